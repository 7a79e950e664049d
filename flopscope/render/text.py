"""Pure renderers: a profile in, text out (never printing). Units are always named.

Tables go through ``tabulate`` (``tablefmt``: "simple", "github", "pipe" (markdown),
"html", ...); ``units`` is ``"macs"`` (multiply-accumulates) or ``"flops"`` (2 x MACs).
:func:`to_json` writes the versioned schema documented in :data:`JSON_SCHEMA`;
:func:`to_csv` one row per counted op.
"""

from __future__ import annotations

import csv
import io
import json
import platform
import sys
from typing import Any

from tabulate import tabulate

from ..attribute.paths import enclosing
from ..conventions import EXECUTED, check_attention
from ..errors import FlopscopeError
from ..predict.attention import notes as attention_notes
from ..version import __version__
from .module_stats import dominant_roles as module_dominant_roles
from .module_stats import params_inclusive
from .numbers import human
from .view import ProfileView

UNITS = {"macs": ("MAC", 1), "flops": ("FLOP", 2)}
JSON_SCHEMA = "flopscope.profile/1"
"""Schema of :func:`to_json` (version 1). Top-level keys:

- ``schema``: this string; ``units``: what ``macs`` / ``flops`` / ``elementwise_ops``
  mean;
- ``mode``: "fake" or "real"; ``totals``: ``{macs, flops, bytes, by_phase: {phase:
  macs}}``;
- ``bytes``: ``{role: bytes}`` (``bytes_by_role``; ``"no_multiply"`` for ops that do not
  multiply);
- ``steps``: one row per forward (``Step.row()``: phase, batch, tokens, context, macs,
  flops, bytes, ...);
- ``modules``: list of ``{path, type, calls, macs, flops, params, dominant_role}``
  (inclusive of submodules);
- ``roles``: ``{role: macs}``; ``blocks``: ``{block path: {role: macs}}``; ``ops``:
  ``{aten op: macs}``;
- ``elementwise``: ``{category: elementwise ops}``; ``unsupported``: ``{aten op:
  calls}``; ``notes``: [str];
- ``reconciliation``: list of ``{block, role, measured, predicted, ratio, term, useful,
  reason, basis}`` (``ratio`` as a string fraction, ``null`` where there is no
  prediction);
- ``attention``: ``{convention, macs, flops, roles, blocks, steps, notes}``: the
  attention core counted by the convention asked for (``"executed"``, ``"causal"`` or
  ``"mask"``, :mod:`flopscope.predict.attention`), with the totals, roles, blocks and
  steps that follow from it (``totals`` / ``roles`` / ``blocks`` / ``steps`` above stay
  executed work);
- ``environment``: ``{flopscope, torch, transformers, python, platform}``.
"""


def _unit(units: str) -> tuple[str, int]:
    if units not in UNITS:
        raise FlopscopeError(f"units must be 'macs' or 'flops'; got {units!r}")
    return UNITS[units]


def params_by_module(prof: ProfileView) -> dict[str, int]:
    """Parameters per module path, inclusive of submodules (shared parameters counted
    where declared)."""
    return params_inclusive(prof.facts.param_shapes)


def dominant_roles(prof: ProfileView) -> dict[str, str]:
    """Per module path, the role with most MACs among the ops it ran (inclusive; a
    container never called, such as a ``ModuleList``, of what its submodules ran)."""
    uncalled = prof.uncalled_modules()
    return module_dominant_roles((enclosing(record.module_stack, uncalled), record.roles) for record in prof.records)


def module_tree(prof: ProfileView, depth: int = 2, units: str = "macs",
                tablefmt: str = "simple") -> str:
    """The model's structure with MACs (or FLOPs), parameters, share and dominant role
    per module, down to ``depth`` levels below the root."""
    name, factor = _unit(units)
    total = prof.total() or 1
    params = params_by_module(prof)
    dominant = dominant_roles(prof)
    types = prof.facts.types
    rows = []
    for path, macs in prof.by_module().items():
        level = 0 if path == "" else path.count(".") + 1
        if level > depth:
            continue
        label = "(model)" if path == "" else "· " * level + path.rsplit(".", 1)[-1]
        rows.append([label, types[path].__name__ if path in types else "", f"{factor * macs:,}",
                     human(factor * macs, name), f"{params.get(path, 0):,}",
                     f"{100 * macs / total:.1f}%",
                     dominant.get(path, "")])
    return tabulate(rows, headers=["module", "type", f"{name}s", "", "params", "share",
                                   "dominant role"],
                    tablefmt=tablefmt,
                    colalign=("left", "left", "right", "right", "right", "right", "left"))


def op_table(prof: ProfileView, units: str = "macs", tablefmt: str = "simple") -> str:
    """Per ATen op, largest first, with the number of calls."""
    name, factor = _unit(units)
    total = prof.total() or 1
    calls = prof.op_calls()
    rows = [[op, calls[op], f"{factor * macs:,}", human(factor * macs, name),
             f"{100 * macs / total:.1f}%"]
            for op, macs in sorted(prof.by_op().items(), key=lambda kv: -kv[1])]
    return tabulate(rows, headers=["ATen op", "calls", f"{name}s", "", "share"], tablefmt=tablefmt,
                    colalign=("left", "right", "right", "right", "right"))


def where(paths: list[str], limit: int = 3) -> str:
    """Module paths summarised as patterns: ``layers.0.attn``, ``layers.1.attn`` ->
    ``layers.*.attn (x2)``."""
    patterns: dict[str, int] = {}
    for path in paths:
        pattern = ".".join("*" if part.isdigit() else part for part in path.split(".")) if path else "(model)"
        patterns[pattern] = patterns.get(pattern, 0) + 1
    shown = [f"{p} (x{n})" if n > 1 else p for p, n in list(patterns.items())[:limit]]
    more = len(patterns) - limit
    return ", ".join(shown) + (f", +{more} more" if more > 0 else "")


def role_table(prof: ProfileView, units: str = "macs", tablefmt: str = "simple",
               attention: str = EXECUTED) -> str:
    """Role | MACs | FLOPs | share of total | where (the blocks it occurs in); the
    attention core and the total priced by the ``attention`` convention
    (:mod:`flopscope.predict.attention`)."""
    total = prof.total(attention=attention) or 1
    blocks: dict[str, list[str]] = {}
    for block, roles in prof.by_block(attention=attention).items():
        for role, macs in roles.items():
            if macs:
                blocks.setdefault(role, []).append(block)
    first = "MACs" if units == "macs" else "FLOPs"
    _unit(units)
    rows = []
    for role, macs in prof.by_role(attention=attention).items():
        shown = macs if units == "macs" else 2 * macs
        other = human(2 * macs, "FLOP") if units == "macs" else human(macs, "MAC")
        rows.append([role, f"{shown:,}", other, f"{100 * macs / total:.1f}%",
                     where(blocks.get(role, []))])
    return tabulate(rows, headers=["role", first, "FLOPs" if units == "macs" else "MACs", "share",
                                   "where"],
                    tablefmt=tablefmt, colalign=("left", "right", "right", "right", "left"))


def unsupported_table(prof: ProfileView, tablefmt: str = "simple") -> str:
    rows = [[op, calls] for op, calls in sorted(prof.unsupported().items())]
    if not rows:
        return "unsupported ops: none"
    return "unsupported ops (no formula; they may do arithmetic that the total leaves out):\n" + tabulate(
        rows, headers=["ATen op", "calls"], tablefmt=tablefmt)


def summary(prof: ProfileView, depth: int = 2, units: str = "macs", tablefmt: str = "simple",
            reconciliation: bool = True, attention: str = EXECUTED) -> str:
    """Totals, roles, reconciliation, the module tree, ops, elementwise work and
    unsupported ops. ``attention``: the convention of the total and the role table
    (:mod:`flopscope.predict.attention`); the module tree, ops and reconciliation
    stay executed work."""
    macs, flops = prof.total(attention=attention), prof.total_flops(attention=attention)
    priced = "" if check_attention(attention) == EXECUTED else (
        f", attention core priced {attention!r} (executed: {prof.total():,} MACs; module tree and "
        "ops: executed)")
    lines = [
        f"total: {macs:,} MACs = {flops:,} FLOPs ({human(flops, 'FLOP')}; 1 MAC = 2 FLOPs), "
        f"counted in {prof.mode} mode{priced}",
        f"bytes moved at least: {prof.total_bytes():,} ({human(prof.total_bytes(), 'B')}; each "
        "tensor read and written once, see flopscope.formulas.traffic)",
    ]
    phases = prof.by_phase()
    if len(phases) > 1:
        lines.append("by phase: " + ", ".join(f"{k} {v:,} MACs" for k, v in phases.items()))
    lines += ["", role_table(prof, units, tablefmt, attention)]
    if reconciliation:
        result = prof.reconcile()
        if result.rows:
            exact = sum(r.exact for r in result.rows)
            lines += ["", f"reconciliation: {exact} of {len(result.rows)} rows exactly as predicted",
                      result.to_table(tablefmt)]
    lines += ["", module_tree(prof, depth, units, tablefmt), "", op_table(prof, units, tablefmt)]
    if prof.timed:
        lines += ["", "time per role (real mode; wall time of the ops that ran):",
                  prof.timing().to_table(tablefmt)]
    elementwise = prof.elementwise()
    if elementwise:
        parts = ", ".join(f"{k} {v:,}" for k, v in sorted(elementwise.items()))
        lines += ["", f"elementwise ops (not MACs, not in the total): {parts}"]
    lines += ["", unsupported_table(prof, tablefmt)]
    lines += [f"note: {note}" for note in [*prof.notes,
                                           *attention_notes(prof.attention_core(), attention)]]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# machine-readable
def to_dict(prof: ProfileView, reconciliation: bool = True,
            attention: str = EXECUTED) -> dict[str, Any]:
    """The JSON document of :data:`JSON_SCHEMA` as a dict; ``attention``: the convention
    of its ``attention`` section."""
    check_attention(attention)
    params = params_by_module(prof)
    dominant = dominant_roles(prof)
    calls = prof.module_calls()
    types = prof.facts.types
    doc: dict[str, Any] = {
        "schema": JSON_SCHEMA,
        "units": {"macs": "multiply-accumulates", "flops": "2 x macs",
                  "elementwise_ops": "see flopscope.formulas.elementwise (per-element conventions)"},
        "mode": prof.mode,
        "totals": {"macs": prof.total(), "flops": prof.total_flops(), "bytes": prof.total_bytes(),
                   "by_phase": prof.by_phase()},
        "bytes": prof.bytes_by_role(),
        "steps": [step.row() for step in prof.steps()],
        "modules": [{"path": path, "type": types[path].__name__ if path in types else None,
                     "calls": calls.get(path, 0), "macs": macs, "flops": 2 * macs,
                     "params": params.get(path, 0),
                     "dominant_role": dominant.get(path)} for path, macs in prof.by_module().items()],
        "roles": prof.by_role(),
        "blocks": prof.by_block(),
        "ops": prof.by_op(),
        "elementwise": prof.elementwise(),
        "unsupported": prof.unsupported(),
        "notes": prof.notes,
        "reconciliation": [],
        "attention": {"convention": attention, "macs": prof.total(attention=attention),
                      "flops": prof.total_flops(attention=attention),
                      "roles": prof.by_role(attention=attention),
                      "blocks": prof.by_block(attention=attention),
                      "steps": [step.row() for step in prof.steps(attention)],
                      "notes": attention_notes(prof.attention_core(), attention)},
        "environment": environment(),
    }
    if reconciliation:
        doc["reconciliation"] = [
            {"block": r.block, "role": r.role, "measured": r.measured, "predicted": r.predicted,
             "ratio": None if r.ratio is None else str(r.ratio), "term": r.term, "useful": r.useful,
             "reason": r.reason, "basis": r.basis} for r in prof.reconcile().rows]
    return doc


def to_json(prof: ProfileView, reconciliation: bool = True, indent: int | None = 2,
            attention: str = EXECUTED) -> str:
    return json.dumps(to_dict(prof, reconciliation, attention), indent=indent)


def to_csv(prof: ProfileView) -> str:
    """One row per counted op: phase, module, op, role split, MACs, FLOPs, input shapes."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["phase", "module", "call", "op", "role", "roles", "macs", "flops",
                     "input_shapes", "block"])
    for r in prof.records:
        roles = ";".join(f"{role}={macs}" for role, macs in r.roles.items())
        shapes = ";".join("x".join(str(s) for s in shape) for shape in r.input_shapes)
        writer.writerow([r.phase, r.module, r.call, r.op, r.role.value, roles, r.multiplies,
                         2 * r.multiplies,
                         shapes, r.block])
    return out.getvalue()


def environment() -> dict[str, str | None]:
    import torch

    try:
        import transformers

        hf: str | None = transformers.__version__
    except ImportError:
        hf = None
    return {"flopscope": __version__, "torch": torch.__version__, "transformers": hf,
            "python": sys.version.split()[0], "platform": platform.platform()}

