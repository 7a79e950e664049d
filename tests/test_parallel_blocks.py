"""Parallel blocks with fused projections (ViT-22B, PaLM): one input projection whose columns are the queries, keys,
values and the MLP's up projection, one output projection reading cat([attention, mlp]). The input projection is
split by output columns, the output projection by input rows (docs/roles.md section 4), against closed forms."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import flopscope

d, h, d_ff, B, n = 32, 4, 128, 2, 10


class ParallelBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_dim, self.num_heads = d, h  # declared, as attention modules do
        self.norm = nn.LayerNorm(d)
        self.linear1 = nn.Linear(d, 3 * d + d_ff)  # q, k, v and the MLP's up projection, fused
        self.linear2 = nn.Linear(d + d_ff, d)  # attention's output projection and the MLP's down projection, fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v, up = self.linear1(self.norm(x)).split([d, d, d, d_ff], dim=-1)
        q, k, v = (t.view(B, n, h, d // h).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, n, d)
        return x + self.linear2(torch.cat([attended, F.gelu(up)], dim=-1))


EXPECTED = {"q_proj": B * n * d * d, "k_proj": B * n * d * d, "v_proj": B * n * d * d, "out_proj": B * n * d * d,
            "attn_scores": B * h * n * n * (d // h), "attn_weighted_sum": B * h * n * n * (d // h),
            "ffn_up": B * n * d * d_ff, "ffn_down": B * n * d_ff * d}


@pytest.mark.parametrize("mode", ["fake", "real"])
def test_fused_parallel_block_splits_by_columns_and_rows(mode):
    prof = flopscope.profile(ParallelBlock(), torch.randn(B, n, d), mode=mode)
    assert {role: macs for role, macs in prof.by_role().items() if macs} == EXPECTED
    (first,) = [r for r in prof.records if r.module == "linear1"]
    assert dict(first.roles) == {"q_proj": B * n * d * d, "k_proj": B * n * d * d, "v_proj": B * n * d * d,
                                 "ffn_up": B * n * d * d_ff}
    (last,) = [r for r in prof.records if r.module == "linear2"]
    assert dict(last.roles) == {"out_proj": B * n * d * d, "ffn_down": B * n * d_ff * d}


def test_fused_parallel_block_reconciles():
    """Without a declared d_ff the fused up projection's width is not the FFN's: the FFN rows say so; with a
    TransformerSpec every row is exact."""
    prof = flopscope.profile(ParallelBlock(), torch.randn(B, n, d), mode="fake")
    rows = prof.reconcile().rows
    assert not prof.reconcile().unexplained()
    assert {r.role for r in rows if not r.exact} == {"ffn_up", "ffn_down"}
    assert all("fused" in r.reason for r in rows if not r.exact)
    assert prof.reconcile(flopscope.TransformerSpec(d=d, h=h, d_ff=d_ff)).all_exact()

