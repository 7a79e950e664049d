"""Formulas are pure functions of shapes: tables of closed-form answers, no model needed."""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch

import flopscope
from flopscope import formulas as f
from flopscope.errors import RegistryError

aten = torch.ops.aten
needs_grouped_mm = pytest.mark.skipif(not hasattr(aten, "_grouped_mm"), reason="this torch has no _grouped_mm")


def _grouped_mm_runs_on_the_cpu() -> bool:
    """torch 2.8 has ``_grouped_mm`` without a CPU kernel; 2.9 has one."""
    try:
        torch._grouped_mm(torch.zeros(8, 8, dtype=torch.bfloat16), torch.zeros(1, 8, 8, dtype=torch.bfloat16),
                          offs=torch.tensor([8], dtype=torch.int32))  # (strides of 16 bytes)
    except (AttributeError, NotImplementedError, RuntimeError):
        return False
    return True


def macs(op, *args, out_shape=None, **kwargs):
    """Total MACs of the registered formula of `op` called on shapes."""
    fn = f.REGISTRY.get(op.default if hasattr(op, "default") else op)
    assert fn is not None, op
    return f.total_of(fn(*args, out_shape=out_shape, **kwargs))


@pytest.mark.parametrize(("op", "args", "expected"), [
    (aten.mm, [(7, 5), (5, 3)], 7 * 5 * 3),
    (aten._int_mm, [(32, 64), (64, 16)], 32 * 64 * 16),
    (aten.addmm, [(3,), (7, 5), (5, 3)], 7 * 5 * 3),
    (aten._addmm_activation, [(3,), (7, 5), (5, 3)], 7 * 5 * 3),
    (aten.bmm, [(4, 7, 5), (4, 5, 3)], 4 * 7 * 5 * 3),
    (aten.baddbmm, [(4, 7, 3), (4, 7, 5), (4, 5, 3)], 4 * 7 * 5 * 3),
    (aten.addbmm, [(7, 3), (4, 7, 5), (4, 5, 3)], 4 * 7 * 5 * 3),
    (aten.mv, [(7, 5), (5,)], 7 * 5),
    (aten.addmv, [(7,), (7, 5), (5,)], 7 * 5),
    (aten.dot, [(9,), (9,)], 9),
    (aten.linear, [(2, 10, 16), (32, 16)], 2 * 10 * 16 * 32),
    (aten.matmul, [(2, 1, 7, 5), (3, 5, 4)], 2 * 3 * 7 * 5 * 4),
    (aten.matmul, [(5,), (5,)], 5),
    (aten.matmul, [(7, 5), (5,)], 7 * 5),
    (aten._scaled_mm, [(16, 32), (32, 8), (), ()], 16 * 32 * 8),
])
def test_matrix_products(op, args, expected):
    assert macs(op, *args) == expected


@pytest.mark.parametrize(("a", "b", "out", "expected"), [
    ((12, 16), (3, 16, 8), (12, 8), 12 * 16 * 8),  # MoE experts: rows of a split over 3 experts
    ((3, 4, 16), (3, 16, 8), (3, 4, 8), 3 * 4 * 16 * 8),  # batched
    ((4, 12), (12, 8), (3, 4, 8), 4 * 12 * 8),  # K split into groups
])
@needs_grouped_mm
def test_grouped_mm(a, b, out, expected):
    """Offsets whose values are not known (routing on fake tensors): the whole split dim."""
    op = aten._grouped_mm.default
    assert f.total_of(f.count(f.REGISTRY.get(op), [a, b, (3,)], {}, out, target=op)) == expected


@pytest.mark.parametrize(("a", "b", "out", "expected"), [
    ((12, 16), (3, 16, 8), (12, 8), 10 * 16 * 8),  # rows 10 and 11 in no group (another rank's experts')
    ((3, 4, 16), (16, 24), (4, 24), 4 * 10 * 16),  # the columns of b split
    ((4, 12), (12, 8), (3, 4, 8), 4 * 10 * 8),  # K split
])
@needs_grouped_mm
def test_grouped_mm_counts_the_groups_its_known_offsets_cover(a, b, out, expected):
    offs = f.KnownShape((3,), [3, 7, 10])
    for op, args in ((aten._grouped_mm.default, [a, b, offs]),
                     (aten._scaled_grouped_mm.default, [a, b, (1,), (1,), offs])):
        assert f.total_of(f.count(f.REGISTRY.get(op), args, {}, out, target=op)) == expected, op
        assert f.total_of(f.count(f.REGISTRY.get(op), args[:-1], {"offs": offs}, out, target=op)) == expected, op


def test_transformers_grouped_mm_fallback_counts_the_rows_its_known_offsets_cover():
    """transformers' fallback loops over the groups ``offs`` bounds: rows after ``offs[-1]`` are not computed."""
    fallback = f.REGISTRY.get("transformers::grouped_mm_fallback")
    assert fallback((12, 16), (3, 16, 8), f.KnownShape((3,), [3, 7, 10])) == 10 * 16 * 8
    assert fallback((12, 16), (3, 16, 8), (3,)) == 12 * 16 * 8  # offsets not known: every row


@pytest.mark.skipif(not _grouped_mm_runs_on_the_cpu(), reason="this torch has no CPU kernel for _grouped_mm")
def test_grouped_mm_runs_on_cpu_against_the_loop_of_mms():
    """A real `_grouped_mm` call is charged what the loop of per-expert mms it replaces costs."""

    class Experts(torch.nn.Module):
        def __init__(self, grouped: bool):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(3, 16, 8, dtype=torch.bfloat16))
            self.grouped = grouped

        def forward(self, x, offs):
            if self.grouped:
                return torch._grouped_mm(x, self.w, offs=offs)
            bounds = [0, *offs.tolist()]
            return torch.cat([x[s:e] @ self.w[i] for i, (s, e) in enumerate(itertools.pairwise(bounds))])

    x = torch.randn(12, 16, dtype=torch.bfloat16)
    offs = torch.tensor([3, 7, 12], dtype=torch.int32)
    grouped = flopscope.profile(Experts(True), x, offs, mode="real")
    loop = flopscope.profile(Experts(False), x, offs, mode="real")
    assert grouped.by_op() == {"aten._grouped_mm": 12 * 16 * 8}
    assert loop.total() == (3 + 4 + 5) * 16 * 8 == grouped.total()
    # the rows after the last group (routes to another rank's experts under expert parallelism) are not computed
    x = torch.randn(16, 16, dtype=torch.bfloat16)
    grouped = flopscope.profile(Experts(True), x, offs, mode="real")
    loop = flopscope.profile(Experts(False), x, offs, mode="real")
    assert grouped.total() == loop.total() == 12 * 16 * 8


def test_sdpa_every_kernel_and_grouped_query():
    B, h, n_kv, n_q, n_k, d_k, d_v = 2, 8, 2, 5, 7, 16, 12
    q, k, v = (B, h, n_q, d_k), (B, n_kv, n_k, d_k), (B, n_kv, n_k, d_v)
    expected = {"attn_scores": B * h * n_q * n_k * d_k, "attn_weighted_sum": B * h * n_q * n_k * d_v}
    for op in (aten._scaled_dot_product_flash_attention_for_cpu, aten._scaled_dot_product_flash_attention,
               aten._scaled_dot_product_efficient_attention, aten._scaled_dot_product_cudnn_attention,
               aten._scaled_dot_product_attention_math, aten._scaled_dot_product_fused_attention_overrideable):
        assert f.REGISTRY.get(op.default)(q, k, v, out_shape=None) == expected, op
    # the CUDA kernels' [B, n, heads, d] layout
    bnhd = (B, n_q, h, d_k), (B, n_k, n_kv, d_k), (B, n_k, n_kv, d_v)
    for op in (aten._flash_attention_forward, aten._efficient_attention_forward):
        assert f.REGISTRY.get(op.default)(*bnhd, out_shape=None) == expected, op


def test_fused_transformer_paths():
    B, n, E, h, F = 2, 10, 32, 4, 64
    mha = f.REGISTRY.get(aten._native_multi_head_attention.default)(
        (B, n, E), (B, n, E), (B, n, E), E, h, (3 * E, E), (3 * E,), (E, E), (E,), out_shape=None)
    assert mha == {"q_proj": B * n * E * E, "k_proj": B * n * E * E, "v_proj": B * n * E * E,
                   "attn_scores": B * n * n * E, "attn_weighted_sum": B * n * n * E, "out_proj": B * n * E * E}
    layer = f.REGISTRY.get(aten._transformer_encoder_layer_fwd.default)(
        (B, n, E), E, h, (3 * E, E), (3 * E,), (E, E), (E,), False, False, 1e-5, (E,), (E,), (E,), (E,),
        (F, E), (F,), (E, F), (E,), out_shape=None)
    assert layer == {**mha, "ffn_up": B * n * E * F, "ffn_down": B * n * F * E}


def test_recurrent_kernels():
    T, B, d_in, H, P = 9, 3, 12, 16, 10
    # the CPU oneDNN kernel: one layer, one direction, LSTM weights [4H, d_in], [4H, H]
    layer = f.REGISTRY.get(aten.mkldnn_rnn_layer.default)((T, B, d_in), (4 * H, d_in), (4 * H, H), (4 * H,),
                                                          (4 * H,), (B, H), (B, H), out_shape=None)
    assert layer == {"recurrent": T * B * 4 * H * (d_in + H)}
    # cuDNN: 2-layer bidirectional LSTM with projection P: layer 2 reads 2P features
    weights = []
    for d_layer_in in (d_in, 2 * P):
        for _ in range(2):
            weights += [(4 * H, d_layer_in), (4 * H, P), (4 * H,), (4 * H,), (P, H)]
    rnn = f.REGISTRY.get(aten._cudnn_rnn.default)((T, B, d_in), weights, 5, None, (4, B, P), (4, B, H),
                                                  2, H, P, 2, False, 0.0, False, True, [], None, out_shape=None)
    per_step = 2 * (4 * H * (d_in + P) + P * H) + 2 * (4 * H * (2 * P + P) + P * H)
    assert rnn == {"recurrent": T * B * per_step}


def test_conv_formula_uses_output_for_forward_and_input_for_transposed():
    x, w, out = (2, 6, 20), (8, 3, 5), (2, 8, 16)  # groups=2: weight [C_out, C_in/g, k]
    assert macs(aten.convolution, x, w, None, [1], [0], [1], False, [0], 2, out_shape=out) == 2 * 8 * 16 * 3 * 5
    xt, wt, outt = (2, 6, 20), (6, 4, 5), (2, 8, 24)  # transposed: weight [C_in, C_out/g, k]
    assert macs(aten.convolution, xt, wt, None, [1], [0], [1], True, [0], 2, out_shape=outt) == 2 * 20 * 6 * 4 * 5


def test_registry_rejects_double_registration_and_overrides_on_a_copy():
    registry = f.FormulaRegistry()
    registry.register(aten.mm)(lambda a, b, **_: 1)
    with pytest.raises(RegistryError):
        registry.register(aten.mm)(lambda a, b, **_: 2)
    with pytest.raises(RegistryError):
        f.REGISTRY.register(aten.bmm)(lambda a, b, **_: 2)
    copy = f.REGISTRY.copy()
    copy.override(aten.mm, lambda a, b, **_: 3 * a[0] * a[1] * b[1])
    prof = flopscope.profile(torch.nn.Linear(4, 5, bias=False), torch.zeros(6, 4), registry=copy)
    assert prof.total() == 3 * 6 * 4 * 5
    assert flopscope.profile(torch.nn.Linear(4, 5, bias=False), torch.zeros(6, 4)).total() == 6 * 4 * 5
    assert "aten::mm" in f.REGISTRY.ops()


def test_triangular_solve_and_euclidean_distance():
    """Substitution: n(n-1)/2 multiply-adds per right-hand side; cdist by matmul on [d + 2] columns."""

    class Ops(torch.nn.Module):
        def forward(self, a, b, x, y):
            triangular = torch.linalg.solve_triangular(a, b, upper=False)
            return triangular, torch.cdist(x, y, compute_mode="use_mm_for_euclid_dist")

    a = torch.randn(2, 5, 5).tril() + 5 * torch.eye(5)
    prof = flopscope.profile(Ops(), a, torch.randn(2, 5, 3), torch.randn(4, 6), torch.randn(7, 6), mode="real")
    assert prof.by_op() == {"aten.linalg_solve_triangular": 2 * 3 * (5 * 4 // 2),
                            "aten._euclidean_dist": 4 * 7 * (6 + 2)}


def test_bilinear_and_dynamic_int8_linear():
    """nn.Bilinear: B·out·in1·in2; a dynamically quantized Linear: rows·in·out (formulas keyed by name)."""
    bilinear = flopscope.profile(torch.nn.Bilinear(6, 7, 4), torch.randn(3, 6), torch.randn(3, 7), mode="real")
    assert bilinear.by_op() == {"aten._trilinear": 3 * 4 * 6 * 7} and bilinear.unsupported() == {}
    with warnings.catch_warnings():  # torch's own deprecation notices for eager quantization (newer torch)
        warnings.simplefilter("ignore")
        quantized = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(torch.nn.Linear(16, 8)),
                                                           {torch.nn.Linear}, dtype=torch.qint8)
    prof = flopscope.profile(quantized, torch.randn(5, 16), mode="real")
    assert prof.total() == 5 * 16 * 8 and prof.unsupported() == {}


@pytest.mark.parametrize("kernel, layout", [
    (torch.ops.aten._flash_attention_forward.default, "bnhd"),
    (torch.ops.aten._efficient_attention_forward.default, "bnhd"),
    (torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default, "bhnd"),
])
def test_one_place_says_where_an_attention_kernels_positions_are(kernel, layout) -> None:
    """The operand layout is declared with the kernel's formula and read by every analysis: the generation steps
    (query / key positions of each step) and the mask geometry agree. At a9f00b3 generation read FlashAttention's
    [B, n, heads, d] as [B, heads, n, d] and took the head count for the context."""
    from flopscope.capture.records import CapturedOp
    from flopscope.formulas.registry import REGISTRY
    from flopscope.predict import attention as attention_mask
    from flopscope.predict import steps

    B, n_q, n_k, heads, d = 2, 3, 11, 4, 8
    shapes = {"bnhd": ((B, n_q, heads, d), (B, n_k, heads, d)), "bhnd": ((B, heads, n_q, d), (B, heads, n_k, d))}
    q_shape, k_shape = shapes[layout]
    q, k, v = (CapturedOp("placeholder", name, (), {}, name, output_shapes=(shape,))
               for name, shape in (("q", q_shape), ("k", k_shape), ("v", k_shape)))
    spec = REGISTRY.spec(kernel)
    assert spec is not None
    args: list = [None] * (max(spec.operands) + 1)
    for position, record in zip(spec.operands, (q, k, v), strict=True):
        args[position] = record
    op = CapturedOp("call_function", kernel, tuple(args), {}, "attention", spec=spec)
    assert steps._queries_and_keys(op) == (n_q, n_k)
    assert attention_mask._kernel_geometry(op) == (n_q, n_k, (B, heads, n_q, n_k))
