"""Regressions found in review: each test failed before its fix."""

from __future__ import annotations

import warnings

import pytest
import torch
from closed_forms import add, attention, ffn, times
from torch import nn

import flopscope

B, n, d, h = 2, 16, 64, 4


class LearnedQuery(nn.Module):
    """Attention pooling with a learned query (SigLIP's head, Perceiver latents, Q-Former)."""

    def __init__(self, fast: bool):
        super().__init__()
        self.probe = nn.Parameter(torch.randn(1, 1, d))
        self.mha = nn.MultiheadAttention(d, h, batch_first=True)
        self.fast = fast

    def forward(self, x):
        query = self.probe.repeat(x.shape[0], 1, 1)
        return self.mha(query, x, x, need_weights=not self.fast)[0]


@pytest.mark.parametrize("fast", [False, True])
def test_a_learned_query_is_still_attention(fast):
    with torch.no_grad():
        prof = flopscope.profile(LearnedQuery(fast).eval(), torch.randn(B, n, d))
    assert {r: m for r, m in prof.by_role().items() if m} == attention(B, 1, n, d, h)


def test_a_caught_submodule_error_leaves_attribution_intact():
    class Fragile(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            self.lin(x)
            raise RuntimeError("fast path unavailable")

    class Parent(nn.Module):
        def __init__(self):
            super().__init__()
            self.fast, self.slow, self.head = Fragile(), nn.Linear(8, 8), nn.Linear(8, 4)

        def forward(self, x):
            try:
                y = self.fast(x)
            except RuntimeError:
                y = self.slow(x)
            return self.head(y)

    for mode in ("fake", "real"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            prof = flopscope.profile(Parent(), torch.randn(3, 8), mode=mode)
        assert prof.by_module() == {"": 3 * 8 * 8 * 2 + 3 * 8 * 4, "fast": 3 * 8 * 8, "fast.lin": 3 * 8 * 8,
                                    "slow": 3 * 8 * 8, "head": 3 * 8 * 4}


def test_real_backward_leaves_existing_gradients_alone():
    model = nn.Linear(8, 8)
    model.weight.grad = torch.ones_like(model.weight)
    before = model.weight.grad
    flopscope.profile(model, torch.randn(3, 8), mode="real", backward=True)
    assert model.weight.grad is before and torch.equal(before, torch.ones_like(before))
    assert model.bias.grad is None


def test_fake_profiler_does_not_touch_real_buffers():
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8)).train()
    with flopscope.profiler(model, mode="fake") as prof:
        model(torch.randn(4, 8))
    assert prof.total() == 4 * 8 * 8
    assert model[1].num_batches_tracked.item() == 0
    assert torch.equal(model[1].running_mean, torch.zeros(8))


def test_shared_expert_gate_and_shared_expert_in_a_mixture_of_experts():
    transformers = pytest.importorskip("transformers")
    d_ff, experts, top_k, L = 64, 4, 2, 2
    config = transformers.Qwen2MoeConfig(hidden_size=d, num_hidden_layers=L, num_attention_heads=h,
                                         num_key_value_heads=h, moe_intermediate_size=d_ff,
                                         shared_expert_intermediate_size=d_ff, num_experts=experts,
                                         num_experts_per_tok=top_k, vocab_size=100, intermediate_size=d_ff,
                                         decoder_sparse_step=1)
    torch.manual_seed(0)
    prof = flopscope.profile(transformers.Qwen2MoeModel(config).eval(), torch.randint(0, 100, (1, n)))
    tokens = n
    expected = times(L, add(attention(1, n, n, d, h),
                            ffn(1, tokens * top_k, d, d_ff, gated=True),  # routed experts
                            ffn(1, tokens, d, d_ff, gated=True),  # the shared expert sees every token
                            {"other": tokens * d * experts + tokens * d * 1}))  # router, shared-expert gate
    assert {r: m for r, m in prof.by_role().items() if m} == expected
    result = prof.reconcile()
    assert result.unexplained() == [] and result.all_exact(), result.to_table()
