"""The command line never exhausts the machine (issue 35): on Llama-2-7B's shape (``hf:llama``'s default config,
27 GB of fp32 weights), run in a subprocess whose address space is limited to 8 GiB, ``profile`` counts on meta,
``generate`` counts greedy decoding on meta (fake tensors), a real run is refused before anything is allocated with
both sizes named, and a bad ``--input`` fails before any model code runs. Each child's peak resident memory and CPU
time come from ``os.wait4`` (that child's own rusage)."""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
import time

import pytest
import torch
from torch import nn

import flopscope
from flopscope.cli import main
from flopscope.hardware import memory

from closed_forms import rotary

transformers = pytest.importorskip("transformers")

LIMIT = 8 * 2**30
"""The children's address-space limit (bytes): a third of the 7B model's fp32 weights."""
GIB = 2**30


def run_cli(*argv: str, limit: int = LIMIT) -> tuple[int, str, float, float, int]:
    """``python -m flopscope ARGV`` under ``RLIMIT_AS = limit``: (exit code, stdout + stderr, wall seconds, CPU
    seconds, peak resident bytes) of that child alone."""
    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "flopscope", *argv], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, preexec_fn=limited, text=True)
    assert child.stdout is not None
    out = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)  # (reaped here: Popen must not wait for it again)
    return (child.returncode, out, time.perf_counter() - start, usage.ru_utime + usage.ru_stime,
            usage.ru_maxrss * 1024)  # ru_maxrss: KiB on Linux


def llama_7b() -> dict[str, int]:
    """The default LlamaConfig (Llama-2-7B's shape), read from transformers, not from flopscope."""
    config = transformers.LlamaConfig()
    shape = {"L": config.num_hidden_layers, "d": config.hidden_size, "d_ff": config.intermediate_size,
             "V": config.vocab_size, "h": config.num_attention_heads, "kv": config.num_key_value_heads}
    assert shape == {"L": 32, "d": 4096, "d_ff": 11008, "V": 32000, "h": 32, "kv": 32}  # multi-head, no GQA
    return shape


def parameters(lm_head: bool = False) -> int:
    """LlamaModel's parameters: the token table, per layer q, k, v, o (d x d, no bias), gate, up, down (d x d_ff) and
    two RMSNorm weights, the final norm; the causal-lm head adds V x d (not tied)."""
    s = llama_7b()
    body = s["V"] * s["d"] + s["L"] * (4 * s["d"] ** 2 + 3 * s["d"] * s["d_ff"] + 2 * s["d"]) + s["d"]
    return body + (s["V"] * s["d"] if lm_head else 0)


def forward_macs(n: int) -> int:
    """LlamaModel's forward MACs on one sequence of n tokens (executed convention: SDPA with is_causal computes the
    full n x n scores and weighted sum, docs/conventions.md): per layer the four projections 4·n·d², the gated FFN
    3·n·d·d_ff and the attention core 2·n²·d; no head (hf:llama is the bare model)."""
    s = llama_7b()
    angles = sum(rotary(n, s["d"] // s["h"]).values())  # the rotary angles, where this transformers makes a matmul
    return s["L"] * (4 * n * s["d"] ** 2 + 3 * n * s["d"] * s["d_ff"] + 2 * n * n * s["d"]) + angles


def test_the_limit_is_below_the_weights() -> None:
    assert parameters() * 4 > 3 * LIMIT  # fp32 weights: 24.6 GiB, three times the limit
    assert 6.7e9 < parameters(lm_head=True) < 6.8e9  # the "7B": 6.74 billion with the head


def test_profile_counts_the_7b_shape_on_meta_under_the_limit() -> None:
    code, out, _, _, peak = run_cli("profile", "hf:llama", "--input", "1x16")
    assert code == 0, out
    assert f"hf:llama: {parameters():,} parameters (built on meta: nothing allocated)" in out
    assert f"total: {forward_macs(16):,} MACs" in out
    assert "counted in fake mode" in out
    assert peak < 2 * GIB  # the weights alone are 24.6 GiB


def decode_macs(c: int) -> int:
    """LlamaForCausalLM's MACs for one new token of one sequence attending to c positions (cached + new): per layer
    the four projections 4·d², the gated FFN 3·d·d_ff and the attention core 2·c·d; the head d·V."""
    s = llama_7b()
    angles = sum(rotary(1, s["d"] // s["h"]).values())
    return s["L"] * (4 * s["d"] ** 2 + 3 * s["d"] * s["d_ff"] + 2 * c * s["d"]) + s["d"] * s["V"] + angles


def test_generate_counts_the_7b_shape_on_meta_under_the_limit() -> None:
    """Greedy generation of 3 tokens after 16 (one prefill, two decode steps) on fake tensors: nothing allocated;
    the prefill is the forward over the prompt with the head on its last position only (generate's
    logits_to_keep=1)."""
    code, out, _, _, peak = run_cli("generate", "hf:llama", "--prompt", "16", "--new", "3")
    assert code == 0, out
    assert (f"hf:llama/causal-lm: {parameters(lm_head=True):,} parameters, float32 (built on meta: nothing "
            "allocated); generating 3 tokens after a prompt of 16, batch 1, counted on fake tensors") in out
    rows = [line.split() for line in out.splitlines() if line.split()[1:2] in (["prefill"], ["decode"])]
    s = llama_7b()
    assert [row[1:6] for row in rows] == [
        ["prefill", "1", "16", "16", f"{forward_macs(16) + s['d'] * s['V']:,}"],  # 103,814,266,880
        ["decode", "1", "1", "17", f"{decode_macs(17):,}"],  # 6,611,533,824
        ["decode", "1", "1", "18", f"{decode_macs(18):,}"],
    ]
    assert forward_macs(16) + s["d"] * s["V"] == 103_814_266_880 + sum(rotary(16, s["d"] // s["h"]).values())
    assert [row[-1] for row in rows] == ["-"] * 3  # nothing ran: no wall time
    assert "roofline on this CPU (counted on fake tensors: nothing ran, no time measured)" in out
    assert "can't allocate memory" not in out
    assert peak < 2 * GIB  # the weights alone are 25.1 GiB with the head


def _refused(out: str, need: int, copies: int = 1) -> None:
    """The refusal names the bytes needed (parameters, ``copies`` of them) and available, and the way out."""
    state = f"{copies} x {need / GIB:,.2f} GiB" if copies > 1 else f"{need / GIB:,.2f} GiB"
    assert f"({state} of parameters and buffers" in out, out
    available = re.search(r"but ([\d,.]+) GiB are available on cpu: not run", out)
    assert available is not None, out
    assert float(available.group(1).replace(",", "")) <= LIMIT / GIB  # RLIMIT_AS counts, not only MemAvailable
    assert "--set num_hidden_layers=2" in out
    assert "can't allocate memory" not in out  # refused, not failed half-way


@pytest.mark.parametrize(("argv", "lm_head", "copies", "instead"), [
    (["profile", "hf:llama", "--input", "1x16", "--mode", "real"], False, 1, "use --mode fake"),
    (["crosscheck", "hf:llama", "--input", "1x16"], False, 2, "count it with flopscope profile hf:llama"),
    (["generate", "hf:llama", "--prompt", "16", "--new", "4", "--mode", "real"], True, 1, "use --mode fake"),
])
def test_a_real_run_that_cannot_fit_is_refused_before_allocating(argv: list[str], lm_head: bool, copies: int,
                                                                 instead: str) -> None:
    code, out, _, _, peak = run_cli(*argv)
    assert code == 3, out
    weights = parameters(lm_head) * 4  # fp32; the rotary table's 64 floats are below the message's precision
    _refused(out, weights, copies)
    assert instead in out
    assert f"needs at least {copies * weights / GIB:,.2f} GiB" in out  # the parameters alone: no estimate run
    assert "of parameters and buffers alone, the activations not counted" in out
    assert peak < 2 * GIB


BRANCH = """
from torch import nn


class Branch(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        y = self.fc(x)
        return y * 2 if y.sum().item() > 0 else y  # a value: fake tensors cannot go on
"""


def test_autos_fall_back_to_a_real_run_that_cannot_fit_is_refused(tmp_path, monkeypatch) -> None:
    (tmp_path / "branching.py").write_text(BRANCH)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    d = 65536
    code, out, _, _, peak = run_cli("profile", "branching:Branch", "--set", f"d={d}", "--input", f"4x{d}")
    assert code == 3, out
    weights, activation = (d * d + d) * 4, 4 * d * 4  # 16 GiB of fp32; fc's output, before .item() stopped it
    assert "auto's fall-back to a real run of branching:Branch (it cannot be counted on fake tensors" in out
    assert (f"needs at least {(weights + activation) / GIB:,.2f} GiB ({weights / GIB:,.2f} GiB of parameters and "
            f"buffers, {activation / GIB:.3g} GiB for the largest activation of a fake run)") in out
    assert "--mode fake" not in out  # it cannot be counted on fake tensors: not a way out
    assert peak < 2 * GIB
    code, out, *_ = run_cli("profile", "branching:Branch", "--set", "d=64", "--input", "4x64")
    assert code == 0, out
    assert f"total: {4 * 64 * 64:,} MACs" in out and "counted in real mode" in out  # small: built for real, run


def test_a_bad_input_fails_before_any_model_is_built() -> None:
    _, _, _, import_cpu, _ = _python("import flopscope.cli")
    code, out, _, cpu, peak = run_cli("profile", "hf:llama", "--input", "1x0")
    assert code == 2, out
    assert "argument --input: shape must be positive; got '1x0'" in out
    # the CPU time of starting Python and importing flopscope's command line, and under a second more (building
    # the 7B model on meta alone takes several seconds; for real, it failed under the limit after 49 s)
    assert cpu < import_cpu + 1.0, (cpu, import_cpu)
    assert peak < GIB


@pytest.mark.parametrize(("option", "value", "error"), [
    ("--input", "1xten", "argument --input: takes shapes like 1x128 or 1x3x224x224; got '1xten'"),
    ("--input", "2x-3", "argument --input: shape must be positive; got '2x-3'"),
    ("--dtype", "float33", "argument --dtype: not a torch dtype: 'float33'"),
])
def test_bad_inputs_are_usage_errors(option: str, value: str, error: str, capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("profile", "crosscheck"):
        with pytest.raises(SystemExit) as caught:
            main([command, "hf:llama", option, value])
        assert caught.value.code == 2
        assert error in capsys.readouterr().err


def _python(code: str) -> tuple[int, str, float, float, int]:
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    assert child.stdout is not None
    out = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    return child.returncode, out, time.perf_counter() - start, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024


class _BranchOnData(nn.Module):
    """A projection, then a branch on a value: fake tensors cannot take it, so mode="auto" would run it for real."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        return y * 2 if y.sum().item() > 0 else y


def test_a_meta_model_whose_fall_back_cannot_fit_is_refused_with_the_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    d, rows = 8192, 4
    with torch.device("meta"):
        model = _BranchOnData(d)
    weights = (d * d + d) * 4  # 256 MiB and the bias, fp32; nothing allocated on meta
    activation = rows * d * 4  # fc's output, the largest tensor the fake run made before .item() stopped it
    monkeypatch.setattr(memory, "system_available", lambda: 64 * 2**20)
    monkeypatch.setattr(memory, "address_space_left", lambda: None)
    with pytest.raises(flopscope.DoesNotFitError) as caught:
        flopscope.profile(model, torch.randn(rows, d))
    assert caught.value.needed_bytes == weights + activation
    assert caught.value.available_bytes == 64 * 2**20
    message = str(caught.value)
    assert f"needs at least {(weights + activation) / GIB:.2f} GiB ({weights / GIB:.2f} GiB of parameters" in message
    assert f"{64 / 1024:.2f} GiB are available" in message and "aten._local_scalar_dense" in message
    assert isinstance(caught.value, MemoryError) and isinstance(caught.value, flopscope.RunError)
    monkeypatch.setattr(memory, "system_available", lambda: 2**40)  # it would fit: still on meta, cannot run
    with pytest.raises(flopscope.FakeTensorError, match=r"made on device='meta', so it cannot run for real"):
        flopscope.profile(model, torch.randn(rows, d))


def test_state_bytes_counts_tied_weights_once_and_converts_floating_state() -> None:
    with torch.device("meta"):
        model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10, bias=False))
    model[1].weight = model[0].weight  # tied: one tensor
    model.register_buffer("steps", torch.zeros(3, dtype=torch.long, device="meta"))
    assert memory.state_bytes(model) == 10 * 4 * 4 + 3 * 8
    assert memory.state_bytes(model, torch.bfloat16) == 10 * 4 * 2 + 3 * 8  # integer buffers keep their dtype


def test_check_fits_adds_the_copies_of_the_state_and_the_activation(monkeypatch: pytest.MonkeyPatch) -> None:
    mib = 2**20
    monkeypatch.setattr(memory, "system_available", lambda: 100 * mib)
    monkeypatch.setattr(memory, "address_space_left", lambda: 80 * mib)  # the smaller of the two counts
    memory.check_fits("a run", 30 * mib, 20 * mib, copies=2)  # 80 MiB: fits exactly
    with pytest.raises(flopscope.DoesNotFitError) as caught:
        memory.check_fits("a run", 30 * mib, 21 * mib, copies=2, way_out="count less")
    assert (caught.value.needed_bytes, caught.value.available_bytes) == (81 * mib, 80 * mib)
    assert str(caught.value) == (f"a run needs at least {81 / 1024:.2f} GiB (2 x {30 / 1024:.2f} GiB of parameters and "
                                 f"buffers, {21 / 1024:.2f} GiB for the largest activation of a fake run) but "
                                 f"{80 / 1024:.2f} GiB are available on cpu: not run; count less")
    monkeypatch.setattr(memory, "system_available", lambda: None)
    monkeypatch.setattr(memory, "address_space_left", lambda: None)
    memory.check_fits("a run", 2**50, 2**50)  # nothing known: no refusal
