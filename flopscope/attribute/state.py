"""What the role passes found so far (:class:`RoleState`), and the :data:`Pass` type.

- A pass writes a multiply's roles only through :meth:`RoleState.claim`. A second claim
  of one multiply is a bug in the passes: it raises :class:`DoubleClaimError`.
- The rule passes win over everything: they write through :meth:`RoleState.force`.
- A pass asks for a projection's roles with :meth:`RoleState.demand` (its columns that
  reach a consumer) or :meth:`RoleState.demand_rows` (its rows that hold a value). The
  pipeline settles the column demands after each pass (:meth:`RoleState.settle`); the
  rows are settled by the pass ``concatenated_inputs``.

Definitions: docs/roles.md sections 3 (the passes) and 4 (demands split by columns and
rows).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ..capture.records import CapturedOp
from ..role import Role
from .columns import split_by_columns
from .graph_view import GraphView
from .rules import RoleRule

PROJECTION_ROLES = frozenset({Role.Q_PROJ.value, Role.K_PROJ.value, Role.V_PROJ.value})
"""The attention projections' roles: what factors and projectors of keys and values are
read by."""

Demand = tuple[CapturedOp, str]
"""A request for a projection's roles: (the consumer its columns reach, or the value its
rows hold; the role)."""


class DoubleClaimError(AssertionError):
    """A pass claimed a multiply that an earlier claim holds: a bug in the passes, not
    in the model. Each pass checks that a multiply is free before it claims it."""


@dataclass
class RoleState:
    """What the passes have claimed, and what they ask for.

    - ``parts``: ``{role: MACs}`` per claimed node (read-only: written by :meth:`claim`,
      :meth:`force` and :meth:`settle`);
    - ``demands`` / ``row_demands``: the projections asked for by columns / by rows;
    - ``settled``: the column demands of each projection settled so far;
    - ``groups``: the nodes that form one attention / FFN instance (its block);
    - ``factors``: factors of the projections they feed (docs/roles.md section 3.5);
    - ``module_types`` and ``rules``: what the rule passes read (the user's rules).
    """

    module_types: Mapping[str, type] = field(default_factory=dict)
    rules: tuple[RoleRule, ...] = ()
    demands: dict[CapturedOp, list[Demand]] = field(default_factory=dict)
    row_demands: dict[CapturedOp, list[Demand]] = field(default_factory=dict)
    groups: list[set[CapturedOp]] = field(default_factory=list)
    settled: dict[CapturedOp, list[Demand]] = field(default_factory=dict)
    factors: set[CapturedOp] = field(default_factory=set)
    _parts: dict[CapturedOp, dict[str, int]] = field(default_factory=dict, init=False, repr=False)
    parts: Mapping[CapturedOp, dict[str, int]] = field(init=False)

    def __post_init__(self) -> None:
        # a live read-only view: passes read it, only the methods below write
        self.parts = MappingProxyType(self._parts)

    def claim(self, node: CapturedOp, parts: Role | dict[str, int]) -> None:
        """Give ``node`` its roles: ``{role: MACs}``, or one :class:`Role` for all its
        MACs.

        Raises :class:`DoubleClaimError` if a claim holds ``node`` already."""
        if node in self._parts:
            raise DoubleClaimError(f"{node!r} is claimed already ({self._parts[node]}); "
                              "a pass claims only a free multiply, RoleState.force() overwrites")
        self._parts[node] = {parts.value: node.macs} if isinstance(parts, Role) else parts

    def force(self, node: CapturedOp, parts: dict[str, int]) -> None:
        """Give ``node`` these roles whatever it held (the rule passes, which win)."""
        self._parts[node] = parts

    def claimed(self, n: CapturedOp) -> bool:
        """``n`` holds roles or is asked for."""
        return n in self._parts or n in self.demands or n in self.row_demands

    def roles_of(self, n: CapturedOp) -> set[str]:
        """The roles ``n`` was given or asked for so far."""
        return {role for role, macs in self._parts.get(n, {}).items() if macs} | {
            role for _, role in self.demands.get(n, ())}

    def demand(self, projection: CapturedOp, consumer: CapturedOp, role: str) -> bool:
        """Ask for ``projection``'s columns that reach ``consumer`` to be ``role``. A
        consumer in a later call of the root module (a later step, reading the columns
        through a state the step left: a cache) asks for nothing: a step's projection is
        charged by what that step does with its columns, whatever steps follow it.
        (Qwen3-Next's convolution state holds the last positions of its fused ``q, k,
        v`` columns, which a label replay into the next step's chunk mixes.) Returns
        whether it asked (the projection is then part of the consumer's instance)."""
        if _later_call(consumer, projection):
            return False
        self.demands.setdefault(projection, []).append((consumer, role))
        return True

    def demand_rows(self, projection: CapturedOp, source: CapturedOp, role: str) -> None:
        """Ask for the rows of ``projection`` (its input's columns) that hold
        ``source``'s values to be ``role``: ``projection`` reads a concatenation of
        several values. Settled by the pass ``concatenated_inputs``, after every pass
        that may ask for the others."""
        self.row_demands.setdefault(projection, []).append((source, role))

    def take_row_demands(self) -> dict[CapturedOp, list[Demand]]:
        """The rows asked for so far, each projection's; none are left asked for."""
        found, self.row_demands = self.row_demands, {}
        return found

    def rows_only(self, n: CapturedOp) -> bool:
        """Only rows of ``n`` are asked for (more of its rows may still be)."""
        return n in self.row_demands and n not in self._parts and n not in self.demands

    def settle(self, view: GraphView) -> None:
        """Claim every demanded projection: whole when one role wants it and one
        multiply reads it, else split by columns (with the columns an earlier pass
        asked for).

        A fused projection's columns may feed attention and an MLP. Qwen3-Next's
        ``q_proj``, whose other half gates the attention's output, is ``q_proj`` for its
        query columns and ``other`` for the gate's, as a gate of its own is. A
        projection settled before, or claimed ``conv`` by its family, is settled again:
        its parts are replaced."""
        for p, wanted in self.demands.items():
            wanted = [*self.settled.get(p, ()), *wanted]
            roles = {role for _, role in wanted}
            whole = len(roles) == 1 and (len(view.frontier(view.users(p), view.users)) <= 1
                                         or not all(target is p or target in view.descendants(p)
                                                    for target, _ in wanted))
            parts = None if whole else split_by_columns(p, wanted, p.macs)
            if parts is None or (len(roles) == 1 and not parts.get(next(iter(roles)))):
                # one role, its columns not followed: the whole projection
                parts = {next(iter(roles)): p.macs}
            self._parts[p] = parts
            self.settled[p] = wanted
        self.demands = {}

    def has_free_columns(self, p: CapturedOp) -> bool:
        """``p`` was split by columns and some of its columns no consumer asked for yet
        (``other``)."""
        return p in self.settled and bool(self._parts.get(p, {}).get(Role.OTHER.value))


Pass = Callable[[GraphView, RoleState], None]
"""A role pass: reads the view, claims and asks through the state."""


def _later_call(consumer: CapturedOp, p: CapturedOp) -> bool:
    """``consumer`` ran in a later call of the root module that ran ``p`` (a later step)."""
    if not consumer.module_stack or not p.module_stack:
        return False
    mine, theirs = p.module_stack[0], consumer.module_stack[0]
    return mine.path == theirs.path and theirs.call > mine.call
