"""The roles yardstick of the zoo sweeps (issue 47): the roles that must balance in every standard layer and head
(:func:`flopscope.invariants.role_balance`), checked per architecture without a closed form, the exceptions, and
the report.

- :func:`balance_record`: one model's profile (``mode="auto"``, ``no_grad``) and what it breaks: its heads
  (:func:`flopscope.invariants.head_paths`), its imbalances (layer or head path, rule, the MACs that do not balance)
  and its roles;
- :data:`EXCEPTIONS`: every architecture where a rule truly does not apply, with the reason read from the model's
  code (one place for the Hugging Face, timm and diffusers zoos). An imbalance that no exception covers is a
  misreading: a bug of the roles, never an entry here;
- :func:`report_lines`: the consistent share (base models, and with their heads), the misreadings by family with
  the measured numbers, the exceptions that were used.

Units: MACs. A run is one model class (the base ``AutoModel`` class or a head class: ``*ForCausalLM``,
``*ForSequenceClassification``, ``*ForImageClassification``); its record's ``kind`` says which.
"""

from __future__ import annotations

import re
import traceback
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

BASE = "base"
"""The ``kind`` of a base model's run (the head runs are named by their mapping: ``causal-lm``, ...)."""


# --------------------------------------------------------------------------------------------------
# one model
# --------------------------------------------------------------------------------------------------
def balance_record(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], kind: str) -> dict[str, Any]:
    """Profile ``model(*args, **kwargs)`` (``mode="auto"``, ``no_grad``) and check :func:`role_balance` on it with
    its heads: ``{"kind", "class", "prefix" (the base model's attribute in a head class), "macs", "heads",
    "imbalances": [[where, rule, detail], ...], "by_role"}``, or ``"error"`` (and ``"traceback"`` when the error
    is not flopscope's)."""
    import torch

    import flopscope
    from flopscope.invariants import role_balance

    out: dict[str, Any] = {"kind": kind, "class": type(model).__name__,
                           "prefix": getattr(model, "base_model_prefix", "") or ""}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.manual_seed(0)
            with torch.no_grad():
                prof = flopscope.profile(model, *args, mode="auto", **kwargs)
            heads = head_paths(prof)
            found = role_balance(prof, heads)
        except Exception as e:
            out["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
            if not isinstance(e, flopscope.FlopscopeError):
                out["traceback"] = traceback.format_exc()[-1500:]
            return out
    out.update(macs=prof.total(), heads=heads, imbalances=[[i.where, i.rule, i.detail] for i in found],
               by_role={k: v for k, v in prof.by_role().items() if v})
    return out


def head_paths(prof: Any) -> list[str]:
    """:func:`flopscope.invariants.head_paths` (the outermost modules beside the layers whose multiplies all run
    after the last layer's)."""
    from flopscope import invariants
    found = getattr(invariants, "head_paths", None)
    return found(prof) if found is not None else _head_paths(prof)


def _head_paths(prof: Any) -> list[str]:
    """The same reading as ``flopscope.invariants.head_paths`` in the lead's working tree, for a checkout that does
    not have it yet (the sweeps then run on either)."""
    from flopscope.capture.records import FORWARD
    from flopscope.invariants import _layer
    types = prof.facts.types
    records = [r for r in prof.records if r.phase == FORWARD]
    layers = [_layer(r.module, types) for r in records]
    last = max((i for i, layer in enumerate(layers) if layer is not None), default=None)
    if last is None:
        return []
    holders = {".".join(layer.split(".")[:i]) for layer in filter(None, layers)
               for i in range(len(layer.split(".")))}
    first: dict[str, int] = {}
    for i, record in enumerate(records):
        parts = record.module.split(".") if record.module else []
        for depth in range(1, len(parts) + 1):
            path = ".".join(parts[:depth])
            if path in holders:
                continue
            if ".".join(parts[:depth - 1]) in holders:
                first.setdefault(path, i)
            break
    return [path for path, i in first.items() if i > last]


# --------------------------------------------------------------------------------------------------
# the exceptions: where a rule truly does not apply (read in the model's code), never a misreading
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RoleException:
    """``rule`` (of :data:`flopscope.invariants.BALANCE_RULES`) does not apply in ``names`` (model types, timm
    models, diffusers classes) at the paths ``where`` matches (a regular expression searched in the layer or head
    path; "" for every path), for ``reason``."""

    rule: str
    names: tuple[str, ...]
    reason: str
    where: str = ""

    def covers(self, name: str, where: str, rule: str) -> bool:
        return rule == self.rule and name in self.names and (not self.where or re.search(self.where, where) is not None)


EXCEPTIONS: tuple[RoleException, ...] = ()
"""Every documented exception, for every zoo."""


def exception_for(name: str, where: str, rule: str) -> RoleException | None:
    return next((e for e in EXCEPTIONS if e.covers(name, where, rule)), None)


# --------------------------------------------------------------------------------------------------
# the report
# --------------------------------------------------------------------------------------------------
CONSISTENT, COVERED, MISREAD = "consistent", "covered", "misread"


def _verdict(name: str, runs: list[dict[str, Any]]) -> str | None:
    """``consistent`` (no imbalance), ``covered`` (each one by an exception) or ``misread``; None if nothing ran."""
    ran = [run for run in runs if "imbalances" in run]
    if not ran:
        return None
    found = [i for run in ran for i in run["imbalances"]]
    if not found:
        return CONSISTENT
    return COVERED if all(exception_for(name, where, rule) for where, rule, _ in found) else MISREAD


def _strip(where: str, prefix: str) -> str:
    return where[len(prefix) + 1:] if prefix and where.startswith(prefix + ".") else where


def new_in_head(base: dict[str, Any] | None, run: dict[str, Any]) -> list[list[str]]:
    """The imbalances of a head class's run that its base model does not have (the same rule and numbers at the
    same path under the head class's base-model attribute are the base's)."""
    known = {(w, r, d) for w, r, d in (base or {}).get("imbalances", [])}
    return [[w, r, d] for w, r, d in run.get("imbalances", []) if (_strip(w, run.get("prefix", "")), r, d) not in known]


def _layers_collapsed(items: list[list[str]]) -> list[tuple[str, str, str]]:
    """``(where, rule, detail)`` with the layers of one list that break a rule with the same numbers on one row
    (``encoder.layer.{0,1}``)."""
    groups: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    for where, rule, detail in items:
        m = re.match(r"^(.*?)(\d+)$", where)
        stem, index = (m.group(1), m.group(2)) if m else (where, "")
        groups[(stem, rule, detail)].append(index)
    rows = []
    for (stem, rule, detail), indices in groups.items():
        where = stem if indices == [""] else stem + (indices[0] if len(indices) == 1 else "{" + ",".join(indices) + "}")
        rows.append((where, rule, detail))
    return rows


def summary(results: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """Per architecture, the verdict of its base run and of its head runs; the counts."""
    base_verdicts, head_verdicts = {}, {}
    for r in results:
        runs = r.get("roles", {}).get("runs", [])
        base = [run for run in runs if run["kind"] == BASE]
        heads = [run for run in runs if run["kind"] != BASE]
        v = _verdict(r[name], base)
        if v:
            base_verdicts[r[name]] = v
        v = _verdict(r[name], heads)
        if v:
            head_verdicts[r[name]] = v
    return {"base": base_verdicts, "heads": head_verdicts,
            "base_counts": Counter(base_verdicts.values()), "head_counts": Counter(head_verdicts.values())}


def _share(counts: Counter[str], what: str) -> str:
    checked = sum(counts.values())
    return (f"**{counts[CONSISTENT]} of {checked} {what} consistent**, {counts[COVERED]} covered by documented "
            f"exceptions, {counts[MISREAD]} misread")


def share_lines(s: dict[str, Any]) -> list[str]:
    return [f"- base models: {_share(s['base_counts'], 'architectures')}",
            f"- with their heads (`*ForCausalLM`, `*ForSequenceClassification`, `*ForImageClassification`): "
            f"{_share(s['head_counts'], 'architectures with a head class')}"]


def _violation_rows(results: list[dict[str, Any]], name: str, heads: bool,
                    cell: Callable[[Any], str]) -> tuple[list[str], list[str], Counter[str]]:
    """Markdown rows of the misreadings and of the covered imbalances (base runs, or the head runs' new ones),
    and how many imbalances (collapsed rows) of each kind."""
    misread, covered, counts = [], [], Counter[str]()
    for r in results:
        runs = r.get("roles", {}).get("runs", [])
        base = next((run for run in runs if run["kind"] == BASE), None)
        for run in runs:
            if (run["kind"] == BASE) == heads or "imbalances" not in run:
                continue
            items = new_in_head(base, run) if heads else run["imbalances"]
            for where, rule, detail in _layers_collapsed(items):
                exc = exception_for(r[name], where, rule)
                head_cell = f" {run['class']} |" if heads else ""
                row = f"| {r[name]} |{head_cell} {cell(where)} | {rule} | {cell(detail)} |"
                if exc:
                    covered.append(row[:-1] + f"| {cell(exc.reason[:90])} |")
                    counts[COVERED] += 1
                else:
                    misread.append(row)
                    counts[MISREAD] += 1
    return misread, covered, counts


def report_lines(results: list[dict[str, Any]], name: str, cell: Callable[[Any], str]) -> list[str]:
    """The report's body: the consistent share, the misreadings (base, then new with the heads), the covered
    imbalances, the exceptions table, and what did not run."""
    s = summary(results, name)
    lines = ["## Summary", "", *share_lines(s), ""]
    for heads, title in ((False, "Base models"), (True, "With heads: what the head classes add")):
        misread, covered, counts = _violation_rows(results, name, heads, cell)
        header = f"| {name} |" + (" class |" if heads else "") + " layer / head | rule | measured (MACs) |"
        sep = "|---|" + ("---|" if heads else "") + "---|---|---|"
        lines += [f"## {title}", "",
                  f"{counts[MISREAD]} misread, {counts[COVERED]} covered by exceptions (layers of one list with the "
                  "same numbers on one row).", "", "### Misreadings", ""]
        lines += [header, sep, *misread] if misread else ["(none)"]
        lines += ["", "### Covered by documented exceptions", ""]
        lines += [header + " reason |", sep + "---|", *covered] if covered else ["(none)"]
        lines.append("")
    used = Counter(e for r in results for run in r.get("roles", {}).get("runs", [])
                   for where, rule, _ in run.get("imbalances", []) if (e := exception_for(r[name], where, rule)))
    lines += ["## Documented exceptions", "", "| rule | where | architectures | reason | imbalances covered |",
              "|---|---|---|---|---|"]
    lines += [f"| {e.rule} | {cell(e.where) or 'any'} | {', '.join(e.names)} | {cell(e.reason)} | {used[e]} |"
              for e in EXCEPTIONS] or ["(none)"]
    return [*lines, ""]
