"""Variable-length attention kernels: exact with known offsets, a labelled upper bound without them."""

from __future__ import annotations

import pytest
import torch

import flopscope
from flopscope import formulas

H, D = 4, 16
OFFSETS = [0, 30, 60, 90, 123]  # four packed sequences: 30, 30, 30 and 33 tokens


def packed() -> torch.Tensor:
    return torch.randn(OFFSETS[-1], H, D)  # [total tokens, heads, head width]


def known(t: torch.Tensor) -> torch.Tensor | None:
    """What the recorder knows of a tensor's values in real mode: the values of small integer tensors."""
    return None if t.is_floating_point() else t


def test_flash_varlen_with_known_offsets_counts_each_sequence_against_itself() -> None:
    q, cu = packed(), torch.tensor(OFFSETS, dtype=torch.int32)
    spec = flopscope.REGISTRY.spec(torch.ops.aten._flash_attention_forward.default)
    parts = formulas.count(spec.formula, (q, q, q, cu, cu, 33, 33, 0.0, False, False), {}, None, values=known)
    exact = H * D * (3 * 30 * 30 + 33 * 33)  # per matmul: heads · head width · Σ Lᵢ²
    assert parts == {"attn_scores": exact, "attn_weighted_sum": exact}
    assert sum(parts.values()) == 484_992  # the figure, against 1,936,512 as one 123-token sequence
    # without the values: the bound the kernel is launched for, every sequence as long as the longest
    bound = formulas.count(spec.formula, (q, q, q, cu, cu, 33, 33, 0.0, False, False), {}, None)
    assert isinstance(bound, formulas.UpperBound) and bound["attn_scores"] == 4 * H * D * 33 * 33


def test_efficient_varlen_reads_its_offsets_after_the_bias() -> None:
    q, cu = packed(), torch.tensor(OFFSETS, dtype=torch.int32)
    spec = flopscope.REGISTRY.spec(torch.ops.aten._efficient_attention_forward.default)
    parts = formulas.count(spec.formula, (q.unsqueeze(0), q.unsqueeze(0), q.unsqueeze(0), None, cu, cu, 33, 33, 0.0,
                                          0), {}, None, values=known)
    assert parts["attn_scores"] == H * D * (3 * 30 * 30 + 33 * 33)


def test_a_fake_count_without_offsets_says_it_is_a_bound() -> None:
    class Varlen(torch.nn.Module):
        def forward(self, q, k, v, cu):
            return torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, 33, 33, 0.0, False, False)[0]

    with torch.device("meta"):  # no values anywhere: the offsets cannot be read
        q, cu = packed(), torch.tensor(OFFSETS, dtype=torch.int32)
    with pytest.warns(flopscope.FlopscopeWarning, match="upper bound"):
        prof = flopscope.profile(Varlen(), q, q, q, cu, mode="fake")
    assert prof.by_role() == {"attn_scores": 4 * H * D * 33 * 33, "attn_weighted_sum": 4 * H * D * 33 * 33}
    assert any("upper bound" in note and "_flash_attention_forward" in note for note in prof.notes)


def test_a_dense_call_is_unchanged() -> None:
    q = torch.randn(2, 10, H, D)  # [B, n, heads, d], no offsets
    spec = flopscope.REGISTRY.spec(torch.ops.aten._flash_attention_forward.default)
    parts = formulas.count(spec.formula, (q, q, q, None, None, 10, 10, 0.0, False, False), {}, None)
    assert parts == {"attn_scores": 2 * H * 10 * 10 * D, "attn_weighted_sum": 2 * H * 10 * 10 * D}
    assert not isinstance(parts, formulas.UpperBound)


# --------------------------------------------------------------------------------------------------
# nested tensors, jagged layout: SDPA on CPU runs its math path per sequence (strided nested matmuls)
LENGTHS = [30, 30, 30, 33]
E = H * D  # model width: 4 heads of 16


class JaggedSelfAttention(torch.nn.Module):
    """q/k/v projections on a jagged ``[B, j, E]`` batch, SDPA on ``[B, h, j, d]``."""

    def __init__(self) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (torch.nn.Linear(E, E) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (proj(x).unflatten(-1, (H, D)).transpose(1, 2) for proj in (self.q_proj, self.k_proj, self.v_proj))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(-2)


def jagged_batch() -> torch.Tensor:
    return torch.nested.nested_tensor([torch.randn(n, E) for n in LENGTHS], layout=torch.jagged)


PER_SEQUENCE = H * D * (3 * 30**2 + 33**2)  # one attention matmul: heads · head width · Σ nᵢ²
PROJECTION = (3 * 30 + 33) * E * E  # Σ nᵢ tokens · d_in · d_out


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
def test_jagged_sdpa_counts_each_sequence_against_itself_in_real_mode() -> None:
    prof = flopscope.profile(JaggedSelfAttention(), jagged_batch(), mode="real")
    assert prof.by_role() == {"q_proj": PROJECTION, "k_proj": PROJECTION, "v_proj": PROJECTION,
                              "attn_scores": PER_SEQUENCE, "attn_weighted_sum": PER_SEQUENCE}
    assert 2 * prof.total() == 2 * (3 * (3 * 30 + 33) * E * E + 2 * 4 * 16 * (3 * 30**2 + 33**2))  # FLOPs
    assert PER_SEQUENCE < 4 * H * 33 * 33 * D  # less than the padded batch, which the math path never computes
    assert not any("upper bound" in note for note in prof.notes)
    assert prof.unsupported() == {}


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
def test_a_jagged_batch_cannot_be_fake_so_auto_counts_it_for_real() -> None:
    with pytest.raises(flopscope.FakeTensorError, match="a jagged nested tensor of 4 entries cannot be a fake"):
        flopscope.profile(JaggedSelfAttention(), jagged_batch(), mode="fake")
    with pytest.warns(flopscope.FlopscopeWarning, match="counted in real mode instead"):
        prof = flopscope.profile(JaggedSelfAttention(), jagged_batch())
    assert prof.mode == "real" and prof.by_role()["attn_scores"] == PER_SEQUENCE


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
def test_jagged_sdpa_backward_differentiates_each_sequence() -> None:
    prof = flopscope.profile(JaggedSelfAttention(), jagged_batch(), mode="real", backward=True,
                             loss=lambda out: out.values().sum())
    # the math path keeps its scores: each matmul's backward is two products of its size (of both operands);
    # the input needs no gradient, so each projection's backward is its weight gradient only
    assert prof.by_role(phase="backward") == {"q_proj": PROJECTION, "k_proj": PROJECTION, "v_proj": PROJECTION,
                                              "attn_scores": 2 * PER_SEQUENCE, "attn_weighted_sum": 2 * PER_SEQUENCE}
    assert prof.unsupported() == {}


def test_the_shape_of_a_jagged_tensor_lists_each_sequence() -> None:
    values, offsets = torch.randn(OFFSETS[-1], H, D), torch.tensor(OFFSETS)
    shape = formulas.shape_of(torch.nested.nested_tensor_from_jagged(values, offsets).transpose(1, 2))
    assert isinstance(shape, formulas.NestedShape) and shape == (4, H, 33, D)  # padded: the longest sequence
    assert shape.sizes == ((H, 30, D), (H, 30, D), (H, 30, D), (H, 33, D))
    # offsets without values (meta): every sequence as long as the longest it was told of
    unknown = torch.nested.nested_tensor_from_jagged(values.to("meta"), offsets.to("meta"), max_seqlen=33)
    assert formulas.shape_of(unknown).sizes == ((33, H, D),) * 4


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
def test_nested_matmuls_skip_the_padding() -> None:
    a = torch.nested.nested_tensor([torch.randn(3, 8), torch.randn(5, 8)])
    b = torch.nested.nested_tensor([torch.randn(8, 4), torch.randn(8, 2)])
    for op in (torch.ops.aten.bmm.default, torch.ops.aten.matmul.default):
        parts = formulas.count(flopscope.REGISTRY.spec(op).formula, (a, b), {}, None)
        assert parts == 3 * 8 * 4 + 5 * 8 * 2  # against 2 · 5 · 8 · 4 padded
    backward = flopscope.REGISTRY.spec(torch.ops.aten.matmul_backward.default).formula
    assert formulas.count(backward, (a, a, b, [True, False]), {}, None) == 3 * 8 * 4 + 5 * 8 * 2
    assert formulas.count(backward, (a, a, b, [True, True]), {}, None) == 2 * (3 * 8 * 4 + 5 * 8 * 2)


def test_varlen_backward_kernels_read_their_offsets() -> None:
    q, cu = packed(), torch.tensor(OFFSETS, dtype=torch.int32)
    flash = flopscope.REGISTRY.spec(torch.ops.aten._flash_attention_backward.default).formula
    args = (q, q, q, q, q, torch.empty(H, OFFSETS[-1]), cu, cu, 33, 33, 0.0, False, None, None)
    exact = H * D * (3 * 30 * 30 + 33 * 33)  # one forward matmul
    assert formulas.count(flash, args, {}, None, values=known) == {"attn_scores": 3 * exact,
                                                                 "attn_weighted_sum": 2 * exact}
    bound = formulas.count(flash, args, {}, None)
    assert isinstance(bound, formulas.UpperBound) and bound["attn_scores"] == 3 * 4 * H * D * 33 * 33
    efficient = flopscope.REGISTRY.spec(torch.ops.aten._efficient_attention_backward.default).formula
    q4 = q.unsqueeze(0)  # [1, total tokens, heads, d]
    parts = formulas.count(efficient, (q4, q4, q4, q4, None, q4, cu, cu, 33, 33), {}, None, values=known)
    assert parts == {"attn_scores": 3 * exact, "attn_weighted_sum": 2 * exact}
    dense = torch.randn(2, 10, H, D)  # no offsets (an empty tensor in their place): as before
    parts = formulas.count(flash, (dense, dense, dense, dense, dense, None, torch.empty(0), torch.empty(0), 10, 10),
                           {}, None)
    assert parts == {"attn_scores": 3 * 2 * H * 10 * 10 * D, "attn_weighted_sum": 2 * 2 * H * 10 * 10 * D}
