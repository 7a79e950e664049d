"""What attention asks of the multiplies around it (docs/roles.md section 3.2).

- :func:`demand_projections`: ``q_proj`` / ``k_proj`` / ``v_proj`` for the projections
  behind an operand;
- :func:`demand_values`: ``v_proj`` behind the values of a weighted sum without a
  softmax;
- :func:`demand_out_proj`: ``out_proj`` for the projections after the attention output;
- :func:`free_product` and :func:`from_attention`: which activation products may start
  an instance.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ...capture.records import CapturedOp
from ...role import Role
from ..graph_view import GraphView, is_channelwise_conv, reach
from ..state import RoleState
from ._walks import behind_channelwise, claimed_by_family, concatenated, nearest_after, nearest_before, projections_of

aten = torch.ops.aten


def free_product(view: GraphView, state: RoleState, n: CapturedOp) -> bool:
    """An activation product no pass has claimed."""
    return view.is_activation_product(n) and n not in state.parts


def from_attention(view: GraphView, state: RoleState, operand: CapturedOp) -> bool:
    """``operand`` is computed from an attention core product already found (without
    another multiply)."""
    return any(Role(role).attention_core for m in nearest_before(view, operand) for role in state.parts.get(m, {}))


def demand_projections(view: GraphView, state: RoleState, operand: CapturedOp, role: str,
                        blocked: frozenset[Any] = frozenset()) -> set[CapturedOp]:
    """``role`` for the projections behind ``operand`` (looking through depthwise
    convolutions), except those that reach it only through a sine or cosine (a
    positional encoding of learned Fourier features, LightGlue's
    ``cos(projector(keypoints))`` rotating its queries and keys) or an op of
    ``blocked``."""
    stops = PERIODIC | blocked
    direct = set(behind_channelwise(view, operand, blocked=lambda n: view.packet(n) in stops))
    found = [demand for demand in projections_of(view, state, operand, role,
                                                 through_channelwise=True)
             if demand[0] in direct]
    # (a projection of an earlier step, read through its cache, is no projection of this instance)
    return {p for p, target, demanded in found if state.demand(p, target, demanded)}


PERIODIC = frozenset({aten.sin, aten.cos})
"""Periodic functions: what they make of a projection is a positional encoding, not
content."""


def demand_beside_decays(view: GraphView, state: RoleState, operand: CapturedOp,
                         role: str) -> set[CapturedOp]:
    """:func:`demand_projections`, also not through a cumulative sum: a decay
    accumulated over positions (KDA's ``q * exp(cumsum(g))``, ``g`` from its forget
    gate's projections) scales the queries and keys, it is no projection of them."""
    return demand_projections(view, state, operand, role, blocked=frozenset({aten.cumsum}))


def demand_out_proj(view: GraphView, state: RoleState, output: CapturedOp,
                    through_reductions: bool = False
                     ) -> set[CapturedOp]:
    found = set()
    for p in nearest_after(view, output, through_reductions):
        if view.is_conv_projection(p) and claimed_by_family(state, p):
            state.demand(p, view.activation_operand(p), Role.OUT_PROJ.value)
            found.add(p)
        elif view.is_weight_matmul(p) and p not in state.parts:
            a, b = view.matmul_operands(p)
            sources = [x for x in concatenated(view, view.activation_operand(p)) if view.descends_from(x, output)]
            # the attention output is one of several values the projection reads (a
            # parallel block)
            if sources:
                for x in sources:
                    state.demand_rows(p, x, Role.OUT_PROJ.value)
            else:
                state.demand(p, a if view.descends_from(a, output) else b, Role.OUT_PROJ.value)
            found.add(p)
    return found


def demand_values(view: GraphView, state: RoleState, operand: CapturedOp) -> set[CapturedOp]:
    """``v_proj`` for the weight matmuls the values of a weighted sum (without a
    softmax) come from (:func:`_value_sources`)."""
    found = [p for p in _value_sources(view, operand) if view.is_weight_matmul(p)
             and (p not in state.parts or p in state.demands)]
    for p in found:
        state.demand(p, operand, Role.V_PROJ.value)
    return set(found)


SOLVE_RHS = {aten.linalg_solve_triangular: 1, aten.triangular_solve: 0}
"""Triangular solves, and the position of their right-hand side ``B``
(``linalg_solve_triangular(A, B)``, ``triangular_solve(B, A)``): the solution's
columns are ``B``'s."""


def _value_sources(view: GraphView, start: CapturedOp) -> list[CapturedOp]:
    """The multiplies nearest behind ``start``, walking back through what carries values
    without making them: ops without multiplies, depthwise convolutions (their
    input), a triangular solve (its right-hand side: the delta rule's corrected
    values ``solve(I + β·K·Kᵀ, β·V)``), a square mix over positions (its right
    operand: :func:`_mixes_positions`), and past a per-position scale (the one-column
    operand of ``v * beta[..., None]``: a gate, not a source of the values' columns)."""
    def carries(n: CapturedOp) -> bool:
        return not n.macs or is_channelwise_conv(n) or view.packet(n) in SOLVE_RHS or _mixes_positions(view, n)

    def step(n: CapturedOp) -> Iterable[CapturedOp]:
        packet = view.packet(n)
        if packet in SOLVE_RHS:
            rhs = n.args[SOLVE_RHS[packet]] if len(n.args) > SOLVE_RHS[packet] else None
            return (rhs,) if isinstance(rhs, CapturedOp) else ()
        if n.macs and _mixes_positions(view, n):
            return (view.matmul_operands(n)[1],)
        if is_channelwise_conv(n):
            return (n.args[0],) if isinstance(n.args[0], CapturedOp) else ()
        inputs = view.inputs(n)
        if packet is aten.mul and n.output_shapes and n.output_shapes[0][-1:] != (1,):
            wide = tuple(x for x in inputs if x.output_shapes and x.output_shapes[0][-1:] == n.output_shapes[0][-1:])
            return wide or inputs
        return inputs

    return [n for n in reach([start], step, carries) if not carries(n)]


def _mixes_positions(view: GraphView, n: CapturedOp) -> bool:
    """``n`` is ``A @ V`` with ``A`` a square positions × positions matrix and ``V`` as
    many rows: a mix over positions keeps ``V``'s columns (KDA's in-chunk
    ``A @ (β·v)`` of its WY form, as a triangular solve does)."""
    if not view.is_activation_product(n):
        return False
    a, b = view.matmul_operands(n)
    left = a.output_shapes[0] if a.output_shapes else ()
    right = b.output_shapes[0] if b.output_shapes else ()
    return len(left) >= 2 and len(right) >= 2 and left[-1] == left[-2] == right[-2]
