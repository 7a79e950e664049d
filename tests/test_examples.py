"""Every script in examples/ runs (small sizes) and says what it claims."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import sys
from pathlib import Path

import numpy as np
import pytest

from flopscope.workloads.symbolic import symbolic_sizes_kept

from closed_forms import rotary, total

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_every_example_is_tested():
    assert {p.stem for p in EXAMPLES.glob("*.py")} == {"huggingface_from_config", "training_step",
                                                       "custom_block_rule", "scaling_plot", "seed_exercise",
                                                       "training_loop_mfu", "lightning_mfu", "generation_roofline",
                                                       "distributed_70b", "trace_roles", "flop_budget", "real_config",
                                                       "notebook_view"}


def test_huggingface_from_config(capsys):
    pytest.importorskip("transformers")
    prof = load("huggingface_from_config").main(["--layers", "1", "--n", "32"])
    assert prof.reconcile().all_exact()
    out = capsys.readouterr().out
    # the example's Llama: one layer, d 512, 8 heads of 64, 2 key/value heads, SwiGLU d_ff 1376, vocab 32000
    L, d, h, d_k, n_kv, d_ff, V, n = 1, 512, 8, 64, 2, 1376, 32000, 32
    d_attn = h * d_k
    per_token = (L * (d * d_attn + 2 * d * n_kv * d_k  # Q, then grouped K and V
                      + 2 * n * d_attn  # scores and weighted sum over all n keys
                      + d_attn * d + 3 * d * d_ff)  # output projection, gate / up / down
                 + d * V  # logits
                 + total(rotary(n, d_k)) // n)  # (transformers before 5.19: the rotary angles, d_k/2 per token)
    assert out.splitlines()[0] == f"{n * per_token:,} MACs = {2 * n * per_token:,} FLOPs for {n} tokens"
    kaplan_n = 2 * d * L * (2 * d_attn + d_ff)  # Kaplan et al. 2020: N = 2·d·L·(2·d_attn + d_ff)
    kaplan = kaplan_n + L * n * d_attn  # C_forward / 2 = N + L·n·d_attn MACs per token
    row = next(line for line in out.splitlines() if line.startswith("Kaplan"))
    columns = row.split()
    assert f"{kaplan:,}" in columns and f"{per_token:,}" in columns
    assert f"{100 * (per_token - kaplan) / kaplan:+.2f}%" in columns
    assert f"QKV projections -{L * (3 * d * d_attn - d * d_attn - 2 * d * n_kv * d_k):,};" in row  # K/V grouped
    assert f"FFN +{L * d * d_ff:,};" in row  # the gate: Kaplan's FFN has two matrices
    assert f"logits (de-embedding) +{d * V:,}" in row  # left out of C_forward


def test_training_step():
    pytest.importorskip("transformers")
    prof = load("training_step").main(["--layers", "1", "--n", "16"])
    forward, backward = prof.by_role(phase="forward"), prof.by_role(phase="backward")
    assert backward["ffn_up"] == 2 * forward["ffn_up"] and backward["q_proj"] == 2 * forward["q_proj"]
    L, B, n, d, V = 1, 2, 16, 256, 1000  # the example's GPT-2: width 256, vocabulary 1000, batch 2
    assert forward["ffn_up"] == L * B * n * d * 4 * d and forward["q_proj"] == L * B * n * d * d
    assert forward["logits"] == B * n * d * V


def test_custom_block_rule():
    roles = load("custom_block_rule").main([])
    n, d, token_hidden = 128, 64, 256  # token mixing: d rows of n positions through n -> token_hidden -> n
    assert roles == {"token_mixing": 2 * d * n * token_hidden, "ffn_up": n * d * 4 * d, "ffn_down": n * 4 * d * d}


def test_scaling_plot(tmp_path):
    image = pytest.importorskip("matplotlib.image")
    result = load("scaling_plot").main(["--out", str(tmp_path / "s.png"), "--d", "64"])
    d = 64
    assert result.crossover() == 2 * d + 4 * d + 1  # 2n²d > n(4d² + 2·d·4d)  <=>  n > 6d
    pixels = image.imread(tmp_path / "s.png")
    assert pixels.shape[:2] == (int(5.5 * 120), 8 * 120)  # flopscope.render.plots: 8 x 5.5 inches at 120 dpi
    colours = np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)
    assert len(colours) > 1  # not blank
    assert (np.ptp(colours[:, :3], axis=1) > 0.2).any()  # and not only greys: the role lines are drawn in colour


def test_seed_exercise():
    ours, theirs = load("seed_exercise").main([])
    n, d, B = 64, 128, 2
    assert ours == theirs == {"q_proj": B * n * d * d, "k_proj": B * n * d * d, "v_proj": B * n * d * d,
                              "out_proj": B * n * d * d, "attn_scores": B * n * n * d,
                              "attn_weighted_sum": B * n * n * d}


def test_training_loop_mfu(capsys):
    pytest.importorskip("transformers")
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    import flopscope

    steps = load("training_loop_mfu").main(["--steps", "2"])
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000, n_positions=256))
    for step in steps:  # the priced FLOPs are those of a profile of that very batch, forward and backward
        ids = torch.zeros(2, step["length"], dtype=torch.long)
        profiled = flopscope.profile(model, ids, mode="fake", backward=True, loss=lambda out: out.logits.mean())
        assert step["flops"] == profiled.total_flops()
        assert step["mfu"] == step["flops_per_sec"] / step["peak"] and 0 < step["mfu"] < 1
    assert "MFU" in capsys.readouterr().out


def test_lightning_mfu(capsys):
    pytest.importorskip("transformers")
    pytest.importorskip("lightning")
    import torch

    import flopscope

    example = load("lightning_mfu")
    rows = example.main(["--steps", "3"])
    lines = capsys.readouterr().out.splitlines()
    assert len({row["shape"] for row in rows}) == 3  # every batch padded to its own length
    model = example.TinyGPT()
    L, d = 2, 64  # the example's GPT-2; HF's non-embedding parameters: per block 2 LayerNorms, c_attn, c_proj,
    n_params = L * (12 * d * d + 13 * d) + 2 * d  # c_fc and the MLP's c_proj (weights and biases), + ln_f
    for i, row in enumerate(rows):  # the priced FLOPs are those of a profile of that very batch, forward and backward
        batch, tokens = torch.zeros(row["shape"], dtype=torch.long), row["shape"][0] * row["shape"][1]
        exact = flopscope.profile(model, batch, mode="fake", backward=True).total_flops()
        assert row["flops"] == exact and row["tokens"] == tokens and row["hf_flops"] == 6 * n_params * tokens
        assert row["mfu"] == row["flops_per_sec"] / row["peak"] and 0 < row["mfu"] < 1
        printed = next(line.split() for line in lines if line.startswith(f"{i + 1:>4} "))
        assert printed[:5] == [str(i + 1), "×".join(map(str, row["shape"])), str(tokens), f"{exact:,}",
                               f"{6 * n_params * tokens:,}"]
        # ThroughputMonitor read flops_per_batch: its FLOP/s (over the whole loop, callbacks included) is lower
        monitored = row["monitor_flops_per_sec"]
        assert (monitored is None) if i == 0 else (0 < monitored <= row["flops_per_sec"])
    assert f"MFU = FLOP/s ÷ {rows[0]['peak'] / 1e9:,.1f} GFLOP/s" in lines[-1]


def test_generation_roofline(tmp_path, capsys):
    pytest.importorskip("transformers")
    pytest.importorskip("matplotlib")
    prompt, new = 8, 5
    result = load("generation_roofline").main(["--prompt", str(prompt), "--new", str(new),
                                               "--out", str(tmp_path / "roofline.png")])
    out = capsys.readouterr().out
    decode_rows = [row[:5] for row in map(str.split, out.splitlines()) if row[:2] and row[0].isdigit()
                   and row[1] == "decode"]  # the step table's decode rows
    assert decode_rows == [[str(1 + i), "decode", "1", "1", str(prompt + i)] for i in range(1, new)]
    assert (tmp_path / "roofline.png").stat().st_size > 0
    # the example's Llama: 2 layers, d 128, 4 heads of 32, 2 key/value heads, d_ff 256, vocab 1000
    L, d, h, d_k, n_kv, d_ff, V = 2, 128, 4, 32, 2, 256, 1000
    slope = 4 * L * h * d_k  # FLOPs per context position: scores + weighted sum, 2·L·h·d_k MACs
    constant = 2 * (L * (d * h * d_k + 2 * d * n_kv * d_k + h * d_k * d + 3 * d * d_ff) + d * V + total(rotary(1, d_k)))
    assert f"FLOPs per generated token at context c: {slope:,}·c + {constant:,} (KV cache: {slope:,}·c)" in out
    assert result["scaling"].lengths == tuple(prompt + i for i in range(1, new))
    assert all(p.bound == "memory" for p in result["roofline"].steps)  # tiny, batch 1: memory-bound on an H100
    projections = ("q_proj", "k_proj", "v_proj", "out_proj", "ffn_up", "ffn_gate", "ffn_down", "logits")
    decode = {p.name: p for p in result["decode"].roles}
    prefill = {p.name: p for p in result["prefill"].roles}
    for role in projections:  # the 7B shape: a weight read per multiply-add at decode, shared by 2,048 at prefill
        assert decode[role].bound == "memory" and decode[role].intensity == pytest.approx(1.0, rel=1e-3)
        assert prefill[role].bound == "compute"


def test_distributed_70b(capsys):
    pytest.importorskip("transformers")
    dist = pytest.importorskip("torch.distributed")
    from zoo import hf_plan_shards_the_embedding

    if not hf_plan_shards_the_embedding():
        pytest.skip("this transformers' tensor-parallel plan for Llama leaves the token embedding whole")
    # the example's 70B shape shrunk: 2 layers, d 256, 16 heads of 16, 8 KV heads, FFN 512, vocab 1000; TP 8 x DP 8
    L, d, h, kv, d_ff, V, n, t, dp = 2, 256, 16, 8, 512, 1000, 32, 8, 8
    result = load("distributed_70b").main(["--layers", str(L), "--width", str(d), "--heads", str(h), "--kv-heads",
                                           str(kv), "--ffn", str(d_ff), "--vocab", str(V), "--tokens", str(n)])
    out = capsys.readouterr().out
    assert not dist.is_initialized()
    whole, mine = result["unsharded"].by_role(phase="forward"), result["sharded"].by_role(phase="forward")
    d_kv = kv * d // h
    assert whole["q_proj"] == L * n * d * d and mine["q_proj"] == whole["q_proj"] // t
    assert mine["k_proj"] == L * n * d * d_kv // t and mine["ffn_down"] == L * n * d_ff * d // t
    assert mine["logits"] == n * d * V // t  # the LM head is sharded by vocabulary too
    assert all(line.split()[-1] == "1/8" for line in out.split("share\n")[1].split("\n\n")[0].splitlines()[1:])
    rows = result["sharded"].collectives()
    activation = n * d * 2  # one bf16 [1, n, d] activation
    forward = [(r.kind, r.calls, r.bytes) for r in rows if r.phase == "forward"]
    assert sum(c for k, c, _ in forward if k == "all_reduce") == 2 * L + 1  # Megatron's two per layer + embedding
    assert sum(b for k, _, b in forward if k == "all_reduce") == (2 * L + 1) * activation
    assert [(k, b) for k, _, b in forward if k == "all_gather"] == [("all_gather", n * V * 2)]  # bf16 logits
    assert sum(r.calls for r in rows if r.phase == "backward") == 5 * L + 1
    layer = 2 * ((2 * d * d + 2 * d * d_kv + 3 * d * d_ff) // t + 2 * d)  # bf16 bytes of a layer's TP shard
    assert result["units"] == [("", 2 * (2 * V * d // t + d))] + [(f"model.layers.{i}", layer) for i in range(L)]
    assert "predicted (FSDP2 does not run on fake tensors)" in out
    assert f"FSDP over {dp} ranks leaves" in out
    macs = result["sharded"].total(module="model.layers.0")
    row = next(line for line in out.splitlines() if line.startswith("model.layers.0..1 (each)")).split()
    assert row[2:5] == [f"{macs:,}", f"{7 * activation:,}", f"{3 * layer:,}"]


def test_trace_roles(tmp_path, capsys):
    pytest.importorskip("transformers")
    pytest.importorskip("matplotlib")
    L, n, d, h, V = 1, 16, 64, 4, 100
    result = load("trace_roles").main(["--out", str(tmp_path), "--layers", str(L), "--n", str(n), "--width", str(d),
                                       "--heads", str(h), "--vocab", str(V)])
    # GPT-2: fused QKV, output projection, scores and weighted sum, a 4d FFN; the LM head
    expected = L * (4 * n * d * d + 2 * n * n * d + 8 * n * d * d) + n * d * V
    ops = [e for e in result["trace"]["traceEvents"] if e["ph"] == "X"]
    assert result["profile"].total() == sum(e["args"]["macs"] for e in ops) == expected
    ranges = [e for e in result["merged"]["traceEvents"] if e.get("cat") == "flopscope"]
    assert sum(e["args"]["macs"] for e in ranges) == expected  # every multiply on one of torch's events
    calls = {role: sum(e["name"] == role for e in ranges) for role in ("attn_scores", "ffn_up", "logits")}
    assert calls == {"attn_scores": L, "ffn_up": L, "logits": 1}
    assert result["module_ranges"]["flopscope/transformer.h.0.attn"] == 1  # key_averages() groups by module
    assert {p.name for p in tmp_path.iterdir()} == {"flopscope_trace.json", "torch_trace.json",
                                                    "torch_trace_roles.json", "trace.png"}
    assert result["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and result["png"].stat().st_size > 20_000
    assert f"{expected:,} MACs" in capsys.readouterr().out


def test_flop_budget(capsys):
    result = load("flop_budget").main(["--n", "16", "--d", "64"])
    n, d, d_ff = 16, 64, 256
    assert result["profile"].total() == 4 * n * d * d + 2 * n * n * d + 2 * n * d * d_ff
    failure = result["failure"].splitlines()
    up = n * d * d_ff  # the FFN doubled: each of its GEMMs gains one more of itself
    assert any(line.split()[:5] == ["ffn_up", f"{up:,}", f"{2 * up:,}", f"+{up:,}", "CHANGED"] for line in failure)
    assert not any(line.startswith("attn_scores") and "CHANGED" in line for line in failure)
    assert json.loads(result["baseline"])["roles"]["ffn_up"] == 2 * up  # updated, as pytest --flops-update does
    assert f"closed form holds: {result['profile'].total():,} MACs" in capsys.readouterr().out


def test_real_config(capsys):
    pytest.importorskip("transformers")
    from closed_forms import add, attention, ffn, times

    L, n = 2, 64
    prof = load("real_config").main(["--layers", str(L), "--n", str(n)])
    d, d_ff, vocab = 4096, 14336, 128256  # Llama-3.1-8B: GQA 32 heads over 8 key/value heads, SwiGLU
    layer = add(attention(1, n, n, d, 32, 8), ffn(1, n, d, d_ff, gated=True))
    assert {r: m for r, m in prof.by_role().items() if m} == add(times(L, layer), {"logits": n * d * vocab},
                                                                  rotary(n, d // 32))
    out = capsys.readouterr().out
    weights = L * (2 * d * d + 2 * d * 1024 + 3 * d * d_ff) + d * vocab  # a MAC per weight per token
    assert f"per token: {prof.total() // n:,} MACs = {weights:,} (a MAC per weight) + {2 * L * n * d:,}" in out


def test_notebook_view(tmp_path, capsys):
    n, d = 64, 256  # the example's block: h = 8, d_ff = 4d
    d_ff = 4 * d
    fragment, page = tmp_path / "cell.html", tmp_path / "report.html"
    prof = load("notebook_view").main(["--n", str(n), "--d", str(d), "--fragment", str(fragment),
                                       "--report", str(page)])
    total = n * (4 * d * d + 2 * d * d_ff) + 2 * n * n * d
    assert prof.total() == total
    out = capsys.readouterr().out
    assert out.startswith(f"TransformerBlock: {total:,} MACs = {2 * total:,} FLOPs")
    assert f"| q_proj | {n * d * d:,} | {2 * n * d * d:,} |" in out
    assert f"| attn_scores | {n * n * d:,} | {2 * n * n * d:,} |" in out
    assert f"| ffn_up | {n * d * d_ff:,} | {2 * n * d * d_ff:,} |" in out
    assert f"| · ffn | FeedForward |  | {2 * n * d * d_ff:,} |" in out
    assert "<script" not in fragment.read_text() and f"{n * d * d:,}" in fragment.read_text()
    assert f"wrote {page}" in out and f"{total:,}" in page.read_text()


def test_the_readme_example_runs_as_written_and_prints_what_the_readme_shows():
    """The README's example, run as written in a fresh interpreter, prints the README's output block, whose numbers
    are the closed forms of its 4-layer Llama (d 512, 8 heads of 64, 2 key/value heads, d_ff 1376, 128 tokens)."""
    transformers = pytest.importorskip("transformers")
    import subprocess

    if tuple(int(part) for part in transformers.__version__.split(".")[:2]) < (5, 19):
        pytest.skip("the README shows transformers 5.19's output and later: before, the rotary angles are a matmul "
                    "(one more row, other)")

    readme = (EXAMPLES.parent / "README.md").read_text()
    section = readme[readme.index("## An example, and what it prints"):]
    code, shown = re.findall(r"```(?:python)?\n(.*?)```", section, flags=re.S)[:2]
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout == shown
    L, d, d_k, n_kv, d_ff, V, n = 4, 512, 64, 2, 1376, 32000, 128
    printed = {line.split()[0]: int(line.split()[1].replace(",", "")) for line in shown.splitlines()[1:-1]}
    assert printed["q_proj"] == printed["out_proj"] == L * n * d * d
    assert printed["k_proj"] == printed["v_proj"] == L * n * d * n_kv * d_k
    assert printed["attn_scores"] == printed["attn_weighted_sum"] == L * 8 * n * n * d_k
    assert printed["ffn_up"] == printed["ffn_gate"] == printed["ffn_down"] == L * n * d * d_ff
    assert printed["logits"] == n * d * V


# --------------------------------------------------------------------------------------------------
# The guide's pages open with an example, and what it prints
# --------------------------------------------------------------------------------------------------
DOCS = EXAMPLES.parent / "docs"
GUIDE = [*sorted((DOCS / "guide").glob("*.md")), DOCS / "examples.md"]
OPENING = re.compile(r"\A# [^\n]*\n\n```(python|bash)\n(.*?)```\n(?:\n```text\n(.*?)```\n)?", re.S)
# packages an example may need that a plain install lacks: the example is skipped without them
OPTIONAL = ("transformers", "diffusers", "matplotlib", "lightning", "timm", "torchvision")
# the templates with symbolic sizes, which a PyTorch that makes symbolic sizes constants refuses
SYMBOLIC = re.compile(r"\b(cost_model|count_generation)\(|flopscope cost ")
PREFIXES = {"hf:": "transformers", "timm:": "timm", "torchvision.": "torchvision", "diffusers:": "diffusers"}


def imported(code: str) -> set[str]:
    """The top-level packages that Python source imports."""
    names = set()
    for statement in re.findall(r"^\s*(?:from\s+([\w.]+)\s+import|import\s+([\w., ]+))", code, flags=re.M):
        for name in (statement[0] or statement[1]).split(","):
            names.add(name.strip().split(".")[0])
    return names


def commands(kind: str, code: str) -> tuple[list[list[str]], set[str]]:
    """The processes that run a page's opening block, and the packages they import.

    A python block runs as ``python -c``; each command of a bash block runs with this interpreter
    (``flopscope ...`` as ``python -m flopscope ...``), its arguments that name files of the repository
    made absolute."""
    if kind == "python":  # the block, then a mark when it imported transformers (flopscope may import it for it)
        mark = "\nimport sys\nif 'transformers' in sys.modules:\n    open('transformers-imported', 'w').close()\n"
        return [[sys.executable, "-c", code + mark]], imported(code)
    runs, needs = [], set()
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        program, *arguments = words
        assert program in ("flopscope", "python"), f"a command the test cannot run: {line}"
        arguments = [str(EXAMPLES.parent / a) if (EXAMPLES.parent / a).is_file() else a for a in arguments]
        for argument in arguments:
            if argument.endswith(".py"):
                needs |= imported(Path(argument).read_text(encoding="utf-8"))
            needs |= {package for prefix, package in PREFIXES.items() if argument.startswith(prefix)}
        runs.append([sys.executable, *(["-m", "flopscope"] if program == "flopscope" else []), *arguments])
    return runs, needs


@pytest.mark.parametrize("page", GUIDE, ids=lambda page: page.stem)
def test_a_guide_page_opens_with_an_example_that_prints_what_the_page_shows(page, tmp_path):
    """Each page of the guide (and the examples page) opens with a python or bash block, run here as written in a
    fresh interpreter, in an empty folder; the ``text`` block after it, where there is one, is what it prints.
    transformers before 5.19 computes the rotary angles as a matmul (one more row, other): there the example only
    has to run."""
    import os
    import subprocess

    import flopscope

    match = OPENING.match(page.read_text(encoding="utf-8"))
    assert match, f"{page.name} opens with its title, then a python or bash block"
    kind, code, shown = match.groups()
    runs, needs = commands(kind, code)
    for package in sorted(needs & set(OPTIONAL)):
        pytest.importorskip(package, reason=f"the example of {page.name} imports {package}")
    path = os.pathsep.join(filter(None, [str(Path(flopscope.__file__).parents[1]), os.environ.get("PYTHONPATH")]))
    printed = ""
    for argv in runs:
        run = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                             env={**os.environ, "PYTHONPATH": path}, check=False)
        missing = re.findall(r"No module named '(\w+)'", run.stderr)
        if run.returncode and missing and missing[0] in OPTIONAL:  # imported by flopscope for the example
            pytest.skip(f"the example of {page.name} needs {missing[0]}")
        if SYMBOLIC.search(code) and not symbolic_sizes_kept():  # refused on this torch, with the reason
            assert run.returncode != 0 and "traces the model once with symbolic sizes" in run.stderr, run.stderr
            return
        assert run.returncode == 0, run.stderr[-3000:]
        printed += run.stdout
    if shown is None:
        return
    if "transformers" in needs or (tmp_path / "transformers-imported").exists():
        import transformers

        if tuple(int(part) for part in transformers.__version__.split(".")[:2]) < (5, 19):
            return
    assert printed == shown
