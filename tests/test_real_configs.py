"""Models from their own config.json (no weights, no network): built on meta, counted on fake tensors."""

from __future__ import annotations

import json

import pytest
import torch

import flopscope
from flopscope.cli import main
from flopscope.targets import load_target

from closed_forms import add, attention, ffn, times

transformers = pytest.importorskip("transformers")
N = 128

LLAMA_3_1_8B = {  # the published config.json of Llama-3.1-8B: GQA 32/8 and llama3 rope scaling
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
    "max_position_embeddings": 131072, "rope_theta": 500000.0, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"}}
MIXTRAL_8X7B = {  # Mixtral-8x7B: 8 experts, 2 per token
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
    "num_local_experts": 8, "num_experts_per_tok": 2, "max_position_embeddings": 32768, "torch_dtype": "bfloat16"}
QWEN2_VL_2B = {  # Qwen2-VL-2B: a vision tower beside a GQA text decoder with multimodal rope
    "architectures": ["Qwen2VLForConditionalGeneration"], "model_type": "qwen2_vl", "hidden_size": 1536,
    "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
    "vocab_size": 151936, "torch_dtype": "bfloat16", "tie_word_embeddings": True,
    "vision_config": {"depth": 32, "embed_dim": 1280, "hidden_size": 1536, "num_heads": 16, "in_chans": 3,
                      "spatial_patch_size": 14},
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}


def write(tmp_path, config: dict) -> str:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def decoder(layers: int, d: int, h: int, n_kv: int, d_ff: int, vocab: int, experts_per_token: int = 1) -> dict:
    """A decoder-only forward of N tokens: attention and a gated FFN per layer (each token through
    ``experts_per_token`` experts), then the LM head."""
    layer = add(attention(1, N, N, d, h, n_kv), times(experts_per_token, ffn(1, N, d, d_ff, gated=True)))
    return add(times(layers, layer), {"logits": N * d * vocab})


def test_llama_3_1_8b_from_its_config(tmp_path) -> None:
    target = load_target(write(tmp_path, LLAMA_3_1_8B))
    model = target.model
    assert next(model.parameters()).is_meta and next(model.parameters()).dtype == torch.bfloat16
    d, kv_width, d_ff, vocab, layers = 4096, 1024, 14336, 128256, 32
    per_layer = 2 * d * d + 2 * d * kv_width + 3 * d * d_ff + 2 * d  # projections, gated FFN, two RMSNorms
    assert sum(p.numel() for p in model.parameters()) == 2 * vocab * d + layers * per_layer + d  # 8,030,261,248
    prof = flopscope.profile(model, torch.zeros(1, N, dtype=torch.long), mode="fake")
    assert {role: macs for role, macs in prof.by_role().items() if macs} == decoder(32, d, 32, 8, d_ff, vocab)


def test_mixtral_from_its_config_counts_the_two_experts_each_token_takes(tmp_path) -> None:
    # two of its 32 layers: finding the experts' roles costs about 1.5 s a layer at this width (columns.py)
    model = load_target(write(tmp_path, MIXTRAL_8X7B), ["num_hidden_layers=2"]).model
    prof = flopscope.profile(model, torch.zeros(1, N, dtype=torch.long), mode="fake")
    expected = decoder(2, 4096, 32, 8, 14336, 32000, experts_per_token=2)
    expected["other"] = 2 * N * 4096 * 8  # the router: one score per expert
    assert {role: macs for role, macs in prof.by_role().items() if macs} == expected


def test_a_multimodal_config_counts_its_text_decoder_on_token_ids(tmp_path) -> None:
    target = load_target(write(tmp_path, QWEN2_VL_2B))
    assert type(target.model).__name__ == "Qwen2VLForConditionalGeneration"
    prof = flopscope.profile(target.model, torch.zeros(1, N, dtype=torch.long), mode="fake")
    assert {role: macs for role, macs in prof.by_role().items() if macs} == decoder(28, 1536, 12, 2, 8960, 151936)


def test_the_cli_takes_a_config_path_and_settings(tmp_path, capsys) -> None:
    path = write(tmp_path, LLAMA_3_1_8B)
    assert main(["profile", path, "--set", "num_hidden_layers=2", "--input", f"1x{N}", "--json",
                 str(tmp_path / "r.json")]) == 0
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["totals"]["macs"] == sum(decoder(2, 4096, 32, 8, 14336, 128256).values())
    with pytest.raises(flopscope.FlopscopeError, match=r"has no 'num_layer'.*num_hidden_layers"):
        load_target(path, ["num_layer=2"])


def test_a_hub_model_offline_says_what_to_do(monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(flopscope.FlopscopeError, match=r"cannot fetch the config.json of 'acme/no-such-model'.*"
                                                      r"pass its path"):
        load_target("hf:acme/no-such-model")
    assert load_target("hf:llama/causal-lm", ["num_hidden_layers=1", "hidden_size=64", "intermediate_size=64",
                                              "num_attention_heads=4", "num_key_value_heads=4"]).description \
        == "hf:llama/causal-lm"  # FAMILY/HEAD is still a family
