"""flopscope.compare() (studies.why_self_attention): Vaswani et al. Table 1, measured, against closed forms."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import flopscope
from flopscope.studies.why_self_attention import (
    BandedSelfAttention,
    Comparison,
    MaskedBandSelfAttention,
    band_window,
    compare,
    compare_lengths,
)

SHAPES = {
    "default": {"n": 512, "d": 512, "h": 8, "k": 5, "r": 64, "d_ff": 4 * 512},
    "small": {"n": 64, "d": 32, "h": 4, "k": 3, "r": 8, "d_ff": 4 * 32},
}


def closed_forms(n: int, d: int, h: int, k: int, r: int, d_ff: int) -> dict[str, int]:
    """Predicted MACs per row, one sequence, forward (odd k: the convolutions' output length is n)."""
    return {
        "self_attention_core": 2 * n * n * d,
        "self_attention": 4 * n * d * d + 2 * n * n * d,
        "self_attention_single_head": 4 * n * d * d + 2 * n * n * d,
        "restricted_banded_core": 2 * r * n * d,
        "restricted_masked_dense_core": 2 * n * n * d,
        "convolution": k * n * d * d,
        "separable_convolution": k * n * d + n * d * d,
        "recurrent": 2 * n * d * d,
        "feed_forward": 2 * n * d * d_ff,
        "fully_connected": n * n * d * d,
        "transformer_block": n * (4 * d * d + 2 * d * d_ff) + 2 * n * n * d,
        "cross_attention_one_query": d * d + 2 * n * d * d + 2 * n * d + d * d,
        "cross_attention_q_proj": d * d,
        "self_attention_q_proj": n * d * d,
    }


@pytest.fixture(scope="module", params=list(SHAPES))
def case(request: pytest.FixtureRequest) -> tuple[dict[str, int], Comparison]:
    shape = SHAPES[request.param]
    return shape, compare(**shape)


def test_every_row_measured_equals_predicted_equals_closed_form(case: tuple[dict[str, int], Comparison]) -> None:
    shape, result = case
    expected = closed_forms(**shape)
    assert [row.key for row in result.rows] == list(expected)
    for row in result.rows:
        assert row.predicted_macs == expected[row.key], row.key
        assert row.measured_macs == expected[row.key], row.key
        assert row.match, row.key
        assert row.measured_flops == 2 * row.measured_macs
    assert result.all_match


def test_parameters(case: tuple[dict[str, int], Comparison]) -> None:
    shape, result = case
    d, n, d_ff = shape["d"], shape["n"], shape["d_ff"]
    assert result.row("fully_connected").params == (n * d) ** 2 + n * d
    assert result.row("transformer_block").params == 4 * d * d + 2 * d * d_ff + d_ff + 9 * d
    assert result.row("transformer_block").params == 12 * d * d + 13 * d  # d_ff = 4d
    assert result.row("self_attention").params == 4 * d * d + 4 * d
    assert result.row("cross_attention_one_query").params == 4 * d * d + 4 * d  # nn.MultiheadAttention
    assert result.row("recurrent").params == 2 * d * d + 2 * d
    assert result.row("convolution").params == shape["k"] * d * d + d
    assert result.row("separable_convolution").params == (shape["k"] * d + d) + (d * d + d)


def test_weights_without_biases(case: tuple[dict[str, int], Comparison]) -> None:
    shape, result = case
    d, n, k, d_ff = shape["d"], shape["n"], shape["k"], shape["d_ff"]
    weights = {  # the >= 2-D parameters: matrices and kernels; biases and norm scales are 1-D
        "self_attention_core": 4 * d * d,  # a partial row: the whole layer's weights
        "self_attention": 4 * d * d,
        "self_attention_single_head": 4 * d * d,
        "restricted_banded_core": 4 * d * d,
        "restricted_masked_dense_core": 4 * d * d,
        "convolution": k * d * d,
        "separable_convolution": k * d + d * d,  # depthwise [d, 1, k] and pointwise [d, d, 1]
        "recurrent": 2 * d * d,
        "feed_forward": 2 * d * d_ff,
        "fully_connected": (n * d) ** 2,
        "transformer_block": 4 * d * d + 2 * d * d_ff,
        "cross_attention_one_query": 4 * d * d,
        "cross_attention_q_proj": 4 * d * d,
        "self_attention_q_proj": 4 * d * d,
    }
    assert {row.key: row.weights for row in result.rows} == weights
    biases = {"fully_connected": n * d, "transformer_block": 4 * d + d_ff + d + 2 * 2 * d,  # + two LayerNorms
              "recurrent": 2 * d, "convolution": d, "separable_convolution": 2 * d, "feed_forward": d_ff + d}
    for key, extra in biases.items():
        assert result.row(key).params == weights[key] + extra, key


def test_fully_connected_vs_transformer_block_at_512() -> None:
    result = compare()
    fc, block = result.row("fully_connected"), result.row("transformer_block")
    assert fc.params == 512**4 + 512 * 512 == 68_719_738_880  # weights and biases
    assert fc.weights == 512**4 == 68_719_476_736  # the seed note's "64 Gi": the weights alone
    assert block.params == 12 * 512**2 + 13 * 512 == 3_152_384
    assert block.weights == 12 * 512**2 == 3_145_728  # the note's "~3 M"
    table = result.to_table()
    fc_line = next(line for line in table.splitlines() if line.startswith("fully connected"))
    assert fc_line.split()[-4:-2] == [f"{512**4:,}", f"{512**4 + 512 * 512:,}"]  # weights, + biases
    block_line = next(line for line in table.splitlines() if line.startswith("Transformer block"))
    assert block_line.split()[-4:-2] == [f"{12 * 512**2:,}", f"{12 * 512**2 + 13 * 512:,}"]
    assert f"{512**4:,}" in fc_line.split()[:-4]  # the MACs of the fully-connected layer, n²·d² = 512^4 too
    weights_line = next(line for line in table.splitlines() if line.startswith("weights:"))
    assert f"{512**4:,} vs Transformer block {12 * 512**2:,} ({512**2 // 12:,}x)" in weights_line
    assert f"{512**4 + 512 * 512:,} vs {12 * 512**2 + 13 * 512:,}" in weights_line
    assert " NO " not in table


def test_multi_head_equals_single_head(case: tuple[dict[str, int], Comparison]) -> None:
    _, result = case
    assert result.row("self_attention").measured_macs == result.row("self_attention_single_head").measured_macs


def test_banded_core_vs_masked_dense_core(case: tuple[dict[str, int], Comparison]) -> None:
    shape, result = case
    n, d, r = shape["n"], shape["d"], shape["r"]
    assert result.row("restricted_banded_core").measured_macs == 2 * r * n * d
    assert result.row("restricted_masked_dense_core").measured_macs == 2 * n * n * d
    assert result.row("restricted_masked_dense_core").measured_macs == result.row("self_attention_core").measured_macs


def test_q_projection_one_query_vs_n_queries(case: tuple[dict[str, int], Comparison]) -> None:
    shape, result = case
    n, d = shape["n"], shape["d"]
    one, many = result.row("cross_attention_q_proj").measured_macs, result.row("self_attention_q_proj").measured_macs
    assert (one, many) == (d * d, n * d * d)


def test_crossover(case: tuple[dict[str, int], Comparison]) -> None:
    shape, result = case
    d = shape["d"]
    n = result.crossover_self_attention_vs_recurrence()
    assert n == d + 1
    assert 2 * n * n * d > 2 * n * d * d and not 2 * (n - 1) ** 2 * d > 2 * (n - 1) * d * d


def test_compare_lengths_shows_the_crossover() -> None:
    d = 32
    lengths = [d // 2, d, d + 1, 2 * d]
    result = compare_lengths(lengths, d=d, h=4)
    assert [row.n for row in result.rows] == lengths
    for row in result.rows:
        assert row.match
        assert row.attention_core_measured_macs == 2 * row.n * row.n * d
        assert row.recurrent_measured_macs == 2 * row.n * d * d
    assert [row.cheaper for row in result.rows] == ["self-attention", "equal", "recurrent", "recurrent"]
    assert result.crossover_self_attention_vs_recurrence() == d + 1
    assert f"{2 * (d + 1) ** 2 * d:,}" in result.to_table()


@pytest.mark.parametrize("r", [1, 4, 5, 40])  # odd, even, and a window wider than the sequence
def test_banded_attention_is_the_band_masked_attention(r: int) -> None:
    n, d, h = 16, 8, 2
    torch.manual_seed(0)
    banded = BandedSelfAttention(d, h, r)
    masked = MaskedBandSelfAttention(d, h, r)
    masked.load_state_dict(banded.state_dict())
    x = torch.randn(3, n, d)
    with torch.no_grad():
        torch.testing.assert_close(banded(x), masked(x))
    left, right = band_window(r)
    assert left + right + 1 == r
    prof = flopscope.profile(banded, x, mode="fake")
    assert prof.total() == 3 * (4 * n * d * d + 2 * r * n * d)
    roles = prof.by_role()
    assert roles["attn_scores"] == roles["attn_weighted_sum"] == 3 * r * n * d
    assert roles["q_proj"] == roles["k_proj"] == roles["v_proj"] == roles["out_proj"] == 3 * n * d * d


def test_even_kernel_width_counts_the_extra_output_position() -> None:
    n, d, h, k, r = 16, 8, 2, 4, 3
    result = compare(n=n, d=d, h=h, k=k, r=r)
    assert result.all_match
    assert result.row("convolution").measured_macs == k * (n + 1) * d * d  # padding k//2: n + 1 outputs
    assert result.row("separable_convolution").measured_macs == k * (n + 1) * d + (n + 1) * d * d


def test_rows_are_frozen_and_inputs_are_validated() -> None:
    result = compare(n=8, d=8, h=2, k=3, r=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.rows[0].measured_macs = 0  # type: ignore[misc]
    with pytest.raises(KeyError):
        result.row("nope")
    assert (result.n, result.d, result.h, result.k, result.r, result.d_ff) == (8, 8, 2, 3, 2, 4 * 8)
    with pytest.raises(ValueError):
        compare(n=8, d=10, h=4)
    with pytest.raises(ValueError):
        compare(n=8, d=8, h=2, r=0)
