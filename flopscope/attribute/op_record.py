"""One counted op as a user reads it: the ATen op, where it ran, its MACs and the roles
they were given (:attr:`flopscope.Profile.records`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..role import Role

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
