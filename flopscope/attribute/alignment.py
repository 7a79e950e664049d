"""Two captures of one model paired record by record, so that one's roles can be carried
to the other (a sweep's lengths, a symbolic trace and its concrete twin)."""

from __future__ import annotations

from collections.abc import Sequence

from ..capture.records import CapturedOp, Cost


def aligned(mine: Sequence[CapturedOp],
            theirs: Sequence[CapturedOp]) -> list[tuple[CapturedOp, CapturedOp]] | None:
    """``mine`` and ``theirs`` paired op by op, where both ran the same ops in the same
    order once the ops of no arithmetic (:attr:`Cost.ZERO`) that only one of them ran
    are passed over; ``None`` where they did not."""
    pairs: list[tuple[CapturedOp, CapturedOp]] = []
    i = j = 0
    while i < len(mine) or j < len(theirs):
        a = mine[i] if i < len(mine) else None
        b = theirs[j] if j < len(theirs) else None
        if a is not None and b is not None and a.target == b.target and a.node_op == b.node_op:
            pairs.append((a, b))
            i, j = i + 1, j + 1
        elif a is not None and a.cost is Cost.ZERO:
            i += 1
        elif b is not None and b.cost is Cost.ZERO:
            j += 1
        else:
            return None
    return pairs
