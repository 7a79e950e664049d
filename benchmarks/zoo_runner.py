"""What the two zoo sweeps share: ``benchmarks/zoo.py`` (Hugging Face) and ``benchmarks/timm_zoo.py`` (timm).

- one model's counts: flopscope (``profile_record``), the reference ``FlopCounterMode`` (``reference``) in
  the eager configuration (``eager_context``), under a per-model alarm (``guarded``);
- the sweep (``sweep``): ``jobs`` worker processes forked from a warmed-up parent, each retired after a few
  tasks or one that timed out or crashed; one that does not answer within the timeout + 30 s is killed;
  results in task order;
- the grouping and report helpers (``summarize``, ``group_lines``, ``op_diff``, ...) and the shared
  command-line options (``add_common_arguments``).

A task is a ``(name, detail)`` pair: ``(model_type, class)`` in the Hugging Face zoo, ``(model, family)`` in
timm's; each sweep's run function returns a record keyed by its own ``names`` (``("arch", "class")``,
``("model", "family")``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import re
import signal
import sys
import time
import traceback
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from multiprocessing.connection import wait as mp_wait
from pathlib import Path
from typing import Any

HARD_TIMEOUT_GRACE = 30  # seconds a task's process gets past --timeout before the driver kills it


# --------------------------------------------------------------------------------------------------
# one model (runs in its own process)
# --------------------------------------------------------------------------------------------------
class StageTimeoutError(BaseException):
    """The per-model alarm: a ``BaseException`` (like ``KeyboardInterrupt``), so that the ``except Exception``
    clauses of the sweep, the model and flopscope let it through to ``guarded``."""


def _alarm(signum: int, frame: Any) -> None:
    raise StageTimeoutError("timed out")


def short(e: BaseException, limit: int = 300) -> str:
    text = f"{type(e).__name__}: {str(e).strip()}"
    text = text.splitlines()[0] if text else type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


@contextlib.contextmanager
def guarded(res: dict[str, Any], timeout: int, timeout_reason: Callable[[dict[str, Any]], str]) -> Iterator[None]:
    """Run the block under ``signal.alarm(timeout)``: a timeout sets ``res["status"] = "timeout"`` with
    ``timeout_reason(res)``, any other exception ``"crash"`` with the traceback; ``res["seconds"]`` always."""
    t0 = time.time()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout)
    try:
        yield
    except StageTimeoutError:
        res["status"] = "timeout"
        res["reason"] = timeout_reason(res)
    except BaseException as e:
        res["status"] = "crash"
        res["reason"] = short(e, 300)
        res["traceback"] = traceback.format_exc()[-1500:]
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
        res["seconds"] = round(time.time() - t0, 2)


def profile_record(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], grad: bool,
                   res: dict[str, Any], key: str) -> dict[str, Any]:
    """flopscope's count (``mode="auto"``), filled into ``res[key]`` as it goes (a timeout keeps what was
    reached) and ``res["stage"]`` naming the step being run: MACs, by op, by role, unsupported ops (with one
    call's input shapes each), notes, the real-mode fallback's reason, or the error."""
    import torch

    import flopscope
    res[key] = out = {}
    res["stage"] = f"{key}: profile"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            torch.manual_seed(0)
            with torch.set_grad_enabled(grad):
                prof = flopscope.profile(model, *args, mode="auto", **kwargs)
        except flopscope.FlopscopeError as e:
            out["error"] = short(e, 400)
            out["error_type"] = type(e).__name__
            cause = e.__cause__
            out["error_cause"] = short(cause, 200) if cause is not None else None
            return out
        except Exception as e:  # not a FlopscopeError: a bug in flopscope (or the model)
            out["error"] = "non-flopscope " + short(e, 400)
            out["error_type"] = type(e).__name__
            out["traceback"] = traceback.format_exc()[-1500:]
            return out
    out["macs"] = prof.total()
    out["mode"] = prof.mode
    out["by_op"] = prof.by_op()
    res["stage"] = f"{key}: by_role"
    by_role = prof.by_role()
    out["by_role"] = by_role
    out["roles_sum_ok"] = sum(by_role.values()) == out["macs"]
    out["attention"] = by_role.get("attn_scores", 0) > 0
    out["unsupported"] = prof.unsupported()
    shapes: dict[str, list[Any]] = {}
    for node in prof.graph.nodes:  # one example call of each unsupported op, with its input shapes
        if node.meta.get("cost") == "unsupported":
            name = str(getattr(node.target, "overloadpacket", node.target))
            shapes.setdefault(name, [list(s) for s in node.meta.get("input_shapes", ())][:4])
    out["unsupported_shapes"] = shapes
    out["notes"] = prof.notes
    fell_back = [str(w.message) for w in caught
                 if issubclass(w.category, flopscope.FlopscopeWarning) and "real mode" in str(w.message)]
    out["fallback"] = fell_back[0] if fell_back else None
    res["stage"] = f"{key}: done"
    return out


def invariants_record(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], res: dict[str, Any]) -> None:
    """``check_invariants`` on the model as built (under ``no_grad``): ``res["invariants"]``
    maps each invariant to ``"ok"``, ``"violated: ..."`` or ``"skipped: ..."``; ``res["signature"]`` holds the
    total and roles of each mode counted, for the comparison with a run under another ``PYTHONHASHSEED``
    (:func:`hash_seed_lines`)."""
    from flopscope.testing.invariants import INVARIANTS, check_invariants

    res["stage"] = "invariants"
    try:
        report = check_invariants(model, *args, **kwargs)
    except Exception as e:  # a bug of the checks themselves: a violation to look at
        res["invariants"] = {"checks": f"violated: the checks raised {short(e, 300)}"}
        res["invariants_traceback"] = traceback.format_exc()[-1500:]
        return
    res["invariants"] = {name: report.status(name) for name in INVARIANTS}
    res["signature"] = {label: {"total": c.total, "roles": c.roles} for label, c in report.counts.items()}
    res["hash_seed"] = os.environ.get("PYTHONHASHSEED", "random")


def add_against_argument(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--against", help="the --json of a run under another PYTHONHASHSEED: the invariant 'hash seed' "
                                      "compares each architecture's totals and roles with it")


def compare_runs(results: list[dict[str, Any]], against: str | None, name: str) -> None:
    """Fill each result's ``invariants["hash seed"]`` from the run in ``against`` (the same counts, mode by mode)."""
    if not against:
        return
    other = {r[name]: r for r in json.loads(Path(against).read_text())}
    for r in results:
        mine, theirs = r.get("signature"), other.get(r[name], {}).get("signature")
        if mine is None or theirs is None:
            continue
        seeds = f"PYTHONHASHSEED {r.get('hash_seed')} vs {other[r[name]].get('hash_seed')}"
        differing = [label for label in mine if label in theirs and mine[label] != theirs[label]]
        r["invariants"]["hash seed"] = (f"violated: {', '.join(differing)} differ ({seeds})" if differing
                                        else f"ok ({seeds})")


def invariant_lines(results: list[dict[str, Any]], name: str) -> list[str]:
    """The report's invariant section: per invariant, how many hold, are violated, are skipped; each violation by
    architecture."""
    checked = [r for r in results if r.get("invariants")]
    names: dict[str, None] = {}
    for r in checked:
        names.update(dict.fromkeys(r["invariants"]))
    lines = ["## Invariants", "", f"Checked on {len(checked)} of {len(results)} "
             "(`check_invariants`: repeat, modes = fake / real / meta, attention = eager / SDPA, "
             "forward after = before, caches hold no fake tensor; hash seed = against another run's JSON).", "",
             "| invariant | ok | violated | skipped |", "|---|---|---|---|"]
    for inv in names:
        states = [r["invariants"].get(inv, "") for r in checked]
        counts = [sum(s.startswith(kind) for s in states) for kind in ("ok", "violated", "skipped")]
        lines.append(f"| {inv} | " + " | ".join(map(str, counts)) + " |")
    violations = [(r[name], inv, state) for r in checked for inv, state in r["invariants"].items()
                  if state.startswith("violated")]
    lines += ["", "### Violations", ""]
    lines += [f"- **{who}** {inv}: {cell(state[len('violated: '):])}" for who, inv, state in violations] or ["(none)"]
    return [*lines, ""]


def reference(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``FlopCounterMode``'s total // 2 and per-op MACs, grad on (falls back to ``no_grad``, with a note)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    note = None
    for grad in (True, False):  # grad on keeps fused inference fast paths off; some models only run without
        fc = FlopCounterMode(display=False)
        torch.manual_seed(0)
        try:
            with torch.set_grad_enabled(grad), fc:
                model(*args, **kwargs)
            break
        except Exception as e:
            if not grad:
                raise
            note = f"ran under no_grad (with grad: {short(e, 150)})"
    counts = fc.get_flop_counts().get("Global", {})
    return {"macs": fc.get_total_flops() // 2, "by_op": {str(k): v // 2 for k, v in counts.items()}, "note": note}


def eager_context() -> Any:
    """SDPA's math kernel and oneDNN off: the unfused paths the reference counts."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    stack = contextlib.ExitStack()
    stack.enter_context(sdpa_kernel(SDPBackend.MATH))
    stack.enter_context(torch.backends.mkldnn.flags(enabled=False))
    return stack


# --------------------------------------------------------------------------------------------------
# the sweep
# --------------------------------------------------------------------------------------------------
def _worker(conn: Any, run: Callable[..., dict[str, Any]], names: tuple[str, str], threads: int,
            tasks_per_process: int) -> None:
    import torch
    torch.set_num_threads(threads)
    for _ in range(tasks_per_process):
        task = conn.recv()
        res = run(*task)
        try:
            conn.send(res)
        except Exception as e:  # unpicklable result: keep the essentials
            conn.send({names[0]: task[0], names[1]: task[1], "status": "crash",
                       "reason": f"result not sendable: {e}"})
        if res.get("status") in LEAVES_STATE:
            return


LEAVES_STATE = ("timeout", "crash")  # a task cut short by the alarm or an exception: its process is retired


def sweep(tasks: list[tuple[str, str]], jobs: int, run: Callable[..., dict[str, Any]], timeout: int,
          names: tuple[str, str], progress: Callable[[dict[str, Any]], str] | None = None,
          warm_up: Callable[[], Any] | None = None, tasks_per_process: int = 20) -> list[dict[str, Any]]:
    """``run(*task)`` for every task in ``jobs`` processes forked from this one (``run`` need not pickle), each
    retired after ``tasks_per_process`` tasks or a task that timed out or crashed, and replaced by a fresh fork;
    ``progress(res)`` is the text printed after each record's counter. Results in task order.

    A worker that took every task one after another slowed down: after a task cut short by the alarm (a
    dispatch mode or hooks left behind) and with gigabytes of heap, the same reference count ran 10-30x slower
    late in a sweep, and some later tasks crashed. ``warm_up()`` runs here first, so that what every task
    imports and initialises is done once and inherited by each fork."""
    import gc
    import logging

    import torch
    ctx = mp.get_context("fork")
    threads = max(1, (os.cpu_count() or 1) // jobs)
    warnings.filterwarnings("ignore")  # here and, inherited, in every worker
    logging.disable(logging.WARNING)
    if warm_up is not None:
        previous = torch.get_num_threads()
        torch.set_num_threads(1)  # no OpenMP pool in the parent: the workers start their own
        warm_up()
        torch.set_num_threads(previous)
    gc.collect()
    gc.freeze()  # what the parent holds is never collected in the workers: no copy-on-write of it
    todo = list(tasks)
    results: list[dict[str, Any]] = []
    workers: dict[Any, dict[str, Any]] = {}
    retired: list[Any] = []

    def spawn() -> Any:
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_worker, args=(child, run, names, threads, tasks_per_process), daemon=True)
        p.start()
        child.close()
        workers[parent] = {"proc": p, "task": None, "start": 0.0, "done": 0}
        return parent

    def assign(conn: Any) -> None:
        task = todo.pop(0)
        workers[conn].update(task=task, start=time.time())
        conn.send(task)

    def retire(conn: Any) -> None:
        retired.append(workers.pop(conn)["proc"])
        conn.close()
        if todo:
            assign(spawn())

    def record(res: dict[str, Any]) -> None:
        results.append(res)
        if progress:
            print(f"[{len(results):4d}/{len(tasks)}] {progress(res)}", flush=True)

    def lost(w: dict[str, Any], status: str, reason: str, now: float) -> None:
        record({names[0]: w["task"][0], names[1]: w["task"][1], "status": status, "reason": reason,
                "seconds": round(now - w["start"], 2)})

    for _ in range(min(jobs, len(todo))):
        assign(spawn())
    while workers:
        for conn in mp_wait(list(workers), timeout=5):
            w = workers[conn]
            try:
                res = conn.recv()
            except (EOFError, OSError):
                w["proc"].join(1)
                lost(w, "crash", f"worker died (exit code {w['proc'].exitcode})", time.time())
                retire(conn)
                continue
            record(res)
            w["done"] += 1
            if w["done"] == tasks_per_process or res.get("status") in LEAVES_STATE or not todo:
                retire(conn)
            else:
                assign(conn)
        now = time.time()
        for conn, w in list(workers.items()):
            if now - w["start"] > timeout + HARD_TIMEOUT_GRACE:
                w["proc"].kill()
                lost(w, "timeout", f"hard timeout: worker killed after {timeout + HARD_TIMEOUT_GRACE} s", now)
                retire(conn)
        retired = [p for p in retired if p.is_alive()]  # reaped once they have exited
    for p in retired:
        p.join(5)
        if p.is_alive():
            p.kill()
    gc.unfreeze()
    order = {name: i for i, (name, _) in enumerate(tasks)}
    return sorted(results, key=lambda r: order.get(r[names[0]], 0))


# --------------------------------------------------------------------------------------------------
# grouping and report
# --------------------------------------------------------------------------------------------------
def norm(text: str) -> str:
    """A grouping key: numbers, shapes and quoted module paths blanked out."""
    text = re.sub(r"'[^']*'", "'…'", text)
    text = re.sub(r"\[[\d, ]*\]", "[…]", text)
    text = re.sub(r"(?<![A-Za-z_\d])\d+", "N", text)
    return text[:160]


def fallback_key(msg: str, normalize: bool = True) -> str:
    op = re.search(r"op (\S+)", msg)
    where = op.group(1) if op else "(no op: module-level)"
    reason = re.search(r"could not run on fake tensors \((.*)\); counted in real mode", msg)
    text = norm if normalize else (lambda t: t)
    return f"{where}: {text(reason.group(1)) if reason else text(msg)}"


def op_diff(a: dict[str, int], b: dict[str, int]) -> dict[str, tuple[int, int]]:
    return {op: (a.get(op, 0), b.get(op, 0)) for op in sorted(set(a) | set(b)) if a.get(op, 0) != b.get(op, 0)}


def fmt(n: Any) -> str:
    return f"{n:,}" if isinstance(n, int) else "–"


def diff_text(d: dict[str, tuple[int, int]], limit: int = 4) -> str:
    items = sorted(d.items(), key=lambda kv: -abs(kv[1][0] - kv[1][1]))[:limit]
    return "; ".join(f"{op} {fmt(x)} vs {fmt(y)}" for op, (x, y) in items)


def by_op_diff(a: dict[str, Any], b: dict[str, Any]) -> str:
    """The largest per-op differences between two counts (records with ``by_op``)."""
    return diff_text(op_diff(a.get("by_op", {}), b.get("by_op", {})))


def reference_blind(counted: dict[str, Any], ref: dict[str, Any]) -> dict[str, int] | None:
    """``{op: MACs}`` where ``counted`` (a flopscope record on the reference's own path: fs-eager) is above the
    reference only by ops that ``FlopCounterMode`` has no formula for (it counts them as 0); None when the two
    are equal or differ otherwise."""
    from torch.utils.flop_counter import flop_registry
    known = {str(op) for op in flop_registry}
    d = op_diff(counted.get("by_op", {}), ref.get("by_op", {}))
    if not d or any(op in known or theirs != 0 or ours <= 0 for op, (ours, theirs) in d.items()):
        return None
    return {op: ours for op, (ours, _) in d.items()}


def cell(x: Any) -> str:
    """Text for a markdown table cell."""
    return str(x).replace("|", "\\|").replace("\n", " ")


def ratio(r: dict[str, Any]) -> str:
    fs, ref = r.get("fs", {}), r.get("ref", {})
    return f"{fs['macs'] / ref['macs']:.4f}" if fs.get("macs") is not None and ref.get("macs") else "–"


def summarize(results: list[dict[str, Any]], name: str, errors_of_skips: bool = True) -> dict[str, Any]:
    """Status counts and, grouped, each architecture's unsupported ops, real-mode fallbacks, flopscope errors
    (also for skipped records unless ``errors_of_skips`` is off) and skip reasons; which architectures differ
    between fs-eager and the reference (formulas) and between flopscope and fs-eager (fused kernels); whose
    ``by_role()`` does not sum to ``total()``."""
    status = Counter(r["status"] for r in results)
    unsupported: dict[str, list[str]] = defaultdict(list)
    fallbacks: dict[str, list[str]] = defaultdict(list)
    errors: dict[str, list[str]] = defaultdict(list)
    skips: dict[str, list[str]] = defaultdict(list)
    formula_mismatch, fused_mismatch, roles_bad = [], [], []
    for r in results:
        a = r[name]
        if r["status"] in ("skip", "timeout", "crash"):
            skips[f"{r['status']}: {norm(r.get('reason', '?'))}"].append(a)
        for key in ("fs", "fs_eager"):
            p = r.get(key) or {}
            tag = "[default] " if key == "fs" else "[eager]   "
            for op in p.get("unsupported", {}):
                if a not in unsupported[op]:
                    unsupported[op].append(a)
            if p.get("fallback"):
                fallbacks[tag + fallback_key(p["fallback"])].append(a)
            if p.get("error") and (errors_of_skips or r["status"] != "skip"):
                errors[f"{tag}{p.get('error_type')}: {norm(p['error'])}"].append(a)
        fs, fe, ref = r.get("fs", {}), r.get("fs_eager", {}), r.get("ref", {})
        if "macs" in fs and not fs.get("roles_sum_ok", True):
            roles_bad.append(a)
        if "macs" in fe and "macs" in ref and fe["macs"] != ref["macs"]:
            formula_mismatch.append(a)
        if "macs" in fs and "macs" in fe and fs["macs"] != fe["macs"]:
            fused_mismatch.append(a)
    return {"status": dict(status), "unsupported": unsupported, "fallbacks": fallbacks, "errors": errors,
            "skips": skips, "formula_mismatch": formula_mismatch, "fused_mismatch": fused_mismatch,
            "roles_bad": roles_bad}


def group_lines(groups: dict[str, list[str]], limit: int = 6) -> list[str]:
    rows = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    out = []
    for key, archs in rows:
        more = f", … (+{len(archs) - limit})" if len(archs) > limit else ""
        out.append(f"{len(archs):4d}  {key}  [{', '.join(archs[:limit])}{more}]")
    return out


def group_sections(s: dict[str, Any], sections: tuple[tuple[str, str], ...]) -> list[str]:
    """The report's ``### title`` blocks of grouped lines, one per ``(title, key of s)``."""
    lines = []
    for title, key in sections:
        lines += [f"### {title}", "", "```"] + (group_lines(s[key]) or ["(none)"]) + ["```", ""]
    return lines


def print_groups(s: dict[str, Any], sections: tuple[tuple[str, str], ...]) -> None:
    for title, key in sections:
        print(f"\n{title}:")
        for line in group_lines(s[key]) or ["   (none)"]:
            print(line)


def status_line(results: list[dict[str, Any]], s: dict[str, Any], what: str, elapsed: float) -> str:
    return (f"{len(results)} {what} in {elapsed / 60:.1f} min: "
            + ", ".join(f"{k} {v}" for k, v in sorted(s["status"].items(), key=lambda kv: -kv[1])))


def add_common_arguments(ap: argparse.ArgumentParser, report: str, timeout: int, what: str) -> None:
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--report", default=report, help="markdown report path")
    ap.add_argument("--json", help="also write the raw results as JSON here")
    ap.add_argument("--timeout", type=int, default=timeout, help=f"seconds per {what} (default {timeout})")
    ap.add_argument("--quiet", action="store_true", help=f"no per-{what} progress lines")


def only(tasks: list[tuple[str, str]], names: str | None, what: str) -> list[tuple[str, str]]:
    """The tasks ``--only`` names (comma-separated, in that order), saying on stderr which ``what`` are unknown; all
    tasks without ``--only``."""
    if not names:
        return tasks
    wanted = [w.strip() for w in names.split(",") if w.strip()]
    known = dict(tasks)
    missing = [w for w in wanted if w not in known]
    if missing:
        print(f"unknown {what}: {', '.join(missing)}", file=sys.stderr)
    return [(w, known[w]) for w in wanted if w in known]
