"""Roles on the architectures people train now, per role against closed forms written from each config: DeepSeek-V3
(multi-head latent attention with low-rank query and key / value factors, a sigmoid router, shared and routed
experts, dense first layers) and GPT-OSS (attention sinks, a softmax router, experts with biases)."""

from __future__ import annotations

import warnings

import pytest
import torch

import flopscope

from zoo import hf

transformers = pytest.importorskip("transformers")

n = 8  # tokens


def roles_of(model: torch.nn.Module, ids: torch.Tensor, mode: str) -> dict[str, int]:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prof = flopscope.profile(model, ids, mode=mode)
    by_role = prof.by_role()
    assert sum(by_role.values()) == prof.total()
    return {role: macs for role, macs in by_role.items() if macs}


DEEPSEEK = dict(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=3,
                first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4,
                num_experts_per_tok=2, n_shared_experts=1, n_group=2, topk_group=1, q_lora_rank=12, kv_lora_rank=8,
                qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5, max_position_embeddings=64)


def deepseek_v3_roles(c: dict[str, int]) -> dict[str, int]:
    """DeepSeek-V3 per role (batch 1, n tokens). Attention (MLA), every layer: the query factors q_a (d -> r_q) and
    q_b (r_q -> h·(nope + rope)) are q_proj; kv_a (d -> r_kv + rope: the latent and the shared rotary key) is
    k_proj (its latent columns feed keys and values: the first role, docs/roles.md section 3.5); kv_b's key columns
    (h·nope) are k_proj, its value columns (h·d_v) v_proj; scores over nope + rope, weighted sum over d_v. FFN: the
    dense layers d -> d_ff -> d gated; the MoE layers k routed experts per token and the shared expert, of
    moe_intermediate each, gated; the sigmoid router (d -> experts) other."""
    d, h, L, dense = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"], c["first_k_dense_replace"]
    r_q, r_kv, nope, rope, d_v = (c["q_lora_rank"], c["kv_lora_rank"], c["qk_nope_head_dim"], c["qk_rope_head_dim"],
                                  c["v_head_dim"])
    moe, k, experts, shared = (c["moe_intermediate_size"], c["num_experts_per_tok"], c["n_routed_experts"],
                               c["n_shared_experts"])
    ffn_per_branch = dense * n * d * c["intermediate_size"] + (L - dense) * (k + shared) * n * d * moe
    return {"q_proj": L * n * (d * r_q + r_q * h * (nope + rope)),
            "k_proj": L * n * (d * (r_kv + rope) + r_kv * h * nope),
            "v_proj": L * n * r_kv * h * d_v,
            "out_proj": L * n * h * d_v * d,
            "attn_scores": L * h * n * n * (nope + rope),
            "attn_weighted_sum": L * h * n * n * d_v,
            "ffn_up": ffn_per_branch, "ffn_gate": ffn_per_branch, "ffn_down": ffn_per_branch,
            "logits": n * d * c["vocab_size"],
            "other": (L - dense) * n * d * experts}


MODES = ["real", "fake", "meta"]  # meta: the model built on device="meta", counted in fake mode


def build(cls: str, config: str, attn: str, mode: str, settings: dict[str, int]) -> torch.nn.Module:
    return hf(cls, config, attn=attn, device="meta" if mode == "meta" else None, **settings)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("mode", MODES)
def test_deepseek_v3_roles_equal_their_closed_forms(attn: str, mode: str) -> None:
    """At 3bbe37a k_proj was 0 (the key is assembled in place: key[..., :nope].copy_(k_nope)), q_a_proj other, the
    router ffn_up, and the second MoE layer's factors ffn_down."""
    model = build("DeepseekV3ForCausalLM", "DeepseekV3Config", attn, mode, DEEPSEEK)
    ids = torch.randint(0, DEEPSEEK["vocab_size"], (1, n))
    assert roles_of(model, ids, "fake" if mode == "meta" else mode) == deepseek_v3_roles(DEEPSEEK)


GPT_OSS = dict(vocab_size=64, hidden_size=32, intermediate_size=16, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
               layer_types=["sliding_attention", "full_attention"])


def gpt_oss_roles(c: dict[str, int]) -> dict[str, int]:
    """GPT-OSS per role (batch 1, n tokens): grouped-query attention with biases and sinks (the sink is one more
    logit per row of the softmax: no multiply); the sliding layer's scores are computed for every pair and masked
    (eager attention); k experts per token, each gate / up (interleaved columns of one product) and down of
    intermediate_size; the softmax router (d -> experts) other."""
    d, h, kv, hd, L = (c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"],
                       c["num_hidden_layers"])
    routed = n * c["num_experts_per_tok"] * d * c["intermediate_size"]
    return {"q_proj": L * n * d * h * hd, "k_proj": L * n * d * kv * hd, "v_proj": L * n * d * kv * hd,
            "out_proj": L * n * h * hd * d, "attn_scores": L * h * n * n * hd, "attn_weighted_sum": L * h * n * n * hd,
            "ffn_up": L * routed, "ffn_gate": L * routed, "ffn_down": L * routed,
            "logits": n * d * c["vocab_size"], "other": L * n * d * c["num_local_experts"]}


@pytest.mark.parametrize("mode", MODES)
def test_gpt_oss_roles_equal_their_closed_forms(mode: str) -> None:
    """At 3bbe37a the router was ffn_up (the per-expert bias lookup gate_up_proj_bias[expert_ids] has a
    router-derived index) and ffn_gate changed between runs."""
    model = build("GptOssForCausalLM", "GptOssConfig", "eager", mode, GPT_OSS)
    ids = torch.randint(0, GPT_OSS["vocab_size"], (1, n))
    for _ in range(2):
        assert roles_of(model, ids, "fake" if mode == "meta" else mode) == gpt_oss_roles(GPT_OSS)
