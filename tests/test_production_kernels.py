"""The kernels production GPUs run, counted on a CPU: stand-in custom ops with the real libraries' names, schemas and
fake implementations (flash-attn 2's and 3's ``torch.library`` ops, a Hub kernel's hashed namespace, xFormers' flash
ops, causal-conv1d's ``DaoAILab`` ops), profiled against closed forms and against the torch reference path of the same
block."""

from __future__ import annotations

import sys
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import flopscope
from flopscope.formulas import BNHD, REGISTRY, OpFamily, hub_name

B, N, H, D = 2, 64, 4, 16  # batch, positions, query heads, head width
E = H * D

# each library's schema, as its own registration declares it (flash-attn's are inferred by torch.library.custom_op
# from the Python signatures; the Hub kernel's and FlashAttention 3's C++ ones are written in TORCH_LIBRARY)
SCHEMAS = {
    "flash_attn::_flash_attn_forward":
        "(Tensor q, Tensor k, Tensor v, float dropout_p, float softmax_scale, bool causal, SymInt window_size_left, "
        "SymInt window_size_right, float softcap, Tensor? alibi_slopes, bool return_softmax) "
        "-> (Tensor, Tensor, Tensor, Tensor)",
    "flash_attn::_flash_attn_varlen_forward":
        "(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, SymInt max_seqlen_q, "
        "SymInt max_seqlen_k, float dropout_p, float softmax_scale, bool causal, SymInt window_size_left=-1, "
        "SymInt window_size_right=-1, float softcap=0.0, Tensor? alibi_slopes=None, bool return_softmax=False, "
        "Tensor? block_table=None, Tensor? leftpad_k=None, Tensor? seqused_k=None, bool zero_tensors=False, "
        "SymInt num_splits=0) -> (Tensor, Tensor, Tensor, Tensor)",
    "flash_attn::_flash_attn_backward":
        "(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, Tensor(a!)? dq, Tensor(b!)? dk, "
        "Tensor(c!)? dv, float dropout_p, float softmax_scale, bool causal, SymInt window_size_left, "
        "SymInt window_size_right, float softcap, Tensor? alibi_slopes, bool deterministic, "
        "Tensor? rng_state=None) -> Tensor",
    "flash_attn_3::_flash_attn_forward":
        "(Tensor q, Tensor k, Tensor v, Tensor? k_new=None, Tensor? v_new=None, Tensor? qv=None, "
        "Tensor? out_=None, Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, Tensor? cu_seqlens_k_new=None, "
        "Tensor? seqused_q=None, Tensor? seqused_k=None, SymInt? max_seqlen_q=None, SymInt? max_seqlen_k=None, "
        "Tensor? page_table=None, Tensor? kv_batch_idx=None, Tensor? leftpad_k=None, Tensor? rotary_cos=None, "
        "Tensor? rotary_sin=None, Tensor? seqlens_rotary=None, Tensor? q_descale=None, Tensor? k_descale=None, "
        "Tensor? v_descale=None, float? softmax_scale=None, bool causal=False, SymInt window_size_left=-1, "
        "SymInt window_size_right=-1, SymInt attention_chunk=0, float softcap=0.0, bool rotary_interleaved=True, "
        "Tensor? scheduler_metadata=None, SymInt num_splits=1, bool? pack_gqa=None, SymInt sm_margin=0) "
        "-> (Tensor, Tensor, Tensor, Tensor)",
    "_flash_attn_2b4ec51_dirty::fwd":
        "(Tensor(a!) q, Tensor k, Tensor v, Tensor(b!)? out_, Tensor? alibi_slopes_, float p_dropout, "
        "float softmax_scale, bool is_causal, int window_size_left, int window_size_right, float softcap, "
        "bool return_softmax, Generator? gen_) -> Tensor[]",
    "xformers_flash::flash_fwd":
        "(Tensor query, Tensor key, Tensor value, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, Tensor? seqused_k, "
        "SymInt max_seqlen_q, SymInt max_seqlen_k, float p, float softmax_scale, bool is_causal, SymInt window_left, "
        "SymInt window_right, bool return_softmax, Tensor? block_tables) -> (Tensor, Tensor, Tensor)",
    "xformers_flash::flash_bwd":
        "(bool grads_share_storage, Tensor grad, Tensor query, Tensor key, Tensor value, Tensor out, Tensor lse, "
        "Tensor cu_seqlens_q, Tensor cu_seqlens_k, SymInt max_seqlen_q, SymInt max_seqlen_k, float p, "
        "float softmax_scale, bool is_causal, SymInt window_left, SymInt window_right, Tensor rng_state) "
        "-> (Tensor, Tensor, Tensor)",
    "DaoAILab::_causal_conv1d_fwd_cpp":
        "(Tensor x, Tensor weight, Tensor? bias, Tensor? seq_idx, Tensor? initial_states, Tensor(a!) out, "
        "Tensor(b!)? final_states_out, bool silu_activation) -> ()",
}


def _attention_outputs(q, v, *_, **__):
    """out [..., h, d_v], softmax_lse, p, rng_state: the shapes flash-attn's fake implementations give."""
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))
    return out, q.new_empty(q.shape[:-1], dtype=torch.float32), q.new_empty((0,)), q.new_empty((2,), dtype=torch.int64)


IMPLEMENTATIONS = {  # each op's outputs (the same for the CPU kernel and the fake one: values are not counted)
    "flash_attn::_flash_attn_forward": lambda q, k, v, *a: _attention_outputs(q, v),
    "flash_attn::_flash_attn_varlen_forward": lambda q, k, v, *a, **kw: _attention_outputs(q, v),
    "flash_attn::_flash_attn_backward": lambda dout, q, *a, **kw: q.new_empty(q.shape[:-1], dtype=torch.float32),
    "flash_attn_3::_flash_attn_forward": lambda q, k, v, *a, **kw: _attention_outputs(q, v),
    "_flash_attn_2b4ec51_dirty::fwd": lambda q, k, v, *a: list(_attention_outputs(q, v)),
    "DaoAILab::_causal_conv1d_fwd_cpp": lambda *a: None,
    "xformers_flash::flash_fwd": lambda q, k, v, *a: _attention_outputs(q, v)[:3],
    "xformers_flash::flash_bwd": lambda share, grad, q, k, v, *a: (q.new_empty(q.shape), k.new_empty(k.shape),
                                                                    v.new_empty(v.shape)),
}
_LIBRARIES = []


def _define() -> None:
    for name, schema in SCHEMAS.items():
        namespace, _, op = name.partition("::")
        if hasattr(getattr(torch.ops, namespace), op):
            continue
        library = torch.library.Library(namespace, "FRAGMENT")
        library.define(op + schema)
        library.impl(op, IMPLEMENTATIONS[name], "CPU")
        library.impl(op, IMPLEMENTATIONS[name], "Meta")
        _LIBRARIES.append(library)


_define()
ops = torch.ops


class FlashBlock(nn.Module):
    """A self-attention block whose core is one kernel: ``"sdpa"`` (the torch reference path a CPU runs),
    ``"flash"`` (flash-attn 2's op), ``"flash3"`` (3's), ``"hub"`` (a Hub kernel's), ``"xformers"`` (xFormers'
    flash op)."""

    def __init__(self, kernel: str, causal: bool = True) -> None:
        super().__init__()
        self.kernel, self.causal = kernel, causal
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(E, E, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = (proj(x).view(b, n, H, D) for proj in (self.q_proj, self.k_proj, self.v_proj))
        scale = D ** -0.5
        if self.kernel == "sdpa":
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                 is_causal=self.causal).transpose(1, 2)
        elif self.kernel == "flash":
            out = ops.flash_attn._flash_attn_forward(q, k, v, 0.0, scale, self.causal, -1, -1, 0.0, None, False)[0]
        elif self.kernel == "flash3":
            out = ops.flash_attn_3._flash_attn_forward(q, k, v, softmax_scale=scale, causal=self.causal)[0]
        elif self.kernel == "xformers":
            out = ops.xformers_flash.flash_fwd(q, k, v, None, None, None, n, n, 0.0, scale, self.causal, -1, -1,
                                               False, None)[0]
        else:
            out = ops._flash_attn_2b4ec51_dirty.fwd(q, k, v, None, None, 0.0, scale, self.causal, -1, -1, 0.0,
                                                    False, None)[0]
        return self.o_proj(out.reshape(b, n, E))


def profile(model: nn.Module, *args, mode: str = "fake") -> flopscope.Profile:
    with torch.no_grad():
        return flopscope.profile(model.eval(), *args, mode=mode)


def test_hub_namespaces_are_matched_by_kernel_name_without_the_build_hash():
    assert hub_name("_flash_attn_2b4ec51_dirty::fwd") == "flash_attn::fwd"
    assert hub_name("_flash_attn3_0123abcd::fwd") == "flash_attn3::fwd"
    assert hub_name("_gsplat_20250920003636::rasterize") == "gsplat::rasterize"
    assert hub_name("flash_attn::fwd") is None and hub_name("_private::op") is None
    spec = REGISTRY.spec(ops._flash_attn_2b4ec51_dirty.fwd.default)
    assert spec is not None and spec.family is OpFamily.ATTENTION and spec.layout == BNHD
    assert REGISTRY.spec(ops.flash_attn._flash_attn_forward.default) is not None


EXPECTED = {"q_proj": B * N * E * E, "k_proj": B * N * E * E, "v_proj": B * N * E * E,
            "attn_scores": B * H * N * N * D, "attn_weighted_sum": B * H * N * N * D, "out_proj": B * N * E * E}
"""One block's roles: projections B·N·E² each, scores and weighted sum B·H·N²·D each (dense, as SDPA's kernels are
counted: docs/conventions.md section 5)."""


def test_flash_attention_ops_count_as_the_torch_reference_path():
    """Every kernel of one block counts the same, total and roles, on fake tensors and on meta; the "causal"
    convention reads the flash ops' ``causal`` / ``is_causal`` as it reads SDPA's ``is_causal``: B·H·(N²/2)·D."""
    for kernel in ("sdpa", "flash", "flash3", "hub", "xformers"):
        for device in ("cpu", "meta"):
            with torch.device(device):
                block = FlashBlock(kernel)
                x = torch.randn(B, N, E)
            prof = profile(block, x)
            assert prof.total() == sum(EXPECTED.values()), (kernel, device)
            assert prof.by_role() == EXPECTED, (kernel, device)
            assert prof.unsupported() == {}, (kernel, device)
            if device == "cpu":  # (on meta, SDPA runs its math path: a mask, no kernel flag)
                causal = prof.by_role(attention="causal")
                assert causal["attn_scores"] == B * H * (N * N // 2) * D, kernel


def test_flash_attention_3_scores_its_qv_block_too():
    """FlashAttention 3's ``qv`` (a second query block of width d_v, scored against V) adds h·pairs·d_v to the
    scores."""

    class WithQv(nn.Module):
        def forward(self, q, k, v, qv):
            return ops.flash_attn_3._flash_attn_forward(q, k, v, qv=qv)[0]

    q, k, v, qv = (torch.randn(B, N, H, D) for _ in range(4))
    prof = profile(WithQv(), q, k, v, qv)
    assert prof.total() == B * H * N * N * (D + D + D)


class Varlen(nn.Module):
    def forward(self, q, k, v, cu, longest):
        return ops.flash_attn._flash_attn_varlen_forward(q, k, v, cu, cu, longest, longest, 0.0, D ** -0.5, True)[0]


def test_variable_length_flash_attention_counts_each_sequence_from_its_offsets():
    """Two packed sequences of 3 and 5 positions: 3² + 5² pairs per head, exactly, in real and fake mode (the
    offsets are an input with known values); on meta offsets (values unknown) the launch bound 2 · 5 · 5 pairs,
    flagged as a bound."""
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    q, k, v = (torch.randn(8, H, D) for _ in range(3))
    for mode in ("real", "fake"):
        assert profile(Varlen(), q, k, v, cu, 5, mode=mode).total() == H * (3 * 3 + 5 * 5) * (D + D)
    meta = [t.to("meta") for t in (q, k, v, cu)]
    bound = profile(Varlen(), *meta, 5)
    assert bound.total() == H * 2 * 5 * 5 * (D + D)
    assert any("upper bound" in note for note in bound.notes)


def test_flash_attention_backward_is_the_forward_core_times_five_halves():
    """The backward kernel recomputes the scores and forms four gradient products: 3x the scores' MACs and 2x the
    weighted sum's."""

    class Backward(nn.Module):
        def forward(self, dout, q, k, v, out, lse):
            dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
            ops.flash_attn._flash_attn_backward(dout, q, k, v, out, lse, dq, dk, dv, 0.0, D ** -0.5, True, -1, -1,
                                                0.0, None, False)
            return dq + dk + dv

    q, k, v, dout, out = (torch.randn(B, N, H, D, device="meta") for _ in range(5))
    lse = torch.randn(B, H, N, device="meta")
    prof = profile(Backward(), dout, q, k, v, out, lse)
    assert prof.total() == 3 * B * H * N * N * D + 2 * B * H * N * N * D


def test_causal_conv1d_counts_its_taps_and_the_buffer_it_fills_is_not_flagged():
    """causal-conv1d's forward (x [B, C, L], weight [C, W]) writes into the ``empty`` buffer it is given: B·C·L·W
    MACs, and the buffer counts as written by a recorded op (nothing outside the dispatcher)."""
    channels, length, width = 32, 50, 4

    class Conv(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.randn(channels, width))

        def forward(self, x):
            out = torch.empty_like(x)
            ops.DaoAILab._causal_conv1d_fwd_cpp(x, self.weight, None, None, None, out, None, True)
            return out

    x = torch.randn(B, channels, length)
    for mode in ("real", "fake"):
        prof = profile(Conv(), x, mode=mode)
        assert prof.total() == B * channels * length * width
        assert prof.unsupported() == {}


def test_one_unpadded_sequence_pairs_every_query_with_every_key():
    """A packed call of one sequence without offsets (``q [total_q, h, d]``, ``k [total_k, h_k, d]``): total_q ·
    total_k pairs per head, the key count read from k's first dimension, not its heads (aten's kernel and
    flash-attn's through one helper)."""
    from flopscope.formulas import attention_bnhd, flash_pairs

    q, k = (12, H, D), (20, 2, D)
    assert flash_pairs(q, k) == (12 * 20, True)
    assert attention_bnhd(q, k, (20, 2, D), None, None, 0, 0) == {"attn_scores": H * 12 * 20 * D,
                                                                  "attn_weighted_sum": H * 12 * 20 * D}


def test_xformers_flash_backward_and_its_sliding_window():
    """xFormers' backward op (its q, k, v after ``grads_share_storage`` and ``grad``): 3x the scores, 2x the weighted
    sum; its forward's ``window_left`` is read as FlashAttention's ``window_size_left``: with W = 8 keys, the "mask"
    convention prices W·N − W(W−1)/2 pairs per head."""

    class Backward(nn.Module):
        def forward(self, grad, q, k, v, out, lse, cu, rng):
            return ops.xformers_flash.flash_bwd(False, grad, q, k, v, out, lse, cu, cu, N, N, 0.0, D ** -0.5, True,
                                                -1, -1, rng)[0]

    q, k, v, grad, out = (torch.randn(B, N, H, D) for _ in range(5))
    cu, rng = torch.tensor([0, N, 2 * N], dtype=torch.int32), torch.zeros(2, dtype=torch.int64)
    prof = profile(Backward(), grad, q, k, v, out, torch.randn(B, H, N), cu, rng)
    assert prof.total() == 3 * B * H * N * N * D + 2 * B * H * N * N * D

    class Window(nn.Module):
        def forward(self, q, k, v):
            return ops.xformers_flash.flash_fwd(q, k, v, None, None, None, N, N, 0.0, D ** -0.5, True, 7, 0,
                                                False, None)[0]

    window = 8
    prof = profile(Window(), q, k, v)
    pairs = window * N - window * (window - 1) // 2
    assert prof.by_role(attention="mask")["attn_scores"] == B * H * pairs * D


@pytest.fixture
def flash_extension():
    """A stand-in for flash-attn's CUDA extension ``flash_attn_2_cuda`` (which needs a GPU to build): its
    ``fwd_kvcache`` with the extension's positional parameters, computing with torch; removed afterwards."""

    def fwd_kvcache(q, kcache, vcache, k, v, seqlens_k, rotary_cos, rotary_sin, cache_batch_idx, leftpad_k,
                    block_table, alibi_slopes, out, softmax_scale, is_causal, window_size_left, window_size_right,
                    softcap, is_rotary_interleaved, num_splits):
        lse = q.new_zeros((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
        return (q @ q.transpose(-1, -2)).sum() * 0 + q.new_zeros(q.shape), lse  # (work the record stands for)

    extension = types.ModuleType("flash_attn_2_cuda")
    extension.fwd_kvcache = fwd_kvcache
    sys.modules["flash_attn_2_cuda"] = extension
    try:
        yield extension
    finally:
        del sys.modules["flash_attn_2_cuda"]


class KVCacheStep(nn.Module):
    """One decoding step as ``flash_attn_with_kvcache`` makes it: the extension's function looked up on its module
    at each call (not a custom op: no dispatcher sees it)."""

    def forward(self, q, kcache, vcache, k, v, lengths):
        extension = sys.modules["flash_attn_2_cuda"]
        return extension.fwd_kvcache(q, kcache, vcache, k, v, lengths, None, None, None, None, None, None, None,
                                     D ** -0.5, True, -1, -1, 0.0, False, 0)[0]


def test_flash_attn_with_kvcache_counts_the_keys_each_sequence_uses(flash_extension):
    """Two sequences whose caches hold 5 and 9 keys (room for 32), one new token each: the query attends 5 + 1 and
    9 + 1 keys, per head, in real and fake mode (the lengths are an input with known values); the extension's own
    work is not recorded; its function is put back afterwards."""
    original = flash_extension.fwd_kvcache
    cache = [torch.randn(B, 32, H, D) for _ in range(2)]
    q, k, v = (torch.randn(B, 1, H, D) for _ in range(3))
    lengths = torch.tensor([5, 9], dtype=torch.int32)
    for mode in ("real", "fake"):
        prof = profile(KVCacheStep(), q, *cache, k, v, lengths, mode=mode)
        assert prof.total() == H * ((5 + 1) + (9 + 1)) * (D + D), mode
        assert [op.op_name for op in prof._ops if op.macs] == ["flash_attn.fwd_kvcache"], mode
        assert prof.unsupported() == {}, mode
    assert flash_extension.fwd_kvcache is original
