"""Pass 2, attention (docs/roles.md section 3.2).

Claims ``attn_scores`` and ``attn_weighted_sum`` at each softmax fed by an activation
product, the parts of the linear form (``attn_kv_state``, ``attn_readout``,
``attn_normaliser``) where two activation products chain without a softmax, and asks for
the projections around each instance and around each attention kernel (``q_proj`` /
``k_proj`` / ``v_proj``, ``out_proj``). The state products of chunked linear attention
are in :mod:`.state_products`.
"""

from __future__ import annotations

import operator

import torch

from ...capture.records import CapturedOp
from ...formulas.elementwise import SOFTMAX_OPS, VALUE_COPIES
from ...formulas.registry import OpFamily, argument
from ...role import Role
from ..columns import holds_columns_along
from ..graph_view import GraphView, reach
from ..state import RoleState
from ._projections import demand_out_proj, demand_projections, demand_values, free_product, from_attention
from ._walks import nearest_after, nearest_before
from .state_products import state_products

aten = torch.ops.aten


def attention(view: GraphView, state: RoleState) -> None:
    """Attention at each softmax fed by an activation product, and around each attention
    kernel."""
    for s in view.nodes:
        if view.packet(s) in SOFTMAX_OPS:
            _attention_at_softmax(view, state, s)
    for n in view.nodes:
        parts = view.parts(n)
        spec = view.spec(n)
        if parts and spec is not None and spec.family is OpFamily.ATTENTION:
            members = {n}
            qkv = [n.args[i] if len(n.args) > i else None for i in spec.operands]
            for operand, role in zip(qkv, (Role.Q_PROJ, Role.K_PROJ, Role.V_PROJ), strict=True):
                if isinstance(operand, CapturedOp):
                    members |= demand_projections(view, state, operand, role.value)
            members |= _scores_in_the_bias(view, state, n)
            output = next((u for u in view.users(n) if u.target is operator.getitem and u.args[1] == 0), n)
            members |= demand_out_proj(view, state, output)
            state.groups.append(members)
        elif parts:
            state.groups.append({n})
    for first in view.nodes:
        if free_product(view, state, first):
            _attention_at_products(view, state, first)
    state_products(view, state)


def _scores_in_the_bias(view: GraphView, state: RoleState, kernel: CapturedOp) -> set[CapturedOp]:
    """Score work passed to an attention kernel as its additive mask: a product of two
    activations that reaches the kernel's ``attn_mask`` / ``attn_bias`` through ops
    without multiplies (relative-position scores q·rᵀ of Transformer-XL / Conformer
    attention) is ``attn_scores``, its operands' projections ``q_proj`` / ``k_proj``:
    what the same model's eager attention gives, where that product is added to q·kᵀ
    before the softmax."""
    bias = argument(kernel.target, kernel.args, kernel.kwargs, "attn_mask", "attn_bias", "bias")
    if not isinstance(bias, CapturedOp):
        return set()
    members: set[CapturedOp] = set()
    for m in nearest_before(view, bias):
        if view.is_activation_product(m) and m not in state.parts:
            state.claim(m, Role.ATTN_SCORES)
            a, b = view.matmul_operands(m)
            members |= {m, *demand_projections(view, state, a, Role.Q_PROJ.value),
                        *demand_projections(view, state, b, Role.K_PROJ.value)}
    return members


def _attention_at_softmax(view: GraphView, state: RoleState, s: CapturedOp) -> None:
    """One attention instance at the softmax ``s``: its score products, weighted sums
    and projections. Scores that another softmax already took (one score matrix
    normalised two ways: Grounding DINO's fusion attends vision to text and text to
    vision; LiLT adds its text and layout scores for each stream) make a second
    instance, of the weighted sums after ``s``: the product is charged once, as
    ``attn_scores`` of the first."""
    behind = [m for m in nearest_before(view, s.args[0], stop_at_softmax=True) if view.is_activation_product(m)]
    scores = [m for m in behind if m not in state.parts]
    shared = [m for m in behind if Role.ATTN_SCORES.value in state.parts.get(m, {})]
    if not scores and not shared:
        return
    weighted = [m for m in nearest_after(view, s) if view.is_activation_product(m) and m not in state.parts]
    if not weighted and (not scores or _unread(view, s)):
        # (a softmax nothing reads but copies: dead code, as Sam2's Hiera computes
        # softmax(q·kᵀ) over its heads at each position and drops it; its product is no
        # attention)
        return
    members: set[CapturedOp] = set(scores) | set(weighted)
    for m in scores:
        state.claim(m, Role.ATTN_SCORES)
        a, b = view.matmul_operands(m)
        if _transposed_on_the_way(view, m, s):
            # (DeBERTa's position-to-content scores, K·(P_q)ᵀ then transposed: the keys
            # come first)
            a, b = b, a
        members |= demand_projections(view, state, a, Role.Q_PROJ.value)
        members |= demand_projections(view, state, b, Role.K_PROJ.value)
    for m in weighted:
        state.claim(m, Role.ATTN_WEIGHTED_SUM)
        a, b = view.matmul_operands(m)
        value_side = b if view.descends_from(a, s) else a
        members |= demand_projections(view, state, value_side, Role.V_PROJ.value)
        members |= demand_out_proj(view, state, m)
    state.groups.append(members)


def _unread(view: GraphView, n: CapturedOp) -> bool:
    """Nothing reads ``n``'s result but copies of it (dtype changes, clones), which
    nothing reads either: a value the forward computes and drops (or returns as it
    is)."""
    return all(view.packet(m) in VALUE_COPIES for m in reach(view.users(n), view.users,
                                                             lambda m: True))


def _transposed_on_the_way(view: GraphView, product: CapturedOp, softmax: CapturedOp) -> bool:
    """The scores ``product`` makes reach the ``softmax`` with their last two axes
    swapped (an odd number of transposes on the way, through ops without multiplies):
    its left operand's positions end on the softmax's axis, the keys', so its left
    operand holds the keys. Queries and keys are told by which side's positions the
    softmax normalises over, not by operand order."""
    target = softmax.args[0] if softmax.args else None
    parity: dict[CapturedOp, bool] = {product: False}
    todo = [product]
    while todo:
        n = todo.pop(0)
        if n is target:
            return parity[n]
        for user in view.users(n):
            if user.macs or user in parity or view.packet(user) in SOFTMAX_OPS:
                continue
            parity[user] = parity[n] ^ _swaps_last_axes(user)
            todo.append(user)
    return False


def _swaps_last_axes(n: CapturedOp) -> bool:
    """``n`` is a transpose or permute that swaps its input's last two axes."""
    rank = len(n.output_shapes[0]) if n.output_shapes else 0
    if rank < 2:
        return False
    if n.target in (aten.transpose.int, aten.transpose_copy.int) and len(n.args) >= 3:
        return {n.args[1] % rank, n.args[2] % rank} == {rank - 2, rank - 1}
    if n.target in (aten.permute.default, aten.permute_copy.default) and len(n.args) >= 2:
        dims = [d % rank for d in n.args[1]]
        return dims[-2:] == [rank - 1, rank - 2]
    return n.target in (aten.t.default, aten.t_copy.default) and rank == 2


def _attention_at_products(view: GraphView, state: RoleState, first: CapturedOp) -> None:
    """Attention without a softmax: ``first`` (a product of two activations) reaches an
    operand of another activation product, whose result a weight matmul projects,
    through ops without multiplies (any normalisation: exp / logsumexp, sigmoid,
    ReLU, acos, none). Its result is the *left* operand of the second (weights x
    values): the quadratic form, ``attn_scores`` then ``attn_weighted_sum``; the
    *right* operand (queries x summary): the linear form, ``attn_kv_state`` (φ(K)ᵀV)
    then ``attn_readout`` (φ(Q)·state), with ``attn_normaliser`` for the other
    products of the same queries with a sum of the same keys."""
    a, b = view.matmul_operands(first)
    if from_attention(view, state, a) or from_attention(view, state, b):
        # a product of attention's own results (a pseudo-inverse's iterations): not a
        # new instance
        return
    seconds = [m for m in nearest_after(view, first) if m is not first and free_product(view, state, m)
               and _projected(view, state, m)]
    if not seconds:
        return
    linear = _contracts_positions(view, first)
    quadratic = [] if linear else [m for m in seconds if view.descends_from(view.matmul_operands(m)[0], first)]
    if quadratic and not _makes_a_positions_grid(view, first):
        # a product over another axis (Gemma 3n's AltUp mixes its streams at each
        # position): no attention
        return
    members = {first, *seconds}
    if quadratic:
        state.claim(first, Role.ATTN_SCORES)
        members |= demand_projections(view, state, a, Role.Q_PROJ.value)
        members |= demand_projections(view, state, b, Role.K_PROJ.value)
        for m in quadratic:
            state.claim(m, Role.ATTN_WEIGHTED_SUM)
            members |= demand_values(view, state, view.matmul_operands(m)[1])
            # a sum over hash rounds (LSH)
            members |= demand_out_proj(view, state, m, through_reductions=True)
        state.groups.append(members - (set(seconds) - set(quadratic)))
        return
    if all(view.descends_from(view.matmul_operands(m)[0], first) for m in seconds):
        # the state read from the left, S·φ(Q) (Sana's (V·φ(K)ᵀ)·φ(Q)): its right factor
        # is the keys
        a, b = b, a
    behind_k, behind_v = nearest_before(view, a), nearest_before(view, b)
    if not behind_k or not behind_v or not all(view.is_weight_matmul(p) for p in (*behind_k, *behind_v)):
        # keys and values are projections of the input, nothing else (a residual-stream
        # mix is not)
        return
    keys = set(behind_k)
    state.claim(first, Role.ATTN_KV_STATE)
    members |= demand_projections(view, state, a, Role.K_PROJ.value)
    members |= demand_projections(view, state, b, Role.V_PROJ.value)
    for m in seconds:
        state.claim(m, Role.ATTN_READOUT)
        x, y = view.matmul_operands(m)
        query = y if view.descends_from(x, first) else x  # φ(Q)·S, or S·φ(Q)
        members |= demand_projections(view, state, query, Role.Q_PROJ.value)
        members |= demand_out_proj(view, state, m, through_reductions=True)
        for z in view.frontier(view.through_no_macs(query), view.users):
            # (a readout of this state, claimed below, is no normaliser)
            if z is not m and z not in seconds and free_product(view, state, z) and _is_normaliser(view, z, keys):
                state.claim(z, Role.ATTN_NORMALISER)
                members.add(z)
    state.groups.append(members)


def _makes_a_positions_grid(view: GraphView, first: CapturedOp) -> bool:
    """The scores of a quadratic form are a positions × positions grid: no projection
    behind ``first``'s left operand has its output columns (features) along that
    operand's rows, nor one behind its right operand along that operand's columns. A
    product whose rows or columns run over features or streams mixes something else."""
    a, b = view.matmul_operands(first)
    for operand, axis in ((a, -2), (b, -1)):
        for p in nearest_before(view, operand):
            if view.is_weight_matmul(p) and holds_columns_along(p, operand, axis) is True:
                return False
    return True


def _contracts_positions(view: GraphView, first: CapturedOp) -> bool:
    """``first`` sums over positions, not over a head's features: along the axis its
    left operand contracts, every entry holds the same column of the projection
    behind it. That is a state product (φ(K)ᵀ·V, written either way round), whichever
    side the next product reads it from; scores (Q·Kᵀ) contract the features."""
    left = view.matmul_operands(first)[0]
    behind = [p for p in nearest_before(view, left) if view.is_weight_matmul(p)]
    return len(behind) == 1 and holds_columns_along(behind[0], left, -1) is False


def _is_normaliser(view: GraphView, z: CapturedOp, keys: set[CapturedOp]) -> bool:
    """φ(Q)·Σφ(K): one number per query (its output is one column wide) from a sum over
    the keys (a reduction between the key projections and its second operand)."""
    if tuple(z.output_shapes[0][-1:]) != (1,):
        return False
    summed = view.matmul_operands(z)[1]
    return bool(keys & {p for p in nearest_before(view, summed) if view.is_weight_matmul(p)}) and any(
        (x.elementwise or ("",))[0] == "reduction" for x in view.through_no_macs(summed))


def _projected(view: GraphView, state: RoleState, output: CapturedOp) -> bool:
    """A weight matmul takes ``output`` (through ops without multiplies, reductions
    included): the mixed values go on as data. A scoring product whose result only
    selects (DeepSeek's sparse-attention indexer feeding a top-k) is not attention's
    output."""
    return any(view.is_weight_matmul(p) and p not in state.parts for p in nearest_after(view, output, True))
