"""How much does counting cost? flopscope's overhead next to a plain forward and FlopCounterMode.

Run from the repository root (the script puts the repository on ``sys.path``; ``transformers`` and
``tabulate`` are needed)::

    python benchmarks/overhead.py                  # full run, a few minutes on a laptop CPU
    python benchmarks/overhead.py --quick          # smoke test: small models, few repetitions
    python benchmarks/overhead.py --threads 4 --reps 11

Part 1: small models, executed for real on the CPU (or ``--device cuda``)
-----------------------------------------------------------------------
BERT-base (``BertModel(BertConfig())``), GPT-2 small (``GPT2Model(GPT2Config())``) and a 4-layer
Llama (d 512, GQA 8/2 heads), all built from configs with random weights, in eval mode, under
``torch.no_grad()``, batch 1, 128 token ids (``--device`` and ``--dtype`` move them; on a GPU each timed
call ends with ``torch.cuda.synchronize()``, so that it includes the kernels it launched). For each model five
variants are timed:

    plain            ``model(ids)``
    empty mode       ``model(ids)`` under a ``TorchDispatchMode`` that only runs each op (see below)
    flopscope real   ``flopscope.profile(model, ids, mode="real")``  (runs the forward, records it)
    FlopCounterMode  ``with torch.utils.flop_counter.FlopCounterMode(display=False): model(ids)``
    flopscope fake   ``flopscope.profile(model, ids, mode="fake")``  (fake tensors: nothing is computed)

Each repetition runs every variant once, back to back (the starting variant rotates from one
repetition to the next so that none always runs first); ``--warmup`` rounds are run and discarded
first. ``gc.collect()`` runs before each timed call, outside the timing (after ``gc.freeze()`` of
the long-lived heap, so that it is cheap).

How to read the table: ``plain ms`` is the median wall time of the bare forward. The ``x plain``
columns are the median, over repetitions, of each variant's time divided by the plain forward's
time *in the same repetition* (so slow drift of the machine cancels); 1.00 means free, 1.30 means
30 % slower than just running the model. ``fs us/op`` is flopscope real mode's extra time per
recorded ATen op, ``(real - plain) / ops``: flopscope's cost is a per-op Python cost, so it matters
most for small/fast models with many cheap ops and vanishes for large matmuls. ``flopscope fake``
below 1.0 means counting without computing is faster than running the model. The MAC columns show
what each counter found: FlopCounterMode reports FLOPs (halved here to MACs) and has no formula for
CPU fused attention (``_scaled_dot_product_flash_attention_for_cpu``), so its count is lower by the
attention-score and weighted-sum products.

Part 2: Llama-7B shape on ``device="meta"``, counted on fake tensors
--------------------------------------------------------------------
``LlamaModel`` with the Llama-7B config (32 layers, d 4096, d_ff 11008, 32 heads, no ``lm_head``)
built under ``with torch.device("meta")``, input ids ``(1, 2048)`` on meta. It runs in a fresh
subprocess, started before part 1 builds anything, so that its memory numbers are its own (a
child's ``ru_maxrss`` starts at its parent's RSS: Linux carries the high-water mark across exec).
Reported: the wall time of the first (cold) ``flopscope.profile(model, ids, mode="fake")`` call
and the median of the following ``--reps-7b`` calls; ``maxrss built``, the peak RSS
(``getrusage(RUSAGE_SELF).ru_maxrss``) once the model is built, and its growth after the first
count and after all counts (+0 means counting never rose above the import/build peak); ``VmHWM
+1st`` (Linux), the peak RSS during the first count above the RSS just before it, after resetting
the high-water mark through ``/proc/self/clear_refs`` -- the memory counting itself needs,
including one-time lazy imports; and the ``tracemalloc`` peak of one extra count (Python-level
allocations only: the fx graph, node metadata, fake-tensor wrappers; nothing is allocated for
tensor data on fake tensors). The MAC total is compared with the analytic count
``L * (B n d (2 d + 2 d_kv) + 3 B n d d_ff + 2 B n^2 d)`` (projections, SwiGLU MLP, attention scores
and weighted sum; no ``lm_head``), which for the 7B shape is 14,362,370,637,824.

Then, side by side in the same child (rounds in turn, the first of each rotating, under ``no_grad``): the
plain meta forward, the same under an empty dispatch mode, ``FlopCounterMode``'s meta count, ``flopscope.profile``
(the count) and ``flopscope.profile(...).by_role()`` (the count with roles); printed are the medians and the medians
of the per-round ratios, against issue 15's targets (<= 1.0x FlopCounterMode, <= 1.6x the plain forward) and issue
34's (the count <= 1.15x the empty mode, with roles <= 1.25x). A meta model's forward-only count runs on meta
kernels directly (``docs/conventions.md``, the modes table), as FlopCounterMode's does.

Part 1 also times an empty ``TorchDispatchMode`` (the floor of any counter that sees every ATen op) and
prints flopscope real / empty mode per round (issue 34's target: <= 1.2), beside two floors of a recorder
(``benchmarks/floors.py``), each / the empty mode: ``op recorder`` keeps per op only the op, its input shapes and the
innermost module; ``dataflow recorder`` also maps each tensor argument to its producer's record (the least a counter
that attributes work through the dataflow does).

Part 4: generation, the Llama-7B shape (``LlamaForCausalLM``, with its head) on meta, a prompt of 512 token ids and
256 new tokens (``--new``), in its own child: the count of the prompt's forward (``flopscope.profile``), the count of
the whole greedy generation (``flopscope.profile_generation``: the prefill and 255 decode steps, layers replayed) and
their ratio (issue 34's target: <= 3); then per decode step (from 5 new tokens, prefill taken off) the three ways to
count it: ``profile_generation``, the same with ``reuse=False``, and ``greedy_decode`` in a ``profiler(mode="fake")``
block (the way before ``profile_generation``); and the floor of any count that runs each step: one decode step of
the same model on fake tensors with nothing recorded (``floors.bare_decode_steps``), next to the target's budget per
step, ``(3 - 1) x prefill count / decode steps``; then ``flopscope.count_generation`` (templates with a
symbolic cache length) for the same generation and for 32,768 new tokens, each against its target (issue 49).
Skipped with ``--quick`` (then 2 layers, a prompt of 64, 8 tokens).

Part 3: the Llama-70B shape (80 layers, d 8192, GQA 64/8 heads, d_ff 28672) at n 4096, one count after the
first in its own child: seconds (target < 1.5 s) and the memory the first count needed (VmHWM growth, target
< 600 MiB). Skipped with ``--quick``.

Part 5: DeepSeek-V3 (671 B: ``DeepseekV3ForCausalLM(DeepseekV3Config())``, 61 layers, MLA, 256 routed experts) on
meta, ids (1, 2048), in its own child: the first count in the process (``flopscope.profile(...).total()``) and the
median of three more, against issue 49's target (< 0.5 s); ``--quick``: 4 layers.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from floors import DataflowRecorder, OpRecorder, bare_decode_steps, recorded  # noqa: E402  (benchmarks/)
from rounds import median_ratio, rounds  # noqa: E402  (benchmarks/, the script's own directory)
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

import flopscope  # noqa: E402

LLAMA_7B_MACS = 14_362_370_637_824
LLAMA_7B = dict(
    hidden_size=4096,
    intermediate_size=11008,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=32,
    vocab_size=32000,
    max_position_embeddings=4096,
)
LLAMA_7B_QUICK = {**LLAMA_7B, "num_hidden_layers": 2}
LLAMA_70B = dict(
    hidden_size=8192,
    intermediate_size=28672,
    num_hidden_layers=80,
    num_attention_heads=64,
    num_key_value_heads=8,
    vocab_size=32000,
    max_position_embeddings=4096,
)
VARIANTS = ("plain", "empty mode", "op recorder", "dataflow recorder", "flopscope real", "FlopCounterMode",
            "flopscope fake")
TARGETS = {"real_vs_empty": 1.2, "7b_vs_fcm": 1.0, "7b_vs_plain": 1.6, "70b_s": 1.5, "70b_mib": 600,
           "7b_count_vs_empty": 1.15, "7b_roles_vs_empty": 1.25, "generation_vs_prefill": 3, "long_vs_short": 1.5,
           "deepseek_s": 0.5}
"""Issue 34's target for real-mode time / an empty dispatch mode's (issue 15 asked 1.08); issue 15's: the 7B count
with roles / FlopCounterMode's meta count and / the plain meta forward; the 70B count with roles in seconds and its
peak memory growth in MiB. Issue 34's: the 7B count (``profile()``) and the count with roles, each / the meta forward
under an empty dispatch mode (the floor of any dispatch-level counter); a 7B generation of 256 tokens / the count of
its prompt's forward; issue 49's: 32,768 new tokens / 256 counted from templates, DeepSeek-V3's count in seconds."""
LONG_GENERATION = 32_768


class EmptyMode(TorchDispatchMode):
    """A dispatch mode that only runs each op: the floor of any counter that sees every ATen op."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


# -------------------------------------------------------------------------------------------------
# part 1
def small_models(quick: bool) -> list[tuple[str, torch.nn.Module, int]]:
    """(label, model, sequence length); quick mode shrinks depth and sequence length."""
    from transformers import BertConfig, BertModel, GPT2Config, GPT2Model, LlamaConfig, LlamaModel

    n = 32 if quick else 128
    torch.manual_seed(0)
    bert = BertModel(BertConfig(num_hidden_layers=2) if quick else BertConfig())
    gpt2 = GPT2Model(GPT2Config(n_layer=2) if quick else GPT2Config())
    llama = LlamaModel(
        LlamaConfig(
            hidden_size=512,
            intermediate_size=1376,
            num_attention_heads=8,
            num_key_value_heads=2,
            vocab_size=32000,
            num_hidden_layers=1 if quick else 4,
        )
    )
    tag = " (2 layers)" if quick else ""
    return [
        (f"BERT-base{tag}", bert, n),
        (f"GPT-2 small{tag}", gpt2, n),
        (f"Llama 512d {'1' if quick else '4'}L", llama, n),
    ]


def time_model(model: torch.nn.Module, ids: torch.Tensor, reps: int, warmup: int) -> dict[str, Any]:
    model.eval()
    gc.collect()
    gc.freeze()  # park the long-lived heap (torch, transformers, weights) so per-call gc.collect() is cheap

    def fcm() -> FlopCounterMode:
        with FlopCounterMode(display=False) as counter:
            model(ids)
        return counter

    def empty() -> None:
        with EmptyMode():
            model(ids)

    calls: dict[str, Callable[[], Any]] = {
        "plain": lambda: model(ids),
        "empty mode": empty,
        "op recorder": recorded(OpRecorder, lambda: model(ids)),
        "dataflow recorder": recorded(DataflowRecorder, lambda: model(ids)),
        "flopscope real": lambda: flopscope.profile(model, ids, mode="real"),
        "FlopCounterMode": fcm,
        "flopscope fake": lambda: flopscope.profile(model, ids, mode="fake"),
    }
    if ids.is_cuda:  # a GPU runs its kernels after the call returns: each time ends when they have finished
        calls = {name: _synchronized(call) for name, call in calls.items()}
    fcm_failure = None
    try:  # PyTorch's counter has failed on models flopscope counts (its SDPA formula on grouped-query CUDA calls)
        with torch.no_grad():
            fcm()
    except Exception as error:  # any failure of the peer is reported in its column, not raised
        fcm_failure = f"fails: {type(error).__name__}: {str(error)[:80]}"
        del calls["FlopCounterMode"]
    with torch.no_grad():
        times, last = rounds(calls, reps, warmup)
    gc.unfreeze()
    plain = times["plain"]
    real_prof = last["flopscope real"]
    ops = sum(1 for node in real_prof.graph.nodes if node.op == "call_function")
    extra = statistics.median(r - p for r, p in zip(times["flopscope real"], plain, strict=True))
    return {
        "plain_ms": 1e3 * statistics.median(plain),
        "ratio": {v: median_ratio(times[v], plain) if v in times else float("nan") for v in VARIANTS[1:]},
        "real_vs_empty": median_ratio(times["flopscope real"], times["empty mode"]),
        "floors_vs_empty": {v: median_ratio(times[v], times["empty mode"]) for v in ("op recorder",
                                                                                    "dataflow recorder")},
        "ops": ops,
        "us_per_op": 1e6 * extra / ops if ops else float("nan"),
        "fs_macs": real_prof.total(),
        "fs_fake_macs": last["flopscope fake"].total(),
        "fcm": fcm_failure or f"{last['FlopCounterMode'].get_total_flops() // 2:,}",
    }


def _synchronized(call: Callable[[], Any]) -> Callable[[], Any]:
    def run() -> Any:
        result = call()
        torch.cuda.synchronize()
        return result

    return run


# -------------------------------------------------------------------------------------------------
# part 2 (runs in a child process)
def llama_analytic_macs(cfg: dict[str, int], batch: int, n: int) -> int:
    d, ff, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    d_kv = d // cfg["num_attention_heads"] * cfg["num_key_value_heads"]
    tokens = batch * n
    per_layer = tokens * d * (2 * d + 2 * d_kv) + 3 * tokens * d * ff + 2 * batch * n * n * d
    return layers * per_layer


def _max_rss_mib() -> float:
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return kib / (1024 * 1024) if sys.platform == "darwin" else kib / 1024


def _proc_status_mib(field: str) -> float | None:
    """``VmRSS`` / ``VmHWM`` of this process from /proc (Linux only), in MiB."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux: write 5 to /proc/self/clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def child_7b(spec: dict[str, Any]) -> dict[str, Any]:
    from transformers import LlamaConfig, LlamaModel

    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    cfg, n, reps = spec["config"], spec["n"], spec["reps"]
    with torch.device("meta"):
        model = LlamaModel(LlamaConfig(**cfg))
        ids = torch.zeros(1, n, dtype=torch.long)
    model.eval()
    gc.collect()
    rss_built = _max_rss_mib()
    rss_now = _proc_status_mib("VmRSS")
    hwm_reset = _reset_peak_rss()
    times = []
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(1 + reps):
            start = time.perf_counter()
            prof = flopscope.profile(model, ids, mode="fake")
            times.append(time.perf_counter() - start)
            if i == 0:
                rss_first = _max_rss_mib()
                hwm_first = _proc_status_mib("VmHWM")
                total = prof.total()
                ops = sum(1 for node in prof.graph.nodes if node.op == "call_function")
            del prof
            gc.collect()
        rss_all = _max_rss_mib()
        tracemalloc.start()
        tracemalloc.reset_peak()
        flopscope.profile(model, ids, mode="fake")
        _, traced_peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    hwm_growth = hwm_first - rss_now if hwm_reset and hwm_first is not None and rss_now is not None else None
    side = _side_by_side(model, ids, spec["side_reps"]) if spec["side_reps"] else {}
    return {
        "side": side,
        "first_s": times[0],
        "median_s": statistics.median(times[1:]),
        "rss_built_mib": rss_built,
        "rss_growth_first_mib": rss_first - rss_built,
        "rss_growth_all_mib": rss_all - rss_built,
        "hwm_growth_mib": hwm_growth,
        "inherited": rss_built <= spec["parent_rss_mib"],
        "tracemalloc_peak_mib": traced_peak / 2**20,
        "macs": total,
        "expected": llama_analytic_macs(cfg, 1, n),
        "ops": ops,
        "warnings": sorted({str(w.message) for w in caught}),
    }


def _side_by_side(model: torch.nn.Module, ids: torch.Tensor, reps: int) -> dict[str, float]:
    """Median seconds of the plain meta forward, the same under an empty dispatch mode, FlopCounterMode's meta count,
    flopscope's count and its count with roles, run in turn (the first of each round rotating), under ``no_grad``;
    and the medians of the per-round ratios."""

    def fcm() -> None:
        with FlopCounterMode(display=False):
            model(ids)

    def empty() -> None:
        with EmptyMode():
            model(ids)

    calls: dict[str, Callable[[], Any]] = {
        "plain": lambda: model(ids),
        "empty mode": empty,
        "FlopCounterMode": fcm,
        "flopscope": lambda: flopscope.profile(model, ids, mode="fake"),
        "flopscope + roles": lambda: flopscope.profile(model, ids, mode="fake").by_role(),
    }
    with torch.no_grad():
        times, _ = rounds(calls, reps)
    fs = times["flopscope + roles"]
    return {**{name: statistics.median(t) for name, t in times.items()},
            "vs_fcm": median_ratio(fs, times["FlopCounterMode"]), "vs_plain": median_ratio(fs, times["plain"]),
            "count_vs_empty": median_ratio(times["flopscope"], times["empty mode"]),
            "roles_vs_empty": median_ratio(fs, times["empty mode"]),
            "fcm_vs_empty": median_ratio(times["FlopCounterMode"], times["empty mode"])}


def run_7b(quick: bool, reps: int, threads: int | None, config: dict[str, int] | None = None, n: int | None = None,
           side_reps: int = 5) -> dict[str, Any]:
    spec = {
        "config": config or (LLAMA_7B_QUICK if quick else LLAMA_7B),
        "n": n or (512 if quick else 2048),
        "reps": reps,
        "side_reps": side_reps,
        "threads": threads,
        "parent_rss_mib": _max_rss_mib(),
    }
    return _child("--child-7b", spec, "7B")


def _child(flag: str, spec: dict[str, Any], what: str) -> dict[str, Any]:
    """Run this script again as a child with ``flag`` and ``spec`` (JSON); its result
    (the last line it prints) with ``spec`` added."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, __file__, flag, json.dumps(spec)], env=env, capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{what} child process failed:\n{done.stderr[-4000:]}")
    return {**json.loads(done.stdout.strip().splitlines()[-1]), **spec}


def child_generation(spec: dict[str, Any]) -> dict[str, Any]:
    """Part 4, in a child: seconds to count the prompt's forward, the whole generation, and one decode step three
    ways (see the module docstring)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from flopscope.workloads.generation import greedy_decode
    from flopscope.workloads.generation_templates import count_generation

    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**spec["config"])).eval()
    ids = torch.zeros(1, spec["prompt"], dtype=torch.long)
    few = 5

    def blocked(new: int) -> flopscope.Profile:
        with flopscope.profiler(model, mode="fake") as prof:
            greedy_decode(model, ids, new)
        return prof.result

    def timed(call: Callable[[], Any]) -> tuple[float, Any]:
        gc.collect()
        start = time.perf_counter()
        out = call()
        return time.perf_counter() - start, out

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        flopscope.profile_generation(model, ids, 2)  # (warm: lazy imports, the fake kernels' caches)
        prefill_s, _ = timed(lambda: flopscope.profile(model, ids, mode="fake"))
        whole_s, whole = timed(lambda: flopscope.profile_generation(model, ids, spec["new"]))
        per_step = {}
        for name, count in (("profile_generation", lambda n: flopscope.profile_generation(model, ids, n)),
                            ("reuse=False", lambda n: flopscope.profile_generation(model, ids, n, reuse=False)),
                            ("profiler + greedy_decode", blocked)):
            one_s, _ = timed(lambda count=count: count(1))
            many_s, many = timed(lambda count=count: count(few))
            per_step[name] = ((many_s - one_s) / (few - 1), many.total())
        bare = bare_decode_steps(lambda: LlamaForCausalLM(LlamaConfig(**spec["config"])), spec["prompt"], few)
        # templates: a prefill and a decode step traced with a symbolic cache length (count_generation)
        templates: dict[int, list[float]] = {spec["new"]: [], LONG_GENERATION: []}
        totals = {}
        for _ in range(3):  # alternating, medians
            for new in templates:
                seconds, counted = timed(lambda new=new: count_generation(model, ids, new))
                seconds += timed(counted.total)[0]
                templates[new].append(seconds)
                totals[new] = counted.total()
    return {"bare_step_s": statistics.median(bare),
            "templates_s": {str(new): statistics.median(v) for new, v in templates.items()},
            "templates_same": totals[spec["new"]] == whole.total(),
            "prefill_s": prefill_s, "whole_s": whole_s, "steps": whole.module_calls()[""], "per_step": per_step,
            "same": len({total for _, total in per_step.values()}) == 1,
            "replayed": [note for note in whole.notes if "replayed" in note]}


def run_generation(quick: bool, new: int, threads: int | None) -> dict[str, Any]:
    spec = {"config": LLAMA_7B_QUICK if quick else LLAMA_7B, "prompt": 64 if quick else 512,
            "new": 8 if quick else new, "threads": threads}
    return _child("--child-generation", spec, "generation")


def child_deepseek(spec: dict[str, Any]) -> dict[str, Any]:
    """Part 5, in a child: seconds of the first count of DeepSeek-V3 on meta, then the median of three more."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    config = DeepseekV3Config(**({"num_hidden_layers": 4} if spec["quick"] else {}))
    with torch.device("meta"):
        model = DeepseekV3ForCausalLM(config).eval()
    ids = torch.zeros(1, spec["n"], dtype=torch.long)
    seconds, totals = [], set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(4):
            gc.collect()
            start = time.perf_counter()
            totals.add(flopscope.profile(model, ids).total())
            seconds.append(time.perf_counter() - start)
    return {"first_s": seconds[0], "median_s": statistics.median(seconds[1:]), "macs": totals.pop(),
            "same": len(totals) == 0, "layers": config.num_hidden_layers}


def run_deepseek(quick: bool, threads: int | None) -> dict[str, Any]:
    spec = {"n": 2048, "quick": quick, "threads": threads}
    return _child("--child-deepseek", spec, "DeepSeek-V3")


# -------------------------------------------------------------------------------------------------
def table(rows: list[list[Any]], headers: list[str]) -> str:
    try:
        from tabulate import tabulate
    except ImportError:
        widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows, strict=True)]
        return "\n".join("  ".join(str(x).rjust(w) for x, w in zip(r, widths, strict=True)) for r in [headers, *rows])
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--reps", type=int, default=None, help="timed repetitions per model (default 7; quick 3)")
    parser.add_argument("--warmup", type=int, default=None, help="discarded rounds first (default 2; quick 1)")
    parser.add_argument("--reps-7b", type=int, default=3, help="timed fake-mode counts of the 7B shape (default 3)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: 2-layer BERT/GPT-2, 1-layer Llama, n=32; 2-layer 7B shape at n=512",
    )
    parser.add_argument("--skip-7b", action="store_true", help="only part 1")
    parser.add_argument("--device", default="cpu", help="part 1's device (cuda: each time ends with a synchronize)")
    parser.add_argument("--dtype", default="float32", help="part 1's parameter dtype (bfloat16, ...)")
    parser.add_argument("--new", type=int, default=256, help="part 4: new tokens of the 7B generation (default 256)")
    parser.add_argument("--skip-generation", action="store_true", help="no part 4")
    parser.add_argument("--child-7b", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-generation", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-deepseek", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child_7b is not None:
        print(json.dumps(child_7b(json.loads(args.child_7b))))
        return
    if args.child_generation is not None:
        print(json.dumps(child_generation(json.loads(args.child_generation))))
        return
    if args.child_deepseek is not None:
        print(json.dumps(child_deepseek(json.loads(args.child_deepseek))))
        return

    if args.threads:
        torch.set_num_threads(args.threads)
    reps = args.reps or (3 if args.quick else 7)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    # Part 2 runs first, while this process is still small: a child's ru_maxrss starts at its parent's
    # RSS (the kernel carries the forked image's high-water mark across exec).
    big = None if args.skip_7b else run_7b(args.quick, args.reps_7b, args.threads, side_reps=3 if args.quick else 5)
    huge = None if args.skip_7b or args.quick else run_7b(False, 1, args.threads, LLAMA_70B, 4096, side_reps=0)
    generation = None if args.skip_generation else run_generation(args.quick, args.new, args.threads)
    deepseek = None if args.skip_7b else run_deepseek(args.quick, args.threads)
    import transformers

    print(
        f"flopscope {flopscope.__version__}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"python {platform.python_version()}, {torch.get_num_threads()} torch threads, {os.cpu_count()} CPUs; "
        f"{reps} reps after {warmup} warm-up{'s' if warmup != 1 else ''}{' (quick)' if args.quick else ''}"
    )

    rows = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for label, model, n in small_models(args.quick):
            ids = torch.randint(0, 1000, (1, n), device=args.device)
            r = time_model(model.to(args.device, getattr(torch, args.dtype)), ids, reps, warmup)
            same = "=" if r["fs_macs"] == r["fs_fake_macs"] else "!= fake"
            rows.append(
                [
                    label,
                    n,
                    f"{r['plain_ms']:.1f}",
                    f"{r['ratio']['empty mode']:.2f}",
                    f"{r['ratio']['flopscope real']:.2f}",
                    f"{r['real_vs_empty']:.2f}",
                    f"{r['floors_vs_empty']['op recorder']:.2f}",
                    f"{r['floors_vs_empty']['dataflow recorder']:.2f}",
                    f"{r['ratio']['FlopCounterMode']:.2f}",
                    f"{r['ratio']['flopscope fake']:.2f}",
                    r["ops"],
                    f"{r['us_per_op']:.0f}",
                    f"{r['fs_macs']:,} {same}",
                    r["fcm"],
                ]
            )
            del model
    device = torch.device(args.device)
    where = f"{device} ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else device.type.upper()
    print(f"\nPart 1: {where} forward, {args.dtype}, batch 1, eval, no_grad  (x plain = median of per-rep time "
          "ratios)")
    print(
        table(
            rows,
            [
                "model",
                "n",
                "plain ms",
                "empty mode x",
                "fs real x",
                f"fs real / empty (target <= {TARGETS['real_vs_empty']})",
                "op rec. / empty",
                "dataflow / empty",
                "FCM x",
                "fs fake x",
                "ops",
                "fs us/op",
                "flopscope MACs (real = fake)",
                "FCM MACs (FLOPs/2)",
            ],
        )
    )
    messages = sorted({str(w.message) for w in caught})

    if big is not None:
        r = big
        label = f"Llama-7B shape{' (2 layers, quick)' if args.quick else ''}"
        print(f"\nPart 2: {label} on meta, ids (1, {r['n']}), flopscope.profile(mode='fake'), fresh subprocess")
        check = f"{'==' if r['macs'] == r['expected'] else '!='} analytic {r['expected']:,}"
        if r["config"] == LLAMA_7B and r["n"] == 2048:
            check += f" ({'matches' if r['macs'] == LLAMA_7B_MACS else 'DIFFERS from'} 14,362,370,637,824)"
        hwm = "n/a" if r["hwm_growth_mib"] is None else f"+{r['hwm_growth_mib']:.0f}"
        print(
            table(
                [
                    [
                        f"{r['first_s']:.2f}",
                        f"{r['median_s']:.2f}",
                        r["ops"],
                        f"{r['rss_built_mib']:.0f}",
                        f"+{r['rss_growth_first_mib']:.0f}",
                        f"+{r['rss_growth_all_mib']:.0f}",
                        hwm,
                        f"{r['tracemalloc_peak_mib']:.1f}",
                    ]
                ],
                [
                    "first s",
                    f"median s ({r['reps']})",
                    "ops",
                    "maxrss built MiB",
                    "maxrss +1st",
                    "maxrss +all",
                    "VmHWM +1st",
                    "tracemalloc peak MiB",
                ],
            )
        )
        print(f"MACs: {r['macs']:,} {check}")
        side = r["side"]
        print(f"side by side, medians of {r['side_reps']} rounds: plain meta forward {side['plain']:.3f} s, "
              f"FlopCounterMode {side['FlopCounterMode']:.3f} s, flopscope count + by_role() "
              f"{side['flopscope + roles']:.3f} s: {side['vs_fcm']:.2f}x FlopCounterMode (target <= "
              f"{TARGETS['7b_vs_fcm']}), {side['vs_plain']:.2f}x plain (target <= {TARGETS['7b_vs_plain']})")
        print(f"against the floor, the meta forward under an empty dispatch mode ({side['empty mode']:.3f} s): "
              f"flopscope count {side['flopscope']:.3f} s, {side['count_vs_empty']:.2f}x (target <= "
              f"{TARGETS['7b_count_vs_empty']}); with by_role() {side['roles_vs_empty']:.2f}x (target <= "
              f"{TARGETS['7b_roles_vs_empty']}); FlopCounterMode {side['fcm_vs_empty']:.2f}x")
    if huge is not None:
        r = huge
        hwm = float("nan") if r["hwm_growth_mib"] is None else r["hwm_growth_mib"]
        print(f"\nPart 3: Llama-70B shape (80 layers, d 8192, GQA 64/8, d_ff 28672) on meta, ids (1, {r['n']}): first "
              f"count {r['first_s']:.2f} s, then {r['median_s']:.2f} s (target < {TARGETS['70b_s']} s); memory the "
              f"first count needed (VmHWM growth) {hwm:.0f} MiB (target < {TARGETS['70b_mib']} MiB); MACs "
              f"{r['macs']:,} {'==' if r['macs'] == r['expected'] else '!='} analytic {r['expected']:,}")
        messages += r["warnings"]
        if r["inherited"]:
            print("caution: the child's ru_maxrss baseline is its parent's RSS, so the maxrss growth is understated")
        messages += r["warnings"]
    if generation is not None:
        r = generation
        label = "Llama-7B shape" + (" (2 layers, quick)" if args.quick else "")
        print(f"\nPart 4: generation, {label} on meta, a prompt of {r['prompt']}, {r['new']} new tokens: the prompt's "
              f"forward counted in {r['prefill_s']:.2f} s (flopscope.profile), the generation ({r['steps']} steps) in "
              f"{r['whole_s']:.2f} s (flopscope.profile_generation), {r['whole_s'] / r['prefill_s']:.1f}x (target <= "
              f"{TARGETS['generation_vs_prefill']}); {'; '.join(r['replayed'])}")
        print("one decode step counted by " + ", ".join(
            f"{name} {seconds:.3f} s" for name, (seconds, _) in r["per_step"].items())
              + f" (the same total each: {r['same']})")
        short, long = (r["templates_s"][str(new)] for new in (r["new"], LONG_GENERATION))
        print(f"from templates (flopscope.count_generation, total(): a prefill and a decode step traced with a "
              f"symbolic cache length, medians of 3 alternating): {r['new']} new tokens {short:.2f} s, "
              f"{short / r['prefill_s']:.1f}x the prompt's count (target <= {TARGETS['generation_vs_prefill']}), "
              f"the total of profile_generation's: {r['templates_same']}; {LONG_GENERATION:,} new tokens "
              f"{long:.2f} s, {long / short:.2f}x the {r['new']} count (target <= {TARGETS['long_vs_short']})")
        budget = (TARGETS["generation_vs_prefill"] - 1) * r["prefill_s"] / max(1, r["steps"] - 1)
        print(f"the floor of a count that runs each step: one decode step on fake tensors, nothing recorded "
              f"(floors.bare_decode_steps), {r['bare_step_s']:.3f} s, against the target's budget of "
              f"{budget * 1e3:.2f} ms a step ({r['bare_step_s'] / budget:.0f}x)")
    if deepseek is not None:
        r = deepseek
        print(f"\nPart 5: DeepSeek-V3 on meta ({r['layers']} layers{', quick' if r['quick'] else ''}), ids (1, "
              f"{r['n']}), flopscope.profile(...).total(), fresh subprocess: first count {r['first_s']:.2f} s, then "
              f"{r['median_s']:.2f} s (target < {TARGETS['deepseek_s']} s); {r['macs']:,} MACs"
              f"{'' if r['same'] else ' (DIFFERENT totals between counts)'}")
    for message in sorted(set(messages)):
        print(f"warning seen: {message}")


if __name__ == "__main__":
    main()
