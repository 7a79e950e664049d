"""Role ranges over a ``torch.profiler`` trace: :func:`merge_torch_trace`. A profile's
own trace is :meth:`Profile.export_chrome_trace`; both are written by
:mod:`flopscope.render.chrome_trace`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..capture.records import captured
from . import chrome_trace

if TYPE_CHECKING:
    from .view import ProfileView


def merge_torch_trace(torch_trace: Mapping[str, Any] | str | Path,
                      prof: ProfileView) -> dict[str, Any]:
    """A ``torch.profiler`` trace (its ``export_chrome_trace`` JSON, or that file's
    path) with a process of role ranges added: each op flopscope recorded is matched,
    in execution order, to torch's event for the same ATen op (the outermost one:
    torch also lists the call inside flopscope's dispatch mode), and a range named
    after its role is laid over it with torch's own time and flopscope's counts in
    ``args``. Profile the same run with both (``torch.profiler.profile()`` around
    ``flopscope.profiler(model, mode="real")``). How many ops were matched is in
    ``otherData.flopscope``."""
    records = [captured(node) for node in prof.graph.nodes]
    return chrome_trace.merge_torch_trace(torch_trace, records, prof.role_assignments_by_op(),
                                          prof.total())
