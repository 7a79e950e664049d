"""Models from their own config.json (no weights, no network): built on meta, counted on fake tensors; timm and
torchvision models by name, at the input size of their weights."""

from __future__ import annotations

import importlib
import json
import sys
import time
import warnings

import pytest
import torch

import flopscope
from flopscope.cli import main
from flopscope.cli.targets import load_target, make_inputs

from closed_forms import add, attention, conv_out, ffn, rotary, times

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


def decoder(layers: int, d: int, h: int, n_kv: int, d_ff: int, vocab: int, experts_per_token: int = 1,
            rope_rows: int = 1) -> dict:
    """A decoder-only forward of N tokens: attention and a gated FFN per layer (each token through
    ``experts_per_token`` experts), then the LM head; and transformers < 5.19's rotary matmul (``rope_rows``: the
    rows of its position ids, 3 for multimodal rope)."""
    layer = add(attention(1, N, N, d, h, n_kv), times(experts_per_token, ffn(1, N, d, d_ff, gated=True)))
    return add(times(layers, layer), {"logits": N * d * vocab}, rotary(N, d // h, rope_rows))


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
    # two of its 32 layers: finding the experts' roles costs about half a second a layer at this width (columns.py)
    model = load_target(write(tmp_path, MIXTRAL_8X7B), ["num_hidden_layers=2"]).model
    prof = flopscope.profile(model, torch.zeros(1, N, dtype=torch.long), mode="fake")
    expected = decoder(2, 4096, 32, 8, 14336, 32000, experts_per_token=2)
    expected["other"] = expected.get("other", 0) + 2 * N * 4096 * 8  # the router: one score per expert
    assert {role: macs for role, macs in prof.by_role().items() if macs} == expected


def test_a_multimodal_config_counts_its_text_decoder_on_token_ids(tmp_path) -> None:
    target = load_target(write(tmp_path, QWEN2_VL_2B))
    assert type(target.model).__name__ == "Qwen2VLForConditionalGeneration"
    prof = flopscope.profile(target.model, torch.zeros(1, N, dtype=torch.long), mode="fake")
    expected = decoder(28, 1536, 12, 2, 8960, 151936, rope_rows=3)  # (multimodal rope: 3 rows of positions)
    assert {role: macs for role, macs in prof.by_role().items() if macs} == expected


def test_the_cli_takes_a_config_path_and_settings(tmp_path, capsys) -> None:
    path = write(tmp_path, LLAMA_3_1_8B)
    assert main(["profile", path, "--set", "num_hidden_layers=2", "--input", f"1x{N}", "--json",
                 str(tmp_path / "r.json")]) == 0
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["totals"]["macs"] == sum(decoder(2, 4096, 32, 8, 14336, 128256).values())
    with pytest.raises(flopscope.FlopscopeError, match=r"has no 'num_layer'.*num_hidden_layers"):
        load_target(path, ["num_layer=2"])


TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 4,
              "vocab_size": 256, "max_position_embeddings": 2 * N}


def cache_config(cache, repo: str, config: dict) -> None:
    """A config.json in a Hugging Face hub cache, laid out as huggingface_hub writes it (refs/main -> snapshot)."""
    folder, commit = cache / f"models--{repo.replace('/', '--')}", "0" * 40
    (folder / "snapshots" / commit).mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(commit)
    (folder / "snapshots" / commit / "config.json").write_text(json.dumps(config))


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))  # read by hf_hub_download at each call
    return tmp_path


@pytest.fixture
def unreachable_hub(monkeypatch):
    """Online (tests/conftest.py sets HF_HUB_OFFLINE), with the hub at a local port where nothing listens."""
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # read by huggingface_hub at its import
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: refused at once


def timed_error(spec: str) -> tuple[str, float]:
    start = time.perf_counter()
    with pytest.raises(flopscope.FlopscopeError) as error:
        load_target(spec)
    return str(error.value), time.perf_counter() - start


def test_a_hub_model_offline_says_what_to_do(monkeypatch, hub_cache) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # after huggingface_hub read its constants: still respected
    message, seconds = timed_error("hf:acme/no-such-model")
    assert message.startswith("cannot fetch the config.json of 'acme/no-such-model': HF_HUB_OFFLINE is set, and "
                              "the Hugging Face cache has no copy")
    assert "pass its path" in message
    assert seconds < 10  # the hub client's retries take about 25 s; no request is made at all here
    assert load_target("hf:llama/causal-lm", ["num_hidden_layers=1", "hidden_size=64", "intermediate_size=64",
                                              "num_attention_heads=4", "num_key_value_heads=4"]).description \
        == "hf:llama/causal-lm"  # FAMILY/HEAD is still a family


def test_an_unreachable_hub_fails_at_once(unreachable_hub, hub_cache) -> None:
    message, seconds = timed_error("hf:acme/no-such-model")
    assert message.startswith("cannot fetch the config.json of 'acme/no-such-model': the Hugging Face hub at "
                              "http://127.0.0.1:9 cannot be reached (")
    assert "the Hugging Face cache has no copy" in message and "pass its path" in message and "HF_ENDPOINT" in message
    assert seconds < 10  # one probe, no retries (the hub client alone retries five times, about 25 s)


@pytest.mark.parametrize("offline", [True, False])
def test_a_cached_hub_config_is_used_offline(request, monkeypatch, hub_cache, offline) -> None:
    cache_config(hub_cache, "acme/tiny-llama", TINY_LLAMA)
    if offline:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:  # online, but the hub does not answer: the cached copy, with a warning naming the endpoint
        request.getfixturevalue("unreachable_hub")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        target = load_target("hf:acme/tiny-llama")
    unreachable = [str(w.message) for w in caught if "cannot be reached" in str(w.message)]
    assert len(unreachable) == (0 if offline else 1)
    if not offline:
        assert unreachable[0].startswith("the Hugging Face hub at http://127.0.0.1:9 cannot be reached (")
        assert unreachable[0].endswith("): using the cached copy of the config.json of 'acme/tiny-llama'")
    prof = flopscope.profile(target.model, torch.zeros(1, N, dtype=torch.long), mode="fake")
    assert {role: macs for role, macs in prof.by_role().items() if macs} == decoder(1, 64, 4, 4, 128, 256)


def test_a_config_without_model_type_says_which_to_add(tmp_path) -> None:
    config = {key: value for key, value in LLAMA_3_1_8B.items() if key != "model_type"}
    with pytest.raises(flopscope.FlopscopeError, match=r"config.json has no \"model_type\".*LlamaForCausalLM is "
                                                      r"'llama'.*add \"model_type\": \"llama\""):
        load_target(write(tmp_path, config))
    del config["architectures"]
    with pytest.raises(flopscope.FlopscopeError, match=r"has no \"model_type\".*model card"):
        load_target(write(tmp_path, config))
    (tmp_path / "config.json").write_text('{"model_type": "llama",')  # cut short
    with pytest.raises(flopscope.FlopscopeError, match=r"config.json is not a JSON config file"):
        load_target(str(tmp_path))


# timm and torchvision (the vision extra). A torchvision wheel built for another torch (the CUDA one beside a CPU
# torch) fails to import with a RuntimeError, not an ImportError: skip on any failure, saying which.
def vision(name: str):
    try:
        return importlib.import_module(name)
    except Exception as e:
        pytest.skip(f"{name} does not import here ({type(e).__name__}: {e})")


def resnet18_convolutions(size: int) -> int:
    """ResNet-18's convolution MACs on one size x size image (He et al. 2016, Table 1): a 7x7 stem of stride 2 and a
    3x3 max pool of stride 2, then four stages of two basic blocks (two 3x3 convolutions each) at widths 64, 128,
    256, 512, each stage after the first halving the side in its first convolution and adding a 1x1 projection."""
    side = conv_out(size, 7, stride=2, pad=3)
    macs = side * side * 64 * 3 * 7 * 7
    side = conv_out(side, 3, stride=2, pad=1)
    c_in = 64
    for stage, c in enumerate((64, 128, 256, 512)):
        if stage:
            side = conv_out(side, 3, stride=2, pad=1)
        projection = c_in if c != c_in else 0
        macs += side * side * c * (c_in * 9 + 3 * c * 9 + projection)
        c_in = c
    return macs


def test_timm_resnet18_with_its_own_input_size(capsys) -> None:
    vision("timm")
    from torch.utils.flop_counter import FlopCounterMode

    target = load_target("timm:resnet18")
    assert target.input_shape == (1, 3, 224, 224)  # its pretrained_cfg["input_size"]
    (x,), _ = make_inputs(target, [])(None)
    assert x.shape == (1, 3, 224, 224)
    prof = flopscope.profile(target.model, x)
    assert resnet18_convolutions(224) == 1_813_561_344  # the 1.8 GMACs usually quoted
    assert prof.by_role()["conv"] == resnet18_convolutions(224)
    assert prof.total() == resnet18_convolutions(224) + 512 * 1000  # and the classifier
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        target.model(x)
    assert prof.total() == counter.get_total_flops() // 2
    assert main(["profile", "timm:resnet18", "--depth", "0"]) == 0  # no --input: its own size
    assert f"{prof.total():,}" in capsys.readouterr().out


def test_a_timm_vit_counts_attention_over_its_197_tokens() -> None:
    vision("timm")
    target = load_target("timm:vit_tiny_patch16_224")
    prof = flopscope.profile(target.model, *make_inputs(target, [])(None)[0])
    depth, heads, n, d = 12, 3, 14 * 14 + 1, 192  # 196 patches and the class token
    roles = prof.by_role()
    assert roles["attn_scores"] == roles["attn_weighted_sum"] == depth * heads * n * n * (d // heads)
    assert roles["q_proj"] == depth * n * d * d and roles["ffn_up"] == depth * n * d * 4 * d
    assert roles["conv"] == 14 * 14 * d * 3 * 16 * 16  # the patch embedding


def test_torchvision_models_get_their_weights_input_size() -> None:
    vision("torchvision")
    target = load_target("torchvision.models:resnet18")
    assert target.input_shape == (1, 3, 224, 224)
    prof = flopscope.profile(target.model, *make_inputs(target, [])(None)[0])
    assert prof.total() == resnet18_convolutions(224) + 512 * 1000  # the same network as timm's
    assert load_target("torchvision.models:inception_v3", ["init_weights=False"]).input_shape == (1, 3, 299, 299)
    assert load_target("torchvision.models:resnet18", ["num_classes=10"]).input_shape == (1, 3, 224, 224)


def test_an_unknown_timm_name_offers_the_closest() -> None:
    vision("timm")
    with pytest.raises(flopscope.FlopscopeError, match=r"unknown timm model 'resnet181'; closest: resnet18, .*"
                                                      r"timm.list_models"):
        load_target("timm:resnet181")


def test_vision_targets_explain_a_missing_or_broken_package(monkeypatch, tmp_path) -> None:
    """The real packages are tested above when the vision extra imports; here only what a user without it sees."""
    monkeypatch.setitem(sys.modules, "timm", None)  # not installed
    with pytest.raises(flopscope.FlopscopeError, match=r"pip install 'torch-flopscope\[vision\]'"):
        load_target("timm:resnet50")
    (tmp_path / "brokenvision").mkdir()  # a package built for another torch
    (tmp_path / "brokenvision" / "__init__.py").write_text(
        "raise RuntimeError('operator torchvision::nms does not exist')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(flopscope.FlopscopeError, match=r"cannot load 'brokenvision:resnet18': importing brokenvision "
                                                      r"failed with torch .*RuntimeError: operator torchvision::nms"):
        load_target("brokenvision:resnet18")
