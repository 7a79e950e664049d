"""The page of ``flopscope diff``: one self-contained HTML file (style inline, no
script, no network) from a diff's plain data
(:meth:`flopscope.diff.ProfileDiff.to_dict`): the total, a row per role with a bar of
its MACs before and after and why it moved, the attention core's useful pairs, and
the modules and ops that changed. Each role's row carries ``data-role``,
``data-before`` and ``data-after`` (MACs, exact digits): what a browser test reads
back."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

from .files import write_atomically
from .numbers import times

_STYLE = """body{font:14px/1.45 system-ui,sans-serif;margin:1.5em auto;max-width:1200px;color:#222;padding:0 1em}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{padding:.25em .6em;border-bottom:1px solid #ddd;
text-align:left;vertical-align:top}td.num{text-align:right;font-variant-numeric:tabular-nums}
.bar{height:7px;margin:1px 0}.before{background:#9bb7d4}.after{background:#2f5f8f}.why{color:#444}
.up{color:#a33}.down{color:#262}"""


def diff_document(data: Mapping[str, Any]) -> str:
    """The page of a diff's data."""
    total = data["total"]
    largest = max([1] + [max(r["before"], r["after"]) for r in data["roles"]])
    rows = []
    for r in data["roles"]:
        bars = "".join(f"<div class='bar {side}' "
                       f"style='width:{100 * r[side] / largest:.2f}%'></div>"
                       for side in ("before", "after"))
        rows.append(f"<tr class=role data-role='{html.escape(r['key'])}' data-before={r['before']} "
                    f"data-after={r['after']}><td>{html.escape(r['key'])}</td><td "
                    f"class=num>{r['before']:,}</td><td class=num>{r['after']:,}</td><td "
                    f"class='num {_sign(r['delta'])}'>{_delta(r['delta'])}</td><td "
                    f"class=num>{_ratio(r['ratio'])}</td><td style='width:180px'>{bars}</td><td "
                    f"class=why>{html.escape(r['why'])}</td></tr>")
    sections = [
        f"<h1>{html.escape(data['before'])} → {html.escape(data['after'])}</h1>",
        f"<p id=total data-before={total['before']} "
        f"data-after={total['after']}><b>{total['before']:,}</b> → <b>{total['after']:,}</b> MACs "
        f"({_delta(total['delta'])}, {_ratio(total['ratio']) or '1x'}); 1 MAC = 2 FLOPs</p>",
        "<h2>Roles</h2><table><thead><tr><th>role</th><th>before MACs</th><th>after "
        "MACs</th><th>change</th>"
        "<th>after / before</th><th>before, after</th><th>why (closed "
        "form)</th></tr></thead><tbody>" + "".join(rows)
        + "</tbody></table>",
    ]
    if any(r["delta"] for r in data["useful"]):
        sections.append("<h2>Attention core, useful pairs only (the 'mask' convention)</h2>"
                        + _table(data["useful"], "role", why=True))
    for title, key in (("Modules that changed", "modules"), ("Ops that changed", "ops")):
        if data[key]:
            sections.append(f"<h2>{title}</h2>" + _table(data[key], key[:-1]))
    return ("<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8><title>"
            f"{html.escape(data['before'])} → {html.escape(data['after'])}: flopscope "
            f"diff</title><style>{_STYLE}</style></head><body>{''.join(sections)}<footer>flopscope "
            "diff · units: MACs (multiply-accumulates); FLOPs = 2 × MACs</footer></body></html>\n")


def write_diff_html(data: Mapping[str, Any], path: str | Path) -> Path:
    """Write :func:`diff_document` of ``data`` to ``path``, all or nothing."""
    return write_atomically(path, diff_document(data), "the diff page")


def _table(changes: Sequence[Mapping[str, Any]], what: str, why: bool = False) -> str:
    titles = (what, "before MACs", "after MACs", "change", "after / before",
              *(["why"] if why else []))
    head = "".join(f"<th>{h}</th>" for h in titles)
    rows = []
    for c in changes:
        reason = f"<td class=why>{html.escape(c['why'])}</td>" if why else ""
        rows.append(f"<tr><td>{html.escape(c['key'] or '(the model)')}</td><td "
                    f"class=num>{c['before']:,}</td><td class=num>{c['after']:,}</td><td "
                    f"class='num {_sign(c['delta'])}'>{_delta(c['delta'])}</td><td "
                    f"class=num>{_ratio(c['ratio'])}</td>{reason}</tr>")
    body = "".join(rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _delta(delta: int) -> str:
    return f"{delta:+,}" if delta else "0"


def _sign(delta: int) -> str:
    return "up" if delta > 0 else "down" if delta < 0 else ""


def _ratio(ratio: str | None) -> str:
    """The document's exact ratio (a fraction string, ``"870/427"``) as people read it:
    ``"2.04x"``."""
    return "" if ratio in (None, "1") else times(float(Fraction(ratio)))
