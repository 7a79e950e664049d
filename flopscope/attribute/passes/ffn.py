"""Pass 4, FFN, and the rows asked for (docs/roles.md sections 3.4 and 4).

- :func:`ffn` claims ``ffn_down`` for a weight matmul whose input passes an activation
  (or a gated product) from nearer weight matmuls, and asks for those as ``ffn_up`` /
  ``ffn_gate``. Its vetoes are named predicates (listed in :func:`ffn`'s docstring):
  tables, Fourier features, conditioning, heads, routers' coefficients and MLPs are no
  FFN.
- :func:`concatenated_inputs` claims every projection whose rows were asked for (a
  parallel block's ``proj_out(cat([attention, mlp]))``), split by rows.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

import torch

from ...capture.records import CapturedOp, after_write
from ...formulas import elementwise
from ...formulas.registry import prod
from ...role import Role
from ..columns import columns, split_by_rows
from ..graph_view import SUM_OPS, GraphView, reach, rows_of, spreads, weighs_rows
from ..state import PROJECTION_ROLES, RoleState
from ._walks import (
    BARRIER_CATEGORIES,
    SELECTIONS,
    behind_channelwise,
    concatenated,
    nearest_before,
    pass_through_root,
    passes_activation,
    projections_of,
    writes_back,
)

aten = torch.ops.aten


def ffn(view: GraphView, state: RoleState) -> None:
    """Down projections behind an activation (or a gated product), and the projections
    feeding them.

    A down projection that reads a concatenation (a parallel block's
    ``proj_out(cat([attention, mlp]))``) is one for the rows that hold a hidden layer.
    Gated hidden layers are read first: a GLU's gate and up projections are its branches
    even where an activation lies before them (GLM-4.1V's patch merger,
    ``SwiGLU(gelu(norm(proj(x))))``: ``gate_proj`` is no down projection of ``proj``).

    The vetoes, each a named predicate: :func:`_on_no_input` (a table),
    :func:`_fourier_features` (a positional or timestep embedding), :func:`_per_sample`
    and :func:`_spread_before` (conditioning), ``view.pooled`` (a head),
    :func:`_only_weighs` (a router's coefficients), :func:`_an_mlp` (a projector or a
    head's layers)."""
    for gated in (True, False):
        _down_projections(view, state, gated)


def _down_projections(view: GraphView, state: RoleState, gated: bool) -> None:
    """The FFN pass over every weight matmul, for the hidden layers that are ``gated``
    (a GLU) or not."""
    for d in view.nodes:
        if not view.is_weight_matmul(d) or (state.claimed(d) and not state.rows_only(d)):
            continue
        if _on_no_input(view, d):
            continue
        x = view.activation_operand(d)
        sources = concatenated(view, x)
        if _fourier_features(view, sources or _stacked(view, x)):
            continue
        taken = {source for source, _ in state.row_demands.get(d, ())}
        for hidden in [s for s in sources if s not in taken] if sources else [x]:
            # gated hidden layers are read in the first sweep, the others in the second
            if _gated_here(view, hidden) != gated:
                continue
            residual = writes_back(view, d)
            found = _hidden_layer(view, state, hidden, through_channelwise=residual)
            # conditioning, a head, a router's coefficients or an MLP: no FFN (the
            # vetoes)
            if found is None or _per_sample(view, d) or view.pooled(d) or _only_weighs(view, d) \
                    or _spread_before(view, found) or _an_mlp(view, state, d, found,
                                                              residual or bool(sources)):
                continue
            for demands in found:
                for p, target, role in demands:
                    state.demand(p, target, role)
            if sources:
                state.demand_rows(d, hidden, Role.FFN_DOWN.value)
            else:
                state.claim(d, Role.FFN_DOWN)
            state.groups.append({d} | {p for demands in found for p, _, _ in demands})


Branches = Sequence[Sequence[tuple[CapturedOp, Any, str]]]
"""A hidden layer's projections, per branch: (projection, consumer, role)."""


def _on_no_input(view: GraphView, d: CapturedOp) -> bool:
    """``d`` is computed from the model's own tables, on no input (Swin V2's
    position-bias MLP on a coordinate buffer): a table, the same for every input, not
    an FFN of the tokens."""
    return not view.dynamic[d]


def _spread_before(view: GraphView, found: Branches) -> bool:
    """A projection of the hidden layer ``found`` is spread over the positions
    (:func:`_spread`): the hidden layer ran on one vector per sample or frame
    (Flux-3's per-token modulations of ``silu(temb)`` expanded to the tokens). It is
    conditioning, as one spread after the down projection is (:func:`_per_sample`)."""
    return any(_spread(view, p) for demands in found for p, _, _ in demands)


def _an_mlp(view: GraphView, state: RoleState, d: CapturedOp, found: Branches,
            residual: bool) -> bool:
    """``d`` writes back to no residual stream (``residual``: it does, or it reads a
    concatenation, judged by rows) and is no FFN's down projection either: it maps
    between widths (:func:`_back_to_its_width`), or the MLP goes on after it
    (:func:`_projected_again`). A projector, a box or quality head, a gate's
    generator: an MLP, not an FFN."""
    return not (residual or (_back_to_its_width(view, d, found) and not _projected_again(view, state, d)))


def _gated_here(view: GraphView, hidden: CapturedOp) -> bool:
    """``hidden`` is a GLU's gated product itself, reached walking back through ops that
    join it with no other activation and normalise nothing (views, copies, dropout, a
    scale): a gated product behind a residual sum or a norm (RWKV's
    ``x + sigmoid(r) * v`` before the next block's LayerNorm) is another block's
    output, read in the second pass as it always was."""
    def plain(m: CapturedOp) -> bool:
        return m is hidden or (not m.macs and (m.elementwise or ("",))[0] not in BARRIER_CATEGORIES
                               and not view.mixes(m))

    return any(_gating(view, n) and _gated_branches(view, n)[0] is not None
               for n in reach([hidden], view.inputs, plain) if not n.macs)


def _back_to_its_width(view: GraphView, d: CapturedOp, found: Branches) -> bool:
    """``d`` maps the hidden layer back to the width its projections read: an FFN's d →
    f → d (a projection that is no plain weight matmul, a pointwise convolution, is
    not compared)."""
    width = d.output_shapes[0][-1:] if d.output_shapes else ()
    projections = [p for demands in found for p, _, _ in demands]
    if not all(view.is_weight_matmul(p) for p in projections):
        return True
    inputs = {p: view.activation_operand(p) for p in projections}
    # (not a factor reading another's output: a LoRA adapter's B after its A)
    first = [p for p in projections
             if not any(m in projections for m in nearest_before(view, inputs[p]))]
    return all(tuple(inputs[p].output_shapes[0][-1:]) == tuple(width) for p in first or projections)


SUMS = SUM_OPS | {aten.sum}
"""Ops that add values together: a sum of two tensors, or of the slices along an axis
(the top-k experts' outputs)."""


def _projected_again(view: GraphView, state: RoleState, d: CapturedOp) -> bool:
    """``d``'s result reaches a weight matmul before it is summed with anything (through
    ops without multiplies, not through a sum, a scatter-add or a sum over an axis: an
    MoE's combine), and either passes an activation on the way or is read by an
    attention projection: the MLP goes on (a head's next layer, after its ReLU; a gate
    generated for a norm's output, through its sigmoid) or projects keys and values (a
    caption projection), so ``d`` is no FFN's down projection. A stack of MLP blocks
    without residuals, one block's result read by the next one's up projection as it
    is, keeps its FFNs."""
    def onward(n: CapturedOp) -> bool:
        return not n.macs and view.packet(n) not in SUMS and (n.elementwise or ("",))[0] != "scatter"

    todo, seen = [(u, False) for u in view.users(d)], set()
    while todo:
        n, activated = todo.pop()
        if (n, activated) in seen:
            continue
        seen.add((n, activated))
        if n.macs:
            roles = state.roles_of(n)
            if view.is_weight_matmul(n) and (activated or (bool(roles) and roles <= PROJECTION_ROLES)):
                return True
            continue
        if onward(n):
            activated = activated or view.packet(n) in elementwise.ACTIVATION_OPS
            todo.extend((u, activated) for u in view.users(n))
    return False


def _only_weighs(view: GraphView, d: CapturedOp) -> bool:
    """``d``'s result only weighs or selects other values, never joins them as data:
    following it forward in graph order (through ops that combine it with nothing
    else, and through the weight matmuls of the same small network), wherever it
    meets another activation it is an operand of an activation product (a mixing
    matrix: Gemma 3n's AltUp predicts each stream as ``streams @ coefs(router(x))``),
    a factor with one entry along the features that the product spreads over them
    (``innovation * coefs[..., None]``, an expert's routing weight), or indices that
    pick entries (a top-k's, :data:`SELECTIONS`). Such a hidden layer computes
    coefficients (a router's: ZAYA's router MLP), not a position-wise FFN of the
    token stream. The walk gives up (data) after :data:`_WEIGHS_WALK` nodes."""
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
            # indices, offsets or a mask that pick entries of another value (a grouped
            # matmul's groups)
            met = True
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
"""The most nodes :func:`_only_weighs` follows (a router's few layers and the ops that
use its weights take far fewer; an FFN's output reaches the residual stream within a
few)."""


def _stacked(view: GraphView, x: CapturedOp) -> list[CapturedOp]:
    """The values ``x`` stacks (through views and copies:
    ``stack([sin, cos], -1).flatten(-2)``), when there are several."""
    root = pass_through_root(view, x)
    if view.packet(root) is not aten.stack or not isinstance(root.args[0], (list, tuple)):
        return []
    parts = [v for v in root.args[0] if isinstance(v, CapturedOp)]
    return parts if len(parts) > 1 else []


def _fourier_features(view: GraphView, sources: Sequence[CapturedOp]) -> bool:
    """The concatenated values are sines and cosines (of one product,
    ``[sin(2πx·B), cos(2πx·B)]``): Fourier features of a timestep or of coordinates
    (Gaussian Fourier projections, NeRF and SAM positional encodings), not a hidden
    layer whose activation happens to be periodic."""
    found = {view.packet(pass_through_root(view, s)) for s in sources}
    return bool(sources) and found == {aten.sin, aten.cos}


def _hidden_layer(view: GraphView, state: RoleState, x: CapturedOp,
                  through_channelwise: bool = False
                  ) -> list[list[tuple[CapturedOp, CapturedOp, str]]] | None:
    """The projections an FFN hidden layer ``x`` is made from, per branch (gate and up,
    or up), if ``x`` is one: it passes an activation function (or a gated product)
    from weight matmuls, each branch reaching one; ``through_channelwise``: looking
    through depthwise convolutions on the way (a Mix-FFN's ``fc1 → dwconv → GELU``)."""
    gate, up = _gated_branches(view, x)
    if gate is not None and up is not None:
        branches = [(gate, Role.FFN_GATE.value), (up, Role.FFN_UP.value)]
    elif passes_activation(view, x):
        branches = [(x, Role.FFN_UP.value)]
    else:
        return None
    if any(not view.is_weight_matmul(m) for start, _ in branches for m in behind_channelwise(view, start)):
        # a product of activations (a scan, a state) behind the hidden layer: a token
        # mixer, no FFN
        return None
    if any(_assembled_in_parts(view, start) for start, _ in branches):
        # a hidden layer written a part at a time (a scan's positions, RWKV's WKV): a
        # token mixer
        return None

    # (a GLU before a depthwise convolution: a convolution module's, no Mix-FFN's:
    # Conformer's, Gemma 4 audio's lconv1d)
    def gated_product(n: CapturedOp) -> bool:
        return view.packet(n) is aten.glu or _gating(view, n)
    found = [projections_of(view, state, start, role, through_channelwise, blocked=gated_product)
             for start, role in branches]
    # every branch reaches a projection, else none is committed
    return found if all(found) else None


def concatenated_inputs(view: GraphView, state: RoleState) -> None:
    """Claim every projection whose rows were asked for: each role the rows (input
    columns) that hold the value it asked for, the rest ``other`` (Flux's
    single-stream ``proj_out(cat([attention, mlp]))``: ``out_proj`` for the
    attention's rows, ``ffn_down`` for the MLP's)."""
    for p, wanted in state.take_row_demands().items():
        if p not in state.parts:
            state.claim(p, split_by_rows(p, view.activation_operand(p), wanted, p.macs))


def _per_sample(view: GraphView, d: CapturedOp) -> bool:
    """``d``'s result is spread over positions, or it is read only by weight matmuls
    whose results are: an elementwise op broadcasts it (or an ``expand`` repeats it)
    along an axis other than the last, and it has no positions there or on any later
    axis but the last, where the op's output has many
    (``x * (1 + scale[:, None]) + shift[:, None]`` of adaLN, a UNet's
    ``h + temb[:, :, None, None]``, a video model's per-frame ``temb[:, :, None]``
    over each frame's tokens), the value keeping its rows on the way (reshaped or
    chunked, never reduced). Such a hidden layer ran on one vector per sample or per
    frame (a timestep, a class, pooled text), not on every position: it conditions
    the positions, it is no FFN (docs/roles.md section 3.4). A value that has
    positions (GQA's keys repeated over the heads of a group, a positional table
    added over the batch) is not spread."""
    if not view.is_condition(d):
        return False  # a value of the token stream (its readers' values are too)
    if _spread(view, d):
        return True
    readers = view.frontier(view.users(d), view.users)
    return bool(readers) and all(view.is_weight_matmul(m) and _spread(view, m) for m in readers)


def _spread(view: GraphView, n: CapturedOp) -> bool:
    """``n``'s value, with at least the rows it has, is spread over positions
    (:func:`_per_sample`)."""
    rows = rows_of(n.output_shapes[0]) if n.output_shapes else None
    if rows is None:
        return False  # (symbolic sizes: nothing to compare)
    return (view.ahead(n, ("spread over positions", rows), spreads,
                       lambda user, _: _keeps_rows(user, rows))
            and view.is_condition(n))  # (a value of the token stream is no condition)


def _keeps_rows(user: CapturedOp, rows: int) -> bool:
    """``user``'s output has ``rows`` rows (all dims but the last) or more: a value
    reshaped or cut into chunks along a middle axis (adaLN's
    ``emb.reshape(B, 6, d).chunk(6, dim=1)``) keeps its rows; one reduced over them
    does not."""
    found = rows_of(user.output_shapes[0]) if user.output_shapes else None
    return found is not None and found >= rows


def _assembled_in_parts(view: GraphView, start: CapturedOp) -> bool:
    """``start`` is (computed without multiplies from) a buffer that writes filled a
    part at a time: a version record whose write covers less than the whole tensor
    (``out[:, t] = ...`` in a loop over positions). An FFN's hidden layer is computed
    whole, position by position alike."""
    def partial(n: CapturedOp) -> bool:
        write = n.args[1] if len(n.args) > 1 else None
        return (isinstance(write, CapturedOp) and bool(write.output_shapes) and bool(n.output_shapes)
                and prod(write.output_shapes[0]) < prod(n.output_shapes[0]))

    return view.cached("assembled in parts", start, lambda: any(
        n.target is after_write and partial(n) for n in view.through_no_macs(start)))


def _gated_branches(view: GraphView, x: CapturedOp) -> tuple[CapturedOp | None, CapturedOp | None]:
    """The (activated, plain) inputs of the elementwise product gating an FFN, if there
    is one: reached walking back from ``x`` through ops that join it with no other
    activation (views, norms, dropout, a scale; not a residual sum: a gated product
    behind one is another block's, D-FINE's gateway ``norm(g1 · x1 + g2 · x2)``
    before the next layer's projections)."""
    if not view.behind(x, "gating product", lambda n: _gating(view, n)):
        # (one pass for all: the search below would walk a residual stream to the
        # embedding)
        return None, None

    # (a norm written out, x · rsqrt(mean(x²)), joins x with itself)
    def alone(m: CapturedOp) -> bool:
        return m is x or (not m.macs and not view.mixes(m))

    for n in (m for m in reach([x], view.inputs, alone) if not m.macs):
        if not _gating(view, n):
            continue
        a, b = n.args[:2]
        if any(isinstance(v, CapturedOp) and view.spreads_a_condition(n, v) for v in (a, b)):
            # a vector per sample scaling the tokens (adaLN-Zero's tanh(gate) * ffn(x)):
            # conditioning
            continue
        if any(isinstance(v, CapturedOp) and weighs_rows(n, v) for v in (a, b)):
            # a weight per row (DeepSeek-V4's hyper-connections, sigmoid(hc)[..., None]
            # * block output)
            continue
        if a.output_shapes and b.output_shapes and tuple(a.output_shapes[0]) != tuple(b.output_shapes[0]):
            # one side broadcast over the other: a GLU's gate and up have one shape
            # (deformable attention's sampled values · softmax(weights), the weights
            # spread over each head's features)
            continue
        act_a = _gate_side(view, a, b)
        macs_a = {m for m in nearest_before(view, a) if view.is_weight_matmul(m)}
        macs_b = {m for m in nearest_before(view, b) if view.is_weight_matmul(m)}
        # gated: two projections, or one whose output columns the two branches split
        # (GPT-OSS interleaves them); every shared projection is asked (in no order: the
        # answer must not depend on a set's order)
        if macs_a and macs_b and (macs_a != macs_b or any(not (columns(m, a) & columns(m, b)) for m in macs_a)):
            return (a, b) if act_a else (b, a)
    return None, None


def _gating(view: GraphView, n: CapturedOp) -> bool:
    """An elementwise product of two nodes, one of them behind an activation and the
    other not (a bound, a softcap's ``tanh(x / c) · c``, does not count where the
    other branch passes a gating activation: Inkling2's
    ``softcap(g) · sigmoid(g) · softcap(u)``)."""
    if view.packet(n) not in elementwise.PRODUCT_OPS or len(n.args) < 2:
        return False
    a, b = n.args[:2]
    return isinstance(a, CapturedOp) and isinstance(b, CapturedOp) and _gate_side(view, a, b) is not None


def _gate_side(view: GraphView, a: CapturedOp, b: CapturedOp) -> bool | None:
    """Whether ``a`` (True) or ``b`` (False) is a gating product's activated branch;
    ``None``: neither, or both alike."""
    act_a, act_b = passes_activation(view, a), passes_activation(view, b)
    if act_a != act_b:
        return act_a
    if not act_a:
        return None
    gate_a, gate_b = (view.activated(x, GATING_ACTIVATIONS) for x in (a, b))
    return gate_a if gate_a != gate_b else None


GATING_ACTIVATIONS = elementwise.ACTIVATION_OPS - {aten.tanh, aten.tanh_}
"""Activations that gate: every one but ``tanh``, which a softcap uses to bound a value
(``tanh(x / c) · c``)."""
