"""Flame-graph files of a profile: Brendan Gregg's folded stacks and speedscope's JSON.

Both are written from the profile's module call stacks
(:meth:`flopscope.Profile.by_stack`): one frame per module path, outermost first (the
root module, path ``""``, is the frame ``(model)``), weighted in **MACs**
(multiply-accumulates; FLOPs = 2 x MACs), integers. A stack's weight is the *self* MACs
of its innermost module: the ops that module ran outside any submodule. A frame's width
in the drawn graph (the sum of the weights of the stacks through it) is then its
module's inclusive MACs, ``by_module()[path]``. Stacks without MACs are left out.

- **Folded** (``flamegraph.pl``, inferno, speedscope read it): one line per stack,
  ``frame;frame;frame weight``. A frame name never holds ``;`` or a line break (each
  becomes ``_``).
- **speedscope** (https://www.speedscope.app/file-format-schema.json): ``shared.frames``
  lists the module paths, each phase is one ``"sampled"`` profile (unit ``"none"``: the
  weights are MACs) with one sample per stack, in the order the stacks first ran,
  ``weights`` its MACs, ``startValue`` 0 and ``endValue`` their sum.

This module takes plain data (stacks and their MACs), never a profile:
:meth:`Profile.export_folded` and :meth:`Profile.export_speedscope` pass it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import FlopscopeError
from .files import write_atomically

ROOT_FRAME = "(model)"
"""The frame of the root module (path ``""``)."""
SPEEDSCOPE_SCHEMA = "https://www.speedscope.app/file-format-schema.json"

Stacks = Mapping[tuple[str, ...], int]
"""``{(outermost module path, ..., innermost): self MACs}``, as :meth:`Profile.by_stack`
gives it."""


def frame_name(path: str) -> str:
    """The frame of a module path: the path itself (``""`` is :data:`ROOT_FRAME`), ``;``
    and line breaks as ``_``."""
    if path == "":
        return ROOT_FRAME
    return path.replace(";", "_").replace("\n", "_").replace("\r", "_")


def folded(stacks: Stacks) -> str:
    """The folded-stack text of ``stacks``: a line ``frame;...;frame MACs`` per stack
    with MACs, in order."""
    return "".join(f"{';'.join(frame_name(p) for p in stack)} {macs}\n" for stack, macs in stacks.items() if macs)


def folded_paths(path: str | Path, phases: Sequence[str]) -> dict[str, Path]:
    """Where :func:`export_folded` writes each phase: ``path`` itself for a single
    phase; for several, ``<stem>.<phase><suffix>`` beside it (``out.folded`` ->
    ``out.forward.folded``, ``out.backward.folded``; ``stacks.txt`` ->
    ``stacks.forward.txt``; a name without suffix gets ``.<phase>`` appended)."""
    out = Path(path)
    if len(phases) == 1:
        return {phases[0]: out}
    return {phase: out.with_name(f"{out.stem}.{phase}{out.suffix}") for phase in phases}


def export_folded(path: str | Path, by_phase: Mapping[str, Stacks]) -> list[Path]:
    """Write one folded-stack file per phase (:func:`folded_paths` names them) and
    return their paths, in the order of ``by_phase``. Each file is written whole (a
    temporary file, then renamed); a path that cannot be written raises a
    :class:`~flopscope.errors.FlopscopeError` naming it."""
    if not by_phase:
        raise FlopscopeError("nothing to write: the profile has no phase with counted ops")
    paths = folded_paths(path, list(by_phase))
    return [write_atomically(paths[phase], folded(stacks),
                             f"the folded stacks of the {phase} phase")
            for phase, stacks in by_phase.items()]


def speedscope(by_phase: Mapping[str, Stacks], name: str = "flopscope") -> dict[str, Any]:
    """The speedscope document (a dict) of ``by_phase``: one sampled profile per phase,
    MACs as weights."""
    frames: dict[str, int] = {}
    profiles = []
    for phase, stacks in by_phase.items():
        samples, weights = [], []
        for stack, macs in stacks.items():
            if not macs:
                continue
            samples.append([frames.setdefault(frame_name(p), len(frames)) for p in stack])
            weights.append(macs)
        profiles.append({"type": "sampled", "name": f"{name} {phase} (MACs)", "unit": "none",
                         "startValue": 0,
                         "endValue": sum(weights), "samples": samples, "weights": weights})
    return {"$schema": SPEEDSCOPE_SCHEMA, "name": f"{name} (MACs; FLOPs = 2 x MACs)",
            "exporter": "flopscope",
            "activeProfileIndex": 0, "shared": {"frames": [{"name": frame} for frame in frames]},
            "profiles": profiles}


def export_speedscope(path: str | Path, by_phase: Mapping[str, Stacks],
                      name: str = "flopscope") -> Path:
    """Write :func:`speedscope` to ``path`` (JSON), whole or not at all (a path that
    cannot be written raises a :class:`~flopscope.errors.FlopscopeError` naming it)."""
    if not by_phase:
        raise FlopscopeError("nothing to write: the profile has no phase with counted ops")
    return write_atomically(path, json.dumps(speedscope(by_phase, name), separators=(",", ":")),
                            "the speedscope profile")
