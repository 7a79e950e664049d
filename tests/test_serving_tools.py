"""The analytic tools' FLOPs (``flopscope.predict.serving_tools``) against their own formulas' arithmetic on the
published configs of Llama-3-8B, Mixtral-8x7B and DeepSeek-V3 (closed forms written out here), and the explanation
of their differences from flopscope's count on tiny configs of the same families built on meta: every difference
named with a cause, never "unexplained", the rows summing to the total difference."""

from __future__ import annotations

import pytest
import torch

from flopscope.errors import ConfigurationError
from flopscope.predict.serving_tools import CAUSES, TOOLS, explain
from flopscope.predict.serving_tools._dims import read
from flopscope.workloads import profile_generation

from closed_forms import rotary

transformers = pytest.importorskip("transformers")

P, C = 2048, 2048  # prompt and cache lengths

# published config.json values (the keys the tools read)
LLAMA3_8B = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
             "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": False, "model_type": "llama"}
MIXTRAL_8X7B = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
                "num_key_value_heads": 8, "vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2,
                "sliding_window": None, "tie_word_embeddings": False, "model_type": "mixtral"}
DEEPSEEK_V3 = {"hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
               "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128, "vocab_size": 129280,
               "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
               "moe_layer_freq": 1, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
               "qk_rope_head_dim": 64, "v_head_dim": 128, "tie_word_embeddings": False, "model_type": "deepseek_v3"}


def count(tool: str, config: dict) -> tuple[dict[str, int], dict[str, int] | None]:
    found = TOOLS[tool].count(config, prompt=P, context=C)
    return found.prefill, found.decode


def test_vllm_llama_and_mixtral() -> None:
    prefill, decode = count("vllm", LLAMA3_8B)
    assert prefill == {"qkv_proj": 2 * P * 4096 * (32 + 2 * 8) * 128 * 32, "out_proj": 2 * P * 4096 * 32 * 128 * 32,
                       "attn_qk": 2 * 32 * P * P * 128 * 32, "attn_av": 2 * 32 * P * P * 128 * 32,
                       "dense_ffn": 2 * 4096 * 3 * 14336 * P * 32, "unembed": 2 * 4096 * 128256}
    assert decode == {"qkv_proj": 2 * 4096 * 48 * 128 * 32, "out_proj": 2 * 4096 * 32 * 128 * 32,
                      "attn_qk": 2 * 32 * (C + 1) * 128 * 32, "attn_av": 2 * 32 * (C + 1) * 128 * 32,
                      "dense_ffn": 2 * 4096 * 3 * 14336 * 32, "unembed": 2 * 4096 * 128256}
    prefill, decode = count("vllm", MIXTRAL_8X7B)
    assert prefill["routed_ffn"] == 2 * 4096 * 3 * 14336 * P * 2 * 32 and "dense_ffn" not in prefill
    assert decode is not None and decode["routed_ffn"] == 2 * 4096 * 3 * 14336 * 2 * 32
    assert prefill["unembed"] == 2 * 4096 * 32000 and "router" not in prefill


def test_vllm_deepseek_v3_mla_and_moe() -> None:
    prefill, decode = count("vllm", DEEPSEEK_V3)
    assert prefill == {"q_a_proj": 2 * P * 7168 * 1536 * 61, "q_b_proj": 2 * P * 1536 * 128 * 192 * 61,
                       "kv_a_proj": 2 * P * 7168 * (512 + 64) * 61, "kv_b_proj": 2 * P * 512 * 128 * (128 + 128) * 61,
                       "attn_qk": 2 * 128 * P * P * 192 * 61, "attn_av": 2 * 128 * P * P * 128 * 61,
                       "out_proj": 2 * P * 128 * 128 * 7168 * 61, "dense_ffn": 2 * 7168 * 3 * 18432 * P * 3,
                       "routed_ffn": 2 * 7168 * 3 * 2048 * P * 8 * 58, "shared_ffn": 2 * 7168 * 3 * 2048 * 1 * P * 58,
                       "unembed": 2 * 7168 * 129280}
    assert decode is not None
    assert decode["kv_b_proj"] == 2 * 512 * 128 * 256 * 61  # per new token: the cache's expansion is not charged
    assert decode["attn_qk"] == 2 * 128 * (C + 1) * 192 * 61


def test_llm_viewer_llama_and_mixtral() -> None:
    for config, vocab in ((LLAMA3_8B, 128256), (MIXTRAL_8X7B, 32000)):
        prefill, decode = count("llm-viewer", config)
        assert prefill == {
            "q_proj": 2 * P * 4096 * 4096 * 32, "k_proj": 2 * P * 4096 * 1024 * 32, "v_proj": 2 * P * 4096 * 1024 * 32,
            "out_proj": 2 * P * 4096 * 4096 * 32, "gate_proj": 2 * P * 4096 * 14336 * 32,
            "up_proj": 2 * P * 4096 * 14336 * 32, "down_proj": 2 * P * 14336 * 4096 * 32,
            "qk_matmul": 2 * P * P * 128 * 32 * 32, "sv_matmul": 2 * P * P * 128 * 32 * 32,
            "softmax": 5 * 32 * P * P * 32, "attn_norm": 7 * 4096 * P * 32, "mlp_norm": 7 * 4096 * P * 32,
            "attn_add": 4096 * P * 32, "mlp_add": 4096 * P * 32, "mlp_act": 2 * 4096 * P * 32,
            "lm_head": 4096 * vocab}  # MACs, once, not per layer
        assert decode is not None
        assert decode["qk_matmul"] == 2 * C * 128 * 32 * 32 and decode["q_proj"] == 2 * 4096 * 4096 * 32
        assert decode["softmax"] == 5 * 32 * C * 32 and decode["lm_head"] == 4096 * vocab


def test_llm_viewer_refuses_mla() -> None:
    with pytest.raises(ConfigurationError, match="latent attention"):
        count("llm-viewer", DEEPSEEK_V3)


def test_llm_analysis_llama_and_mixtral() -> None:
    for config, vocab in ((LLAMA3_8B, 128256), (MIXTRAL_8X7B, 32000)):
        prefill, decode = count("llm-analysis", config)
        assert prefill == {"q_proj+attn_out": 4 * P * 4096 ** 2 * 32, "k_proj+v_proj": 4 * P * 4096 ** 2 // 4 * 32,
                           "compute_attn": 4 * P * P * 4096 * 32, "mlp": 6 * P * 4096 ** 2 * 32 * 14336 // 4096,
                           "logit": 2 * P * 4096 * vocab}
        assert decode == {"q_proj+attn_out": 4 * 4096 ** 2 * 32, "k_proj+v_proj": 4 * 4096 ** 2 // 4 * 32,
                          "compute_attn": 4 * 1 * 4096 * 32, "mlp": 6 * 4096 * 14336 * 32, "logit": 2 * 4096 * vocab}


def test_llm_analysis_refuses_a_ratio_its_loader_cannot_read() -> None:
    with pytest.raises(ConfigurationError, match=r"3\.5"):
        count("llm-analysis", DEEPSEEK_V3)


# the published parameter counts (Hugging Face classes), written out
LLAMA_N = 2 * 128256 * 4096 + 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096) + 4096
MIXTRAL_N = (2 * 32000 * 4096 + 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 8 * 3 * 4096 * 14336 + 8 * 4096
                                      + 2 * 4096) + 4096)
MLA = 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168 + 2 * 7168 + 512 + 1536
DEEPSEEK_N = 2 * 129280 * 7168 + 61 * MLA + 3 * 3 * 7168 * 18432 + 58 * (257 * 3 * 7168 * 2048 + 256 * 7168) + 7168


def test_nanogpt_forward_of_a_prompt() -> None:
    assert LLAMA_N == 8_030_261_248  # Llama-3-8B's published parameter count
    assert MIXTRAL_N == 46_702_792_704  # Mixtral-8x7B's
    for config, n, heads, q, layers in ((LLAMA3_8B, LLAMA_N, 32, 128, 32), (MIXTRAL_8X7B, MIXTRAL_N, 32, 128, 32),
                                        (DEEPSEEK_V3, DEEPSEEK_N, 128, 7168 // 128, 61)):
        assert read(config).parameters == n
        prefill, decode = count("nanogpt", config)
        assert prefill == {"params": 2 * n * P, "attention": 4 * layers * heads * q * P * P}
        assert (6 * n + 12 * layers * heads * q * P) * P == 3 * sum(prefill.values())  # its 6N + 12LHQT, per token
        assert decode is None


def test_torchtitan_forward_of_a_prompt() -> None:
    """6·N_active + 6·L·H·head_dims·seq per token, the forward one third of it: N_active without the embedding
    table, the routed experts at top_k / num_experts; head_dims 2·(dim // heads), 2·head_dim, or nope + rope + v."""
    llama = LLAMA_N - 128256 * 4096
    mixtral = MIXTRAL_N - 32000 * 4096 - 32 * 3 * 4096 * 14336 * (8 - 2)
    deepseek = DEEPSEEK_N - 129280 * 7168 - 58 * 3 * 7168 * 2048 * (256 - 8)
    for config, active, layers, heads, head_dims in ((LLAMA3_8B, llama, 32, 32, 2 * (4096 // 32)),
                                                     (MIXTRAL_8X7B, mixtral, 32, 32, 2 * 128),
                                                     (DEEPSEEK_V3, deepseek, 61, 128, 128 + 64 + 128)):
        prefill, decode = count("torchtitan", config)
        assert prefill == {"params": 2 * active * P, "attention": 2 * layers * heads * head_dims * P * P}
        assert (6 * active + 6 * layers * heads * head_dims * P) * P == 3 * sum(prefill.values())
        assert decode is None


def test_megatron_forward_of_a_prompt() -> None:
    """num_floating_point_operations / 3: the core attention causal-halved, logits over the padded vocabulary at
    every position, no router."""
    prefill, decode = count("megatron", LLAMA3_8B)
    assert prefill == {"qkv_proj": 2 * P * 4096 * (4096 + 2 * 1024) * 32, "out_proj": 2 * P * 4096 * 4096 * 32,
                       "core_attention": 2 * P * P * (4096 // 2) * 2 * 32, "dense_mlp": 2 * P * 4096 * 14336 * 3 * 32,
                       "logits": 2 * P * 4096 * 128256}  # 128256 = 1002 x 128: no padding
    assert decode is None
    prefill, _ = count("megatron", MIXTRAL_8X7B)
    assert prefill["routed_experts"] == 2 * P * 4096 * 14336 * 2 * 3 * 32 and "dense_mlp" not in prefill
    assert prefill["logits"] == 2 * P * 4096 * 32000 and "router" not in prefill
    prefill, _ = count("megatron", DEEPSEEK_V3)
    assert prefill == {"q_proj": 2 * P * 1536 * (7168 + 128 * (128 + 64) + 1) * 61,
                       "kv_proj": 2 * P * (512 * (7168 + 128 * (128 + 128) + 1) + 7168 * 64) * 61,
                       "out_proj": 2 * P * 128 * 128 * 7168 * 61,
                       "core_attention": 2 * P * P * (128 * (128 + 64) // 2 + 128 * 128 // 2) * 61,
                       "dense_mlp": 2 * P * 7168 * 18432 * 3 * 3, "routed_experts": 2 * P * 7168 * 2048 * 8 * 3 * 58,
                       "shared_experts": 2 * P * 7168 * 1 * 2048 * 3 * 58, "logits": 2 * P * 7168 * 129280}


def test_eleuther_infer_mode() -> None:
    """calc_flops with --infer: hidden_size-wide dense attention, the MLP at the default expansion 4 (14336 / 4096
    is no integer), ffn *= topk / expert_interval, embedding 4·h + 2·h·V per token."""
    for config, vocab, experts, top_k in ((LLAMA3_8B, 128256, 0, 1), (MIXTRAL_8X7B, 32000, 8, 2)):
        prefill, decode = count("eleuther", config)
        expected = {"qkv": 2 * (4 + 2 * 1) * 32 * P * 4096 * 4096 // 4,  # 1 + 2 x kv_size_ratio 0.25
                    "attention_matrix": 2 * 32 * P * P * 4096, "attention_over_values": 2 * 32 * P * P * 4096,
                    "linear_projection": 2 * 32 * P * 4096 * 4096, "ffn": 2 * 3 * 4 * 32 * P * 4096 * 4096 * top_k,
                    "embedding": P * (4 * 4096 + 2 * 4096 * vocab)}
        if experts:
            expected["gating"] = 2 * P * experts * 4096 * 32
        assert prefill == expected and decode is None


def test_eleuther_refuses_mla() -> None:
    with pytest.raises(ConfigurationError, match="latent attention"):
        count("eleuther", DEEPSEEK_V3)


# tiny configs of each family, on meta; intermediate 3.5 x hidden where llm-analysis's loader needs it
d, L, h, kv, V = 64, 2, 4, 2, 96
TINY = {
    "llama": (transformers.LlamaForCausalLM, transformers.LlamaConfig, dict(
        hidden_size=d, intermediate_size=224, num_hidden_layers=L, num_attention_heads=h, num_key_value_heads=kv,
        vocab_size=V)),
    "mixtral": (transformers.MixtralForCausalLM, transformers.MixtralConfig, dict(
        hidden_size=d, intermediate_size=224, num_hidden_layers=L, num_attention_heads=h, num_key_value_heads=kv,
        vocab_size=V, num_local_experts=4, num_experts_per_tok=2)),
    "deepseek_v3": (transformers.DeepseekV3ForCausalLM, transformers.DeepseekV3Config, dict(
        hidden_size=d, intermediate_size=112, moe_intermediate_size=32, num_hidden_layers=2, first_k_dense_replace=1,
        num_attention_heads=h, num_key_value_heads=h, vocab_size=V, n_routed_experts=4, n_shared_experts=1,
        num_experts_per_tok=2, n_group=1, topk_group=1, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=12)),
}
EXPECTED = {  # (tool, family, phase) -> the causes named; a missing key: the tool refuses the config
    ("vllm", "llama", "prefill"): set(), ("vllm", "llama", "decode"): set(),
    ("vllm", "mixtral", "prefill"): {"router not counted"}, ("vllm", "mixtral", "decode"): {"router not counted"},
    ("vllm", "deepseek_v3", "prefill"): {"router not counted"},
    ("vllm", "deepseek_v3", "decode"): {"router not counted", "MLA cache re-expanded"},
    ("llm-viewer", "llama", "prefill"): {"elementwise ops counted", "lm_head in MACs"},
    ("llm-viewer", "llama", "decode"): {"elementwise ops counted", "lm_head in MACs", "new position's key omitted"},
    ("llm-viewer", "mixtral", "prefill"): {"elementwise ops counted", "lm_head in MACs",
                                           "experts not multiplied by top-k", "router not counted"},
    ("llm-viewer", "mixtral", "decode"): {"elementwise ops counted", "lm_head in MACs", "new position's key omitted",
                                          "experts not multiplied by top-k", "router not counted"},
    ("llm-analysis", "llama", "prefill"): {"logits at every prefill position"},
    ("llm-analysis", "llama", "decode"): {"cache omitted"},
    ("llm-analysis", "mixtral", "prefill"): {"logits at every prefill position", "experts not multiplied by top-k",
                                             "router not counted"},
    ("llm-analysis", "mixtral", "decode"): {"cache omitted", "experts not multiplied by top-k", "router not counted"},
    ("nanogpt", "llama", "prefill"): {"embedding counted as a matmul", "norm weights counted as a matmul",
                                      "logits at every prefill position"},
    ("nanogpt", "mixtral", "prefill"): {"embedding counted as a matmul", "norm weights counted as a matmul",
                                        "logits at every prefill position", "experts not multiplied by top-k"},
    ("nanogpt", "deepseek_v3", "prefill"): {"embedding counted as a matmul", "norm weights counted as a matmul",
                                            "logits at every prefill position", "experts not multiplied by top-k",
                                            "head_dim assumed hidden/heads"},
    **{("torchtitan", family, "prefill"): {"norm weights counted as a matmul", "logits at every prefill position"}
       for family in ("llama", "mixtral", "deepseek_v3")},
    ("megatron", "llama", "prefill"): {"causal halving", "logits at every prefill position", "vocabulary padded"},
    ("megatron", "mixtral", "prefill"): {"causal halving", "logits at every prefill position", "vocabulary padded",
                                         "router not counted"},
    ("megatron", "deepseek_v3", "prefill"): {"causal halving", "logits at every prefill position",
                                             "vocabulary padded", "router not counted",
                                             "norm weights counted as a matmul"},
    **{("eleuther", family, "prefill"): {"logits at every prefill position", "embedding lookup charged FLOPs",
                                         "MLP width not the config's"} for family in ("llama", "mixtral")},
}
PROMPT, CONTEXT = 12, 9


@pytest.fixture(scope="module", params=sorted(TINY))
def tiny(request: pytest.FixtureRequest) -> tuple[str, dict, dict[str, dict[str, int]]]:
    model_class, config_class, sizes = TINY[request.param]
    config = config_class(**sizes)
    with torch.device("meta"):
        model = model_class(config)
    # flopscope's side counted step by step (the cost model's requests equal these: tests/test_step_cost.py)
    rotary_dim = sizes.get("qk_rope_head_dim", sizes["hidden_size"] // sizes["num_attention_heads"])
    plain = dict(sizes, moe_layer_freq=1) if request.param == "deepseek_v3" else dict(sizes)
    return request.param, plain, {"prefill": _without_rotary(model, PROMPT, 1, rotary_dim),
                                  "decode": _without_rotary(model, CONTEXT, 2, rotary_dim)}


def _without_rotary(model: torch.nn.Module, prompt: int, step: int, rotary_dim: int) -> dict[str, int]:
    """MACs by role of ``step`` of a generation after a prompt of ``prompt``, less the rotary angles where
    transformers computes them as a matmul (before 5.19: ``closed_forms.rotary``, in ``other``), an op no analytic
    tool models."""
    prof = profile_generation(model, torch.zeros(1, prompt, dtype=torch.long), step)
    by_role = dict(prof.steps()[step - 1].by_role)
    angles = prof.by_module(step=step)["model.rotary_emb"]
    positions = prompt if step == 1 else 1
    assert angles == rotary(positions, rotary_dim).get("other", 0)
    by_role["other"] = by_role.get("other", 0) - angles
    return {role: macs for role, macs in by_role.items() if macs}


def test_the_parameter_count_is_the_models(tiny: tuple[str, dict, dict[str, dict[str, int]]]) -> None:
    family, config, _ = tiny
    model_class, config_class, sizes = TINY[family]
    with torch.device("meta"):
        model = model_class(config_class(**sizes))
    assert read(config).parameters == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_every_difference_is_named(tool: str, tiny: tuple[str, dict, dict[str, dict[str, int]]]) -> None:
    family, config, macs = tiny
    for phase in TOOLS[tool].phases:
        if (tool, family, phase) not in EXPECTED:
            with pytest.raises(ConfigurationError):
                explain(TOOLS[tool], macs[phase], config, phase=phase, prompt=PROMPT, context=CONTEXT)
            continue
        rows = explain(TOOLS[tool], macs[phase], config, phase=phase, prompt=PROMPT, context=CONTEXT)
        found = TOOLS[tool].count(config, prompt=PROMPT, context=CONTEXT)
        tool_total = found.prefill_total if phase == "prefill" else found.decode_total
        assert sum(row.tool_flops for row in rows) == tool_total
        assert sum(row.flopscope_flops for row in rows) == 2 * sum(macs[phase].values())
        assert sum(row.difference for row in rows) == tool_total - 2 * sum(macs[phase].values())
        for row in rows:
            assert sum(v for _, v in row.causes) == row.difference, row
            assert all(name in CAUSES and name != "unexplained" for name, _ in row.causes), row
        assert {name for row in rows for name, _ in row.causes} == EXPECTED[tool, family, phase]


def test_the_causes_amounts_are_their_closed_forms(tiny: tuple[str, dict, dict[str, dict[str, int]]]) -> None:
    """llm-analysis's omitted cache: 4·h_model·c·L FLOPs (QKᵀ and AV over c keys); its prefill logits: 2·(P−1)·d·V;
    LLM-Viewer's lm_head: d·V FLOPs short; vLLM's router: 2·T·d·experts per MoE layer."""
    family, config, macs = tiny
    if family == "deepseek_v3":
        return
    by = {row.term: dict(row.causes) for row in explain(TOOLS["llm-analysis"], macs["decode"], config,
                                                        phase="decode", prompt=PROMPT, context=CONTEXT)}
    assert by["compute_attn"] == {"cache omitted": -4 * d * CONTEXT * L}
    by = {row.term: dict(row.causes) for row in explain(TOOLS["llm-analysis"], macs["prefill"], config,
                                                        phase="prefill", prompt=PROMPT, context=CONTEXT)}
    assert by["logit"] == {"logits at every prefill position": 2 * (PROMPT - 1) * d * V}
    by = {row.term: dict(row.causes) for row in explain(TOOLS["llm-viewer"], macs["decode"], config,
                                                        phase="decode", prompt=PROMPT, context=CONTEXT)}
    assert by["lm_head"] == {"lm_head in MACs": -d * V}
    if family == "mixtral":
        by = {row.term: dict(row.causes) for row in explain(TOOLS["vllm"], macs["prefill"], config,
                                                            phase="prefill", prompt=PROMPT, context=CONTEXT)}
        assert by["router"] == {"router not counted": -2 * PROMPT * d * 4 * L}


def test_the_training_tools_causes_are_their_closed_forms(tiny: tuple[str, dict, dict[str, dict[str, int]]]) -> None:
    """torchtitan's norm weights: 2·P·(2·d·L + d) (no MLA); Megatron's causal halving: the core's 4·P²·d·L halved,
    its padded vocabulary: 2·d·(128 - V) at the one position; the EleutherAI calculator's embedding: 4·d·P, its
    MLP width: 4·d instead of 224 in 3 matrices (times top-k)."""
    family, config, macs = tiny
    if family == "deepseek_v3":
        return

    def causes(tool: str) -> dict[str, dict[str, int]]:
        return {row.term: dict(row.causes) for row in explain(TOOLS[tool], macs["prefill"], config, phase="prefill",
                                                              prompt=PROMPT, context=CONTEXT)}

    assert causes("torchtitan")["params"] == {"norm weights counted as a matmul": 2 * PROMPT * (2 * d * L + d),
                                              "logits at every prefill position": 2 * (PROMPT - 1) * d * V}
    megatron = causes("megatron")
    assert megatron["core_attention"] == {"causal halving": -2 * PROMPT * PROMPT * d * L}
    assert megatron["logits"] == {"logits at every prefill position": 2 * (PROMPT - 1) * d * 128,
                                  "vocabulary padded": 2 * d * (128 - V)}
    eleuther = causes("eleuther")
    top_k = 2 if family == "mixtral" else 1
    assert eleuther["embedding"] == {"logits at every prefill position": 2 * (PROMPT - 1) * d * V,
                                     "embedding lookup charged FLOPs": 4 * d * PROMPT}
    assert eleuther["ffn"] == {"MLP width not the config's": 2 * 3 * L * PROMPT * d * (4 * d - 224) * top_k}
