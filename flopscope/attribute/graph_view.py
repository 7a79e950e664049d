"""A read-only view of a capture's dataflow for the role passes: per record (a node of
the graph), its op, MACs, family and what its value depends on, and one walk helper
(:func:`reach`) that every graph search is written with. It walks the
:class:`~flopscope.capture.records.CapturedOp` records themselves (linked by
:func:`~flopscope.capture.recorder.link`): finding roles needs no ``torch.fx`` graph.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any, TypeVar

import torch

from ..capture.records import FORWARD, CapturedOp, LeafKind, link
from ..errors import FlopscopeError
from ..formulas.registry import OpFamily, OpSpec

T = TypeVar("T")


# depends on an input or outside constant; on a parameter; on a multiply
_DYNAMIC, _WEIGHT, _COMPUTED = 1, 2, 4
_LEAF_FACTS: dict[LeafKind | None, int] = {LeafKind.INPUT: _DYNAMIC, LeafKind.CONSTANT: _DYNAMIC,
                                           LeafKind.PARAMETER: _WEIGHT}


def reach(starts: Iterable[CapturedOp], step: Callable[[CapturedOp], Iterable[CapturedOp]],
          expand: Callable[[CapturedOp], bool]) -> Iterator[CapturedOp]:
    """Every node reachable from ``starts`` (each once, depth first), moving by ``step``
    out of the nodes for which ``expand`` is true. A node is yielded before its
    neighbours are taken."""
    seen: set[CapturedOp] = set()
    todo = list(starts)
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        yield n
        if expand(n):
            todo.extend(step(n))


def inputs_of(n: CapturedOp) -> tuple[CapturedOp, ...]:
    """Every record ``n`` takes (data and control: what its value depends on)."""
    return n.inputs


aten = torch.ops.aten
CONTROL_ARGUMENTS: dict[Any, tuple[int, ...]] = {
    **dict.fromkeys((aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_,
                     aten._unsafe_index,
                     aten._unsafe_index_put, aten.take_along_dim, aten.embedding, aten.masked_fill,
                     aten.masked_fill_, aten.masked_scatter, aten.masked_select), (1,)),
    **dict.fromkeys((aten.index_select, aten.gather, aten.scatter, aten.scatter_, aten.scatter_add,
                     aten.scatter_add_, aten.scatter_reduce, aten.scatter_reduce_, aten.index_add,
                     aten.index_add_,
                     aten.index_copy, aten.index_copy_, aten.index_fill, aten.index_fill_), (2,)),
    **dict.fromkeys((aten.where,), (0,)),
    **dict.fromkeys((aten.grid_sampler, aten.grid_sampler_2d, aten.grid_sampler_3d, aten.cudnn_grid_sampler), (1,)),
}
"""The argument positions that say *where* an op reads or writes (indices, masks, a
selection's condition), not *what*: control, never data for a role search (a router's
scores reach the experts only through top-k indices; a mask reaches the scores only
through where they are kept; a grid sampler's grid says where it samples its input,
deformable attention's sampling locations). Values still depend on them
(:attr:`GraphView.dynamic`)."""


def data_inputs(n: CapturedOp) -> tuple[CapturedOp, ...]:
    """The records ``n`` takes as data: :attr:`~CapturedOp.inputs` less those found only
    at its :data:`CONTROL_ARGUMENTS` positions."""
    positions = CONTROL_ARGUMENTS.get(getattr(n.target, "overloadpacket", None))
    if positions is None:
        return n.inputs
    data: dict[CapturedOp, None] = {}
    for i, a in enumerate(n.args):
        if i not in positions:
            _records_in(a, data)
    _records_in(n.kwargs, data)
    return tuple(x for x in n.inputs if x in data)


def _records_in(x: Any, found: dict[CapturedOp, None]) -> None:
    if isinstance(x, CapturedOp):
        found[x] = None
    elif isinstance(x, (tuple, list)):
        for v in x:
            _records_in(v, found)
    elif isinstance(x, dict):
        for v in x.values():
            _records_in(v, found)


def is_channelwise_conv(n: CapturedOp) -> bool:
    """A depthwise convolution with one filter per channel (``groups == C_in == C_out``,
    weight ``[C, 1, *k]``): it mixes positions within each channel, never channels
    (Mamba's and gated DeltaNet's short causal convolution after the input
    projection, SegFormer's Mix-FFN). Its output channel ``c`` is computed from its
    input channel ``c`` alone."""
    shapes = _forward_conv_shapes(n)
    if shapes is None:
        return False
    x, weight = shapes
    return x[1] > 1 and weight[1] == 1 and weight[0] == x[1] == n.output_shapes[0][1]


def _forward_conv_shapes(n: CapturedOp) -> tuple[Sequence[int], Sequence[int]] | None:
    """(input, weight) shapes of a convolution that is not transposed, with channels and
    at least one spatial dim. causal-conv1d's kernels take a depthwise weight without
    its singleton, ``[C, W]``: read as ``[C, 1, W]``."""
    spec = n.spec
    if spec is None or spec.family is not OpFamily.CONV or len(n.input_shapes) < 2 or not n.output_shapes:
        return None
    x, weight = n.input_shapes[0], n.input_shapes[1]
    if len(x) == 3 and len(weight) == 2:
        weight = (weight[0], 1, weight[1])
    transposed = len(n.args) > 6 and n.args[6] is True
    return None if transposed or len(x) < 3 or len(weight) != len(x) else (x, weight)


def is_pointwise_conv(n: CapturedOp) -> bool:
    """A 1×1 convolution that mixes channels (every kernel dim 1, not transposed, not
    depthwise; grouped or not): at each position the same linear map of the channels
    (block-diagonal when grouped), a projection written as a convolution (YOLO11's
    C2PSA ``qkv`` and ``proj``, EfficientViT, SqueezeBERT, non-local blocks). Its
    output channel (dim 1) is its column."""
    shapes = _forward_conv_shapes(n)
    if shapes is None:
        return False
    x, weight = shapes
    return weight[1] > 1 and x[1] % weight[1] == 0 and all(k == 1 for k in weight[2:])


class GraphView:
    """The forward part of a captured graph, with facts computed once and never changed.

    - ``live[n]``: an activation: depends on a forward input, or was computed by a
      multiply (a learned query projected by a weight is one);
    - ``raw_weight[n]``: parameter data that no multiply produced (a weight, or a view
      of one);
    - ``dynamic[n]``: depends on a forward input (or an outside constant).
    """

    def __init__(self, ops: Sequence[CapturedOp]) -> None:
        link(ops)
        self.nodes: tuple[CapturedOp, ...] = tuple(n for n in ops if n.phase == FORWARD)
        # backward and recomputed ops: each takes the roles of the forward op it
        # differentiates or repeats
        self.backward_nodes: tuple[CapturedOp, ...] = tuple(n for n in ops if n.phase != FORWARD)
        dynamic: dict[CapturedOp, bool] = {}
        live: dict[CapturedOp, bool] = {}
        raw_weight: dict[CapturedOp, bool] = {}
        # what a node's users inherit: its facts, _COMPUTED if it multiplies
        passed_on: dict[CapturedOp, int] = {}
        for n in self.nodes:  # in graph order: a node's inputs come first
            facts = _LEAF_FACTS.get(n.leaf, 0)
            for p in n.inputs:
                facts |= passed_on[p]
            dynamic[n] = bool(facts & _DYNAMIC)
            live[n] = is_live = bool(facts & (_DYNAMIC | _COMPUTED))
            raw_weight[n] = bool(facts & _WEIGHT) and not is_live
            passed_on[n] = facts | _COMPUTED if n.macs else facts
        self._packets = {n: getattr(n.target, "overloadpacket", None) for n in ops}
        self.dynamic: Mapping[CapturedOp, bool] = MappingProxyType(dynamic)
        self.live: Mapping[CapturedOp, bool] = MappingProxyType(live)
        self.raw_weight: Mapping[CapturedOp, bool] = MappingProxyType(raw_weight)
        self._inputs = {n: data_inputs(n) for n in self.nodes}
        users: dict[CapturedOp, list[CapturedOp]] = {n: [] for n in self.nodes}
        for n in self.nodes:  # (graph order: each node's users in order)
            for p in self._inputs[n]:
                if p in users:
                    users[p].append(n)
        self._users = {n: tuple(u) for n, u in users.items()}
        self._memo: dict[tuple[str, CapturedOp], Any] = {}
        self._memo_plain: dict[str, Any] = {}
        self._matmul: dict[CapturedOp, bool] = {}
        self._weight_matmul: dict[CapturedOp, bool] = {}
        # key -> node -> found behind it (behind())
        self._behind: dict[Any, dict[CapturedOp, bool]] = {}

    @property
    def batch(self) -> int | None:
        """The batch size of the forward's inputs: the leading dim most of its input
        tensors share (``None`` without inputs, or where the sizes are symbolic)."""
        def compute() -> int | None:
            leading = Counter(n.output_shapes[0][0] for n in self.nodes
                              if n.leaf is LeafKind.INPUT and n.output_shapes and len(n.output_shapes[0]) >= 1
                              # (symbolic sizes: no batch to compare)
                              and type(n.output_shapes[0][0]) is int)
            return max(leading, key=lambda size: (leading[size], -size)) if leading else None

        if "batch" not in self._memo_plain:
            self._memo_plain["batch"] = compute()
        batch: int | None = self._memo_plain["batch"]
        return batch

    def inputs_behind(self, n: CapturedOp) -> tuple[int, bool]:
        """(the most elements of any forward input ``n`` is computed from, whether any
        of them is not floating-point: token ids, masks); ``(0, False)`` for a value
        of weights and constants only."""
        if "inputs behind" not in self._memo_plain:
            table: dict[CapturedOp, tuple[int, bool]] = {}
            none = (0, False)
            for m in self.nodes:  # in graph order: a node's inputs come first
                largest, not_float = 0, False
                if m.leaf is LeafKind.INPUT and m.output_shapes and all(type(s) is int for s in m.output_shapes[0]):
                    largest = math.prod(m.output_shapes[0])
                    not_float = m.dtype is not None and not m.dtype.is_floating_point
                for x in inputs_of(m):  # (all inputs: token ids index a table)
                    size, integer = table.get(x, none)
                    largest, not_float = max(largest, size), not_float or integer
                table[m] = (largest, not_float)
            self._memo_plain["inputs behind"] = table
        result: tuple[int, bool] = self._memo_plain["inputs behind"].get(n, (0, False))
        return result

    def is_condition(self, n: CapturedOp) -> bool:
        """``n`` holds a vector per sample (as many rows as the inputs' batch), or per
        frame: more rows, all computed from floating-point inputs of no more elements
        than that (a timestep per frame), not from the token stream (token ids:
        hyper-connections' streams; an encoder's features: an RNN-T joint's per-frame
        projections)."""
        if not n.output_shapes or not all(type(s) is int for s in n.output_shapes[0]):
            return False
        rows = math.prod(n.output_shapes[0][:-1])
        if rows == self.batch:
            return True
        largest, not_float = self.inputs_behind(n)
        return not not_float and largest <= rows

    def pooled(self, n: CapturedOp) -> bool:
        """``n`` holds one vector per sample pooled from the positions: a ``[batch,
        features]`` value computed (through any ops, multiplies included, each
        keeping one vector per sample) from a reduction of a value with more rows
        (``hidden[:, 0]``, a mean or max over the positions). A pooler's and a
        sequence classifier's input; never a value of the token stream, not even at
        one position (``[batch, 1, d]`` keeps its positions axis), nor a condition
        made from a timestep or a class."""
        if "pooled" not in self._memo_plain:
            table: dict[CapturedOp, bool] = {}
            batch = self.batch
            for m in self.nodes:  # in graph order: a node's inputs come first
                shape = m.output_shapes[0] if m.output_shapes else None
                if batch is None or shape is None or len(shape) != 2 or shape[0] != batch or not self.live[m]:
                    table[m] = False
                    continue
                numel = numel_of(shape) or 0
                table[m] = any(table.get(x, False) or (not m.macs and x.output_shapes and (numel_of(
                    x.output_shapes[0]) or 0) > numel and (rows_of(x.output_shapes[0]) or 0) > batch)
                               for x in self._inputs[m] if self.live.get(x, False))
            self._memo_plain["pooled"] = table
        found: bool = self._memo_plain["pooled"].get(n, False)
        return found

    def spreads_a_condition(self, user: CapturedOp, n: CapturedOp) -> bool:
        """``user`` spreads ``n`` over the positions (:func:`spreads`) and ``n`` is a
        condition (:meth:`is_condition`)."""
        return spreads(user, n) and self.is_condition(n)

    def runs(self, packets: frozenset[Any]) -> bool:
        """Some forward node runs an op of ``packets``."""
        if "packets" not in self._memo_plain:
            self._memo_plain["packets"] = frozenset(self._packets[n] for n in self.nodes)
        present: frozenset[Any] = self._memo_plain["packets"]
        return not present.isdisjoint(packets)

    def cached(self, kind: str, node: CapturedOp, compute: Callable[[], T]) -> T:
        """``compute()`` once per ``(kind, node)``: searches over a view that never
        changes."""
        key = (kind, node)
        if key not in self._memo:
            self._memo[key] = compute()
        value: T = self._memo[key]
        return value

    # ---------------------------------------------------------------------------------------------
    def users(self, n: CapturedOp) -> tuple[CapturedOp, ...]:
        """Forward nodes that take ``n``'s output as data (not as an index or mask:
        :data:`CONTROL_ARGUMENTS`)."""
        return self._users[n]

    def inputs(self, n: CapturedOp) -> tuple[CapturedOp, ...]:
        """The records ``n`` takes as data (:func:`data_inputs`): what the role searches
        walk back through."""
        return self._inputs.get(n, n.inputs)

    def packet(self, n: CapturedOp) -> Any:
        """The ATen op packet of a call node (``None`` for leaves and ``getitem``)."""
        return self._packets[n]

    def spec(self, n: CapturedOp) -> OpSpec | None:
        return n.spec

    def parts(self, n: CapturedOp) -> Mapping[str, int] | None:
        """A fused op's formula parts ``{role: MACs}``."""
        return n.parts

    def operands(self, n: CapturedOp) -> tuple[CapturedOp, ...] | None:
        """The operand nodes of a matmul or attention kernel (at its family's
        positions), if all are nodes."""
        spec = self.spec(n)
        if spec is None or not spec.operands or len(n.args) <= max(spec.operands):
            return None
        found = [a for a in (n.args[i] for i in spec.operands) if isinstance(a, CapturedOp)]
        return tuple(found) if len(found) == len(spec.operands) else None

    def is_matmul(self, n: CapturedOp) -> bool:
        """A product of two node operands that multiplies something."""
        known = self._matmul.get(n)
        if known is None:
            spec = self.spec(n)
            known = self._matmul[n] = (spec is not None and spec.is_matmul and bool(n.macs)
                                       and self.operands(n) is not None)
        return known

    def matmul_operands(self, n: CapturedOp) -> tuple[CapturedOp, CapturedOp]:
        found = self.operands(n)
        if found is None or len(found) != 2:
            raise FlopscopeError(f"{n.name} ({n.target}) is not a matmul of two graph nodes")
        return found[0], found[1]

    def is_activation_product(self, n: CapturedOp) -> bool:
        """A matmul of two activations (attention scores or weighted sum, never a
        projection)."""
        if not self.is_matmul(n):
            return False
        a, b = self.matmul_operands(n)
        return self.live[a] and self.live[b]

    def is_weight_matmul(self, n: CapturedOp) -> bool:
        """``x @ W``, ``W @ x``, or a learned query (two raw weights, the second one the
        weight)."""
        known = self._weight_matmul.get(n)
        if known is None:
            if not self.is_matmul(n) or self.parts(n):
                known = False
            else:
                a, b = self.matmul_operands(n)
                known = self.raw_weight[b] or (self.raw_weight[a] and self.live[b])
            self._weight_matmul[n] = known
        return known

    def activated(self, n: CapturedOp, activations: frozenset[Any]) -> bool:
        """An op of ``activations`` on an activation (:attr:`live`) lies among the nodes
        without multiplies reached walking back from ``n`` without crossing a
        multiply (``n`` included; a multiply itself is never activated; a learned
        scalar squashed by a sigmoid to blend two streams, SVD's ``AlphaBlender``,
        activates nothing; nor does one behind a value without positions spread over
        the tokens: adaLN's ``tanh(gate)`` conditions them; nor one behind a weight
        per row spread over the features, ``sigmoid(w)[..., None] * streams``:
        DeepSeek-V4's hyper-connections weigh their streams; nor one behind a sum of
        two activations, a stream mixed or written back to: D-FINE's gateway
        ``norm(sigmoid(g1) · x1 + sigmoid(g2) · x2)``)."""
        return self.behind(n, activations, lambda m: self.packet(m) in activations and self.live[m],
                           through=lambda m, x: (self._packets[m] not in BROADCASTING_OPS
                                                 or not (self.spreads_a_condition(m, x) or weighs_rows(m, x)))
                           and not self._joins_activations(m))

    def _joins_activations(self, m: CapturedOp) -> bool:
        """``m`` adds or subtracts two activations computed from different multiplies (a
        residual sum, a mix of streams; not two terms of one activation function of
        one value, xIELU's ``(expm1(h) − h)·a + b·h``)."""
        return self._packets[m] in SUM_OPS and self.mixes(m)

    def mixes(self, m: CapturedOp) -> bool:
        """``m`` combines activations computed from different multiplies (a gated
        product, a residual sum; not a norm's ``x · rsqrt(mean(x²))`` nor two terms
        of one function of one value)."""
        live = [x for x in self._inputs[m] if self.live.get(x, False)]
        if len(live) < 2:
            return False
        sources = {frozenset((x,)) if x.macs else self._multiplies_behind(x) for x in live}
        return len(sources) > 1

    def _multiplies_behind(self, x: CapturedOp) -> frozenset[CapturedOp]:
        """The multiplies nearest behind ``x`` (cached)."""
        return self.cached("multiplies behind", x,
                           lambda: frozenset(self.frontier([x], self.inputs)))

    def behind(self, n: CapturedOp, key: Any, test: Callable[[CapturedOp], bool],
               through: Callable[[CapturedOp, CapturedOp], bool] | None = None) -> bool:
        """A node passing ``test`` lies among the nodes without multiplies reached
        walking back from ``n`` without crossing a multiply (``n`` included; a
        multiply never passes), along the inputs ``x`` of each node ``m`` that pass
        ``through(m, x)`` (default: all). Computed for every node in one pass over
        the graph per ``key`` (which names ``test``): a search from each node would
        walk a residual stream back to the embedding, O(layers²) in all."""
        table = self._behind.get(key)
        if table is None:
            table = self._behind[key] = {}
            for m in self.nodes:  # in graph order: a node's inputs come first
                inputs = self._inputs[m] if through is None else [x for x in self._inputs[m] if through(m, x)]
                table[m] = not m.macs and (any(map(table.__getitem__, inputs)) or test(m))
        return table.get(n, False)

    def ahead(self, n: CapturedOp, key: Any, test: Callable[[CapturedOp, CapturedOp], bool],
              through: Callable[[CapturedOp, CapturedOp], bool] = lambda user, n: True) -> bool:
        """Some user ``u`` of ``n``'s value passes ``test(u, its input)``, walking
        forward from ``n`` through users without multiplies that pass ``through(u,
        its input)``. Computed for every node in one pass over the graph per ``key``
        (which names ``test`` and ``through``), as :meth:`behind`."""
        table = self._behind.get(("ahead", key))
        if table is None:
            table = self._behind[("ahead", key)] = {}
            for m in reversed(self.nodes):  # a node's users come after it
                table[m] = any(test(u, m) or (not u.macs and through(u, m) and table.get(u, False))
                               for u in self._users[m])
        return table.get(n, False)

    def weight_operand(self, n: CapturedOp) -> CapturedOp:
        a, b = self.matmul_operands(n)
        return b if self.raw_weight[b] else a

    def is_conv_projection(self, n: CapturedOp) -> bool:
        """A pointwise convolution (:func:`is_pointwise_conv`) of an activation by a raw
        weight."""
        return (is_pointwise_conv(n) and isinstance(n.args[0], CapturedOp) and isinstance(n.args[1], CapturedOp)
                and self.live[n.args[0]] and self.raw_weight[n.args[1]])

    def activation_operand(self, n: CapturedOp) -> CapturedOp:
        if self.is_conv_projection(n):
            first: CapturedOp = n.args[0]
            return first
        a, b = self.matmul_operands(n)
        return a if self.raw_weight[b] else b

    # ---------------------------------------------------------------------------------------------
    # searches, all written with reach()
    def frontier(self, starts: Iterable[CapturedOp],
                 step: Callable[[CapturedOp], Iterable[CapturedOp]],
                 blocked: Callable[[CapturedOp], bool] = lambda n: False) -> list[CapturedOp]:
        """The multiply nodes met first from ``starts``, moving by ``step`` through
        nodes without multiplies and never past a ``blocked`` one."""
        return [n for n in reach(starts, step, lambda n: not n.macs and not blocked(n)) if n.macs]

    def through_no_macs(self, start: CapturedOp) -> Iterator[CapturedOp]:
        """Nodes without multiplies reached walking back from ``start`` without crossing
        a multiply."""
        return (n for n in reach([start], self.inputs, lambda n: not n.macs) if not n.macs)

    def leaves_of(self, n: CapturedOp) -> list[CapturedOp]:
        """The parameter / buffer leaves (``get_attr``) ``n`` is computed from."""
        return [x for x in reach([n], inputs_of, lambda x: True) if x.node_op == "get_attr"]

    def descends_from(self, n: CapturedOp, ancestor: CapturedOp) -> bool:
        """``n`` is computed from ``ancestor`` without crossing another multiply."""
        return any(x is ancestor for x in reach([n], self.inputs, lambda x: x is n or not x.macs))

    def descendants(self, ancestor: CapturedOp) -> frozenset[CapturedOp]:
        """The forward nodes computed from ``ancestor`` without crossing another multiply
        (the multiplies met first among them): :meth:`descends_from` of many nodes at
        once, in one walk (found once per node)."""
        return self.cached("descendants", ancestor,
                           lambda: frozenset(reach(self.users(ancestor), self.users, lambda x: not x.macs)))


SUM_OPS = frozenset({aten.add, aten.add_, aten.sub, aten.sub_})
"""Elementwise sums: where an update meets the output of the projection it updates, a
residual stream its sublayer's output."""
BROADCASTING_OPS = frozenset({aten.add, aten.add_, aten.sub, aten.sub_, aten.mul, aten.mul_,
                              aten.div, aten.div_,
                              aten.addcmul, aten.addcdiv, aten.where, aten.lerp, aten.expand})
"""Ops that broadcast their operands to one shape: the elementwise ones, and ``expand``
(a scatter such as ``index_add_`` does not)."""


def spreads(user: CapturedOp, n: CapturedOp) -> bool:
    """``user`` broadcasts ``n``'s value along an axis other than the last, where ``n``
    has one entry and the output many (or none), and ``n`` has one entry on every
    later axis but the last: the value holds no positions, the output does."""
    if getattr(user.target, "overloadpacket", None) not in BROADCASTING_OPS or not user.output_shapes \
            or not n.output_shapes:
        return False
    out, shape = tuple(user.output_shapes[0]), tuple(n.output_shapes[0])
    if len(shape) > len(out) or len(out) < 2 or not shape or math.prod(shape) <= 1:
        return False
    padded = (1,) * (len(out) - len(shape)) + shape
    # (0: repeated for no frame)
    first = next((i for i in range(len(out) - 1) if padded[i] == 1 != out[i]), None)
    return first is not None and all(size == 1 for size in padded[first:-1])


def numel_of(shape: Any) -> int | None:
    """Elements of a value of this shape; None where a size is symbolic (nothing to
    compare)."""
    return math.prod(shape) if all(type(s) is int for s in shape) else None


def rows_of(shape: Any) -> int | None:
    """Rows of a value of this shape (every dim but the last); None where a size is
    symbolic."""
    return math.prod(shape[:-1]) if all(type(s) is int for s in shape) else None


def weighs_rows(product: CapturedOp, x: CapturedOp) -> bool:
    """``x`` enters ``product`` with one entry along the last axis, where the product
    has many: it scales whole rows (a router's weight, a hyper-connection's), no
    value per feature as a GLU's gate has."""
    return (bool(x.output_shapes) and bool(product.output_shapes) and x.output_shapes[0][-1:] == (1,)
            and product.output_shapes[0][-1:] != (1,))
