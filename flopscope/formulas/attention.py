"""The attention kernels' multiply formulas, one ``@formula`` each with its op family,
operand positions and layout: SDPA and its fused kernels (flash, memory-efficient,
cuDNN, flex attention, the nested and varlen forms), ``nn.MultiheadAttention``'s and
``nn.TransformerEncoderLayer``'s fast paths, and their backward kernels. Pure
functions of the arguments' shapes, in MACs (docs/formulas.md section 7)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch

from .registry import BNHD, NestedShape, OpFamily, Shape, UpperBound, formula, prod

aten = torch.ops.aten

__all__ = [  # every formula of this module; flopscope.formulas re-exports them
    'FLEX_ATTENTION',
    'FLEX_ATTENTION_BACKWARD',
    'attention_bnhd',
    'attention_core',
    'attention_core_backward',
    'backward_of',
    'efficient_attention',
    'efficient_attention_backward',
    'flash_attention',
    'flash_attention_backward',
    'flash_pairs',
    'multi_head_attention',
    'native_multi_head_attention',
    'sdpa',
    'sdpa_backward',
    'transformer_encoder_layer',
]


# --------------------------------------------------------------------------------------------------
# attention
# --------------------------------------------------------------------------------------------------
def attention_core(batch_heads: int, n_q: int, n_k: int, d_k: int, d_v: int) -> dict[str, int]:
    """Scores ``Q Kᵀ`` and weighted sum ``softmax(.) V`` over ``batch_heads`` (= B *
    query heads).

    Dense: every (query, key) pair is computed, as the kernel executes it (masks, causal
    included, do not reduce the count; grouped-query K/V heads are broadcast to the
    query heads).
    """
    return {
        "attn_scores": batch_heads * n_q * n_k * d_k,
        "attn_weighted_sum": batch_heads * n_q * n_k * d_v,
    }


@formula(aten._scaled_dot_product_flash_attention_for_cpu, aten._scaled_dot_product_flash_attention,
         aten._scaled_dot_product_efficient_attention, aten._scaled_dot_product_cudnn_attention,
         aten._scaled_dot_product_attention_math,
         aten._scaled_dot_product_fused_attention_overrideable,
         aten._scaled_dot_product_attention_math_for_mps, family=OpFamily.ATTENTION,
         operands=(0, 1, 2))
def sdpa(q: Shape, k: Shape, v: Shape, *_: Any, **__: Any) -> dict[str, int]:
    """Every kernel of ``F.scaled_dot_product_attention``; grouped-query K/V (fewer
    heads) allowed."""
    # [*B, h, n_q, d_v] = sdpa([*B, h, n_q, d_k], [*B, h_kv, n_k, d_k], [*B, h_kv, n_k,
    # d_v])
    return attention_core(prod(q[:-2]), q[-2], k[-2], q[-1], v[-1])


def _flex_attention_ops() -> tuple[Any, Any]:
    try:
        from torch._higher_order_ops.flex_attention import flex_attention, flex_attention_backward
    except ImportError:  # pragma: no cover  (a torch without FlexAttention)
        return None, None
    return flex_attention, flex_attention_backward


FLEX_ATTENTION, FLEX_ATTENTION_BACKWARD = _flex_attention_ops()
"""FlexAttention's higher-order ops
(``torch.nn.attention.flex_attention.flex_attention`` calls the first; its autograd
function the second)."""

if FLEX_ATTENTION is not None:
    @formula(FLEX_ATTENTION, family=OpFamily.ATTENTION, operands=(0, 1, 2))
    def flex_attention(q: Shape, k: Shape, v: Shape, *_: Any, **__: Any) -> dict[str, int]:
        """FlexAttention as its eager implementation (the CPU's, and any device's
        without ``torch.compile``) executes it: dense, every (query, key) pair of
        every head; the block mask and ``score_mod`` change the scores, not how many
        are computed (``docs/conventions.md``). Grouped-query K/V heads allowed."""
        # [B, h, n_q, d_v] = flex_attention(q [B, h, n_q, d_k], k [B, h_kv, n_k, d_k], v
        # [B, h_kv, n_k, d_v], ...)
        return attention_core(prod(q[:-2]), q[-2], k[-2], q[-1], v[-1])


@formula(aten._flash_attention_forward, family=OpFamily.ATTENTION, operands=(0, 1, 2), layout=BNHD)
def flash_attention(q: Shape, k: Shape, v: Shape, cum_seq_q: Shape | None = None,
                    cum_seq_k: Shape | None = None,
                    max_q: int = 0, max_k: int = 0, *_: Any, **__: Any) -> dict[str, int]:
    """FlashAttention's kernel (``[B, n, heads, d]``; variable-length: packed ``[total,
    heads, d]`` with ``cum_seq_q`` / ``cum_seq_k`` offsets): see
    :func:`attention_bnhd`."""
    # [B, n_q, h, d_v] = _flash_attention_forward(q, k, v, cum_seq_q, cum_seq_k, max_q,
    # max_k, dropout, causal, ...)
    return attention_bnhd(q, k, v, cum_seq_q, cum_seq_k, max_q, max_k)


@formula(aten._efficient_attention_forward, family=OpFamily.ATTENTION, operands=(0, 1, 2),
         layout=BNHD)
def efficient_attention(q: Shape, k: Shape, v: Shape, bias: Shape | None = None,
                        cu_seqlens_q: Shape | None = None,
                        cu_seqlens_k: Shape | None = None, max_seqlen_q: int | None = None,
                        max_seqlen_k: int | None = None, *_: Any, **__: Any) -> dict[str, int]:
    """The memory-efficient kernel (same layouts; its offsets come after the bias): see
    :func:`attention_bnhd`."""
    # [B, n_q, h, d_v] = _efficient_attention_forward(q, k, v, bias, cu_seqlens_q,
    # cu_seqlens_k, max_q, max_k, ...)
    return attention_bnhd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q or 0, max_seqlen_k or 0)


def attention_bnhd(q: Shape, k: Shape, v: Shape, offsets_q: Shape | None, offsets_k: Shape | None,
                   max_q: int,
                   max_k: int) -> dict[str, int]:
    """Attention kernels in ``[B, n, heads, d]`` layout. Variable-length calls (packed
    ``[total, heads, d]`` with offsets of ``b`` sequences) compute each sequence
    against itself: exactly ``Σ Lq_i · Lk_i`` pairs per head when the offsets' values
    are known (real mode), else the bound ``b · max_q · max_k`` (what the kernel is
    launched for: an :class:`UpperBound`) (:func:`flash_pairs`)."""
    if offsets_q is None or offsets_k is None:
        offsets_q = offsets_k = None
    pairs, exact = flash_pairs(q, k, offsets_q, offsets_k, max_q, max_k)
    heads, d_k, d_v = q[-2], q[-1], v[-1]
    parts = {"attn_scores": heads * pairs * d_k, "attn_weighted_sum": heads * pairs * d_v}
    return parts if exact else UpperBound(parts)


def flash_pairs(q: Shape, k: Shape, cu_q: Shape | None = None, cu_k: Shape | None = None,
                max_q: int | None = None, max_k: int | None = None, used_k: Shape | None = None,
                pages: Shape | None = None, k_new: Shape | None = None) -> tuple[int, bool]:
    """(query-key pairs per head over the whole call, whether exact) of a
    FlashAttention-style kernel.

    Dense: ``q [B, n_q, h, d]`` against ``k [B, n_k, h_k, d]``, or a KV cache: paged
    (``pages [B, pages per sequence]`` of ``k [pages, page size, h_k, d]``: ``pages[1] ·
    k[1]`` keys of room per sequence) with ``used_k [B]`` keys used in each (the cache's
    lengths; ``k_new [B, n_new, h_k, d]`` keys appended after them). Variable-length:
    packed ``q [total_q, h, d]`` with offsets ``cu_q`` / ``cu_k`` ``[b + 1]``
    (``used_k`` overrides the keys of each sequence). Offsets and lengths with known
    values give the exact pairs; unknown ones the launch bound (``max_q · max_k`` per
    sequence, or the cache's room), with ``False``."""
    new = k_new[1] if k_new is not None and len(k_new) == 4 else 0
    if cu_q is None:
        if len(q) == 3:  # (one unpadded sequence)
            q = (1, *q)
        if len(k) == 3:
            k = (1, *k)
        batch, n_q = q[0], q[1]
        room = pages[1] * k[1] if pages is not None and len(pages) == 2 else k[1]
        if used_k is None:
            return batch * n_q * room, True
        lengths = getattr(used_k, "values", None)
        if lengths is None:
            return batch * n_q * room, False
        return n_q * sum(int(length) + new for length in lengths), True
    sequences = cu_q[0] - 1
    starts_q = getattr(cu_q, "values", None)
    keys = getattr(used_k, "values", None) if used_k is not None else None
    starts_k = getattr(cu_k, "values", None) if used_k is None else None
    if starts_k is not None:
        keys = [b - a for a, b in itertools.pairwise(starts_k)]
    if starts_q is None or keys is None:
        return sequences * (max_q or 0) * (max_k or 0), False
    return sum((b - a) * (int(n) + new) for (a, b), n in zip(itertools.pairwise(starts_q), keys, strict=True)), True


def multi_head_attention(tokens_q: int, n_q: int, n_k: int, embed_dim: int) -> dict[str, int]:
    """Fused multi-head attention with packed ``[3E, E]`` in-projection and ``[E, E]``
    out-projection.

    ``tokens_q = B * n_q``; keys and values are ``B * n_k`` tokens of width E; heads
    split E, so the core is ``B * n_q * n_k * E`` per matmul whatever the head count.
    """
    batch = tokens_q // n_q
    tokens_k = batch * n_k
    parts = {
        "q_proj": tokens_q * embed_dim * embed_dim,
        "k_proj": tokens_k * embed_dim * embed_dim,
        "v_proj": tokens_k * embed_dim * embed_dim,
    }
    parts.update(attention_core(batch, n_q, n_k, embed_dim, embed_dim))
    parts["out_proj"] = tokens_q * embed_dim * embed_dim
    return parts


@formula(aten._native_multi_head_attention, family=OpFamily.FUSED_LAYER)
def native_multi_head_attention(query: Shape, key: Shape, value: Shape, embed_dim: int,
                                num_head: int,
                                *_: Any, **__: Any) -> dict[str, int]:
    """The eval fast path of ``nn.MultiheadAttention`` (batch-first, ``kdim == vdim ==
    embed_dim``)."""
    # [B, n_q, E] = _native_multi_head_attention([B, n_q, E], [B, n_k, E], [B, n_k, E],
    # E, h, [3E, E], ...)
    if isinstance(query, NestedShape):  # self-attention over variable-length sequences
        return _nested_self_attention(query.lengths, embed_dim)
    return multi_head_attention(prod(query[:-1]), query[-2] if len(query) > 1 else 1,
                                key[-2] if len(key) > 1 else 1, embed_dim)


def _nested_self_attention(lengths: Sequence[int], embed_dim: int) -> dict[str, int]:
    """Self-attention of each sequence on its own: projections on its L tokens, core L²
    each."""
    parts: dict[str, int] = {}
    for length in lengths:
        for role, macs in multi_head_attention(length, length, length, embed_dim).items():
            parts[role] = parts.get(role, 0) + macs
    return parts


@formula(aten._transformer_encoder_layer_fwd, family=OpFamily.FUSED_LAYER)
def transformer_encoder_layer(src: Shape, embed_dim: int, num_heads: int, qkv_weight: Shape,
                              qkv_bias: Any,
                              proj_weight: Shape, proj_bias: Any, use_gelu: bool, norm_first: bool,
                              eps: float,
                              norm_weight_1: Any, norm_bias_1: Any, norm_weight_2: Any,
                              norm_bias_2: Any,
                              ffn_weight_1: Shape, *_: Any, **__: Any) -> dict[str, int]:
    """The fused eval fast path of ``nn.TransformerEncoderLayer``: self-attention plus a
    two-layer FFN."""
    # [B, n, E] = _transformer_encoder_layer_fwd([B, n, E], E, h, [3E, E], ..., [F, E],
    # [F], [E, F], [E], ...) padded batch passed as a nested tensor: no work on the
    # padding
    if isinstance(src, NestedShape):
        tokens, parts = sum(src.lengths), _nested_self_attention(src.lengths, embed_dim)
    else:
        tokens, n = prod(src[:-1]), (src[-2] if len(src) > 1 else 1)
        parts = multi_head_attention(tokens, n, n, embed_dim)
    d_ff = ffn_weight_1[0]
    parts["ffn_up"] = tokens * embed_dim * d_ff
    parts["ffn_down"] = tokens * d_ff * embed_dim
    return parts


# backward kernels (counted when profiling with backward=True)
def attention_core_backward(batch_heads: int, n_q: int, n_k: int, d_k: int,
                            d_v: int) -> dict[str, int]:
    """Flash-style attention backward: recompute S = QKᵀ, then dV = Pᵀ·dO and dP = dO·Vᵀ
    (the weighted sum's gradients), dQ = dS·K and dK = dSᵀ·Q (the scores' gradients):
    2.5x the forward core when d_k == d_v, as PyTorch's counter and FlashAttention-2
    count it."""
    return backward_of(attention_core(batch_heads, n_q, n_k, d_k, d_v))


def backward_of(core: dict[str, int]) -> dict[str, int]:
    """The backward of a forward attention core (see :func:`attention_core_backward`); a
    bound stays a bound."""
    parts = {"attn_scores": 3 * core["attn_scores"],
             "attn_weighted_sum": 2 * core["attn_weighted_sum"]}
    return UpperBound(parts) if isinstance(core, UpperBound) else parts


@formula(aten._scaled_dot_product_flash_attention_for_cpu_backward,
         aten._scaled_dot_product_flash_attention_backward,
         aten._scaled_dot_product_efficient_attention_backward,
         aten._scaled_dot_product_cudnn_attention_backward,
         aten._scaled_dot_product_fused_attention_overrideable_backward, family=OpFamily.ATTENTION,
         operands=(1, 2, 3))
def sdpa_backward(grad_out: Shape, q: Shape, k: Shape, v: Shape, *_: Any,
                  **__: Any) -> dict[str, int]:
    # (dQ, dK, dV) = sdpa_backward(dO [*B, h, n_q, d_v], Q [*B, h, n_q, d_k], K, V [*B,
    # h_kv, n_k, d], ...)
    return attention_core_backward(prod(q[:-2]), q[-2], k[-2], q[-1], v[-1])


@formula(aten._flash_attention_backward, family=OpFamily.ATTENTION, operands=(1, 2, 3), layout=BNHD)
def flash_attention_backward(grad_out: Shape, q: Shape, k: Shape, v: Shape, out: Shape,
                             logsumexp: Shape,
                             cum_seq_q: Shape | None = None, cum_seq_k: Shape | None = None,
                             max_q: int = 0,
                             max_k: int = 0, *_: Any, **__: Any) -> dict[str, int]:
    """Backward of FlashAttention's kernel, variable-length included (see
    :func:`attention_bnhd`)."""
    # (dQ, dK, dV) = _flash_attention_backward(dO, q, k, v, out, logsumexp, cum_seq_q,
    # cum_seq_k, max_q, max_k, ...)
    return backward_of(attention_bnhd(q, k, v, _varlen(cum_seq_q), _varlen(cum_seq_k), max_q,
                                      max_k))


@formula(aten._efficient_attention_backward, family=OpFamily.ATTENTION, operands=(1, 2, 3),
         layout=BNHD)
def efficient_attention_backward(grad_out: Shape, q: Shape, k: Shape, v: Shape, bias: Shape | None,
                                 out: Shape,
                                 cu_seqlens_q: Shape | None = None,
                                 cu_seqlens_k: Shape | None = None,
                                 max_seqlen_q: int = 0, max_seqlen_k: int = 0, *_: Any,
                                 **__: Any) -> dict[str, int]:
    """Backward of the memory-efficient kernel, variable-length included (see
    :func:`attention_bnhd`)."""
    # (dQ, dK, dV, dBias) = _efficient_attention_backward(dO, q, k, v, bias, out, cu_q,
    # cu_k, max_q, max_k, ...)
    return backward_of(attention_bnhd(q, k, v, _varlen(cu_seqlens_q), _varlen(cu_seqlens_k),
                                      max_seqlen_q,
                                      max_seqlen_k))


def _varlen(offsets: Shape | None) -> Shape | None:
    """Offsets of a variable-length call; None for a dense one (a backward kernel gets
    an empty tensor there)."""
    return offsets if offsets is not None and len(offsets) == 1 and offsets[0] > 0 else None


if FLEX_ATTENTION_BACKWARD is not None:
    @formula(FLEX_ATTENTION_BACKWARD, family=OpFamily.ATTENTION, operands=(0, 1, 2))
    def flex_attention_backward(q: Shape, k: Shape, v: Shape, *_: Any, **__: Any) -> dict[str, int]:
        """FlexAttention's backward as its eager implementation runs it: dense, the
        scores recomputed, then the four gradient products
        (:func:`attention_core_backward`). In torch 2.13 the CPU refuses it."""
        # (dQ, dK, dV, ...) = flex_attention_backward(q, k, v, out, logsumexp, grad_out,
        # grad_logsumexp, ...)
        return attention_core_backward(prod(q[:-2]), q[-2], k[-2], q[-1], v[-1])
