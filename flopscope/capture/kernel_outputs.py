"""What the catalogued kernels' outputs and costs are made of: the output makers that
build a kernel's results from its arguments (fake or real) and the formulas by sequence
and chunk, in MACs, for :data:`flopscope.capture.catalog.CATALOG` (fla's chunked linear
attention, Liger's fused losses and norms, mamba-ssm's scans, causal-conv1d,
flash-attn's KV-cache call)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..formulas.kernels import (
    GATED_DELTA_CHUNK,
    KDA_CHUNK,
    dplr_delta_rule_chunked,
    gated_delta_rule_chunked,
    kda_chunked,
    linear_attention_chunked,
    ssd_chunked,
)
from ..formulas.registry import MacCount, UpperBound

Named = Mapping[str, Any]
"""A call's arguments by parameter name (tensors as they are)."""


def gated_delta_outputs(named: Named) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fla's chunk_gated_delta_rule: ``o [B, T, h, V]`` in v's dtype, and the final
    state ``[N, h, K, V]`` (float32) when asked for (N: the batch, or the packed
    sequences)."""
    q, v = named["q"], named["v"]
    out = v.new_empty(v.shape)
    if not named.get("output_final_state"):
        return out, None
    cu = named.get("cu_seqlens")
    sequences = cu.shape[0] - 1 if isinstance(cu, torch.Tensor) else q.shape[0]
    widths = (v.shape[-1], q.shape[-1]) if named.get("state_v_first") else (q.shape[-1], v.shape[-1])
    return out, q.new_empty((sequences, v.shape[-2], *widths), dtype=torch.float32)


def by_sequence(algorithm: Callable[..., dict[str, int]], chunk_of: Callable[[Any, Named], int]
                 ) -> Callable[..., MacCount]:
    """A chunked algorithm's formula from a kernel's q and v (``algorithm(q, v, lengths,
    chunk)``), its chunk given (``chunk_size``) or ``chunk_of(q, the other
    arguments)``; packed sequences by their offsets' values where known, else an
    upper bound (each of the b sequences padded by at most C − 1 positions)."""
    def formula(q: Any, v: Any, cu_seqlens: Any = None, chunk_size: int | None = None,
                **rest: Any) -> MacCount:
        chunk = chunk_size or chunk_of(q, rest)
        if cu_seqlens is None:
            return algorithm(q, v, None, chunk)
        starts = getattr(cu_seqlens, "values", None)
        if starts is not None:
            return algorithm(q, v, [b - a for a, b in itertools.pairwise(starts)], chunk)
        return UpperBound(algorithm(q, v, [q[1] + (cu_seqlens[0] - 1) * (chunk - 1)], chunk))

    return formula


def gla_chunk(q: Any, _: Named) -> int:
    """fla's chunk for GLA: the sequence's length to the next power of two, within 16 to
    64."""
    return min(64, max(16, 1 << max(0, q[1] - 1).bit_length()))


def dplr_chunk(_: Any, named: Named) -> int:
    """fla's chunk for the DPLR delta rule: 64 positions where the gate's
    ``lower_bound`` keeps a 64-wide chunk in float32's range (fla 0.6's rule), else
    16."""
    bound = named.get("lower_bound")
    return 64 if isinstance(bound, float | int) and bound < 0 and abs(bound) * 33 / math.log(2) <= 124 else 16


gated_delta_formula = by_sequence(gated_delta_rule_chunked, lambda *_: GATED_DELTA_CHUNK)


kda_formula = by_sequence(kda_chunked, lambda *_: KDA_CHUNK)


gla_formula = by_sequence(linear_attention_chunked, gla_chunk)


simple_gla_formula = by_sequence(linear_attention_chunked, lambda *_: 64)


dplr_formula = by_sequence(dplr_delta_rule_chunked, dplr_chunk)


def twice(formula: Callable[..., MacCount]) -> Callable[..., MacCount]:
    """A backward priced as two gradients of each forward product
    (``docs/conventions.md`` section 7)."""
    def backward(**shapes: Any) -> MacCount:
        forward = formula(**shapes)
        return {part: 2 * macs for part, macs in forward.items()} if isinstance(forward, Mapping) else 2 * forward

    return backward


def linear_cross_entropy_outputs(named: Named) -> tuple[torch.Tensor, ...]:
    """Liger's fused linear cross-entropy: the loss (per token with
    ``reduction="none"``), then the z-loss, the token accuracy and the predicted
    tokens where asked for (``None`` otherwise)."""
    x = named["_input"]
    tokens = x.shape[0]
    loss = x.new_empty((tokens,) if named.get("reduction") == "none" else (), dtype=torch.float32)
    z_loss = x.new_empty((), dtype=torch.float32) if named.get("return_z_loss") else None
    accuracy = x.new_empty((), dtype=torch.float32) if named.get("return_token_accuracy") else None
    predicted = x.new_empty((tokens,), dtype=torch.long) if named.get("return_predicted_tokens") else None
    return loss, z_loss, accuracy, predicted  # type: ignore[return-value]


def logits_of(_input: Any, weight: Any, reduction: Any = None, **_: Any) -> MacCount:
    """The ``lm_head``'s product its fused loss computes chunk by chunk: ``N · d · V``
    (x ``[N, d]``, W ``[V, d]``)."""
    return {"logits": _input[0] * _input[1] * weight[0]}


def linear_cross_entropy_gradients(named: Named) -> MacCount:
    """The gradients Liger's forward computes (mean or sum reduction, an input or the
    weight requiring grad): one ``N · d · V`` product for x's gradient, one for W's;
    with ``reduction="none"`` they wait for the backward."""
    x, weight = named["_input"], named["weight"]
    if named.get("reduction") == "none":
        return 0
    wanted = int(x.requires_grad) + int(weight.requires_grad)
    return {"logits": wanted * x.shape[0] * x.shape[1] * weight.shape[0]} if wanted else 0


def linear_cross_entropy_backward(_input: Any, weight: Any, reduction: Any = None,
                                  **_: Any) -> MacCount:
    """Its backward: scaling the gradients the forward computed (no product), or with
    ``reduction="none"`` the logits again and both gradients (3 · N · d · V)."""
    return {"logits": 3 * _input[0] * _input[1] * weight[0]} if reduction == "none" else 0


def rms_norm(named: Named) -> torch.Tensor:
    """Liger's RMSNorm as the Llama family's ``RMSNorm`` computes it (in float32, then
    the input's dtype, times ``offset + W``)."""
    x, weight = named["X"], named["W"]
    x32 = x.to(torch.float32)
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + named["eps"])
    offset = named.get("offset") or 0.0
    return (weight + offset if offset else weight) * normed.to(x.dtype)


def swiglu(named: Named) -> torch.Tensor:
    """Liger's SwiGLU: ``silu(a) · b`` (times its multipliers, where they are not 1)."""
    a, b = named["a"], named["b"]
    gate, down = named.get("gate_multiplier", 1.0), named.get("down_multiplier", 1.0)
    out = torch.nn.functional.silu(a if gate == 1.0 else a * gate) * b
    return out if down == 1.0 else out * down


def rope(named: Named) -> tuple[torch.Tensor, torch.Tensor]:
    """Liger's RoPE as transformers' ``apply_rotary_pos_emb``: ``x · cos +
    rotate_half(x) · sin`` over the first ``rotary_dim`` widths (all by default)."""
    cos, sin = (named[name].unsqueeze(named.get("unsqueeze_dim", 1)) for name in ("cos", "sin"))

    def rotate(x: torch.Tensor) -> torch.Tensor:
        width = named.get("rotary_dim") or x.shape[-1]
        part, rest = x[..., :width], x[..., width:]
        half = torch.cat((-part[..., width // 2:], part[..., :width // 2]), dim=-1)
        rotated = part * cos[..., :width] + half * sin[..., :width]
        return rotated if rest.shape[-1] == 0 else torch.cat((rotated, rest), dim=-1)

    return rotate(named["q"]), rotate(named["k"])


def cross_entropy(named: Named) -> tuple[torch.Tensor | None, ...]:
    """Liger's cross-entropy: torch's (its z-loss, accuracy and predicted tokens shaped
    as the kernel's)."""
    loss = torch.nn.functional.cross_entropy(
        named["_input"], named["target"], ignore_index=named.get("ignore_index", -100),
        reduction=named.get("reduction", "mean"), label_smoothing=named.get("label_smoothing", 0.0))
    return (loss, *linear_cross_entropy_outputs(named)[1:])


def recurrent_gated_delta(named: Named) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fla's fused recurrent gated delta rule (decoding, short sequences) as the
    token-by-token recurrence it computes, in the ops transformers'
    ``torch_recurrent_gated_delta_rule`` runs (the same records on either path): per
    token the state decays by ``exp(g)``, reads ``k`` (``(S · k).sum``), takes the
    delta ``(v − read) · β`` and the queries read it (``(S · q).sum``), all
    elementwise products and sums (no multiply-accumulate of a matmul: the convention
    of ``docs/conventions.md``). ``q``, ``k`` ``[B, T, h_k, K]``; ``v`` ``[B, T, h,
    V]``; ``g``, ``beta`` ``[B, T, h]``; returns ``o`` like ``v`` and the final state
    ``[B, h, K, V]`` where asked for."""
    q, k, v, g, beta = (named[name] for name in ("q", "k", "v", "g", "beta"))
    dtype, (batch, length, heads_k, width_k), (heads, width_v) = q.dtype, k.shape, v.shape[-2:]
    if heads_k != heads:
        q, k = (x.repeat_interleave(heads // heads_k, dim=2) for x in (q, k))
    q, k, v, beta = (x.transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format)
                     for x in (q, k, v, beta))
    if g is not None:
        g = g.transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format)
    if named.get("use_qk_l2norm_in_kernel"):
        q, k = (x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6) for x in (q, k))
    q = q * (named.get("scale") or width_k ** -0.5)
    initial = named.get("initial_state")
    state = (torch.zeros((batch, heads, width_k, width_v), dtype=v.dtype, device=v.device) if initial is None
             else initial.to(v))
    out = torch.zeros_like(v)
    for i in range(length):
        if g is not None:  # (no gate: the state does not decay)
            state = state * g[:, :, i].exp()[..., None, None]
        read = (state * k[:, :, i].unsqueeze(-1)).sum(dim=-2)
        delta = (v[:, :, i] - read) * beta[:, :, i].unsqueeze(-1)
        state = state + k[:, :, i].unsqueeze(-1) * delta.unsqueeze(-2)
        out[:, :, i] = (state * q[:, :, i].unsqueeze(-1)).sum(dim=-2)
    return out.transpose(1, 2).contiguous().to(dtype), state if named.get("output_final_state") else None


def ssd_formula(x: Any, chunk_size: int, **shapes: Any) -> MacCount:
    """:func:`~flopscope.formulas.kernels.ssd_chunked` (packed sequences, ``seq_idx`` /
    ``cu_seqlens``, chunk the packed length as one sequence: the kernel's chunks run
    over it, the states reset at each boundary)."""
    return ssd_chunked(x, shapes["B"], chunk_size)


def ssd_outputs(named: Named) -> Any:
    """mamba-ssm's ``mamba_chunk_scan_combined``: ``out`` like x; then the final states
    ``[B, H, P, N]`` and the packed sequences' final states ``[S, H, P, N]``
    (float32) where asked for."""
    x, b = named["x"], named["B"]
    batch, _, heads, width = x.shape
    made = [x.new_empty(x.shape)]
    if named.get("return_final_states"):
        made.append(x.new_empty((batch, heads, width, b.shape[-1]), dtype=torch.float32))
    if named.get("return_varlen_states"):
        made.append(x.new_empty((named["cu_seqlens"].shape[0] - 1, heads, width, b.shape[-1]),
                                dtype=torch.float32))
    return made[0] if len(made) == 1 else tuple(made)


def causal_conv_outputs(named: Named) -> Any:
    """causal-conv1d's ``causal_conv1d_fn``: ``out`` like x ``[B, D, L]``, and the final
    states ``[B, D, W − 1]`` where asked for."""
    x, weight = named["x"], named["weight"]
    out = x.new_empty(x.shape)
    if not named.get("return_final_states"):
        return out
    return out, x.new_empty((x.shape[0], x.shape[1], weight.shape[-1] - 1))


def selective_scan_formula(u: Any, **shapes: Any) -> MacCount:
    """Mamba's selective scan: each of the ``B · D · L`` outputs reads its ``N``-wide
    state with C (u ``[B, D, L]``, A ``[D, N]``); discretising and updating the state
    are elementwise, as on transformers' torch path."""
    return u[0] * u[1] * u[2] * shapes["A"][-1]


def selective_scan_outputs(named: Named) -> Any:
    """mamba-ssm's ``selective_scan_fn``: ``out`` like u, and the last state ``[B, D,
    N]`` where asked for."""
    u, a = named["u"], named["A"]
    out = u.new_empty(u.shape)
    return (out, u.new_empty((*u.shape[:2], a.shape[-1]))) if named.get("return_last_state") else out


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """An RMSNorm over the last dim, in float32 (elementwise work only)."""
    x32 = x.to(torch.float32)
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def gated_rms_norm(y: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float, group: int,
                    before_gate: bool) -> torch.Tensor:
    """The gated RMSNorm by groups of ``group`` widths, in float32, as transformers'
    ``MambaRMSNormGated`` computes it (``before_gate``: normalised first, then times
    ``silu(z)``)."""
    dtype = y.dtype
    y = y.to(torch.float32)
    gate = torch.nn.functional.silu(z.to(torch.float32))
    if not before_gate:
        y = y * gate
    grouped = y.view(*y.shape[:-1], -1, group)
    y = (grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + eps)).view(y.shape)
    if before_gate:
        y = y * gate
    return weight * y.to(dtype)


def no_multiply(**_: Any) -> MacCount:
    """A kernel of elementwise work (a norm, an activation, a rotation): no
    multiply-accumulate, as its torch path."""
    return 0


def like(*names: str) -> Callable[[Named], Any]:
    """Outputs of an elementwise kernel: one new tensor like each named argument (one:
    the tensor itself)."""
    def outputs(named: Named) -> Any:
        made = tuple(named[name].new_empty(named[name].shape) for name in names)
        return made[0] if len(made) == 1 else made

    return outputs


def state_update_formula(batch: int, nheads: int, dim: int, dstate: int, **_: Any) -> MacCount:
    """mamba-ssm's decoding step (``selective_state_update``): each head's ``dim``
    outputs read its ``dim × dstate`` state with C, ``batch · nheads · dim · dstate``
    (transformers' torch path: one ``bmm``); the state's update is elementwise."""
    return batch * nheads * dim * dstate


def kvcache_outputs(named: Named) -> tuple[torch.Tensor, torch.Tensor]:
    """flash-attn's ``fwd_kvcache``: ``out`` ``[B, n_q, h, d_v]`` and the log-sum-exp
    ``[B, h, n_q]`` (float32)."""
    q, v = named["q"], named["vcache"]
    return q.new_empty((*q.shape[:-1], v.shape[-1])), q.new_empty((q.shape[0], q.shape[2],
                                                                   q.shape[1]),
                                                                   dtype=torch.float32)
