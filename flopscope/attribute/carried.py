"""Roles found once and carried to other records: a capture's replayed calls take the
roles of the calls they copy (:func:`roles_with_copies`), and a capture of the same model
at another input length takes a template's (:func:`carried_roles`), so the role passes
never run twice over the same work.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from ..capture.module_tracker import ModuleCall
from ..capture.records import CapturedOp, LeafKind, link, map_records
from ..capture.replay.copy import renaming
from .columns import scale_parts
from .roles import Assignment, find_roles
from .rules import RoleRule

__all__ = ["carried_roles", "roles_with_copies"]

STUB_MULTIPLIES = 1
"""How many multiplies a stub's region crosses after a shared read (:func:`_condensed`):
the first ones reached and what follows them up to the next ones (a timestep
embedding's per-block modulation projection, and the broadcast of its result over the
positions that makes it conditioning)."""

def roles_with_copies(ops: Sequence[CapturedOp], copies: Mapping[CapturedOp, CapturedOp],
                      module_types: Mapping[str, type], rules: Sequence[RoleRule] = ()
                      ) -> dict[CapturedOp, Assignment]:
    """The role passes over a capture's records ``ops``, in graph order; a replayed
    call's records (``copies``: :attr:`Capture.copies`) take the roles of the records
    they copy, found once, on the capture condensed (:func:`_condensed`). A copy's block
    is its template's, renamed from the template's call to the copy's
    (``model.layers.0.mlp`` for layer 0 is ``model.layers.5.mlp`` for layer 5)."""
    if not copies:
        found = find_roles(ops, module_types, rules)
        # (in graph order, as with copies)
        return {op: found[op] for op in ops if op in found}
    link(ops)
    condensed, twins = _condensed(ops, copies)
    # (records of their own: the capture's links stay as they are)
    link(condensed, again=True)
    found = find_roles(condensed, module_types, rules)
    out: dict[CapturedOp, Assignment] = {}
    for op in ops:
        source = op
        while source in copies:
            source = copies[source]
        assignment = found.get(twins[source])
        if assignment is None:
            continue
        if source is not op:
            block = _renamed(assignment.block, source, op)
            if block != assignment.block:
                assignment = Assignment(assignment.parts, block, assignment.factor)
        out[op] = assignment
    return out


def _condensed(ops: Sequence[CapturedOp], copies: Mapping[CapturedOp, CapturedOp]
               ) -> tuple[list[CapturedOp], dict[CapturedOp, CapturedOp]]:
    """The records the role passes run over in place of ``ops``, in graph order, each a
    record of its own (the capture's records and their links are not touched), and
    ``{distinct record: its twin among them}``.

    - A distinct record reading a copy reads the record it copies instead (its twin
      does): the layer after a run of replayed ones reads the last distinct layer's
      output, the same op on the same shapes, so a model of 61 layers, 58 of them
      replayed, is seen as its few distinct layers in the order they first ran.
    - A copy reading a distinct record made outside its own call and its template's (a
      text embedding every block's cross-attention projects, the rotary tables, a mask)
      is kept as a stub, with the copies after it up to the second multiplies they
      reach (:data:`STUB_MULTIPLIES`), their other inputs stood in for by leaves: each
      such record has as many readers as in the whole capture (a projection read by 30
      blocks is no low-rank factor of one block's; a timestep embedding modulating
      every block is conditioning).
    - A distinct record made inside a replayed call (by a method of an object the call
      was given: a cache's update) reads that call's copies as leaves, not the
      template's records, and so the records such methods made in other replayed calls:
      a layer's cache grown by every decoding step is no chain through all the steps
      (each step's attention core, a stub where it reads the rotary tables, would walk
      it back: time quadratic in the steps)."""
    distinct: list[CapturedOp] = []
    twins: dict[CapturedOp, CapturedOp] = {}
    # copies kept as stubs -> theirs; the multiplies crossed to reach each from a shared
    # read (not for the weights stubs read)
    stubs: dict[CapturedOp, CapturedOp] = {}
    depth: dict[CapturedOp, int] = {}
    weights = _from_parameters(ops)
    calls = _ReplayedCalls(copies)

    def read(x: CapturedOp) -> CapturedOp:
        while x in copies:
            x = copies[x]
        return twins[x]

    def twin_of(op: CapturedOp, reads: Callable[[CapturedOp], CapturedOp], forward: CapturedOp | None) -> CapturedOp:
        made = replace(op, args=map_records(op.args, reads), kwargs=map_records(op.kwargs, reads), forward=forward)
        distinct.append(made)
        return made

    def reading_copies(op: CapturedOp) -> CapturedOp:
        # (its twin, reading stubs, twins and, for the other copies it reads, stubs of
        # the weights among them (computed from parameters alone, as the transpose a
        # linear layer takes) and leaves)
        leaves: dict[CapturedOp, CapturedOp] = {}
        for x in op.inputs:
            if x in copies and x not in stubs:
                if weights[x]:
                    stubs[x] = reading_copies(x)
                else:
                    leaves[x] = _leaf_like(x)
                    distinct.append(leaves[x])
            elif x not in copies and calls.elsewhere(x, op):
                leaves[x] = _leaf_like(x)
                distinct.append(leaves[x])
        return twin_of(op, functools.partial(_first_of, (stubs, leaves, twins)), None)

    for op in ops:
        if op in copies:
            crossed = min((depth[x] + bool(x.macs) for x in op.inputs if x in depth), default=None)
            if crossed is None and _shared_inputs(op, copies, calls):
                crossed = 0
            if crossed is not None and crossed <= STUB_MULTIPLIES:
                depth[op] = crossed
                stubs[op] = reading_copies(op)
            continue
        if calls.inside(op) and any(x in copies or calls.elsewhere(x, op) for x in op.inputs):
            twins[op] = reading_copies(op)
        else:
            twins[op] = twin_of(op, read, None if op.forward is None else read(op.forward))
    return distinct, twins


class _ReplayedCalls:
    """The module calls replayed in a capture, read from its copies: for a copy, the
    outermost module call where its stack and its template's differ, and the
    template's (worked out once per pair of stacks: a call's records share theirs)."""

    def __init__(self, copies: Mapping[CapturedOp, CapturedOp]) -> None:
        self._pairs: dict[tuple[int, int], tuple[ModuleCall | None, ModuleCall | None]] = {}
        self._copies = copies
        self.replayed: set[ModuleCall] = set()
        for copy in copies:
            mine = self.of(copy)[0]
            if mine is not None:
                self.replayed.add(mine)

    def of(self, copy: CapturedOp) -> tuple[ModuleCall | None, ModuleCall | None]:
        template = self._copies[copy]
        key = (id(copy.module_stack), id(template.module_stack))
        found = self._pairs.get(key)
        if found is None:
            found = self._pairs[key] = next(
                ((theirs, mine) for mine, theirs in zip(template.module_stack, copy.module_stack, strict=False)
                 if mine != theirs), (None, None))
        return found

    def inside(self, op: CapturedOp) -> bool:
        """``op`` ran inside a replayed call."""
        return any(frame in self.replayed for frame in op.module_stack)

    def elsewhere(self, x: CapturedOp, op: CapturedOp) -> bool:
        """``x``, a distinct record ``op`` (one made inside a replayed call) reads, was
        made inside another replayed call than ``op``'s."""
        return (x.node_op == "call_function" and self.inside(x)
                and not self.replayed.intersection(x.module_stack).intersection(op.module_stack))


def _shared_inputs(copy: CapturedOp, copies: Mapping[CapturedOp, CapturedOp], calls: _ReplayedCalls) -> bool:
    """``copy`` reads a distinct record (no leaf) made outside its own call and its
    template's."""
    own = None
    for x in copy.inputs:
        if x not in copies and x.node_op == "call_function":
            own = own or set(calls.of(copy))
            if not own.intersection(x.module_stack):
                return True
    return False


def _first_of(tables: Sequence[Mapping[CapturedOp, CapturedOp]], x: CapturedOp) -> CapturedOp:
    """``x`` as the first of ``tables`` that has it maps it (else ``x``)."""
    for table in tables:
        found = table.get(x)
        if found is not None:
            return found
    return x


def _from_parameters(ops: Sequence[CapturedOp]) -> dict[CapturedOp, bool]:
    """For each record of ``ops`` (in graph order), whether it is computed from
    parameters and buffers alone (a weight, a view of one, a transposed one)."""
    found: dict[CapturedOp, bool] = {}
    for op in ops:
        found[op] = (op.leaf in (LeafKind.PARAMETER, LeafKind.BUFFER) if op.node_op != "call_function" else
                     bool(op.inputs) and all(found.get(x, False) for x in op.inputs))
    return found


def _leaf_like(x: CapturedOp) -> CapturedOp:
    """An input leaf of ``x``'s shapes: what a stub reads in place of a copy."""
    return CapturedOp("placeholder", x.name, (), {}, x.name, x.phase, output_shapes=x.output_shapes, dtype=x.dtype,
                      leaf=LeafKind.INPUT)


def _renamed(block: str, template: CapturedOp, copy: CapturedOp) -> str:
    """``block`` (a module path of ``template``'s call) as the path it has where ``copy``
    ran: where the two records' stacks differ in a module call's path, the part of the
    paths before the names they end with in common is renamed, the outermost call first
    (``nets.0.blocks.0`` of a template is ``nets.1.blocks.3`` for a copy in the second
    net's fourth block)."""
    renames: list[Callable[[str], str]] = []

    def renamed(path: str) -> str:
        for rename in renames:
            path = rename(path)
        return path

    for mine, theirs in zip(template.module_stack, copy.module_stack, strict=False):
        old, new = renamed(mine.path).split("."), theirs.path.split(".")
        # (the names they end with in common are the same submodule of the two calls:
        # ``layers.0.attention`` and ``layers.1.attention`` rename ``layers.0``, the
        # block a group of both may have)
        while len(old) > 1 and len(new) > 1 and old[-1] == new[-1]:
            old, new = old[:-1], new[:-1]
        if old != new:
            renames.append(renaming(".".join(old), ".".join(new)))
    return renamed(block)


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
