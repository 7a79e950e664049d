"""Backward counts: every gradient GEMM is attributed to the forward role and module that produced it."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch import nn

import flopscope

from closed_forms import add, attention, ffn, rotary, times, total
from zoo import CPU_FUSED_GQA

transformers = pytest.importorskip("transformers")
d, h, n_kv, d_ff, L, V, B, n = 64, 4, 2, 128, 2, 100, 2, 10


def llama(attn: str) -> nn.Module:
    config = transformers.LlamaConfig(hidden_size=d, intermediate_size=d_ff, num_hidden_layers=L,
                                      num_attention_heads=h, num_key_value_heads=n_kv, vocab_size=V)
    config._attn_implementation = attn
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def forward_roles() -> dict[str, int]:
    return add(times(L, add(attention(B, n, n, d, h, n_kv), ffn(B, n, d, d_ff, gated=True))),
               {"logits": B * n * d * V})


@pytest.mark.parametrize("mode", ["fake", "real"])
def test_training_step_is_three_forwards_with_eager_attention(mode):
    model = llama("eager")
    before = [p.grad for p in model.parameters()]
    prof = flopscope.profile(model, torch.randint(0, V, (B, n)), mode=mode, backward=True)
    expected = forward_roles()
    forward = {role: macs for role, macs in prof.by_role(phase="forward").items() if macs}
    assert forward == add(expected, rotary(n, d // h))  # (the rotary angles need no gradient)
    # each GEMM's backward computes the input gradient and the weight gradient: twice its forward
    backward = {role: macs for role, macs in prof.by_role(phase="backward").items() if macs}
    assert backward == {role: 2 * macs for role, macs in expected.items()}
    rotary_macs = total(rotary(n, d // h))
    assert prof.total() == 3 * total(expected) + rotary_macs
    assert prof.by_phase() == {"forward": total(expected) + rotary_macs, "backward": 2 * total(expected)}
    assert [p.grad for p in model.parameters()] == before  # .grad restored
    assert prof.unsupported() == {}


def test_real_backward_leaves_existing_gradients_alone():
    model = nn.Linear(8, 8)
    model.weight.grad = torch.ones_like(model.weight)
    before = model.weight.grad
    flopscope.profile(model, torch.randn(3, 8), mode="real", backward=True)
    assert model.weight.grad is before and torch.equal(before, torch.ones_like(before))
    assert model.bias.grad is None


@pytest.mark.skipif(not CPU_FUSED_GQA, reason="this torch runs grouped-query SDPA on the CPU as the math path")
def test_fused_attention_backward_follows_the_kernel_formula():
    prof = flopscope.profile(llama("sdpa"), torch.randint(0, V, (B, n)), backward=True)
    core = B * h * n * n * (d // h)
    backward = prof.by_role(phase="backward")
    assert backward["attn_scores"] == L * 3 * core  # recompute QKᵀ, then dQ and dK
    assert backward["attn_weighted_sum"] == L * 2 * core  # dV and dP
    assert backward["q_proj"] == 2 * L * B * n * d * d


def test_gradients_land_on_the_module_that_ran_the_forward_op():
    """Q, K and V share their input; PyTorch's counter puts their gradients on the wrong module."""
    model = transformers.GPT2Model(transformers.GPT2Config(n_embd=d, n_layer=1, n_head=h, vocab_size=V))
    prof = flopscope.profile(model, torch.randint(0, V, (B, n)), backward=True)
    backward = Counter()
    for record in prof.records:
        if record.phase == "backward":
            for role, macs in record.roles.items():
                backward[(record.module, role)] += macs
    per_projection = 2 * B * n * d * d  # input and weight gradients of one third of c_attn
    for role in ("q_proj", "k_proj", "v_proj"):
        assert backward[("h.0.attn.c_attn", role)] == per_projection
    assert backward[("h.0.mlp.c_fc", "ffn_up")] == 2 * B * n * d * 4 * d


def test_recurrent_and_convolution_backward():
    lstm = nn.LSTM(12, 16)
    prof = flopscope.profile(lstm, torch.randn(7, 3, 12, requires_grad=True), backward=True, mode="real")
    forward = 7 * 3 * 4 * 16 * (12 + 16)
    assert prof.by_phase() == {"forward": forward, "backward": 2 * forward}
    conv = nn.Conv1d(6, 8, 3)
    prof = flopscope.profile(conv, torch.randn(2, 6, 20), backward=True)  # the input needs no gradient
    forward = 2 * 8 * 18 * 6 * 3
    assert prof.by_phase() == {"forward": forward, "backward": forward}


def test_backward_needs_something_to_differentiate():
    frozen = nn.Linear(4, 4).requires_grad_(False)
    with pytest.raises(flopscope.FlopscopeError, match="requires grad"):
        flopscope.profile(frozen, torch.randn(2, 4), backward=True)
    assert all(not p.requires_grad for p in frozen.parameters())


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("mode", ["fake", "real"])
def test_activation_checkpointing_recompute_is_its_own_phase_with_the_forward_roles(mode, reentrant):
    plain = llama("eager").train()
    checkpointed = llama("eager").train()
    checkpointed.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    ids = torch.randint(0, V, (B, n))
    baseline = flopscope.profile(plain, ids, mode=mode, backward=True)
    prof = flopscope.profile(checkpointed, ids, mode=mode, backward=True)
    layers = times(L, add(attention(B, n, n, d, h, n_kv), ffn(B, n, d, d_ff, gated=True)))
    if not reentrant:
        # PyTorch's non-reentrant checkpoint stops recomputing once every saved activation is back: no backward
        # node saves down_proj's output (only the residual add reads it), so the last GEMM of a layer is not re-run
        del layers["ffn_down"]
    assert {role: macs for role, macs in prof.by_role(phase="recompute").items() if macs} == layers
    assert prof.by_role(phase="forward") == baseline.by_role(phase="forward")
    assert prof.by_role(phase="backward") == baseline.by_role(phase="backward")
    assert prof.total() == baseline.total() + sum(layers.values())  # totals are executed work
    for i in range(L):  # a re-run layer is the same module call, attributed like its forward
        assert prof.total(f"model.layers.{i}", phase="recompute") == sum(layers.values()) // L
    assert prof.module_calls() == baseline.module_calls()
