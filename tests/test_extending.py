"""Extending flopscope in one place: a new op is one registration (formula + family), and the options of
profile() reach every length of a sweep."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from fractions import Fraction
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import flopscope
from flopscope import formulas
from flopscope.formulas.linear_algebra import mm
from flopscope.formulas.registry import OpFamily
from flopscope.studies.models import TransformerBlock
from flopscope.workloads.scaling import Polynomial


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
    from flopscope.api import profile_with_plan
    from flopscope.capture import CapturePlan, new_converter

    model, plan = TransformerBlock(32, 4, 64), CapturePlan(mode="fake", backward=True, converter=new_converter())
    runs = [profile_with_plan(model, (torch.zeros(1, 8, 32),), {}, plan) for _ in range(2)]
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


# --------------------------------------------------------------------------------------------------
# docs/extending.md: a new attention kernel is one registration, a new role one row and its pass
@torch.library.custom_op("flopscope_test::bnhd_attention", mutates_args=())
def bnhd_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool) -> torch.Tensor:
    """Attention over ``[B, n, heads, d]`` operands (FlashAttention's layout), causal or not."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=is_causal)
    return out.transpose(1, 2).contiguous()


@bnhd_attention.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool) -> torch.Tensor:
    return q.new_empty(*q.shape[:-1], v.shape[-1])


def _bnhd_macs(q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...], *_: object, **__: object) -> dict[str, int]:
    # [B, n_q, h, d_v] = attention([B, n_q, h, d], [B, n_k, h, d], [B, n_k, h, d_v])
    return formulas.attention_core(q[0] * q[2], q[1], k[1], q[3], v[3])


class BnhdAttention(nn.Module):
    """Causal self-attention through the custom kernel: projections, heads in the third dimension."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(d, d, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = (p(x).view(b, n, self.heads, d // self.heads) for p in (self.q_proj, self.k_proj, self.v_proj))
        return self.o_proj(bnhd_attention(q, k, v, True).reshape(b, n, d))


def test_a_new_attention_kernel_is_one_registration() -> None:
    """The registration of docs/extending.md ("A new attention kernel") on a registry copy: the projections are
    found through its operands, the causal and mask conventions read n_q, n_k from the declared layout and the
    kernel's is_causal, the generation step reads its context there. Declared in the other layout, the head
    count is read as the positions: the declaration is what is read."""
    B, n, h, d = 2, 16, 4, 32
    d_k = d // h
    model, x = BnhdAttention(d, h), torch.randn(B, n, d)
    registry = flopscope.REGISTRY.copy()
    registry.override(torch.ops.flopscope_test.bnhd_attention, _bnhd_macs, family=OpFamily.ATTENTION,
                      operands=(0, 1, 2), layout=formulas.BNHD)
    prof = flopscope.profile(model, x, registry=registry)
    projections = B * n * d * d
    core = B * h * n * n * d_k
    assert prof.by_role() == {"q_proj": projections, "k_proj": projections, "v_proj": projections,
                              "out_proj": projections, "attn_scores": core, "attn_weighted_sum": core}
    assert prof.total(attention="causal") == 4 * projections + 2 * B * h * (n * n // 2) * d_k  # n²/2 pairs
    assert prof.total(attention="mask") == 4 * projections + 2 * B * h * (n * (n + 1) // 2) * d_k  # exact
    assert [(step.tokens, step.context) for step in prof.steps()] == [(n, n)]
    misdeclared = flopscope.REGISTRY.copy()
    misdeclared.override(torch.ops.flopscope_test.bnhd_attention, _bnhd_macs, family=OpFamily.ATTENTION,
                         operands=(0, 1, 2), layout=formulas.BHND)
    assert [(s.tokens, s.context) for s in flopscope.profile(model, x, registry=misdeclared).steps()] == [(h, h)]


MIXTRAL = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)
ROLES_OF = """
import json, sys, warnings
import torch, transformers, flopscope
config = transformers.MixtralConfig(**json.loads(sys.argv[1]))
torch.manual_seed(0)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    model = transformers.MixtralForCausalLM(config).eval()
    ids = torch.randint(0, config.vocab_size, (1, int(sys.argv[2])))
    out = {mode: flopscope.profile(model, ids, mode=mode).by_role() for mode in ("real", "fake")}
print(json.dumps({"file": flopscope.__file__, "roles": out}))
"""


def _diffs_of(section: str) -> str:
    """The ``diff`` blocks of a section of docs/extending.md, as one patch."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "extending.md").read_text(encoding="utf-8")
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return "".join(block.split("\n", 1)[1] for block in body.split("```diff")[1:]).replace("```", "")


def test_a_new_role_is_one_row_and_its_pass(tmp_path: Path) -> None:
    """docs/extending.md's "A new role" diff, applied as written to a copy of the installed package: Mixtral's
    routers (d -> experts, one per MoE layer) become role ``router``; every other role is as before."""
    transformers = pytest.importorskip("transformers")
    copy = tmp_path / "flopscope"
    shutil.copytree(Path(flopscope.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    patch = tmp_path / "router.diff"
    patch.write_text(_diffs_of("A new role"))
    applied = subprocess.run(["git", "apply", str(patch)], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert applied.returncode == 0, applied.stderr
    n = 8
    run = subprocess.run([sys.executable, "-c", ROLES_OF, json.dumps(MIXTRAL), str(n)], capture_output=True, text=True,
                         check=False, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)}, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert Path(found["file"]).parent == copy
    router = MIXTRAL["num_hidden_layers"] * n * MIXTRAL["hidden_size"] * MIXTRAL["num_local_experts"]
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.MixtralForCausalLM(transformers.MixtralConfig(**MIXTRAL)).eval()
        ids = torch.randint(0, MIXTRAL["vocab_size"], (1, n))
        before = {mode: flopscope.profile(model, ids, mode=mode).by_role() for mode in ("real", "fake")}
    for mode, roles in found["roles"].items():
        expected = {**before[mode], "router": router, "other": before[mode].get("other", 0) - router}
        assert {r: m for r, m in roles.items() if m} == {r: m for r, m in expected.items() if m}
