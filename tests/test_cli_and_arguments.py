"""Arguments out of their domain are refused early and by name: the CLI's options (exit 2, before anything
is built or profiled), token sequences longer than a learned position table (exit 3, before the inputs are
built), scaling() lengths below one; and compare()'s windows wider than the sequence, which are exact."""

from __future__ import annotations

import sys

import pytest
import torch

import flopscope
from flopscope import errors
from flopscope.cli import main

BLOCK = ["profile", "flopscope.studies.models:TransformerBlock", "--set", "d=8", "--set", "h=2", "--set", "d_ff=16",
         "--input", "1x4x8"]
GPT2 = ["profile", "hf:gpt2", "--set", "n_layer=1", "--set", "n_embd=32", "--set", "n_head=4",
        "--set", "vocab_size=100", "--set", "n_positions=16", "--mode", "fake"]


def usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run the CLI expecting argparse's bad-usage exit (2) before anything ran; argparse's message."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    captured = capsys.readouterr()
    assert info.value.code == 2, captured.err
    assert captured.out == ""  # nothing built, nothing profiled
    return captured.err.strip().splitlines()[-1]


# --------------------------------------------------------------------------------------------------
# CLI options
def test_a_negative_depth_is_bad_usage_and_zero_shows_the_model_only(capsys):
    assert "argument --depth: must be >= 0" in usage_error([*BLOCK, "--depth", "-3"], capsys)
    assert "argument --depth: not an integer: 'two'" in usage_error([*BLOCK, "--depth", "two"], capsys)
    assert main([*BLOCK, "--depth", "0"]) == 0
    out = capsys.readouterr().out
    assert "(model)" in out and "· attention" not in out  # the root row only


def test_sweep_and_lengths_name_the_option_and_the_bad_item(capsys):
    assert usage_error([*BLOCK, "--sweep", "8,abc"], capsys) == \
        "flopscope profile: error: argument --sweep: 'abc' is not a length (a positive integer) in '8,abc'"
    assert "argument --sweep: length 0 is not positive" in usage_error([*BLOCK, "--sweep", "8,0,16,32"], capsys)
    assert "argument --sweep: give at least 4 distinct lengths" in usage_error([*BLOCK, "--sweep", "8,16,16,32"],
                                                                                capsys)
    assert "argument --lengths: '1e3' is not a length" in usage_error(["compare", "--lengths", "16,1e3"], capsys)


@pytest.mark.parametrize("flag", ["--json", "--csv", "--plot"])
def test_output_paths_are_checked_before_profiling(flag, tmp_path, capsys):
    missing = tmp_path / "no_such_dir" / "out.png"
    assert usage_error([*BLOCK, flag, str(missing)], capsys) == (
        f"flopscope profile: error: argument {flag}: cannot write {missing}: directory {missing.parent} "
        "does not exist")
    assert f"argument {flag}: {tmp_path} is a directory" in usage_error([*BLOCK, flag, str(tmp_path)], capsys)


def test_a_plot_needs_an_image_suffix_and_matplotlib_before_profiling(tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    message = usage_error([*BLOCK, "--plot", str(tmp_path / "shares.txt")], capsys)
    assert "argument --plot" in message and "ending in .png" in message
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    assert main([*BLOCK, "--plot", str(tmp_path / "shares.png")]) == 3
    captured = capsys.readouterr()
    assert captured.out == "" and "--plot needs matplotlib" in captured.err


def test_an_unknown_hugging_face_family_gets_the_closest_few_names(capsys):
    pytest.importorskip("transformers")
    assert main(["profile", "hf:gpt3"]) == 3
    err = capsys.readouterr().err.strip()
    closest = err.split("closest: ", 1)[1].split(". All ", 1)[0].split(", ")
    assert "gpt2" in closest and len(closest) <= 5
    assert "transformers.CONFIG_MAPPING" in err  # how to list all of them
    assert len(err) < 300  # not the several hundred names
    assert main(["profile", "hf:GPT2", "--input", "1x4"]) == 3
    assert "closest: gpt2" in capsys.readouterr().err  # a case slip finds the family


def test_a_slip_in_a_hugging_face_head_is_named_not_sent_to_the_hub(capsys, monkeypatch):
    pytest.importorskip("transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # were it taken for the repository llama/causal_lm: "cannot fetch"
    for written, meant in (("llama/causal_lm", "llama/causal-lm"), ("Llama/CausalLM", "llama/causal-lm"),
                           ("bert/classifcation", "bert/classification")):
        assert main(["profile", f"hf:{written}", "--input", "1x8"]) == 3
        err = capsys.readouterr().err
        assert f"did you mean hf:{meant}?" in err and "cannot fetch" not in err
    assert main(["profile", "hf:acme/causal_lm", "--input", "1x8"]) == 3  # no family acme: a hub repository
    assert "cannot fetch the config.json of 'acme/causal_lm'" in capsys.readouterr().err


def test_a_factory_in_the_current_folder_loads_without_pythonpath(tmp_path, monkeypatch, capsys):
    """As ``python -m`` does: the ``flopscope`` script's sys.path has its own folder first, not the current one."""
    name = f"local_factory_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text("import torch\n\n\ndef build(d: int = 8):\n"
                                         "    return torch.nn.Linear(d, 2 * d)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".") and p != str(tmp_path)])
    try:
        assert main(["profile", f"{name}:build", "--set", "d=4", "--input", "3x4", "--depth", "0"]) == 0
        assert f"total: {3 * 4 * 8:,} MACs" in capsys.readouterr().out
        assert main(["profile", f"{name}:buld", "--input", "3x4"]) == 3
        assert f"(did you mean {name}:build?)" in capsys.readouterr().err
        assert main(["profile", "no_such_local_module:build", "--input", "3x4"]) == 3
        assert f"looked in the installed packages and the current folder, {tmp_path}" in capsys.readouterr().err
    finally:
        sys.modules.pop(name, None)


# --------------------------------------------------------------------------------------------------
# --set
@pytest.mark.parametrize(("text", "value"), [
    ("false", False), ("False", False), ("NO", False), ("off", False), ("true", True), ("Yes", True), ("ON", True),
    ("2", 2), ("-3", -3), ("0.1", 0.1), ("1e-5", 1e-5), ("none", None), ("Null", None), ("None", None),
    ("gelu", "gelu"), ("[1, 2]", [1, 2]), ("'two'", "two")])
def test_set_values_parse_as_a_person_writes_them(text, value):
    from flopscope.cli.settings import parse_setting

    parsed = parse_setting(f"key={text}")
    assert parsed == ("key", value) and type(parsed[1]) is type(value)


def test_set_values_reach_the_config_with_its_types(capsys):
    pytest.importorskip("transformers")
    from flopscope.cli.targets import load_target

    config = load_target("hf:gpt2", ["n_layer=1", "use_cache=false", "scale_attn_weights=No",
                                     "layer_norm_epsilon=1e-5", "resid_pdrop=0"], "meta").model.config
    assert (config.use_cache, config.scale_attn_weights, config.layer_norm_epsilon) == (False, False, 1e-5)
    assert config.resid_pdrop == 0.0 and type(config.resid_pdrop) is float  # an int for a float key: that float
    assert main([*GPT2, "--set", "use_cache=FALSE", "--input", "1x8"]) == 0


def test_a_set_value_of_the_wrong_type_names_key_value_and_type_and_is_bad_usage(capsys):
    pytest.importorskip("transformers")
    assert main(["profile", "hf:llama", "--set", "num_hidden_layers=two", "--input", "1x8"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == ("flopscope profile: error: --set num_hidden_layers=two: num_hidden_layers of "
                                    "hf:llama takes an integer, not 'two' (e.g. --set num_hidden_layers=32, the "
                                    "config's)")
    assert main([*GPT2, "--set", "use_cache=maybe", "--input", "1x8"]) == 2
    assert "use_cache of hf:gpt2 takes a boolean (true or false), not 'maybe'" in capsys.readouterr().err
    assert main([*BLOCK, "--set", "d_ff=1.5"]) == 2  # a factory: its default's type
    assert "d_ff of flopscope.studies.models:TransformerBlock takes an integer, not 1.5 (e.g. --set d_ff=2048, its " \
        "default)" in capsys.readouterr().err
    assert main(["profile", "hf:llama", "--set", "hidden_size=65", "--input", "1x8"]) == 2  # the config's validation
    assert "the config of hf:llama refuses --set hidden_size=65: " in capsys.readouterr().err


def test_a_set_without_equals_is_bad_usage_showing_the_form(capsys):
    assert usage_error([*BLOCK, "--set", "d_ff"], capsys) == (
        "flopscope profile: error: argument --set: takes KEY=VALUE (e.g. --set num_hidden_layers=2); got 'd_ff'")
    assert "argument --set-after: takes KEY=VALUE" in usage_error(["diff", "a.json", "b.json", "--set-after", "=2"],
                                                                  capsys)


# --------------------------------------------------------------------------------------------------
# --input shapes of the form the model takes
def test_a_token_model_given_another_form_than_batch_x_sequence_is_bad_usage(capsys):
    pytest.importorskip("transformers")
    for shape, dims, example in (("1x16x3", 3, "1x16"), ("16", 1, "1x16")):
        assert main([*GPT2, "--input", shape]) == 2  # GPT-2 would flatten 1x16x3 into 3 sequences of 16, unsaid
        captured = capsys.readouterr()
        assert captured.out == ""  # before anything is counted
        assert captured.err.strip() == (f"flopscope profile: error: --input {shape}: hf:gpt2 takes token ids of 2 "
                                        f"dims, BATCHxSEQUENCE (e.g. --input {example}), not {dims}")
    assert main([*GPT2, "--input", "2x16"]) == 0


def test_an_image_model_given_another_form_than_its_weights_input_is_refused():
    from flopscope.cli.targets import Target, make_inputs

    target = Target(torch.nn.Conv2d(3, 8, 3), "a 3-channel model", token_inputs=False, input_shape=(1, 3, 224, 224))
    with pytest.raises(errors.UsageError, match=r"--input 1x3x224: a 3-channel model takes "
                                                r"BATCHxCHANNELSxHEIGHTxWIDTH with 3 channels \(e.g. --input "
                                                r"1x3x224x224, the size its weights were trained at\)"):
        make_inputs(target, [(1, 3, 224)])
    with pytest.raises(errors.UsageError, match=r"--input 2x1x64x64: .* with 3 channels \(e.g. --input 2x3x64x64"):
        make_inputs(target, [(2, 1, 64, 64)])
    assert make_inputs(target, [(2, 3, 64, 64)])(None)[0][0].shape == (2, 3, 64, 64)  # any batch and size


# --------------------------------------------------------------------------------------------------
# token sequences against the learned position table
def test_a_sequence_longer_than_the_position_table_is_refused_before_the_inputs(capsys):
    pytest.importorskip("transformers")
    assert main([*GPT2, "--input", "1x17"]) == 3
    captured = capsys.readouterr()
    assert captured.out == ""  # refused before the inputs are built, so before anything is profiled
    assert captured.err.strip() == (
        "flopscope: error: --input 1x17: a sequence of 17 tokens is longer than hf:gpt2's position table "
        "(16 rows, config n_positions=16): a real forward would fail; give at most 16 tokens or --set "
        "n_positions=17")
    assert main([*GPT2, "--input", "1x8", "--sweep", "4,8,16,32"]) == 3  # a sweep length is checked up front
    captured = capsys.readouterr()
    assert captured.out == "" and "--sweep length: a sequence of 32 tokens" in captured.err
    assert main([*GPT2, "--input", "1x16"]) == 0  # the whole table is usable
    d, n = 32, 16  # GPT2Model, one layer: 12·d² per token (projections 4d², FFN 8d²), 2·n²·d attention core
    assert f"total: {n * 12 * d * d + 2 * n * n * d:,} MACs" in capsys.readouterr().out


def test_only_a_learned_position_table_limits_the_sequence():
    pytest.importorskip("transformers")
    from flopscope.cli.targets import load_target, make_inputs

    def tiny(spec: str, **config: int) -> flopscope.cli.targets.Target:
        return load_target(spec, [f"{k}={v}" for k, v in config.items()])

    gpt2 = tiny("hf:gpt2", n_layer=1, n_embd=32, n_head=4, vocab_size=16, n_positions=16)  # vocab = positions
    with pytest.raises(errors.InputError, match="17 tokens is longer than hf:gpt2's position table"):
        make_inputs(gpt2, [(2, 17)])
    build = make_inputs(gpt2, [(2, 8)])
    with pytest.raises(errors.InputError, match="a sequence of 17 tokens"):
        build(17)
    assert build(16)[0][0].shape == (2, 16)
    # OPT keeps two extra rows (offset 2): the limit is still max_position_embeddings, and a real forward
    # past it fails; Llama's rotary positions have no table, and a real forward past it runs
    opt = tiny("hf:opt", num_hidden_layers=1, hidden_size=32, ffn_dim=64, num_attention_heads=4, vocab_size=100,
               max_position_embeddings=16, word_embed_proj_dim=32)
    llama = tiny("hf:llama", num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=100, max_position_embeddings=16)
    assert (opt.positions, opt.positions_key, llama.positions) == (16, "max_position_embeddings", None)
    with pytest.raises(errors.InputError, match="config max_position_embeddings=16"):
        make_inputs(opt, [(1, 17)])
    with torch.no_grad(), pytest.raises(IndexError):
        opt.model(torch.zeros(1, 17, dtype=torch.long))
    inputs, _ = make_inputs(llama, [(1, 40)])(None)
    with torch.no_grad():
        assert llama.model(*inputs).last_hidden_state.shape == (1, 40, 32)


# --------------------------------------------------------------------------------------------------
# scaling() and compare()
def test_scaling_refuses_a_length_below_one_by_name_before_profiling():
    block = flopscope.studies.models.TransformerBlock(8, 2, 16)
    built: list[int] = []

    def inputs(n: int) -> torch.Tensor:
        built.append(n)
        return torch.zeros(1, n, 8)

    for bad in (0, -1):
        with pytest.raises(errors.ConfigurationError, match=f"length must be >= 1; got {bad}$"):
            flopscope.scaling(block, inputs, lengths=[4, 8, bad, 16, 32])
    assert built == []


def test_compare_counts_windows_wider_than_the_sequence_exactly_and_says_so():
    """Accepted on purpose: with padding k // 2 the padded input (n + 2·(k // 2) positions) is never shorter
    than the kernel, so a convolution with k > n still has n_out = n + 2·(k // 2) - k + 1 outputs, each of k
    taps executed (those on padding too): k·n_out·d². Restricted attention with r > n scores r keys per
    query, padded ones included, then masks them: 2·r·n·d. The table notes that the windows reach past the
    sequence."""
    n, d, h = 3, 4, 2
    for k, r in ((8, 7), (7, 4)):  # even k: n_out = n + 1; odd k: n_out = n
        n_out = n + 1 if k % 2 == 0 else n
        table = flopscope.compare(n=n, d=d, h=h, k=k, r=r)
        assert table.all_match
        assert table.row("convolution").measured_macs == k * n_out * d * d
        assert table.row("separable_convolution").measured_macs == k * n_out * d + n_out * d * d
        assert table.row("restricted_banded_core").measured_macs == 2 * r * n * d
        text = table.to_table()
        assert f"k={k} > n={n}: every convolution window reaches into the zero padding" in text
        assert f"r={r} > n={n}: every restricted-attention window reaches past the sequence" in text
    assert " > n=" not in flopscope.compare(n=8, d=d, h=h, k=3, r=8).to_table()  # k, r <= n: no note
