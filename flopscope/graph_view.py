"""A read-only view of a captured graph for the role passes: per node, its op, MACs, family and what its
value depends on, and one walk helper (:func:`reach`) that every graph search is written with.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

from torch import fx

from .capture import FORWARD, CapturedOp, LeafKind, captured
from .errors import FlopscopeError
from .formulas import OpSpec

T = TypeVar("T")


def reach(starts: Iterable[fx.Node], step: Callable[[fx.Node], Iterable[fx.Node]],
          expand: Callable[[fx.Node], bool]) -> Iterator[fx.Node]:
    """Every node reachable from ``starts`` (each once, depth first), moving by ``step`` out of the nodes
    for which ``expand`` is true. A node is yielded before its neighbours are taken."""
    seen: set[fx.Node] = set()
    todo = list(starts)
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        yield n
        if expand(n):
            todo.extend(step(n))


def inputs_of(n: fx.Node) -> list[fx.Node]:
    return n.all_input_nodes


class GraphView:
    """The forward part of a captured graph, with facts computed once and never changed.

    - ``live[n]``: an activation: depends on a forward input, or was computed by a multiply (a learned
      query projected by a weight is one);
    - ``raw_weight[n]``: parameter data that no multiply produced (a weight, or a view of one);
    - ``dynamic[n]``: depends on a forward input (or an outside constant).
    """

    def __init__(self, graph: fx.Graph) -> None:
        every = list(graph.nodes)
        self.graph = graph
        self.ops: Mapping[fx.Node, CapturedOp] = MappingProxyType({n: captured(n) for n in every})
        self.node_of: Mapping[CapturedOp, fx.Node] = MappingProxyType({op: n for n, op in self.ops.items()})
        self.nodes: tuple[fx.Node, ...] = tuple(n for n in every if self.ops[n].phase == FORWARD)
        # backward and recomputed ops: each takes the roles of the forward op it differentiates or repeats
        self.backward_nodes: tuple[fx.Node, ...] = tuple(n for n in every if self.ops[n].phase != FORWARD)
        self.macs: Mapping[fx.Node, int] = MappingProxyType({n: self.ops[n].macs for n in every})
        dynamic: dict[fx.Node, bool] = {}
        weighty: dict[fx.Node, bool] = {}
        computed: dict[fx.Node, bool] = {}
        for n in self.nodes:
            parents = n.all_input_nodes
            leaf = self.ops[n].leaf
            dynamic[n] = leaf in (LeafKind.INPUT, LeafKind.CONSTANT) or any(dynamic[p] for p in parents)
            weighty[n] = leaf is LeafKind.PARAMETER or any(weighty[p] for p in parents)
            computed[n] = any(computed[p] or self.macs[p] for p in parents)
        self.dynamic: Mapping[fx.Node, bool] = MappingProxyType(dynamic)
        self.live: Mapping[fx.Node, bool] = MappingProxyType({n: dynamic[n] or computed[n] for n in self.nodes})
        self.raw_weight: Mapping[fx.Node, bool] = MappingProxyType(
            {n: weighty[n] and not self.live[n] for n in self.nodes})
        self._users = {n: tuple(u for u in n.users if self.ops[u].phase == FORWARD) for n in self.nodes}
        self._memo: dict[tuple[str, fx.Node], Any] = {}
        self._matmul: dict[fx.Node, bool] = {}
        self._weight_matmul: dict[fx.Node, bool] = {}
        self._behind: dict[Any, dict[fx.Node, bool]] = {}  # key -> node -> found behind it (behind())

    def cached(self, kind: str, node: fx.Node, compute: Callable[[], T]) -> T:
        """``compute()`` once per ``(kind, node)``: searches over a view that never changes."""
        key = (kind, node)
        if key not in self._memo:
            self._memo[key] = compute()
        value: T = self._memo[key]
        return value

    # ---------------------------------------------------------------------------------------------
    def users(self, n: fx.Node) -> tuple[fx.Node, ...]:
        """Forward nodes that take ``n``'s output."""
        return self._users[n]

    def packet(self, n: fx.Node) -> Any:
        """The ATen op packet of a call node (``None`` for leaves and ``getitem``)."""
        return getattr(n.target, "overloadpacket", None)

    def spec(self, n: fx.Node) -> OpSpec | None:
        return self.ops[n].spec

    def parts(self, n: fx.Node) -> Mapping[str, int] | None:
        """A fused op's formula parts ``{role: MACs}``."""
        return self.ops[n].parts

    def operands(self, n: fx.Node) -> tuple[fx.Node, ...] | None:
        """The operand nodes of a matmul or attention kernel (at its family's positions), if all are nodes."""
        spec = self.spec(n)
        if spec is None or not spec.operands or len(n.args) <= max(spec.operands):
            return None
        found = [a for a in (n.args[i] for i in spec.operands) if isinstance(a, fx.Node)]
        return tuple(found) if len(found) == len(spec.operands) else None

    def is_matmul(self, n: fx.Node) -> bool:
        """A product of two node operands that multiplies something."""
        known = self._matmul.get(n)
        if known is None:
            spec = self.spec(n)
            known = self._matmul[n] = (spec is not None and spec.is_matmul and bool(self.macs[n])
                                       and self.operands(n) is not None)
        return known

    def matmul_operands(self, n: fx.Node) -> tuple[fx.Node, fx.Node]:
        found = self.operands(n)
        if found is None or len(found) != 2:
            raise FlopscopeError(f"{n.name} ({n.target}) is not a matmul of two graph nodes")
        return found[0], found[1]

    def is_activation_product(self, n: fx.Node) -> bool:
        """A matmul of two activations (attention scores or weighted sum, never a projection)."""
        if not self.is_matmul(n):
            return False
        a, b = self.matmul_operands(n)
        return self.live[a] and self.live[b]

    def is_weight_matmul(self, n: fx.Node) -> bool:
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

    def activated(self, n: fx.Node, activations: frozenset[Any]) -> bool:
        """An op of ``activations`` lies among the nodes without multiplies reached walking back from ``n``
        without crossing a multiply (``n`` included; a multiply itself is never activated)."""
        return self.behind(n, activations, lambda m: self.packet(m) in activations)

    def behind(self, n: fx.Node, key: Any, test: Callable[[fx.Node], bool]) -> bool:
        """A node passing ``test`` lies among the nodes without multiplies reached walking back from ``n`` without
        crossing a multiply (``n`` included; a multiply never passes). Computed for every node in one pass over
        the graph per ``key`` (which names ``test``): a search from each node would walk a residual stream back
        to the embedding, O(layers²) in all."""
        table = self._behind.get(key)
        if table is None:
            table = self._behind[key] = {}
            for m in self.nodes:  # in graph order: a node's inputs come first
                table[m] = not self.macs[m] and (any(table.get(p, False) for p in m.all_input_nodes) or test(m))
        return table.get(n, False)

    def weight_operand(self, n: fx.Node) -> fx.Node:
        a, b = self.matmul_operands(n)
        return b if self.raw_weight[b] else a

    def activation_operand(self, n: fx.Node) -> fx.Node:
        a, b = self.matmul_operands(n)
        return a if self.raw_weight[b] else b

    # ---------------------------------------------------------------------------------------------
    # searches, all written with reach()
    def frontier(self, starts: Iterable[fx.Node], step: Callable[[fx.Node], Iterable[fx.Node]],
                 blocked: Callable[[fx.Node], bool] = lambda n: False) -> list[fx.Node]:
        """The multiply nodes met first from ``starts``, moving by ``step`` through nodes without
        multiplies and never past a ``blocked`` one."""
        return [n for n in reach(starts, step, lambda n: not self.macs[n] and not blocked(n)) if self.macs[n]]

    def through_no_macs(self, start: fx.Node) -> Iterator[fx.Node]:
        """Nodes without multiplies reached walking back from ``start`` without crossing a multiply."""
        return (n for n in reach([start], inputs_of, lambda n: not self.macs[n]) if not self.macs[n])

    def leaves_of(self, n: fx.Node) -> list[fx.Node]:
        """The parameter / buffer leaves (``get_attr``) ``n`` is computed from."""
        return [x for x in reach([n], inputs_of, lambda x: True) if x.op == "get_attr"]

    def descends_from(self, n: fx.Node, ancestor: fx.Node) -> bool:
        """``n`` is computed from ``ancestor`` without crossing another multiply."""
        return any(x is ancestor for x in reach([n], inputs_of, lambda x: x is n or not self.macs[x]))
