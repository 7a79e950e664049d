"""Exact polynomials from one symbolic trace: closed forms, the same answer as sampling, and a named fall-back
where the model decides on n."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
from torch import nn

import flopscope
from flopscope.errors import SymbolicError
from flopscope.studies.models import TransformerBlock
from flopscope.workloads.scaling import Polynomial
from flopscope.workloads.symbolic import symbolic_limits


def poly(*coefficients: int) -> Polynomial:
    return Polynomial(tuple(Fraction(c) for c in coefficients))


LIMITS = symbolic_limits()
SYMBOLIC_LIMIT = LIMITS["linear"] or LIMITS["matmul"]
needs_symbolic_n = pytest.mark.skipif(SYMBOLIC_LIMIT is not None, reason=str(SYMBOLIC_LIMIT))
needs_symbolic_linear = pytest.mark.skipif(LIMITS["linear"] is not None, reason=str(LIMITS["linear"]))


def llama(d: int = 64, h: int = 4, n_kv: int = 2, d_ff: int = 128, layers: int = 2, vocab: int = 100) -> nn.Module:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=d, intermediate_size=d_ff, num_hidden_layers=layers,
                                      num_attention_heads=h, num_key_value_heads=n_kv, vocab_size=vocab)
    return transformers.LlamaForCausalLM(config).eval()


@needs_symbolic_n
def test_llama_sequence_length_closed_forms_and_same_as_sampled():
    d, h, n_kv, d_ff, L, V, B = 64, 4, 2, 128, 2, 100, 2
    model = llama(d, h, n_kv, d_ff, L, V)
    lengths = (4, 8, 16, 32)
    result = flopscope.scaling(model, lambda n: torch.zeros(B, n, dtype=torch.long), lengths=lengths,
                               method="symbolic")
    d_k = d // h
    expected = {
        "q_proj": poly(0, L * B * d * h * d_k), "k_proj": poly(0, L * B * d * n_kv * d_k),
        "v_proj": poly(0, L * B * d * n_kv * d_k), "out_proj": poly(0, L * B * h * d_k * d),
        "attn_scores": poly(0, 0, L * B * h * d_k), "attn_weighted_sum": poly(0, 0, L * B * h * d_k),
        "ffn_up": poly(0, L * B * d * d_ff), "ffn_gate": poly(0, L * B * d * d_ff),
        "ffn_down": poly(0, L * B * d_ff * d),
        "logits": poly(0, B * d * V),
    }
    assert result.method == "symbolic" and result.fallback is None
    for role, polynomial in expected.items():
        assert result.polynomials[role] == polynomial, role
        assert result.matches(role), role
        assert result.measured[role] == tuple(int(polynomial(n)) for n in lengths), role
    sampled = flopscope.scaling(model, lambda n: torch.zeros(B, n, dtype=torch.long), lengths=lengths)
    assert sampled.method == "sampled"
    assert result.polynomials == sampled.polynomials
    assert result.predicted == sampled.predicted
    assert result.measured == sampled.measured


@needs_symbolic_n
def test_batch_size_is_a_symbol_too():
    d, h, n_kv, d_ff, L, V, n = 64, 4, 2, 128, 2, 100, 12
    result = flopscope.scaling(llama(d, h, n_kv, d_ff, L, V), lambda b: torch.zeros(b, n, dtype=torch.long),
                               lengths=(2, 3, 5), method="symbolic")
    d_k = d // h
    assert result.polynomials["attn_scores"] == poly(0, L * n * n * h * d_k)  # B·h·n²·d_k, linear in B
    assert result.polynomials["q_proj"] == poly(0, L * n * d * h * d_k)
    assert result.polynomials["logits"] == poly(0, n * d * V)


@needs_symbolic_n
def test_backward_pass_polynomials_equal_the_sampled_ones():
    d, h, d_ff = 32, 4, 64
    block = TransformerBlock(d, h, d_ff)

    def make(n: int) -> torch.Tensor:
        return torch.zeros(1, n, d)

    symbolic = flopscope.scaling(block, make, lengths=(8, 16, 32, 64), backward=True, method="symbolic")
    sampled = flopscope.scaling(block, make, lengths=(8, 16, 32, 64), backward=True)
    # forward n²·d, backward twice that (a gradient for each operand): 3·n²·d
    assert symbolic.polynomials["attn_scores"] == poly(0, 0, 3 * d)
    assert symbolic.polynomials == sampled.polynomials


@pytest.mark.skipif(SYMBOLIC_LIMIT is None, reason="this torch runs a Transformer block with n symbolic")
def test_where_torch_cannot_trace_n_auto_samples_and_says_why():
    block = TransformerBlock(32, 4, 64)

    def make(n: int) -> torch.Tensor:
        return torch.zeros(1, n, 32)

    why = r"TransformerBlock (specialises on n: guard Eq|did not run with a symbolic)"
    with pytest.raises(SymbolicError, match=why):
        flopscope.scaling(block, make, lengths=(8, 16, 32, 64), method="symbolic")
    result = flopscope.scaling(block, make, lengths=(8, 16, 32, 64), method="auto")
    assert result.method == "sampled" and result.fallback
    assert result.polynomials["attn_scores"] == poly(0, 0, 32)  # n²·d, sampled


class Branchy(nn.Module):
    """Takes a wider layer for sequences longer than 64: its counts are no single polynomial in n."""

    def __init__(self) -> None:
        super().__init__()
        self.short, self.long = nn.Linear(8, 8), nn.Linear(8, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] > 64:
            return self.long(x)
        return self.short(x)


BRANCH_LINE = Branchy.forward.__code__.co_firstlineno + 1


@needs_symbolic_linear
def test_a_branch_on_n_falls_back_to_sampling_and_names_the_guard():
    model = Branchy()
    result = flopscope.scaling(model, lambda n: torch.zeros(2, n, 8), lengths=(16, 32, 128, 256), method="auto")
    assert result.method == "sampled"
    assert result.fallback is not None
    assert "n > 64" in result.fallback and f"{__file__}:{BRANCH_LINE} in forward" in result.fallback
    assert "false at n = 16" in result.fallback
    assert result.polynomials["other"] is None  # 2·n·64 below 64, 2·n·128 above: no polynomial through all four
    with pytest.raises(SymbolicError, match="n > 64"):
        flopscope.scaling(model, lambda n: torch.zeros(2, n, 8), lengths=(16, 32, 128, 256), method="symbolic")


@needs_symbolic_linear
def test_a_branch_on_n_that_holds_at_every_length_is_a_condition():
    result = flopscope.scaling(Branchy(), lambda n: torch.zeros(2, n, 8), lengths=(128, 256, 512, 1024),
                               method="auto")
    assert result.method == "symbolic" and result.fallback is None
    assert "n > 64" in result.conditions
    assert result.polynomials["other"] == poly(0, 2 * 8 * 16)  # B·n·d_in·d_out


class Pinned(nn.Module):
    """Makes a tensor of ``int(n)`` elements: the symbol is pinned to the traced length."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) + torch.zeros(int(x.shape[0]), 1)


def test_int_of_a_size_pins_n_and_falls_back():
    result = flopscope.scaling(Pinned(), lambda n: torch.zeros(n, 8), lengths=(4, 8, 16, 32), method="auto")
    assert result.method == "sampled"
    assert result.fallback is not None and "Eq(n, 32)" in result.fallback
    assert result.polynomials["other"] == poly(0, 8 * 8)


def test_inputs_that_vary_otherwise_than_as_n_fall_back():
    block = TransformerBlock(16, 2, 32)
    result = flopscope.scaling(block, lambda n: torch.zeros(1, n + 1, 16), lengths=(4, 8, 16, 32), method="auto")
    assert result.method == "sampled"
    assert result.fallback is not None and "is 5 at n = 4 and 33 at n = 32" in result.fallback
    # the sampled polynomial is in n with the model's length n + 1: (n + 1)²·d = d·n² + 2d·n + d
    assert result.polynomials["attn_scores"] == poly(16, 32, 16)


def test_strided_convolution_is_not_a_polynomial_in_n():
    conv = nn.Conv1d(4, 4, kernel_size=3, stride=2, padding=1)
    with pytest.raises(SymbolicError, match="not a polynomial in n"):
        flopscope.scaling(conv, lambda n: torch.zeros(1, 4, n), lengths=(8, 16, 32, 64), method="symbolic")
    sampled = flopscope.scaling(conv, lambda n: torch.zeros(1, 4, n), lengths=(8, 16, 32, 64))
    # even n: n / 2 output positions, each 4·4·3 MACs
    assert sampled.polynomials["conv"] == Polynomial((Fraction(0), Fraction(4 * 4 * 3, 2)))


def test_symbolic_needs_fake_tensors_and_two_lengths():
    block = TransformerBlock(16, 2, 32)
    with pytest.raises(SymbolicError, match="fake tensors"):
        flopscope.scaling(block, lambda n: torch.zeros(1, n, 16), lengths=(4, 8), mode="real", method="symbolic")
    with pytest.raises(flopscope.ConfigurationError, match="two lengths"):
        flopscope.scaling(block, lambda n: torch.zeros(1, n, 16), lengths=(4,), method="symbolic")
    with pytest.raises(flopscope.ConfigurationError, match="method must be one of"):
        flopscope.scaling(block, lambda n: torch.zeros(1, n, 16), lengths=(4, 8, 16, 32), method="fitted")


class Scores(nn.Module):
    """Batched products of a sequence with itself: [B, n, d] @ [B, d, n], B·n²·d MACs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ x.transpose(1, 2)


def test_the_probe_foretells_whether_a_batched_matmul_traces_symbolically():
    """Where this torch's batched matmul keeps n a symbol (the probe), one trace gives 2·n²·8; where it does not, the
    refusal names the probe's finding."""
    def make(n: int) -> torch.Tensor:
        return torch.zeros(2, n, 8)

    if LIMITS["matmul"] is None:
        result = flopscope.scaling(Scores(), make, lengths=(4, 8, 16), method="symbolic")
        assert sum(p(10) for p in result.polynomials.values()) == 2 * 10 * 10 * 8
    else:
        with pytest.raises(SymbolicError, match="batched matmul makes n a constant"):
            flopscope.scaling(Scores(), make, lengths=(4, 8, 16), method="symbolic")


@pytest.mark.skipif(SYMBOLIC_LIMIT is None, reason="this torch keeps n a symbol: the templates run "
                    "(tests/test_generation_templates.py, tests/test_step_cost.py)")
def test_templates_are_refused_with_the_reason_where_torch_makes_sizes_constants():
    from flopscope.workloads import cost_model, count_generation

    model = llama()
    refused = r"count_generation traces .*torch 2\..* one length only.*profile_generation"
    with pytest.raises(SymbolicError, match=refused):
        count_generation(model, torch.zeros(1, 4, dtype=torch.long), 3)
    with pytest.raises(SymbolicError, match=r"cost_model traces .*torch 2\."):
        cost_model(model)
