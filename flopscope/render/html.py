"""A profile as one self-contained HTML page: an icicle chart of the module call tree,
and the tables.

The page needs no network (its style and script are inline; no library, no font, no
CDN): an icicle chart of the module call tree (the root on top, each module as wide as
its inclusive **MACs**, in the order the modules first ran, coloured by its dominant
role; hover for path, type, calls, MACs, FLOPs = 2 x MACs, share of the total,
parameters, input shapes of its first call and dominant role; click a module to zoom
into it, an ancestor to zoom out), the role table, the reconciliation against closed
forms with its reasons, the ledger of ops without a formula, the notes, and where
present the generation steps (a profile of several forwards) and the scaling polynomials
(``scaling=``, a :class:`flopscope.Scaling`).

The tables are HTML written here, so they show before any script runs; the chart is
drawn by the page's script from a compact JSON document (:func:`report_data`) embedded
in the page. Modules narrower than :data:`MIN_PIXELS` at the current zoom are drawn as
one rectangle per run of neighbours (``+N``), so a model of thousands of modules stays
light. Every rectangle the script draws carries ``data-macs`` (its MACs) and
``data-path`` (the module path; an aggregate: ``data-members``, the paths it holds,
``|``-separated), which the browser test reads back, and the body ``data-render-ms``
(the script's time, JSON parsed to chart drawn) and ``data-drawn-ms`` (from the start of
navigation to the chart drawn: the whole page read and parsed first). The page's address
may name a module to zoom into and one whose details to show:
``report.html#focus=transformer.h.0&tip=transformer.h.0.attn``.

This module never imports :mod:`flopscope.profile` (``Profile.to_html`` delegates here):
it reads the profile through its public queries.
"""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import FlopscopeError
from ..role import ROLE_ORDER
from .files import write_atomically
from .module_stats import dominant_roles, params_inclusive
from .numbers import human
from .pipeline_chart import components_svg, steps_svg
from .scaling_chart import chart_data, chart_svg

MIN_PIXELS = 1.0
"""Below this width (CSS pixels) a module is drawn inside its run of narrow neighbours'
aggregate rectangle."""

ROLE_COLOURS = {
    "q_proj": "#4e79a7", "k_proj": "#6b93c4", "v_proj": "#8fb0d9", "out_proj": "#2f5b8a",
    "attn_scores": "#e15759", "attn_weighted_sum": "#f28e8e", "attn_kv_state": "#c44e52",
    "attn_readout": "#e8a0a0",
    "attn_normaliser": "#b07aa1", "token_mixing": "#d37295",
    "ffn_up": "#59a14f", "ffn_gate": "#8cd17d", "ffn_down": "#3b7a36",
    "conv": "#f28e2b", "recurrent": "#edc948", "embedding": "#9c755f", "logits": "#76b7b2",
    "other": "#bab0ac",
}
"""A colour per role (:class:`flopscope.Role` values): attention blues / reds, FFN
greens."""
_NO_ROLE = "#d9d9d9"
_SAFE = 2**53  # the largest integer range a double (a JSON number in the page) holds exactly
_SHAPES_LIMIT = 160  # characters of a module's input shapes kept for the tooltip


def report_data(prof: Any, *, scaling: Any = None, title: str | None = None) -> dict[str, Any]:
    """The page's content as plain, JSON-ready data (units: MACs; FLOPs = 2 x MACs).
    ``prof`` is a :class:`flopscope.Profile`, ``scaling`` a :class:`flopscope.Scaling`
    or ``None``.

    ``tree`` is the module call tree, a row per node (parent before child, children in
    the order they first ran): ``[parent index (-1: the root), module path, type index
    into "types", inclusive MACs, parameters (inclusive), dominant role (or ""), calls,
    input shapes of the first call, self MACs, dominant role of the self MACs]``; a
    node's MACs are the sum of ``prof.by_stack()`` over the stacks through it, so for a
    module called from one place they are ``prof.by_module()[path]``; its self MACs (the
    ops it ran outside any submodule, such as an attention kernel called in the
    attention module's own forward) are ``prof.by_stack()[its stack]``. A profile of
    several phases adds to each row its MACs per phase (a list, in the order of
    ``phases``). MACs above 2^53 (``macs`` and the tree's) are strings of their digits:
    a JSON number, a double, would round them."""
    types = prof.facts.types
    params = params_inclusive(prof.facts.param_shapes)
    records = prof.records
    dominant = dominant_roles((_rooted(record.module_stack), record.roles) for record in records)
    # of its own ops
    own = dominant_roles((record.module_stack[-1:], record.roles) for record in records)
    calls = prof.module_calls()
    shapes: dict[str, str] = {}
    for call, arguments in prof.module_inputs().items():
        if call.call == 1:
            shapes[call.path] = _shapes(arguments)
    type_names: dict[str, int] = {}
    index: dict[tuple[str, ...], int] = {}
    tree: list[list[Any]] = []
    for stack, macs in ((_rooted(stack), macs) for stack, macs in prof.by_stack().items()):
        for depth in range(1, len(stack) + 1):
            key = stack[:depth]
            if key not in index:
                path = key[-1]
                kind = types[path].__name__ if path in types else ""
                index[key] = len(tree)
                tree.append([index[key[:-1]] if depth > 1 else -1, path,
                             type_names.setdefault(kind, len(type_names)),
                             0, params.get(path, 0), dominant.get(path, ""), calls.get(path, 0),
                             shapes.get(path, ""),
                             0, own.get(path, "")])
            tree[index[key]][3] += macs
        tree[index[stack]][8] += macs
    phases = list(prof.by_phase())
    if len(phases) > 1:  # each node's MACs per phase, in the order of "phases"
        for row in tree:
            row.append([0] * len(phases))
        for k, phase in enumerate(phases):
            for stack, macs in ((_rooted(stack), macs) for stack, macs in prof.by_stack(phase).items()):
                for depth in range(1, len(stack) + 1):
                    tree[index[stack[:depth]]][10][k] += macs
    # JSON numbers are doubles: larger counts go as strings, which the page reads
    # exactly
    for row in tree:
        row[3], row[8] = _exact(row[3]), _exact(row[8])
        if len(row) > 10:
            row[10] = [_exact(macs) for macs in row[10]]
    if not tree:
        root_type = types[""].__name__ if "" in types else ""
        tree.append([-1, "", type_names.setdefault(root_type, 0), 0, params.get("", 0), "",
                     calls.get("", 0),
                     shapes.get("", ""), 0, ""])
    return {
        "title": title or f"flopscope: {types[''].__name__ if '' in types else 'model'}",
        "mode": prof.mode,
        "macs": _exact(prof.total()),
        "params": params.get("", 0),
        "phases": prof.by_phase(),
        "roles": list(prof.by_role().items()),
        "blocks": _blocks_per_role(prof.by_block()),
        "colours": {role: ROLE_COLOURS.get(role, _NO_ROLE) for role in ROLE_ORDER},
        "types": list(type_names),
        "tree": tree,
        "reconciliation": [[r.block, r.role, r.measured, r.predicted,
                            None if r.ratio is None else str(r.ratio),
                            r.term, r.useful, r.reason, r.basis] for r in prof.reconcile().rows],
        "unsupported": sorted(prof.unsupported().items()),
        "elementwise": sorted(prof.elementwise().items()),
        "notes": list(prof.notes),
        "steps": _steps(prof),
        "decode": _decode(prof),
        "scaling": _scaling(scaling) if scaling is not None else None,
        "formulas": _formulas(prof),
    }


def html_document(data: Mapping[str, Any]) -> str:
    """The page for :func:`report_data`'s ``data``: one string, style and script inline."""
    total = int(data["macs"])
    phases = data["phases"]
    head = [f"<b>{total:,}</b> MACs = <b>{2 * total:,}</b> FLOPs ({human(2 * total, 'FLOP')}; 1 "
            "MAC = 2 FLOPs)",
            f"counted in {html.escape(data['mode'])} mode", f"{data['params']:,} parameters"]
    if len(phases) > 1:
        head.append("by phase: " + ", ".join(f"{html.escape(p)} {m:,} MACs" for p, m in phases.items()))
    together = (" The MACs are those of every phase together (" + ", ".join(html.escape(p) for p in phases)
                + "), as <code>by_module()</code> has them." if len(phases) > 1 else "")
    sections = [
        f"<h1>{html.escape(data['title'])}</h1>",
        f"<p class=summary>{' · '.join(head)}</p>",
        "<section id=chart-section><h2>Module tree, sized by MACs</h2>"
        "<p class=hint>Each module is as wide as its MACs (its submodules' included), below the "
        "module that called it, in the order they first ran; colour: its dominant role. Hover for "
        "details, click to zoom in, click an ancestor (or <button id=reset "
        f"type=button>reset</button>) to zoom out.{together}</p><div id=crumbs></div><div "
        "id=chart></div><div id=legend></div></section>",
        _role_section(data),
        _reconciliation_section(data["reconciliation"],
                                _as_they_ran(data["pipeline"]) if data.get("pipeline") else ()),
        _unsupported_section(data["unsupported"], data["elementwise"]),
    ]
    if data["steps"]:
        sections.append(_steps_section(data["steps"], data["decode"]))
    if data.get("pipeline"):
        sections.append(_pipeline_section(data["pipeline"]))
        sections.insert(2, _call_section(data["pipeline"], total))
    if data["formulas"]:
        formulas = data["formulas"]
        sections.append(f"<section id=formulas><h2>Per token, against the published formulas</h2>"
                        f"<p>{html.escape(formulas['caption'])}; each difference explained by the "
                        "parts that make "
                        f"it.</p>{_table(formulas['headers'], formulas['rows'], numeric=(1, 2, 3))}</section>")
    if data["scaling"]:
        sections.append(_scaling_section(data["scaling"], data["colours"]))
    if data["notes"]:
        sections.append("<section><h2>Notes</h2><ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in data["notes"])
                        + "</ul></section>")
    payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    return ("<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
            "<meta name=viewport content='width=device-width, initial-scale=1'>"
            f"<title>{html.escape(data['title'])}</title><style>{_asset('html.css')}</style></head>"
            f"<body>{''.join(sections)}<div id=tip role=tooltip></div>"
            f"<footer>flopscope · units: MACs (multiply-accumulates); FLOPs = 2 × MACs</footer>"
            f"<script type=application/json id=data>{payload}</script>"
            f"<script>{_asset('html.js')}</script></body></html>\n")


def write_html(prof: Any, path: str | Path, *, scaling: Any = None, title: str | None = None,
               pipeline: Mapping[str, Any] | None = None) -> Path:
    """Write the page of ``prof`` to ``path``, whole or not at all (a path that cannot
    be written raises a :class:`~flopscope.errors.FlopscopeError` naming it);
    ``pipeline``: a diffusion pipeline's section (its tables' data,
    :meth:`flopscope.PipelineProfile.to_html`)."""
    data = report_data(prof, scaling=scaling, title=title)
    if pipeline is not None:
        data["pipeline"] = pipeline
        data["root"] = pipeline.get("name")
    return write_atomically(path, html_document(data), "the HTML report")


# --------------------------------------------------------------------------------------------------
# the data
def _rooted(stack: Sequence[str]) -> tuple[str, ...]:
    """A module call stack as the chart draws it: opened by the root ``""``. A stack
    whose outermost call is not the root's (a pipeline's components, whose container
    is never called; ``vae.decoder``, run by ``vae.decode``, a method other than
    ``forward``) is put under the root by its outermost module's path: ``("", "vae",
    "vae.decoder", ...)``."""
    stack = tuple(stack)
    if stack[:1] == ("",):
        return stack
    if not stack:
        return ("",)
    parts = stack[0].split(".")
    return ("", *(".".join(parts[:i]) for i in range(1, len(parts))), *stack)


def _exact(macs: int) -> int | str:
    """``macs`` as JSON keeps it exactly: a number up to 2^53 (a double holds every
    integer that far), else a string."""
    return macs if macs <= _SAFE else str(macs)


def _shapes(arguments: Sequence[tuple[int | str, tuple[int, ...]]]) -> str:
    text = ", ".join(f"{key}: {'x'.join(map(str, shape)) or 'scalar'}" for key, shape in arguments)
    return text if len(text) <= _SHAPES_LIMIT else text[: _SHAPES_LIMIT - 1] + "…"


def _blocks_per_role(blocks: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    """How many block instances (attention / FFN / conv blocks, or modules outside them)
    each role occurs in."""
    out: dict[str, int] = {}
    for roles in blocks.values():
        for role, macs in roles.items():
            if macs:
                out[role] = out.get(role, 0) + 1
    return out


def _steps(prof: Any) -> list[dict[str, Any]]:
    """The generation steps, when the profile holds more than one forward (else nothing
    to show)."""
    steps = prof.steps()
    return [step.row() for step in steps] if len(steps) > 1 else []


def _decode(prof: Any) -> list[list[str]] | None:
    """Per role, the decode steps' MACs per sequence as a polynomial in the context
    ``c`` (``None`` without three decode steps at distinct contexts)."""
    try:
        decode = prof.decode_scaling()
    except FlopscopeError:
        return None
    return [[role, "not a polynomial" if poly is None else poly.text("c")] for role, poly in decode.polynomials.items()]


def _formulas(prof: Any) -> dict[str, Any] | None:
    """The per-token comparison with Kaplan, Chinchilla, Megatron-LM and PaLM (a
    language model's), or ``None``."""
    try:
        result = prof.model_formulas()
    except FlopscopeError:
        return None
    return {"caption": result.caption(), "headers": list(result.HEADERS), "rows": result.cells()}


def _scaling(scaling: Any) -> dict[str, Any]:
    rows = []
    for role, poly in scaling.polynomials.items():
        predicted = scaling.predicted.get(role)
        rows.append([role, "not a polynomial" if poly is None else str(poly),
                     "" if predicted is None else str(predicted), scaling.matches(role)])
    total = scaling.total()
    return {"lengths": list(scaling.lengths), "method": scaling.method, "rows": rows,
            "total": None if total is None else str(total), "chart": chart_data(scaling)}


# --------------------------------------------------------------------------------------------------
# the tables
def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]],
           numeric: Sequence[int] = ()) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = []
        for i, cell in enumerate(row):
            text = cell if isinstance(cell, _Raw) else html.escape(f"{cell:,}" if isinstance(cell, int)
                                                                     and not isinstance(cell, bool) else str(cell))
            cells.append(f"<td class=num>{text}</td>" if i in numeric else f"<td>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


class _Raw(str):
    """Table cell text that is HTML already."""


def _role_section(data: Mapping[str, Any]) -> str:
    total = int(data["macs"]) or 1
    rows = []
    for role, macs in data["roles"]:
        swatch = _Raw("<span class=swatch "
                      f"style='background:{data['colours'].get(role, _NO_ROLE)}'></span>"
                      f"{html.escape(role)}")
        rows.append([swatch, macs, 2 * macs, f"{100 * macs / total:.1f}%",
                     data["blocks"].get(role, 0)])
    table = _table(["role", "MACs", "FLOPs", "share", "blocks"], rows, numeric=(1, 2, 3, 4))
    return f"<section id=roles><h2>Roles</h2>{table}</section>"


def _reconciliation_section(rows: Sequence[Sequence[Any]], components: Sequence[str] = ()) -> str:
    """The reconciliation, a group per set of identical blocks (the same roles with the
    same counts, predictions and basis: ``layers.0–31.self_attn × 32``), each
    expandable to its rows for one block, its basis said once. With ``components`` (a
    pipeline's), the groups are inside one expandable line per component (the first
    part of the blocks' paths), which says how many of its rows are exact."""
    if not rows:
        return ("<section id=reconciliation><h2>Reconciliation</h2><p>No block with a closed form "
                "was found (attention, FFN, convolution, recurrent, logits blocks are "
                "reconciled).</p></section>")
    exact = sum(1 for r in rows if r[4] == "1")
    groups = reconciliation_groups(rows)
    if components:
        mine: dict[str, list[Sequence[Any]]] = {name: [] for name in components}
        for row in rows:
            mine.setdefault(row[0].split(".", 1)[0], []).append(row)
        parts = []
        for name, members in mine.items():
            if not members:
                continue
            inner = reconciliation_groups(members)
            blocks = len({r[0] for r in members})
            ok = sum(1 for r in members if r[4] == "1")
            parts.append("<details class=component "
                         f"data-component='{html.escape(name)}'><summary><b>"
                         f"{html.escape(name)}</b>: {ok} of {len(members)} rows as predicted, "
                         f"{blocks} block{'s' * (blocks != 1)} in {len(inner)} "
                         f"group{'s' * (len(inner) != 1)} of identical "
                         f"blocks</summary>{_groups_html(inner)}</details>")
        return (f"<section id=reconciliation><h2>Reconciliation</h2><p>{exact} of {len(rows)} rows "
                f"exactly as predicted by the closed forms, in {len(groups)} "
                f"group{'s' if len(groups) != 1 else ''} of identical blocks, by component (open "
                "one for its groups, a group for its rows, per "
                f"block):</p>{''.join(parts)}</section>")
    return (f"<section id=reconciliation><h2>Reconciliation</h2><p>{exact} of {len(rows)} rows "
            f"exactly as predicted by the closed forms, in {len(groups)} "
            f"group{'s' if len(groups) != 1 else ''} of identical blocks (open one for its rows, "
            f"per block):</p>{_groups_html(groups)}</section>")


def _groups_html(groups: Sequence[Mapping[str, Any]]) -> str:
    """Each group of :func:`reconciliation_groups` as an expandable line: its label,
    count, roles as predicted, and basis; open, one block's rows."""
    parts = []
    for group in groups:
        members = group["rows"]
        shown = [[role, measured, "no prediction" if predicted is None else predicted,
                  "—" if ratio is None else ratio,
                  term, "" if useful is None else useful,
                  reason or ("no closed form for this role" if predicted is None else "")]
                 for _, role, measured, predicted, ratio, term, useful, reason, _ in members]
        table = _table(["role", "measured MACs", "predicted MACs", "ratio", "term", "useful MACs", "reason"], shown,
                       numeric=(1, 2, 3, 5))
        bases = "; ".join(dict.fromkeys(r[8] for r in members if r[8]))
        ok = sum(1 for r in members if r[4] == "1")
        count = len(group["blocks"])
        parts.append(f"<details class=group data-pattern='{html.escape(group['pattern'])}' "
                     f"data-count={count}>"
                     f"<summary><b>{html.escape(group['label'])}</b>{f' × {count}' if count > 1 else ''}: {ok} of "
                     f"{len(members)} roles as predicted{' in each' if count > 1 else ''}"
                     f"{f' · <span class=basis>{html.escape(bases)}</span>' if bases else ''}</summary>{table}"
                     "</details>")
    return "".join(parts)


_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.|$)")


def reconciliation_groups(rows: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    """The reconciliation rows ``[block, role, measured, predicted, ratio, term, useful,
    reason, basis]`` grouped by identical blocks: blocks whose path differs only in
    its indices (``layers.3.mlp``) and whose rows are the same but for the block's
    path. Each group: ``pattern`` (indices as ``*``), ``label`` (``layers.0–31.mlp``,
    or the indices listed), ``blocks`` (their paths, in order) and ``rows`` (the
    first block's)."""
    by_block: dict[str, list[Sequence[Any]]] = {}
    for row in rows:
        by_block.setdefault(row[0], []).append(row)
    groups: dict[tuple[Any, ...], dict[str, Any]] = {}
    for block, members in by_block.items():
        pattern = _INDEX.sub("*", block)
        key = (pattern, tuple(tuple(r[1:]) for r in members))
        group = groups.setdefault(key, {"pattern": pattern, "blocks": [], "rows": members})
        group["blocks"].append(block)
    for group in groups.values():
        group["label"] = _label(group["pattern"], group["blocks"])
    return list(groups.values())


def _label(pattern: str, blocks: Sequence[str]) -> str:
    """``layers.0–31.mlp`` for a run of consecutive indices at one place, ``layers.{0,
    2, 5}.mlp`` otherwise; with indices at several places, each place's
    (``up_blocks.0.attentions.0–2.transformer_blocks.0.attn1``) where the blocks are
    every combination of them, else the paths listed; the path itself for one block
    (``(model)`` for the root)."""
    indices = [[int(i) for i in _INDEX.findall(block)] for block in blocks]
    places = [list(dict.fromkeys(each[k] for each in indices)) for k in range(pattern.count("*"))]
    if len(blocks) == 1 or not places or math.prod(map(len, places)) != len(blocks):
        return ", ".join(blocks[:3]) + (f", … ({len(blocks)})" if len(blocks) > 3 else "") if blocks[0] else "(model)"
    label = pattern
    for values in places:
        run = values == list(range(values[0], values[0] + len(values)))
        shown = (str(values[0]) if len(values) == 1 else f"{values[0]}–{values[-1]}" if run
                 else "{" + ", ".join(map(str, values[:6])) + (", …}" if len(values) > 6 else "}"))
        label = label.replace("*", shown, 1)
    return label


def _unsupported_section(unsupported: Sequence[Sequence[Any]],
                         elementwise: Sequence[Sequence[Any]]) -> str:
    if unsupported:
        body = ("<p>Ops without a formula: they may do arithmetic that the total leaves out.</p>"
                + _table(["ATen op", "calls"], unsupported, numeric=(1,)))
    else:
        body = "<p>None: every op that ran has a formula, an elementwise rule or a place in the zero-cost list.</p>"
    if elementwise:
        body += ("<p>Elementwise ops (not MACs, not in the total): "
                 + ", ".join(f"{html.escape(k)} {v:,}" for k, v in elementwise) + "</p>")
    return f"<section id=unsupported><h2>Unsupported ops</h2>{body}</section>"


def _steps_section(steps: Sequence[Mapping[str, Any]],
                   decode: Sequence[Sequence[str]] | None) -> str:
    rows = [[s["step"], s["phase"], _dash(s["batch"]), _dash(s["tokens"]), _dash(s["context"]),
             s["macs"], s["flops"],
             s["bytes"], s["kv_macs"]] for s in steps]
    body = _table(["step", "phase", "batch", "tokens", "context", "MACs", "FLOPs", "bytes", "KV MACs"], rows,
                  numeric=(0, 2, 3, 4, 5, 6, 7, 8))
    if decode:
        body += ("<p>Decode MACs per sequence and step, exact polynomials in the context c:</p>"
                 + _table(["role", "MACs per decode step"], decode))
    return f"<section id=steps><h2>Generation steps</h2>{body}</section>"


def _scaling_section(scaling: Mapping[str, Any], colours: Mapping[str, str]) -> str:
    rows = [[role, poly, predicted or "—",
             "no prediction" if not predicted else "yes" if matches else "no"]
            for role, poly, predicted, matches in scaling["rows"]]
    total = f"<p>Total: {html.escape(scaling['total'])} MACs</p>" if scaling["total"] else ""
    lengths = ", ".join(f"{n:,}" for n in scaling["lengths"])
    crossover = scaling["chart"]["crossover"]
    said = (" The attention core (scores and weighted sum, n²·d) costs more than the projections "
            "and the FFN "
            f"(n·d²) from n = {crossover:,}." if crossover is not None else "")
    return ("<section id=scaling><h2>Scaling in n</h2><p>MACs per role against the sequence "
            "length: points measured, lines the exact polynomials through "
            f"them.{said}</p>{chart_svg(scaling['chart'], colours)}<p>Exact polynomials per role "
            f"({html.escape(scaling['method'])}, lengths {lengths}), MACs:</p>"
            + _table(["role", "measured", "closed form", "equal"], rows) + total + "</section>")


def _call_section(pipeline: Mapping[str, Any], total: int) -> str:
    """A diffusion pipeline's call at a glance: its MACs by component (each a link that
    zooms the module tree into it) and by part of the call (before the steps, each
    denoising step, after them)."""
    bars, colours = pipeline["bars"], pipeline["colours"]
    macs_of = dict(zip(pipeline["components"], pipeline["totals"], strict=True))
    in_order = {name: macs_of[name] for name in _as_they_ran(pipeline)}
    steps = [bar for bar in bars if bar["kind"] == "step"]
    rows = []
    for name, macs in in_order.items():
        where = [bar["kind"] for bar in bars if bar["macs"].get(name)]
        said = ", ".join(dict.fromkeys(
            "before the steps" if kind == "before" else "after the steps" if kind == "after"
            else f"in {sum(1 for k in where if k == 'step')} of {len(steps)} steps" for kind in where))
        swatch = _Raw(f"<span class=swatch style='background:{colours.get(name, _NO_ROLE)}'></span>"
                      f"<a href='#focus={html.escape(name)}'>{html.escape(name)}</a>")
        rows.append([swatch, macs, 2 * macs, f"{100 * macs / (total or 1):.1f}%", said])
    table = _table(["component", "MACs", "FLOPs", "share", "ran"], rows, numeric=(1, 2, 3))
    denoisers = ", ".join(pipeline.get("denoisers", ())) or "none found"
    guidance = ", ".join(dict.fromkeys(bar["guidance"] for bar in steps))
    loop = (f"{len(steps)} denoising step{'s' * (len(steps) != 1)} (denoiser: "
            f"{html.escape(denoisers)}; guidance: "
            f"{html.escape(guidance)})" if steps else "no denoising step (no scheduler.step call)")
    return ("<section id=call><h2>The call: by component and by step</h2>"
            "<p class=hint>Every multiply of one call of "
            f"{html.escape(pipeline.get('name', 'the pipeline'))}, {loop}. Units: MACs; 1 MAC = 2 "
            "FLOPs. Hover a bar for its exact MACs and FLOPs; click a component's name to open it "
            f"in the module tree.</p>{components_svg(in_order, colours)}{table}"
            "<p class=hint>Each part of the call, in the order it ran: the calls before the "
            "denoising loop, each step (its denoisers stacked), the calls after it. Bars of "
            f"identical steps are labelled once.</p>{steps_svg(bars, colours)}</section>")


def _as_they_ran(pipeline: Mapping[str, Any]) -> list[str]:
    """A pipeline's components with MACs in the order they first ran (by the parts of
    the call: before the steps, the steps, after them)."""
    names = pipeline["components"]
    ran = [*dict.fromkeys(c for bar in pipeline["bars"] for c in bar["macs"] if c in names)]
    return [*ran, *[c for c in names if c not in ran]]


def _pipeline_section(pipeline: Mapping[str, Any]) -> str:
    """A diffusion pipeline's call: MACs by role in each component, and by component and
    by role in each denoising step (a row per run of identical steps)."""
    names, stepped = pipeline["components"], pipeline["stepped"]
    roles = _table(["role", *names], [*pipeline["roles"], ["total", *pipeline["totals"]]],
                   numeric=tuple(range(1, len(names) + 1)))
    steps = _table(["steps", "count", *[f"{c}, each" for c in stepped], "MACs, each",
                    "MACs, together", "guidance"],
                   _runs_of_steps(pipeline["steps"], tail=1),
                   numeric=tuple(range(1, len(stepped) + 4)))
    step_roles = pipeline.get("step_roles", [])
    # a column per run, a row per role
    runs = _runs_of_steps(pipeline.get("steps_by_role", []), tail=0)
    by_role = _table(["role", *[f"steps {run[0]}, each" if run[1] > 1 else f"step {run[0]}" for run in runs]],
                     [[name, *[run[2 + k] for run in runs]] for k, name in enumerate([*step_roles, "total"])],
                     numeric=tuple(range(1, len(runs) + 1)))
    return ("<section id=pipeline><h2>The pipeline: by role, and the steps</h2><p>MACs by role in "
            f"each component:</p>{roles}<p>MACs of the denoising steps by component (a row per run "
            f"of identical steps; guidance: how the unconditional pass ran).</p>{steps}<p>MACs of "
            f"the denoising steps by role:</p>{by_role}</section>")


def _runs_of_steps(rows: Sequence[Sequence[Any]], tail: int) -> list[list[Any]]:
    """Rows ``[step, *MACs, total, *tail columns]`` of consecutive steps equal but for
    the step merged into one: ``["0–27", 28, *MACs each, total each, total of the
    run, *tail columns]``."""
    out: list[list[Any]] = []
    runs: list[list[Sequence[Any]]] = []
    for row in rows:
        if runs and list(runs[-1][-1][1:]) == list(row[1:]):
            runs[-1].append(row)
        else:
            runs.append([row])
    for run in runs:
        first, last = run[0][0], run[-1][0]
        values = list(run[0][1:len(run[0]) - tail])
        out.append([str(first) if first == last else f"{first}–{last}", len(run), *values,
                    len(run) * values[-1],
                    *run[0][len(run[0]) - tail:]])
    return out


def _dash(value: Any) -> Any:
    return "—" if value is None else value


def _asset(name: str) -> str:
    return resources.files("flopscope.render").joinpath(name).read_text(encoding="utf-8")
