"""Capture: record every ATen op a forward executes, with its costs, as
:class:`CapturedOp` records that become a ``torch.fx`` graph on demand.

:class:`Recorder` is a ``TorchDispatchMode``: it sees each op below autograd, after
Python-level composites (``linear``, ``matmul``, ``einsum``, ``@``,
``F.scaled_dot_product_attention``) have dispatched to what really runs. Each op becomes
one ``call_function`` node whose arguments are the nodes that produced its input tensors
(the dataflow), so later stages can follow Q, K and V through views, transposes and
splits. Parameters and buffers enter as ``get_attr`` nodes named by their qualified
names; forward inputs and other outside tensors as ``placeholder`` nodes.

The records, their fx graph and its ``node.meta`` keys are
:mod:`flopscope.capture.records`. Ops run only while a module of the profiled model is
on the stack are recorded. Units: see ``docs/conventions.md``.

Each dispatch goes through named stages (:meth:`Recorder.__torch_dispatch__`): route,
classify, execute, record, link. The package's other modules hold what the stages use:

- ``_route``: the dispatches a tensor subclass takes (DTensor, jagged tensors);
- ``_classify``: how each op is counted (:class:`OpClass`), once per overload;
- ``_dataflow``: the record of each tensor's value (``Dataflow``);
- ``_fake_kernels``: what fake kernels do not check, and outputs they refuse to make;
- ``_known_values``: the values a fake run knows (:class:`KnownValues`);
- ``_storage``: the writes to each storage and the version records they make;
- ``_autograd_link``: the forward op of each backward or recomputed op;
- ``_tallies``: what a run counts beside its records (:class:`Tallies`);
- ``_failures``: where an op failed, and the errors raised from inside one;
- ``_tensors``: the tensors in an op's arguments.
"""

from __future__ import annotations

import dataclasses
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from ...formulas import collectives, elementwise, traffic
from ...formulas import registry as formulas
from ...formulas.registry import FormulaRegistry, OpFamily, OpSpec, shape_of
from ..expert_parallel import unrouted_records
from ..fake import CountingFakeTensorMode, needs_real_data
from ..module_tracker import ModuleCall, ModuleTracker
from ..records import FORWARD, Capture, CapturedOp, Cost, LeafName, op_name
from ._autograd_link import AutogradLinks, phase_now
from ._classify import OpClass, class_of, packet
from ._dataflow import Dataflow
from ._failures import FakeTensorInRealRun, OpFailure, RefusedInput, failure_at
from ._fake_kernels import FAKE_SHAPE_RULES, MIXED_DTYPE_OPS, check_as_the_real_kernel
from ._known_values import (
    CONSTRUCTORS_FROM_DATA,
    INDEX_DTYPES,
    MAX_KNOWN_FLOAT_NUMEL,
    MAX_KNOWN_NUMEL,
    SCALAR_READS,
    UNINITIALISED,
    KnownValues,
    at_most,
    fake_run,
    from_known_data,
    small_index_value,
)
from ._route import in_shape_propagation, route_higher_order_ops, subclass_kind
from ._storage import StorageVersions, UnwrittenRead, Window
from ._tallies import Tallies, TallyAlias
from ._tensors import (
    Producers,
    WrittenArguments,
    any_requires_grad,
    first_shape,
    map_tensors,
    storage_of,
    tensors,
)

__all__ = [
    "CONSTRUCTORS_FROM_DATA", "FAKE_SHAPE_RULES", "INDEX_DTYPES", "MAX_KNOWN_FLOAT_NUMEL", "MAX_KNOWN_NUMEL",
    "MIXED_DTYPE_OPS", "UNINITIALISED", "FakeTensorInRealRun", "KnownValues", "OpFailure", "Recorder",
    "RefusedInput", "Tallies", "Window", "capture_of", "fake_run_of", "from_known_data", "storage_of",
]

_LIFT_FRESH = torch.ops.aten.lift_fresh.default
_ATTENTION_FAMILIES = (OpFamily.ATTENTION, OpFamily.FUSED_LAYER)
_TRACING_MODES = (torch._C._TorchDispatchModeKey.FAKE, torch._C._TorchDispatchModeKey.PROXY)
_RECORD = object()
"""What the route stage returns for an op the recorder goes on to record."""


class Recorder(TorchDispatchMode):
    """Records ops as :class:`CapturedOp` s while the tracker's model is running.

    Its parts, each with its own state: :attr:`tallies` (:class:`Tallies`),
    :attr:`known_values` (:class:`KnownValues`), :attr:`storage` (``StorageVersions``),
    :attr:`dataflow` (``Dataflow``) and :attr:`links` (``AutogradLinks``).

    Args:
        tracker: the module tracker of the profiled model (ops outside its modules are
            not recorded).
        registry: formulas and families.
        leaf_names: ``id(tensor)`` -> :class:`LeafName` for the tensors that enter the
            forward from outside (parameters, buffers, inputs); other outside tensors
            become ``placeholder`` constants.
        timed: record each op's wall time (real execution on the CPU: ops are
            synchronous).
        fake: running on fake tensors: :data:`FAKE_SHAPE_RULES` stand in for over-strict
            fake kernels.
        fake_mode: the fake-tensor mode of a fake run, for what the recorder makes from
            known values where that mode is not on the stack (a diffusion pipeline's own
            code runs outside it: :mod:`flopscope.pipeline`).
        device: the device of every tensor the run makes (``meta`` for a count on meta
            kernels): a constructor (``zeros``, ``randn``, ``arange``, ... ; a
            device-less one arrives here as ``device="cpu"``) makes it there, and a
            tensor made from data (``torch.tensor``) is moved there, so nothing is made
            for real (no memory, no draw from the CPU's random generator). One check per
            op, where a default-device context (``with torch.device("meta")``) would add
            a Python call to every torch function the model calls.
    """

    supports_higher_order_operators = True
    """Higher-order ops (FlexAttention, ``cond``, ...) come here too: those with a
    formula are counted, the others run as they are and are listed as unsupported (what
    they run inside is not seen)."""

    # the tallies under their earlier names (flopscope.capture.replay reads them here)
    unsupported: TallyAlias[Counter[str]] = TallyAlias("unsupported")
    decomposed: TallyAlias[Counter[str]] = TallyAlias("decomposed")
    upper_bounds: TallyAlias[Counter[str]] = TallyAlias("upper_bounds")
    undeclared_kernels: TallyAlias[set[str]] = TallyAlias("undeclared_kernels")
    unchecked_lookups: TallyAlias[int] = TallyAlias("unchecked_lookups")
    value_reads: TallyAlias[int] = TallyAlias("value_reads")
    largest_out: TallyAlias[int] = TallyAlias("largest_out")
    _late_parameters: TallyAlias[int] = TallyAlias("late_parameters")

    def __init__(self, tracker: ModuleTracker, registry: FormulaRegistry, leaf_names: Mapping[int, LeafName],
                 *, timed: bool = False, fake: bool = False, fake_mode: FakeTensorMode | None = None,
                 device: torch.device | None = None) -> None:
        super().__init__()
        if not hasattr(TorchDispatchMode, "supports_higher_order_operators"):
            route_higher_order_ops(Recorder)
        self.device = device
        self.ops: list[CapturedOp] = []
        self.tracker = tracker
        self.registry = registry
        self.leaf_names = dict(leaf_names)
        self.timed = timed
        self.fake = fake
        self.fake_mode = fake_mode
        self.tallies = Tallies()
        self.failure: OpFailure | None = None
        self.windows: list[Window] = []
        """Calls being watched for :mod:`flopscope.capture.replay` (innermost last)."""
        self.copies: dict[CapturedOp, CapturedOp] = {}
        """A replayed record -> the record it copies."""
        self.outside_work: list[Any] = []
        """What :mod:`flopscope.capture.undispatched` found (``OutsideWork``)."""
        # real mode (flopscope.capture.undispatched): told of each tensor made from data
        # (lift_fresh's output), of each outside tensor first met inside a module call
        # (a constant), and of each op that reads memory an `empty` made and no recorded
        # op wrote since: work done outside the dispatcher
        self.on_lift: Callable[[torch.Tensor], None] | None = None
        self.on_constant: Callable[[torch.Tensor], None] | None = None
        self.on_unwritten_read: UnwrittenRead | None = None
        producers: Producers = {}
        written = WrittenArguments()
        self.known_values = KnownValues(producers, written, self.tallies, fake_mode)
        self.storage = StorageVersions(self.ops, tracker, producers, self.windows, written, self.known_values)
        self.dataflow = Dataflow(producers, self.ops, self.leaf_names, self.storage, self.known_values, self.tallies)
        self.links = AutogradLinks(self.ops)
        self._backward = False
        """While the backward pass runs: record ops outside any module call."""
        self._inputs_need_grad = False
        """A tensor argument of the op just recorded requires grad."""
        self._classes: dict[int, OpClass] = {}
        """``id(op overload)`` -> how it is counted."""
        self._subclasses: dict[tuple[type, ...], str] = {}
        """The tensor types of a dispatch -> :func:`subclass_kind`."""
        self._own_kind = "fake" if fake else ""
        """The :func:`subclass_kind` of a dispatch the route stage lets through."""
        self._dtensor_seen = False
        self._suspended = 0
        """Inside a catalog kernel (:mod:`flopscope.capture.catalog`): ops run,
        unrecorded."""

    def add_leaf_names(self, leaf_names: Mapping[int, LeafName]) -> None:
        self.leaf_names.update(leaf_names)

    @contextmanager
    def watching(self) -> Iterator[Window]:
        """Watch the ops recorded inside the block (:class:`Window`): what they allocate
        and where they write."""
        window = Window(len(self.ops))
        self.windows.append(window)
        try:
            yield window
        finally:
            self.windows.remove(window)

    @contextmanager
    def backward_pass(self) -> Iterator[None]:
        """Record the ops of a backward pass run inside the block (attributed to their
        forward ops)."""
        self._backward = self.tracker.replaying = True
        try:
            yield
        finally:
            self._backward = self.tracker.replaying = False

    @contextmanager
    def suspended(self) -> Iterator[None]:
        """Ops dispatched in the block run unrecorded: the insides of a kernel that
        :meth:`record_kernel` records as one call."""
        self._suspended += 1
        try:
            yield
        finally:
            self._suspended -= 1

    @property
    def recording(self) -> bool:
        """Whether a kernel called now is the model's work to record: inside the model's
        module calls or in its backward pass, and not inside a catalog kernel (whose
        record covers it)."""
        return not self._suspended and (bool(self.tracker.stack) or self._backward)

    # the dispatch, in stages ----------------------------------------------------------
    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        """One op, in five stages.

        1. route (:meth:`_route`): a tensor subclass may take the op, or it is not the
           run's work;
        2. classify: how the op counts (:class:`OpClass`), from the cache or
           :func:`class_of`; on :attr:`device`, placed there (:meth:`_placed`);
        3. execute (:meth:`_execute`): run it, checked as the real kernel would check
           it;
        4. record (:meth:`_record`): its record, its inputs' records and its costs;
        5. link (``links.link``): its forward op, or its autograd node.

        Metadata ops and ops outside the model run unrecorded after stage 2. An op
        without a formula or a rule may run as its decomposition instead
        (:meth:`_decomposed`).
        """
        kwargs = kwargs or {}
        # a catalog kernel's insides: its own record covers them
        if self._suspended:
            return func(*args, **kwargs)
        # a list for a higher-order op
        types = tuple(types)
        # the run's own tensors, with no DTensor seen: nothing to route (the hot path)
        if self._subclasses.get(types) != self._own_kind or self._dtensor_seen:
            routed = self._route(func, types, args, kwargs)
            if routed is not _RECORD:
                return routed
        op_class = self._classes.get(id(func))
        if op_class is None:
            op_class = class_of(self._classes, func, self.registry)
        if self.device is not None:
            args, kwargs = self._placed(func, args, kwargs, op_class)
        if op_class.passed:
            return func(*args, **kwargs)
        stack = self.tracker.stack
        forward_op = None
        recompute = self._backward and torch.is_grad_enabled()
        if self._backward and not stack:
            forward_op = self.links.forward_op()
            stack = forward_op.module_stack if forward_op is not None else ()
        elif not stack:
            return self._outside_the_model(func, args, kwargs)
        if op_class.decompose:
            decomposed = self._decomposed(func, args, kwargs)
            if decomposed is not NotImplemented:
                return decomposed
            op_class = self._classes[id(func)]
        start = time.perf_counter()
        out = self._execute(func, args, kwargs, stack, op_class)
        seconds = time.perf_counter() - start
        op = self._record(func, args, kwargs, out, stack, op_class)
        if self.on_lift is not None and func is _LIFT_FRESH:
            self.on_lift(out)
        if self.timed:
            op.seconds, op.started = seconds, start
        # a forward without grad has nothing to link (the hot path)
        if self._backward or self._inputs_need_grad or self.links.deferred is not None:
            self.links.link(op, func, forward_op, recompute, self._backward, self._inputs_need_grad)
        return out

    def _route(self, func: Any, types: tuple[type, ...], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The route stage: :data:`_RECORD` for an op to record, else what the dispatch
        returns. A DTensor or a jagged tensor runs its ops on its local tensors
        (``NotImplemented``: those are recorded); DTensor's shape propagation and a
        caller's fake tensors in a real run are not the run's work."""
        kind = self._subclasses.get(types)
        if kind is None:
            kind = self._subclasses[types] = subclass_kind(types)
        if kind == "dtensor":
            # DTensor runs its own ops on its local shards (and its collectives): those
            # count. Its autograd node was made for this op: the local op of the same
            # overload that follows is the one it differentiates.
            self._dtensor_seen = True
            if torch.is_grad_enabled() and not self._backward and any_requires_grad((args, kwargs)):
                self.links.defer(func)
            return NotImplemented
        if kind == "jagged":
            # a jagged nested tensor runs its ops on its packed values (and offsets):
            # those count, at Σ nᵢ tokens
            return NotImplemented
        if self._dtensor_seen and in_shape_propagation():
            # DTensor working out output shapes on fake tensors: not this rank's work
            return func(*args, **kwargs)
        if kind == "fake" and not self.fake:
            # raises inside the model
            self._met_fake_tensor(func, args, kwargs)
            return func(*args, **kwargs)
        return _RECORD

    def _placed(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], op_class: OpClass
                ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``args`` and ``kwargs`` that make the op's output on :attr:`device`."""
        if op_class.constructor and kwargs.get("device") != self.device:
            return args, {**kwargs, "device": self.device}
        # torch.tensor(data): made on the CPU first
        if func is _LIFT_FRESH and args[0].device != self.device:
            return (args[0].to(self.device),), kwargs
        return args, kwargs

    def _outside_the_model(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run an op outside the model's module calls, unrecorded. The caller's code,
        between the model's calls in a block, may write a tensor whose values are known,
        such as a buffer: known after the write, or forgotten."""
        out = func(*args, **kwargs)
        known = self.known_values
        if self.fake and (known.leaf_values or known.by_record) and isinstance(func, torch._ops.OpOverload):
            known.writes(func, args, kwargs)
        return out

    def _decomposed(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """An op without a formula or a rule run as its decomposition (whose ops are
        recorded), or ``NotImplemented`` where it has none: it is not tried again."""
        with self:
            decomposed = func.decompose(*args, **kwargs)
        if decomposed is not NotImplemented:
            self.tallies.decomposed[op_name(func)] += 1
            return decomposed
        self._classes[id(func)] = dataclasses.replace(self._classes[id(func)], decompose=False)
        return NotImplemented

    def _met_fake_tensor(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A real run met a fake tensor inside the model (or its backward pass): it
        cannot be counted, and what it returns would be fake too. Raises
        :class:`FakeTensorInRealRun` naming the op, the module and the shapes (ops
        outside the model's modules are the caller's, not counted: passed)."""
        stack = self.tracker.stack
        if not stack and not self._backward:
            return
        if any(torch._C._get_dispatch_mode(key) is not None for key in _TRACING_MODES):
            # torch tracing a graph on its own fake tensors (FlexAttention's backward on
            # torch 2.9)
            return
        where = failure_at(func, stack, args, kwargs)
        if self.failure is None:
            self.failure = where
        fakes = [t for t in tensors((args, kwargs)) if isinstance(t, FakeTensor)]
        raise FakeTensorInRealRun(where, ours=any(isinstance(t.fake_mode, CountingFakeTensorMode) for t in fakes))

    def _execute(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], stack: tuple[ModuleCall, ...],
                 op_class: OpClass) -> Any:
        """The execute stage: run the op; remember where the first failure happened (for
        the error the user sees). On fake tensors, first check what the real kernel
        would check and fake kernels do not."""
        try:
            if self.fake and op_class.checked:
                check_as_the_real_kernel(func, args, op_class.spec, self.known_values)
            # .item() / .tolist() / int(t) of a tensor with known values
            if self.fake and func in SCALAR_READS:
                self.tallies.value_reads += 1
                value = self.known_values.value_of(args[0])
                if value is not None and value.numel() == 1:
                    # real values: no fake mode below may take them
                    with _disable_current_modes():
                        return value.item()
            return func(*args, **kwargs)
        # any kernel's error: noted here, re-raised unless a fake-shape rule stands in
        except Exception as error:
            if self.fake and needs_real_data(error) is not None and isinstance(func, torch._ops.OpOverload):
                known_out = self.known_values.propagate(func, args, kwargs, op_class.cost)
                # its data was known: the output the values make
                if isinstance(known_out, torch.Tensor):
                    self.tallies.value_reads += 1
                    return self.known_values.stand_in(known_out)
            maker = FAKE_SHAPE_RULES.get(packet(func)) if self.fake else None
            if maker is None:
                if self.failure is None:
                    self.failure = failure_at(func, stack, args, kwargs)
                raise
            # a fake kernel stricter than the real one: make the output here
            return maker(*args, **kwargs)

    def _record(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                stack: tuple[ModuleCall, ...], op_class: OpClass) -> CapturedOp:
        """The record stage: a record of the op, its inputs the records of its tensor
        arguments' values, its outputs' values where they are known, then its costs."""
        shapes: list[tuple[int, ...]] = []
        inputs: list[torch.Tensor] = []
        record_of, backward, on_constant = self.dataflow.record_of, self._backward, self.on_constant

        def to_op(t: torch.Tensor) -> CapturedOp:
            shapes.append(shape_of(t))
            inputs.append(t)
            return record_of(t, backward, on_constant)

        phase = FORWARD if not backward else phase_now(backward)
        op = CapturedOp("call_function", func, map_tensors(args, to_op), map_tensors(kwargs, to_op) if kwargs else {},
                        op_class.name, phase, stack, cost=op_class.cost, spec=op_class.spec)
        op.input_shapes = tuple(shapes)
        self._inputs_need_grad = torch.is_grad_enabled() and any(t.requires_grad for t in inputs)
        storage = self.storage
        storage.made_at[id(op)] = len(self.ops)
        self.ops.append(op)
        if self.on_unwritten_read is not None:
            storage.watch_unwritten(func, args, kwargs, inputs, out, stack, self.on_unwritten_read)
        storage.note_writes(func, args, kwargs, op)
        if isinstance(out, torch.Tensor):
            op.output_shapes, op.dtype = (shape_of(out),), out.dtype
            if out.dtype in INDEX_DTYPES:
                op.value = small_index_value(out)
                # a higher-order op has no schema to read
                if (self.fake and op.value is None and at_most(out, MAX_KNOWN_NUMEL)
                        and isinstance(func, torch._ops.OpOverload)):
                    self._learn_output(op, func, args, kwargs, op_class)
            elif (self.fake and out.is_floating_point() and at_most(out, MAX_KNOWN_FLOAT_NUMEL)
                    and isinstance(func, torch._ops.OpOverload)):
                # arange(t) * interval, then .long()
                self._learn_output(op, func, args, kwargs, op_class)
            self.dataflow.producers[id(out)] = (weakref.ref(out), op)
        else:
            values = self.known_values.of_outputs(func, args, kwargs, out, op_class.cost) if self.fake else None
            self.dataflow.record_getters(op, out, stack, values)
        results = [out] if isinstance(out, torch.Tensor) else tensors(out)
        # a view (such as a weight's transpose) allocates nothing
        if self.windows and not getattr(func, "is_view", False):
            for window in self.windows:
                window.storages.update(storage_of(t) for t in results)
        tallies = self.tallies
        # the least memory a real run would need
        if self.fake and not getattr(func, "is_view", False):
            for t in results:
                # a symbolic size (symbolic trace) is not compared: no guard
                size = traffic.nbytes(t)
                if isinstance(size, int) and size > tallies.largest_out:
                    tallies.largest_out = size
        # its costs: bytes moved, a collective's message, multiplies (by formula) or
        # elementwise work (by rule)
        op.bytes = traffic.bytes_moved(op_class.access, inputs, results)
        if op_class.collective is not None:
            op.collective = (op_class.collective, collectives.message_bytes(func, args, kwargs, results),
                             collectives.group_size(args, kwargs))
        if op_class.spec is not None:
            macs = formulas.count(op_class.spec.formula, args, kwargs, first_shape(out),
                                  values=self.known_values.read_value, target=func)
            if isinstance(macs, formulas.UpperBound):
                tallies.upper_bounds[op_name(func)] += 1
            op.macs = formulas.total_of(macs)
            op.parts = dict(macs) if isinstance(macs, Mapping) else None
            if op.parts and "attn_scores" in op.parts and op_class.spec.family not in _ATTENTION_FAMILIES:
                tallies.undeclared_kernels.add(op_name(func))
        elif op_class.rule is not None:
            op.elementwise = (op_class.rule.category, elementwise.elementwise_ops(op_class.rule, args, out))
        elif op_class.cost is Cost.UNSUPPORTED:
            tallies.unsupported[op_name(func)] += 1
        return op

    def _learn_output(self, op: CapturedOp, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                      op_class: OpClass) -> None:
        """On fake tensors: the values of ``op``'s output, where they follow from known
        values."""
        value = self.known_values.propagate(func, args, kwargs, op_class.cost)
        if isinstance(value, torch.Tensor):
            self.known_values.by_record[id(op)] = value

    # kernels outside the dispatcher ---------------------------------------------------
    def record_kernel(self, target: Any, spec: OpSpec | None, args: tuple[Any, ...], out: Any,
                      differentiated: bool = False, *, module: str | None = None, phase: str | None = None,
                      forward: CapturedOp | None = None, writes: Sequence[torch.Tensor] = ()) -> CapturedOp | None:
        """One record for a call of a kernel that runs outside the dispatcher
        (:mod:`flopscope.capture.catalog`): ``target`` names it, ``args`` are its
        arguments (tensors among them, as ``spec``'s formula takes them), ``out`` what
        it returned (its tensors get this record as their producer); ``differentiated``:
        a forward whose ``autograd.Function`` node will run a backward (its backward's
        record belongs to this one); ``module``: the path of the module whose work it
        is, when that module was not called (a new call of it is made); ``phase`` and
        ``forward``: a record of another phase than the run's (gradients a forward call
        computes are the backward's, of ``forward``); ``writes``: tensors it wrote in
        place (a Triton kernel's output buffers: what reads them reads this record's
        work). ``spec=None``: a kernel without a formula, listed by :attr:`unsupported`
        under its name. ``None`` outside the model's module calls."""
        stack, forward_op = self.tracker.stack, None
        if self._backward and not stack:
            forward_op = self.links.forward_op()
            stack = forward_op.module_stack if forward_op is not None else ()
        elif not stack:
            return None
        if forward is not None:
            # the gradients of a forward record: in its module call
            stack = forward.module_stack
        elif module is not None and stack[-1].path != module and not self._backward:
            stack = self.tracker.call_of(module, stack)
        name = str(target).rpartition(".")[2]
        op_class = OpClass(Cost.FORMULA, spec=spec, name=name) if spec is not None else OpClass(Cost.UNSUPPORTED,
                                                                                                name=name)
        op = self._record(target, args, {}, out, stack, op_class)
        for t in writes:
            self.storage.wrote(t, op)
        if phase is not None:
            op.phase, op.forward = phase, forward
        elif self._backward:
            op.forward = forward_op
        elif differentiated:
            # the Function's node, made before its forward ran
            self.links.differentiated(op)
        return op

    # the dataflow and what the run knows of values ------------------------------------
    def made_by(self, t: torch.Tensor) -> CapturedOp | None:
        """The record of the op that made ``t`` (or of ``t`` as a leaf), if the run has
        seen ``t``."""
        return self.dataflow.made_by(t)

    def record_of(self, t: torch.Tensor) -> CapturedOp:
        """The record of ``t``'s value now (:meth:`Dataflow.record_of`)."""
        return self.dataflow.record_of(t, self._backward, self.on_constant)

    def set_producer(self, t: torch.Tensor, op: CapturedOp) -> None:
        """``op`` is the record of ``t``'s value (:meth:`Dataflow.set_producer`)."""
        self.dataflow.set_producer(t, op)

    def add_records(self, ops: Sequence[CapturedOp]) -> None:
        """Append ``ops``, records made outside :meth:`__torch_dispatch__`
        (:mod:`flopscope.capture.replay`)."""
        self.ops.extend(ops)

    def leaves_alive(self, ops: Sequence[CapturedOp]) -> set[int]:
        """``id(record)`` of the leaves among ``ops`` whose tensors are alive
        (:meth:`Dataflow.leaves_alive`)."""
        return self.dataflow.leaves_alive(ops)

    def known_storage(self, t: torch.Tensor) -> bool:
        """Whether ``t`` shares its storage with a tensor the run has seen
        (:meth:`Dataflow.known_storage`)."""
        return self.dataflow.known_storage(t)

    def unwritten_allocation(self, t: torch.Tensor) -> bool:
        """Whether ``t`` (or what it views) was made by an allocation of uninitialised
        memory that no recorded op has written since
        (:meth:`StorageVersions.unwritten_allocation`)."""
        return self.storage.unwritten_allocation(t)

    def value_of(self, t: torch.Tensor) -> torch.Tensor | None:
        """The known values of an index tensor (an input's real values, or what
        propagated to it)."""
        return self.known_values.value_of(t)

    def values_known(self, t: torch.Tensor) -> bool:
        """Whether the run knows ``t``'s values (:meth:`Dataflow.values_known`)."""
        return self.dataflow.values_known(t)


def fake_run_of(recorder: Recorder) -> AbstractContextManager[None]:
    """This thread runs ``recorder``'s fake run: :func:`from_known_data` may answer from
    its known values."""
    return fake_run(recorder.known_values)


def capture_of(recorder: Recorder, tracker: ModuleTracker) -> Capture:
    """What ``recorder`` and ``tracker`` hold at the end of a run."""
    tallies = recorder.tallies
    return Capture(recorder.ops, dict(tallies.unsupported), tuple(sorted(tallies.undeclared_kernels)),
                   tallies.unchecked_lookups, dict(tallies.decomposed), dict(tracker.inputs), dict(tracker.calls),
                   dict(tracker.root_seconds), dict(tallies.upper_bounds), tuple(recorder.outside_work),
                   tallies.largest_out, dict(recorder.copies),
                   unrouted_records(recorder.ops, tracker.roots, recorder.known_values.of_record))
