"""Extending flopscope in one place: a new op is one registration (formula + family), and the options of
profile() reach every length of a sweep."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import flopscope
from flopscope.formulas.registry import OpFamily, mm
from flopscope.models import TransformerBlock
from flopscope.scaling import Polynomial


@torch.library.custom_op("flopscope_test::plain_mm", mutates_args=())
def plain_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A matrix product that PyTorch does not know as one: an op no formula or role pass has heard of."""
    return torch.mm(a, b)


@plain_mm.register_fake
def _(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.new_empty(a.shape[0], b.shape[1])


class CustomOpBlock(nn.Module):
    """Single-head self-attention and a ReLU FFN, every product through ``plain_mm`` (one sequence)."""

    def __init__(self, d: int, d_ff: int) -> None:
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Parameter(torch.randn(d, d) / d) for _ in range(4))
        self.w1, self.w2 = nn.Parameter(torch.randn(d, d_ff) / d), nn.Parameter(torch.randn(d_ff, d) / d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = plain_mm(x, self.wq), plain_mm(x, self.wk), plain_mm(x, self.wv)
        weights = F.softmax(plain_mm(q, k.t()) / q.shape[-1] ** 0.5, dim=-1)
        x = x + plain_mm(plain_mm(weights, v), self.wo)
        return x + plain_mm(F.relu(plain_mm(x, self.w1)), self.w2)


@pytest.mark.parametrize("mode", ["real", "fake"])
def test_a_new_op_declared_a_matmul_gets_its_roles_without_any_other_edit(mode: str) -> None:
    n, d, d_ff = 16, 32, 64
    model, x = CustomOpBlock(d, d_ff), torch.randn(n, d)
    with pytest.warns(flopscope.FlopscopeWarning, match="flopscope_test.plain_mm"):
        unknown = flopscope.profile(model, x, mode=mode)
    assert unknown.total() == 0 and unknown.unsupported() == {"flopscope_test.plain_mm": 8}

    registry = flopscope.REGISTRY.copy()
    registry.override(torch.ops.flopscope_test.plain_mm, mm, family=OpFamily.MATMUL, operands=(0, 1))
    prof = flopscope.profile(model, x, mode=mode, registry=registry)
    assert prof.by_role() == {
        "q_proj": n * d * d, "k_proj": n * d * d, "v_proj": n * d * d,
        "attn_scores": n * n * d, "attn_weighted_sum": n * n * d, "out_proj": n * d * d,
        "ffn_up": n * d * d_ff, "ffn_down": n * d_ff * d,
    }
    assert prof.by_block() == {"": prof.by_role()}


def test_a_new_op_without_a_family_counts_but_has_no_role() -> None:
    n, d, d_ff = 8, 16, 32
    registry = flopscope.REGISTRY.copy()
    registry.override(torch.ops.flopscope_test.plain_mm, mm)  # a formula, no family: OpFamily.OTHER
    prof = flopscope.profile(CustomOpBlock(d, d_ff), torch.randn(n, d), registry=registry)
    assert prof.by_role() == {"other": 4 * n * d * d + 2 * n * n * d + 2 * n * d * d_ff}


def test_registering_a_matmul_needs_its_operand_positions() -> None:
    registry = flopscope.REGISTRY.copy()
    with pytest.raises(flopscope.RegistryError, match="operand positions"):
        registry.override(torch.ops.flopscope_test.plain_mm, mm, family=OpFamily.MATMUL)


def test_scaling_in_fake_mode_counts_the_backward_pass_like_real_mode() -> None:
    """backward=True reaches every length of a fake sweep (it used to be dropped there)."""
    d, h, d_ff = 64, 4, 256
    lengths = (8, 16, 32, 64)

    def make(n: int) -> torch.Tensor:
        return torch.zeros(1, n, d)

    fake = flopscope.scaling(TransformerBlock(d, h, d_ff), make, lengths=lengths, mode="fake", backward=True)
    real = flopscope.scaling(TransformerBlock(d, h, d_ff), make, lengths=lengths, mode="real", backward=True)
    assert fake.polynomials == real.polynomials
    # forward Q·Kᵀ (n²·d) and its two gradient GEMMs (dQ, dK: n²·d each)
    assert fake.polynomials["attn_scores"] == Polynomial((Fraction(0), Fraction(0), Fraction(3 * d)))
    # forward x·W_1 (n·d·d_ff), gradients of the input and of the weight (n·d·d_ff each)
    assert fake.polynomials["ffn_up"] == Polynomial((Fraction(0), Fraction(3 * d * d_ff)))


class _Config:
    """A config object as Hugging Face models carry one (``to_dict``), naming its width ``d_embed``."""

    def __init__(self, **values: int) -> None:
        self.values = values

    def to_dict(self) -> dict[str, int]:
        return dict(self.values)


class RawWeightAttention(nn.Module):
    """Multi-head self-attention on raw weight matrices: no module declares the width or the heads."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads  # not a name flopscope reads: the config says it
        self.wq, self.wk, self.wv, self.wo = (nn.Parameter(torch.randn(d, d) / d) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, n, d = x.shape
        q, k, v = ((x @ w).view(B, n, self.heads, d // self.heads).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        y = F.softmax(q @ k.transpose(-2, -1), dim=-1) @ v
        return y.transpose(1, 2).reshape(B, n, d) @ self.wo


class NewFamily(nn.Module):
    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.config = _Config(d_embed=d, num_attention_heads=h)
        self.attn = RawWeightAttention(d, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x)


def test_a_new_model_family_is_one_name_in_conventions() -> None:
    from flopscope import conventions

    n, d, h = 16, 32, 4
    model, x = NewFamily(d, h), torch.zeros(1, n, d)
    before = flopscope.profile(model, x).reconcile()
    assert before.rows and all(row.predicted is None and "unrecognised" in row.reason for row in before.rows)

    known = conventions.WIDTH.config
    object.__setattr__(conventions.WIDTH, "config", (*known, "d_embed"))  # the one edit, made at run time
    try:
        after = flopscope.profile(model, x).reconcile()
    finally:
        object.__setattr__(conventions.WIDTH, "config", known)
    assert after.all_exact()
    assert {row.role: row.predicted for row in after.rows} == {
        "q_proj": n * d * d, "k_proj": n * d * d, "v_proj": n * d * d,
        "attn_scores": n * n * d, "attn_weighted_sum": n * n * d, "out_proj": n * d * d,
    }


def test_registry_names_an_op_one_way_whatever_way_it_is_written() -> None:
    """``"aten::mm"``, ``"aten.mm"`` and ``torch.ops.aten.mm`` are one key: no shadow entries."""
    registry = flopscope.REGISTRY.copy()
    assert registry.spec("aten.mm") is registry.spec("aten::mm") is registry.spec(torch.ops.aten.mm.default)
    with pytest.raises(flopscope.RegistryError):
        registry.register("aten::mm")(mm)
    registry.override("aten.mm", lambda a, b, **_: 7 * a[0] * a[1] * b[1])
    prof = flopscope.profile(nn.Linear(4, 5, bias=False), torch.zeros(6, 4), registry=registry)
    assert prof.total() == 7 * 6 * 4 * 5 and registry.ops().count("aten::mm") == 1
    registry.override("aten.mm", mm, family=OpFamily.OTHER)  # a new family drops the old operand positions
    assert registry.spec("aten.mm").operands == ()  # type: ignore[union-attr]


@torch.library.custom_op("flopscope_test::attend", mutates_args=())
def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Single-head attention as one opaque kernel: softmax(q kᵀ) v."""
    return torch.softmax(q @ k.t(), dim=-1) @ v


@attend.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return q.new_empty(q.shape[0], v.shape[1])


class KernelAttention(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.o(attend(self.q(x), self.k(x), self.v(x)))


def _attend_macs(q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...], **_: object) -> dict[str, int]:
    # [n_q, d_v] = attend([n_q, d], [n_k, d], [n_k, d_v])
    return {"attn_scores": q[0] * k[0] * q[1], "attn_weighted_sum": q[0] * k[0] * v[1]}


def test_an_attention_kernel_is_found_once_declared_and_said_when_not() -> None:
    n, d = 8, 16
    model, x = KernelAttention(d), torch.randn(n, d)
    undeclared = flopscope.REGISTRY.copy()
    undeclared.override(torch.ops.flopscope_test.attend, _attend_macs)
    with pytest.warns(flopscope.FlopscopeWarning, match="flopscope_test.attend returns attention parts"):
        prof = flopscope.profile(model, x, registry=undeclared)
    assert prof.by_role() == {"attn_scores": n * n * d, "attn_weighted_sum": n * n * d, "other": 4 * n * d * d}

    declared = flopscope.REGISTRY.copy()
    declared.override(torch.ops.flopscope_test.attend, _attend_macs, family=OpFamily.ATTENTION, operands=(0, 1, 2))
    assert flopscope.profile(model, x, registry=declared).by_role() == {
        "q_proj": n * d * d, "k_proj": n * d * d, "v_proj": n * d * d, "out_proj": n * d * d,
        "attn_scores": n * n * d, "attn_weighted_sum": n * n * d}


def test_a_fake_sweep_with_backward_does_not_carry_gradients_between_lengths() -> None:
    from flopscope.runner import CaptureOptions, new_converter, run_in_mode

    model, converter, options = TransformerBlock(32, 4, 64), new_converter(), CaptureOptions.of(backward=True)
    runs = [run_in_mode(model, (torch.zeros(1, 8, 32),), {}, options, "fake", converter=converter) for _ in range(2)]
    assert runs[0].elementwise() == runs[1].elementwise() and runs[0].op_calls() == runs[1].op_calls()


def test_scaling_passes_keyword_inputs_to_the_model_at_every_length() -> None:
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(16, 16, bias=False)

        def forward(self, x: torch.Tensor, repeat: int = 1) -> torch.Tensor:
            for _ in range(repeat):
                x = self.proj(x)
            return x

    result = flopscope.scaling(Scaled(), lambda n: torch.zeros(1, n, 16), lengths=(2, 4, 8, 16), repeat=3)
    assert result.polynomials["other"] == Polynomial((Fraction(0), Fraction(3 * 16 * 16)))
