"""A profile in a notebook: what ``Profile._repr_html_`` and ``Profile._repr_markdown_``
show.

Three parts, in MACs (multiply-accumulates; FLOPs = 2 x MACs, both shown): a one-line
summary (total, mode, parameters, ops without a formula), the role table and a compact
module tree. The tree holds the modules with MACs down to :data:`DEPTH` levels below the
root, inclusive of their submodules; numbered siblings of one type and one count
(``layers.0`` ... ``layers.31``) are one row, ``×32``, with the MACs of each and the
share of all, and only the first of them is opened (its rows count for all: ``attn
×32``). A container that never runs itself (a ``ModuleList``) is opened in place.
:meth:`flopscope.Profile.to_html` writes the whole report (chart and every table).

This module never imports :mod:`flopscope.profile` (``Profile`` delegates here): it
reads the profile through its public queries.
"""

from __future__ import annotations

import html
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .module_stats import dominant_roles, params_inclusive
from .numbers import human

DEPTH = 3
"""Levels below the root that the compact tree shows."""


@dataclass(frozen=True)
class TreeRow:
    """One row of the compact tree: a module, or ``count`` numbered siblings alike
    (``first`` to ``last``)."""

    level: int  # 0 for the root
    path: str  # the module's path (of a run: its first member's)
    last: str  # a run: its last member's path; else ``path``
    count: int  # modules in the row (1, or the run's length)
    times: int  # instances of the row in the model: its count times the counts of the runs above it
    type: str
    macs: int  # MACs of each module (inclusive of its submodules)
    params: int  # parameters of each module (inclusive)
    role: str  # dominant role ("" without MACs)

    # the path below the row's parent ("attn"; "h.0" under a ModuleList that never ran
    # itself)
    name: str

    @property
    def label(self) -> str:
        """``"(model)"``, ``"attn"``, ``"h.0–31"``."""
        if self.path == "":
            return "(model)"
        return self.name if self.count == 1 else f"{self.name}–{self.last.rsplit('.', 1)[-1]}"


def summary_line(prof: Any) -> str:
    """``"GPT2LMHeadModel: 4,431,872 MACs = 8,863,744 FLOPs (8.86 MFLOP), fake mode,
    ..."`` (plain text)."""
    types = prof.facts.types
    name = types[""].__name__ if "" in types else "model"
    total = prof.total()
    params = params_inclusive(prof.facts.param_shapes).get("", 0)
    unsupported = prof.unsupported()
    ledger = (f"{sum(unsupported.values()):,} calls of {len(unsupported)} op(s) without a formula "
              "(not in the total)"
              if unsupported else "every op counted or known to cost nothing")
    phases = prof.by_phase()
    by_phase = ("; " + ", ".join(f"{p} {m:,}" for p, m in phases.items())) if len(phases) > 1 else ""
    return (f"{name}: {total:,} MACs = {2 * total:,} FLOPs ({human(2 * total, 'FLOP')}; 1 MAC = 2 "
            f"FLOPs){by_phase}, {prof.mode} mode, {params:,} parameters; {ledger}")


def role_rows(prof: Any) -> list[tuple[str, int, int, str]]:
    """``(role, MACs, FLOPs, share of the total)`` per role."""
    total = prof.total() or 1
    return [(role, macs, 2 * macs, f"{100 * macs / total:.1f}%") for role, macs in prof.by_role().items()]


def tree_rows(prof: Any, depth: int = DEPTH) -> list[TreeRow]:
    """The compact module tree (see the module docstring), parents before children."""
    macs = prof.by_module()
    types = prof.facts.types
    params = params_inclusive(prof.facts.param_shapes)
    dominant = dominant_roles((record.module_stack, record.roles) for record in prof.records)
    children: dict[str, list[str]] = {}
    for path in macs:
        if path:
            children.setdefault(path.rsplit(".", 1)[0] if "." in path else "", []).append(path)

    uncalled = prof.uncalled_modules()

    def row(path: str, level: int, members: Sequence[str], parent: str, above: int) -> TreeRow:
        kind = types[path].__name__ if path in types else ""
        return TreeRow(level, path, members[-1], len(members), above * len(members), kind,
                       macs[path],
                       params.get(path, 0),
                       dominant.get(path, ""), path[len(parent) + 1:] if parent else path)

    def shown(path: str) -> Iterator[str]:
        """The children of ``path`` with MACs, a container that never ran itself (a
        ModuleList) opened."""
        for child in children.get(path, []):
            if child in uncalled:
                yield from shown(child)
            elif macs[child]:
                yield child

    def walk(path: str, level: int, above: int) -> Iterator[TreeRow]:
        if level >= depth:
            return
        for members in _runs(list(shown(path)), macs, types):
            yield row(members[0], level + 1, members, path, above)
            yield from walk(members[0], level + 1, above * len(members))

    return [row("", 0, [""], "", 1), *walk("", 0, 1)]


def notebook_html(prof: Any, depth: int = DEPTH) -> str:
    """The HTML a notebook shows for ``prof``: summary line, role table, compact tree
    (no script)."""
    roles = "".join(f"<tr><td>{html.escape(role)}</td><td style='text-align:right'>{m:,}</td>"
                    f"<td style='text-align:right'>{f:,}</td><td "
                    f"style='text-align:right'>{share}</td></tr>"
                    for role, m, f, share in role_rows(prof))
    total = prof.total() or 1
    tree = "".join(
        f"<tr><td style='padding-left:{0.3 + 1.2 * r.level:.1f}em'>{html.escape(r.label)}</td>"
        f"<td>{html.escape(r.type)}</td><td style='text-align:right'>{_count(r)}</td>"
        f"<td style='text-align:right'>{r.macs:,}</td><td style='text-align:right'>"
        f"{100 * r.times * r.macs / total:.1f}%</td><td style='text-align:right'>{r.params:,}</td>"
        f"<td>{html.escape(r.role)}</td></tr>" for r in tree_rows(prof, depth))
    head = "<tr>" + "".join(f"<th>{h}</th>" for h in ("module", "type", "×", "MACs each", "share",
                                                      "params each",
                                                       "dominant role")) + "</tr>"
    return (f"<div class='flopscope-profile'><p>{html.escape(summary_line(prof))}</p>"
            f"<table><thead><tr><th>role</th><th>MACs</th><th>FLOPs</th><th>share</th></tr></thead>"
            f"<tbody>{roles}</tbody></table>"
            f"<table><thead>{head}</thead><tbody>{tree}</tbody></table></div>")


def notebook_markdown(prof: Any, depth: int = DEPTH) -> str:
    """The same as Markdown: summary line, role table, compact tree (tables in GitHub's
    pipe syntax)."""
    lines = [_md(summary_line(prof)), "", "| role | MACs | FLOPs | share |", "|---|---:|---:|---:|"]
    lines += [f"| {_md(role)} | {m:,} | {f:,} | {share} |" for role, m, f, share in role_rows(prof)]
    total = prof.total() or 1
    lines += ["", "| module | type | × | MACs each | share | params each | dominant role |",
              "|---|---|---:|---:|---:|---:|---|"]
    lines += [f"| {'· ' * r.level}{_md(r.label)} | {_md(r.type)} | {_count(r)} | {r.macs:,} | "
              f"{100 * r.times * r.macs / total:.1f}% | {r.params:,} | {_md(r.role)} |" for r in tree_rows(prof, depth)]
    return "\n".join(lines) + "\n"


def _runs(paths: Sequence[str], macs: Mapping[str, int],
          types: Mapping[str, type]) -> Iterator[list[str]]:
    """``paths`` (siblings, in order) grouped: consecutive numbered ones of one type and
    one MAC count together."""
    run: list[str] = []
    for path in paths:
        name = path.rsplit(".", 1)[-1]
        previous = run[-1] if run else ""
        if run and name.isdigit() and previous.rsplit(".", 1)[-1].isdigit() and types.get(path) is types.get(previous) \
                and macs[path] == macs[previous] and path.rpartition(".")[0] == previous.rpartition(".")[0]:
            run.append(path)
            continue
        if run:
            yield run
        run = [path]
    if run:
        yield run


def _count(row: TreeRow) -> str:
    return "" if row.times == 1 else f"×{row.times}"


def _md(text: str) -> str:
    return text.replace("|", "\\|")

