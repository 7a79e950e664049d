r"""Collectives: which ops communicate, what each sends, the collectives a profile saw
and the closed forms of parallelism schemes, side by side.

A profile sees every collective a rank issues from Python (DTensor redistribution,
FSDP2, functional collectives, ``dist.all_reduce``, DDP's gradient all-reduce):
:meth:`Profile.collectives` lists them as :class:`CollectiveRow`\ s (kind, group size,
module, carried role, phase, calls, message bytes); :func:`megatron`, :func:`fsdp` and
:func:`ddp` say what those schemes send; :func:`compare` sets the two side by side.
Which ops communicate and how their message bytes are read:
:mod:`flopscope.formulas.collectives`; conventions: ``docs/conventions.md`` §12.
"""

from __future__ import annotations

from collections.abc import Sequence

from tabulate import tabulate

from ..formulas.collectives import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    BROADCAST,
    RECV,
    REDUCE_SCATTER,
    SEND,
    group_size,
    is_bookkeeping,
    kind_of,
    message_bytes,
)
from .collectives import CollectiveRow, PredictedCollective, collectives, ddp, fsdp, megatron

__all__ = [
    'ALL_GATHER', 'ALL_REDUCE', 'ALL_TO_ALL', 'BROADCAST', 'RECV', 'REDUCE_SCATTER', 'SEND',
    'CollectiveRow',
    'PredictedCollective', 'collectives', 'compare', 'ddp', 'fsdp', 'group_size', 'is_bookkeeping',
    'kind_of',
    'megatron', 'message_bytes',
]


def compare(measured: Sequence[CollectiveRow], predicted: Sequence[PredictedCollective],
            tablefmt: str = "simple") -> str:
    """Measured against predicted collectives, per kind and phase: calls and bytes side
    by side."""
    keys = list(dict.fromkeys([(p.kind, p.phase) for p in predicted] + [(m.kind, m.phase) for m in measured]))
    rows = []
    for kind, phase in keys:
        got = [m for m in measured if (m.kind, m.phase) == (kind, phase)]
        want = [p for p in predicted if (p.kind, p.phase) == (kind, phase)]
        got_calls, got_bytes = sum(m.calls for m in got), sum(m.bytes for m in got)
        want_calls, want_bytes = sum(p.calls for p in want), sum(p.bytes for p in want)
        same = "yes" if (got_calls, got_bytes) == (want_calls, want_bytes) else "NO"
        rows.append([kind, phase, got_calls, f"{got_bytes:,}", want_calls, f"{want_bytes:,}", same,
                     "; ".join(dict.fromkeys(p.basis for p in want)) or "-"])
    return tabulate(rows, headers=["collective", "phase", "calls", "bytes", "predicted calls",
                                   "predicted bytes",
                                   "match", "basis"], tablefmt=tablefmt, disable_numparse=True)
