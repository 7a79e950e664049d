"""The command line: the README's demo, profile / compare with every output, and errors with exit codes."""

from __future__ import annotations

import csv
import doctest
import io
import json

import numpy as np
import pytest

import flopscope
from flopscope.cli import main
from flopscope.render.text import JSON_SCHEMA

from closed_forms import rnn, rotary
from zoo import CPU_FUSED_GQA, hf_plan_shards_the_embedding


def line_starting(out: str, prefix: str) -> str:
    return next(line for line in out.splitlines() if line.startswith(prefix))


def test_demo_matches_its_closed_form(capsys):
    n, d, h, d_ff = 64, 32, 4, 128
    assert main(["demo", "--n", str(n), "--d", str(d), "--h", str(h), "--d-ff", str(d_ff)]) == 0
    out = capsys.readouterr().out
    assert f"{n * (4 * d * d + 2 * d * d_ff) + 2 * n * n * d:,} MACs: matches" in out
    assert "reconciliation: 8 of 8 rows exactly as predicted" in out
    assert "Table 1" in out and "unsupported ops: none" in out
    k = 5
    table_1 = {  # Vaswani et al. 2017, Table 1, as MACs of one sequence
        "self-attention core (4 heads)": 2 * n * n * d,
        "convolution (k=5)": n * k * d * d,
        "recurrent (nn.RNN)": rnn(1, n, 1, d, d),
        "fully connected (n·d → n·d)": (n * d) ** 2,
        "Transformer block (d_ff=128)": n * (4 * d * d + 2 * d * d_ff) + 2 * n * n * d,
    }
    for layer, macs in table_1.items():
        columns = line_starting(out, layer)[len(layer):].split()
        # predicted and measured; the fully-connected layer's weights, (n·d)², are its MACs too
        assert columns.count(f"{macs:,}") == 2 + (layer.startswith("fully connected")) and "yes" in columns, layer
    fully_connected = line_starting(out, "fully connected (n·d → n·d)").split()
    assert fully_connected[-4:-2] == [f"{(n * d) ** 2:,}", f"{(n * d) ** 2 + n * d:,}"]  # weights, + biases
    block = line_starting(out, "Transformer block (d_ff=128)").split()
    weights, biases, norms = 4 * d * d + 2 * d * d_ff, 4 * d + d_ff + d, 2 * 2 * d  # d_ff = 4d here
    assert block[-4:-2] == [f"{weights:,}", f"{weights + biases + norms:,}"]
    assert line_starting(out, "Transformer block n=").startswith(
        f"Transformer block n={n} d={d} h={h} d_ff={d_ff}: {12 * d * d:,} weights, {12 * d * d + 13 * d:,} parameters")
    assert line_starting(out, "self-attention core (2·n²·d) exceeds").endswith(f"from n = {d + 1} (n > d = {d})")


def test_profile_a_factory_with_every_output(tmp_path, capsys):
    d, n = 32, 16
    json_path, csv_path, png = tmp_path / "p.json", tmp_path / "p.csv", tmp_path / "s.png"
    code = main(["profile", "flopscope.studies.models:TransformerBlock", "--set", f"d={d}", "--set", "h=4",
                 "--set", f"d_ff={4 * d}", "--input", f"1x{n}x{d}", "--mode", "real", "--sweep", "8,16,32,64",
                 "--json", str(json_path), "--csv", str(csv_path), "--plot", str(png), "--units", "flops",
                 "--format", "github"])
    assert code == 0
    out = capsys.readouterr().out
    assert "time per role" in out and "| role " in out  # github tables
    assert f"{2 * n * n * d:,}" in out  # --units flops: attention scores as FLOPs
    assert f"{d}·n²" in out  # attention scores: n²·d for one sequence
    doc = json.loads(json_path.read_text())
    assert doc["schema"] == JSON_SCHEMA
    assert doc["totals"]["macs"] == n * (4 * d * d + 2 * d * 4 * d) + 2 * n * n * d
    assert doc["totals"]["flops"] == 2 * doc["totals"]["macs"]
    assert doc["roles"]["attn_scores"] == n * n * d
    assert {m["path"] for m in doc["modules"]} >= {"", "attention", "attention.q_proj", "ffn.up"}
    assert all(r["ratio"] == "1" for r in doc["reconciliation"])
    rows = list(csv.DictReader(io.StringIO(csv_path.read_text())))
    assert sum(int(r["macs"]) for r in rows) == doc["totals"]["macs"]
    pixels = pytest.importorskip("matplotlib.image").imread(png)
    assert pixels.shape[:2] == (int(5.5 * 120), 8 * 120)  # the scaling plot: 8 x 5.5 inches at 120 dpi
    assert len(np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)) > 1  # not blank


def test_profile_a_hugging_face_family_with_backward(capsys):
    pytest.importorskip("transformers")
    assert main(["profile", "hf:gpt2", "--set", "n_layer=1", "--set", "n_embd=64", "--set", "n_head=4",
                 "--set", "vocab_size=100", "--input", "1x16", "--backward", "--mode", "fake"]) == 0
    out = capsys.readouterr().out
    L, d, h, V, n = 1, 64, 4, 100, 16
    per_token = L * (12 * d * d + 2 * n * d)  # 4d² projections, 8d² FFN, dense core; GPT2Model has no LM head
    core = L * h * n * n * (d // h)  # the scores, or the weighted sum, of one sequence
    forward = n * per_token
    backward = 2 * (forward - 2 * core) + 3 * core + 2 * core  # GEMMs twice; fused attention: 3 for QKᵀ, 2 for AV
    assert f"by phase: forward {forward:,} MACs, backward {backward:,} MACs" in out
    narayanan = L * (24 * d * d + 4 * n * d) // 2 + d * V  # Megatron's FLOPs per token, halved, plus the logits
    row = line_starting(out, "Narayanan")
    assert f"{narayanan:,}" in row.split() and f"{per_token:,}" in row.split()
    assert f"logits (de-embedding) -{d * V:,}" in row  # a GPT2Model has no de-embedding


def test_compare_command(capsys):
    assert main(["compare", "--n", "64", "--d", "32", "--h", "4", "--k", "3", "--r", "8", "--lengths", "16,32,64"]) == 0
    out = capsys.readouterr().out
    assert f"{64**2 * 32**2:,}" in out  # the fully connected layer: n²·d² weights


def test_errors_have_exit_codes_and_say_what_to_do(capsys):
    assert main(["profile", "no_such_module:factory", "--input", "1x4"]) == 3
    assert "cannot load" in capsys.readouterr().err
    assert main(["profile", "flopscope.studies.models:TransformerBlock", "--set", "d=8", "--set", "h=2",
                 "--input", "1x4x9"]) == 3
    err = capsys.readouterr().err
    assert "ForwardError" in err or "raised" in err
    with pytest.raises(SystemExit) as info:
        main(["profile"])
    assert info.value.code == 2


def test_crosscheck_of_a_hugging_face_model_counts_with_every_peer_that_can(capsys):
    """The example ``--help`` prints: fvcore's TorchScript trace cannot return GPT-2's DynamicCache, so it counts the
    call without the cache (use_cache=False: the same MACs), and the table says so and why; exit 0."""
    pytest.importorskip("transformers")
    pytest.importorskip("fvcore")
    L, d, h, n = 1, 32, 4, 16
    assert main(["crosscheck", "hf:gpt2", "--set", f"n_layer={L}", "--set", f"n_embd={d}", "--set", f"n_head={h}",
                 "--set", "vocab_size=100", "--input", f"1x{n}", "--tools", "FlopCounterMode,fvcore"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines()[2:] if line and not line[0].isspace()}
    total = L * (n * 12 * d * d + 2 * n * n * d)  # GPT2Model: 12·d² per token, the dense attention core 2·n²·d
    core = L * 2 * n * n * d  # SDPA's CPU kernel: not in fvcore, in FlopCounterMode where its torch has a formula
    import torch
    from torch.utils.flop_counter import flop_registry

    counted = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu in flop_registry
    layer_norms = 5 * (2 * L + 1) * n * d  # fvcore: 5 "flops" per element of each affine LayerNorm
    assert rows == {"flopscope": f"{total:,}", "FlopCounterMode": f"{total if counted else total - core:,}",
                    "fvcore": f"{total - core + layer_norms:,}"}
    text = " ".join(out.split())
    assert ("counted with use_cache=False: with the model's cache, its TorchScript trace takes tensors, tuples, lists "
            "and dicts only, and the forward gave it a DynamicCache") in text
    assert "unexplained" not in text


def test_version_prints_the_distribution_and_its_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"torch-flopscope {flopscope.__version__}"


def test_help_teaches_by_example(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "flopscope profile hf:gpt2 --set n_layer=2" in capsys.readouterr().out


def test_package_docstring_examples_run():
    assert doctest.testmod(flopscope, raise_on_error=True).attempted > 0


def test_bad_settings_are_caught_with_a_hint(capsys):
    pytest.importorskip("transformers")
    assert main(["profile", "hf:gpt2", "--set", "n_layr=2", "--input", "1x8"]) == 3
    assert "did you mean n_layer" in capsys.readouterr().err
    assert main(["compare", "--d", "63", "--h", "8"]) == 3
    assert "divisible" in capsys.readouterr().err
    assert main(["profile", "torch.nn:Linear", "--input", "2x4"]) == 3
    assert "pass them with --set" in capsys.readouterr().err


TINY_LLAMA = ["--set", "hidden_size=64", "--set", "intermediate_size=128", "--set", "num_hidden_layers=2",
              "--set", "num_attention_heads=4", "--set", "num_key_value_heads=2", "--set", "vocab_size=100"]


@pytest.mark.parametrize("mode", ["auto", "real"])  # auto: greedy decoding on fake tensors; real: HF generate()
def test_generate_prints_steps_the_per_token_polynomial_and_the_roofline(mode, tmp_path, capsys):
    pytest.importorskip("transformers")
    pytest.importorskip("matplotlib")
    prompt, new = 8, 5
    json_path, png = tmp_path / "g.json", tmp_path / "roofline.png"
    code = main(["generate", "hf:llama", *TINY_LLAMA, "--prompt", str(prompt), "--new", str(new), "--peak", "1e11",
                 "--bandwidth", "1e10", "--json", str(json_path), "--plot", str(png), "--mode", mode])
    assert code == 0
    out = capsys.readouterr().out
    fake = mode != "real"
    assert ("counted on fake tensors" in line_starting(out, "hf:llama/causal-lm: ")) is fake
    assert ("built on meta: nothing allocated" in out) is fake
    L, d, h, n_kv, d_ff, V = 2, 64, 4, 2, 128, 100
    d_k = d // h
    decode_rows = [line.split() for line in out.splitlines() if line.split()[1:2] == ["decode"]]
    assert [row[2:5] for row in decode_rows] == [["1", "1", str(prompt + i)] for i in range(1, new)]
    # per generated token and sequence: scores + weighted sum are 2·L·h·d_k MACs per context position,
    # 4·L·h·d_k FLOPs; the rest (projections, FFN, LM head) does not depend on the context
    slope = 4 * L * h * d_k
    angles = sum(rotary(1, d_k).values())  # (transformers before 5.19: the rotary angles of the new position)
    rest = 2 * (L * (d * h * d_k + 2 * d * n_kv * d_k + h * d_k * d + 3 * d * d_ff) + d * V + angles)
    assert f"total: {slope:,}·c + {rest:,} FLOPs per generated token" in out
    assert f"KV-cache term (attention core, scores + weighted sum, reads the cache): {slope:,}·c" in out
    assert "ridge 10.0 FLOPs/byte" in out and "step 2 (decode)" in out
    doc = json.loads(json_path.read_text())
    assert doc["schema"] == "flopscope.generate/1"
    assert [s["phase"] for s in doc["steps"]] == ["prefill"] + ["decode"] * (new - 1)  # one step per forward
    assert doc["polynomials"]["flops_per_token"] == [str(rest), str(slope)]
    assert doc["polynomials"]["macs_by_role"]["attn_scores"] == ["0", str(L * h * d_k)]
    assert doc["polynomials"]["contexts"] == [prompt + i for i in range(1, new)]
    roofline = doc["roofline"]
    assert roofline["ridge"] == 10.0
    assert {row["name"]: row["bound"] for row in roofline["rows"] if row["kind"] == "step"} == \
        {f"step {i} ({'prefill' if i == 1 else 'decode'})": "memory" for i in range(1, new + 1)}
    assert doc["mode"] == ("fake" if fake else "real")
    measured = [row["measured_seconds"] for row in roofline["rows"] if row["kind"] == "step"]
    if fake:  # nothing ran: no time, no MFU
        assert measured == [None] * new and all(s["seconds"] is None for s in doc["steps"])
        assert "roofline on this CPU (counted on fake tensors: nothing ran, no time measured):" in out
    else:
        assert all(seconds > 0 for seconds in measured)
    assert png.stat().st_size > 0


STATIC_CACHE_LLAMA = """
import transformers


def llama():
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=100)
    model = transformers.LlamaForCausalLM(config)
    model.generation_config.cache_implementation = "static"  # greedy_decode builds generate()'s DynamicCache only
    return model
"""


def test_generate_falls_back_to_a_real_generate_where_greedy_decoding_does_not_mimic_it(tmp_path, monkeypatch,
                                                                                         capsys):
    pytest.importorskip("transformers")
    (tmp_path / "static_llama.py").write_text(STATIC_CACHE_LLAMA)
    monkeypatch.syspath_prepend(str(tmp_path))
    prompt, new = 6, 4
    argv = ["generate", "static_llama:llama", "--prompt", str(prompt), "--new", str(new), "--peak", "1e11",
            "--bandwidth", "1e10"]
    assert main([*argv, "--mode", "fake"]) == 3
    assert "asks for a 'static' cache, which greedy_decode does not build" in capsys.readouterr().err
    assert main(argv) == 0  # auto: HF's generate() for real, with its static cache
    captured = capsys.readouterr()
    assert "generation cannot be counted on fake tensors (ConfigurationError: " in captured.err
    assert "running generate() for real instead" in captured.err
    assert "(HF generate(), run for real)" in captured.out
    rows = [line.split() for line in captured.out.splitlines() if line.split()[1:2] in (["prefill"], ["decode"])]
    buffer = prompt + new - 1  # a static cache's kernels attend over the whole buffer at every decode step
    assert [row[1:5] for row in rows] == [["prefill", "1", str(prompt), str(prompt)]] + \
        [["decode", "1", "1", str(buffer)]] * (new - 1)
    assert all(float(row[-1]) > 0 for row in rows)  # measured: it ran


def test_generate_refuses_what_cannot_generate(capsys):
    assert main(["generate", "flopscope.studies.models:TransformerBlock", "--set", "d=8", "--set", "h=2"]) == 3
    err = capsys.readouterr().err
    assert "flopscope.studies.models:TransformerBlock (TransformerBlock) has no generate() method" in err
    for option in ("--new", "--prompt", "--batch"):
        with pytest.raises(SystemExit) as info:
            main(["generate", "hf:llama", option, "0"])
        assert info.value.code == 2
        assert f"argument {option}: must be at least 1; got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["generate", "hf:llama", "--dtype", "int8"])
    assert info.value.code == 2 and "not a floating-point torch dtype" in capsys.readouterr().err


SHARDED_LLAMA = ["--set", "hidden_size=64", "--set", "intermediate_size=128", "--set", "num_hidden_layers=2",
                 "--set", "num_attention_heads=8", "--set", "num_key_value_heads=4", "--set", "vocab_size=160"]


def test_profile_tensor_parallel_on_a_fake_world(capsys):
    pytest.importorskip("transformers")
    dist = pytest.importorskip("torch.distributed")
    t, dp, B, n, L, d, d_ff, V, kv_width = 4, 2, 2, 16, 2, 64, 128, 160, 32  # kv_width: 4 KV heads of 8
    if not hf_plan_shards_the_embedding():
        pytest.skip("this transformers' tensor-parallel plan for Llama leaves the token embedding whole")
    assert main(["profile", "hf:llama/causal-lm", *SHARDED_LLAMA, "--input", f"{B}x{n}", "--tp", str(t), "--dp",
                 str(dp), "--backward"]) == 0
    out = capsys.readouterr().out
    assert not dist.is_initialized()  # the fake world is gone
    assert "rank 0 of a fake world of 8 ranks (mesh dp 2 x tp 4)" in out
    # forward + backward: each projection's GEMM three times (output, input gradient, weight gradient), 1/4 per rank
    for role, macs in (("q_proj", 3 * L * B * n * d * d), ("k_proj", 3 * L * B * n * d * kv_width),
                       ("ffn_down", 3 * L * B * n * d_ff * d), ("logits", 3 * B * n * d * V)):
        assert line_starting(out, role + " ").split() == [role, f"{macs:,}", f"{macs // t:,}", "1/4"]
    activation = B * n * d * 4
    assert line_starting(out, "all_gather    4").split() == ["all_gather", "4", "lm_head", "logits", "forward", "1",
                                                           f"{B * n * V * 4:,}"]
    assert line_starting(out, "all_reduce    4        model.layers.*.mlp.down_proj").split()[-2:] == \
        [str(L), f"{L * activation:,}"]
    comparison = out.split("Megatron-LM's closed form:")[1].split("\n\n")[0]
    assert line_starting(comparison, "all_reduce    forward").split()[1:7] == \
        ["forward", str(2 * L + 1), f"{(2 * L + 1) * activation:,}", str(2 * L + 1), f"{(2 * L + 1) * activation:,}",
         "yes"]
    assert "predicted (FSDP2 does not run on fake tensors)" in out
    layer = 4 * ((2 * d * d + 2 * d * kv_width + 3 * d * d_ff) // t + 2 * d)  # this rank's shard of one layer
    root = 4 * (2 * V * d // t + d)
    assert line_starting(out, "reduce_scatter  2").split()[:5] == ["reduce_scatter", "2", "backward", str(1 + L),
                                                                    f"{root + L * layer:,}"]
    # per layer: its GEMMs three times, the scores four (forward, and QKᵀ's three in backward), the weighted sum three
    # (SDPA's math path, grouped-query SDPA on torch <= 2.8, does not recompute the scores: three)
    gemms, core = B * n * (2 * d * d + 2 * d * kv_width + 3 * d * d_ff), B * n * n * d
    macs = (3 * gemms + (7 if CPU_FUSED_GQA else 6) * core) // t
    # 2 all-reduces forward and 5 backward (one per column-parallel projection); FSDP: gather, re-gather, scatter
    assert line_starting(out, "model.layers.0..1 (each)").split()[2:] == \
        [f"{macs:,}", f"{7 * activation:,}", f"{3 * layer:,}", f"{(7 * activation + 3 * layer) / macs:.4f}"]


def test_profile_tensor_parallel_errors(capsys):
    pytest.importorskip("transformers")
    with pytest.raises(SystemExit) as info:
        main(["profile", "hf:llama", "--tp", "0"])
    assert info.value.code == 2 and "--tp: must be at least 1" in capsys.readouterr().err
    assert main(["profile", "hf:llama/causal-lm", *SHARDED_LLAMA, "--tp", "3"]) == 3
    assert "mesh of size 3 does not divide config num_attention_heads=8" in capsys.readouterr().err
    assert main(["profile", "hf:llama", *SHARDED_LLAMA, "--dp", "2"]) == 2
    assert "--dp needs --tp" in capsys.readouterr().err
    assert main(["profile", "hf:llama", *SHARDED_LLAMA, "--tp", "2", "--mode", "real"]) == 2
    assert "cannot be combined with --mode real" in capsys.readouterr().err


@pytest.mark.parametrize("attention", ["executed", "causal", "mask"])
def test_profile_prices_the_attention_core_by_the_convention_asked_for(attention, tmp_path, capsys):
    pytest.importorskip("transformers")
    n, L, d, h, n_kv, d_ff, V = 16, 2, 64, 4, 2, 128, 100
    d_k = d // h
    option = [] if attention == "executed" else ["--attention", attention]  # executed: the default, unchanged
    json_path = tmp_path / "p.json"
    assert main(["profile", "hf:llama/causal-lm", *TINY_LLAMA, "--input", f"1x{n}", "--depth", "0", *option,
                 "--json", str(json_path)]) == 0
    out = capsys.readouterr().out
    pairs = {"executed": n * n, "causal": n * n // 2, "mask": n * (n + 1) // 2}[attention]  # per head and layer
    core = L * h * d_k * pairs  # MACs of each core role: scores, weighted sum
    rest = n * L * (d * h * d_k + 2 * d * n_kv * d_k + h * d_k * d + 3 * d * d_ff) + n * d * V
    rest += sum(rotary(n, d_k).values())  # (transformers before 5.19)
    executed = rest + 2 * L * h * d_k * n * n
    assert line_starting(out, "attn_scores").split()[1] == f"{core:,}"
    assert line_starting(out, "attn_weighted_sum").split()[1] == f"{core:,}"
    assert line_starting(out, "q_proj").split()[1] == f"{n * L * d * h * d_k:,}"  # projections never change
    total = line_starting(out, "total: ")
    assert total.startswith(f"total: {rest + 2 * core:,} MACs = {2 * (rest + 2 * core):,} FLOPs")
    assert (f"attention core priced '{attention}' (executed: {executed:,} MACs" in total) == (attention != "executed")
    doc = json.loads(json_path.read_text())
    assert doc["totals"]["macs"] == executed  # the totals of the report stay executed work
    assert doc["attention"]["convention"] == attention and doc["attention"]["macs"] == rest + 2 * core


def test_generate_steps_and_per_token_numbers_follow_the_convention(capsys):
    pytest.importorskip("transformers")
    prompt, new, L, d, h, n_kv, d_ff, V = 8, 4, 2, 64, 4, 2, 128, 100
    d_k = d // h
    assert main(["generate", "hf:llama", *TINY_LLAMA, "--prompt", str(prompt), "--new", str(new), "--peak", "1e11",
                 "--bandwidth", "1e10", "--attention", "causal"]) == 0
    out = capsys.readouterr().out
    per_token = L * (d * h * d_k + 2 * d * n_kv * d_k + h * d_k * d + 3 * d * d_ff) + d * V  # MACs, no context
    per_token += sum(rotary(1, d_k).values())  # (transformers before 5.19: the rotary angles of the new position)
    rows = {row[0]: row for row in (line.split() for line in out.splitlines()) if row[1:2] in (["prefill"], ["decode"])}
    # prefill: a causal square of the prompt, charged its half (p²/2 pairs per head, layer and core matmul); the
    # logits of the last position only (generate keeps one)
    kv = 2 * L * h * d_k * prompt * prompt // 2
    angles = sum(rotary(1, d_k).values()), sum(rotary(prompt, d_k).values())
    prefill = prompt * (per_token - d * V - angles[0]) + d * V + kv + angles[1]
    assert rows["1"][5:9:3] == [f"{prefill:,}", f"{kv:,}"]  # MACs, KV MACs
    # decode: one query over c = prompt + i keys sees them all (HF's SDPA calls are not causal there): dense, as
    # executed, so the per-token polynomial is the executed one, in FLOPs 4·L·h·d_k·c + 2·(the rest). SDPA's math
    # path (grouped-query SDPA on torch <= 2.8) has no is_causal=False to read: the model's declared causal mask, whose
    # causal half of 1 x c pairs is c - 1/2, so 4·L·h·d_k·c - 2·L·h·d_k + 2·(the rest)
    for i in range(1, new):
        c = prompt + i
        assert rows[str(i + 1)][8] == f"{2 * L * h * d_k * c if CPU_FUSED_GQA else L * h * d_k * (2 * c - 1):,}"
    assert "attention core priced 'causal'" in out
    rest = 2 * per_token if CPU_FUSED_GQA else 2 * per_token - 2 * L * h * d_k
    assert f"total: {4 * L * h * d_k:,}·c + {rest:,} FLOPs per generated token" in out
