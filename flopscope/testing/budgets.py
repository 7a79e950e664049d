"""FLOP budgets in test suites: assert a model's multiplies, or hold them to a snapshot.

    from flopscope.testing import assert_macs

    def test_block_cost():
        assert_macs(block, x, expected=3 * 128 * 512 * 512, roles={"attn_scores": 128 * 128 * 512})

    def test_model_cost(flops):                     # the fixture of the pytest plug-in (installed with flopscope)
        flops.check(model, ids)                     # against __flops__/<test name>.json next to the test file

A failure names every role (and, for snapshots, every module) whose count changed, with
both counts and the difference. ``pytest --flops-update`` rewrites the snapshots. Units:
MACs (FLOPs = 2 x MACs).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tabulate import tabulate
from torch import nn

from ..api import profile
from ..errors import BudgetError, ConfigurationError
from ..profile import Profile
from ..render.files import write_atomically

__all__ = ["FlopBudget", "assert_macs", "diff_table"]

SNAPSHOT_SCHEMA = "flopscope.snapshot/1"


def assert_macs(model: nn.Module, *inputs: Any, expected: int | None = None,
                roles: Mapping[str, int] | None = None,
                rel: float = 0.0, **profile_kwargs: Any) -> Profile:
    """Profile ``model(*inputs)`` (``profile_kwargs`` as for :func:`flopscope.profile`;
    ``mode="auto"`` by default) and fail with a
    :class:`~flopscope.errors.BudgetError` (an ``AssertionError``) and a per-role
    table unless its total is ``expected`` and each role of ``roles`` has its count,
    within a relative tolerance ``rel`` (0: exactly). Returns the profile."""
    if expected is None and not roles:
        raise ConfigurationError("assert_macs needs expected= (total MACs) or roles= ({role: MACs})")
    if rel < 0:
        raise ConfigurationError(f"rel must be >= 0; got {rel}")
    prof = profile(model, *inputs, **profile_kwargs)
    measured = prof.by_role()
    wanted = dict(roles or {})
    bad = [role for role, count in wanted.items() if not _close(measured.get(role, 0), count, rel)]
    total_bad = expected is not None and not _close(prof.total(), expected, rel)
    if bad or total_bad:
        rows = {role: (wanted[role], measured.get(role, 0)) for role in wanted}
        if expected is not None:
            rows["total"] = (expected, prof.total())
        within = "exactly" if rel == 0 else f"within {rel:.2%}"
        raise BudgetError(f"{type(model).__name__}: MACs not as expected ({within}):\n"
                             f"{diff_table(rows, ('expected', 'measured'))}")
    return prof


def _close(measured: int, expected: int, rel: float) -> bool:
    return measured == expected if rel == 0 else abs(measured - expected) <= rel * abs(expected)


def diff_table(rows: Mapping[str, tuple[int, int]], names: tuple[str, str] = ("baseline", "now"),
               tablefmt: str = "simple") -> str:
    """``{name: (before, after)}`` as a table with the difference, changed rows marked."""
    body = [[name, f"{a:,}", f"{b:,}", f"{b - a:+,}" if a != b else "0",
             "CHANGED" if a != b else ""]
            for name, (a, b) in rows.items()]
    return tabulate(body, headers=["", *names, "difference", ""], tablefmt=tablefmt,
                    disable_numparse=True)


@dataclass
class FlopBudget:
    """Snapshot budgets of one test: :meth:`check` counts a model and compares it with
    the JSON baseline ``directory / f"{name}.json"`` (a test may check several
    models: ``key=`` names each). A missing baseline is written and the check passes;
    ``update=True`` (``pytest --flops-update``) rewrites it; otherwise any change in
    the total, a role or a module fails with both diffs."""

    directory: Path
    name: str
    update: bool = False

    def check(self, model: nn.Module, *inputs: Any, key: str = "",
              **profile_kwargs: Any) -> Profile:
        prof = profile(model, *inputs, **profile_kwargs)
        path = self.directory / f"{self.name}{'.' + key if key else ''}.json"
        now = _snapshot(prof)
        if self.update or not path.exists():
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise ConfigurationError(f"cannot make the snapshot directory {path.parent}: "
                                         f"{e.strerror or e}"
                                         ) from e
            write_atomically(path, json.dumps(now, indent=2, sort_keys=True) + "\n", "the snapshot")
            return prof
        before = _read_snapshot(path)
        if before["macs"] != now["macs"] or before["roles"] != now["roles"] or before["modules"] != now["modules"]:
            roles = _changed(before["roles"], now["roles"]) | {"total": (before["macs"], now["macs"])}
            modules = _changed(before["modules"], now["modules"], only_changed=True)
            raise BudgetError(
                f"{type(model).__name__}: MACs differ from the snapshot {path} (pytest "
                f"--flops-update accepts them):\nby role:\n{diff_table(roles)}\nby module (changed "
                f"only):\n{diff_table(modules) if modules else '(none)'}")
        return prof


def _read_snapshot(path: Path) -> dict[str, Any]:
    """The baseline at ``path``, or a :class:`~flopscope.errors.ConfigurationError`
    saying what is wrong with the file and how to replace it."""
    fix = "delete it, or run pytest --flops-update to write it from this run's counts"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigurationError(f"the FLOP snapshot {path} is not JSON ({e}); {fix}") from e
    except OSError as e:
        raise ConfigurationError(f"cannot read the FLOP snapshot {path}: {e.strerror or e}") from e
    if not isinstance(doc, dict) or doc.get("schema") != SNAPSHOT_SCHEMA:
        schema = doc.get("schema") if isinstance(doc, dict) else None
        found = f"schema {schema!r}" if schema else "no schema"
        raise ConfigurationError(f"{path} is not a flopscope snapshot ({SNAPSHOT_SCHEMA}; it has "
                                 f"{found}); {fix}")
    if not all(isinstance(doc.get(key), kind) for key, kind in (("macs", int), ("roles", dict),
                                                                ("modules", dict))):
        raise ConfigurationError(f"the FLOP snapshot {path} lacks its macs, roles or modules; {fix}")
    return doc


def _snapshot(prof: Profile) -> dict[str, Any]:
    return {"schema": SNAPSHOT_SCHEMA, "units": "MACs (FLOPs = 2 x MACs)", "macs": prof.total(),
            "roles": {role: macs for role, macs in prof.by_role().items() if macs},
            "modules": {path or "(root)": macs for path, macs in prof.by_module().items() if macs}}


def _changed(before: Mapping[str, int], after: Mapping[str, int],
             only_changed: bool = False) -> dict[str, tuple[int, int]]:
    keys = list(dict.fromkeys([*before, *after]))
    rows = {key: (before.get(key, 0), after.get(key, 0)) for key in keys}
    return {key: pair for key, pair in rows.items() if not only_changed or pair[0] != pair[1]}
