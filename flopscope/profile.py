"""The result of a profile: per-op records and the queries people ask of them.

Units live in names: ``multiplies`` / MACs (one multiply-accumulate), ``flops`` (= 2 x
MACs), and ``elementwise ops`` (see :mod:`flopscope.formulas.elementwise`). The root
module's path is ``""``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping
from fractions import Fraction
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Any

from torch import fx

from .attribute.alignment import aligned
from .attribute.carried import carried_roles, roles_with_copies
from .attribute.columns import scale_parts
from .attribute.op_record import OpRecord, Shape, op_records
from .attribute.paths import enclosing
from .attribute.roles import Assignment, RoleRule
from .attribute.tally import Tally, tally
from .capture import CaptureResult, paused_gc, undispatched
from .capture.facts import ModelFacts
from .capture.module_tracker import ModuleCall
from .capture.records import FORWARD, CapturedOp, Cost, build_graph, captured
from .conventions import EXECUTED
from .errors import NotFoundError
from .predict import steps
from .predict.attention import CoreOp, check_attention, core_ops, parts_under, saved
from .predict.collectives import CollectiveRow, collectives
from .predict.exact_sum import SumsBy, exact_sum
from .predict.model_formulas import ModelFormulas, model_formulas
from .predict.polynomial import Scaling
from .predict.reconcile import Reconciliation, TransformerSpec, reconcile
from .predict.steps import Step
from .predict.timing import Timing, timing
from .render import chrome_trace, flame, html, notebook
from .role import NO_MULTIPLY, ROLE_ORDER, Role


class Profile:
    """Counts of one profiled run (or of every forward inside a
    :func:`flopscope.profiler` block).

    Build it with :func:`flopscope.profile` or :class:`flopscope.profiler`, or from what
    :func:`flopscope.capture.capture` returns: ``Profile(result, role_rules=...)``.
    Units: MACs (``docs/conventions.md``). The class is the façade over one
    :class:`Capture`: it sums the records, finds their roles once
    (:mod:`flopscope.attribute`) and caches what the analyses of
    :mod:`flopscope.predict` and :mod:`flopscope.render` compute from its data; each
    query below is a sum over the records or a one-line call of one of those, so the
    queries people ask are in one place:

    - what was captured: :attr:`graph`, :attr:`records`, :attr:`mode`, :attr:`timed`,
      :attr:`output`, :attr:`facts`, :meth:`module_inputs`, :attr:`root_seconds`,
      :attr:`notes`;
    - MACs: :meth:`total`, :meth:`total_flops`, :meth:`by_phase`, :meth:`by_module`,
      :meth:`by_stack`, :meth:`by_op` (``by_operator``: fvcore's name),
      :meth:`by_module_and_op`, :meth:`op_calls`;
    - bytes: :meth:`total_bytes`, :meth:`bytes_by_module`, :meth:`bytes_by_role`;
    - roles: :meth:`by_role`, :meth:`by_block`, :meth:`role_of`,
      :meth:`role_assignments` (by fx node), :meth:`role_assignments_by_op` (by record,
      no graph built), :meth:`attention_core`;
    - closed forms and time: :meth:`reconcile`, :meth:`model_formulas`, :meth:`timing`;
    - several forwards and ranks: :meth:`steps`, :meth:`decode_scaling`,
      :meth:`collectives`;
    - what ``total()`` leaves out or bounds: :meth:`unsupported` (``unsupported_ops``:
      fvcore's name), :meth:`decomposed`, :meth:`unrouted`, :meth:`elementwise`,
      :meth:`elementwise_by_op`, :meth:`total_elementwise`, :meth:`uncalled_modules`,
      :meth:`module_calls`, :meth:`canonical_module_name`;
    - files and views: :meth:`export_chrome_trace`, :meth:`export_folded`,
      :meth:`export_speedscope`, :meth:`to_html`, the notebook's ``_repr_html_`` /
      ``_repr_markdown_``.

    What is not a query lives beside it: :func:`reuse_roles` (a sweep gives one length
    the roles of another).
    """

    def __init__(self, result: CaptureResult, role_rules: tuple[RoleRule, ...] = ()) -> None:
        capture, facts = result.capture, result.facts
        self._ops = capture.ops
        self._capture = capture
        self._graph: fx.Graph | None = None  # built on first use: totals need only the records
        self._facts = facts
        self._module_paths = list(facts.types)
        self._role_rules = role_rules
        # role_assignments(): on the fx graph's nodes
        self._roles: Mapping[fx.Node, Assignment] | None = None
        # the same on the records (no graph needed)
        self._op_roles: Mapping[CapturedOp, Assignment] | None = None
        self._records: tuple[OpRecord, ...] | None = None
        # attention_core(): on the fx graph, for the conventions
        self._core: tuple[CoreOp, ...] | None = None
        self._mode = result.mode
        self._output = result.output
        self._notes = tuple(result.notes)

    @cached_property
    def _tally(self) -> Tally:
        """The records summed once, on the first query that needs them (finding roles
        does not): :func:`~flopscope.attribute.tally.tally`."""
        return tally(self._ops, self._uncalled)

    # ---------------------------------------------------------------------------------------------
    # what was captured
    @property
    def graph(self) -> fx.Graph:
        """The captured ``torch.fx`` graph (one node per ATen op; see
        :mod:`flopscope.capture.recorder`), with ``node.meta["role"]`` /
        ``["role_parts"]`` / ``["block"]`` on every node that multiplies."""
        self.role_assignments()
        return self._fx_graph()

    def _fx_graph(self) -> fx.Graph:
        if self._graph is None:
            self._graph = build_graph(self._ops)
        return self._graph

    @property
    def records(self) -> tuple[OpRecord, ...]:
        """Every op with a multiply formula, in execution order, with its roles."""
        if self._records is None:
            self._records = op_records(self._fx_graph().nodes, self.role_assignments())
        return self._records

    @property
    def mode(self) -> str:
        """``"fake"`` or ``"real"``: how the counted run executed (``"auto"`` resolves
        to one of them)."""
        return self._mode

    @property
    def timed(self) -> bool:
        """Whether op wall times were recorded (a real-mode run): :meth:`timing` needs
        them."""
        return any(op.seconds is not None for op in self._ops)

    @property
    def output(self) -> Any:
        """What the forward returned (fake tensors in fake mode; ``None`` for
        :func:`flopscope.profiler`)."""
        return self._output

    @property
    def facts(self) -> ModelFacts:
        """What the model declares (module attributes, parameter shapes, config), read
        before it ran."""
        return self._facts

    def module_inputs(self) -> dict[ModuleCall, tuple[tuple[int | str, Shape], ...]]:
        """Per module call, the shapes of its tensor arguments (by position or keyword)."""
        return dict(self._capture.module_inputs)

    @property
    def root_seconds(self) -> Mapping[int, float]:
        """Wall time of each call of the root module (call number -> seconds); 0 in fake
        mode is meaningless, so read it in real mode."""
        return MappingProxyType(dict(self._capture.root_seconds))

    def steps(self, attention: str = EXECUTED) -> list[Step]:
        """One row per forward of the model (a generation step: prefill or decode), with
        its batch, new tokens, context, MACs by role (the attention core under
        ``attention``: :mod:`flopscope.predict.attention`), bytes and wall time (real
        mode; ``None`` in fake mode, where nothing ran)
        (:mod:`flopscope.generation`)."""
        return steps.steps(self._ops, self.role_assignments_by_op(), self._priced(attention),
                           self._capture.module_inputs,
                           self._capture.root_seconds if self._mode == "real" else {})

    def export_chrome_trace(self, path: str | Path, *, peak: float | None = None,
                            bandwidth: float | None = None) -> Path:
        """Write the profile as a trace-event JSON file (Perfetto,
        ``chrome://tracing``): one track per role and the module calls, MACs / FLOPs /
        bytes / role / module / shapes in every event (:mod:`flopscope.trace`). Real
        mode: measured times; fake mode: roofline times with ``peak`` and ``bandwidth``,
        else order only."""
        trace = chrome_trace.chrome_trace(self._ops, self.role_assignments_by_op(), self._mode,
                                          self.total(),
                                          peak=peak, bandwidth=bandwidth)
        return chrome_trace.export_chrome_trace(path, trace)

    def export_folded(self, path: str | Path) -> list[Path]:
        """Write Brendan Gregg's folded stacks (``flamegraph.pl``, inferno, speedscope
        read them): a line ``frame;frame;frame MACs`` per module call stack
        (:meth:`by_stack`), frames the module paths (the root is ``(model)``), weights
        the stack's self MACs as integers (FLOPs = 2 x MACs), so a frame's drawn width
        is its module's inclusive ``by_module()`` MACs. One phase: the file ``path``.
        Several (``backward=True``, activation checkpointing): one file per phase beside
        it, ``<stem>.<phase><suffix>`` (``out.folded`` -> ``out.forward.folded``,
        ``out.backward.folded``, ``out.recompute.folded``). Returns the paths written
        (:mod:`flopscope.render.flame`)."""
        return flame.export_folded(path, {phase: self.by_stack(phase) for phase in self.by_phase()})

    def export_speedscope(self, path: str | Path) -> Path:
        """Write the module call stacks as a speedscope file
        (https://www.speedscope.app: JSON, schema ``file-format-schema.json``): one
        ``"sampled"`` profile per phase, a sample per stack, its weight the stack's self
        MACs (unit ``"none"``; FLOPs = 2 x MACs), as :meth:`export_folded`
        (:mod:`flopscope.render.flame`)."""
        return flame.export_speedscope(path, {phase: self.by_stack(phase) for phase in self.by_phase()})

    def to_html(self, path: str | Path, *, scaling: Scaling | None = None,
                title: str | None = None) -> Path:
        """Write a self-contained HTML report (no network: inline SVG, CSS and script):
        an icicle chart of the module call tree sized by MACs and coloured by dominant
        role (hover for path, type, MACs, FLOPs, share, parameters, input shapes; click
        to zoom), the role table, the reconciliation with its reasons, the
        unsupported-op ledger, the generation steps of a profile of several forwards,
        and ``scaling``'s polynomials when given (:func:`flopscope.scaling`). See
        :mod:`flopscope.render.html`."""
        return html.write_html(self, path, scaling=scaling, title=title)

    def _repr_html_(self) -> str:
        """The notebook view (Jupyter): totals, the role table and a compact module tree
        (:mod:`flopscope.render.notebook`)."""
        return notebook.notebook_html(self)

    def _repr_markdown_(self) -> str:
        """The notebook view as Markdown: totals, the role table and a compact module
        tree."""
        return notebook.notebook_markdown(self)

    def collectives(self) -> list[CollectiveRow]:
        """Every collective this rank issued (all-reduce, all-gather, reduce-scatter,
        all-to-all, broadcast, send / recv), grouped by kind, group size, module,
        carried role and phase, with calls and message bytes
        (:mod:`flopscope.communication`)."""
        return collectives(self._ops, self.role_assignments_by_op())

    def decode_scaling(self, attention: str = EXECUTED) -> Scaling:
        """The decode steps' MACs per sequence, per role, as exact polynomials in the
        context length."""
        return steps.decode_scaling(self.steps(attention))

    @property
    def largest_tensor_bytes(self) -> int:
        """Bytes of the largest tensor an op of the model made in a fake run (0 in a
        real run, which does not track it): with the parameters, the least memory a real
        run of the same inputs needs (:mod:`flopscope.memory`)."""
        return self._capture.largest_tensor_bytes

    @property
    def notes(self) -> list[str]:
        """One line per thing worth knowing about the run (fall-back to real mode,
        decompositions, an attention kernel registered without its family)."""
        return [*self._notes, *self._capture.notes()]

    # ---------------------------------------------------------------------------------------------
    # totals
    def total(self, module: str = "", phase: str | None = None, attention: str = EXECUTED) -> int:
        """Multiply-accumulates (MACs) of linear-algebra work (matmul, conv, attention,
        recurrent GEMMs), of the whole run (``module=""``) or of one module, inclusive
        of its submodules; ``phase`` ("forward" / "backward") restricts a profile taken
        with ``backward=True``; ``attention`` ("executed", "causal" or "mask") prices
        the attention core by that convention (:mod:`flopscope.predict.attention`)."""
        if module != "":
            module = self.canonical_module_name(module)
        core = self._core_if(attention)
        # a container (never called): the core ops inside it by structure
        if module in self._uncalled and core:
            core = tuple(op for op in core if module in enclosing(op.module_stack, self._uncalled))
            module_of_core = ""
        else:
            module_of_core = module
        return sum(macs for _, macs, paths, ph in self._tally.counted
                   if (module == "" or module in paths) and (phase is None or ph == phase)
                   ) - saved(core, attention, module_of_core, phase)

    def total_flops(self, module: str = "", phase: str | None = None,
                    attention: str = EXECUTED) -> int:
        """Floating-point operations of the same work: ``2 * total(module)`` (1 MAC = 2
        FLOPs)."""
        return 2 * self.total(module, phase, attention)

    def by_phase(self) -> dict[str, int]:
        """MACs of the forward pass and (with ``backward=True``) of the backward pass."""
        out: Counter[str] = Counter()
        for _, macs, _, phase in self._tally.counted:
            out[phase] += macs
        return dict(out)

    def by_module(self, step: int | None = None) -> dict[str, int]:
        """MACs per module path, inclusive of submodules, for every module of the model
        (0 where none); ``by_module()[""] == total()``. A module called several times
        sums its calls; a container that is never called itself (a ``ModuleList`` of
        layers) sums what its submodules ran. ``step``: only the ops of that call of the
        root module (a :class:`Step`'s ``step``, 1 for the first)."""
        counted = ((macs, paths) for _, macs, paths, _ in self._tally.counted) if step is None else \
            ((op.macs, paths) for op, paths in self._step_ops(step) if op.cost is Cost.FORMULA)
        return self._by_path(counted)

    def _by_path(self, counts: Iterable[tuple[int, frozenset[str]]]) -> dict[str, int]:
        """Each count summed under every module path it has, for every module (0 where
        none; symbolic counts summed once per path: :class:`SumsBy`)."""
        sums: SumsBy[str] = SumsBy()
        for count, paths in counts:
            for path in paths:
                sums.add(path, count)
        return {**dict.fromkeys(self._module_paths, 0), **sums.totals()}

    def step_totals(self, step: int) -> tuple[int, int]:
        """MACs (as executed) and bytes moved of one call of the root module (a
        :class:`Step`'s ``step``, 1 for the first): ``by_module(step)[""]`` and
        ``bytes_by_module(step)[""]`` without the other modules' sums (each a symbolic
        expression in a trace with symbolic sizes)."""
        ops = [op for op, _ in self._step_ops(step)]
        return (exact_sum(op.macs for op in ops if op.cost is Cost.FORMULA), exact_sum(op.bytes for op in ops))

    def _step_ops(self, step: int) -> Iterator[tuple[CapturedOp, frozenset[str]]]:
        """The records of one call of the root module, each with its module paths."""
        for op in self._ops:
            stack = op.module_stack
            if stack and stack[0].path == "" and stack[0].call == step:
                yield op, enclosing((frame.path for frame in stack), self._uncalled)

    def by_stack(self, phase: str | None = None) -> dict[tuple[str, ...], int]:
        """Self MACs per module call stack: ``{(outermost module path, ..., innermost):
        MACs}`` of the ops run by the innermost module of that stack outside any
        submodule (the root ``""`` opens every stack), in the order the stacks first
        ran; ``phase`` restricts it to one phase. A module's inclusive MACs,
        ``by_module()[path]``, are the sum over the stacks that hold its path; the
        values sum to ``total(phase=phase)``. What flame graphs draw
        (:meth:`export_folded`, :meth:`export_speedscope`, :meth:`to_html`)."""
        out: dict[tuple[str, ...], int] = {}
        # id(module stack) -> its paths (the ops of a call share one)
        stack_of: dict[int, tuple[str, ...]] = {}
        for op in self._ops:
            if op.cost is not Cost.FORMULA or (phase is not None and op.phase != phase):
                continue
            stack = stack_of.get(id(op.module_stack))
            if stack is None:
                stack = stack_of[id(op.module_stack)] = tuple(frame.path for frame in op.module_stack) or ("",)
            out[stack] = out.get(stack, 0) + op.macs
        return out

    def by_op(self) -> dict[str, int]:
        """MACs per ATen op (``"aten.mm"``,
        ``"aten._scaled_dot_product_flash_attention_for_cpu"``)."""
        out: Counter[str] = Counter()
        for op, macs, _, _ in self._tally.counted:
            out[op] += macs
        return dict(out)

    by_operator = by_op  # fvcore's name

    def by_module_and_op(self) -> dict[str, dict[str, int]]:
        """``{module path: {op: MACs}}``, inclusive of submodules."""
        out: dict[str, Counter[str]] = defaultdict(Counter)
        for op, macs, paths, _ in self._tally.counted:
            for path in paths:
                out[path][op] += macs
        return {path: dict(out[path]) for path in self._module_paths if path in out}

    def op_calls(self) -> dict[str, int]:
        """How many times each counted op ran."""
        return dict(Counter(op for op, _, _, _ in self._tally.counted))

    # ---------------------------------------------------------------------------------------------
    # bytes moved (the memory side of the roofline; the model is flopscope.formulas.traffic's)
    def total_bytes(self, module: str = "", phase: str | None = None) -> int:
        """Minimum bytes read and written by every recorded op (multiplies or not:
        norms, softmax and copies move memory too), of the whole run or of one module
        inclusive of its submodules."""
        if module != "":
            module = self.canonical_module_name(module)
        return sum(size for size, paths, ph in self._tally.moved
                   if (module == "" or module in paths) and (phase is None or ph == phase))

    def bytes_by_module(self, step: int | None = None) -> dict[str, int]:
        """Bytes moved per module path, inclusive of submodules (0 where none);
        ``[""] == total_bytes()``. ``step``: only the ops of that call of the root
        module (as :meth:`by_module`)."""
        moved = ((size, paths) for size, paths, _ in self._tally.moved) if step is None else \
            ((op.bytes, paths) for op, paths in self._step_ops(step) if op.bytes)
        return self._by_path(moved)

    def weight_bytes(self, step: int) -> int:
        """Bytes of the parameters one call of the root module reads (:func:`steps.weight_bytes`): what a batch
        of requests in one step reads once."""
        return steps.weight_bytes(self._ops, step)

    def bytes_by_role(self, phase: str | None = None) -> dict[str, int]:
        """Bytes moved per role: an op that multiplies splits its bytes over its roles
        as it splits its MACs; the bytes of ops that do not multiply (elementwise work,
        norms, softmax, copies such as KV-cache updates) are under :data:`NO_MULTIPLY`.
        The values sum to ``total_bytes(phase=phase)``."""
        assignments = self.role_assignments_by_op()
        out: Counter[str] = Counter()
        for op in self._ops:
            if not op.bytes or (phase is not None and op.phase != phase):
                continue
            assignment = assignments.get(op)
            if assignment is None or not any(assignment.parts.values()):
                out[NO_MULTIPLY] += op.bytes
            else:
                out.update(scale_parts(assignment.parts, op.bytes))
        return {role: out[role] for role in (*ROLE_ORDER, NO_MULTIPLY) if role in out}

    # ---------------------------------------------------------------------------------------------
    # roles
    def by_role(self, phase: str | None = None, attention: str = EXECUTED) -> dict[str, int]:
        """MACs per semantic role (:class:`~flopscope.attribute.roles.Role` values as
        keys, in the canonical order); every multiply has exactly one role, so the
        values sum to ``total(phase=phase)``. Backward ops carry the role of the forward
        op they differentiate. ``attention``: the convention of the ``attn_scores`` /
        ``attn_weighted_sum`` rows (:mod:`flopscope.predict.attention`)."""
        out: Counter[str] = Counter()
        for op, parts in self._priced(attention).items():
            if phase is not None and op.phase != phase:
                continue
            for role, macs in parts.items():
                out[role] += macs
        return {role: out[role] for role in ROLE_ORDER if role in out}

    def by_block(self, attention: str = EXECUTED) -> dict[str, dict[str, int]]:
        """``{block path: {role: MACs}}`` per attention / FFN / conv block instance (the
        module path enclosing its multiplies); multiplies outside such blocks are listed
        under their own module. ``attention``: the convention of the attention core
        (:mod:`flopscope.predict.attention`)."""
        out: dict[str, Counter[str]] = defaultdict(Counter)
        assignments = self.role_assignments_by_op()
        for op, parts in self._priced(attention).items():
            for role, macs in parts.items():
                out[assignments[op].block or ""][role] += macs
        return {block: {r: roles[r] for r in ROLE_ORDER if r in roles} for block, roles in out.items()}

    def role_of(self, node: fx.Node | str) -> Role:
        """The role of a graph node (or node name): for a node split across roles, the
        one with most MACs."""
        assignments = self.role_assignments()
        found = node if isinstance(node, fx.Node) else next((n for n in self._fx_graph().nodes if n.name == node), None)
        if found is None:
            raise NotFoundError(f"no node named {node!r} in the captured graph (see prof.graph)")
        assignment = assignments.get(found)
        return Role(assignment.role) if assignment is not None else Role.OTHER

    def role_assignments(self) -> Mapping[fx.Node, Assignment]:
        """Read-only ``{node: Assignment}`` for every node of :attr:`graph` that
        multiplies (and every embedding lookup, with 0 MACs): its ``{role: MACs}`` split
        (read-only) and its block. Also stamps the nodes' ``role`` / ``role_parts`` /
        ``block`` meta keys."""
        if self._roles is None:
            node_of = {captured(node): node for node in self._fx_graph().nodes}
            roles: dict[fx.Node, Assignment] = {}
            # (in the order the passes claimed them)
            for op, assignment in self.role_assignments_by_op().items():
                node = node_of[op]
                node.meta.update(role_parts=dict(assignment.parts), role=assignment.role,
                                 block=assignment.block)
                roles[node] = assignment
            self._roles = MappingProxyType(roles)
        return self._roles

    def role_assignments_by_op(self) -> Mapping[CapturedOp, Assignment]:
        """:meth:`role_assignments` keyed by the capture's records
        (:class:`~flopscope.capture.records.CapturedOp`): what the role passes find on
        the records' dataflow, without building the fx graph."""
        if self._op_roles is None:
            self._op_roles = MappingProxyType(self._find_roles())
        return self._op_roles

    def _find_roles(self) -> dict[CapturedOp, Assignment]:
        """The role passes over the records, a replayed call's records taking the roles
        of those they copy (:func:`~flopscope.attribute.carried.roles_with_copies`), the
        collector paused (:func:`~flopscope.capture.paused_gc`: its full collections
        took 5-10 % of DeepSeek-V3's roles at 2,048 tokens); what they keep goes to the
        oldest generation after a fake count, as its records did."""
        with paused_gc(promote=self.mode == "fake"):
            return roles_with_copies(self._ops, self._capture.copies, self._facts.types,
                                     self._role_rules)

    def attention_core(self) -> tuple[CoreOp, ...]:
        """Every op of the attention core (scores, weighted sum; any phase) with its
        (query, key) pairs and the mask facts that price it under ``attention="causal"``
        / ``"mask"``, and where they come from (``source``):
        :mod:`flopscope.predict.attention`. Computed once."""
        if self._core is None:
            self._core = core_ops(self._ops, self.role_assignments_by_op(), self._facts)
        return self._core

    def _core_if(self, convention: str) -> tuple[CoreOp, ...]:
        """The attention core where ``convention`` reads it (not for executed work:
        totals need no graph)."""
        return () if check_attention(convention) == EXECUTED else self.attention_core()

    def _priced(self, convention: str) -> dict[CapturedOp, Mapping[str, int]]:
        """``{record: {role: MACs}}`` with the attention core under ``convention``."""
        return parts_under(self.role_assignments_by_op(), self._core_if(convention), convention)

    def reconcile(self, spec: TransformerSpec | None = None) -> Reconciliation:
        """Measured MACs per block and role against exact closed forms from the model's
        declared structure (or ``spec``), with the complexity term, useful work under
        masks, and the reason for any ratio that is not 1. See
        :mod:`flopscope.predict.reconcile`."""
        return reconcile(self.role_assignments_by_op(), self._facts, self._capture.module_inputs,
                         spec)

    def model_formulas(self, attention: str = EXECUTED) -> ModelFormulas:
        """Measured forward MACs per token against Kaplan, Chinchilla, Megatron-LM and
        PaLM, with the difference explained part by part (see
        :mod:`flopscope.predict.model_formulas`); the measured attention core under
        ``attention`` (:mod:`flopscope.predict.attention`)."""
        return model_formulas(self._facts, self.by_role(phase=FORWARD, attention=attention),
                              self._capture.module_inputs, attention)

    def timing(self) -> Timing:
        """Wall time per role and module of a real-mode run, with GFLOP/s and time share
        against MAC share (see :mod:`flopscope.predict.timing`)."""
        return timing(self._ops, self.role_assignments_by_op())

    # ---------------------------------------------------------------------------------------------
    # what is not in total()
    def unsupported(self) -> dict[str, int]:
        """``{op: calls}`` of ops with neither a formula, an elementwise rule, nor a
        place in the zero-cost list: they may do arithmetic that ``total()`` does not
        include. A real run also lists, per module path, the tensors computed outside
        the ATen dispatcher (NumPy, a C++ / CUDA extension filling memory itself:
        :mod:`flopscope.capture.undispatched`) as ``{"outside the ATen dispatcher:
        <module path>": tensors}``."""
        return {**self._capture.unsupported, **undispatched.unsupported_of(self._capture.outside)}

    unsupported_ops = unsupported  # fvcore's name

    def decomposed(self) -> dict[str, int]:
        """``{op: calls}`` of ops without a formula that were counted through
        ``op.decompose()``."""
        return dict(self._capture.decomposed)

    def unrouted(self) -> Mapping[CapturedOp, Fraction | None]:
        """``{record: share}`` (read-only): an expert-parallel rank's grouped matmuls
        counted with every route on fake tensors (an upper bound), each with the share of
        its layer's experts the rank holds (:mod:`flopscope.capture.expert_parallel`)."""
        return MappingProxyType(dict(self._capture.unrouted))

    def elementwise(self) -> dict[str, int]:
        """Elementwise ops (not MACs) per category: pointwise, softmax, norm, reduction,
        ..."""
        return dict(self._tally.elementwise)

    def elementwise_by_op(self) -> dict[str, int]:
        """Elementwise ops (not MACs) per ATen op."""
        return dict(self._tally.elementwise_by_op)

    def total_elementwise(self) -> int:
        """All elementwise ops (softmax, norms, activations, adds, ...); never part of
        ``total()``."""
        return sum(self.elementwise().values())

    def uncalled_modules(self) -> set[str]:
        """Module paths of the model that never ran (fvcore's name)."""
        return set(self._uncalled)

    @cached_property
    def _uncalled(self) -> frozenset[str]:
        """The module paths that never ran: a container among them (``ModuleList``) sums
        what its submodules ran (:func:`flopscope.attribute.paths.enclosing`)."""
        return frozenset(p for p in self._module_paths if p not in self._capture.module_calls)

    def module_calls(self) -> dict[str, int]:
        """How many times each module ran."""
        return dict(self._capture.module_calls)

    # ---------------------------------------------------------------------------------------------
    def __repr__(self) -> str:
        return (f"<{type(self).__name__} mode={self._mode} total={self.total():,} MACs "
                f"({self.total_flops():,} FLOPs), {len(self._tally.counted)} counted ops, "
                f"{sum(self._capture.unsupported.values())} unsupported calls>")

    def canonical_module_name(self, name: str) -> str:
        """The path under which the module called ``name`` is counted: ``name``, or for
        another name of a module registered in several places, its first name, the one
        ``named_modules()`` gives (fvcore's name for this query): every name of a shared
        module finds the same calls."""
        if name in self._facts.types:
            return name
        canonical = self._facts.aliases.get(name)
        if canonical is None:
            raise NotFoundError(f"no module with path {name!r} in the profiled model")
        return canonical


def reuse_roles(prof: Profile, template: Profile) -> bool:
    """Give ``prof`` the roles of ``template``, a profile of the same model at another
    input length, when both ran the same ops in the same order, apart from ops of no
    arithmetic (a slice that a symbolic size keeps and a known size drops): each op
    keeps its template's role fractions (a fused projection splits by columns,
    independent of length; a fused kernel's parts are its own). For sweeps
    (:func:`flopscope.scaling`) and symbolic traces. Returns False, changing nothing,
    when the op sequences differ or ``prof``'s roles are already known."""
    pairs = None if prof._op_roles is not None else aligned(prof._ops, template._ops)
    if pairs is None:
        return False
    roles = carried_roles(pairs, template.role_assignments_by_op())
    prof._op_roles = MappingProxyType(roles)
    return True
