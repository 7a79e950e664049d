"""The result of a profile: per-op records and the queries people ask of them.

Units live in names: ``multiplies`` / MACs (one multiply-accumulate), ``flops`` (= 2 x MACs), and
``elementwise ops`` (see :mod:`flopscope.elementwise`). The root module's path is ``""``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import fx

from .capture import Entry, build_graph
from .errors import FlopscopeError
from .facts import ModelFacts
from .model_formulas import ModelFormulas, model_formulas
from .module_tracker import ModuleCall, ModuleTracker
from .reconcile import Reconciliation, TransformerSpec, reconcile
from .roles import ROLE_ORDER, Assignment, Role, RoleFinder, RoleRule, scale_parts
from .timing import Timing, timing

Shape = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class OpRecord:
    """One counted op: an ATen op with a multiply formula, as executed once."""

    op: str  # "aten.bmm"
    module: str  # innermost module path; "" is the root
    module_stack: tuple[str, ...]  # module paths of the calls running it, outermost first
    call: int  # which call of `module` (1 = first) executed it
    input_shapes: tuple[Shape, ...]
    output_shapes: tuple[Shape, ...]
    multiplies: int  # MACs; FLOPs = 2 * multiplies
    parts: Mapping[str, int] | None  # {part: MACs} of a fused op (e.g. attn_scores / attn_weighted_sum)
    node: str  # name of the fx node in Profile.graph
    phase: str  # "forward" or "backward"
    role: Role  # the role that got most of this op's MACs
    roles: Mapping[str, int]  # {role: MACs}, summing to `multiplies` (several for fused ops / fused QKV)
    block: str  # module path of the attention / FFN / conv block instance it belongs to


class Profile:
    """Counts of one profiled run (or of every forward inside a :func:`flopscope.profiler` block).

    Build it with :func:`flopscope.profile`; the constructor is internal.
    """

    def __init__(self, entries: list[Entry], facts: ModelFacts, tracker: ModuleTracker, unsupported: Mapping[str, int],
                 mode: str, output: Any = None, notes: list[str] | None = None,
                 decomposed: Mapping[str, int] | None = None, role_rules: tuple[RoleRule, ...] = ()) -> None:
        self._set(entries, facts, tracker, unsupported, mode, output, notes, decomposed, role_rules)

    def _set(self, entries: list[Entry], facts: ModelFacts, tracker: ModuleTracker, unsupported: Mapping[str, int],
             mode: str, output: Any, notes: list[str] | None, decomposed: Mapping[str, int] | None,
             role_rules: tuple[RoleRule, ...]) -> None:
        self._entries = entries
        self._graph: fx.Graph | None = None  # built on first use: totals need only the entries' metadata
        self._facts = facts
        self._module_types = dict(facts.types)
        self._module_paths = list(facts.types)
        self._module_inputs = dict(tracker.inputs)
        module_calls = tracker.calls
        self._role_rules = role_rules
        self._roles: dict[fx.Node, Assignment] | None = None
        self._records: tuple[OpRecord, ...] | None = None
        self._module_calls = dict(module_calls)
        self._unsupported = dict(unsupported)
        self._decomposed = dict(decomposed or {})
        self._mode = mode
        self._output = output
        self._notes = list(notes or [])
        counted: list[tuple[str, int, frozenset[str], str]] = []
        elementwise: Counter[str] = Counter()
        elementwise_by_op: Counter[str] = Counter()
        for entry in entries:
            meta = entry.meta
            cost = meta.get("cost")
            if cost == "formula":
                paths = frozenset(frame.path for frame in meta["module_stack"])
                counted.append((str(entry.target.overloadpacket), meta["multiplies"], paths, meta["phase"]))
            elif cost == "elementwise":
                category, ops = meta["elementwise"]
                elementwise[category] += ops
                elementwise_by_op[str(entry.target.overloadpacket)] += ops
        self._counted = counted  # (op, MACs, module paths on the stack, phase) per counted op
        self._elementwise = dict(elementwise)
        self._elementwise_by_op = dict(elementwise_by_op)
        self._ready = True

    # ---------------------------------------------------------------------------------------------
    # what was captured
    @property
    def graph(self) -> fx.Graph:
        """The captured ``torch.fx`` graph (one node per ATen op; see :mod:`flopscope.capture`), with
        ``node.meta["role"]`` / ``["role_parts"]`` / ``["block"]`` on every node that multiplies."""
        self._role_assignments()
        return self._fx_graph()

    def _fx_graph(self) -> fx.Graph:
        self._check_ready()
        if self._graph is None:
            self._graph = build_graph(self._entries)
        return self._graph

    @property
    def records(self) -> tuple[OpRecord, ...]:
        """Every op with a multiply formula, in execution order, with its roles."""
        if self._records is None:
            assignments = self._role_assignments()
            records = []
            for node in self._fx_graph().nodes:
                meta = node.meta
                if meta.get("cost") != "formula":
                    continue
                assignment = assignments.get(node)
                roles = dict(assignment.parts) if assignment else {}
                records.append(OpRecord(
                    op=str(node.target.overloadpacket), module=meta["module"] or "",
                    module_stack=tuple(frame.path for frame in meta["module_stack"]),
                    call=meta["module_stack"][-1].call if meta["module_stack"] else 0,
                    input_shapes=meta["input_shapes"],
                    output_shapes=meta["output_shapes"], multiplies=meta["multiplies"],
                    parts=meta["multiply_parts"], node=node.name, phase=meta["phase"],
                    role=Role(meta.get("role", Role.OTHER.value)), roles=roles,
                    block=assignment.block or "" if assignment else meta["module"]))
            self._records = tuple(records)
        return self._records

    @property
    def mode(self) -> str:
        """``"fake"`` or ``"real"``: how the counted run executed (``"auto"`` resolves to one of them)."""
        return self._mode

    @property
    def output(self) -> Any:
        """What the forward returned (fake tensors in fake mode; ``None`` for :func:`flopscope.profiler`)."""
        return self._output

    @property
    def facts(self) -> ModelFacts:
        """What the model declares (module attributes, parameter shapes, config), read before it ran."""
        return self._facts

    def module_inputs(self) -> dict[ModuleCall, tuple[tuple[int | str, Shape], ...]]:
        """Per module call, the shapes of its tensor arguments (by position or keyword)."""
        return dict(self._module_inputs)

    @property
    def notes(self) -> list[str]:
        """One line per thing worth knowing about the run (fall-back to real mode, decompositions)."""
        return list(self._notes)

    # ---------------------------------------------------------------------------------------------
    # totals
    def total(self, module: str = "", phase: str | None = None) -> int:
        """Multiply-accumulates (MACs) of linear-algebra work (matmul, conv, attention, recurrent GEMMs),
        of the whole run (``module=""``) or of one module, inclusive of its submodules; ``phase``
        ("forward" / "backward") restricts a profile taken with ``backward=True``."""
        self._check_ready()
        if module != "":
            self._check_module(module)
        return sum(macs for _, macs, paths, ph in self._counted
                   if (module == "" or module in paths) and (phase is None or ph == phase))

    def total_flops(self, module: str = "", phase: str | None = None) -> int:
        """Floating-point operations of the same work: ``2 * total(module)`` (1 MAC = 2 FLOPs)."""
        return 2 * self.total(module, phase)

    def by_phase(self) -> dict[str, int]:
        """MACs of the forward pass and (with ``backward=True``) of the backward pass."""
        self._check_ready()
        out: Counter[str] = Counter()
        for _, macs, _, phase in self._counted:
            out[phase] += macs
        return dict(out)

    def by_module(self) -> dict[str, int]:
        """MACs per module path, inclusive of submodules, for every module of the model (0 where none);
        ``by_module()[""] == total()``. A module called several times sums its calls."""
        self._check_ready()
        out = dict.fromkeys(self._module_paths, 0)
        for _, macs, paths, _ in self._counted:
            for path in paths:
                out[path] = out.get(path, 0) + macs
        return out

    def by_op(self) -> dict[str, int]:
        """MACs per ATen op (``"aten.mm"``, ``"aten._scaled_dot_product_flash_attention_for_cpu"``)."""
        self._check_ready()
        out: Counter[str] = Counter()
        for op, macs, _, _ in self._counted:
            out[op] += macs
        return dict(out)

    by_operator = by_op  # fvcore's name

    def by_module_and_op(self) -> dict[str, dict[str, int]]:
        """``{module path: {op: MACs}}``, inclusive of submodules."""
        self._check_ready()
        out: dict[str, Counter[str]] = defaultdict(Counter)
        for op, macs, paths, _ in self._counted:
            for path in paths:
                out[path][op] += macs
        return {path: dict(out[path]) for path in self._module_paths if path in out}

    def op_calls(self) -> dict[str, int]:
        """How many times each counted op ran."""
        self._check_ready()
        return dict(Counter(op for op, _, _, _ in self._counted))

    # ---------------------------------------------------------------------------------------------
    # roles
    def by_role(self, phase: str | None = None) -> dict[str, int]:
        """MACs per semantic role (:class:`~flopscope.roles.Role` values as keys, in the canonical
        order); every multiply has exactly one role, so the values sum to ``total(phase=phase)``.
        Backward ops carry the role of the forward op they differentiate."""
        out: Counter[str] = Counter()
        for node, assignment in self._role_assignments().items():
            if phase is not None and node.meta.get("phase") != phase:
                continue
            for role, macs in assignment.parts.items():
                out[role] += macs
        return {role: out[role] for role in ROLE_ORDER if role in out}

    def by_block(self) -> dict[str, dict[str, int]]:
        """``{block path: {role: MACs}}`` per attention / FFN / conv block instance (the module path
        enclosing its multiplies); multiplies outside such blocks are listed under their own module."""
        out: dict[str, Counter[str]] = defaultdict(Counter)
        for assignment in self._role_assignments().values():
            for role, macs in assignment.parts.items():
                out[assignment.block or ""][role] += macs
        return {block: {r: roles[r] for r in ROLE_ORDER if r in roles} for block, roles in out.items()}

    def role_of(self, node: fx.Node | str) -> Role:
        """The role of a graph node (or node name): for a node split across roles, the one with most MACs."""
        self._role_assignments()
        found = node if isinstance(node, fx.Node) else next(n for n in self._fx_graph().nodes if n.name == node)
        return Role(found.meta.get("role", Role.OTHER.value))

    def reconcile(self, spec: TransformerSpec | None = None) -> Reconciliation:
        """Measured MACs per block and role against exact closed forms from the model's declared
        structure (or ``spec``), with the complexity term, useful work under masks, and the reason for
        any ratio that is not 1. See :mod:`flopscope.reconcile`."""
        return reconcile(self, spec)

    def model_formulas(self) -> ModelFormulas:
        """Measured forward MACs per token against Kaplan, Chinchilla, Megatron-LM and PaLM, with the
        difference explained part by part (see :mod:`flopscope.model_formulas`)."""
        return model_formulas(self)

    def timing(self) -> Timing:
        """Wall time per role and module of a real-mode run, with GFLOP/s and time share against MAC
        share (see :mod:`flopscope.timing`)."""
        return timing(self)

    def _adopt_roles(self, template: Profile) -> bool:
        """Take the roles of ``template``, a profile of the same model at another input length, when both
        ran the same ops in the same order: each op keeps its template's role fractions (a fused
        projection splits by columns, independent of length; a fused kernel's parts are its own).
        Returns False, changing nothing, when the op sequences differ."""
        pairs = zip(template._entries, self._entries, strict=False)
        if len(template._entries) != len(self._entries) or any(
                a.target != b.target or a.kind != b.kind for a, b in pairs):
            return False
        theirs = template._role_assignments()
        roles: dict[fx.Node, Assignment] = {}
        for mine, other in zip(self._fx_graph().nodes, template._fx_graph().nodes, strict=True):
            source = theirs.get(other)
            if source is None:
                continue
            macs = int(mine.meta.get("multiplies") or 0)
            own = mine.meta.get("multiply_parts")
            parts = dict(own) if own else (scale_parts(source.parts, macs) if macs else dict(source.parts))
            roles[mine] = Assignment(parts, source.block, source.kind)
        self._roles = roles
        self._stamp_roles()
        return True

    def _stamp_roles(self) -> None:
        assert self._roles is not None
        for node, assignment in self._roles.items():
            node.meta["role_parts"] = dict(assignment.parts)
            node.meta["role"] = max(assignment.parts, key=assignment.parts.__getitem__)
            node.meta["block"] = assignment.block

    def _role_assignments(self) -> dict[fx.Node, Assignment]:
        self._check_ready()
        if self._roles is None:
            self._roles = RoleFinder(self._fx_graph(), self._module_types, self._role_rules).assign()
            self._stamp_roles()
        return self._roles

    # ---------------------------------------------------------------------------------------------
    # what is not in total()
    def unsupported(self) -> dict[str, int]:
        """``{op: calls}`` of ops with neither a formula, an elementwise rule, nor a place in the
        zero-cost list: they may do arithmetic that ``total()`` does not include."""
        self._check_ready()
        return dict(self._unsupported)

    unsupported_ops = unsupported  # fvcore's name

    def decomposed(self) -> dict[str, int]:
        """``{op: calls}`` of ops without a formula that were counted through ``op.decompose()``."""
        return dict(self._decomposed)

    def elementwise(self) -> dict[str, int]:
        """Elementwise ops (not MACs) per category: pointwise, softmax, norm, reduction, ..."""
        self._check_ready()
        return dict(self._elementwise)

    def elementwise_by_op(self) -> dict[str, int]:
        """Elementwise ops (not MACs) per ATen op."""
        self._check_ready()
        return dict(self._elementwise_by_op)

    def total_elementwise(self) -> int:
        """All elementwise ops (softmax, norms, activations, adds, ...); never part of ``total()``."""
        return sum(self.elementwise().values())

    def uncalled_modules(self) -> set[str]:
        """Module paths of the model that never ran (fvcore's name)."""
        self._check_ready()
        return {p for p in self._module_paths if p not in self._module_calls}

    def module_calls(self) -> dict[str, int]:
        """How many times each module ran."""
        return dict(self._module_calls)

    # ---------------------------------------------------------------------------------------------
    def __repr__(self) -> str:
        if not getattr(self, "_ready", False):
            return f"<{type(self).__name__} recording>"
        return (f"<{type(self).__name__} mode={self._mode} total={self.total():,} MACs "
                f"({self.total_flops():,} FLOPs), {len(self._counted)} counted ops, "
                f"{sum(self._unsupported.values())} unsupported calls>")

    def _check_ready(self) -> None:
        if not getattr(self, "_ready", False):
            raise FlopscopeError("the profiler is still recording: query it after the `with` block")

    def _check_module(self, module: str) -> None:
        if module not in self._module_paths:
            raise FlopscopeError(f"no module with path {module!r} in the profiled model")
