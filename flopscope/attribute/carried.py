"""Roles found once and carried to other records: a capture's replayed calls take the
roles of the calls they copy (:func:`roles_with_copies`), and a capture of the same model
at another input length takes a template's (:func:`carried_roles`), so the role passes
never run twice over the same work.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

from ..capture.records import CapturedOp, link
from .columns import scale_parts
from .roles import Assignment, find_roles
from .rules import RoleRule

__all__ = ["carried_roles", "roles_with_copies"]

_PART_LINKED = threading.Lock()
"""Held while the role passes run over part of a capture's records, linked as a capture
of their own."""


def roles_with_copies(ops: Sequence[CapturedOp], copies: Mapping[CapturedOp, CapturedOp],
                      module_types: Mapping[str, type], rules: Sequence[RoleRule] = ()
                      ) -> dict[CapturedOp, Assignment]:
    """The role passes over a capture's records ``ops``, in graph order; a replayed
    call's records (``copies``: :attr:`Capture.copies`) take the roles of the records
    they copy, found once: the passes run over the records of the distinct calls only
    (linked as a capture of their own, then the whole capture linked again), and over
    the copies those read."""
    if not copies:
        found = find_roles(ops, module_types, rules)
        # (in graph order, as with copies)
        return {op: found[op] for op in ops if op in found}
    link(ops)
    # copies that records of the passes read (a captured call taking a replayed call's
    # output), and what those copies read: the passes run over them too
    needed: set[CapturedOp] = set()
    reading = [source for op in ops if op not in copies for source in op.inputs if source in copies]
    while reading:
        source = reading.pop()
        if source not in needed:
            needed.add(source)
            reading.extend(x for x in source.inputs if x in copies)
    distinct = [op for op in ops if op not in copies or op in needed]
    # (while part of the records are linked, no other thread reads their links)
    with _PART_LINKED:
        try:
            found = find_roles(distinct, module_types, rules)
        finally:
            link(ops, again=True)
    return {op: found[copies.get(op, op)] for op in ops if copies.get(op, op) in found}


def carried_roles(pairs: Sequence[tuple[CapturedOp, CapturedOp]],
                  theirs: Mapping[CapturedOp, Assignment]
                  ) -> dict[CapturedOp, Assignment]:
    """The roles of the first record of each pair (:func:`~.alignment.aligned`) carried
    from the second's, ``theirs``: each keeps its template's role fractions (a fused
    projection splits by columns, independent of length; a fused kernel's parts are its
    own)."""
    roles: dict[CapturedOp, Assignment] = {}
    for mine, other in pairs:
        source = theirs.get(other)
        if source is None:
            continue
        parts = dict(mine.parts) if mine.parts else (scale_parts(source.parts, mine.macs) if mine.macs
                                                     else dict(source.parts))
        roles[mine] = Assignment(parts, source.block, source.factor)
    return roles
