"""A capture's records summed once for :class:`~flopscope.profile.Profile`'s queries:
each counted op with the module paths it ran inside and its phase, each op that moves
memory likewise, and the elementwise ops per category and per op (:func:`tally`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from ..capture.records import CapturedOp, Cost
from .paths import enclosing

__all__ = ["Tally", "tally"]


@dataclass(frozen=True)
class Tally:
    # (op, MACs, module paths on the stack, phase) per counted op
    counted: list[tuple[str, int, frozenset[str], str]]
    # (bytes, module paths on the stack, phase) per op that moves memory
    moved: list[tuple[int, frozenset[str], str]]
    elementwise: dict[str, int]  # elementwise ops per category
    elementwise_by_op: dict[str, int]  # elementwise ops per op name


def tally(ops: Sequence[CapturedOp], uncalled: Collection[str]) -> Tally:
    """The records ``ops`` summed once, each with the module paths it ran inside
    (:func:`~flopscope.attribute.paths.enclosing`, ``uncalled``: the module paths that
    never ran)."""
    counted: list[tuple[str, int, frozenset[str], str]] = []
    moved: list[tuple[int, frozenset[str], str]] = []
    elementwise: Counter[str] = Counter()
    elementwise_by_op: Counter[str] = Counter()
    # id(module stack) -> its paths (the ops of a call share one stack)
    paths_of: dict[int, frozenset[str]] = {}
    for op in ops:
        paths = paths_of.get(id(op.module_stack))
        if paths is None:
            paths = paths_of[id(op.module_stack)] = enclosing((frame.path for frame in op.module_stack), uncalled)
        if op.bytes:
            moved.append((op.bytes, paths, op.phase))
        if op.cost is Cost.FORMULA:
            counted.append((op.op_name, op.macs, paths, op.phase))
        elif op.cost is Cost.ELEMENTWISE and op.elementwise is not None:
            category, count = op.elementwise
            elementwise[category] += count
            elementwise_by_op[op.op_name] += count
    return Tally(counted, moved, dict(elementwise), dict(elementwise_by_op))
