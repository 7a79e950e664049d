"""Low-rank adapters take the role of the projection they update (docs/roles.md section 3.5): the real PEFT package's
LoRA on every projection of Llama and GPT-2 and on convolutions, forward and backward (frozen bases: input gradients
only; trainable adapters: input and weight gradients), per role against closed forms written from the configs."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import flopscope

from closed_forms import add, rotary, total

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

d, h, n_kv, d_ff, L, V, n, r = 64, 4, 2, 128, 2, 256, 12, 6
d_k = d // h
LLAMA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# (module, role, width in, width out) of each Llama projection
LLAMA_PROJECTIONS = (("q_proj", "q_proj", d, h * d_k), ("k_proj", "k_proj", d, n_kv * d_k),
                     ("v_proj", "v_proj", d, n_kv * d_k), ("o_proj", "out_proj", h * d_k, d),
                     ("gate_proj", "ffn_gate", d, d_ff), ("up_proj", "ffn_up", d, d_ff),
                     ("down_proj", "ffn_down", d_ff, d))


def lora_llama(attn: str = "sdpa", device: str = "cpu", **lora: object) -> nn.Module:
    config = transformers.LlamaConfig(hidden_size=d, intermediate_size=d_ff, num_hidden_layers=L,
                                      num_attention_heads=h, num_key_value_heads=n_kv, vocab_size=V)
    config._attn_implementation = attn
    torch.manual_seed(0)
    with torch.device(device):
        base = transformers.LlamaForCausalLM(config)
    return peft.get_peft_model(base, peft.LoraConfig(r=r, target_modules=list(LLAMA_TARGETS), **lora))


def llama_forward() -> dict[str, int]:
    """Per role, one forward of batch 1: each projection W (in -> out) with its adapter B·A (in -> r -> out):
    n·in·out + n·in·r + n·r·out; the attention core 2·h·n²·d_k; the LM head n·d·V."""
    roles: dict[str, int] = {}
    for _, role, width_in, width_out in LLAMA_PROJECTIONS:
        roles[role] = L * n * (width_in * width_out + width_in * r + r * width_out)
    return add(roles, {"attn_scores": L * h * n * n * d_k, "attn_weighted_sum": L * h * n * n * d_k,
                       "logits": n * d * V})


def llama_backward() -> dict[str, int]:
    """Per role, the backward of ``logits.sum()`` with frozen base weights and trainable adapters. A frozen W computes
    its input's gradient only (n·in·out), where its input needs one; an adapter computes its weight's gradient and,
    where its input needs one, its input's. Layer 0's query / key / value read the embedding's output, which needs no
    gradient (the embedding is frozen): their W computes nothing and their A only its weight gradient. Everything after
    them needs gradients (the adapters' outputs do). The core's two products each differentiate both operands (2×);
    the LM head is frozen (n·d·V)."""
    roles: dict[str, int] = {}
    for _, role, width_in, width_out in LLAMA_PROJECTIONS:
        w, a, b = n * width_in * width_out, n * width_in * r, n * r * width_out
        first_layer = (0 + a + 2 * b) if role in ("q_proj", "k_proj", "v_proj") else (w + 2 * a + 2 * b)
        roles[role] = first_layer + (L - 1) * (w + 2 * a + 2 * b)
    return add(roles, {"attn_scores": 2 * L * h * n * n * d_k, "attn_weighted_sum": 2 * L * h * n * n * d_k,
                       "logits": n * d * V})


def nonzero(by_role: dict[str, int]) -> dict[str, int]:
    return {role: macs for role, macs in by_role.items() if macs}


@pytest.mark.parametrize("mode", ["fake", "real", "meta"])
def test_lora_on_every_llama_projection_takes_its_role(mode):
    model = lora_llama(device="meta" if mode == "meta" else "cpu")
    ids = torch.randint(0, V, (1, n), device="meta" if mode == "meta" else "cpu")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prof = flopscope.profile(model, ids, mode="fake" if mode == "meta" else mode)
    assert nonzero(prof.by_role()) == add(llama_forward(), rotary(n, d_k))
    adapters = [rec for rec in prof.records if ".lora_" in rec.module]
    assert len(adapters) == 2 * L * len(LLAMA_TARGETS)
    for rec in adapters:  # each factor has its projection's role, and is in its projection's block
        module = rec.module.split(".lora_")[0].rsplit(".", 1)[-1]
        role = dict((m, role) for m, role, _, _ in LLAMA_PROJECTIONS)[module]
        assert dict(rec.roles) == {role: rec.multiplies}, rec.module
        assert rec.block == ("self_attn" if module.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp") \
            or rec.block.endswith(("self_attn", "mlp")), rec.block


@pytest.mark.parametrize("mode", ["fake", "real"])
def test_lora_training_step_with_frozen_bases(mode):
    model = lora_llama(attn="eager").train()
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in name for name in trainable)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prof = flopscope.profile(model, torch.randint(0, V, (1, n)), mode=mode, backward=True,
                                 loss=lambda out: out.logits.sum())
    assert nonzero(prof.by_role(phase="forward")) == add(llama_forward(), rotary(n, d_k))
    assert nonzero(prof.by_role(phase="backward")) == llama_backward()
    assert prof.total() == total(llama_forward()) + total(rotary(n, d_k)) + total(llama_backward())


def test_dropout_and_rslora_scaling_keep_the_roles():
    """Dropout on the adapter's input (a training run) and rsLoRA's scale change no role."""
    model = lora_llama(lora_dropout=0.1, use_rslora=True).train()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prof = flopscope.profile(model, torch.randint(0, V, (1, n)), mode="fake")
    assert nonzero(prof.by_role()) == add(llama_forward(), rotary(n, d_k))


def test_lora_on_gpt2_fused_projections_splits_like_them():
    """GPT-2's c_attn is one Conv1D d -> 3d split into q, k, v by columns: its adapter's B (r -> 3d) splits the same
    way, and its A (d -> r), which serves all three, in the same proportions (a third each)."""
    config = transformers.GPT2Config(n_embd=d, n_layer=L, n_head=h, vocab_size=V, n_positions=64)
    torch.manual_seed(0)
    model = peft.get_peft_model(transformers.GPT2LMHeadModel(config),
                                peft.LoraConfig(r=r, target_modules=["c_attn", "c_proj", "c_fc"], fan_in_fan_out=True))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prof = flopscope.profile(model, torch.randint(0, V, (1, n)), mode="fake")
    d_ff_gpt2 = 4 * d
    per_layer = {
        # W d -> d each, A d -> r shared by thirds, B r -> d each
        "q_proj": n * d * d + n * d * r // 3 + n * r * d,
        "k_proj": n * d * d + n * d * r // 3 + n * r * d,
        "v_proj": n * d * d + n * d * r // 3 + n * r * d,
        "out_proj": n * d * d + n * d * r + n * r * d,
        "attn_scores": h * n * n * d_k, "attn_weighted_sum": h * n * n * d_k,
        "ffn_up": n * d * d_ff_gpt2 + n * d * r + n * r * d_ff_gpt2,
        "ffn_down": n * d_ff_gpt2 * d + n * d_ff_gpt2 * r + n * r * d,
    }
    assert nonzero(prof.by_role()) == add(*[per_layer] * L, {"logits": n * d * V})


def test_lora_on_convolutions_is_convolution():
    """LoRA on a Conv2d: A is a convolution of the base's kernel to r channels, B a 1×1 convolution back."""
    net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 8, 3, padding=1))
    model = peft.get_peft_model(net, peft.LoraConfig(r=4, target_modules=["0", "2"]))
    prof = flopscope.profile(model, torch.randn(2, 3, 10, 10), mode="fake")
    pixels = 2 * 10 * 10
    base = pixels * (16 * 3 * 9 + 8 * 16 * 9)
    adapters = pixels * (4 * 3 * 9 + 16 * 4) + pixels * (4 * 16 * 9 + 8 * 4)
    assert nonzero(prof.by_role()) == {"conv": base + adapters}


def test_dora_keeps_the_projection_roles_and_its_weight_norm_is_other():
    """DoRA scales the base output and the adapter's by a magnitude over the norm of W + B·A: the adapter keeps its
    projection's roles; the weight-norm products (B·A applied to an identity, in·in·r + in·r·out per adapted layer,
    once per call whatever the tokens) are other, never a projection the scale multiplies."""
    model = lora_llama(use_dora=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        roles = nonzero(flopscope.profile(model, torch.randint(0, V, (1, n)), mode="fake").by_role())
    weight_norms = L * sum(width_in * width_in * r + width_in * r * width_out
                           for _, _, width_in, width_out in LLAMA_PROJECTIONS)
    assert roles == add(llama_forward(), rotary(n, d_k), {"other": weight_norms})
