"""One counted op as a user reads it: the ATen op, where it ran, its MACs and the roles
they were given (:attr:`flopscope.Profile.records`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from torch import fx

from ..capture.records import Cost, captured
from ..role import Role
from .roles import Assignment

Shape = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class OpRecord:
    """One counted op: an ATen op with a multiply formula, as executed once."""

    op: str  # "aten.bmm"
    module: str  # innermost module path; "" is the root
    module_stack: tuple[str, ...]  # module paths of the calls running it, outermost first
    call: int  # which call of `module` (1 = first) executed it
    input_shapes: tuple[Shape, ...]
    output_shapes: tuple[Shape, ...]
    multiplies: int  # MACs; FLOPs = 2 * multiplies
    # {part: MACs} of a fused op (e.g. attn_scores / attn_weighted_sum)
    parts: Mapping[str, int] | None
    node: str  # name of the fx node in Profile.graph
    phase: str  # "forward" or "backward"
    role: Role  # the role that got most of this op's MACs
    # {role: MACs}, summing to `multiplies` (several for fused ops / fused QKV)
    roles: Mapping[str, int]
    block: str  # module path of the attention / FFN / conv block instance it belongs to


def op_records(nodes: Iterable[fx.Node],
               assignments: Mapping[fx.Node, Assignment]) -> tuple[OpRecord, ...]:
    """An :class:`OpRecord` per node of a capture's graph with a multiply formula, in
    order, with the roles ``assignments`` gives it (:attr:`flopscope.Profile.records`)."""
    records = []
    for node in nodes:
        op = captured(node)
        if op.cost is not Cost.FORMULA:
            continue
        assignment = assignments.get(node)
        records.append(OpRecord(
            op=op.op_name, module=op.module or "",
            module_stack=tuple(frame.path for frame in op.module_stack),
            call=op.module_stack[-1].call if op.module_stack else 0, input_shapes=op.input_shapes,
            output_shapes=op.output_shapes, multiplies=op.macs, parts=op.parts, node=node.name,
            phase=op.phase, role=Role(assignment.role) if assignment else Role.OTHER,
            roles=dict(assignment.parts) if assignment else {},
            block=assignment.block if assignment else op.module or ""))
    return tuple(records)
