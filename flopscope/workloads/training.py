"""Exact FLOPs inside training loops: a drop-in ``measure_flops``, a batch pricer built
from exact polynomials, and a throughput meter for plain PyTorch loops (MFU).

Units: these functions speak **FLOPs** (2 per MAC), as Lightning, Hugging Face and
torchtitan do; the rest of flopscope speaks MACs. Conventions (what a padded or packed
batch costs): ``docs/conventions.md``.

``attention=`` (every function here): how the attention core is charged, ``"executed"``
(default: every pair the kernels compute), ``"causal"`` (the causal half, FlashAttention
/ Megatron-LM / MaxText) or ``"mask"`` (the pairs the mask allows, padding included
where the batch says which tokens are padding); see :mod:`flopscope.predict.attention`.
MFU computed from such a price is MFU under that convention.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import torch
from torch import nn

from ..api import profile, split_inputs
from ..capture import CapturePlan, Session
from ..capture.checks import describe
from ..capture.fake import tensors_in
from ..capture.records import RECOMPUTE
from ..capture.state import ModelSnapshot
from ..conventions import EXECUTED, MASK, check_attention
from ..errors import ConfigurationError, FlopscopeError, InputError
from ..formulas.registry import prod
from ..hardware.peaks import peak_flops
from ..predict.attention import pairs
from ..predict.polynomial import Polynomial
from ..profile import Profile
from ..role import PAIR_ROLES, Role
from .scaling import scaling

__all__ = ["BatchPricer", "Throughput", "flops_per_batch", "measure_flops", "metric_suffix"]


def metric_suffix(attention: str) -> str:
    """What logged metric names carry for a convention: ``""`` for executed, else
    ``"_causal"`` / ``"_mask"``."""
    return "" if check_attention(attention) == EXECUTED else f"_{attention}"


def measure_flops(model: nn.Module, forward_fn: Callable[[], Any],
                  loss_fn: Callable[[Any], torch.Tensor] | None = None, *, attention: str = EXECUTED) -> int:
    """FLOPs of ``forward_fn()`` (and of ``loss_fn(output).backward()`` when ``loss_fn``
    is given): the signature and unit of
    ``lightning.fabric.utilities.throughput.measure_flops``, counted exactly (CPU
    scaled-dot-product attention, fused ``nn.MultiheadAttention`` / encoder-layer
    paths and grouped expert matmuls included, which Lightning's ``FlopCounterMode``
    counts as 0).

    ``forward_fn`` calls ``model`` (built on ``device="meta"`` if you like: nothing is
    then allocated). Only the work of ``model`` and of its backward pass is counted:
    model FLOPs, the numerator of MFU, so forward work that activation checkpointing
    recomputes in the backward pass is left out (``FlopCounterMode`` counts it;
    :func:`flops_per_batch` prices it apart, for HFU). The model's gradients, buffers
    and flags are left as they were. ``attention``: the convention of the attention core
    (see the module docstring)."""
    check_attention(attention)
    snapshot = ModelSnapshot(model, buffer_values=True, grads=loss_fn is not None)
    session = Session(model, CapturePlan(mode="real"))
    try:
        session.start()
        try:
            output = forward_fn()
            if not tensors_in(output):
                raise InputError(f"forward_fn returned {type(output).__name__}, no tensor: it must call the model "
                                 "and return its output")
            if loss_fn is not None:
                loss = loss_fn(output)
                if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                    raise InputError(f"loss_fn must return a scalar tensor; got {describe(loss)}")
                with session.backward_pass():
                    loss.backward()
        finally:
            prof = Profile(session.finish(stacklevel=3))
    finally:
        snapshot.restore()
    return prof.total_flops(attention=attention) - prof.total_flops(phase=RECOMPUTE, attention=attention)


# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BatchPricer:
    """Prices a batch in FLOPs from exact per-role polynomials in the sequence length
    (MACs of one sequence of ``n`` tokens, forward and, if ``backward``, backward),
    without tracing again.

    - a tensor of token ids ``[B, n]``, or a dict with ``input_ids`` and perhaps a
      padding ``attention_mask``: ``B`` rows of ``n`` tokens, padding included (the work
      that executes);
    - a dict whose ``position_ids`` restart inside a row, or with ``cu_seqlens``
      (offsets of packed sequences): a packed row; per-token roles are priced at the
      row's token count, the attention core (scores and weighted sum) per sequence, ``Σ
      Lᵢ²``, as variable-length kernels execute it;
    - a sequence of ints: that many sequences, each of its own length, run unpadded.

    ``attention`` other than ``"executed"``: the attention core is priced per sequence
    from ``attention_terms`` (MACs per (query, key) pair of each core op, with its mask
    facts) times the pairs the convention charges; under ``"mask"`` a padded batch's
    ``attention_mask`` gives each row's real tokens.
    """

    polynomials: Mapping[str, Polynomial]  # role -> MACs of one sequence of n tokens
    backward: bool
    recomputed: Mapping[str, Polynomial] = field(default_factory=dict)
    """role -> MACs that activation checkpointing recomputes for one sequence of n
    tokens (hardware work)"""
    attention: str = EXECUTED
    attention_terms: tuple[AttentionTerm, ...] = ()
    sequence: SequenceLayout | None = None
    """How a batch given as one tensor holds its sequences (read from ``make_inputs`` by
    :func:`flops_per_batch`): a tensor of that rank is read so, an integer tensor of
    another as token ids ``[..., n]``, a float one refused; ``None``: token ids ``[...,
    n]``, and a float tensor of rank > 2 (hidden states, whose last dimension is a
    width) refused."""

    def __call__(self, batch: Any) -> int:
        """Model FLOPs of the batch (2 per MAC; recomputed work not included: see
        :meth:`recompute_flops`)."""
        return 2 * sum(self.macs_by_role(batch).values())

    def flops_by_role(self, batch: Any) -> dict[str, int]:
        """Model FLOPs per role."""
        return {role: 2 * macs for role, macs in self.macs_by_role(batch).items()}

    def recompute_flops(self, batch: Any) -> int:
        """FLOPs that activation checkpointing recomputes for the batch (0 without
        checkpointing): what hardware FLOPs (HFU) add to the model's."""
        return 2 * sum(self._macs(self.recomputed, self.layout(batch), recomputed=True).values())

    def macs_by_role(self, batch: Any) -> dict[str, int]:
        """Model MACs per role."""
        return self._macs(self.polynomials, self.layout(batch))

    def price(self, batch: Any) -> dict[str, Any]:
        """Everything about one batch from one reading of it: ``flops_by_role``,
        ``flops``, ``recomputed_flops`` and ``tokens`` (what a per-step callback
        needs)."""
        shape = self.layout(batch)
        by_role = {role: 2 * macs for role, macs in self._macs(self.polynomials, shape).items()}
        recomputed = 2 * sum(self._macs(self.recomputed, shape, recomputed=True).values())
        return {"flops_by_role": by_role, "flops": sum(by_role.values()), "recomputed_flops": recomputed,
                "tokens": shape.tokens, "attention": self.attention}

    def tokens(self, batch: Any) -> int:
        """Tokens in the batch, padding included."""
        return self.layout(batch).tokens

    def layout(self, batch: Any) -> Layout:
        """The :class:`Layout` of ``batch``, a tensor read as :attr:`sequence` says (see
        :func:`layout`)."""
        return layout(batch, self.sequence)

    def _macs(self, polynomials: Mapping[str, Polynomial], shape: Layout, recomputed: bool = False) -> dict[str, int]:
        """MACs per role of a batch: the polynomials, the attention core by the
        convention's terms."""
        out = _price(self._integer(polynomials), shape)
        if self.attention == EXECUTED:
            return out
        core: dict[str, Fraction] = {}
        sequences = shape.unpadded if self.attention == MASK and shape.unpadded is not None else shape.sequences
        for term in self.attention_terms:
            if term.recomputed == recomputed and term.role in out:
                priced = sum((count * pairs(self.attention, n, n, term.causal, term.window)
                              for n, count in sequences.items()), Fraction(0))
                core[term.role] = core.get(term.role, Fraction(0)) + term.macs_per_pair * priced
        return {**out, **{role: math.floor(macs) for role, macs in core.items()}}

    def _integer(self, polynomials: Mapping[str, Polynomial]) -> dict[str, _IntegerPolynomial]:
        # frozen dataclass: a cache beside the fields
        cache = self.__dict__.setdefault("_integers", {})
        key = id(polynomials)
        if key not in cache:
            cache[key] = {role: _IntegerPolynomial.of(poly, Role(role).attention_core)
                          for role, poly in polynomials.items()}
        return cache[key]


@dataclass(frozen=True)
class AttentionTerm:
    """The attention core of one sequence, per role and mask: MACs per (query, key) pair
    (executed MACs of its ops over ``n²``) and whether the ops are causal / windowed
    (:class:`flopscope.predict.attention.CoreOp`)."""

    role: str
    macs_per_pair: Fraction
    causal: bool
    window: int | None
    recomputed: bool = False  # work activation checkpointing runs again (HFU)


@dataclass(frozen=True)
class Layout:
    """What pricing needs of a batch: how many rows hold each token count (per-token
    roles run over a row's tokens) and how many sequences have each length (the
    attention core runs per sequence); ``unpadded``: real tokens per row when a
    padding ``attention_mask`` says so (the ``"mask"`` convention prices the core on
    them)."""

    rows: Counter[int]  # tokens in a row -> rows
    sequences: Counter[int]  # sequence length -> sequences
    unpadded: Counter[int] | None = None  # real (unmasked) tokens in a row -> rows

    @property
    def tokens(self) -> int:
        return sum(n * count for n, count in self.rows.items())


@dataclass(frozen=True)
class _IntegerPolynomial:
    """A polynomial with rational coefficients as integers over one denominator (fast
    exact evaluation)."""

    numerators: tuple[int, ...]
    denominator: int
    per_sequence: bool  # the attention core: evaluated per sequence, not per row

    @classmethod
    def of(cls, poly: Polynomial, per_sequence: bool) -> _IntegerPolynomial:
        denominator = math.lcm(*(c.denominator for c in poly.coefficients)) if poly.coefficients else 1
        return cls(tuple(int(c * denominator) for c in poly.coefficients), denominator, per_sequence)

    def total(self, lengths: Counter[int]) -> int:
        """Σ count · P(n) over ``{n: count}``, exactly."""
        scaled = 0
        for n, count in lengths.items():
            value = 0
            for c in reversed(self.numerators):
                value = value * n + c
            scaled += count * value
        whole, rest = divmod(scaled, self.denominator)
        if rest:
            raise FlopscopeError("a role's polynomial gave a fractional count at these lengths; price the batch by "
                                 "profiling it instead")
        return whole


def _price(polynomials: Mapping[str, _IntegerPolynomial], shape: Layout) -> dict[str, int]:
    """MACs per role: per-token roles at each row's token count, the attention core per
    sequence."""
    return {role: poly.total(shape.sequences if poly.per_sequence else shape.rows)
            for role, poly in polynomials.items()}


@dataclass(frozen=True)
class SequenceLayout:
    """Where a tensor input holds its sequences: ``rank`` dimensions, the tokens at
    ``dim`` (counted from the end: -1 for token ids ``[B, n]``, -2 for hidden states
    ``[B, n, d]``), the batch in the dimensions before it."""

    rank: int
    dim: int

    def rows(self, t: torch.Tensor) -> Layout:
        """The layout of a tensor of this rank; token ids ``[..., n]`` otherwise (an
        error for floats)."""
        if t.dim() != self.rank:
            if not t.is_floating_point() and not t.is_complex():
                return _dense(t)
            raise InputError(f"cannot price a float tensor of shape {list(t.shape)}: the pricer was made from inputs "
                             f"of rank {self.rank} with the tokens in dimension {self.rank + self.dim}; give token ids "
                             "[B, n], a dict of model inputs or a list of sequence lengths")
        rows = Counter({int(t.shape[self.dim]): prod(t.shape[: self.rank + self.dim])})
        return Layout(rows, rows)


def sequence_layout(make_inputs: Callable[[int], Any], lengths: Sequence[int]) -> tuple[SequenceLayout, int]:
    """Where ``make_inputs(n)`` puts its tokens, and how many sequences it holds (its
    batch): read from its first tensor at two lengths (the first dimension that
    follows ``n`` is the tokens', those before it the batch). An error where no
    dimension follows ``n``, or where one input holds sequences of several lengths."""
    short, long = sorted(lengths)[:2]
    first = [_first_tensor(make_inputs(n), n) for n in (short, long)]
    if first[0].dim() != first[1].dim():
        raise InputError(f"make_inputs gives tensors of ranks {first[0].dim()} and {first[1].dim()} at n = {short} "
                         f"and {long}: the pricer cannot tell where the tokens are")
    follows = [i for i in range(first[0].dim()) if (first[0].shape[i], first[1].shape[i]) == (short, long)]
    if not follows:
        raise InputError(f"no dimension of make_inputs(n)'s first tensor is n (shapes {list(first[0].shape)} and "
                         f"{list(first[1].shape)} at n = {short} and {long}); flops_per_batch prices sequences of n "
                         "tokens")
    dim = follows[0] - first[0].dim()
    return SequenceLayout(first[0].dim(), dim), prod(first[0].shape[: follows[0]])


def _first_tensor(inputs: Any, n: int) -> torch.Tensor:
    """The tensor of ``make_inputs(n)`` that holds its tokens: ``input_ids`` (or
    ``inputs_embeds``) of a dict, else its first tensor."""
    if isinstance(inputs, tuple) and len(inputs) == 2 and isinstance(inputs[0], tuple) and isinstance(inputs[1], dict):
        inputs = inputs[1] if not inputs[0] else inputs[0]
    if isinstance(inputs, Mapping):
        inputs = inputs.get("input_ids", inputs.get("inputs_embeds", inputs))
    found = tensors_in(inputs)
    if not found:
        raise InputError(f"make_inputs({n}) gave {describe(inputs)}, no tensor: the pricer cannot read its batch")
    return found[0]


def layout(batch: Any, sequence: SequenceLayout | None = None) -> Layout:
    """The :class:`Layout` of a batch: token ids ``[..., n]`` (padding included; a
    tensor read by ``sequence`` when given), a dict of model inputs (``input_ids`` /
    ``inputs_embeds``, packed ``position_ids`` that restart inside a row, or
    ``cu_seqlens`` offsets), or a sequence of lengths (unpadded sequences)."""
    if isinstance(batch, torch.Tensor):
        if sequence is not None:
            return sequence.rows(batch)
        if batch.is_floating_point() and batch.dim() > 2:
            raise InputError(f"cannot price a float tensor of shape {list(batch.shape)}: its last dimension may be a "
                             "width, not tokens; give token ids [B, n], or make the pricer with flops_per_batch, "
                             "which reads where make_inputs puts the tokens")
        return _dense(batch)
    if isinstance(batch, Mapping):
        if batch.get("cu_seqlens") is not None:
            offsets = [int(v) for v in torch.as_tensor(batch["cu_seqlens"]).flatten().tolist()]
            lengths = [b - a for a, b in itertools.pairwise(offsets)]
            if not lengths or min(lengths) < 0:
                raise InputError(f"cu_seqlens must be increasing offsets starting at 0; got {offsets}")
            return Layout(Counter({sum(lengths): 1}), Counter(lengths))
        positions = batch.get("position_ids")
        if isinstance(positions, torch.Tensor) and positions.dim() >= 1 and positions.shape[-1] > 1:
            packed = _packed(positions.reshape(-1, positions.shape[-1]))
            if packed is not None:
                return packed
        ids = batch.get("input_ids", batch.get("inputs_embeds"))
        if isinstance(ids, torch.Tensor):
            dense = _dense(ids if "input_ids" in batch else ids[..., 0])
            mask = batch.get("attention_mask")
            if isinstance(mask, torch.Tensor) and mask.dim() == 2 and tuple(mask.shape) == tuple(ids.shape[:2]):
                real = Counter(int(n) for n in (mask != 0).sum(-1).tolist())
                return Layout(dense.rows, dense.sequences, real)
            return dense
        raise InputError(f"cannot price a batch with keys {sorted(batch)}: give input_ids, position_ids or "
                         "cu_seqlens")
    if isinstance(batch, Sequence) and batch and all(isinstance(n, int) and n > 0 for n in batch):
        unpadded = Counter(int(n) for n in batch)
        return Layout(unpadded, unpadded)
    raise InputError(f"cannot price {describe(batch)}: give token ids [B, n], a dict of model inputs, or a list of "
                     "sequence lengths")


def _dense(ids: torch.Tensor) -> Layout:
    if ids.dim() < 1 or ids.shape[-1] < 1:
        raise InputError(f"token ids need a sequence dimension (last); got shape {list(ids.shape)}")
    rows = Counter({int(ids.shape[-1]): prod(ids.shape[:-1])})
    return Layout(rows, rows)


def _packed(positions: torch.Tensor) -> Layout | None:
    """Rows whose positions restart hold several sequences (``None`` when no row
    restarts: a dense batch)."""
    restarts = positions[:, 1:] <= positions[:, :-1]
    if not bool(restarts.any()):
        return None
    width, count = positions.shape[-1], positions.shape[0]
    starts: list[list[int]] = [[0] for _ in range(count)]
    owners, columns = restarts.nonzero(as_tuple=True)  # only the restarts are read into Python
    for row, column in zip(owners.tolist(), columns.tolist(), strict=True):
        starts[row].append(column + 1)
    sequences: Counter[int] = Counter()
    for row_starts in starts:
        sequences.update(b - a for a, b in itertools.pairwise([*row_starts, width]))
    return Layout(Counter({width: count}), sequences)


def flops_per_batch(model: nn.Module, make_inputs: Callable[[int], Any], *, backward: bool = True,
                    lengths: Sequence[int] = (16, 32, 64, 128, 256), mode: str = "fake",
                    loss: Callable[[Any], torch.Tensor] | None = None, training: bool | None = None,
                    attention: str = EXECUTED, **profile_kwargs: Any) -> BatchPricer:
    """Profile ``model(*make_inputs(n))`` (``n`` tokens in each of its sequences: a
    batch of several is priced per sequence, the batch read from the dimensions
    before the one that follows ``n``) at a few ``lengths``, recover each role's
    exact polynomial in ``n`` (:func:`flopscope.scaling`, checked at one more length
    than its degree needs) and return a :class:`BatchPricer` that prices any batch in
    FLOPs without tracing again. A role whose count is not a polynomial at these
    lengths is an error (give more lengths). ``training=True`` traces the model in
    training mode (what activation checkpointing and dropout need; every module's
    flag is put back after), ``None`` in the mode it is in. ``attention``: the
    convention of the attention core; other than ``"executed"`` the model is profiled
    once more, at the longest length, to read each core op's MACs per pair and mask
    (self-attention only: a core whose keys are not its queries is an error)."""
    check_attention(attention)
    if len(set(lengths)) < 2:
        raise ConfigurationError(f"flops_per_batch needs at least two lengths; got {tuple(lengths)}")
    sequence, batch = sequence_layout(make_inputs, lengths)
    snapshot = ModelSnapshot(model, buffer_values=False)
    try:
        if training is not None:
            model.train(training)
        result = scaling(model, make_inputs, lengths, mode=mode, backward=backward, loss=loss, **profile_kwargs)
        terms = () if attention == EXECUTED else _attention_terms(
            model, make_inputs, max(lengths), result.polynomials, mode=mode, backward=backward, loss=loss,
            **profile_kwargs)
    finally:
        snapshot.restore()
    polynomials = {**result.polynomials, **{f"{role} (recomputed)": p for role, p in result.recomputed.items()}}
    missing = [role for role, poly in polynomials.items() if poly is None]
    if missing:
        raise FlopscopeError(f"the MACs of {', '.join(missing)} are not a polynomial of degree <= "
                             f"{len(result.lengths) - 2} in n at lengths {result.lengths}; give more lengths")
    per_sequence = {role: _per_sequence(poly, batch) for role, poly in result.polynomials.items() if poly is not None}
    recomputed = {role: _per_sequence(poly, batch) for role, poly in result.recomputed.items() if poly is not None}
    terms = tuple(dataclasses.replace(t, macs_per_pair=t.macs_per_pair / batch) for t in terms)
    return BatchPricer(per_sequence, backward, recomputed, attention, terms, sequence)


def _per_sequence(poly: Polynomial, batch: int) -> Polynomial:
    """One sequence's polynomial from that of a batch of ``batch`` equal sequences."""
    return Polynomial(tuple(c / batch for c in poly.coefficients))


def _attention_terms(model: nn.Module, make_inputs: Callable[[int], Any], n: int,
                     polynomials: Mapping[str, Polynomial | None], *, mode: str, backward: bool,
                     loss: Callable[[Any], torch.Tensor] | None, **profile_kwargs: Any) -> tuple[AttentionTerm, ...]:
    """The attention core of one sequence of ``n`` tokens as :class:`AttentionTerm` s,
    checked against the polynomials (every core MAC of the model's work must be in a
    term)."""
    inputs = make_inputs(n)
    options = {k: profile_kwargs.pop(k) for k in ("registry", "roles", "forward_kwargs") if k in profile_kwargs}
    profile_kwargs.pop("spec", None)
    profile_kwargs.pop("progress", None)
    args, kwargs = split_inputs(inputs)
    prof = profile(model, *args, mode=mode, backward=backward, loss=loss, **options, **kwargs, **profile_kwargs)
    grouped: dict[tuple[str, bool, int | None, bool], Fraction] = {}
    for op in prof.attention_core():
        if op.n_q is None or op.n_k is None or op.n_q != n or op.n_k != n:
            raise FlopscopeError(f"the attention core op {op.node} is not self-attention over the {n} tokens of one "
                                 f"sequence (queries {op.n_q}, keys {op.n_k}), so a convention cannot price other "
                                 "lengths; use attention='executed'")
        for role, macs in op.parts.items():
            key = (role, op.causal, op.window, op.phase == RECOMPUTE)
            grouped[key] = grouped.get(key, Fraction(0)) + Fraction(macs, n * n)
    terms = tuple(AttentionTerm(role, per_pair, causal, window, again)
                  for (role, causal, window, again), per_pair in grouped.items())
    for role in PAIR_ROLES:
        poly = polynomials.get(role)
        found = sum((t.macs_per_pair * n * n for t in terms if t.role == role and not t.recomputed), Fraction(0))
        if poly is not None and poly(n) != found:
            raise FlopscopeError(f"the {role} MACs of one sequence of {n} tokens ({poly(n)}) are not all in attention "
                                 f"core ops that the convention can price ({found}); use attention='executed'")
    return terms


# --------------------------------------------------------------------------------------------------
AUTO = "auto"
"""``peak="auto"``: look the device's peak up (:func:`flopscope.peaks.peak_flops`), the
default of :class:`Throughput` and the training callbacks."""


def resolve_peak(peak: float | str | None, device: Any, dtype: torch.dtype) -> tuple[float | None, str]:
    """``(peak FLOP/s or None, where it came from)`` of a :class:`Throughput` ``peak``
    argument: a number as given (``> 0``), ``"auto"`` looked up for ``device`` and
    ``dtype``, ``None`` unknown (no MFU)."""
    if peak is None:
        return None, "unknown (peak=None): MFU and HFU are not computed; pass the dense datasheet FLOP/s, or 'auto'"
    if isinstance(peak, str):
        if peak != AUTO:
            raise ConfigurationError(f"peak must be a number of FLOP/s, {AUTO!r} (look it up) or None (unknown); "
                                     f"got {peak!r}")
        found = peak_flops(device, dtype)
        if found is None:
            return None, (f"unknown: no peak for device {device!r} and {dtype} (a warning says why); MFU and HFU "
                          "are not computed; pass peak= with the dense datasheet FLOP/s")
        where = "measured on this CPU (a GEMM benchmark)" if _is_cpu(device) else "the device's datasheet"
        return found, f"looked up: {where}, {dtype}"
    if isinstance(peak, bool) or not isinstance(peak, (int, float)) or not peak > 0:
        raise ConfigurationError(f"peak must be > 0 FLOP/s, {AUTO!r} or None; got {peak!r}")
    return float(peak), "given"


def _is_cpu(device: Any) -> bool:
    """``device`` means this CPU (as :func:`flopscope.peaks.peak_flops` resolves it:
    ``None`` without CUDA)."""
    if device is None:
        return not torch.cuda.is_available()
    try:
        return torch.device(device).type == "cpu"
    except (RuntimeError, TypeError):
        return False


class Throughput:
    """FLOP/s, MFU, tokens/s and FLOPs per role of a plain PyTorch training loop.

    ``flops``: a :class:`BatchPricer` (prices each batch) or a fixed number of FLOPs per
    batch. ``peak``: the denominator of MFU, the device's dense peak FLOP/s: a number
    (the datasheet figure); ``"auto"`` (default) looks it up
    (:func:`flopscope.peaks.peak_flops` of ``device`` and ``dtype``: a known GPU's
    datasheet figure, this CPU's measured GEMM peak; an unknown device gives ``None``
    and one warning); ``None``: unknown, so MFU and HFU are not computed (``None``, and
    :attr:`peak_source` says why). ``recompute_flops``: FLOPs recomputed per batch by
    activation checkpointing when ``flops`` is a number (a :class:`BatchPricer` prices
    them itself): hardware FLOPs, which HFU counts and MFU does not."""

    def __init__(self, flops: BatchPricer | int, *, peak: float | str | None = AUTO, device: Any = None,
                 dtype: torch.dtype = torch.float32, recompute_flops: int = 0) -> None:
        if isinstance(flops, int) and flops < 0:
            raise ConfigurationError(f"flops per batch must be >= 0; got {flops}")
        self.peak, self.peak_source = resolve_peak(peak, device, dtype)
        self.flops, self.recompute_flops = flops, recompute_flops
        self._zero()

    def _zero(self) -> None:
        self.steps = 0
        self.seconds = 0.0
        self.model_flops = 0
        self.recomputed_flops = 0
        self.tokens = 0
        self.flops_by_role: Counter[str] = Counter()

    def fresh(self) -> Throughput:
        """A meter with the same pricing and peak and no steps yet (for a window of
        steps, such as a log interval)."""
        meter = copy.copy(self)
        meter._zero()
        return meter

    def update(self, batch: Any, seconds: float) -> dict[str, Any]:
        """Account one step that took ``seconds`` (wall time) on ``batch``; returns this
        step's metrics: ``flops`` (model FLOPs), ``flops_per_sec``, ``mfu`` and
        ``hfu`` (``None`` without a peak), ``peak`` (the denominator) and
        ``peak_source`` (where it came from, or why there is none),
        ``recomputed_flops``, ``tokens``, ``tokens_per_sec``, ``seconds`` and
        ``flops_by_role`` (when priced by a :class:`BatchPricer`)."""
        if not isinstance(self.flops, BatchPricer):
            return self.record(int(self.flops), seconds, recomputed=self.recompute_flops)
        priced = self.flops.price(batch)
        return self.record(priced["flops"], seconds, recomputed=priced["recomputed_flops"], tokens=priced["tokens"],
                           flops_by_role=priced["flops_by_role"])

    def record(self, flops: int, seconds: float, *, recomputed: int = 0, tokens: int = 0,
               flops_by_role: Mapping[str, int] | None = None) -> dict[str, Any]:
        """Account one step already priced (``flops`` model FLOPs, ``recomputed`` FLOPs
        of activation checkpointing, ``tokens``) that took ``seconds``; returns the
        metrics of :meth:`update`."""
        if not seconds > 0:
            raise ConfigurationError(f"a step's time must be > 0 seconds; got {seconds}")
        self.steps += 1
        self.seconds += seconds
        self.model_flops += flops
        self.recomputed_flops += recomputed
        self.tokens += tokens
        self.flops_by_role.update(flops_by_role or {})
        return {**self._rates(flops, recomputed, tokens, seconds), "flops_by_role": dict(flops_by_role or {})}

    def summary(self) -> dict[str, Any]:
        """Totals and rates over every step so far (the keys of :meth:`update`, and
        ``steps``)."""
        if not self.steps:
            raise FlopscopeError("no step was recorded yet (call update() after each step)")
        return {**self._rates(self.model_flops, self.recomputed_flops, self.tokens, self.seconds),
                "flops_by_role": dict(self.flops_by_role), "steps": self.steps}

    def _rates(self, flops: int, recomputed: int, tokens: int, seconds: float) -> dict[str, Any]:
        """MFU counts the model's FLOPs, HFU also the recomputed ones; both ``None``
        without a peak."""
        return {"flops": flops, "flops_per_sec": flops / seconds, "peak": self.peak, "peak_source": self.peak_source,
                "mfu": flops / seconds / self.peak if self.peak else None,
                "hfu": (flops + recomputed) / seconds / self.peak if self.peak else None,
                "recomputed_flops": recomputed, "tokens": tokens, "tokens_per_sec": tokens / seconds,
                "seconds": seconds}
