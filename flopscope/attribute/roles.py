"""Semantic roles: which multiplies are Q/K/V projections, attention scores, FFN, convolution, ...

Roles are found from the dataflow of the captured graph (see :mod:`flopscope.capture.recorder`), not from module
names, by an ordered pipeline of small passes (:data:`PASSES`) over a read-only
:class:`~flopscope.attribute.graph_view.GraphView`. Each pass claims only multiplies that no earlier pass
claimed; projections a pass asks for are settled (split by columns where several roles want one
projection) before the next pass starts; rows asked for (a projection reading a concatenation) are settled
after the FFN pass. Definitions: ``docs/roles.md``.

1. **by family**: fused kernels (SDPA, the ``nn.MultiheadAttention`` / ``nn.TransformerEncoderLayer`` fast
   paths, recurrent kernels) are split by their formula's parts; convolutions are ``conv``, Fourier
   transforms (``OpFamily.TRANSFORM``: the FFT kernels) ``token_mixing``.
2. **attention**: a *softmax* whose nearest multiply ancestor multiplies two activations is attention;
   that matmul is ``attn_scores``, the activation x activation matmuls that consume the softmax are
   ``attn_weighted_sum``. The weight matmuls (one operand a parameter, the other an activation) nearest
   to the query / key / value operands, through views, transposes, rotary embeddings, norms, repeated
   KV heads and caches, are ``q_proj`` / ``k_proj`` / ``v_proj``; the nearest weight matmul consuming
   the attention output is ``out_proj``. An attention kernel's operands are its q, k, v.
   **Without a softmax** (LSH's exp(x − logsumexp x), sigmoid, ReLU, YOSO's acos, linear attention): an
   activation product whose result reaches an operand of another activation product through ops without
   multiplies. Reaching its left operand (weights x values) is the quadratic form (``attn_scores``,
   ``attn_weighted_sum``); its right operand (queries x summary) the linear form: ``attn_kv_state``
   (φ(K)ᵀV), ``attn_readout`` (φ(Q)·state) and ``attn_normaliser`` (φ(Q)·Σφ(K)). Products of an
   attention's own results (a Nyström pseudo-inverse) start no new instance.
3. **logits**: a weight matmul whose weight is an embedding table (tied) or has its shape.
4. **FFN**: a weight matmul whose input passes an activation function from nearer weight matmuls is
   ``ffn_down``; those are ``ffn_up``, or, when two branches are multiplied elementwise (SwiGLU, GeGLU),
   the branch through the activation is ``ffn_gate`` and the other ``ffn_up``. Position-wise only: a hidden
   layer whose result is broadcast over positions (one vector per sample: a timestep MLP, adaLN) is
   conditioning. A down projection reading a concatenation is judged per part, and split by rows.
5. **low-rank updates and factors**: a weight-matmul chain from a projection's input added to its output (LoRA's
   B·A) takes the projection's roles; so does a weight matmul only attention projections read (MLA's latents).
6. everything left is ``other`` (routers, poolers, classifier heads, rotary frequencies, conditioning, ...);
7. **rules**: :class:`RoleRule` data (module type or module-path pattern -> role) for what dataflow
   cannot see; built in: every multiply inside an ``nn.RNNBase`` / ``nn.RNNCellBase`` is ``recurrent``;
   then the user's rules, which win.

Which ops are matmuls (and where their operands are), convolutions or attention kernels comes from the
formula registry (:class:`~flopscope.formulas.registry.OpFamily`), so a new op is found once it is registered.
A backward op takes the roles of the forward op whose autograd node ran it.
"""

from __future__ import annotations

import heapq
import math
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch

from ..capture.records import CapturedOp, Cost, after_write
from ..formulas import elementwise
from ..formulas.elementwise import EMBEDDING_LOOKUPS, PRODUCT_OPS, SOFTMAX_OPS, VALUE_COPIES
from ..formulas.registry import OpFamily, argument, prod
from ..role import ROLE_ORDER, Role, parse_role
from .columns import columns, holds_columns_along, scale_parts, split_by_rows
from .graph_view import SUM_OPS, GraphView, is_channelwise_conv, numel_of, reach, rows_of, spreads, weighs_rows
from .paths import common_path
from .rules import BUILTIN_RULES, RoleRule
from .state import Pass, RoleState

aten = torch.ops.aten

BARRIER_CATEGORIES = ("norm", "reduction")  # the attention output does not flow to out_proj through these
FAMILY_ROLES = {OpFamily.CONV: Role.CONV, OpFamily.TRANSFORM: Role.TOKEN_MIXING}
"""Families whose every op has one role of its own, whatever the dataflow around it."""


@dataclass(frozen=True)
class Assignment:
    """Roles of one multiply node: ``{role: MACs}``, summing to the node's multiplies."""

    parts: Mapping[str, int]  # read-only
    block: str  # module path of the attention / FFN / conv block instance it belongs to
    factor: bool = False  # a factor of projections it feeds (section 3.5): its tokens are theirs, not more tokens

    def __post_init__(self) -> None:
        object.__setattr__(self, "parts", MappingProxyType(dict(self.parts)))

    @property
    def role(self) -> str:
        """The role with most MACs."""
        return max(self.parts, key=self.parts.__getitem__)


def find_roles(ops: Sequence[CapturedOp], module_types: Mapping[str, type], rules: Sequence[RoleRule] = ()
               ) -> dict[CapturedOp, Assignment]:
    """The role split of every record with multiplies (forward and backward) of a capture (its ops in order)."""
    view = GraphView(ops)
    state = RoleState()
    builtin = rules_pass(BUILTIN_RULES, module_types, only_unfused=True)
    first, *rest = PASSES
    for step in (first, builtin, *rest, builtin, rules_pass(tuple(rules), module_types, only_unfused=False)):
        step(view, state)
        state.settle(view)
    forward = _with_blocks(view, state)
    return {**forward, **_backward(view, forward)}


# --------------------------------------------------------------------------------------------------
# pass 1: by family
def by_family(view: GraphView, state: RoleState) -> None:
    """Fused kernels keep their formula's parts; convolutions are ``conv``, Fourier transforms
    ``token_mixing`` (:data:`FAMILY_ROLES`)."""
    for n in view.nodes:
        if not n.macs:
            continue
        parts = view.parts(n)
        spec = view.spec(n)
        if parts:
            state.claim(n, dict(parts))
        elif spec is not None and spec.family in FAMILY_ROLES:
            state.claim(n, FAMILY_ROLES[spec.family])


def weight_work(view: GraphView, state: RoleState) -> None:
    """Products that compute a weight, not a projection of tokens: a multiply that depends on none of the forward's
    inputs and is computed from an identity matrix made in the forward (DoRA's ``lora_B(lora_A(eye))``, the adapter's
    ``B·A`` for its weight norm, once per call whatever the tokens) is ``other``, so that no projection search takes
    it for a projection of the values it scales."""
    from_eye: dict[CapturedOp, bool] = {}
    for n in view.nodes:  # in graph order: a node's inputs come first
        from_eye[n] = not view.dynamic[n] and (view.packet(n) is aten.eye or any(from_eye.get(x, False)
                                                                                 for x in n.inputs))
        if from_eye[n] and n.macs and not state.claimed(n):
            state.claim(n, Role.OTHER)


# --------------------------------------------------------------------------------------------------
# pass 2: attention
def attention(view: GraphView, state: RoleState) -> None:
    """Attention at each softmax fed by an activation product, and around each attention kernel."""
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
                    members |= _demand_projections(view, state, operand, role.value)
            members |= _scores_in_the_bias(view, state, n)
            output = next((u for u in view.users(n) if u.target is operator.getitem and u.args[1] == 0), n)
            members |= _demand_out_proj(view, state, output)
            state.groups.append(members)
        elif parts:
            state.groups.append({n})
    for first in view.nodes:
        if _free_product(view, state, first):
            _attention_at_products(view, state, first)
    _state_products(view, state)


def _state_products(view: GraphView, state: RoleState) -> None:
    """The recurrent state of chunked linear attention (gated DeltaNet, Kimi's KDA), beside or without its in-chunk
    quadratic form. A product of two activations writes the state, ``attn_kv_state``, when its right operand is the
    values of a weighted sum found (``kᵀ·v`` with the same ``v`` the chunk's weights multiply; its left operand not
    attention's weights), or when its right operand is the values less a read of the very state it writes (the
    delta rule: ``v_new = v − k·S``, then ``S·decay + kᵀ·v_new``; KDA's in-chunk scores are elementwise, so no
    weighted sum is found there). The state is the write's result and what it is accumulated with (``S·decay +
    kᵀ·v``: tensors of the state's shape, the initial state included); every product whose right operand is a state
    reads it,
    ``attn_readout`` (``q·S``, and the delta rule's ``k·S``, the part of the values the state already predicts). Each
    joins the attention instance of its weighted sum, or forms one. Mamba-2's chunk states (``Bᵀ·x``, with ``x`` read
    by no state) stay ``other``."""
    free = [m for m in view.nodes if _free_product(view, state, m)]
    if not free:
        return  # every product of two activations is attention's already
    values: dict[CapturedOp, CapturedOp] = {}
    for m, parts in state.parts.items():
        if Role.ATTN_WEIGHTED_SUM.value in parts and view.is_matmul(m):
            values.setdefault(_pass_through_root(view, view.matmul_operands(m)[1]), m)
    readers_of: dict[CapturedOp, list[CapturedOp]] = {}  # a right operand's root -> the free matmuls reading it
    for m in view.nodes:
        if view.is_matmul(m) and m not in state.parts and not view.parts(m):
            readers_of.setdefault(_pass_through_root(view, view.matmul_operands(m)[1]), []).append(m)
    writes: dict[CapturedOp, CapturedOp] = {}  # state product -> the weighted sum (or write) it belongs with
    for m in free:
        a, b = view.matmul_operands(m)
        weighted = values.get(_pass_through_root(view, b))
        if weighted is not None and not _from_attention(view, state, a):
            writes[m] = weighted
        elif _corrected_by_a_read(view, b, {r for x in _states_of(view, m) for r in readers_of.get(x, ())} - {m}):
            writes[m] = m  # the delta rule: its values are corrected by a read of its own state
    for m in writes:
        state.claim(m, Role.ATTN_KV_STATE)
    states: dict[CapturedOp, CapturedOp] = {}  # a state -> the weighted sum (or write) whose instance it belongs to
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
    corrections = {_pass_through_root(view, x) for m in writes if Role.ATTN_KV_STATE.value in state.parts[m]
                   for x in _correction_reads(view, view.matmul_operands(m)[1])}
    for m, anchor in writes.items():  # the projections around the state: keys and values that write it, queries
        a, b = view.matmul_operands(m)  # that read it, the output (KDA's in-chunk scores are elementwise: nothing
        members = instances[anchor]  # else asks for them)
        if Role.ATTN_KV_STATE.value in state.parts[m]:
            members |= _demand_beside_decays(view, state, a, Role.K_PROJ.value) | _demand_values(view, state, b)
        elif m not in corrections:  # (the delta rule's k·S: the part of the values the state predicts)
            members |= _demand_beside_decays(view, state, a, Role.Q_PROJ.value)
            members |= _demand_out_proj(view, state, m, through_reductions=True)
    for anchor, members in instances.items():
        group = next((g for g in state.groups if anchor in g), None)
        if group is None:
            state.groups.append(members)
        else:
            group |= members


def _demand_beside_decays(view: GraphView, state: RoleState, operand: CapturedOp, role: str) -> set[CapturedOp]:
    """:func:`_demand_projections`, also not through a cumulative sum: a decay accumulated over positions (KDA's
    ``q * exp(cumsum(g))``, ``g`` from its forget gate's projections) scales the queries and keys, it is no
    projection of them."""
    return _demand_projections(view, state, operand, role, blocked=frozenset({aten.cumsum}))


def _correction_reads(view: GraphView, values: CapturedOp) -> list[CapturedOp]:
    """The reads ``values`` is corrected by (``v − read``, through views and copies), if it is a correction."""
    correction = _pass_through_root(view, values)
    return list(view.inputs(correction)[1:]) if view.packet(correction) in (aten.sub, aten.sub_) else []


def _corrected_by_a_read(view: GraphView, values: CapturedOp, reads: set[CapturedOp]) -> bool:
    """``values`` is ``v − read`` (through views and copies) with ``read`` one of ``reads``: the delta rule's correction
    of the values by what the state already predicts."""
    correction = _pass_through_root(view, values)
    return view.packet(correction) in (aten.sub, aten.sub_) and any(
        _pass_through_root(view, x) in reads for x in view.inputs(correction)[1:])


def _states_of(view: GraphView, write: CapturedOp) -> list[CapturedOp]:
    """The state a state product writes: the records without multiplies its result reaches, and those each of them is
    accumulated from that have the state's shape (its last two dims: the previous or initial state)."""
    shape = tuple(write.output_shapes[0][-2:])

    def state_shaped(y: CapturedOp) -> bool:
        return not y.macs and bool(y.output_shapes) and tuple(y.output_shapes[0][-2:]) == shape

    found: dict[CapturedOp, None] = {}
    for x in reach(view.users(write), view.users, lambda x: not x.macs):
        if not x.macs:
            found.update(dict.fromkeys(y for y in reach([x], view.inputs, state_shaped) if state_shaped(y)))
    return list(found)


def _scores_in_the_bias(view: GraphView, state: RoleState, kernel: CapturedOp) -> set[CapturedOp]:
    """Score work passed to an attention kernel as its additive mask: a product of two activations that reaches the
    kernel's ``attn_mask`` / ``attn_bias`` through ops without multiplies (relative-position scores q·rᵀ of
    Transformer-XL / Conformer attention) is ``attn_scores``, its operands' projections ``q_proj`` / ``k_proj``: what
    the same model's eager attention gives, where that product is added to q·kᵀ before the softmax."""
    bias = argument(kernel.target, kernel.args, kernel.kwargs, "attn_mask", "attn_bias", "bias")
    if not isinstance(bias, CapturedOp):
        return set()
    members: set[CapturedOp] = set()
    for m in _nearest_before(view, bias):
        if view.is_activation_product(m) and m not in state.parts:
            state.claim(m, Role.ATTN_SCORES)
            a, b = view.matmul_operands(m)
            members |= {m, *_demand_projections(view, state, a, Role.Q_PROJ.value),
                        *_demand_projections(view, state, b, Role.K_PROJ.value)}
    return members


def _attention_at_softmax(view: GraphView, state: RoleState, s: CapturedOp) -> None:
    """One attention instance at the softmax ``s``: its score products, weighted sums and projections. Scores that
    another softmax already took (one score matrix normalised two ways: Grounding DINO's fusion attends vision to
    text and text to vision; LiLT adds its text and layout scores for each stream) make a second instance, of the
    weighted sums after ``s``: the product is charged once, as ``attn_scores`` of the first."""
    behind = [m for m in _nearest_before(view, s.args[0], stop_at_softmax=True) if view.is_activation_product(m)]
    scores = [m for m in behind if m not in state.parts]
    shared = [m for m in behind if Role.ATTN_SCORES.value in state.parts.get(m, {})]
    if not scores and not shared:
        return
    weighted = [m for m in _nearest_after(view, s) if view.is_activation_product(m) and m not in state.parts]
    if not weighted and (not scores or _unread(view, s)):
        return  # (a softmax nothing reads but copies: dead code, as Sam2's Hiera computes softmax(q·kᵀ) over its
        # heads at each position and drops it; its product is no attention)
    members: set[CapturedOp] = set(scores) | set(weighted)
    for m in scores:
        state.claim(m, Role.ATTN_SCORES)
        a, b = view.matmul_operands(m)
        if _transposed_on_the_way(view, m, s):
            a, b = b, a  # (DeBERTa's position-to-content scores, K·(P_q)ᵀ then transposed: the keys come first)
        members |= _demand_projections(view, state, a, Role.Q_PROJ.value)
        members |= _demand_projections(view, state, b, Role.K_PROJ.value)
    for m in weighted:
        state.claim(m, Role.ATTN_WEIGHTED_SUM)
        a, b = view.matmul_operands(m)
        value_side = b if view.descends_from(a, s) else a
        members |= _demand_projections(view, state, value_side, Role.V_PROJ.value)
        members |= _demand_out_proj(view, state, m)
    state.groups.append(members)


def _unread(view: GraphView, n: CapturedOp) -> bool:
    """Nothing reads ``n``'s result but copies of it (dtype changes, clones), which nothing reads either: a value the
    forward computes and drops (or returns as it is)."""
    return all(view.packet(m) in VALUE_COPIES for m in reach(view.users(n), view.users, lambda m: True))


def _transposed_on_the_way(view: GraphView, product: CapturedOp, softmax: CapturedOp) -> bool:
    """The scores ``product`` makes reach the ``softmax`` with their last two axes swapped (an odd number of
    transposes on the way, through ops without multiplies): its left operand's positions end on the softmax's axis,
    the keys', so its left operand holds the keys. Queries and keys are told by which side's positions the softmax
    normalises over, not by operand order."""
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
    """Attention without a softmax: ``first`` (a product of two activations) reaches an operand of
    another activation product, whose result a weight matmul projects, through ops without multiplies
    (any normalisation: exp / logsumexp, sigmoid, ReLU, acos, none). Its result is the *left* operand
    of the second (weights x values): the quadratic form, ``attn_scores`` then ``attn_weighted_sum``;
    the *right* operand (queries x summary): the linear form, ``attn_kv_state`` (φ(K)ᵀV) then
    ``attn_readout`` (φ(Q)·state), with ``attn_normaliser`` for the other products of the same queries
    with a sum of the same keys."""
    a, b = view.matmul_operands(first)
    if _from_attention(view, state, a) or _from_attention(view, state, b):
        return  # a product of attention's own results (a pseudo-inverse's iterations): not a new instance
    seconds = [m for m in _nearest_after(view, first) if m is not first and _free_product(view, state, m)
               and _projected(view, state, m)]
    if not seconds:
        return
    linear = _contracts_positions(view, first)
    quadratic = [] if linear else [m for m in seconds if view.descends_from(view.matmul_operands(m)[0], first)]
    if quadratic and not _makes_a_positions_grid(view, first):
        return  # a product over another axis (Gemma 3n's AltUp mixes its streams at each position): no attention
    members = {first, *seconds}
    if quadratic:
        state.claim(first, Role.ATTN_SCORES)
        members |= _demand_projections(view, state, a, Role.Q_PROJ.value)
        members |= _demand_projections(view, state, b, Role.K_PROJ.value)
        for m in quadratic:
            state.claim(m, Role.ATTN_WEIGHTED_SUM)
            members |= _demand_values(view, state, view.matmul_operands(m)[1])
            members |= _demand_out_proj(view, state, m, through_reductions=True)  # a sum over hash rounds (LSH)
        state.groups.append(members - (set(seconds) - set(quadratic)))
        return
    if all(view.descends_from(view.matmul_operands(m)[0], first) for m in seconds):
        a, b = b, a  # the state read from the left, S·φ(Q) (Sana's (V·φ(K)ᵀ)·φ(Q)): its right factor is the keys
    behind_k, behind_v = _nearest_before(view, a), _nearest_before(view, b)
    if not behind_k or not behind_v or not all(view.is_weight_matmul(p) for p in (*behind_k, *behind_v)):
        return  # keys and values are projections of the input, nothing else (a residual-stream mix is not)
    keys = set(behind_k)
    state.claim(first, Role.ATTN_KV_STATE)
    members |= _demand_projections(view, state, a, Role.K_PROJ.value)
    members |= _demand_projections(view, state, b, Role.V_PROJ.value)
    for m in seconds:
        state.claim(m, Role.ATTN_READOUT)
        x, y = view.matmul_operands(m)
        query = y if view.descends_from(x, first) else x  # φ(Q)·S, or S·φ(Q)
        members |= _demand_projections(view, state, query, Role.Q_PROJ.value)
        members |= _demand_out_proj(view, state, m, through_reductions=True)
        for z in view.frontier(view.through_no_macs(query), view.users):
            # (a readout of this state, claimed below, is no normaliser)
            if z is not m and z not in seconds and _free_product(view, state, z) and _is_normaliser(view, z, keys):
                state.claim(z, Role.ATTN_NORMALISER)
                members.add(z)
    state.groups.append(members)


def _makes_a_positions_grid(view: GraphView, first: CapturedOp) -> bool:
    """The scores of a quadratic form are a positions × positions grid: no projection behind ``first``'s left
    operand has its output columns (features) along that operand's rows, nor one behind its right operand along
    that operand's columns. A product whose rows or columns run over features or streams mixes something else."""
    a, b = view.matmul_operands(first)
    for operand, axis in ((a, -2), (b, -1)):
        for p in _nearest_before(view, operand):
            if view.is_weight_matmul(p) and holds_columns_along(p, operand, axis) is True:
                return False
    return True


def _contracts_positions(view: GraphView, first: CapturedOp) -> bool:
    """``first`` sums over positions, not over a head's features: along the axis its left operand contracts, every
    entry holds the same column of the projection behind it. That is a state product (φ(K)ᵀ·V, written either way
    round), whichever side the next product reads it from; scores (Q·Kᵀ) contract the features."""
    left = view.matmul_operands(first)[0]
    behind = [p for p in _nearest_before(view, left) if view.is_weight_matmul(p)]
    return len(behind) == 1 and holds_columns_along(behind[0], left, -1) is False


def _is_normaliser(view: GraphView, z: CapturedOp, keys: set[CapturedOp]) -> bool:
    """φ(Q)·Σφ(K): one number per query (its output is one column wide) from a sum over the keys (a
    reduction between the key projections and its second operand)."""
    if tuple(z.output_shapes[0][-1:]) != (1,):
        return False
    summed = view.matmul_operands(z)[1]
    return bool(keys & {p for p in _nearest_before(view, summed) if view.is_weight_matmul(p)}) and any(
        (x.elementwise or ("",))[0] == "reduction" for x in view.through_no_macs(summed))


def _projected(view: GraphView, state: RoleState, output: CapturedOp) -> bool:
    """A weight matmul takes ``output`` (through ops without multiplies, reductions included): the mixed
    values go on as data. A scoring product whose result only selects (DeepSeek's sparse-attention
    indexer feeding a top-k) is not attention's output."""
    return any(view.is_weight_matmul(p) and p not in state.parts for p in _nearest_after(view, output, True))


def _free_product(view: GraphView, state: RoleState, n: CapturedOp) -> bool:
    """An activation product no pass has claimed."""
    return view.is_activation_product(n) and n not in state.parts


def _from_attention(view: GraphView, state: RoleState, operand: CapturedOp) -> bool:
    """``operand`` is computed from an attention core product already found (without another multiply)."""
    return any(Role(role).attention_core for m in _nearest_before(view, operand) for role in state.parts.get(m, {}))


def _demand_projections(view: GraphView, state: RoleState, operand: CapturedOp, role: str,
                        blocked: frozenset[Any] = frozenset()) -> set[CapturedOp]:
    """``role`` for the projections behind ``operand`` (looking through depthwise convolutions), except those that
    reach it only through a sine or cosine (a positional encoding of learned Fourier features, LightGlue's
    ``cos(projector(keypoints))`` rotating its queries and keys) or an op of ``blocked``."""
    stops = PERIODIC | blocked
    direct = set(_behind_channelwise(view, operand, blocked=lambda n: view.packet(n) in stops))
    found = [demand for demand in _projections_of(view, state, operand, role, through_channelwise=True)
             if demand[0] in direct]
    for p, target, demanded in found:
        state.demand(p, target, demanded)
    return {p for p, _, _ in found}


PERIODIC = frozenset({aten.sin, aten.cos})
"""Periodic functions: what they make of a projection is a positional encoding, not content."""


SOLVE_RHS = {aten.linalg_solve_triangular: 1, aten.triangular_solve: 0}
"""Triangular solves, and the position of their right-hand side ``B`` (``linalg_solve_triangular(A, B)``,
``triangular_solve(B, A)``): the solution's columns are ``B``'s."""


def _demand_values(view: GraphView, state: RoleState, operand: CapturedOp) -> set[CapturedOp]:
    """``v_proj`` for the weight matmuls the values of a weighted sum (without a softmax) come from
    (:func:`_value_sources`)."""
    found = [p for p in _value_sources(view, operand) if view.is_weight_matmul(p)
             and (p not in state.parts or p in state.demands)]
    for p in found:
        state.demand(p, operand, Role.V_PROJ.value)
    return set(found)


def _value_sources(view: GraphView, start: CapturedOp) -> list[CapturedOp]:
    """The multiplies nearest behind ``start``, walking back through what carries values without making them: ops
    without multiplies, depthwise convolutions (their input), a triangular solve (its right-hand side: the delta
    rule's corrected values ``solve(I + β·K·Kᵀ, β·V)``), a square mix over positions (its right operand:
    :func:`_mixes_positions`), and past a per-position scale (the one-column operand of
    ``v * beta[..., None]``: a gate, not a source of the values' columns)."""
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
    """``n`` is ``A @ V`` with ``A`` a square positions × positions matrix and ``V`` as many rows: a mix over positions
    keeps ``V``'s columns (KDA's in-chunk ``A @ (β·v)`` of its WY form, as a triangular solve does)."""
    if not view.is_activation_product(n):
        return False
    a, b = view.matmul_operands(n)
    left = a.output_shapes[0] if a.output_shapes else ()
    right = b.output_shapes[0] if b.output_shapes else ()
    return len(left) >= 2 and len(right) >= 2 and left[-1] == left[-2] == right[-2]


def _demand_out_proj(view: GraphView, state: RoleState, output: CapturedOp, through_reductions: bool = False
                     ) -> set[CapturedOp]:
    found = set()
    for p in _nearest_after(view, output, through_reductions):
        if view.is_conv_projection(p) and _claimed_by_family(state, p):
            state.demand(p, view.activation_operand(p), Role.OUT_PROJ.value)
            found.add(p)
        elif view.is_weight_matmul(p) and p not in state.parts:
            a, b = view.matmul_operands(p)
            sources = [x for x in concatenated(view, view.activation_operand(p)) if view.descends_from(x, output)]
            if sources:  # the attention output is one of several values the projection reads (a parallel block)
                for x in sources:
                    state.demand_rows(p, x, Role.OUT_PROJ.value)
            else:
                state.demand(p, a if view.descends_from(a, output) else b, Role.OUT_PROJ.value)
            found.add(p)
    return found


# --------------------------------------------------------------------------------------------------
# pass 3: logits
def logits(view: GraphView, state: RoleState) -> None:
    """A weight matmul onto the vocabulary: its weight is a token-embedding table (tied) or has its
    shape and no weight matmul takes its result (the last projection), and its output has one column per
    token of that table. Token tables are those looked up
    with indices that come from the inputs (position tables are looked up with ``arange``). A matmul on one vector
    per sample pooled from the positions (a sequence classifier) matches a table's shape only if that table is the
    vocabulary (the largest): a classifier whose labels are as many as the token types is no LM head. The model's last
    projection onto the whole vocabulary is logits whatever its input width (RemBERT decouples its output embeddings'
    width from its input embeddings')."""
    tables: dict[Any, int] = {}  # leaf name or ("shape", shape) -> vocabulary size
    for n in view.nodes:
        if view.packet(n) not in EMBEDDING_LOOKUPS:
            continue
        weight, indices = n.args[0], n.args[1] if len(n.args) > 1 else None
        if isinstance(weight, CapturedOp) and isinstance(indices, CapturedOp) and view.dynamic[indices]:
            shape = tuple(weight.output_shapes[0])
            if len(shape) == 2:
                tables[_leaf_key(weight)] = shape[0]
                tables[("shape", shape)] = shape[0]
        state.claim(n, {Role.EMBEDDING.value: 0})
    if not tables:
        return
    vocabulary = max(tables.values())
    shapes = [key[1] for key in tables if isinstance(key, tuple) and key[0] == "shape"]
    for n in view.nodes:
        if not view.is_weight_matmul(n) or state.claimed(n):
            continue
        width = n.output_shapes[0][-1:]
        leaves = view.leaves_of(view.weight_operand(n))
        tied = {_leaf_key(x) for x in leaves} & tables.keys()
        shaped = {rows for x in leaves for rows in _leading_rows_of(x, shapes)}
        if view.pooled(n):  # one vector per sample pooled from the positions: a classifier, unless the table it
            shaped = {rows for rows in shaped if rows[1] == vocabulary}  # has the shape of is the vocabulary
        decoupled = (vocabulary in width and not view.pooled(n)  # onto the whole vocabulary, from another width,
                     and not _writes_back(view, n))  # (not an FFN's down projection as wide as a small vocabulary)
        if any(tables[key] in width for key in tied) or (
                (decoupled or any(rows in width for rows, _ in shaped)) and not _feeds_a_weight_matmul(view, n)):
            state.claim(n, Role.LOGITS)


EXTRA_ROWS = 8
"""A token table may hold up to one row in this many beyond the tokens its untied LM head predicts (Llama 3.2
Vision's image tokens, CPM-Ant's prompt tokens): the head's weight matches the table's leading rows."""


def _leading_rows_of(leaf: CapturedOp, shapes: Iterable[tuple[int, ...]]) -> list[tuple[int, int]]:
    """``(rows, table rows)`` for each token table (``shapes``: the tables' shapes) whose leading rows ``leaf`` (a
    weight ``[rows, d]``) has the shape of: as wide, with as many rows or up to one in :data:`EXTRA_ROWS` fewer."""
    shape = tuple(leaf.output_shapes[0]) if leaf.output_shapes else ()
    if len(shape) != 2 or not all(type(s) is int for s in shape):
        return []
    rows, width = shape
    return [(rows, table_rows) for table_rows, table_width in shapes
            if table_width == width and table_rows - table_rows // EXTRA_ROWS <= rows <= table_rows]


def _feeds_a_weight_matmul(view: GraphView, n: CapturedOp) -> bool:
    """Some weight matmul takes ``n``'s result (through any ops): ``n`` is not the model's last projection.
    Tells an untied LM head from an FFN up projection whose width happens to equal the vocabulary."""
    return view.cached("feeds_weight_matmul", n, lambda: any(
        view.is_weight_matmul(x) for x in reach(view.users(n), view.users, lambda x: not view.is_weight_matmul(x))))


def _leaf_key(n: CapturedOp) -> Any:
    return ("leaf", n.target) if n.node_op == "get_attr" else ("node", n)


# --------------------------------------------------------------------------------------------------
# pass 4: FFN
def ffn(view: GraphView, state: RoleState) -> None:
    """Down projections behind an activation (or a gated product), and the projections feeding them. A down
    projection that reads a concatenation (a parallel block's ``proj_out(cat([attention, mlp]))``) is one for the
    rows that hold a hidden layer. Gated hidden layers are read first: a GLU's gate and up projections are its
    branches even where an activation lies before them (GLM-4.1V's patch merger, ``SwiGLU(gelu(norm(proj(x))))``:
    ``gate_proj`` is no down projection of ``proj``)."""
    for gated in (True, False):
        _down_projections(view, state, gated)


def _down_projections(view: GraphView, state: RoleState, gated: bool) -> None:
    """The FFN pass over every weight matmul, for the hidden layers that are ``gated`` (a GLU) or not."""
    for d in view.nodes:
        if not view.is_weight_matmul(d) or (state.claimed(d) and not state.rows_only(d)):
            continue
        if not view.dynamic[d]:
            continue  # computed from the model's own tables, on no input (Swin V2's position-bias MLP on a coordinate
            # buffer): a table, the same for every input, not an FFN of the tokens
        x = view.activation_operand(d)
        sources = concatenated(view, x)
        if _fourier_features(view, sources or _stacked(view, x)):
            continue  # cat([sin(x·B), cos(x·B)]): a Fourier embedding of positions or of a timestep, no hidden layer
        taken = {source for source, _ in state.row_demands.get(d, ())}
        for hidden in [s for s in sources if s not in taken] if sources else [x]:
            if gated and not _gated_here(view, hidden):
                continue  # (read in the second pass)
            if not gated and _gated_here(view, hidden):
                continue  # (judged in the first)
            writes_back = _writes_back(view, d)
            found = _hidden_layer(view, state, hidden, through_channelwise=writes_back)
            if found is None or _per_sample(view, d) or view.pooled(d) or _only_weighs(view, d) \
                    or any(_spread(view, p) for demands in found for p, _, _ in demands) \
                    or not (writes_back or sources or (_back_to_its_width(view, d, found)
                                                       and not _projected_again(view, d))):
                continue  # one vector per sample (or frame) spread over the positions, after D or before its hidden
                # layer (Flux-3's per-token modulations of silu(temb expanded to the tokens)), is conditioning; one
                # pooled from the positions (a pooler and its classifier) is a head; one between widths, or one
                # projected again before any sum, that writes back to no residual stream (a projector, a box or
                # quality head, a gate's generator) is an MLP, not an FFN
            for demands in found:
                for p, target, role in demands:
                    state.demand(p, target, role)
            if sources:
                state.demand_rows(d, hidden, Role.FFN_DOWN.value)
            else:
                state.claim(d, Role.FFN_DOWN)
            state.groups.append({d} | {p for demands in found for p, _, _ in demands})


def _gated_here(view: GraphView, hidden: CapturedOp) -> bool:
    """``hidden`` is a GLU's gated product itself, reached walking back through ops that join it with no other
    activation and normalise nothing (views, copies, dropout, a scale): a gated product behind a residual sum or a
    norm (RWKV's ``x + sigmoid(r) * v`` before the next block's LayerNorm) is another block's output, read in the
    second pass as it always was."""
    def plain(m: CapturedOp) -> bool:
        return m is hidden or (not m.macs and (m.elementwise or ("",))[0] not in BARRIER_CATEGORIES
                               and not view.mixes(m))

    return any(_gating(view, n) and _gated_branches(view, n)[0] is not None
               for n in reach([hidden], view.inputs, plain) if not n.macs)


def _back_to_its_width(view: GraphView, d: CapturedOp, found: Sequence[Sequence[tuple[CapturedOp, Any, str]]]
                       ) -> bool:
    """``d`` maps the hidden layer back to the width its projections read: an FFN's d → f → d (a projection that is
    no plain weight matmul, a pointwise convolution, is not compared)."""
    width = d.output_shapes[0][-1:] if d.output_shapes else ()
    projections = [p for demands in found for p, _, _ in demands]
    if not all(view.is_weight_matmul(p) for p in projections):
        return True
    inputs = {p: view.activation_operand(p) for p in projections}
    first = [p for p in projections  # (not a factor reading another's output: a LoRA adapter's B after its A)
             if not any(m in projections for m in _nearest_before(view, inputs[p]))]
    return all(tuple(inputs[p].output_shapes[0][-1:]) == tuple(width) for p in first or projections)


SUMS = SUM_OPS | {aten.sum}
"""Ops that add values together: a sum of two tensors, or of the slices along an axis (the top-k experts' outputs)."""


def _projected_again(view: GraphView, d: CapturedOp) -> bool:
    """``d``'s result reaches a weight matmul before it is summed with anything (through ops without multiplies, not
    through a sum, a scatter-add or a sum over an axis: an MoE's combine): the MLP goes on (a head's or a projector's
    next layer, a text projection read by the keys and values, a gate generated for a norm's output), it is no FFN's
    down projection."""
    def onward(n: CapturedOp) -> bool:
        return not n.macs and view.packet(n) not in SUMS and (n.elementwise or ("",))[0] != "scatter"

    return any(n.macs and view.is_weight_matmul(n) for n in reach(view.users(d), view.users, onward))


def _writes_back(view: GraphView, d: CapturedOp) -> bool:
    """``d``'s result is added to the stream its hidden layer was computed from (through ops without multiplies, an
    addend of as many elements that ``d``'s input descends from): it writes back to a residual stream, as an FFN's
    down projection does. A positional embedding added to queries (RT-DETR's ``query_pos_head`` of the boxes) or a
    type embedding added to a projector's output is no residual."""
    size = _size(d)
    if size is None:
        return False
    stream = _read_by_hidden_layer(view, d)
    for n in reach(view.users(d), view.users, lambda n: not n.macs):  # (through a sum with an adapter's update)
        if view.packet(n) in SUM_OPS and not n.macs and _size(n) == size and any(
                x is not d and _size(x) == size and _pass_through_root(view, x) in stream
                and not view.descends_from(x, d) for x in view.inputs(n)):
            return True
    return False


_UPSTREAM = 256
"""The most nodes :func:`_read_by_hidden_layer` walks back."""


def _read_by_hidden_layer(view: GraphView, d: CapturedOp) -> set[CapturedOp]:
    """What ``d``'s hidden layer reads: walking back from ``d``'s input through ops without multiplies and
    depthwise convolutions to the weight matmuls behind it (its up projections), then from their inputs through ops
    without multiplies, each value by its pass-through root too (at most :data:`_UPSTREAM` nodes)."""
    def walk(starts: list[CapturedOp], seen: set[CapturedOp]) -> list[CapturedOp]:
        projections, todo = [], list(starts)
        while todo and len(seen) < _UPSTREAM:
            n = todo.pop()
            if n in seen:
                continue
            seen.add(n)
            if is_channelwise_conv(n) and isinstance(n.args[0], CapturedOp):
                todo.append(n.args[0])
            elif n.macs:
                projections.append(n)
            else:
                todo.extend(view.inputs(n))
        return projections

    inner: set[CapturedOp] = set()
    ups = [p for p in walk([view.activation_operand(d)], inner) if view.is_weight_matmul(p)]
    stream: set[CapturedOp] = set()
    walk([view.activation_operand(p) for p in ups], stream)
    return {_pass_through_root(view, n) for n in stream} | stream


def _size(n: CapturedOp) -> int | None:
    """Elements of ``n``'s (first) output; None where a size is symbolic."""
    return numel_of(n.output_shapes[0]) if n.output_shapes else None


def _only_weighs(view: GraphView, d: CapturedOp) -> bool:
    """``d``'s result only weighs or selects other values, never joins them as data: following it forward in graph
    order (through ops that combine it with nothing else, and through the weight matmuls of the same small network),
    wherever it meets another activation it is an operand of an activation product (a mixing matrix: Gemma 3n's AltUp
    predicts each stream as ``streams @ coefs(router(x))``), a factor with one entry along the features that the
    product spreads over them (``innovation * coefs[..., None]``, an expert's routing weight), or indices that pick
    entries (a top-k's, :data:`SELECTIONS`). Such a hidden layer computes coefficients (a router's: ZAYA's router
    MLP), not a position-wise FFN of the token stream. The walk gives up (data) after :data:`_WEIGHS_WALK` nodes."""
    reached, met = {d}, False
    todo: list[tuple[int, int, CapturedOp]] = [(u.index, id(u), u) for u in view.users(d)]
    heapq.heapify(todo)
    done: set[CapturedOp] = set()
    while todo:
        _, _, n = heapq.heappop(todo)
        if n in done:
            continue
        done.add(n)
        if len(done) > _WEIGHS_WALK:
            return False
        inputs = view.inputs(n)
        mine = [x for x in inputs if x in reached]
        others = [x for x in inputs if x not in reached and view.live.get(x, False)]
        packet = view.packet(n)
        if mine and all(x.dtype is not None and not x.dtype.is_floating_point for x in mine) and (others or n.macs):
            met = True  # indices, offsets or a mask that pick entries of another value (a grouped matmul's groups)
            continue
        if n.macs:
            if view.is_activation_product(n) and others:
                met = True  # a mixing matrix
                continue
            if not view.is_weight_matmul(n) or view.activation_operand(n) not in reached:
                return False  # read by another product: data
        elif others:
            if packet in (aten.mul, aten.mul_) and all(weighs_rows(n, x) for x in mine):
                met = True  # a weight per row
                continue
            return False  # added to, gated with or concatenated with another activation: data
        elif packet in SELECTIONS:
            met = True
        reached.add(n)
        for user in view.users(n):
            if user not in done:
                heapq.heappush(todo, (user.index, id(user), user))
    return met


_WEIGHS_WALK = 512
"""The most nodes :func:`_only_weighs` follows (a router's few layers and the ops that use its weights take far
fewer; an FFN's output reaches the residual stream within a few)."""


def _stacked(view: GraphView, x: CapturedOp) -> list[CapturedOp]:
    """The values ``x`` stacks (through views and copies: ``stack([sin, cos], -1).flatten(-2)``), when there are
    several."""
    root = _pass_through_root(view, x)
    if view.packet(root) is not aten.stack or not isinstance(root.args[0], (list, tuple)):
        return []
    parts = [v for v in root.args[0] if isinstance(v, CapturedOp)]
    return parts if len(parts) > 1 else []


def _fourier_features(view: GraphView, sources: Sequence[CapturedOp]) -> bool:
    """The concatenated values are sines and cosines (of one product, ``[sin(2πx·B), cos(2πx·B)]``): Fourier features
    of a timestep or of coordinates (Gaussian Fourier projections, NeRF and SAM positional encodings), not a hidden
    layer whose activation happens to be periodic."""
    found = {view.packet(_pass_through_root(view, s)) for s in sources}
    return bool(sources) and found == {aten.sin, aten.cos}


def _hidden_layer(view: GraphView, state: RoleState, x: CapturedOp, through_channelwise: bool = False
                  ) -> list[list[tuple[CapturedOp, CapturedOp, str]]] | None:
    """The projections an FFN hidden layer ``x`` is made from, per branch (gate and up, or up), if ``x`` is one: it
    passes an activation function (or a gated product) from weight matmuls, each branch reaching one;
    ``through_channelwise``: looking through depthwise convolutions on the way (a Mix-FFN's ``fc1 → dwconv → GELU``)."""
    gate, up = _gated_branches(view, x)
    if gate is not None and up is not None:
        branches = [(gate, Role.FFN_GATE.value), (up, Role.FFN_UP.value)]
    elif _passes_activation(view, x):
        branches = [(x, Role.FFN_UP.value)]
    else:
        return None
    if any(not view.is_weight_matmul(m) for start, _ in branches for m in _behind_channelwise(view, start)):
        return None  # a product of activations (a scan, a state) behind the hidden layer: a token mixer, no FFN
    if any(_assembled_in_parts(view, start) for start, _ in branches):
        return None  # a hidden layer written a part at a time (a scan's positions, RWKV's WKV): a token mixer

    def gated_product(n: CapturedOp) -> bool:  # (a GLU before a depthwise convolution: a convolution module's, no
        return view.packet(n) is aten.glu or _gating(view, n)  # Mix-FFN's: Conformer's, Gemma 4 audio's lconv1d)
    found = [_projections_of(view, state, start, role, through_channelwise, blocked=gated_product)
             for start, role in branches]
    return found if all(found) else None  # every branch reaches a projection, else none is committed


def concatenated(view: GraphView, x: CapturedOp) -> list[CapturedOp]:
    """The values ``x`` concatenates along its last dim (through views, copies and dropout), when there are several:
    a concatenation along an earlier axis counts when the views merge that axis and every later one into ``x``'s
    last (ConvBERT's ``cat([attention, span conv], heads axis)`` flattened to the projection's input columns)."""
    width = x.output_shapes[0][-1] if x.output_shapes and x.output_shapes[0] else None
    x = _pass_through_root(view, x)
    if view.packet(x) is not aten.cat or not x.output_shapes:
        return []
    dim = x.args[1] if len(x.args) > 1 else x.kwargs.get("dim", 0)
    parts = [v for v in x.args[0] if isinstance(v, CapturedOp)] if isinstance(x.args[0], (list, tuple)) else []
    shape = x.output_shapes[0]
    if len(parts) < 2 or not isinstance(dim, int) or not shape:
        return []
    dim %= len(shape)
    merged = shape[dim:]
    return parts if dim == len(shape) - 1 or (all(type(s) is int for s in merged) and math.prod(merged) == width) \
        else []


# --------------------------------------------------------------------------------------------------
# settling rows
def concatenated_inputs(view: GraphView, state: RoleState) -> None:
    """Claim every projection whose rows were asked for: each role the rows (input columns) that hold the value it
    asked for, the rest ``other`` (Flux's single-stream ``proj_out(cat([attention, mlp]))``: ``out_proj`` for the
    attention's rows, ``ffn_down`` for the MLP's)."""
    for p, wanted in state.take_row_demands().items():
        if p not in state.parts:
            state.claim(p, split_by_rows(p, view.activation_operand(p), wanted, p.macs))


def _per_sample(view: GraphView, d: CapturedOp) -> bool:
    """``d``'s result is spread over positions, or it is read only by weight matmuls whose results are: an
    elementwise op broadcasts it (or an ``expand`` repeats it) along an axis other than the last, and it has no
    positions there or on any later axis but the last, where the op's output has many (``x * (1 + scale[:, None]) +
    shift[:, None]`` of adaLN, a UNet's ``h + temb[:, :, None, None]``, a video model's per-frame ``temb[:, :, None]``
    over each frame's tokens), the value keeping its rows on the way (reshaped or chunked, never reduced). Such a
    hidden layer ran on one vector per sample or per frame (a timestep, a class, pooled text), not on every position:
    it conditions the positions, it is no FFN (docs/roles.md section 3.4). A value that has positions (GQA's keys
    repeated over the heads of a group, a positional table added over the batch) is not spread."""
    if not view.is_condition(d):
        return False  # a value of the token stream (its readers' values are too)
    if _spread(view, d):
        return True
    readers = view.frontier(view.users(d), view.users)
    return bool(readers) and all(view.is_weight_matmul(m) and _spread(view, m) for m in readers)


def _spread(view: GraphView, n: CapturedOp) -> bool:
    """``n``'s value, with at least the rows it has, is spread over positions (:func:`_per_sample`)."""
    rows = rows_of(n.output_shapes[0]) if n.output_shapes else None
    if rows is None:
        return False  # (symbolic sizes: nothing to compare)
    return (view.ahead(n, ("spread over positions", rows), spreads, lambda user, _: _keeps_rows(user, rows))
            and view.is_condition(n))  # (a value of the token stream is no condition)


def _keeps_rows(user: CapturedOp, rows: int) -> bool:
    """``user``'s output has ``rows`` rows (all dims but the last) or more: a value reshaped or cut into chunks along
    a middle axis (adaLN's ``emb.reshape(B, 6, d).chunk(6, dim=1)``) keeps its rows; one reduced over them does not."""
    found = rows_of(user.output_shapes[0]) if user.output_shapes else None
    return found is not None and found >= rows


def _assembled_in_parts(view: GraphView, start: CapturedOp) -> bool:
    """``start`` is (computed without multiplies from) a buffer that writes filled a part at a time: a version
    record whose write covers less than the whole tensor (``out[:, t] = ...`` in a loop over positions). An FFN's
    hidden layer is computed whole, position by position alike."""
    def partial(n: CapturedOp) -> bool:
        write = n.args[1] if len(n.args) > 1 else None
        return (isinstance(write, CapturedOp) and bool(write.output_shapes) and bool(n.output_shapes)
                and prod(write.output_shapes[0]) < prod(n.output_shapes[0]))

    return view.cached("assembled in parts", start, lambda: any(
        n.target is after_write and partial(n) for n in view.through_no_macs(start)))


def _gated_branches(view: GraphView, x: CapturedOp) -> tuple[CapturedOp | None, CapturedOp | None]:
    """The (activated, plain) inputs of the elementwise product gating an FFN, if there is one: reached walking back
    from ``x`` through ops that join it with no other activation (views, norms, dropout, a scale; not a residual sum:
    a gated product behind one is another block's, D-FINE's gateway ``norm(g1 · x1 + g2 · x2)`` before the next
    layer's projections)."""
    if not view.behind(x, "gating product", lambda n: _gating(view, n)):
        return None, None  # (one pass for all: the search below would walk a residual stream to the embedding)

    def alone(m: CapturedOp) -> bool:  # (a norm written out, x · rsqrt(mean(x²)), joins x with itself)
        return m is x or (not m.macs and not view.mixes(m))

    for n in (m for m in reach([x], view.inputs, alone) if not m.macs):
        if not _gating(view, n):
            continue
        a, b = n.args[:2]
        if any(isinstance(v, CapturedOp) and view.spreads_a_condition(n, v) for v in (a, b)):
            continue  # a vector per sample scaling the tokens (adaLN-Zero's tanh(gate) * ffn(x)): conditioning
        if any(isinstance(v, CapturedOp) and weighs_rows(n, v) for v in (a, b)):
            continue  # a weight per row (DeepSeek-V4's hyper-connections, sigmoid(hc)[..., None] * block output)
        if a.output_shapes and b.output_shapes and tuple(a.output_shapes[0]) != tuple(b.output_shapes[0]):
            continue  # one side broadcast over the other: a GLU's gate and up have one shape (deformable
            # attention's sampled values · softmax(weights), the weights spread over each head's features)
        act_a = _gate_side(view, a, b)
        macs_a = {m for m in _nearest_before(view, a) if view.is_weight_matmul(m)}
        macs_b = {m for m in _nearest_before(view, b) if view.is_weight_matmul(m)}
        # gated: two projections, or one whose output columns the two branches split (GPT-OSS interleaves them);
        # every shared projection is asked (in no order: the answer must not depend on a set's order)
        if macs_a and macs_b and (macs_a != macs_b or any(not (columns(m, a) & columns(m, b)) for m in macs_a)):
            return (a, b) if act_a else (b, a)
    return None, None


def _gating(view: GraphView, n: CapturedOp) -> bool:
    """An elementwise product of two nodes, one of them behind an activation and the other not (a bound, a
    softcap's ``tanh(x / c) · c``, does not count where the other branch passes a gating activation: Inkling2's
    ``softcap(g) · sigmoid(g) · softcap(u)``)."""
    if view.packet(n) not in elementwise.PRODUCT_OPS or len(n.args) < 2:
        return False
    a, b = n.args[:2]
    return isinstance(a, CapturedOp) and isinstance(b, CapturedOp) and _gate_side(view, a, b) is not None


def _gate_side(view: GraphView, a: CapturedOp, b: CapturedOp) -> bool | None:
    """Whether ``a`` (True) or ``b`` (False) is a gating product's activated branch; ``None``: neither, or both
    alike."""
    act_a, act_b = _passes_activation(view, a), _passes_activation(view, b)
    if act_a != act_b:
        return act_a
    if not act_a:
        return None
    gate_a, gate_b = (view.activated(x, GATING_ACTIVATIONS) for x in (a, b))
    return gate_a if gate_a != gate_b else None


GATING_ACTIVATIONS = elementwise.ACTIVATION_OPS - {aten.tanh, aten.tanh_}
"""Activations that gate: every one but ``tanh``, which a softcap uses to bound a value (``tanh(x / c) · c``)."""


# --------------------------------------------------------------------------------------------------
# pass 5: low-rank updates
PASS_THROUGH = frozenset({aten.native_dropout, aten.dropout, aten.feature_dropout, aten.alpha_dropout})
"""Ops besides the zero-cost ones that carry a value to a matmul as the same input (dropout on an adapter's
branch keeps it the projection's input)."""
RANDOM_OPS = frozenset({aten.bernoulli, aten.bernoulli_, aten.rand, aten.rand_like, aten.uniform_, aten.uniform,
                        aten.randn, aten.randn_like, aten.normal, aten.normal_})
"""Random sources: a product with a mask drawn from one is dropout (fake tensors run ``x * bernoulli_(...)``)."""


def low_rank_updates(view: GraphView, state: RoleState) -> None:
    """A chain of weight matmuls that starts from a projection's input and whose result is added to the projection's
    output is part of that projection: ``W·x + B·(A·x) = (W + B·A)·x``. It takes the projection's roles, in the
    projection's proportions: LoRA's ``lora_B`` and ``lora_A`` (DoRA's and rsLoRA's too, which scale the two
    results before the sum) on every projection, whichever factor an earlier pass found (``lora_A`` of an output
    projection or FFN down projection reads the same input as the projection; ``lora_B`` of an up projection is
    behind the same activation), and a weight split in two (``W₁·x + W₂·x``)."""
    if all(state.claimed(n) for n in view.nodes if n.macs and view.is_weight_matmul(n)):
        return  # nothing left to take a role (a model without adapters)
    for p in view.nodes:
        roles = state.parts.get(p)
        if not roles or not view.is_weight_matmul(p) or set(roles) <= {Role.OTHER.value}:
            continue
        source = _pass_through_root(view, view.activation_operand(p))
        width = p.output_shapes[0][-1:]
        for total in _first_sums(view, p):
            for operand in view.inputs(total):
                copies = _scaled_from(view, operand)
                last = copies[-1]  # the update is a scaled copy of the last link's result
                if p in copies or not last.macs or last.output_shapes[0][-1:] != width:
                    continue  # (an update has the projection's output columns)
                for m in _chain_from(view, state, last, source, roles):
                    if m not in state.parts and m not in state.demands:
                        state.claim(m, scale_parts(roles, m.macs))
                        _join_group(state, p, m)


def _pass_through_root(view: GraphView, n: CapturedOp) -> CapturedOp:
    """The record ``n`` holds the value of, walking back through views, copies and dropout (one data input each)."""
    return view.cached("pass-through root", n, lambda: _walk_to_root(view, n))


def _walk_to_root(view: GraphView, n: CapturedOp) -> CapturedOp:
    while not n.macs:
        inputs = view.inputs(n)
        if view.packet(n) in PRODUCT_OPS and len(inputs) == 2:
            inputs = tuple(x for x in inputs if not _random(view, x))  # dropout as x * mask
        if len(inputs) != 1 or not (n.cost is Cost.ZERO or view.packet(n) in PASS_THROUGH | PRODUCT_OPS):
            break
        n = inputs[0]
    return n


def _random(view: GraphView, n: CapturedOp) -> bool:
    """A random op lies behind ``n`` (without multiplies): ``n`` is a mask drawn at random."""
    return view.runs(RANDOM_OPS) and view.behind(n, "random", lambda m: view.packet(m) in RANDOM_OPS)


def _scaled_from(view: GraphView, n: CapturedOp) -> list[CapturedOp]:
    """The records ``n`` is ``x`` of, walking back through ops without multiplies that take one input depending on
    the forward inputs (views, casts, dropout, a scale by a constant or by weights: ``x * scaling``,
    ``mag_norm_scale * x``): ``n`` is a scaled copy of each of them."""
    found = [n]
    while not n.macs:
        dynamic = [x for x in view.inputs(n) if view.dynamic[x] and not _random(view, x)]
        if len(dynamic) != 1 or view.packet(n) in SUM_OPS or (n.elementwise and n.elementwise[0] != "pointwise"):
            break
        n = dynamic[0]
        found.append(n)
    return found


def _first_sums(view: GraphView, p: CapturedOp) -> list[CapturedOp]:
    """The sums that take a scaled copy of ``p``'s output (:func:`_scaled_from`) and another dynamic value."""
    return [s for s in reach(view.users(p), view.users, lambda x: not x.macs and view.packet(x) not in SUM_OPS)
            if view.packet(s) in SUM_OPS and any(p in _scaled_from(view, x) for x in view.inputs(s))
            and sum(view.dynamic[x] for x in view.inputs(s)) >= 2]


def _chain_from(view: GraphView, state: RoleState, last: CapturedOp, source: CapturedOp, roles: Mapping[str, int],
                depth: int = 3) -> list[CapturedOp]:
    """``last`` and the weight matmuls behind it, when they form a chain that starts from ``source`` (every multiply
    nearest behind each link is a weight matmul unclaimed or claimed with the projection's roles, no activation
    function between links, the first link reads ``source``); else nothing."""
    claimed = state.parts.get(last)
    if (not view.is_weight_matmul(last) or depth == 0 or last in state.demands
            or (claimed is not None and set(claimed) != set(roles))):
        return []
    start = view.activation_operand(last)
    if _pass_through_root(view, start) is source:
        return [last]
    if _passes_activation(view, start):
        return []
    behind = _nearest_before(view, start)
    chains = []
    for m in behind:
        chain = _chain_from(view, state, m, source, roles, depth - 1)
        if not chain:
            return []
        chains.append(chain)
    return [last, *(m for chain in chains for m in chain)] if chains else []


def _join_group(state: RoleState, member: CapturedOp, new: CapturedOp) -> None:
    """Put ``new`` in the first block instance that has ``member``."""
    for group in state.groups:
        if member in group:
            group.add(new)
            return


# --------------------------------------------------------------------------------------------------
# pass 6: factored projections
PROJECTION_ROLES = frozenset({Role.Q_PROJ.value, Role.K_PROJ.value, Role.V_PROJ.value})


def factored_projections(view: GraphView, state: RoleState) -> None:
    """A weight matmul whose output only attention projections read (through ops without multiplies,
    normalisations included) is a factor of those projections and takes their roles: the low-rank query and
    key / value factors of multi-head latent attention (DeepSeek's ``q_a_proj`` before ``q_b_proj``), a LoRA
    adapter's first matrix. A reader whose result only selects (:func:`_only_selects`: a sparse-attention indexer's
    query projection beside ``q_b_proj``) does not keep a matmul from being a factor. A factor feeding projections of
    several roles (MLA's key / value latent, which
    ``kv_b_proj`` expands into keys and values) is split by the columns reaching each; a column shared by
    keys and values counts as ``k_proj``, the first in role order (docs/roles.md, section 3.5). A matmul read by the
    projections of several attention instances is not one attention's factor: it stays for the later passes."""
    for n in view.nodes:
        if not n.macs or state.claimed(n) or not view.is_weight_matmul(n):
            continue
        readers = view.frontier(view.users(n), view.users)
        selectors = [r for r in readers if not _projection_roles(state, r)]
        readers = [r for r in readers if _projection_roles(state, r)]
        if not readers or not all(_only_selects(view, r) for r in selectors) or not _only_itself(view, n):
            continue
        owners = {next((i for i, group in enumerate(state.groups) if r in group), None) for r in readers}
        if len(owners - {None}) > 1:
            continue  # read by the projections of several attentions: an input embedding they share (every block's
            # text keys and values from one text projection), no factor of one attention's projections
        state.factors.add(n)
        for r in readers:
            target = view.activation_operand(r)
            for role in sorted(_projection_roles(state, r), key=ROLE_ORDER.index):
                state.demand(n, target, role)
        for group in state.groups:  # one attention instance with the projections it factors
            if any(r in group for r in readers):
                group.add(n)
                break


SELECTIONS = frozenset({aten.topk, aten.sort, aten.argsort, aten.argmax, aten.argmin, aten.kthvalue})
"""Ops that pick entries by value: what a scoring network's result feeds when it only selects."""


def _only_selects(view: GraphView, r: CapturedOp) -> bool:
    """``r``'s result only selects: every path from it (through any ops, multiplies included) ends in a selection
    (:data:`SELECTIONS`), never reaching a weight matmul or the output. DeepSeek-V3.2's sparse-attention indexer, whose
    scores pick each query's keys with a top-k, reads the query latent beside ``q_b_proj``."""
    found = False
    for n in reach(view.users(r), view.users, lambda n: view.packet(n) not in SELECTIONS):
        if view.packet(n) in SELECTIONS:
            found = True
        elif view.is_weight_matmul(n) or not view.users(n):
            return False
    return found


def output_factors(view: GraphView, state: RoleState) -> None:
    """A weight matmul that is the only reader of an output projection's result, and reads nothing else (through
    ops without multiplies that combine it with no other activation), is that projection's second factor:
    ``out_proj`` too (DeepSeek-V4's grouped low-rank output projection, ``o_b_proj(o_a_proj(attention))``)."""
    for n in view.nodes:
        if not n.macs or state.claimed(n) or not view.is_weight_matmul(n):
            continue
        before = _nearest_before(view, view.activation_operand(n))
        if not before or not all(_roles_of(state, m) == {Role.OUT_PROJ.value} and _only_itself(view, m)
                                 and view.frontier(view.users(m), view.users) == [n] for m in before):
            continue
        state.claim(n, Role.OUT_PROJ)
        for group in state.groups:
            if any(m in group for m in before):
                group.add(n)
                break


def _roles_of(state: RoleState, n: CapturedOp) -> set[str]:
    """The roles ``n`` was given or asked for so far."""
    return {role for role, macs in state.parts.get(n, {}).items() if macs} | {
        role for _, role in state.demands.get(n, ())}


def _only_itself(view: GraphView, n: CapturedOp) -> bool:
    """The ops without multiplies between ``n`` and the multiplies that read it combine its value with nothing else
    that depends on the inputs (a norm of it, weights and constants only): the value is ``n``'s, transformed. A
    modulation (adaLN's ``norm(x) * (1 + scale) + shift`` with ``scale`` and ``shift`` from ``n``) is not: there ``n``
    conditions another value, and is no factor of the projections that read the result."""
    between = {x for x in reach(view.users(n), view.users, lambda x: not x.macs) if not x.macs}
    return all(not view.dynamic[i] or i is n or i in between for x in between for i in view.inputs(x))


def _projection_roles(state: RoleState, n: CapturedOp) -> set[str]:
    """The attention projection roles of ``n`` (empty unless all its roles are projection roles)."""
    roles = {role for role, macs in state.parts.get(n, {}).items() if macs}
    return roles if roles and roles <= PROJECTION_ROLES else set()


# --------------------------------------------------------------------------------------------------
# pass 7 and rules
def unclaimed_are_other(view: GraphView, state: RoleState) -> None:
    """Every multiply no pass claimed is ``other``."""
    for n in view.nodes:
        if n.macs and n not in state.parts:
            state.claim(n, Role.OTHER)


def rules_pass(rules: tuple[RoleRule, ...], module_types: Mapping[str, type], only_unfused: bool) -> Pass:
    """A pass forcing ``rules`` on the multiplies inside matching modules (``only_unfused``: not on fused
    kernels, convolutions or Fourier transforms, whose roles are their own)."""

    def apply(view: GraphView, state: RoleState) -> None:
        if not rules:
            return
        for n in [*state.parts, *(n for n in view.nodes if n.macs and n not in state.parts)]:
            spec = view.spec(n)
            if not n.macs or (only_unfused and (view.parts(n) or (spec and spec.family in FAMILY_ROLES))):
                continue
            op, stack = n.op_name, n.module_stack
            for rule in rules:
                if any(rule.matches(frame.path, module_types.get(frame.path), op) for frame in stack):
                    state.force(n, {parse_role(rule.role).value: n.macs})
                    break

    return apply


PASSES: tuple[Pass, ...] = (by_family, weight_work, attention, logits, ffn, concatenated_inputs, low_rank_updates,
                           factored_projections, output_factors, unclaimed_are_other)
"""The dataflow passes, in order (rules follow). Order matters: each pass claims only multiplies no
earlier pass claimed, so logits (a weight matmul onto the vocabulary, often behind an activation) is
found before the FFN pass could take it for a down projection. The built-in rules (multiplies inside recurrent
modules are ``recurrent``) also run right after the first pass: an unfused LSTM (on meta, or with projections)
gates its state with products of activations, which the FFN pass would read as a gated FFN feeding the
projection after the LSTM. Factored projections come after the FFN pass, so that the FFN down projection that
ends an encoder (whose output only the decoder's key / value projections read) stays ``ffn_down``. Rows asked for
are settled after the FFN pass (attention and the FFN each ask for their part of a parallel block's
``proj_out``); low-rank updates follow, once every projection they extend is known."""


# --------------------------------------------------------------------------------------------------
# blocks and the backward pass
def _with_blocks(view: GraphView, state: RoleState) -> dict[CapturedOp, Assignment]:
    """Each claim with its block: the deepest module enclosing its group (the first group that has it),
    else its own module."""
    blocks: dict[CapturedOp, str] = {}
    for members in state.groups:
        block = common_path([m for m in (n.module for n in members) if m is not None])
        for n in members:
            blocks.setdefault(n, block)
    return {n: Assignment(dict(parts), blocks.get(n, n.module or ""), n in state.factors)
            for n, parts in state.parts.items()}


def _backward(view: GraphView, forward: Mapping[CapturedOp, Assignment]) -> dict[CapturedOp, Assignment]:
    """A backward op takes the roles of the forward op whose autograd node ran it, in the same
    proportions (a fused QKV projection's gradient GEMMs split like the projection); a fused
    backward kernel with its own parts (SDPA backward) keeps them."""
    out = {}
    for n in view.backward_nodes:
        macs = n.macs
        if not macs:
            continue
        source = forward.get(n.forward) if n.forward is not None else None
        if n.parts:
            parts = dict(n.parts)
        elif source is not None and any(source.parts.values()):
            parts = scale_parts(source.parts, macs)
        else:
            parts = {Role.OTHER.value: macs}
        if source is not None:
            out[n] = Assignment(parts, source.block)
        else:
            out[n] = Assignment(parts, (n.forward.module if n.forward is not None else None) or "")
    return out


# --------------------------------------------------------------------------------------------------
# searches shared by the passes
def _projections_of(view: GraphView, state: RoleState, start: CapturedOp, role: str, through_channelwise: bool = False,
                    blocked: Callable[[CapturedOp], bool] | None = None) -> list[tuple[CapturedOp, CapturedOp, str]]:
    """(projection, consumer target, role) for the weight matmuls nearest behind ``start``; with
    ``through_channelwise``, looking through depthwise convolutions (a short convolution over positions, channel by
    channel, keeps each channel a column of the projection before it: the query, key and value of Mamba-2 and
    gated DeltaNet; the convolution keeps ``conv``), not past a ``blocked`` node behind a convolution."""
    behind = _behind_channelwise(view, start, behind_conv=blocked) if through_channelwise else _nearest_before(
        view, start)
    return [(p, start, role) for p in behind
            if (view.is_weight_matmul(p) and (p not in state.parts or p in state.demands or state.has_free_columns(p)))
            or (through_channelwise and view.is_conv_projection(p) and (_claimed_by_family(state, p)
                                                                        or p in state.demands))]


def _claimed_by_family(state: RoleState, p: CapturedOp) -> bool:
    """``p`` holds only the role its op family gave it (a convolution's ``conv``): attention may still ask for it as
    a projection (a pointwise convolution)."""
    return state.parts.get(p) == {Role.CONV.value: p.macs} and p not in state.demands


def _behind_channelwise(view: GraphView, start: CapturedOp, blocked: Callable[[CapturedOp], bool] | None = None,
                        behind_conv: Callable[[CapturedOp], bool] | None = None) -> list[CapturedOp]:
    """The multiplies nearest behind ``start``, with each depthwise convolution among them replaced by the
    multiplies nearest behind its input; ``blocked``: nodes the walk does not pass; ``behind_conv``: nodes it does
    not pass behind a convolution."""
    def before(n: CapturedOp, stop: Callable[[CapturedOp], bool] | None) -> list[CapturedOp]:
        if stop is None:
            return _nearest_before(view, n)
        return view.frontier([n], view.inputs, stop)

    def both(n: CapturedOp) -> bool:
        return (blocked is not None and blocked(n)) or (behind_conv is not None and behind_conv(n))

    found: dict[CapturedOp, None] = {}
    todo, seen = list(before(start, blocked)), set()  # (a copy: _nearest_before's lists are cached)
    while todo:
        m = todo.pop(0)
        if m in seen:
            continue
        seen.add(m)
        if is_channelwise_conv(m) and isinstance(m.args[0], CapturedOp):
            todo.extend(before(m.args[0], both if behind_conv is not None else blocked))  # (extends the copy)
        else:
            found[m] = None
    return list(found)


def _nearest_before(view: GraphView, start: Any, stop_at_softmax: bool = False) -> list[CapturedOp]:
    """Multiply nodes reached first walking back from ``start`` through ops without multiplies."""
    if not isinstance(start, CapturedOp):
        return []
    if stop_at_softmax:
        return view.frontier([start], view.inputs, lambda n: n is not start and view.packet(n) in SOFTMAX_OPS)
    return view.cached("before", start, lambda: view.frontier([start], view.inputs))


def _nearest_after(view: GraphView, start: CapturedOp, through_reductions: bool = False) -> list[CapturedOp]:
    """Multiply nodes reached first walking forward from ``start`` through ops without multiplies
    (not through another softmax or a normalisation, nor a reduction unless ``through_reductions``)."""
    barriers = ("norm",) if through_reductions else BARRIER_CATEGORIES
    return view.frontier(view.users(start), view.users, lambda n: view.packet(n) in SOFTMAX_OPS or (
        n.elementwise or ("",))[0] in barriers)


def _passes_activation(view: GraphView, start: CapturedOp) -> bool:
    """An activation function lies between ``start`` and the multiplies behind it."""
    return view.activated(start, elementwise.ACTIVATION_OPS)

