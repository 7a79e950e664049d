"""``flopscope diff`` on pairs whose differences have closed forms: MHA against GQA (k_proj and v_proj scale by
n_kv / h), dense against a mixture of experts (the FFN by top_k, a router beside it), a sliding window (executed work
unchanged, the attention core's useful pairs cut); and the command on two JSON reports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import warnings

import pytest
import torch
from transformers import LlamaConfig, LlamaModel, MistralConfig, MistralModel, MixtralConfig, MixtralModel

import flopscope
from flopscope.cli import main
from flopscope.errors import InputError
from flopscope.render import text as report
from flopscope.render.diff import diff

from closed_forms import rotary

B, N, D, H, D_FF, L = 1, 32, 64, 4, 128, 2
D_K = D // H
BASE = dict(hidden_size=D, intermediate_size=D_FF, num_hidden_layers=L, num_attention_heads=H, vocab_size=100)


def profile(cls, config) -> flopscope.Profile:
    with torch.device("meta"):
        model = cls(config).eval()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return flopscope.profile(model, torch.zeros(B, N, dtype=torch.long))


def roles(changes) -> dict[str, tuple[int, int]]:
    return {c.key: (c.before, c.after) for c in changes.roles}


def test_mha_against_gqa_scales_the_key_and_value_projections_by_n_kv():
    mha = profile(LlamaModel, LlamaConfig(**BASE, num_key_value_heads=H))
    gqa = profile(LlamaModel, LlamaConfig(**BASE, num_key_value_heads=1))
    changes = diff(mha, gqa, "MHA", "GQA")
    kv = L * B * N * D * D_K  # B·n_k·d·(n_kv·d_k) per block, n_kv = 1
    assert roles(changes)["k_proj"] == roles(changes)["v_proj"] == (H * kv, kv)
    assert roles(changes)["q_proj"] == (L * B * N * D * D, L * B * N * D * D)
    assert changes.total.delta == -2 * (H - 1) * kv
    why = {c.key: c.why for c in changes.roles}
    assert why["k_proj"] == f"n_kv {H} → 1 (k_proj = B·n_k·d·(n_kv·d_k))"
    assert why["q_proj"] == ""
    assert [(c.key, c.delta) for c in changes.ops] == [("aten.mm", -2 * (H - 1) * kv)]
    assert {c.key: c.delta for c in changes.modules}["layers.0.self_attn.k_proj"] == -(H - 1) * kv // L


def test_dense_against_a_mixture_of_experts_scales_the_ffn_by_top_k():
    dense = profile(LlamaModel, LlamaConfig(**BASE, num_key_value_heads=H))
    moe = profile(MixtralModel, MixtralConfig(**BASE, num_key_value_heads=H, num_local_experts=4,
                                              num_experts_per_tok=2))
    changes = diff(dense, moe)
    ffn = L * B * N * D * D_FF
    for role in ("ffn_up", "ffn_gate", "ffn_down"):
        assert roles(changes)[role] == (ffn, 2 * ffn)
        assert next(c.why for c in changes.roles if c.key == role).startswith("top_k - → 2")
    angles = rotary(N, D_K).get("other", 0)  # (a matmul before transformers 5.19, in both)
    assert roles(changes)["other"] == (angles, angles + L * B * N * D * 4)  # the router: B·n·d·experts
    assert changes.total.delta == 3 * ffn + L * B * N * D * 4


def test_a_sliding_window_cuts_the_useful_pairs_not_the_executed_work():
    """Executed work is the same (a dense kernel); under the mask the causal window W = 8 leaves
    Σ_i min(i + 1, W) = W·n − W(W−1)/2 pairs per head, against n(n+1)/2 without it."""
    full = profile(MistralModel, MistralConfig(**BASE, num_key_value_heads=H, sliding_window=None))
    window = profile(MistralModel, MistralConfig(**BASE, num_key_value_heads=H, sliding_window=8))
    changes = diff(full, window)
    assert changes.total.delta == 0 and all(c.delta == 0 for c in changes.roles)
    w = 8
    useful = {c.key: (c.before, c.after, c.why) for c in changes.useful}
    before, after, why = useful["attn_scores"]
    assert (before, after) == (L * B * H * (N * (N + 1) // 2) * D_K, L * B * H * (w * N - w * (w - 1) // 2) * D_K)
    assert why.startswith("window - → 8")


def test_the_command_diffs_two_json_reports(tmp_path, capsys):
    mha = profile(LlamaModel, LlamaConfig(**BASE, num_key_value_heads=H))
    gqa = profile(LlamaModel, LlamaConfig(**BASE, num_key_value_heads=2))
    before, after, out = tmp_path / "mha.json", tmp_path / "gqa.json", tmp_path / "diff.json"
    before.write_text(report.to_json(mha))
    after.write_text(report.to_json(gqa))
    assert main(["diff", str(before), str(after), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"n_kv {H} → 2 (k_proj = B·n_k·d·(n_kv·d_k))" in printed
    document = json.loads(out.read_text())
    assert document["schema"] == "flopscope.diff/1"
    kv = L * B * N * D * D_K
    assert {r["key"]: (r["before"], r["after"], r["ratio"]) for r in document["roles"]}["k_proj"] == (
        H * kv, 2 * kv, "1/2")


def test_a_document_that_is_no_profile_is_refused():
    with pytest.raises(InputError, match="not a flopscope profile document"):
        diff({"schema": "something else"}, {"schema": "something else"})


def test_the_command_profiles_two_targets(capsys):
    """Targets as for profile, built on meta: Llama's default config at two layers, d = 64, h = 4, MHA then
    n_kv = 2."""
    settings = ["--set", "num_hidden_layers=2", "--set", "hidden_size=64", "--set", "intermediate_size=128",
                "--set", "num_attention_heads=4"]
    assert main(["diff", "hf:llama", "hf:llama", *settings, "--set-after", "num_key_value_heads=2",
                 "--input", f"{B}x{N}"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("hf:llama → hf:llama num_key_value_heads=2: ")
    kv = L * B * N * D * D_K
    assert f"k_proj             {H * kv:,}" in printed and f"n_kv {H} → 2" in printed


CHROMIUM = next((found for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
                 if (found := shutil.which(name))), None)


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary on PATH (Debian: apt-get install chromium; CI's "
                                              ".ci/run installs it)")
def test_the_diff_page_in_chromium(tmp_path):
    """MHA against GQA as a page: every role's row carries its MACs before and after (k_proj and v_proj halved at
    n_kv = 2, the rest unchanged), the total too, and the page logs nothing."""
    mha = profile(LlamaModel, LlamaConfig(**BASE, num_key_value_heads=H))
    gqa = profile(LlamaModel, LlamaConfig(**BASE, num_key_value_heads=2))
    page = diff(mha, gqa, "MHA", "GQA").to_html(tmp_path / "diff.html")
    result = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                             "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr",
                             "--v=0", "--dump-dom", page.resolve().as_uri()],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0 and [line for line in result.stderr.splitlines() if ":CONSOLE" in line] == []
    rows = {m["data-role"]: (int(m["data-before"]), int(m["data-after"])) for m in (
        dict(re.findall(r"([\w-]+)=['\"]?([^'\" >]+)", tag)) for tag in re.findall(r"<tr class=\"role\"[^>]*>",
                                                                                  result.stdout))}
    kv = L * B * N * D * D_K
    assert rows["k_proj"] == rows["v_proj"] == (H * kv, 2 * kv)
    assert rows["q_proj"] == rows["out_proj"] == (L * B * N * D * D, L * B * N * D * D)
    assert rows == {c.key: (c.before, c.after) for c in diff(mha, gqa).roles}
    total = re.search(r"<p id=\"total\" data-before=\"(\d+)\" data-after=\"(\d+)\"", result.stdout)
    assert (int(total[1]), int(total[2])) == (mha.total(), gqa.total())


def test_more_tokens_move_n_in_the_logits_row_and_ratios_print_as_decimals(tmp_path, capsys):
    """Two JSON reports of a causal LM at N and 2N tokens: the logits row says n moved (it said "no closed-form
    parameter moved": its basis named d and V only), and the ratios print as decimals (they printed as fractions,
    "870/427")."""
    from transformers import LlamaForCausalLM

    config = LlamaConfig(**BASE, num_key_value_heads=H)
    paths = []
    for tokens in (N, 2 * N):
        with torch.device("meta"):
            model = LlamaForCausalLM(config).eval()
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prof = flopscope.profile(model, torch.zeros(B, tokens, dtype=torch.long))
        paths.append(tmp_path / f"n{tokens}.json")
        paths[-1].write_text(report.to_json(prof))
    assert main(["diff", *map(str, paths), "--html", str(tmp_path / "diff.html")]) == 0
    printed = capsys.readouterr().out
    logits = next(line for line in printed.splitlines() if line.startswith("logits"))
    V = BASE["vocab_size"]
    assert f"{B * N * D * V:,}" in logits and f"{B * 2 * N * D * V:,}" in logits
    assert f"n {N} → {2 * N} (logits = B·n·d·V)" in logits and " 2x " in logits
    changes = diff(*(json.loads(p.read_text()) for p in paths))
    ratio = changes.total.after / changes.total.before  # (not a whole number: the attention core grows by 4)
    assert f"({ratio:.3g}x)" in printed.splitlines()[0]
    assert re.search(r"\b\d+/\d+\b", printed) is None  # no fraction anywhere
    page = (tmp_path / "diff.html").read_text()
    assert f"{ratio:.3g}x" in page and re.search(r">\d+/\d+<", page) is None
