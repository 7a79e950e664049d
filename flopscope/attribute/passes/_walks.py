"""Walks over the graph that several role passes share.

- :func:`nearest_before` / :func:`nearest_after`: the multiplies met first walking back
  / on;
- :func:`pass_through_root`: the record a value is a view, copy or dropout of;
- :func:`behind_channelwise` and :func:`projections_of`: the projections behind a value,
  looking through depthwise convolutions;
- :func:`concatenated`: the values a projection's input concatenates;
- :func:`writes_back`: a result added to the residual stream its input came from.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ...capture.records import CapturedOp, Cost
from ...formulas import elementwise
from ...formulas.elementwise import PRODUCT_OPS, SOFTMAX_OPS
from ...role import Role
from ..graph_view import SUM_OPS, GraphView, is_channelwise_conv, numel_of, reach
from ..state import RoleState

aten = torch.ops.aten


BARRIER_CATEGORIES = ("norm", "reduction")
"""Elementwise categories the attention output does not flow to ``out_proj`` through."""


PASS_THROUGH = frozenset({aten.native_dropout, aten.dropout, aten.feature_dropout,
                          aten.alpha_dropout})
"""Ops besides the zero-cost ones that carry a value to a matmul as the same input
(dropout on an adapter's branch keeps it the projection's input)."""


RANDOM_OPS = frozenset({aten.bernoulli, aten.bernoulli_, aten.rand, aten.rand_like, aten.uniform_,
                        aten.uniform,
                        aten.randn, aten.randn_like, aten.normal, aten.normal_})
"""Random sources: a product with a mask drawn from one is dropout (fake tensors run
``x * bernoulli_(...)``)."""


SELECTIONS = frozenset({aten.topk, aten.sort, aten.argsort, aten.argmax, aten.argmin,
                        aten.kthvalue})
"""Ops that pick entries by value: what a scoring network's result feeds when it only
selects."""


def nearest_before(view: GraphView, start: Any, stop_at_softmax: bool = False) -> list[CapturedOp]:
    """Multiply nodes reached first walking back from ``start`` through ops without
    multiplies."""
    if not isinstance(start, CapturedOp):
        return []
    if stop_at_softmax:
        return view.frontier([start], view.inputs,
                             lambda n: n is not start and view.packet(n) in SOFTMAX_OPS)
    return view.cached("before", start, lambda: view.frontier([start], view.inputs))


def nearest_after(view: GraphView, start: CapturedOp,
                  through_reductions: bool = False) -> list[CapturedOp]:
    """Multiply nodes reached first walking forward from ``start`` through ops without
    multiplies (not through another softmax or a normalisation, nor a reduction
    unless ``through_reductions``)."""
    barriers = ("norm",) if through_reductions else BARRIER_CATEGORIES
    return view.frontier(view.users(start), view.users, lambda n: view.packet(n) in SOFTMAX_OPS or (
        n.elementwise or ("",))[0] in barriers)


def passes_activation(view: GraphView, start: CapturedOp) -> bool:
    """An activation function lies between ``start`` and the multiplies behind it."""
    return view.activated(start, elementwise.ACTIVATION_OPS)


def pass_through_root(view: GraphView, n: CapturedOp) -> CapturedOp:
    """The record ``n`` holds the value of, walking back through views, copies and
    dropout (one data input each)."""
    return view.cached("pass-through root", n, lambda: _walk_to_root(view, n))


def _walk_to_root(view: GraphView, n: CapturedOp) -> CapturedOp:
    while not n.macs:
        inputs = view.inputs(n)
        if view.packet(n) in PRODUCT_OPS and len(inputs) == 2:
            inputs = tuple(x for x in inputs if not is_random(view, x))  # dropout as x * mask
        if len(inputs) != 1 or not (n.cost is Cost.ZERO or view.packet(n) in PASS_THROUGH | PRODUCT_OPS):
            break
        n = inputs[0]
    return n


def is_random(view: GraphView, n: CapturedOp) -> bool:
    """A random op lies behind ``n`` (without multiplies): ``n`` is a mask drawn at
    random."""
    return view.runs(RANDOM_OPS) and view.behind(n, "random",
                                                 lambda m: view.packet(m) in RANDOM_OPS)


def behind_channelwise(view: GraphView, start: CapturedOp,
                       blocked: Callable[[CapturedOp], bool] | None = None,
                        behind_conv: Callable[[CapturedOp], bool] | None = None) -> list[CapturedOp]:
    """The multiplies nearest behind ``start``, with each depthwise convolution among
    them replaced by the multiplies nearest behind its input; ``blocked``: nodes the
    walk does not pass; ``behind_conv``: nodes it does not pass behind a convolution."""
    def before(n: CapturedOp, stop: Callable[[CapturedOp], bool] | None) -> list[CapturedOp]:
        if stop is None:
            return nearest_before(view, n)
        return view.frontier([n], view.inputs, stop)

    def both(n: CapturedOp) -> bool:
        return (blocked is not None and blocked(n)) or (behind_conv is not None and behind_conv(n))

    found: dict[CapturedOp, None] = {}
    todo, seen = list(before(start, blocked)), set()  # (a copy: nearest_before's lists are cached)
    while todo:
        m = todo.pop(0)
        if m in seen:
            continue
        seen.add(m)
        if is_channelwise_conv(m) and isinstance(m.args[0], CapturedOp):
            # (extends the copy)
            todo.extend(before(m.args[0], both if behind_conv is not None else blocked))
        else:
            found[m] = None
    return list(found)


def projections_of(view: GraphView, state: RoleState, start: CapturedOp, role: str,
                   through_channelwise: bool = False,
                    blocked: Callable[[CapturedOp], bool] | None = None) -> list[tuple[CapturedOp, CapturedOp, str]]:
    """(projection, consumer target, role) for the weight matmuls nearest behind
    ``start``; with ``through_channelwise``, looking through depthwise convolutions
    (a short convolution over positions, channel by channel, keeps each channel a
    column of the projection before it: the query, key and value of Mamba-2 and gated
    DeltaNet; the convolution keeps ``conv``), not past a ``blocked`` node behind a
    convolution."""
    behind = behind_channelwise(view, start, behind_conv=blocked) if through_channelwise else nearest_before(
        view, start)
    return [(p, start, role) for p in behind
            if (view.is_weight_matmul(p) and (p not in state.parts or p in state.demands or state.has_free_columns(p)))
            or (through_channelwise and view.is_conv_projection(p) and (claimed_by_family(state, p)
                                                                        or p in state.demands))]


def claimed_by_family(state: RoleState, p: CapturedOp) -> bool:
    """``p`` holds only the role its op family gave it (a convolution's ``conv``):
    attention may still ask for it as a projection (a pointwise convolution)."""
    return state.parts.get(p) == {Role.CONV.value: p.macs} and p not in state.demands


def concatenated(view: GraphView, x: CapturedOp) -> list[CapturedOp]:
    """The values ``x`` concatenates along its last dim (through views, copies and
    dropout), when there are several: a concatenation along an earlier axis counts
    when the views merge that axis and every later one into ``x``'s last (ConvBERT's
    ``cat([attention, span conv], heads axis)`` flattened to the projection's input
    columns)."""
    width = x.output_shapes[0][-1] if x.output_shapes and x.output_shapes[0] else None
    x = pass_through_root(view, x)
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


def writes_back(view: GraphView, d: CapturedOp) -> bool:
    """``d``'s result is added to the stream its hidden layer was computed from (through
    ops without multiplies, an addend of as many elements that ``d``'s input descends
    from): it writes back to a residual stream, as an FFN's down projection does. A
    positional embedding added to queries (RT-DETR's ``query_pos_head`` of the boxes)
    or a type embedding added to a projector's output is no residual."""
    size = _size(d)
    if size is None:
        return False
    stream = _read_by_hidden_layer(view, d)
    # (through a sum with an adapter's update)
    for n in reach(view.users(d), view.users, lambda n: not n.macs):
        if view.packet(n) in SUM_OPS and not n.macs and _size(n) == size and any(
                x is not d and _size(x) == size and pass_through_root(view, x) in stream
                and not view.descends_from(x, d) for x in view.inputs(n)):
            return True
    return False


_UPSTREAM = 256
"""The most nodes :func:`_read_by_hidden_layer` walks back."""


def _read_by_hidden_layer(view: GraphView, d: CapturedOp) -> set[CapturedOp]:
    """What ``d``'s hidden layer reads: walking back from ``d``'s input through ops
    without multiplies and depthwise convolutions to the weight matmuls behind it
    (its up projections), then from their inputs through ops without multiplies, each
    value by its pass-through root too (at most :data:`_UPSTREAM` nodes)."""
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
    return {pass_through_root(view, n) for n in stream} | stream


def _size(n: CapturedOp) -> int | None:
    """Elements of ``n``'s (first) output; None where a size is symbolic."""
    return numel_of(n.output_shapes[0]) if n.output_shapes else None
