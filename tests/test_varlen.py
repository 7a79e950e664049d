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
