"""Exact polynomials in n: interpolation is exact and checked, and equals closed forms coefficient by coefficient."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

import flopscope
from flopscope.studies.models import TransformerBlock
from flopscope.workloads.scaling import Polynomial, interpolate


def test_sums_over_steps_are_the_sums_of_their_terms() -> None:
    """Faulhaber's closed form against the sum it replaces, for every power up to 6."""
    poly = Polynomial((Fraction(7), Fraction(-3), Fraction(5, 2), Fraction(1, 2), Fraction(0), Fraction(0),
                       Fraction(1)))
    for first, last in [(0, 0), (1, 10), (5, 4), (512, 900), (0, 37)]:
        assert poly.sum_over(first, last) == sum(poly(x) for x in range(first, last + 1))


def test_interpolation_is_exact_and_checked():
    xs = [3, 5, 8, 13, 21]
    assert interpolate(xs, [7 * x * x + 11 * x for x in xs]) == Polynomial((Fraction(0), Fraction(11), Fraction(7)))
    assert interpolate(xs, [5] * 5).degree == 0
    third = interpolate(xs, [x * (x + 1) // 2 for x in xs])
    assert third is not None and third.coefficient(2) == Fraction(1, 2)
    assert interpolate(xs, [x**4 for x in xs]) is None  # degree 4 needs 6 lengths to be checked
    assert interpolate(xs, [x // 2 for x in xs]) is None  # floor division is no polynomial
    assert str(Polynomial((Fraction(0), Fraction(589824), Fraction(1536)))) == "1,536·n² + 589,824·n"


def test_transformer_block_scaling_and_crossover():
    d, h, d_ff = 64, 4, 256
    block = TransformerBlock(d, h, d_ff)
    result = flopscope.scaling(block, lambda n: torch.zeros(1, n, d), lengths=(8, 16, 32, 64))
    poly = result.polynomials
    assert poly["attn_scores"] == Polynomial((Fraction(0), Fraction(0), Fraction(d)))  # n²·d
    assert poly["q_proj"] == Polynomial((Fraction(0), Fraction(d * d)))  # n·d²
    assert poly["ffn_up"] == Polynomial((Fraction(0), Fraction(d * d_ff)))
    assert all(result.matches(role) for role in poly)
    # 2n²d > n(4d² + 2·d·d_ff)  <=>  n > 2d + d_ff
    assert result.crossover() == 2 * d + d_ff + 1
    assert result.attention_share(2 * d + d_ff) == Fraction(1, 2)
    assert f"overtakes projections + FFN from n = {2 * d + d_ff + 1:,}" in result.to_table()


def test_llama_scaling_matches_closed_forms_coefficient_by_coefficient():
    transformers = pytest.importorskip("transformers")
    d, h, n_kv, d_ff, L, V = 64, 4, 2, 128, 2, 100
    config = transformers.LlamaConfig(hidden_size=d, intermediate_size=d_ff, num_hidden_layers=L, num_attention_heads=h,
                                      num_key_value_heads=n_kv, vocab_size=V)
    model = transformers.LlamaForCausalLM(config).eval()
    result = flopscope.scaling(model, lambda n: torch.zeros(2, n, dtype=torch.long), lengths=(4, 8, 16, 32))
    d_k, B = d // h, 2
    expected = {
        "q_proj": (0, L * B * d * h * d_k), "k_proj": (0, L * B * d * n_kv * d_k),
        "v_proj": (0, L * B * d * n_kv * d_k), "out_proj": (0, L * B * h * d_k * d),
        "attn_scores": (0, 0, L * B * h * d_k), "attn_weighted_sum": (0, 0, L * B * h * d_k),
        "ffn_up": (0, L * B * d * d_ff), "ffn_gate": (0, L * B * d * d_ff), "ffn_down": (0, L * B * d_ff * d),
        "logits": (0, B * d * V),
    }
    for role, coefficients in expected.items():
        assert result.polynomials[role] == Polynomial(tuple(Fraction(c) for c in coefficients)), role
        assert result.matches(role), role


def test_scaling_needs_enough_lengths():
    with pytest.raises(flopscope.FlopscopeError, match="at least 4"):
        flopscope.scaling(TransformerBlock(8, 2, 16), lambda n: torch.zeros(1, n, 8), lengths=(4, 8, 16))
