"""A read-only view of a capture's dataflow for the role passes: per record (a node of the graph), its op,
MACs, family and what its value depends on, and one walk helper (:func:`reach`) that every graph search is
written with. It walks the :class:`~flopscope.capture.CapturedOp` records themselves (linked by
:func:`~flopscope.capture.link`): finding roles needs no ``torch.fx`` graph.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any, TypeVar

from .capture import FORWARD, CapturedOp, LeafKind, link
from .errors import FlopscopeError
from .formulas import OpSpec

T = TypeVar("T")


_DYNAMIC, _WEIGHT, _COMPUTED = 1, 2, 4  # depends on an input or outside constant; on a parameter; on a multiply
_LEAF_FACTS: dict[LeafKind | None, int] = {LeafKind.INPUT: _DYNAMIC, LeafKind.CONSTANT: _DYNAMIC,
                                           LeafKind.PARAMETER: _WEIGHT}


def reach(starts: Iterable[CapturedOp], step: Callable[[CapturedOp], Iterable[CapturedOp]],
          expand: Callable[[CapturedOp], bool]) -> Iterator[CapturedOp]:
    """Every node reachable from ``starts`` (each once, depth first), moving by ``step`` out of the nodes
    for which ``expand`` is true. A node is yielded before its neighbours are taken."""
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
    return n.inputs


class GraphView:
    """The forward part of a captured graph, with facts computed once and never changed.

    - ``live[n]``: an activation: depends on a forward input, or was computed by a multiply (a learned
      query projected by a weight is one);
    - ``raw_weight[n]``: parameter data that no multiply produced (a weight, or a view of one);
    - ``dynamic[n]``: depends on a forward input (or an outside constant).
    """

    def __init__(self, ops: Sequence[CapturedOp]) -> None:
        link(ops)
        self.nodes: tuple[CapturedOp, ...] = tuple(n for n in ops if n.phase == FORWARD)
        # backward and recomputed ops: each takes the roles of the forward op it differentiates or repeats
        self.backward_nodes: tuple[CapturedOp, ...] = tuple(n for n in ops if n.phase != FORWARD)
        dynamic: dict[CapturedOp, bool] = {}
        live: dict[CapturedOp, bool] = {}
        raw_weight: dict[CapturedOp, bool] = {}
        passed_on: dict[CapturedOp, int] = {}  # what a node's users inherit: its facts, _COMPUTED if it multiplies
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
        self._users = ({n: tuple(u for u in n.users if u.phase == FORWARD) for n in self.nodes} if self.backward_nodes
                       else {n: tuple(n.users) for n in self.nodes})
        self._memo: dict[tuple[str, CapturedOp], Any] = {}
        self._matmul: dict[CapturedOp, bool] = {}
        self._weight_matmul: dict[CapturedOp, bool] = {}
        self._behind: dict[Any, dict[CapturedOp, bool]] = {}  # key -> node -> found behind it (behind())

    def cached(self, kind: str, node: CapturedOp, compute: Callable[[], T]) -> T:
        """``compute()`` once per ``(kind, node)``: searches over a view that never changes."""
        key = (kind, node)
        if key not in self._memo:
            self._memo[key] = compute()
        value: T = self._memo[key]
        return value

    # ---------------------------------------------------------------------------------------------
    def users(self, n: CapturedOp) -> tuple[CapturedOp, ...]:
        """Forward nodes that take ``n``'s output."""
        return self._users[n]

    def packet(self, n: CapturedOp) -> Any:
        """The ATen op packet of a call node (``None`` for leaves and ``getitem``)."""
        return self._packets[n]

    def spec(self, n: CapturedOp) -> OpSpec | None:
        return n.spec

    def parts(self, n: CapturedOp) -> Mapping[str, int] | None:
        """A fused op's formula parts ``{role: MACs}``."""
        return n.parts

    def operands(self, n: CapturedOp) -> tuple[CapturedOp, ...] | None:
        """The operand nodes of a matmul or attention kernel (at its family's positions), if all are nodes."""
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
        """A matmul of two activations (attention scores or weighted sum, never a projection)."""
        if not self.is_matmul(n):
            return False
        a, b = self.matmul_operands(n)
        return self.live[a] and self.live[b]

    def is_weight_matmul(self, n: CapturedOp) -> bool:
        """``x @ W``, ``W @ x``, or a learned query (two raw weights, the second one the weight)."""
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
        """An op of ``activations`` lies among the nodes without multiplies reached walking back from ``n``
        without crossing a multiply (``n`` included; a multiply itself is never activated)."""
        return self.behind(n, activations, lambda m: self.packet(m) in activations)

    def behind(self, n: CapturedOp, key: Any, test: Callable[[CapturedOp], bool]) -> bool:
        """A node passing ``test`` lies among the nodes without multiplies reached walking back from ``n`` without
        crossing a multiply (``n`` included; a multiply never passes). Computed for every node in one pass over
        the graph per ``key`` (which names ``test``): a search from each node would walk a residual stream back
        to the embedding, O(layers²) in all."""
        table = self._behind.get(key)
        if table is None:
            table = self._behind[key] = {}
            for m in self.nodes:  # in graph order: a node's inputs come first
                table[m] = not m.macs and (any(map(table.__getitem__, m.inputs)) or test(m))
        return table.get(n, False)

    def weight_operand(self, n: CapturedOp) -> CapturedOp:
        a, b = self.matmul_operands(n)
        return b if self.raw_weight[b] else a

    def activation_operand(self, n: CapturedOp) -> CapturedOp:
        a, b = self.matmul_operands(n)
        return a if self.raw_weight[b] else b

    # ---------------------------------------------------------------------------------------------
    # searches, all written with reach()
    def frontier(self, starts: Iterable[CapturedOp], step: Callable[[CapturedOp], Iterable[CapturedOp]],
                 blocked: Callable[[CapturedOp], bool] = lambda n: False) -> list[CapturedOp]:
        """The multiply nodes met first from ``starts``, moving by ``step`` through nodes without
        multiplies and never past a ``blocked`` one."""
        return [n for n in reach(starts, step, lambda n: not n.macs and not blocked(n)) if n.macs]

    def through_no_macs(self, start: CapturedOp) -> Iterator[CapturedOp]:
        """Nodes without multiplies reached walking back from ``start`` without crossing a multiply."""
        return (n for n in reach([start], inputs_of, lambda n: not n.macs) if not n.macs)

    def leaves_of(self, n: CapturedOp) -> list[CapturedOp]:
        """The parameter / buffer leaves (``get_attr``) ``n`` is computed from."""
        return [x for x in reach([n], inputs_of, lambda x: True) if x.node_op == "get_attr"]

    def descends_from(self, n: CapturedOp, ancestor: CapturedOp) -> bool:
        """``n`` is computed from ``ancestor`` without crossing another multiply."""
        return any(x is ancestor for x in reach([n], inputs_of, lambda x: x is n or not x.macs))
