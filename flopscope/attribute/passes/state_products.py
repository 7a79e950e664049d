"""Pass 2, attention: the state of chunked linear attention (docs/roles.md 3.2.2).

Claims ``attn_kv_state`` for the products that write a state and ``attn_readout`` for
those that read it (gated DeltaNet, Kimi's KDA), and asks for the keys, values, queries
and output around them. Run at the end of
:func:`~flopscope.attribute.passes.attention.attention`.
"""

from __future__ import annotations

import torch

from ...capture.records import CapturedOp
from ...role import Role
from ..graph_view import GraphView, reach
from ..state import RoleState
from ._projections import demand_beside_decays, demand_out_proj, demand_values, free_product, from_attention
from ._walks import pass_through_root

aten = torch.ops.aten


def state_products(view: GraphView, state: RoleState) -> None:
    """The recurrent state of chunked linear attention (gated DeltaNet, Kimi's KDA),
    beside or without its in-chunk quadratic form. A product of two activations
    writes the state, ``attn_kv_state``, when its right operand is the values of a
    weighted sum found (``kᵀ·v`` with the same ``v`` the chunk's weights multiply;
    its left operand not attention's weights), or when its right operand is the
    values less a read of the very state it writes (the delta rule:
    ``v_new = v − k·S``, then ``S·decay + kᵀ·v_new``; KDA's in-chunk scores are
    elementwise, so no weighted sum is found there). The state is the write's result
    and what it is accumulated with (``S·decay + kᵀ·v``: tensors of the state's
    shape, the initial state included); every product whose right operand is a state
    reads it, ``attn_readout`` (``q·S``, and the delta rule's ``k·S``, the part of
    the values the state already predicts). Each joins the attention instance of its
    weighted sum, or forms one. Mamba-2's chunk states (``Bᵀ·x``, with ``x`` read by
    no state) stay ``other``."""
    free = [m for m in view.nodes if free_product(view, state, m)]
    if not free:
        return  # every product of two activations is attention's already
    values: dict[CapturedOp, CapturedOp] = {}
    for m, parts in state.parts.items():
        if Role.ATTN_WEIGHTED_SUM.value in parts and view.is_matmul(m):
            values.setdefault(pass_through_root(view, view.matmul_operands(m)[1]), m)
    # a right operand's root -> the free matmuls reading it
    readers_of: dict[CapturedOp, list[CapturedOp]] = {}
    for m in view.nodes:
        if view.is_matmul(m) and m not in state.parts and not view.parts(m):
            readers_of.setdefault(pass_through_root(view, view.matmul_operands(m)[1]), []).append(m)
    # state product -> the weighted sum (or write) it belongs with
    writes: dict[CapturedOp, CapturedOp] = {}
    for m in free:
        a, b = view.matmul_operands(m)
        weighted = values.get(pass_through_root(view, b))
        if weighted is not None and not from_attention(view, state, a):
            writes[m] = weighted
        elif _corrected_by_a_read(view, b, {r for x in _states_of(view, m) for r in readers_of.get(x, ())} - {m}):
            writes[m] = m  # the delta rule: its values are corrected by a read of its own state
    for m in writes:
        state.claim(m, Role.ATTN_KV_STATE)
    # a state -> the weighted sum (or write) whose instance it belongs to
    states: dict[CapturedOp, CapturedOp] = {}
    for m, anchor in writes.items():
        for x in _states_of(view, m):
            states.setdefault(x, anchor)
    for root, readers in readers_of.items():
        for m in readers:
            if root in states and m not in state.parts:
                state.claim(m, Role.ATTN_READOUT)
                writes[m] = states[root]
    instances: dict[CapturedOp, set[CapturedOp]] = {}
    for m, anchor in writes.items():
        instances.setdefault(anchor, {anchor}).add(m)
    corrections = {pass_through_root(view, x) for m in writes if Role.ATTN_KV_STATE.value in state.parts[m]
                   for x in _correction_reads(view, view.matmul_operands(m)[1])}
    # the projections around the state: keys and values that write it, queries that read
    # it, the output (KDA's in-chunk scores are elementwise: nothing else asks for them)
    for m, anchor in writes.items():
        a, b = view.matmul_operands(m)
        members = instances[anchor]
        if Role.ATTN_KV_STATE.value in state.parts[m]:
            members |= demand_beside_decays(view, state, a, Role.K_PROJ.value) | demand_values(view, state, b)
        elif m not in corrections:
            # (not the delta rule's k·S: the part of the values the state predicts)
            members |= demand_beside_decays(view, state, a, Role.Q_PROJ.value)
            members |= demand_out_proj(view, state, m, through_reductions=True)
    for anchor, members in instances.items():
        group = next((g for g in state.groups if anchor in g), None)
        if group is None:
            state.groups.append(members)
        else:
            group |= members


def _correction_reads(view: GraphView, values: CapturedOp) -> list[CapturedOp]:
    """The reads ``values`` is corrected by (``v − read``, through views and copies), if
    it is a correction."""
    correction = pass_through_root(view, values)
    return list(view.inputs(correction)[1:]) if view.packet(correction) in (aten.sub, aten.sub_) else []


def _corrected_by_a_read(view: GraphView, values: CapturedOp, reads: set[CapturedOp]) -> bool:
    """``values`` is ``v − read`` (through views and copies) with ``read`` one of
    ``reads``: the delta rule's correction of the values by what the state already
    predicts."""
    correction = pass_through_root(view, values)
    return view.packet(correction) in (aten.sub, aten.sub_) and any(
        pass_through_root(view, x) in reads for x in view.inputs(correction)[1:])


def _states_of(view: GraphView, write: CapturedOp) -> list[CapturedOp]:
    """The state a state product writes: the records without multiplies its result
    reaches, and those each of them is accumulated from that have the state's shape
    (its last two dims: the previous or initial state)."""
    shape = tuple(write.output_shapes[0][-2:])

    def state_shaped(y: CapturedOp) -> bool:
        return not y.macs and bool(y.output_shapes) and tuple(y.output_shapes[0][-2:]) == shape

    found: dict[CapturedOp, None] = {}
    for x in reach(view.users(write), view.users, lambda x: not x.macs):
        if not x.macs:
            found.update(dict.fromkeys(y for y in reach([x], view.inputs, state_shaped) if state_shaped(y)))
    return list(found)
