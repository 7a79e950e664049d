"""Capture: record every ATen op a forward executes, with its costs, as :class:`CapturedOp` records
that become a ``torch.fx`` graph on demand.

:class:`Recorder` is a ``TorchDispatchMode``: it sees each op below autograd, after Python-level
composites (``linear``, ``matmul``, ``einsum``, ``@``, ``F.scaled_dot_product_attention``) have
dispatched to what really runs. Each op becomes one ``call_function`` node whose arguments are the
nodes that produced its input tensors (the dataflow), so later stages can follow Q, K and V through
views, transposes and splits. Parameters and buffers enter as ``get_attr`` nodes named by their
qualified names; forward inputs and other outside tensors as ``placeholder`` nodes.

The records, their fx graph and its ``node.meta`` keys are :mod:`flopscope.capture.records`. Ops run only while
a module of the profiled model is on the stack are recorded. Units: see ``docs/conventions.md``.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import sys
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from ...formulas import collectives, elementwise, traffic
from ...formulas import registry as formulas
from ...formulas.elementwise import EMBEDDING_LOOKUPS, ElementwiseRule
from ...formulas.registry import FormulaRegistry, OpFamily, OpSpec, shape_of
from ..fake import CountingFakeTensorMode, loaded_dtensor, needs_real_data
from ..module_tracker import ModuleCall, ModuleTracker
from ..records import (
    BACKWARD,
    FORWARD,
    RECOMPUTE,
    Capture,
    CapturedOp,
    Cost,
    LeafKind,
    LeafName,
    Shape,
    after_write,
    op_name,
)
from ..unread import unread_tensors


class RefusedInput(RuntimeError):  # noqa: N818  (a kernel's refusal, raised as the kernel would)
    """What a real kernel would refuse, found on fake tensors (whose kernels check shapes only): operands of
    different dtypes, an index out of its table's range. Raised from inside the op, like the real error."""


class FakeTensorInRealRun(RuntimeError):  # noqa: N818  (raised from inside the op, as a kernel's error)
    """A real run met a fake tensor: ``where`` the op, module and shapes; ``ours``: a fake tensor made by one of
    flopscope's fake runs (a cache of the model's code kept it), else one the caller made."""

    def __init__(self, where: OpFailure, ours: bool) -> None:
        super().__init__(f"{where.describe()} got a fake tensor in a real run")
        self.where, self.ours = where, ours


@dataclass(frozen=True, slots=True)
class OpFailure:
    """Where an op raised: the op, the innermost module path and the shapes of its tensor inputs."""

    op: str
    module: str
    input_shapes: tuple[Shape, ...]

    def describe(self) -> str:
        shapes = ", ".join(str(list(s)) for s in self.input_shapes) or "no tensor inputs"
        return f"op {self.op} in module '{self.module}' with input shapes {shapes}"


@dataclass(frozen=True, slots=True)
class _OpClass:
    """How one op overload is counted (classified once per recorder)."""

    cost: Cost
    spec: OpSpec | None = None
    rule: ElementwiseRule | None = None
    decompose: bool = False  # no formula and no rule: try ``func.decompose()`` first
    collective: str | None = None  # the kind of collective (Cost.COMMUNICATION)
    name: str = "op"  # the packet's name, the stem of its nodes' names
    passed: bool = False  # a metadata query or a callable that is no op: run, not recorded
    access: str = traffic.ANY  # how it touches its tensors (traffic.access_of)
    checked: bool = False  # fake tensors: checked as the real kernel would (operand dtypes, lookup indices)
    constructor: bool = False  # makes a tensor from no tensor, on the device its ``device`` argument names


_OP_TYPES = (torch._ops.OpOverload, torch._ops.HigherOrderOperator)


@dataclass(eq=False)
class Window:
    """A call being watched (:meth:`Recorder.watching`): its records start at ``start`` in :attr:`Recorder.ops`;
    ``storages``: the storages the ops recorded since allocated (views excluded); ``outside_writes``: writes since to
    a storage not among them (an input's, a parameter's, a cache's made before the call)."""

    start: int
    storages: set[int] = dataclasses.field(default_factory=set)
    outside_writes: int = 0

    def allocated(self, t: torch.Tensor) -> bool:
        """Whether ``t``'s storage was allocated by an op recorded in the window."""
        return storage_of(t) in self.storages


def _classify(func: Any, registry: FormulaRegistry) -> _OpClass:
    if func in elementwise.METADATA_OPS or not isinstance(func, _OP_TYPES):
        return _PASSED
    found = _classify_op(func, registry)
    return dataclasses.replace(found, name=getattr(_packet(func), "__name__", "op"), access=traffic.access_of(func),
                               checked=found.spec is not None or _packet(func) in EMBEDDING_LOOKUPS,
                               constructor=_is_constructor(func))


def _is_constructor(func: Any) -> bool:
    """An op with a ``device`` argument and no tensor argument (``zeros``, ``randn``, ``arange``, ``full``, ...)."""
    arguments = getattr(getattr(func, "_schema", None), "arguments", ())
    return any(a.name == "device" for a in arguments) and not any("Tensor" in str(a.type) for a in arguments)


def _classify_op(func: Any, registry: FormulaRegistry) -> _OpClass:
    spec = registry.spec(func)
    if spec is not None:
        return _OpClass(Cost.FORMULA, spec=spec)
    if isinstance(func, torch._ops.HigherOrderOperator):  # without a formula: run as it is, listed as unsupported
        return _UNSUPPORTED
    kind = collectives.kind_of(func)
    if kind is not None:
        return _OpClass(Cost.COMMUNICATION, collective=kind)
    if elementwise.is_zero_cost(func) or collectives.is_bookkeeping(func):
        return _OpClass(Cost.ZERO)
    rule = elementwise.rule_for(func)
    if rule is not None:
        return _OpClass(Cost.ELEMENTWISE, rule=rule)
    return _OpClass(Cost.UNSUPPORTED, decompose=True)


_UNSUPPORTED = _OpClass(Cost.UNSUPPORTED)
_LIFT_FRESH = torch.ops.aten.lift_fresh.default
_SCALAR_READS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default)
"""Reads of a one-element tensor's value into Python (``.item()``, ``.tolist()``, ``int(t)``): on fake tensors they are
answered from the values the recorder knows (an integer input's, and what is computed from known values)."""
_PASSED = _OpClass(Cost.ZERO, passed=True)
_TRACING_MODES = (torch._C._TorchDispatchModeKey.FAKE, torch._C._TorchDispatchModeKey.PROXY)
_ATTENTION_FAMILIES = (OpFamily.ATTENTION, OpFamily.FUSED_LAYER)


class Recorder(TorchDispatchMode):
    """Records ops as :class:`CapturedOp` s while the tracker's model is running.

    Args:
        tracker: the module tracker of the profiled model (ops outside its modules are not recorded).
        registry: formulas and families.
        leaf_names: ``id(tensor)`` -> :class:`LeafName` for the tensors that enter the forward from outside
            (parameters, buffers, inputs); other outside tensors become ``placeholder`` constants.
        timed: record each op's wall time (real execution on the CPU: ops are synchronous).
        fake: running on fake tensors: :data:`FAKE_SHAPE_RULES` stand in for over-strict fake kernels.
        fake_mode: the fake-tensor mode of a fake run, for what the recorder makes from known values where that mode
            is not on the stack (a diffusion pipeline's own code runs outside it: :mod:`flopscope.pipeline`).
        device: the device of every tensor the run makes (``meta`` for a count on meta kernels): a constructor
            (``zeros``, ``randn``, ``arange``, ... ; a device-less one arrives here as ``device="cpu"``) makes it
            there, and a tensor made from data (``torch.tensor``) is moved there, so nothing is made for real (no
            memory, no draw from the CPU's random generator). One check per op, where a default-device context
            (``with torch.device("meta")``) would add a Python call to every torch function the model calls.
    """

    supports_higher_order_operators = True
    """Higher-order ops (FlexAttention, ``cond``, ...) come here too: those with a formula are counted, the others
    run as they are and are listed as unsupported (what they run inside is not seen)."""

    def __init__(self, tracker: ModuleTracker, registry: FormulaRegistry, leaf_names: Mapping[int, LeafName],
                 *, timed: bool = False, fake: bool = False, fake_mode: FakeTensorMode | None = None,
                 device: torch.device | None = None) -> None:
        super().__init__()
        if not hasattr(TorchDispatchMode, "supports_higher_order_operators"):
            _route_higher_order_ops()
        self.device = device
        self.ops: list[CapturedOp] = []
        self.tracker = tracker
        self.registry = registry
        self.leaf_names = dict(leaf_names)
        self.timed = timed
        self.fake = fake
        self.fake_mode = fake_mode
        self.unsupported: Counter[str] = Counter()
        self.decomposed: Counter[str] = Counter()
        self.failure: OpFailure | None = None
        self.undeclared_kernels: set[str] = set()  # formulas returning attention parts without the family
        self.unchecked_lookups = 0  # fake mode: embedding lookups whose index values were not known
        self.upper_bounds: Counter[str] = Counter()  # ops counted as upper bounds (their data was not known)
        self.largest_out = 0  # bytes of the largest tensor a recorded op made: a real run's peak is at least this
        self.leaf_values: dict[int, torch.Tensor] = {}  # id(fake tensor) -> the values it stands for
        self._known: dict[int, torch.Tensor] = {}  # id(captured op) -> values propagated to its output
        self._stale: set[int] = set()  # id(captured op) whose output's storage was written since: values unknown
        self._written: dict[Any, tuple[str | int, ...]] = {}  # op -> positions / names of the arguments it writes
        self._last_write: dict[int, tuple[int, CapturedOp]] = {}  # storage -> (position in ops, the latest write)
        self._made_at: dict[int, int] = {}  # id(record) -> its position in ops when its tensor was made
        self._versions: dict[tuple[int, int], CapturedOp] = {}  # (id(producer), id(write)) -> version record
        self._backward = False  # while the backward pass runs: record ops outside any module call
        self._producers: dict[int, tuple[weakref.ref[torch.Tensor], CapturedOp]] = {}
        self._leaf_tensors: dict[int, list[weakref.ref[torch.Tensor]]] = {}  # id(leaf record) -> the tensors it was
        # made the record of (leaves_alive: a look-up per leaf, not a scan of every tensor the run has seen)
        self._by_sequence_nr: dict[int, CapturedOp] = {}  # autograd sequence number -> forward op
        self._dtensor_seen = False
        self._late_parameters = 0  # parameters first seen during the run (not in leaf_names)
        self._deferred: tuple[Any, int] | None = None  # a DTensor op left to DTensor: (op, autograd sequence nr)
        self._twins: dict[tuple[Any, ...], list[CapturedOp]] | None = None  # recompute key -> forward ops
        self._replayed: Counter[tuple[Any, ...]] = Counter()  # recompute key -> recompute ops matched so far
        self._classes: dict[int, _OpClass] = {}  # id(op overload) -> how it is counted
        self._subclasses: dict[tuple[type, ...], str] = {}  # the tensor types of a dispatch -> _subclass_kind
        self._inputs_need_grad = False  # a tensor argument of the op just recorded requires grad
        # real mode (flopscope.capture.undispatched): told of each tensor made from data (lift_fresh's output)
        # and of each outside tensor first met inside a module call (a constant): work done outside the dispatcher
        self.on_lift: Callable[[torch.Tensor], None] | None = None
        self.on_constant: Callable[[torch.Tensor], None] | None = None
        # ... and of each op that reads memory an `empty` made and no recorded op wrote since: (the tensor read, the
        # module call that allocated it, the module call of the op reading it, the op)
        self.on_unwritten_read: Callable[[torch.Tensor, ModuleCall, ModuleCall, Any], None] | None = None
        self._unwritten: dict[int, ModuleCall] = {}  # storage of an `empty` no recorded op wrote yet -> its call
        self.outside_work: list[Any] = []  # what flopscope.capture.undispatched found (OutsideWork)
        # fake mode: values of tensors read where they decide what runs or what it costs (a scalar read, an output
        # made from known values, a formula or an index check reading them): flopscope.capture.replay refuses a
        # call that read any
        self.value_reads = 0
        self.windows: list[Window] = []  # calls being watched for flopscope.capture.replay (innermost last)
        self._suspended = 0  # inside a catalog kernel (flopscope.capture.catalog): ops run, unrecorded
        self.copies: dict[CapturedOp, CapturedOp] = {}  # a replayed record -> the record it copies

    def add_leaf_names(self, leaf_names: Mapping[int, LeafName]) -> None:
        self.leaf_names.update(leaf_names)

    @contextmanager
    def watching(self) -> Iterator[Window]:
        """Watch the ops recorded inside the block (:class:`Window`): what they allocate and where they write."""
        window = Window(len(self.ops))
        self.windows.append(window)
        try:
            yield window
        finally:
            self.windows.remove(window)

    @contextmanager
    def backward_pass(self) -> Iterator[None]:
        """Record the ops of a backward pass run inside the block (attributed to their forward ops)."""
        self._backward = self.tracker.replaying = True
        try:
            yield
        finally:
            self._backward = self.tracker.replaying = False

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if self._suspended:  # (a catalog kernel's insides: its own record covers them)
            return func(*args, **kwargs)
        types = tuple(types)  # (a list for a higher-order op)
        kind = self._subclasses.get(types)
        if kind is None:
            kind = self._subclasses[types] = _subclass_kind(types)
        if kind == "dtensor":
            # DTensor runs its own ops on its local shards (and its collectives): those count. Its autograd node
            # was made for this op: the local op of the same overload that follows is the one it differentiates.
            self._dtensor_seen = True
            if torch.is_grad_enabled() and not self._backward and _any_requires_grad((args, kwargs)):
                self._deferred = (func, torch.autograd._get_sequence_nr() - 1)
            return NotImplemented
        if kind == "jagged":
            # a jagged nested tensor runs its ops on its packed values (and offsets): those count, at Σ nᵢ tokens
            return NotImplemented
        if self._dtensor_seen and _in_shape_propagation():
            return func(*args, **kwargs)  # DTensor working out output shapes on fake tensors: not this rank's work
        if kind == "fake" and not self.fake:
            self._met_fake_tensor(func, args, kwargs)  # raises inside the model
            return func(*args, **kwargs)
        known = self._classes.get(id(func))  # (an op overload is long-lived and hashes in Python: keyed by id)
        if known is None:
            known = _classify(func, self.registry)
            if isinstance(func, _OP_TYPES):  # (another callable may not live long: its id could be reused)
                self._classes[id(func)] = known
        if self.device is not None:
            if known.constructor and kwargs.get("device") != self.device:
                kwargs = {**kwargs, "device": self.device}
            elif func is _LIFT_FRESH and args[0].device != self.device:  # torch.tensor(data): made on the CPU first
                args = (args[0].to(self.device),)
        stack = self.tracker.stack
        forward_op = None
        recompute = self._backward and torch.is_grad_enabled()
        if known.passed:
            return func(*args, **kwargs)
        if self._backward and not stack:
            forward_op = self._forward_op()
            stack = forward_op.module_stack if forward_op is not None else ()
        elif not stack:
            out = func(*args, **kwargs)
            if self.fake and (self.leaf_values or self._known) and isinstance(func, torch._ops.OpOverload):
                self._writes(func, args, kwargs)  # (the caller's code, between the model's calls in a block, wrote a
                # tensor whose values are known, such as a buffer: known after the write, or forgotten)
            return out
        if known.decompose:
            with self:
                decomposed = func.decompose(*args, **kwargs)
            if decomposed is not NotImplemented:
                self.decomposed[op_name(func)] += 1
                return decomposed
            known = self._classes[id(func)] = dataclasses.replace(known, decompose=False)
        start = time.perf_counter()
        out = self._execute(func, args, kwargs, stack, known)
        seconds = time.perf_counter() - start
        op = self._record(func, args, kwargs, out, stack, known)
        if self.on_lift is not None and func is _LIFT_FRESH:
            self.on_lift(out)
        if self.timed:
            op.seconds, op.started = seconds, start
        if recompute:
            self._match_twin(op)
        elif self._backward:
            op.forward = forward_op
        if self._deferred is not None and self._deferred[0] is func:
            self._by_sequence_nr[self._deferred[1]] = op
            self._deferred = None
        elif self._inputs_need_grad and (recompute or not self._backward):  # (grad mode on: _record)
            # the autograd node of this op was created just before it was dispatched here (a recomputed op's
            # node is differentiated by a reentrant checkpoint: its gradient belongs to the forward op it repeats)
            self._by_sequence_nr[torch.autograd._get_sequence_nr() - 1] = op.forward if recompute and op.forward else op
        return out

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
        """Whether a kernel called now is the model's work to record: inside the model's module calls or in its
        backward pass, and not inside a catalog kernel (whose record covers it)."""
        return not self._suspended and (bool(self.tracker.stack) or self._backward)

    def record_kernel(self, target: Any, spec: OpSpec | None, args: tuple[Any, ...], out: Any,
                      differentiated: bool = False, *, module: str | None = None, phase: str | None = None,
                      forward: CapturedOp | None = None, writes: Sequence[torch.Tensor] = ()) -> CapturedOp | None:
        """One record for a call of a kernel that runs outside the dispatcher (:mod:`flopscope.capture.catalog`):
        ``target`` names it, ``args`` are its arguments (tensors among them, as ``spec``'s formula takes them), ``out``
        what it returned (its tensors get this record as their producer); ``differentiated``: a forward whose
        ``autograd.Function`` node will run a backward (its backward's record belongs to this one); ``module``: the
        path of the module whose work it is, when that module was not called (a new call of it is made); ``phase``
        and ``forward``: a record of another phase than the run's (gradients a forward call computes are the
        backward's, of ``forward``); ``writes``: tensors it wrote in place (a Triton kernel's output buffers: what
        reads them reads this record's work). ``spec=None``: a kernel without a formula, listed by
        :attr:`unsupported` under its name. ``None`` outside the model's module calls."""
        stack, forward_op = self.tracker.stack, None
        if self._backward and not stack:
            forward_op = self._forward_op()
            stack = forward_op.module_stack if forward_op is not None else ()
        elif not stack:
            return None
        if forward is not None:
            stack = forward.module_stack  # (the gradients of a forward record: in its module call)
        elif module is not None and stack[-1].path != module and not self._backward:
            stack = self.tracker.call_of(module, stack)
        name = str(target).rpartition(".")[2]
        known = _OpClass(Cost.FORMULA, spec=spec, name=name) if spec is not None else _OpClass(Cost.UNSUPPORTED,
                                                                                               name=name)
        op = self._record(target, args, {}, out, stack, known)
        for t in writes:
            self._wrote(t, op)
        if phase is not None:
            op.phase, op.forward = phase, forward
        elif self._backward:
            op.forward = forward_op
        elif differentiated:
            self._by_sequence_nr[torch.autograd._get_sequence_nr() - 1] = op  # (the Function's node, made before
            # its forward ran)
        return op

    def _met_fake_tensor(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A real run met a fake tensor inside the model (or its backward pass): it cannot be counted, and what
        it returns would be fake too. Raises :class:`FakeTensorInRealRun` naming the op, the module and the
        shapes (ops outside the model's modules are the caller's, not counted: passed)."""
        stack = self.tracker.stack
        if not stack and not self._backward:
            return
        if any(torch._C._get_dispatch_mode(key) is not None for key in _TRACING_MODES):
            return  # torch tracing a graph on its own fake tensors (FlexAttention's backward on torch 2.9)
        where = OpFailure(op_name(func), stack[-1].path if stack else "", _shapes((args, kwargs)))
        if self.failure is None:
            self.failure = where
        fakes = [t for t in _tensors((args, kwargs)) if isinstance(t, FakeTensor)]
        raise FakeTensorInRealRun(where, ours=any(isinstance(t.fake_mode, CountingFakeTensorMode) for t in fakes))

    def _execute(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], stack: tuple[ModuleCall, ...],
                 known: _OpClass) -> Any:
        """Run the op; remember where the first failure happened (for the error the user sees). On fake
        tensors, first check what the real kernel would check and fake kernels do not."""
        try:
            if self.fake and known.checked:
                self._check_as_the_real_kernel(func, args, known.spec)
            if self.fake and func in _SCALAR_READS:  # .item() / .tolist() / int(t) of a tensor with known values
                self.value_reads += 1
                value = self.value_of(args[0])
                if value is not None and value.numel() == 1:
                    with _disable_current_modes():  # real values: no fake mode below may take them
                        return value.item()
            return func(*args, **kwargs)
        except Exception as error:  # any kernel's error: noted here, re-raised unless a fake-shape rule stands in
            if self.fake and needs_real_data(error) is not None and isinstance(func, torch._ops.OpOverload):
                known_out = self._propagate(func, args, kwargs, known.cost)
                if isinstance(known_out, torch.Tensor):  # its data was known: the output the values make
                    self.value_reads += 1
                    return self._stand_in(known_out)
            maker = FAKE_SHAPE_RULES.get(_packet(func)) if self.fake else None
            if maker is None:
                if self.failure is None:
                    self.failure = OpFailure(op_name(func), stack[-1].path if stack else "", _shapes((args, kwargs)))
                raise
            return maker(*args, **kwargs)  # a fake kernel stricter than the real one: make the output here

    def _stand_in(self, real: torch.Tensor) -> torch.Tensor:
        """``real`` (an op's output computed from known values) as a tensor of this run: a fake tensor of the run's
        fake mode (below the recorder, or :attr:`fake_mode` where none is on the stack), or a meta tensor on meta
        kernels."""
        mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) or self.fake_mode
        if mode is None:
            return real.to("meta")
        return mode.from_tensor(real)

    def _check_as_the_real_kernel(self, func: Any, args: tuple[Any, ...], spec: OpSpec | None) -> None:
        """Operands of one dtype for products, convolutions and attention; indices inside embedding tables."""
        if spec is not None and _packet(func) not in MIXED_DTYPE_OPS:
            positions = spec.operands or (range(3) if spec.family is OpFamily.CONV else ())
            operands = [args[i] for i in positions if i < len(args) and isinstance(args[i], torch.Tensor)]
            dtypes = {t.dtype for t in operands}
            if len(dtypes) > 1:
                raise RefusedInput(f"{op_name(func)} got operands of dtypes {', '.join(str(t.dtype) for t in operands)}"
                                   "; a real kernel refuses operands of different dtypes")
        if _packet(func) in EMBEDDING_LOOKUPS and len(args) > 1 and isinstance(args[1], torch.Tensor):
            rows = int(args[0].shape[0])
            values = self.value_of(args[1])
            if values is None:
                self.unchecked_lookups += 1
            elif values.numel():
                self.value_reads += 1
                with _disable_current_modes():  # real values: no fake mode below may take them
                    low, high = int(values.min()), int(values.max())
                if high < rows and low >= 0:
                    return
                bad = high if high >= rows else low
                raise RefusedInput(f"index {bad} is out of range for an embedding table of {rows} rows; a real "
                                   "forward refuses it (token ids >= vocab_size, or more positions than the table)")

    def learn(self, t: torch.Tensor, values: torch.Tensor) -> None:
        """``t`` (a fake tensor just made) holds ``values`` (real)."""
        known = self._producers.get(id(t))
        if known is not None and known[0]() is t:
            self._known[id(known[1])] = values
        else:
            self.leaf_values[id(t)] = values

    def made_by(self, t: torch.Tensor) -> CapturedOp | None:
        """The record of the op that made ``t`` (or of ``t`` as a leaf), if the run has seen ``t``."""
        found = self._producers.get(id(t))
        return found[1] if found is not None and found[0]() is t else None

    def unwritten_allocation(self, t: torch.Tensor) -> bool:
        """Whether ``t`` (or what it views) was made by an allocation of uninitialised memory (``empty``,
        ``empty_like``, ``new_empty``, ``empty_strided``) that no recorded op has written since: what a kernel outside
        the dispatcher fills (a C++ / CUDA extension's ``torch::empty_like`` and a loop over its data pointer)."""
        op = self.made_by(t)
        for _ in range(64):  # back through the views of it
            if op is None or not isinstance(op.target, torch._ops.OpOverload):
                return False
            if op.target.overloadpacket in UNINITIALISED:
                last = self._last_write.get(storage_of(t))
                return last is None or last[0] <= self._made_at.get(id(op), -1)
            if not op.target.is_view or not op.args or not isinstance(op.args[0], CapturedOp):
                return False
            op = op.args[0]
        return False

    def known_storage(self, t: torch.Tensor) -> bool:
        """Whether ``t`` shares its storage with a tensor the run has seen (``t.data`` of a parameter, an alias
        made outside the dispatcher). A scan of every tensor seen: for the rare tensor the run has not seen."""
        storage = storage_of(t)
        return any(seen is not None and storage_of(seen) == storage
                   for seen in (ref() for ref, _ in list(self._producers.values())))

    def read_value(self, t: torch.Tensor) -> torch.Tensor | None:
        """:meth:`value_of`, counted in :attr:`value_reads` when known (what runs, or what it costs, depends on it)."""
        value = self.value_of(t)
        if value is not None:
            self.value_reads += 1
        return value

    def record_of(self, t: torch.Tensor) -> CapturedOp:
        """The record of ``t``'s value now (what an op taking ``t`` takes as its argument): its producer, a version
        record after a write to its storage, or a new leaf for a tensor the run has not seen."""
        found = self._producers.get(id(t))
        return self._current(t, found[1]) if found is not None and found[0]() is t else self._leaf_of(t)

    def values_known(self, t: torch.Tensor) -> bool:
        """Whether the run knows ``t``'s values (an input's, a small real tensor's, what propagated to it): what a
        record of it carries."""
        if self.value_of(t) is not None:
            return True
        found = self._producers.get(id(t))
        if found is not None and found[0]() is t:
            return found[1].value is not None
        kind = self.leaf_names[id(t)].kind if id(t) in self.leaf_names else LeafKind.CONSTANT
        return _leaf_value(t, kind) is not None

    def add_records(self, ops: Sequence[CapturedOp]) -> None:
        """Append ``ops``, records made outside :meth:`__torch_dispatch__` (:mod:`flopscope.capture.replay`)."""
        self.ops.extend(ops)

    def set_producer(self, t: torch.Tensor, op: CapturedOp) -> None:
        """``op`` is the record of ``t``'s value (a tensor made outside :meth:`__torch_dispatch__`, now: a write to
        its storage from here on is one after ``op``)."""
        ref = weakref.ref(t)
        self._producers[id(t)] = (ref, op)
        self._made_at[id(op)] = len(self.ops)
        if op.node_op != "call_function":
            self._leaf_tensors.setdefault(id(op), []).append(ref)

    def leaves_alive(self, ops: Sequence[CapturedOp]) -> set[int]:
        """``id(record)`` of the leaves among ``ops`` whose tensors are alive (held by the model or the caller) and
        still have them as their record. Looks up each leaf's tensors (before: a scan of every tensor the run had
        seen, per call captured: a decoding step's first layer took longer each step)."""
        producers, alive = self._producers, set()
        for op in ops:
            if op.node_op == "call_function":
                continue
            for ref in self._leaf_tensors.get(id(op), ()):
                t = ref()
                found = producers.get(id(t)) if t is not None else None
                if found is not None and found[1] is op and found[0]() is t:
                    alive.add(id(op))
                    break
        return alive

    def value_of(self, t: torch.Tensor) -> torch.Tensor | None:
        """The known values of an index tensor (an input's real values, or what propagated to it)."""
        known = self._producers.get(id(t))
        if known is not None and known[0]() is t:
            op = known[1]
            return None if id(op) in self._stale else self._known.get(id(op), op.value)
        return self.leaf_values.get(id(t))

    def _propagate(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], cost: Cost
                   ) -> torch.Tensor | list[torch.Tensor] | None:
        """On fake tensors, the values of a small index tensor made from known values (``arange``, views and
        arithmetic on known ids): the op is run again on those values, for real, on the CPU. Not for ops that
        write to an argument (the known values of what shares its storage would go stale: all are forgotten
        when an index tensor is written), nor for uninitialised memory or random numbers."""
        writes, written = self._writes(func, args, kwargs)
        if writes:
            return written  # (an in-place or out= op returns the tensor it wrote)
        if (cost not in (Cost.ZERO, Cost.ELEMENTWISE) or func.overloadpacket in UNINITIALISED
                or torch.Tag.nondeterministic_seeded in func.tags
                or any(isinstance(a, torch.SymInt) for a in pytree.tree_leaves((args, kwargs)))):
            return None  # (a symbolic size, as in arange(n), would be pinned to its value by running for real)
        known: dict[int, torch.Tensor] = {}
        for t in _tensors((args, kwargs)):
            value = self.value_of(t)
            if value is None:
                return None
            known[id(t)] = value
        with _disable_current_modes():
            try:
                out = func(*_map_tensors(args, lambda t: known[id(t)]), **_map_tensors(kwargs, lambda t: known[id(t)]))
            except (RuntimeError, TypeError, ValueError, IndexError, NotImplementedError):
                return None
        if isinstance(out, (tuple, list)) and all(isinstance(t, torch.Tensor) and not t.is_meta for t in out):
            return list(out)  # a multi-output op (unbind, split): the values of each output
        return out if isinstance(out, torch.Tensor) and not out.is_meta else None

    def _writes(self, func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]
                ) -> tuple[bool, torch.Tensor | None]:
        """Whether ``func`` writes to one of its arguments, and the values of the first one it writes after the
        write, if known. When it writes to an index tensor, the known values of every tensor sharing its storage
        are updated (:meth:`_write_values`: the op is run on the values of the whole storage), or, where they
        cannot be, forgotten."""
        written = [t for t in self._written_tensors(func, args, kwargs) if t.dtype in INDEX_DTYPES]
        values = []
        for t in written:
            value = self._write_values(func, args, kwargs, t)
            if value is None:
                self._forget_storage(storage_of(t))
            values.append(value)
        return bool(self._written[func]), values[0] if values else None

    def _write_values(self, func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any], t: torch.Tensor
                      ) -> torch.Tensor | None:
        """Run the in-place op ``func`` for real on the known values of the storage of ``t`` (the tensor it writes,
        or the one it views), give every tensor on that storage its values after the write, and return ``t``'s.
        ``None`` where a value is not known or the known values are not laid out as the storage (then nothing
        changed)."""
        root = t._base if t._base is not None else t
        whole = self.value_of(root)
        if whole is None or root.storage_offset() != 0 or not root.is_contiguous() or whole.shape != root.shape:
            return None
        known: dict[int, torch.Tensor] = {}
        with _disable_current_modes():
            whole = whole.contiguous().clone()
            known[id(t)] = whole.as_strided(t.size(), t.stride(), t.storage_offset())
        for x in _tensors((args, kwargs)):
            if id(x) not in known:
                value = self.value_of(x)
                if value is None:
                    return None
                known[id(x)] = value
        storage = storage_of(t)
        with _disable_current_modes():
            try:
                func(*_map_tensors(args, lambda x: known[id(x)]), **_map_tensors(dict(kwargs), lambda x: known[id(x)]))
            except (RuntimeError, TypeError, ValueError, IndexError, NotImplementedError):
                return None
            for key, (ref, op) in list(self._producers.items()):
                alias = ref()
                if alias is None or alias.dtype != whole.dtype or storage_of(alias) != storage:
                    continue
                try:
                    value = whole.as_strided(alias.size(), alias.stride(), alias.storage_offset()).clone()
                except RuntimeError:
                    value = None
                if value is None:
                    self._known.pop(id(op), None)
                    self._stale.add(id(op))
                    self.leaf_values.pop(key, None)
                else:
                    self._known[id(op)] = value
                    self._stale.discard(id(op))
            return known[id(t)].clone()

    def _forget_storage(self, storage: int) -> None:
        """The known values of every index tensor on ``storage`` are forgotten (it was written)."""
        for key, (ref, op) in list(self._producers.items()):
            t = ref()
            if t is not None and t.dtype in INDEX_DTYPES and storage_of(t) == storage:
                self._known.pop(id(op), None)
                self._stale.add(id(op))
                self.leaf_values.pop(key, None)

    def _written_tensors(self, func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list[torch.Tensor]:
        """The tensors ``func`` writes to (its schema's mutable arguments: ``self`` of an in-place op, ``out=``)."""
        positions = self._written.get(func)
        if positions is None:
            schema = getattr(func, "_schema", None)  # (a higher-order op has none)
            arguments = schema.arguments if schema is not None else ()
            positions = self._written[func] = tuple(
                i if not a.kwarg_only else a.name for i, a in enumerate(arguments)
                if a.alias_info is not None and a.alias_info.is_write)
        found: list[torch.Tensor] = []
        for at in positions:
            value = (args[at] if at < len(args) else None) if isinstance(at, int) else kwargs.get(at)
            found.extend(v for v in (value if isinstance(value, (list, tuple)) else (value,))
                         if isinstance(v, torch.Tensor))
        return found

    def _watch_unwritten(self, func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any],
                         inputs: list[torch.Tensor], out: Any, stack: tuple[ModuleCall, ...]) -> None:
        """Real mode: tell :attr:`on_unwritten_read` of each tensor this op reads (not a view of it, not an argument it
        writes or does not read the values of) whose memory an ``empty`` made and no recorded op wrote since (a kernel
        outside the dispatcher filled it: a Triton or C++ kernel handed the buffer); remember the ``empty`` this op
        makes."""
        unwritten = self._unwritten
        if unwritten and inputs and stack and not getattr(func, "is_view", False):
            written: set[int] | None = None
            for t in inputs:
                storage = storage_of(t)
                allocated = unwritten.get(storage)
                if allocated is None:
                    continue
                if written is None:
                    written = {id(w) for w in (*self._written_tensors(func, args, kwargs),
                                               *unread_tensors(func, args, kwargs))} if isinstance(
                        func, torch._ops.OpOverload) else set()
                if id(t) in written:
                    continue  # (filled by this op: copy_, fill_, an out= argument; or not read: the input of
                    # addmm(..., beta=0), the self of empty_like: flopscope.capture.unread)
                del unwritten[storage]
                if self.unwritten_allocation(t):  # (its own producer, through views: not another tensor that
                    # came to live at a freed storage's address)
                    self.on_unwritten_read(t, allocated, stack[-1], func)  # type: ignore[misc]
        if (stack and isinstance(out, torch.Tensor) and isinstance(func, torch._ops.OpOverload)
                and func.overloadpacket in UNINITIALISED and out.numel()):
            unwritten[storage_of(out)] = stack[-1]

    def _note_writes(self, func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any], op: CapturedOp) -> None:
        """After ``op`` ran: the storages it wrote to were last written by it (:meth:`_current`)."""
        if not isinstance(func, torch._ops.OpOverload):
            return
        for t in self._written_tensors(func, args, kwargs):
            self._wrote(t, op)

    def _wrote(self, t: torch.Tensor, op: CapturedOp) -> None:
        """``op`` wrote ``t``'s storage: its last write."""
        storage = storage_of(t)
        self._last_write[storage] = (len(self.ops), op)
        if self._unwritten:
            self._unwritten.pop(storage, None)
        for window in self.windows:
            if storage not in window.storages:
                window.outside_writes += 1

    def _current(self, t: torch.Tensor, producer: CapturedOp) -> CapturedOp:
        """The record of ``t``'s value now: ``producer``, or a version record (:func:`after_write`) when an op
        wrote to ``t``'s storage after ``producer`` made it (through ``t``, a view of it or the tensor it views).
        (``t`` held its storage all the while, so a write to that storage since was a write to ``t``'s.)"""
        if not self._last_write:
            return producer
        last = self._last_write.get(storage_of(t))
        if last is None or last[1] is producer or last[0] <= self._made_at.get(id(producer), -1):
            return producer
        write = last[1]
        key = (id(producer), id(write))
        version = self._versions.get(key)
        if version is None:
            phase = FORWARD if not self._backward else RECOMPUTE if torch.is_grad_enabled() else BACKWARD
            version = self._versions[key] = CapturedOp(
                "call_function", after_write, (producer, write), {}, f"{producer.name}_after_{write.name}",
                phase=phase, module_stack=self.tracker.stack or write.module_stack, output_shapes=(shape_of(t),),
                dtype=t.dtype)
            self._made_at[id(version)] = len(self.ops)
            self.ops.append(version)
            if id(producer) in self._stale:  # (what the tensor holds now is known under its producer, or not at all)
                self._stale.add(id(version))
            elif id(producer) in self._known:
                self._known[id(version)] = self._known[id(producer)]
        self._producers[id(t)] = (weakref.ref(t), version)
        return version

    def _match_twin(self, op: CapturedOp) -> None:
        """A recompute op takes the forward op it repeats (same op, input shapes and innermost module; the
        k-th repeat of a key matches the k-th forward op of that key, cyclically) as ``forward``, and that
        op's module stack: a re-run module call is the same call."""
        if self._twins is None:  # built once, at the first recompute op
            self._twins = {}
            for earlier in self.ops:
                if earlier.phase == FORWARD and earlier.node_op == "call_function":
                    self._twins.setdefault(_twin_key(earlier), []).append(earlier)
        key = _twin_key(op)
        twins = self._twins.get(key)
        if twins:
            twin = twins[self._replayed[key] % len(twins)]
            self._replayed[key] += 1
            op.forward, op.module_stack = twin, twin.module_stack
            for getter in reversed(self.ops):  # the getters of a tuple output follow the op
                if getter is op:
                    break
                getter.module_stack = twin.module_stack

    def _forward_op(self) -> CapturedOp | None:
        """The forward op whose autograd node is running now (backward pass), if it was recorded."""
        grad_fn = torch._C._current_autograd_node()
        return None if grad_fn is None else self._by_sequence_nr.get(grad_fn._sequence_nr())

    # ---------------------------------------------------------------------------------------------
    def _record(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                stack: tuple[ModuleCall, ...], known: _OpClass) -> CapturedOp:
        shapes: list[Shape] = []
        inputs: list[torch.Tensor] = []
        producers = self._producers

        def to_op(t: torch.Tensor) -> CapturedOp:
            shapes.append(shape_of(t))
            inputs.append(t)
            return self.record_of(t)

        phase = FORWARD if not self._backward else RECOMPUTE if torch.is_grad_enabled() else BACKWARD
        op = CapturedOp("call_function", func, _map_tensors(args, to_op), _map_tensors(kwargs, to_op) if kwargs else {},
                        known.name, phase, stack, cost=known.cost, spec=known.spec)
        op.input_shapes = tuple(shapes)
        self._inputs_need_grad = torch.is_grad_enabled() and any(t.requires_grad for t in inputs)
        self._made_at[id(op)] = len(self.ops)
        self.ops.append(op)
        if self.on_unwritten_read is not None:
            self._watch_unwritten(func, args, kwargs, inputs, out, stack)
        self._note_writes(func, args, kwargs, op)
        if isinstance(out, torch.Tensor):
            op.output_shapes, op.dtype = (shape_of(out),), out.dtype
            if out.dtype in INDEX_DTYPES:
                op.value = _small_index_value(out)
                if (self.fake and op.value is None and _at_most(out, MAX_KNOWN_NUMEL)
                        and isinstance(func, torch._ops.OpOverload)):  # (a higher-order op has no schema to read)
                    value = self._propagate(func, args, kwargs, known.cost)
                    if isinstance(value, torch.Tensor):
                        self._known[id(op)] = value
            elif (self.fake and out.is_floating_point() and _at_most(out, MAX_KNOWN_FLOAT_NUMEL)
                    and isinstance(func, torch._ops.OpOverload)):
                value = self._propagate(func, args, kwargs, known.cost)  # (arange(t) * interval, then .long())
                if isinstance(value, torch.Tensor):
                    self._known[id(op)] = value
            producers[id(out)] = (weakref.ref(out), op)
        else:
            outputs = [(i, item) for i, item in enumerate(out if isinstance(out, (tuple, list)) else ())
                       if isinstance(item, torch.Tensor)]
            op.output_shapes = tuple(shape_of(item) for _, item in outputs)
            op.dtype = outputs[0][1].dtype if outputs else None
            values = None
            if (self.fake and outputs and all(item.dtype in INDEX_DTYPES for _, item in outputs)
                    and isinstance(func, torch._ops.OpOverload)
                    and sum(item.numel() for _, item in outputs) <= MAX_KNOWN_NUMEL):
                found = self._propagate(func, args, kwargs, known.cost)
                values = found if isinstance(found, list) and len(found) == len(out) else None
            for i, item in outputs:
                getter = CapturedOp("call_function", operator.getitem, (op, i), {}, f"{op.name}_{i}", phase=phase,
                                    module_stack=stack, output_shapes=(shape_of(item),), dtype=item.dtype)
                self._made_at[id(getter)] = len(self.ops)
                self.ops.append(getter)
                producers[id(item)] = (weakref.ref(item), getter)
                if values is not None:
                    self._known[id(getter)] = values[i]
        results = [out] if isinstance(out, torch.Tensor) else _tensors(out)
        if self.windows and not getattr(func, "is_view", False):
            for window in self.windows:
                window.storages.update(storage_of(t) for t in results)
        op.bytes = traffic.bytes_moved(known.access, inputs, results)
        if known.collective is not None:
            op.collective = (known.collective, collectives.message_bytes(func, args, kwargs, results),
                             collectives.group_size(args, kwargs))
        if self.fake and not getattr(func, "is_view", False):  # the least memory a real run would need (a view, such
            # as a weight's transpose, allocates nothing)
            for t in results:
                size = traffic.nbytes(t)  # a symbolic size (symbolic trace) is not compared: no guard
                if isinstance(size, int) and size > self.largest_out:
                    self.largest_out = size
        if known.spec is not None:
            macs = formulas.count(known.spec.formula, args, kwargs, _first_shape(out), values=self.read_value,
                                  target=func)
            if isinstance(macs, formulas.UpperBound):
                self.upper_bounds[op_name(func)] += 1
            op.macs = formulas.total_of(macs)
            op.parts = dict(macs) if isinstance(macs, Mapping) else None
            if op.parts and "attn_scores" in op.parts and known.spec.family not in _ATTENTION_FAMILIES:
                self.undeclared_kernels.add(op_name(func))
        elif known.rule is not None:
            op.elementwise = (known.rule.category, elementwise.elementwise_ops(known.rule, args, out))
        elif known.cost is Cost.UNSUPPORTED:
            self.unsupported[op_name(func)] += 1
        return op

    def _leaf_of(self, t: torch.Tensor) -> CapturedOp:
        """A new record for a tensor no recorded op made (a parameter, buffer, input or outside constant)."""
        leaf = self.leaf_names.get(id(t))
        if leaf is None:  # a parameter the model registered during the run (FSDP2's unsharded ones) is one still
            if isinstance(t, torch.nn.Parameter):
                self._late_parameters += 1  # each its own name: a shared one would make them all one tied weight
                leaf = LeafName("get_attr", f"parameter_{self._late_parameters}", LeafKind.PARAMETER)
            else:
                leaf = LeafName("placeholder", "constant", LeafKind.CONSTANT)
        value = self.leaf_values.get(id(t))
        if value is None:
            value = _leaf_value(t, leaf.kind)
        op = CapturedOp(leaf.node_op, leaf.name, (), {}, leaf.name.replace(".", "_"), output_shapes=(shape_of(t),),
                        dtype=t.dtype, value=value, leaf=leaf.kind)
        # a parameter, buffer or input held its storage since before the run: every write to it since counts
        self._made_at[id(op)] = -1 if leaf.kind is not LeafKind.CONSTANT else len(self.ops)
        self.ops.append(op)
        ref = weakref.ref(t)
        self._producers[id(t)] = (ref, op)
        self._leaf_tensors.setdefault(id(op), []).append(ref)
        if self.on_constant is not None and leaf.kind is LeafKind.CONSTANT:
            self.on_constant(t)
        return op


CONSTRUCTORS_FROM_DATA = ("tensor", "as_tensor", "asarray")
"""The ``torch`` functions that make a tensor from Python data: on fake tensors, :func:`from_known_data` stands in
for them while a fake run counts (``runner.known_tensor_data``)."""
_FAKE_RUN = threading.local()  # .recorder: the recorder of this thread's fake run, if one is running


@contextmanager
def fake_run_of(recorder: Recorder) -> Iterator[None]:
    """This thread runs ``recorder``'s fake run: :func:`from_known_data` may answer from its known values."""
    outer = getattr(_FAKE_RUN, "recorder", None)
    _FAKE_RUN.recorder = recorder
    try:
        yield
    finally:
        _FAKE_RUN.recorder = outer


def from_known_data(original: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.tensor`` (or ``as_tensor``, ``asarray``) that, in a thread running a fake run, takes one-element fake
    tensors in its Python data at the values the recorder knows (``torch.tensor([positions.max() + 1 - n, ...])``:
    Qwen2-VL's rotary position deltas). torch reads such data's memory directly, which a fake tensor has not, and
    no op reaches a dispatch mode; a torch function mode would see the call, but any such mode also turns
    ``nn.MultiheadAttention``'s fast path off (``has_torch_function``). The new tensor's values are known too.
    Other calls (other threads, data without fake tensors, a value not known) are the original's."""

    @functools.wraps(original)
    def constructor(data: Any, *args: Any, **kwargs: Any) -> Any:
        recorder: Recorder | None = getattr(_FAKE_RUN, "recorder", None)
        known = _known_data(recorder, data) if recorder is not None and isinstance(data, (list, tuple)) else None
        if recorder is None or known is None:
            return original(data, *args, **kwargs)
        out = original(known, *args, **kwargs)
        recorder.value_reads += 1
        if isinstance(out, torch.Tensor) and out.dtype in INDEX_DTYPES:
            with _disable_current_modes():
                recorder.learn(out, original(known, dtype=out.dtype))
        return out

    constructor.__flopscope_original__ = original  # type: ignore[attr-defined]
    return constructor


def _known_data(recorder: Recorder, data: Any) -> Any:
    """``data`` with each one-element fake tensor replaced by its known value; ``None`` if one is unknown or
    there is none."""
    found = False

    def value(x: Any) -> Any:
        nonlocal found
        if isinstance(x, (list, tuple)):
            return type(x)(value(v) for v in x)
        if isinstance(x, FakeTensor):
            known = recorder.value_of(x)
            if known is None or known.numel() != 1:
                raise LookupError
            found = True
            with _disable_current_modes():
                return known.item()
        return x

    try:
        out = value(data)
    except LookupError:
        return None
    return out if found else None


def storage_of(t: torch.Tensor) -> int:
    """The identity of ``t``'s storage (views of one tensor share it); ``id(t)`` where it has none."""
    try:
        return int(t.untyped_storage()._cdata)
    except (RuntimeError, NotImplementedError):
        return id(t)


_HOPS_LOCK = threading.Lock()


def _route_higher_order_ops() -> None:
    """On a torch whose higher-order ops know no ``supports_higher_order_operators`` (2.6), an op finds a mode's
    rule by the mode's exact class: give :class:`Recorder` one for each, passing the op to its dispatch as later
    torch does. Run at each new recorder (higher-order ops are made as their modules are imported), under a lock."""
    with _HOPS_LOCK:
        for op in list(torch._ops._higher_order_ops.values()):
            if Recorder not in op.python_key_table:
                op.py_impl(Recorder)(functools.partial(_dispatch_higher_order_op, op))


def _dispatch_higher_order_op(op: Any, mode: Recorder, *args: Any, **kwargs: Any) -> Any:
    return mode.__torch_dispatch__(op, [], args, kwargs)


def _packet(func: Any) -> Any:
    """An op overload's packet (``aten.mm`` for ``aten.mm.default``); a higher-order op is its own."""
    return getattr(func, "overloadpacket", func)


def _subclass_kind(types: Sequence[type]) -> str:
    """How the recorder treats a dispatch whose tensors have these types: ``"dtensor"`` and ``"jagged"`` run their
    ops on their local / packed tensors (those are recorded), ``"fake"`` fake tensors, ``""`` plain tensors."""
    dtensor = loaded_dtensor()
    if dtensor is not None and any(issubclass(t, dtensor) for t in types):
        return "dtensor"
    if any(issubclass(t, formulas.JaggedTensor) for t in types):
        return "jagged"
    return "fake" if any(issubclass(t, FakeTensor) for t in types) else ""


def _grouped_mm_output(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None = None, bias: Any = None,
                       out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The output of ``_grouped_mm`` (PyTorch's fake kernel accepts only bfloat16; the CPU kernel runs
    float32): ``[M, K] x [G, K, N] -> [M, N]``, ``[G, M, K] x [G, K, N] -> [G, M, N]``,
    ``[M, K] x [K, N]`` with offsets over K ``-> [G, M, N]``, ``[G, M, K] x [K, N] -> [M, N]``."""
    if a.dim() == 2 and b.dim() == 3:
        shape: tuple[int, ...] = (a.shape[0], b.shape[-1])
    elif a.dim() == 3 and b.dim() == 3:
        shape = (a.shape[0], a.shape[1], b.shape[-1])
    elif a.dim() == 2 and b.dim() == 2:
        shape = (offs.shape[0] if offs is not None else 1, a.shape[0], b.shape[-1])
    else:
        shape = (a.shape[1], b.shape[-1])
    return torch.empty(shape, dtype=out_dtype or a.dtype, device=a.device)


FAKE_SHAPE_RULES: dict[Any, Callable[..., Any]] = dict.fromkeys(formulas.aten_ops("_grouped_mm"), _grouped_mm_output)
"""Output makers for ops whose fake kernel rejects what the real kernel runs (used only if it raises)."""

INDEX_DTYPES = (torch.int64, torch.int32, torch.bool)
_MAX_VALUE_NUMEL = 4096
MAX_KNOWN_NUMEL = 1 << 16
"""On fake tensors, index tensors up to this many elements keep their values (inputs' real ids, ``arange``
positions and what is computed from them), so lookups can be checked as a real forward would."""
MAX_KNOWN_FLOAT_NUMEL = 1 << 10
"""On fake tensors, floating-point tensors up to this many elements computed only from known values keep theirs
(``torch.arange(t) * time_interval`` before ``.long()``: Qwen2-VL's temporal positions)."""
UNINITIALISED = frozenset({torch.ops.aten.empty, torch.ops.aten.empty_like, torch.ops.aten.new_empty,
                           torch.ops.aten.empty_strided, torch.ops.aten.new_empty_strided})
"""Ops whose output's values are whatever memory held: never known."""
MIXED_DTYPE_OPS = frozenset({torch.ops.aten._scaled_mm, *formulas.aten_ops("_scaled_grouped_mm")})
"""Products whose kernels take operands of different dtypes (fp8 formats with scales)."""


def _leaf_value(t: torch.Tensor, kind: LeafKind) -> torch.Tensor | None:
    """The values a leaf record of ``t`` carries (a small index tensor's, a one-element constant's), if any."""
    return _small_index_value(t) if t.dtype in INDEX_DTYPES else _scalar_constant(t, kind)


def _small_index_value(t: torch.Tensor) -> torch.Tensor | None:
    """The values of a small index tensor (int64 / int32 / bool, at most 4,096 elements): a real tensor's
    own, a fake tensor's constant if it has one; ``None`` for anything else."""
    if t.dtype not in INDEX_DTYPES or not _at_most(t, _MAX_VALUE_NUMEL):
        return None
    source: torch.Tensor | None = t.constant if isinstance(t, FakeTensor) else t
    if source is None or source.is_meta:
        return None
    with _disable_current_modes():  # a copy of real data, not a fake tensor of the mode below us
        return source.detach().clone()


def _scalar_constant(t: torch.Tensor, kind: LeafKind) -> torch.Tensor | None:
    """The value of a one-element constant the forward made from data (``torch.tensor(0.0)``: an additive mask's
    "allowed" value, read by :mod:`flopscope.predict.attention`); ``None`` for anything else."""
    if kind is not LeafKind.CONSTANT or isinstance(t, FakeTensor) or t.is_meta or t.numel() != 1:
        return None
    with _disable_current_modes():
        return t.detach().clone()


def _at_most(t: torch.Tensor, numel: int) -> bool:
    """``t`` has at most ``numel`` elements, a plain number: a tensor whose size is a symbol (a symbolic trace,
    :mod:`flopscope.symbolic`) has no known values, and comparing its size would add a guard on the symbol."""
    size = t.numel()
    return isinstance(size, int) and size <= numel


def _map_tensors(x: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """Replace tensors inside (nested) tuples, lists and dicts by ``fn(tensor)``."""
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, (tuple, list)):
        mapped = [fn(v) if isinstance(v, torch.Tensor) else _map_tensors(v, fn) if isinstance(v, _NESTED) else v
                  for v in x]
        return tuple(mapped) if isinstance(x, tuple) else mapped
    if isinstance(x, dict):
        return {k: _map_tensors(v, fn) for k, v in x.items()} if x else x
    return x


_NESTED = (tuple, list, dict)


def _tensors(x: Any) -> list[torch.Tensor]:
    """The tensors inside (nested) tuples, lists and dicts, in order."""
    found: list[torch.Tensor] = []
    _map_tensors(x, found.append)
    return found


def _any_requires_grad(x: Any) -> bool:
    return any(t.requires_grad for t in _tensors(x))


def _shapes(x: Any) -> tuple[tuple[int, ...], ...]:
    """Shapes of the tensors inside ``x``, in order."""
    return tuple(shape_of(t) for t in _tensors(x))


@functools.cache
def _shape_propagation_code() -> Any:
    """The code of DTensor's output-shape propagation, which runs the op once more on fake tensors of the global
    shapes (on flopscope's own fake mode in a fake run, where no other sign tells those ops apart). Asked only
    once a DTensor op was seen, so torch.distributed.tensor is imported already."""
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    return getattr(getattr(ShardingPropagator, "_propagate_tensor_meta_non_cached", None), "__code__", None)


def _in_shape_propagation() -> bool:
    code = _shape_propagation_code()
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _twin_key(op: CapturedOp) -> tuple[Any, ...]:
    # shapes as text: a symbolic size (torch.SymInt) is not hashable
    return op.target, str(op.input_shapes), op.module_stack[-1].path if op.module_stack else None


def _first_shape(out: Any) -> tuple[int, ...] | None:
    if isinstance(out, torch.Tensor):
        return shape_of(out)
    if isinstance(out, (tuple, list)):
        for item in out:
            if isinstance(item, torch.Tensor):
                return shape_of(item)
    return None


def capture_of(recorder: Recorder, tracker: ModuleTracker) -> Capture:
    """What ``recorder`` and ``tracker`` hold at the end of a run."""
    return Capture(recorder.ops, dict(recorder.unsupported), tuple(sorted(recorder.undeclared_kernels)),
                   recorder.unchecked_lookups, dict(recorder.decomposed), dict(tracker.inputs), dict(tracker.calls),
                   dict(tracker.root_seconds), dict(recorder.upper_bounds), tuple(recorder.outside_work),
                   recorder.largest_out, dict(recorder.copies))
