"""The kernels production GPUs run, registered by their libraries' op names: they load
only where those libraries are installed (a CUDA machine), so each is registered by
qualified name and found once its library has loaded
(:meth:`~flopscope.formulas.registry.FormulaRegistry.spec`).

- **FlashAttention 2** (flash-attn >= 2.7 calls its kernels through ``torch.library``
  custom ops): ``flash_attn::_flash_attn_forward`` / ``_flash_attn_varlen_forward`` and
  their backwards;
- **FlashAttention 3** (``hopper/``): the Python custom ops
  ``flash_attn_3::_flash_attn_forward`` / ``_backward`` and the C++ library's
  ``flash_attn_3::fwd`` / ``bwd`` they call (a dispatch mode sees the outer op only);
- **Hub kernels** (``kernels``, ``use_kernels=True``): a Hub kernel's namespace is its
  name and a build hash (``_flash_attn_2b4ec51_dirty``); the registrations below name
  the kernel without the hash (:func:`~flopscope.formulas.registry.hub_name`):
  FlashAttention 2's C++ API as kernels-community/flash-attn builds it (``fwd``,
  ``varlen_fwd``, ``fwd_kvcache``, ``bwd``, ``varlen_bwd``), and FlashAttention 3's
  (``flash_attn3``, ``vllm_flash_attn3``);
- **xFormers' flash op** (``xformers.ops.memory_efficient_attention`` on its flash
  backend): ``xformers_flash::flash_fwd`` / ``flash_bwd`` (its names for the arguments:
  ``query``, ``key``, ``value``, ``block_tables``, ``is_causal``, ``window_left``);
- **causal-conv1d** (>= 1.5.2): ``DaoAILab::_causal_conv1d_fwd_cpp``, ``_bwd_cpp``,
  ``_update_cpp``.

Every attention kernel here is priced as ``aten._flash_attention_forward`` is
(``docs/conventions.md`` section 5): the (query, key) pairs the kernel is launched for,
dense per sequence, so that a model counts the same with
``attn_implementation="flash_attention_2"`` on a GPU as with ``"sdpa"`` or ``"eager"``
on a CPU; its ``causal`` and ``window_size_left`` are read by the attention conventions
(``"causal"``, ``"mask"``) as the ATen kernels' are. Where the keys a sequence uses are
data (variable-length offsets, a KV cache's lengths), their values give the exact pairs
in real mode; on fake tensors the kernel's launch bound (``max_seqlen``, the cache's
capacity) is counted and flagged as an :class:`~flopscope.formulas.registry.UpperBound`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .attention import backward_of, flash_pairs
from .registry import BNHD, OpFamily, Shape, UpperBound, by_name, formula

__all__ = [
    'GATED_DELTA_CHUNK',
    'causal_conv1d',
    'causal_conv1d_backward',
    'causal_conv1d_update',
    'dplr_delta_rule_chunked',
    'flash_kernel',
    'flash_kernel_backward',
    'gated_delta_rule_chunked',
    'kda_chunked',
    'linear_attention_chunked',
    'ssd_chunked',
    'xformers_flash_backward',
]


def _first(named: Mapping[str, Any], *names: str) -> Any:
    """The first of ``names`` the op was given (not ``None``): one argument under each
    library's name for it."""
    return next((named[name] for name in names if named.get(name) is not None), None)


_ALIASES = {"query": "q", "key": "k", "value": "v", "block_tables": "block_table"}
"""xFormers' names for flash-attn's arguments."""


def _flash_forward(named: Mapping[str, Any]) -> dict[str, int]:
    named = {_ALIASES.get(name, name): value for name, value in named.items()}
    q = named["q"]
    kvcache = named.get("kcache") is not None
    k = named["kcache"] if kvcache else named["k"]
    v = named["vcache"] if kvcache else named["v"]
    k_new = named.get("k") if kvcache else named.get("k_new")
    pairs, exact = flash_pairs(
        q, k, named.get("cu_seqlens_q"), named.get("cu_seqlens_k"), named.get("max_seqlen_q"),
        named.get("max_seqlen_k"), _first(named, "seqused_k", "seqused_k_", "seqlens_k"),
        _first(named, "page_table", "block_table", "block_table_"), k_new)
    heads, d_k, d_v = q[-2], q[-1], v[-1]
    # (FlashAttention 3: a second query block scored against V, as in MLA)
    qv = _first(named, "qv", "q_v")
    parts = {"attn_scores": heads * pairs * (d_k + (qv[-1] if qv is not None else 0)),
             "attn_weighted_sum": heads * pairs * d_v}
    return parts if exact else UpperBound(parts)


_FORWARD = ("flash_attn::_flash_attn_forward", "flash_attn::_flash_attn_varlen_forward",
            "flash_attn_3::_flash_attn_forward", "flash_attn_3::fwd",
            # Hub kernels, by kernel name (the build hash dropped)
            "flash_attn::fwd", "flash_attn::varlen_fwd", "flash_attn::fwd_kvcache",
            "flash_attn3::fwd",
            "vllm_flash_attn3::fwd", "vllm_flash_attn::varlen_fwd", "vllm_flash_attn::fwd_kvcache",
            "xformers_flash::flash_fwd")
_BACKWARD = ("flash_attn::_flash_attn_backward", "flash_attn::_flash_attn_varlen_backward",
             "flash_attn_3::_flash_attn_backward", "flash_attn_3::bwd",
             "flash_attn::bwd", "flash_attn::varlen_bwd", "flash_attn3::bwd",
             "vllm_flash_attn3::bwd")


@formula(*_FORWARD, family=OpFamily.ATTENTION, operands=(0, 1, 2), layout=BNHD)
@by_name
def flash_kernel(named: Mapping[str, Any], **_: Any) -> dict[str, int]:
    """FlashAttention's forward kernels, read by argument name (each library's names for
    one argument): q, k and v (a KV cache's ``kcache`` / ``vcache``, with new keys
    ``k`` / ``k_new``), the variable-length offsets, the keys used per sequence
    (``seqused_k``, ``seqlens_k``) and a page table (:func:`flash_pairs`). Parts:
    ``attn_scores = h · pairs · d_k`` (plus ``h · pairs · d_qv`` for FlashAttention
    3's ``qv``), ``attn_weighted_sum = h · pairs · d_v``, where h is the number of
    query heads; softcap, ALiBi and dropout change no product."""
    # out [B, n_q, h, d_v] = fwd(q [B, n_q, h, d], k [B, n_k, h_k, d], v [B, n_k, h_k,
    # d_v], ...)
    return _flash_forward(named)


@formula(*_BACKWARD, family=OpFamily.ATTENTION, operands=(1, 2, 3), layout=BNHD)
@by_name
def flash_kernel_backward(named: Mapping[str, Any], **_: Any) -> dict[str, int]:
    """FlashAttention's backward kernels: the forward's scores recomputed, then the four
    gradient products (:func:`~flopscope.formulas.linear_algebra.backward_of`: 3x the
    scores' part, 2x the weighted sum's)."""
    # (dq, dk, dv) = bwd(dout, q, k, v, out, softmax_lse, dq, dk, dv, [cu_seqlens_q,
    # cu_seqlens_k, ...], ...)
    forward = _flash_forward({**named, "seqused_k": _first(named, "seqused_k", "sequed_k")})
    return backward_of(forward)


@formula("xformers_flash::flash_bwd", family=OpFamily.ATTENTION, operands=(2, 3, 4), layout=BNHD)
@by_name
def xformers_flash_backward(named: Mapping[str, Any], **_: Any) -> dict[str, int]:
    """xFormers' flash backward (``flash_bwd(grads_share_storage, grad, query, key,
    value, ...)``): as :func:`flash_kernel_backward`."""
    return backward_of(_flash_forward(named))


@formula("DaoAILab::_causal_conv1d_fwd_cpp", family=OpFamily.CONV)
def causal_conv1d(x: Shape, weight: Shape, *_: Any, **__: Any) -> int:
    """causal-conv1d's depthwise causal convolution: each of the ``B · D · L`` outputs
    is a dot product of its channel's ``W`` taps (the kernel computes the L outputs
    only; ``nn.Conv1d`` with ``padding=W-1`` then cut to L, transformers' reference
    path, computes ``L + W - 1`` per channel: ``docs/conventions.md``)."""
    # out [B, D, L] = causal_conv1d_fwd(x [B, D, L], weight [D, W], bias, seq_idx,
    # initial_states, out, ...)
    return x[0] * x[1] * x[2] * weight[-1]


@formula("DaoAILab::_causal_conv1d_bwd_cpp", family=OpFamily.CONV)
def causal_conv1d_backward(x: Shape, weight: Shape, *_: Any, **__: Any) -> int:
    """Its backward: the gradient of the input and of the weight, each one forward's
    products."""
    # (dx, dweight) = causal_conv1d_bwd(x [B, D, L], weight [D, W], bias, dout, seq_idx,
    # ..., dx, dweight, ...)
    return 2 * causal_conv1d(x, weight)


@formula("DaoAILab::_causal_conv1d_update_cpp", family=OpFamily.CONV)
def causal_conv1d_update(x: Shape, conv_state: Shape, weight: Shape, *_: Any, **__: Any) -> int:
    """One decoding step (or a few) against the cached state: ``B · D · L_new · W`` (x
    ``[B, D]``: one position)."""
    # out [B, D(, L)] = causal_conv1d_update(x [B, D(, L)], conv_state [B, D, S], weight
    # [D, W], bias, out, ...)
    new = x[2] if len(x) == 3 else 1
    return x[0] * x[1] * new * weight[-1]


GATED_DELTA_CHUNK = 64
"""The chunk length of the chunked gated delta rule, as transformers' reference and
fla's kernels chunk it."""


def _chunked(q: Shape, v: Shape, lengths: Sequence[int] | None,
             chunk: int) -> tuple[int, int, int, int]:
    """(value heads, positions padded to whole chunks of ``chunk`` over every sequence,
    key width, value width) of a chunked kernel's ``q [B, T, h_k, K]`` and ``v [B, T,
    h, V]``; ``lengths``: the sequences packed in ``T``."""
    sequences = list(lengths) if lengths is not None else [q[1]] * q[0]
    return v[-2], sum(-(-n // chunk) * chunk for n in sequences), q[-1], v[-1]


def gated_delta_rule_chunked(q: Shape, v: Shape, lengths: Sequence[int] | None = None,
                             chunk: int = GATED_DELTA_CHUNK) -> dict[str, int]:
    """The gated delta rule over chunks of ``chunk`` positions (Yang et al. 2024, "Gated
    Delta Networks"), priced as its chunked algorithm computes it (transformers'
    ``torch_chunk_gated_delta_rule``, which fla's ``chunk_gated_delta_rule`` replaces
    on a GPU: one price for the algorithm on every device, ``docs/conventions.md``).
    ``q [B, T, h_k, K]``, ``v [B, T, h, V]`` (h value heads; the queries and keys are
    repeated to them); ``lengths``: the sequences packed in ``T`` (variable length),
    each padded to whole chunks.

    Per value head and padded position (T' positions in N chunks of C): the in-chunk
    scores ``q·kᵀ`` T'·C·K (``attn_scores``) and their product with the corrected values
    T'·C·V (``attn_weighted_sum``); the state's write ``kᵀ·v_new`` T'·K·V
    (``attn_kv_state``) and its two reads ``q·S`` and ``k_cumdecay·S`` 2·T'·K·V
    (``attn_readout``); the key Gram matrix ``β·k·kᵀ`` T'·C·K and the two
    unit-triangular solves of the UT transform N·(K + V)·C(C−1)/2 (``other``)."""
    heads, padded, k_width, v_width = _chunked(q, v, lengths, chunk)
    chunks = padded // chunk
    return {
        "attn_scores": heads * padded * chunk * k_width,
        "attn_weighted_sum": heads * padded * chunk * v_width,
        "attn_kv_state": heads * padded * k_width * v_width,
        "attn_readout": 2 * heads * padded * k_width * v_width,
        "other": heads * (padded * chunk * k_width + chunks * (k_width + v_width) * (chunk * (chunk - 1) // 2)),
    }


def ssd_chunked(x: Shape, b: Shape, chunk: int) -> dict[str, int]:
    """Mamba-2's state space duality over chunks of ``chunk`` positions (Dao & Gu 2024,
    "Transformers are SSMs"), priced as its chunked algorithm computes it
    (transformers' ``mamba2_chunk_scan``, which mamba-ssm's
    ``mamba_chunk_scan_combined`` replaces on a GPU: one price for the algorithm on
    every device, ``docs/conventions.md``). ``x [B, T, H, P]``, ``b`` (and C) ``[B,
    T, G, N]`` (G groups of the heads; B and C are repeated to the H heads); T is
    padded to T' = N_c · chunk.

    Per head: the in-chunk scores ``C·Bᵀ`` B·T'·chunk·N (``attn_scores``) and their
    product with the inputs B·T'·chunk·P (``attn_weighted_sum``); the chunk states
    ``Bᵀ·x`` B·T'·P·N, the passing of states between chunks (the initial state and the
    N_c chunks' states, each start state a sum over the chunks before it) B·(N_c +
    1)²·P·N and the states' read ``C·S`` B·T'·N·P (``other``: an SSM's state is read by
    no query projection, ``flopscope.attribute.roles``)."""
    batch, length, heads, width = x[0], x[1], x[2], x[3]
    state = b[-1]
    chunks = -(-length // chunk)
    padded = chunks * chunk
    return {
        "attn_scores": batch * heads * padded * chunk * state,
        "attn_weighted_sum": batch * heads * padded * chunk * width,
        "other": batch * heads * width * state * (2 * padded + (chunks + 1) ** 2),
    }


KDA_CHUNK = 64
"""The chunk length of Kimi Delta Attention, as transformers' reference and fla's
``chunk_kda`` chunk it."""


def kda_chunked(q: Shape, v: Shape, lengths: Sequence[int] | None = None,
                chunk: int = KDA_CHUNK) -> dict[str, int]:
    """Kimi Delta Attention over chunks of ``chunk`` positions (the gated delta rule
    with a decay per key channel), priced as its chunked algorithm computes it
    (transformers' ``chunk_kimi_delta_attention``, which fla's ``chunk_kda`` replaces
    on a GPU: one price for the algorithm on every device, ``docs/conventions.md``).
    ``q [B, T, h, K]``, ``v [B, T, h, V]``; ``lengths``: the sequences packed in
    ``T``, each padded to whole chunks.

    Per head and padded position (T' positions): the state's write ``kᵀ·v_new`` T'·K·V
    (``attn_kv_state``), its two reads ``q·S`` and ``k_cumdecay·S`` 2·T'·K·V
    (``attn_readout``); the UT transform's products with the values and the decayed keys
    T'·C·(V + K) and the in-chunk scores' product with the corrected values T'·C·V
    (``other``: the in-chunk scores themselves, decayed per channel, are elementwise
    products summed, as the torch path computes them)."""
    heads, padded, k_width, v_width = _chunked(q, v, lengths, chunk)
    return {
        "attn_kv_state": heads * padded * k_width * v_width,
        "attn_readout": 2 * heads * padded * k_width * v_width,
        "other": heads * padded * chunk * (2 * v_width + k_width),
    }


def linear_attention_chunked(q: Shape, v: Shape, lengths: Sequence[int] | None = None,
                             chunk: int = 64
                             ) -> dict[str, int]:
    """Gated linear attention over chunks of ``chunk`` positions (GLA, Yang et al. 2023;
    simple GLA / RetNet's scalar decay), as fla's chunked kernels compute it: per
    chunk the decayed in-chunk scores ``q·kᵀ`` and their product with the values,
    then the state's read ``q·S`` and its write ``kᵀ·v``. ``q [B, T, h, K]``, ``v [B,
    T, h, V]``; ``lengths``: the sequences packed in ``T``, each padded to whole
    chunks.

    Per head and padded position (T' positions): ``attn_scores`` T'·C·K,
    ``attn_weighted_sum`` T'·C·V, ``attn_readout`` T'·K·V, ``attn_kv_state`` T'·K·V."""
    heads, padded, k_width, v_width = _chunked(q, v, lengths, chunk)
    return {
        "attn_scores": heads * padded * chunk * k_width,
        "attn_weighted_sum": heads * padded * chunk * v_width,
        "attn_kv_state": heads * padded * k_width * v_width,
        "attn_readout": heads * padded * k_width * v_width,
    }


def dplr_delta_rule_chunked(q: Shape, v: Shape, lengths: Sequence[int] | None = None,
                            chunk: int = 16
                            ) -> dict[str, int]:
    """The delta rule with a diagonal-plus-low-rank transition (``S ← S·(diag(exp(g)) +
    a·bᵀ) + kᵀ·v``: RWKV-7, fla's ``chunk_dplr_delta_rule``) over chunks of ``chunk``
    positions, priced as fla's own chunked reference computes it
    (``fla.ops.generalized_delta_rule.dplr.naive.dplr_chunkwise``: no torch path in
    transformers). ``q [B, T, h, K]``, ``v [B, T, h, V]``; ``lengths``: the sequences
    packed in ``T``, each padded to whole chunks.

    Per head and padded position (T' positions): the in-chunk scores' products with the
    values and with the state-corrected values, 2·T'·C·V (``attn_weighted_sum``: the
    scores themselves are decayed per key channel, products summed, elementwise); the
    state's two writes ``kᵀ·v`` and ``bᵀ·v₂`` 2·T'·K·V (``attn_kv_state``) and its two
    reads ``q·S`` and ``w·S`` 2·T'·K·V (``attn_readout``); the UT transform's products
    ``A_ab·(A_ak·v)`` and ``A_ab·a`` T'·C·(2V + K) (``other``)."""
    heads, padded, k_width, v_width = _chunked(q, v, lengths, chunk)
    return {
        "attn_weighted_sum": 2 * heads * padded * chunk * v_width,
        "attn_kv_state": 2 * heads * padded * k_width * v_width,
        "attn_readout": 2 * heads * padded * k_width * v_width,
        "other": heads * padded * chunk * (2 * v_width + k_width),
    }
