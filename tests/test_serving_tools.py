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
from flopscope.workloads import cost_model

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


def test_nanogpt_forward_of_a_prompt() -> None:
    llama_n = 2 * 128256 * 4096 + 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096) + 4096
    assert llama_n == 8_030_261_248  # Llama-3-8B's published parameter count
    mixtral_n = (2 * 32000 * 4096 + 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 8 * 3 * 4096 * 14336 + 8 * 4096
                                          + 2 * 4096) + 4096)
    assert mixtral_n == 46_702_792_704  # Mixtral-8x7B's
    mla = 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168 + 2 * 7168 + 512 + 1536
    deepseek_n = (2 * 129280 * 7168 + 61 * mla + 3 * 3 * 7168 * 18432
                  + 58 * (257 * 3 * 7168 * 2048 + 256 * 7168) + 7168)
    for config, n, heads, q, layers in ((LLAMA3_8B, llama_n, 32, 128, 32), (MIXTRAL_8X7B, mixtral_n, 32, 128, 32),
                                        (DEEPSEEK_V3, deepseek_n, 128, 7168 // 128, 61)):
        assert read(config).parameters == n
        prefill, decode = count("nanogpt", config)
        assert prefill == {"params": 2 * n * P, "attention": 4 * layers * heads * q * P * P}
        assert (6 * n + 12 * layers * heads * q * P) * P == 3 * sum(prefill.values())  # its 6N + 12LHQT, per token
        assert decode is None


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
}
PROMPT, CONTEXT = 12, 9


@pytest.fixture(scope="module", params=sorted(TINY))
def tiny(request: pytest.FixtureRequest) -> tuple[str, dict, dict[str, dict[str, int]]]:
    model_class, config_class, sizes = TINY[request.param]
    config = config_class(**sizes)
    with torch.device("meta"):
        model = model_class(config)
    cost = cost_model(model, context=8, chunk=4)
    plain = dict(sizes, moe_layer_freq=1) if request.param == "deepseek_v3" else dict(sizes)
    return request.param, plain, {"prefill": cost.request(PROMPT, 0), "decode": cost.request(1, CONTEXT)}


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
