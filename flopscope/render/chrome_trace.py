"""A capture as a trace (the trace-event JSON that Perfetto, ``chrome://tracing`` and
TensorBoard open), from its records and roles (:meth:`Profile.export_chrome_trace`
and :func:`flopscope.trace.merge_torch_trace` call it).

Two processes in the trace:

- **ops by role** (pid 1): one track (thread) per role, plus ``no_multiply`` for the ops
  that do not multiply; each op is a complete event (``"ph": "X"``) on the track of the
  role with most of its MACs;
- **module calls** (pid 2): one track, each call of a module a begin / end pair (``"B"``
  / ``"E"``), nested as the calls were (forward calls: backward ops are on the role
  tracks only).

Every event's ``args`` carry what flopscope knows: op, module path, roles (``{role:
MACs}``), ``macs``, ``flops`` (2 x MACs), ``bytes`` moved, input shapes, phase; a module
call's carry its MACs and FLOPs (inclusive).

:func:`merge_torch_trace` instead lays role ranges over a ``torch.profiler`` trace of
the same run, on torch's own clock.

Time: in real mode each op sits where it ran (its measured start and wall time,
microseconds from the first op). In fake mode nothing ran: ops are laid end to end in
execution order, each lasting its roofline time on the device given (``max(FLOPs / peak,
bytes / bandwidth)``, :mod:`flopscope.roofline`), or 1 µs each without one (order only,
said in the trace's metadata).
"""

from __future__ import annotations

import json
import operator
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..attribute.roles import Assignment
from ..capture.records import FORWARD, CapturedOp
from ..formulas.elementwise import ZERO_COST_NAMESPACES
from ..role import NO_MULTIPLY
from .files import write_atomically

OPS, MODULES = 1, 2  # pids


def chrome_trace(records: Sequence[CapturedOp], assignments: Mapping[CapturedOp, Assignment],
                 mode: str,
                 total_macs: int, *,
                 peak: float | None = None, bandwidth: float | None = None) -> dict[str, Any]:
    """The trace of a capture as a dict (see the module docstring): its records (in
    order) and their roles, the ``mode`` it ran in and its total MACs. ``peak``
    (FLOP/s) and ``bandwidth`` (bytes/s) time a fake-mode capture's ops by the
    roofline."""
    ops: list[tuple[CapturedOp, Mapping[str, int]]] = []
    for op in records:
        if not _model_op(op):
            continue
        assignment = assignments.get(op)
        ops.append((op, assignment.parts if assignment is not None else {}))
    timed = mode == "real" and all(op.started is not None and op.seconds is not None for op, _ in ops)
    spans = _timeline(ops, timed, peak, bandwidth)
    tracks: dict[str, int] = {}
    events: list[dict[str, Any]] = []
    for (op, parts), (start, duration) in zip(ops, spans, strict=True):
        role = max(parts, key=parts.__getitem__) if parts and any(parts.values()) else NO_MULTIPLY
        tid = tracks.setdefault(role, len(tracks) + 1)
        events.append({"name": op.op_name, "cat": "op", "ph": "X", "ts": start, "dur": duration,
                       "pid": OPS,
                       "tid": tid, "args": {"op": op.op_name, "module": op.module or "",
                                            "role": role,
                                            "roles": dict(parts), "macs": op.macs,
                                            "flops": 2 * op.macs,
                                            "bytes": op.bytes,
                                            "input_shapes": [list(s) for s in op.input_shapes],
                                            "phase": op.phase}})
    events += _module_events(ops, spans)
    names = [{"name": "process_name", "ph": "M", "pid": OPS, "tid": 0,
              "args": {"name": "ops by role"}},
             {"name": "process_name", "ph": "M", "pid": MODULES, "tid": 0,
              "args": {"name": "module calls"}},
             {"name": "thread_name", "ph": "M", "pid": MODULES, "tid": 0,
              "args": {"name": "calls"}}]
    names += [{"name": "thread_name", "ph": "M", "pid": OPS, "tid": tid, "args": {"name": role}}
              for role, tid in tracks.items()]
    clock = ("measured" if timed else "roofline estimate" if peak and bandwidth else
             "order only: 1 us per op (pass peak= and bandwidth= for roofline times)")
    return {"traceEvents": names + events, "displayTimeUnit": "ns",
            "otherData": {"producer": "flopscope", "mode": mode, "time": clock,
                          "units": "MACs; FLOPs = 2 x MACs",
                          "total_macs": total_macs}}


def export_chrome_trace(path: str | Path, trace: Mapping[str, Any]) -> Path:
    """Write ``trace`` (:func:`chrome_trace`) to ``path`` (JSON), atomically: a path
    that cannot be written raises a :class:`~flopscope.errors.FlopscopeError` naming it,
    and leaves any file already there as it was."""
    return write_atomically(path, json.dumps(trace), "the trace")


def _timeline(ops: list[tuple[CapturedOp, Mapping[str, int]]], timed: bool, peak: float | None,
              bandwidth: float | None) -> list[tuple[float, float]]:
    """(start, duration) of each op in microseconds."""
    if timed:
        origin = min((op.started or 0.0) for op, _ in ops) if ops else 0.0
        return [(((op.started or 0.0) - origin) * 1e6, (op.seconds or 0.0) * 1e6) for op, _ in ops]
    spans, now = [], 0.0
    for op, _ in ops:
        duration = max(2 * op.macs / peak, op.bytes / bandwidth) * 1e6 if peak and bandwidth else 1.0
        spans.append((now, duration))
        now += duration
    return spans


def _module_events(ops: list[tuple[CapturedOp, Mapping[str, int]]],
                   spans: list[tuple[float, float]]) -> list[dict[str, Any]]:
    """A begin / end pair per module call, spanning its ops, nested as the calls were."""
    extent: dict[Any, list[float]] = {}
    macs: dict[Any, int] = {}
    order: list[Any] = []
    for (op, _), (start, duration) in zip(ops, spans, strict=True):
        # backward ops carry their forward op's module stack: no span of their own
        if op.phase != FORWARD:
            continue
        for depth in range(len(op.module_stack)):
            key = op.module_stack[: depth + 1]
            if key not in extent:
                extent[key] = [start, start + duration]
                macs[key] = 0
                order.append(key)
            extent[key][0] = min(extent[key][0], start)
            extent[key][1] = max(extent[key][1], start + duration)
            macs[key] += op.macs
    events: list[dict[str, Any]] = []
    stack: list[Any] = []

    def close_until(key: Any) -> None:
        while stack and stack[-1] != key[: len(stack[-1])]:
            done = stack.pop()
            events.append({"name": _label(done), "cat": "module", "ph": "E", "ts": extent[done][1],
                           "pid": MODULES,
                           "tid": 0})

    for key in sorted(order, key=lambda k: (extent[k][0], len(k))):
        close_until(key)
        stack.append(key)
        frame = key[-1]
        events.append({"name": _label(key), "cat": "module", "ph": "B", "ts": extent[key][0],
                       "pid": MODULES,
                       "tid": 0, "args": {"module": frame.path, "call": frame.call,
                                          "macs": macs[key],
                                          "flops": 2 * macs[key]}})
    close_until(())
    return events


def _label(key: Any) -> str:
    frame = key[-1]
    return frame.path or "(root)"


def merge_torch_trace(torch_trace: Mapping[str, Any] | str | Path, records: Sequence[CapturedOp],
                      assignments: Mapping[CapturedOp, Assignment],
                      total_macs: int) -> dict[str, Any]:
    """``torch_trace`` with a process of role ranges laid over its ATen events, from a
    capture's records (in order), their ``{record: Assignment}`` and total MACs (what
    :func:`flopscope.trace.merge_torch_trace` says)."""
    doc = json.loads(Path(torch_trace).read_text()) if isinstance(torch_trace, (str, Path)) else dict(torch_trace)
    cpu = sorted((e for e in doc.get("traceEvents", []) if e.get("ph") == "X" and e.get("cat") == "cpu_op"),
                 key=lambda e: float(e["ts"]))
    theirs = _dispatched(cpu)
    ours = [op for op in records if _model_op(op)]
    pid = 1 + max((e["pid"] for e in doc.get("traceEvents", []) if isinstance(e.get("pid"), int)),
                  default=0)
    tracks: dict[str, int] = {}
    added: list[dict[str, Any]] = []
    matched, j = 0, 0
    # ops torch lists no event of their own for (autograd's detach)
    unmatched: Counter[str] = Counter()
    for op in ours:
        # the next of torch's dispatched ops with this op's name, looking a few ahead
        # (ops the mode passed on without recording, such as size queries, sit between)
        found = next((k for k in range(j, min(j + _LOOKAHEAD, len(theirs))) if theirs[k]["name"] == f"aten::{op.name}"),
                     None)
        if found is None:
            unmatched[op.op_name] += 1
            continue
        event, j = theirs[found], found + 1
        matched += 1
        assignment = assignments.get(op)
        parts = dict(assignment.parts) if assignment is not None else {}
        role = max(parts, key=parts.__getitem__) if parts and any(parts.values()) else NO_MULTIPLY
        tid = tracks.setdefault(role, len(tracks) + 1)
        added.append({"name": role, "cat": "flopscope", "ph": "X", "ts": float(event["ts"]),
                      "dur": float(event.get("dur", 0)), "pid": pid, "tid": tid,
                      "args": {"op": op.op_name, "module": op.module or "", "roles": parts,
                               "macs": op.macs,
                               "flops": 2 * op.macs, "bytes": op.bytes}})
    names = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
              "args": {"name": "flopscope roles"}}]
    names += [{"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": role}}
              for role, tid in tracks.items()]
    other = dict(doc.get("otherData", {}))
    other["flopscope"] = {"matched_ops": matched, "recorded_ops": len(ours),
                          "unmatched": dict(unmatched),
                          "total_macs": total_macs}
    return {**doc, "traceEvents": [*doc.get("traceEvents", []), *names, *added], "otherData": other}


_LOOKAHEAD = 16


def _model_op(op: CapturedOp) -> bool:
    """An op the model ran: not a tuple index of the graph, nor the bookkeeping of a
    ``record_function`` range (``profiler(trace=True)`` opens one per module call;
    the ``profiler`` namespace does no arithmetic)."""
    return (op.node_op == "call_function" and op.target is not operator.getitem
            and op.op_name.split(".")[0] not in ZERO_COST_NAMESPACES)


def _dispatched(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """torch's events of the ATen ops that went through a Python dispatch mode
    (flopscope's): an ``aten::`` event whose first nested event is
    ``PythonDispatchMode``. An older torch's trace has no such events: there the
    first nested event is the op's own again (the call the mode made)."""
    marker = "PythonDispatchMode" if any(e["name"] == "PythonDispatchMode" for e in events) else None
    out = []
    for k, event in enumerate(events[:-1]):
        following = events[k + 1]
        inside = float(following["ts"]) <= float(event["ts"]) + float(event.get("dur", 0))
        if event["name"].startswith("aten::") and following["name"] == (marker or event["name"]) and inside:
            out.append(event)
    return out
