"""Vaswani et al. 2017, Table 1 ("Why Self-Attention"), *measured*: real PyTorch layers,
profiled.

:func:`compare` builds one layer per row of the paper's Table 1 (and of the rows the
authors commented out of it: separable convolution, position-wise FFN, fully connected),
plus the seed study's points (a whole Transformer block, cross-attention with one query,
multi-head vs single-head), profiles each in fake mode (nothing is computed; every layer
is built on ``device="meta"``, so even the n²·d² weights of the fully-connected layer
cost no memory), and sets each measured count next to an exact closed form computed here
from ``n, d, h, k, r, d_ff`` alone (``docs/formulas.md`` section 1).

Conventions:

* Units are in the names: ``*_macs`` are multiply-accumulates (1 MAC = 2 FLOPs);
  ``params`` are scalar parameters (``sum(p.numel())``, biases and norm scales
  included), ``weights`` the scalars of the parameters that multiply (matrices and
  convolution kernels: every parameter of two or more dimensions; biases and norm scales
  left out), so that the seed note's ``512^4`` weights of the fully-connected layer read
  straight off the table; all counts are for **one sequence** (batch 1) of ``n`` tokens
  of width ``d``, forward pass only. Softmax, scaling, masking, biases, norms and
  activations are elementwise work, not MACs, and are in neither column (see
  :meth:`flopscope.Profile.elementwise`).
* Attention uses ``h`` heads of width ``d_k = d_v = d / h``.
* Rows that measure part of a layer (the attention core, a Q projection) take that
  part's roles from :meth:`flopscope.Profile.by_role`; ``params`` is still the whole
  profiled layer's parameter count.
* Restricted self-attention with neighbourhood ``r``: query ``i`` attends to the ``r``
  consecutive key positions ``i - (r - 1) // 2, ..., i + r // 2`` (centred for odd
  ``r``, one more on the right for even ``r``). Positions outside ``0 .. n - 1`` are
  zero padding: they are multiplied (and counted: the kernel executes them) and then
  masked out of the softmax. So every query costs exactly ``r·d`` MACs for its scores
  and ``r·d`` for its weighted sum, ``2·r·n·d`` in all, for any ``r >= 1`` (also ``r >
  n``).
* Convolutions use ``padding = k // 2``, stride 1, so their output length is ``n_out = n
  + 2·(k // 2) - k + 1`` (``= n`` for odd ``k``, ``n + 1`` for even ``k``); the closed
  forms use ``n_out``, which is the ``n`` of the paper's ``k·n·d²`` for odd ``k``. Also
  for ``k > n``: the padded input has ``n + 2·(k // 2) >= k`` positions, so the layer
  has ``n_out >= n >= 1`` outputs, each a full window of ``k`` taps of which at most
  ``n`` fall on the sequence; the taps on the zero padding are executed and counted like
  the others, so ``k·n_out·d²`` stays exact (measured equals predicted). Such a ``k``
  (or an ``r > n``) is therefore accepted; :meth:`Comparison.to_table` notes that the
  windows reach past the sequence, so the count includes work on padding.
* Sequential operations and maximum path lengths are the paper's (not measured). For the
  convolutions the paper's ``O(log_k(n))`` assumes dilated kernels (``O(n/k)`` for
  contiguous ones); the position-wise FFN never mixes positions, so its path length is
  ``∞`` (the paper's commented-out row).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from tabulate import tabulate
from torch import nn

from ..api import profile
from ..capture.checks import check_heads, check_positive
from ..errors import NotFoundError
from ..profile import Profile
from ..role import PAIR_ROLES, Role
from .models import FeedForward, SelfAttention, TransformerBlock

__all__ = [
    "BandedSelfAttention",
    "Comparison",
    "ComparisonRow",
    "LengthComparison",
    "LengthRow",
    "MaskedBandSelfAttention",
    "band_window",
    "compare",
    "compare_lengths",
]


# --------------------------------------------------------------------------------------------------
# restricted (banded) self-attention
def band_window(r: int) -> tuple[int, int]:
    """``(left, right)`` of the restricted-attention window of size ``r``: query ``i``
    sees keys ``i - left .. i + right``, with ``left = (r - 1) // 2``, ``right = r //
    2``, ``left + right + 1 = r``."""
    check_positive(r=r)
    return (r - 1) // 2, r // 2


class _ProjectedAttention(nn.Module):
    """Q/K/V/O projections (``nn.Linear(d, d)`` each) around a core that subclasses
    define."""

    def __init__(self, d: int, h: int, r: int) -> None:
        super().__init__()
        check_heads(d, h)
        self.h, self.d_k, self.r = h, d // h, r
        self.left, self.right = band_window(r)
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(d, d) for _ in range(4))

    def _heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, n, _ = x.shape
        q, k, v = (p(x).view(B, n, self.h, self.d_k).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        return q, k, v  # (B, h, n, d_k) each

    def _merge(self, out: torch.Tensor) -> torch.Tensor:
        B, _, n, _ = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(B, n, self.h * self.d_k))


class BandedSelfAttention(_ProjectedAttention):
    """Restricted self-attention as a true banded kernel: each query attends to ``r``
    keys only.

    The keys and values are zero-padded by ``left = (r - 1) // 2`` positions before and
    ``right = r // 2`` after the sequence, and ``unfold`` gathers, for each query ``i``,
    the window of padded positions ``i .. i + r - 1`` (original positions ``i - left ..
    i + right``). Scores are a batched ``(1 × d_k) @ (d_k × r)`` matmul per query and
    head, the weighted sum a ``(1 × r) @ (r × d_k)`` one: ``h·n·r·d_k = r·n·d`` MACs
    each, **2·r·n·d** for the core. Padded positions are computed and then masked to
    ``-inf`` before the softmax, so they get zero weight.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        q, k, v = self._heads(x)
        pad = (0, 0, self.left, self.right)  # pad the sequence axis of (B, h, n, d_k)
        keys = F.pad(k, pad).unfold(2, self.r, 1)  # (B, h, n, d_k, r)
        values = F.pad(v, pad).unfold(2, self.r, 1).transpose(-2, -1)  # (B, h, n, r, d_k)
        scores = q.unsqueeze(-2) @ keys / math.sqrt(self.d_k)  # (B, h, n, 1, r)
        position = torch.arange(n, device=x.device)[:, None] - self.left + torch.arange(self.r, device=x.device)
        inside = ((position >= 0) & (position < n))[:, None, :]  # (n, 1, r)
        weights = F.softmax(scores.masked_fill(~inside, float("-inf")), dim=-1)
        return self._merge((weights @ values).squeeze(-2))  # (B, h, n, d_k) -> (B, n, d)


class MaskedBandSelfAttention(_ProjectedAttention):
    """The same restriction as :class:`BandedSelfAttention` (same window, same outputs),
    done as a masked **dense** kernel: ``F.scaled_dot_product_attention`` with a
    boolean band mask. The kernel still computes all ``n × n`` scores, so the core
    costs **2·n²·d** MACs whatever ``r`` is."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        q, k, v = self._heads(x)
        # key - query
        offset = torch.arange(n, device=x.device)[None, :] - torch.arange(n, device=x.device)[:, None]
        band = (offset >= -self.left) & (offset <= self.right)  # (n, n), True = attend
        return self._merge(F.scaled_dot_product_attention(q, k, v, attn_mask=band))


# --------------------------------------------------------------------------------------------------
# results
@dataclass(frozen=True, slots=True)
class ComparisonRow:
    """One layer of the comparison. MACs are per sequence, forward; 1 MAC = 2 FLOPs."""

    key: str  # stable identifier ("self_attention_core", "recurrent", ...)
    layer: str  # what was built and what of it was measured
    complexity: str  # the paper's complexity class, e.g. "O(n²·d)"
    predicted_macs: int  # exact closed form from (n, d, h, k, r, d_ff), never from a profile
    measured_macs: int  # from flopscope.profile(..., mode="fake")
    # parameters of the profiled layer (sum of numel, biases included), also for partial
    # rows
    params: int
    # of those, the scalars of its >= 2-D parameters (matrices, kernels): params less
    # biases, norms
    weights: int
    sequential_ops: str  # minimum number of sequential operations, as in the paper
    max_path_length: str  # maximum path length between positions, as in the paper
    match: bool = field(init=False)  # measured_macs == predicted_macs

    def __post_init__(self) -> None:
        object.__setattr__(self, "match", self.measured_macs == self.predicted_macs)

    @property
    def predicted_flops(self) -> int:
        """``2 * predicted_macs``."""
        return 2 * self.predicted_macs

    @property
    def measured_flops(self) -> int:
        """``2 * measured_macs``."""
        return 2 * self.measured_macs


@dataclass(frozen=True, slots=True)
class Comparison:
    """The rows of :func:`compare` and the shapes they were measured at."""

    n: int  # sequence length
    d: int  # model width
    h: int  # attention heads
    k: int  # convolution kernel width
    r: int  # restricted-attention neighbourhood (keys per query)
    d_ff: int  # FFN inner width
    rows: tuple[ComparisonRow, ...]

    def row(self, key: str) -> ComparisonRow:
        """The row with this ``key``."""
        for row in self.rows:
            if row.key == key:
                return row
        raise NotFoundError(f"no row {key!r}; rows: {', '.join(r.key for r in self.rows)}")

    @property
    def all_match(self) -> bool:
        """Whether every row's measured MACs equal its prediction."""
        return all(row.match for row in self.rows)

    def crossover_self_attention_vs_recurrence(self) -> int:
        """The smallest integer sequence length ``n`` at which the self-attention core
        costs more than the recurrent layer at this ``d``: ``2·n²·d > 2·n·d²  ⇔  n >
        d``, so ``d + 1`` (at ``n = d`` both are ``2·d³`` MACs)."""
        return _crossover(self.d)

    def to_table(self, tablefmt: str = "simple") -> str:
        """The comparison as text (a tabulate table, MACs with thousands separators),
        with a header line naming the shapes and units and footer lines with the
        crossover and the parameter ratio."""
        rows = [[row.layer, row.complexity, f"{row.predicted_macs:,}", f"{row.measured_macs:,}",
                 "yes" if row.match else "NO", f"{row.weights:,}", f"{row.params:,}",
                 row.sequential_ops,
                 row.max_path_length] for row in self.rows]
        table = tabulate(rows, headers=["layer", "complexity", "predicted MACs", "measured MACs",
                                        "match",
                                        "weights", "params (+ biases)", "sequential", "max path"],
                         tablefmt=tablefmt, colalign=("left", "left", "right", "right", "left",
                                                      "right", "right",
                                                      "left", "left"), disable_numparse=True)
        lines = [f"Vaswani et al. 2017, Table 1, measured: n={self.n}, d={self.d}, h={self.h}, "
                 f"k={self.k}, "
                 f"r={self.r}, d_ff={self.d_ff}; one sequence, forward, MACs (1 MAC = 2 FLOPs)", "",
                 table, ""]
        crossover = self.crossover_self_attention_vs_recurrence()
        lines.append("self-attention core (2·n²·d) exceeds the recurrent layer (2·n·d²) from n = "
                     f"{crossover:,} (n > d = {self.d:,})")
        fc, block = self.row("fully_connected"), self.row("transformer_block")
        lines.append(f"weights: fully connected {fc.weights:,} vs Transformer block "
                     f"{block.weights:,} ({fc.weights / block.weights:,.0f}x); with biases (and "
                     f"the block's norms): {fc.params:,} vs {block.params:,} "
                     f"({fc.params / block.params:,.0f}x)")
        if self.k > self.n:
            lines.append(f"k={self.k} > n={self.n}: every convolution window reaches into the zero "
                         "padding; its taps there are executed and counted (k·n_out·d² is still "
                         "exact)")
        if self.r > self.n:
            lines.append(f"r={self.r} > n={self.n}: every restricted-attention window reaches past "
                         "the sequence; those keys are scored, then masked out (2·r·n·d is still "
                         "exact)")
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class LengthRow:
    """Self-attention core vs recurrent layer at one sequence length ``n`` (MACs, one
    sequence)."""

    n: int
    attention_core_predicted_macs: int  # 2·n²·d
    attention_core_measured_macs: int  # attn_scores + attn_weighted_sum of SelfAttention(d, h)
    recurrent_predicted_macs: int  # 2·n·d²
    recurrent_measured_macs: int  # nn.RNN(d, d)

    @property
    def cheaper(self) -> str:
        """``"self-attention"``, ``"recurrent"`` or ``"equal"``, by measured MACs."""
        a, b = self.attention_core_measured_macs, self.recurrent_measured_macs
        return "equal" if a == b else "self-attention" if a < b else "recurrent"

    @property
    def match(self) -> bool:
        """Whether both measurements equal their closed forms."""
        return (self.attention_core_measured_macs == self.attention_core_predicted_macs
                and self.recurrent_measured_macs == self.recurrent_predicted_macs)


@dataclass(frozen=True, slots=True)
class LengthComparison:
    """The rows of :func:`compare_lengths`, one per sequence length."""

    d: int
    h: int
    rows: tuple[LengthRow, ...]

    def crossover_self_attention_vs_recurrence(self) -> int:
        """``d + 1``: the smallest ``n`` with ``2·n²·d > 2·n·d²``
        (see :meth:`Comparison.crossover_self_attention_vs_recurrence`)."""
        return _crossover(self.d)

    def to_table(self, tablefmt: str = "simple") -> str:
        """One line per ``n``: measured MACs of both layers, their ratio, and which is
        cheaper."""
        rows = [[f"{row.n:,}", f"{row.attention_core_measured_macs:,}",
                 f"{row.recurrent_measured_macs:,}",
                 f"{row.attention_core_measured_macs / row.recurrent_measured_macs:.4g}",
                 row.cheaper,
                 "yes" if row.match else "NO"] for row in self.rows]
        table = tabulate(rows, headers=["n", "self-attention core MACs", "recurrent MACs",
                                        "ratio (= n/d)",
                                        "cheaper", "match"],
                         tablefmt=tablefmt,
                         colalign=("right", "right", "right", "right", "left", "left"),
                         disable_numparse=True)
        return "\n".join(["self-attention core (2·n²·d) vs recurrent layer (2·n·d²), measured, "
                          f"d={self.d}, "
                          f"h={self.h}; MACs (1 MAC = 2 FLOPs)", "", table, "",
                          "self-attention costs more from n = "
                          f"{self.crossover_self_attention_vs_recurrence():,} (n > d)"])


# --------------------------------------------------------------------------------------------------
# measuring
def compare(n: int = 512, d: int = 512, h: int = 8, k: int = 5, r: int = 64,
            d_ff: int | None = None) -> Comparison:
    """Build and profile (fake mode, modules on ``device="meta"``) one layer per row of
    Vaswani et al.'s Table 1 and of the seed study, for one sequence of ``n`` tokens
    of width ``d``.

    Args:
        n: sequence length (tokens). d: model width. h: attention heads (``d % h ==
            0``).
        k: convolution kernel width. r: restricted-attention neighbourhood (keys per
        query, see :func:`band_window`). Both may exceed ``n``: the windows then reach
        into padding, whose work the kernels execute and the closed forms count (module
        docstring). d_ff: FFN inner width (default ``4 * d``).

    Returns:
        a :class:`Comparison`; every ``predicted_macs`` is an exact closed form, never
        read from a profile.

    Rows (``key``: layer profiled -> predicted MACs, with ``n_out = n + 2·(k // 2) - k +
    1``):

    * ``self_attention_core``: :class:`~flopscope.models.SelfAttention` ``(d, h)``,
      roles ``attn_scores`` + ``attn_weighted_sum`` -> ``2·n²·d``; ``self_attention``:
      the same layer, all of it -> ``4·n·d² + 2·n²·d``; ``self_attention_single_head``:
      ``SelfAttention(d, 1)`` -> the same.
    * ``restricted_banded_core``: :class:`BandedSelfAttention`, core roles ->
      ``2·r·n·d``; ``restricted_masked_dense_core``: :class:`MaskedBandSelfAttention`,
      core roles -> ``2·n²·d``.
    * ``convolution``: ``nn.Conv1d(d, d, k, padding=k // 2)`` -> ``k·n_out·d²``;
      ``separable_convolution``: depthwise ``Conv1d(groups=d)`` then a 1x1 ``Conv1d`` ->
      ``k·n_out·d + n_out·d²``.
    * ``recurrent``: ``nn.RNN(d, d)`` -> ``2·n·d²`` (input GEMM ``n·d²`` + hidden GEMMs
      ``n·d²``).
    * ``feed_forward``: :class:`~flopscope.models.FeedForward` ``(d, d_ff)`` ->
      ``2·n·d·d_ff``.
    * ``fully_connected``: ``nn.Linear(n·d, n·d)`` on the flattened sequence ->
      ``n²·d²`` (``n²·d²`` weights, ``n²·d² + n·d`` parameters with the biases).
    * ``transformer_block``: :class:`~flopscope.models.TransformerBlock` ``(d, h,
      d_ff)`` -> ``n·(4·d² + 2·d·d_ff) + 2·n²·d`` (``12·d²`` weights, ``12·d² + 13·d``
      parameters with biases and norms, when ``d_ff = 4·d``).
    * ``cross_attention_one_query``: ``nn.MultiheadAttention(d, h)`` with one query
      against ``n`` keys / values -> ``d²`` (Q) + ``2·n·d²`` (K, V) + ``2·n·d`` (core) +
      ``d²`` (O); ``cross_attention_q_proj``: its ``q_proj`` role -> ``d²``;
      ``self_attention_q_proj``: the same layer's ``q_proj`` role with ``n`` queries ->
      ``n·d²``.
    """
    d_ff = 4 * d if d_ff is None else d_ff
    check_positive(n=n, k=k, r=r, d_ff=d_ff)
    check_heads(d, h)
    n_out = n + 2 * (k // 2) - k + 1  # Conv1d(padding=k//2) output length
    rows: list[ComparisonRow] = []

    def add(key: str, layer: str, complexity: str, predicted: int, measured: int, module: nn.Module,
            sequential: str = "O(1)", path: str = "O(1)") -> None:
        rows.append(ComparisonRow(key, layer, complexity, predicted, measured, _params(module),
                                  _weights(module),
                                  sequential, path))

    with torch.device("meta"):
        attention = SelfAttention(d, h)
        single_head = SelfAttention(d, 1)
        banded = BandedSelfAttention(d, h, r)
        masked = MaskedBandSelfAttention(d, h, r)
        conv = nn.Conv1d(d, d, k, padding=k // 2)
        separable = nn.Sequential(nn.Conv1d(d, d, k, padding=k // 2, groups=d), nn.Conv1d(d, d, 1))
        recurrent = nn.RNN(d, d)
        ffn = FeedForward(d, d_ff)
        fully_connected = nn.Linear(n * d, n * d)
        block = TransformerBlock(d, h, d_ff)
        mha = nn.MultiheadAttention(d, h, batch_first=True)
    x = _sequence_input(n, d)  # (1, n, d)
    one_query = _sequence_input(1, d)  # (1, 1, d)

    prof = _profile(attention, x)
    add("self_attention_core", f"self-attention core ({h} heads)", "O(n²·d)",
        2 * n * n * d, _core(prof), attention)
    add("self_attention", f"self-attention + Q/K/V/O ({h} heads)", "O(n²·d + n·d²)",
        4 * n * d * d + 2 * n * n * d, prof.total(), attention)
    add("self_attention_single_head", "self-attention + Q/K/V/O (1 head)", "O(n²·d + n·d²)",
        4 * n * d * d + 2 * n * n * d, _profile(single_head, x).total(), single_head)
    add("restricted_banded_core", f"restricted attention core, banded (r={r})", "O(r·n·d)",
        2 * r * n * d, _core(_profile(banded, x)), banded, path="O(n/r)")
    add("restricted_masked_dense_core", f"restricted attention core, masked dense (r={r})",
        "O(n²·d)",
        2 * n * n * d, _core(_profile(masked, x)), masked, path="O(n/r)")
    add("convolution", f"convolution (k={k})", "O(k·n·d²)",
        k * n_out * d * d, _profile(conv, _channels(n, d)).total(), conv, path="O(log_k(n))")
    add("separable_convolution", f"separable convolution (k={k})", "O(k·n·d + n·d²)",
        k * n_out * d + n_out * d * d, _profile(separable, _channels(n, d)).total(), separable,
        path="O(log_k(n))")
    add("recurrent", "recurrent (nn.RNN)", "O(n·d²)",
        2 * n * d * d, _profile(recurrent, _steps(n, d)).total(), recurrent, sequential="O(n)",
        path="O(n)")
    add("feed_forward", f"position-wise FFN (d_ff={d_ff})", "O(n·d²)",
        2 * n * d * d_ff, _profile(ffn, x).total(), ffn, path="∞")
    add("fully_connected", "fully connected (n·d → n·d)", "O(n²·d²)",
        n * n * d * d, _profile(fully_connected, _sequence_input(1, n * d)[0]).total(),
        fully_connected)
    add("transformer_block", f"Transformer block (d_ff={d_ff})", "O(n²·d + n·d²)",
        n * (4 * d * d + 2 * d * d_ff) + 2 * n * n * d, _profile(block, x).total(), block)
    # nn.MultiheadAttention: skip averaging the attention weights
    no_weights = {"need_weights": False}
    cross = _profile(mha, one_query, x, x, forward_kwargs=no_weights)
    add("cross_attention_one_query", "cross-attention, 1 query (nn.MHA)", "O(n·d²)",
        2 * d * d + 2 * n * d * d + 2 * n * d, cross.total(), mha)
    add("cross_attention_q_proj", "· its Q projection, 1 query", "O(d²)",
        d * d, cross.by_role().get(Role.Q_PROJ.value, 0), mha)
    add("self_attention_q_proj", "· Q projection, n queries (self-attn.)", "O(n·d²)",
        n * d * d, _profile(mha, x, x, x, forward_kwargs=no_weights).by_role().get(Role.Q_PROJ.value, 0), mha)
    return Comparison(n=n, d=d, h=h, k=k, r=r, d_ff=d_ff, rows=tuple(rows))


def compare_lengths(lengths: Iterable[int], d: int = 512, h: int = 8) -> LengthComparison:
    """Measured MACs of the self-attention core (``SelfAttention(d, h)``: scores +
    weighted sum, ``2·n²·d``) and of a recurrent layer (``nn.RNN(d, d)``, ``2·n·d²``)
    for each sequence length ``n`` in ``lengths``, so that the crossover at ``n > d``
    shows. One sequence per length, fake mode."""
    check_heads(d, h)
    lengths = tuple(lengths)
    for n in lengths:  # all checked before any is profiled
        check_positive(n=n)
    with torch.device("meta"):
        attention, recurrent = SelfAttention(d, h), nn.RNN(d, d)
    rows = []
    for n in lengths:
        rows.append(LengthRow(n=n, attention_core_predicted_macs=2 * n * n * d,
                              attention_core_measured_macs=_core(_profile(attention, _sequence_input(n, d))),
                              recurrent_predicted_macs=2 * n * d * d,
                              recurrent_measured_macs=_profile(recurrent, _steps(n, d)).total()))
    return LengthComparison(d=d, h=h, rows=tuple(rows))


# --------------------------------------------------------------------------------------------------
def _crossover(d: int) -> int:
    # 2·n²·d > 2·n·d²  ⇔  n > d for n, d >= 1; the smallest such integer is d + 1
    return d + 1


def _profile(module: nn.Module, *inputs: torch.Tensor,
             forward_kwargs: dict[str, Any] | None = None) -> Profile:
    with torch.no_grad():
        return profile(module, *inputs, mode="fake", forward_kwargs=forward_kwargs)


def _core(prof: Profile) -> int:
    roles = prof.by_role()
    return sum(roles.get(role, 0) for role in PAIR_ROLES)


def _params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _weights(module: nn.Module) -> int:
    # the parameters that multiply: weight matrices and convolution kernels (>= 2 dims);
    # biases and norm scales are 1-D
    return sum(p.numel() for p in module.parameters() if p.dim() >= 2)


def _sequence_input(n: int, d: int) -> torch.Tensor:
    return torch.empty(1, n, d, device="meta")  # (batch, sequence, features)


def _channels(n: int, d: int) -> torch.Tensor:
    return torch.empty(1, d, n, device="meta")  # (batch, channels, length) for Conv1d


def _steps(n: int, d: int) -> torch.Tensor:
    return torch.empty(n, 1, d, device="meta")  # (sequence, batch, features) for nn.RNN
