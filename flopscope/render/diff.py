"""What changed between two profiles (two models, two configs, two commits): per role,
per module and per op, and each role's change explained by the closed-form
hyper-parameters that moved (GQA against MHA: ``n_kv`` 8 → 2 in ``k_proj =
B·n_k·d·(n_kv·d_k)``; a mixture of experts: ``top_k``; a sliding window: the
attention core's useful pairs). The view a reviewer opens when a FLOP budget test
fails.

Inputs are :func:`flopscope.report.to_dict` documents (what ``flopscope profile --json``
writes) or profiles. Units: MACs (FLOPs = 2 x MACs). A role's explanation compares the
``basis`` of its reconciliation rows in the two profiles (``B=1 n_q=128 ... n_kv=2 ...
causal window=4096``): the hyper-parameters its closed form depends on
(:data:`~flopscope.predict.reconcile.ROLE_FORMS`), the mask's flags, and how many blocks
have it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from tabulate import tabulate

from ..errors import InputError
from ..predict.reconcile import ROLE_FORMS
from ..role import ATTENTION_CORE, ROLE_ORDER
from .diff_page import write_diff_html
from .numbers import times
from .text import JSON_SCHEMA, to_dict
from .view import ProfileView

DIFF_SCHEMA = "flopscope.diff/1"
"""Schema of :meth:`ProfileDiff.to_dict`: ``before`` / ``after`` (labels), ``total``,
``roles``, ``useful``, ``modules``, ``ops``: each a change ``{"key", "before", "after",
"delta", "ratio", "why"}`` in MACs (``ratio``: after / before as a fraction string,
``null`` from zero)."""


@dataclass(frozen=True)
class Change:
    """One quantity in MACs before and after (``key``: a role, module path or op), and
    why it moved."""

    key: str
    before: int
    after: int
    why: str = ""

    @property
    def delta(self) -> int:
        return self.after - self.before

    @property
    def ratio(self) -> Fraction | None:
        """after / before, exactly (``None`` from zero)."""
        return Fraction(self.after, self.before) if self.before else None

    def row(self) -> dict[str, Any]:
        return {"key": self.key, "before": self.before, "after": self.after, "delta": self.delta,
                "ratio": None if self.ratio is None else str(self.ratio), "why": self.why}


@dataclass(frozen=True)
class ProfileDiff:
    """Two profiles side by side: :attr:`total`, :attr:`roles` (every role of either, in
    the report's order), :attr:`useful` (the attention core's useful pairs, under the
    ``"mask"`` convention), :attr:`modules` and :attr:`ops` (each entry that changed,
    largest change first)."""

    before: str
    after: str
    total: Change
    roles: tuple[Change, ...]
    useful: tuple[Change, ...]
    modules: tuple[Change, ...]
    ops: tuple[Change, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"schema": DIFF_SCHEMA,
                "units": {"macs": "multiply-accumulates", "flops": "2 x macs"},
                "before": self.before, "after": self.after, "total": self.total.row(),
                "roles": [c.row() for c in self.roles], "useful": [c.row() for c in self.useful],
                "modules": [c.row() for c in self.modules], "ops": [c.row() for c in self.ops]}

    def to_html(self, path: str | Path) -> Path:
        """Write the diff's page (one self-contained file:
        :mod:`flopscope.render.diff_page`); returns the path."""
        return write_diff_html(self.to_dict(), path)

    def to_table(self, tablefmt: str = "simple", limit: int = 20) -> str:
        """The total, the roles, the useful attention pairs, and the ``limit`` largest
        module and op changes."""
        lines = [f"{self.before} → {self.after}: {_line(self.total)}", ""]
        headers = ["role", "before MACs", "after MACs", "change", "after / before",
                   "why (closed form)"]
        lines.append(tabulate([_cells(c) for c in self.roles], headers=headers, tablefmt=tablefmt,
                              disable_numparse=True))
        if any(c.delta for c in self.useful):
            lines += ["", "attention core, useful pairs only (the 'mask' convention):",
                      tabulate([_cells(c) for c in self.useful], headers=headers, tablefmt=tablefmt,
                               disable_numparse=True)]
        for title, changes in (("modules", self.modules), ("ops", self.ops)):
            if changes:
                shown = changes[:limit]
                more = f" ({len(changes) - limit} more in --json)" if len(changes) > limit else ""
                lines += ["", f"{title} that changed, largest first{more}:",
                          tabulate([_cells(c)[:5] for c in shown],
                                   headers=[title[:-1], *headers[1:5]],
                                   tablefmt=tablefmt, disable_numparse=True)]
        return "\n".join(lines)


def diff(before: ProfileView | Mapping[str, Any], after: ProfileView | Mapping[str, Any],
         before_label: str = "before",
         after_label: str = "after") -> ProfileDiff:
    """The changes from ``before`` to ``after`` (profiles, or their JSON documents)."""
    a, b = _document(before), _document(after)
    rows_a, rows_b = _rows_by_role(a), _rows_by_role(b)
    roles_a, roles_b = a["roles"], b["roles"]
    names = [r for r in ROLE_ORDER if r in roles_a or r in roles_b]
    names += sorted((set(roles_a) | set(roles_b)) - set(names))
    roles = tuple(Change(r, roles_a.get(r, 0), roles_b.get(r, 0),
                         _why(r, rows_a.get(r, []), rows_b.get(r, [])) if roles_a.get(r, 0) != roles_b.get(r, 0)
                         else "") for r in names)
    useful = tuple(Change(r, _useful(rows_a.get(r, [])), _useful(rows_b.get(r, [])),
                          _why(r, rows_a.get(r, []), rows_b.get(r, []), useful=True))
                   for r in names if r in ATTENTION_CORE and (rows_a.get(r) or rows_b.get(r)))
    modules = _changes({m["path"]: m["macs"] for m in a["modules"]},
                       {m["path"]: m["macs"] for m in b["modules"]})
    return ProfileDiff(before_label, after_label,
                       Change("total", a["totals"]["macs"], b["totals"]["macs"]), roles,
                       useful, modules, _changes(a["ops"], b["ops"]))


def _document(profile: ProfileView | Mapping[str, Any]) -> Mapping[str, Any]:
    if not isinstance(profile, Mapping):
        return to_dict(profile)
    schema = profile.get("schema")
    if schema != JSON_SCHEMA:
        raise InputError(f"not a flopscope profile document (schema {schema!r}, expected "
                         f"{JSON_SCHEMA!r}): write one with flopscope profile TARGET --json FILE")
    return profile


def _changes(before: Mapping[str, int], after: Mapping[str, int]) -> tuple[Change, ...]:
    changed = [Change(k, before.get(k, 0), after.get(k, 0)) for k in dict.fromkeys([*before, *after])
               if before.get(k, 0) != after.get(k, 0)]
    return tuple(sorted(changed, key=lambda c: (-abs(c.delta), c.key)))


def _rows_by_role(doc: Mapping[str, Any]) -> dict[str, list[Mapping[str, Any]]]:
    found: dict[str, list[Mapping[str, Any]]] = {}
    for row in doc.get("reconciliation", ()):
        found.setdefault(row["role"], []).append(row)
    return found


def _useful(rows: Iterable[Mapping[str, Any]]) -> int:
    return sum(row["measured"] if row.get("useful") is None else row["useful"] for row in rows)


_SOURCE = re.compile(r"\([^)]*\)")
_FLAGS = frozenset({"causal", "gated"})
"""The words of a basis that are flags of the closed form (the mask's causality, a gated
FFN's third matrix)."""
_USEFUL_FORM = "useful pairs per head Σᵢ min(n_k − n_q + i + 1, W); causal n_q·n_k − n_q(n_q−1)/2"


def _basis(row: Mapping[str, Any]) -> tuple[dict[str, str], set[str]]:
    """A row's hyper-parameters (``key=value``) and flags (``causal``, ``gated``), its
    sources left out."""
    values: dict[str, str] = {}
    flags: set[str] = set()
    for word in _SOURCE.sub(" ", row.get("basis") or "").split():
        key, sep, value = word.partition("=")
        if sep:
            values[key] = value
        elif word in _FLAGS:
            flags.add(word)
    return values, flags


def _why(role: str, before: list[Mapping[str, Any]], after: list[Mapping[str, Any]],
         useful: bool = False) -> str:
    """The closed-form hyper-parameters and mask flags that differ between the role's
    rows, and the blocks that have it; ``useful``: for the attention core's useful
    pairs (the mask's flags and window)."""
    if not before and not after:
        return "no closed form predicts this role (no reconciliation row)"
    form, names = ROLE_FORMS.get(role, ("", ()))
    parsed_a, parsed_b = [_basis(r) for r in before], [_basis(r) for r in after]
    keys = set(names) or {k for values, _ in parsed_a + parsed_b for k in values}
    if useful:
        keys |= {"window"}
    moved = []
    for key in sorted(keys, key=lambda k: (names.index(k) if k in names else len(names), k)):
        was, now = _values(parsed_a, key), _values(parsed_b, key)
        if was != now:
            moved.append(f"{key} {was or '-'} → {now or '-'}")
    flags_a = set.intersection(*(f for _, f in parsed_a)) if parsed_a else set()
    flags_b = set.intersection(*(f for _, f in parsed_b)) if parsed_b else set()
    moved += [f"{flag} → not {flag}" for flag in sorted(flags_a - flags_b)]
    moved += [f"not {flag} → {flag}" for flag in sorted(flags_b - flags_a)]
    if len(before) != len(after):
        moved.append(f"blocks {len(before)} → {len(after)}")
    if not moved:  # a parameter of the rows' basis that the form does not name (a new row kind's)
        others = {k for values, _ in parsed_a + parsed_b for k in values} - keys
        moved = [f"{key} {was or '-'} → {now or '-'}" for key in sorted(others)
                 if (was := _values(parsed_a, key)) != (now := _values(parsed_b, key))]
    if not moved:
        return "no closed-form parameter moved: see the modules and ops that changed"
    return ", ".join(moved) + (f" ({_USEFUL_FORM})" if useful else f" ({role} = {form})" if form else "")


def _values(parsed: list[tuple[dict[str, str], set[str]]], key: str) -> str:
    found = sorted({values[key] for values, _ in parsed if key in values},
                   key=lambda v: (len(v), v))
    return "/".join(found)


def _cells(change: Change) -> list[str]:
    ratio = change.ratio
    shown = "" if ratio is None or ratio == 1 else times(float(ratio))
    return [change.key or "(the model)", f"{change.before:,}", f"{change.after:,}",
            f"{change.delta:+,}" if change.delta else "0", shown, change.why]


def _line(change: Change) -> str:
    ratio = change.ratio
    factor = f" ({times(float(ratio))})" if ratio is not None and ratio != 1 else ""
    return f"{change.before:,} → {change.after:,} MACs, {change.delta:+,}{factor}"
