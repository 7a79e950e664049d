"""The records of a capture: one :class:`CapturedOp` per ATen op a forward executed (and
per outside tensor it read), linked by their dataflow, the ``torch.fx`` graph built
from them on demand, and :class:`Capture`, what one run produced. The recorder that
makes them is :mod:`flopscope.capture.recorder`.

Every node carries its :class:`CapturedOp` (read it with :func:`captured`). For users,
``node.meta`` also holds these plain keys (written in one place, :func:`_public_meta`):

- ``module``: path of the innermost module call running the op (``""`` is the root);
- ``module_stack``: the :class:`~flopscope.capture.module_tracker.ModuleCall` frames,
  outermost first;
- ``input_shapes`` / ``output_shapes``: shapes of the tensor arguments / outputs, in
  order;
- ``dtype``: dtype of the first tensor output (``None`` if there is none);
- ``bytes``: the minimum bytes the op reads and writes
  (:mod:`flopscope.formulas.traffic`; 0 for views);
- ``collective``: for a collective, ``(kind, message bytes, group size)``
  (:mod:`flopscope.communication`);
- ``multiplies``: MACs of the op (0 for ops without a formula); ``multiply_parts``: the
  formula's ``{part: MACs}`` split for fused ops, else ``None``;
- ``elementwise``: ``(category, ops)`` for elementwise work, else ``None``;
- ``cost``: ``"formula"``, ``"elementwise"``, ``"zero"`` or ``"unsupported"``
  (:class:`Cost`);
- ``seconds``: wall time of the op (real mode only);
- ``phase``: ``"forward"``, ``"backward"`` or ``"recompute"``; a backward op whose
  autograd node was recorded in the forward also has ``forward``: that forward node
  (matched by autograd sequence number), whose module stack it inherits (a backward op
  of work done outside the model, such as a loss, has none). A ``"recompute"`` op is a
  forward op run again inside the backward pass by activation checkpointing
  (``torch.utils.checkpoint``, reentrant or not): an op of the backward pass that runs
  with grad mode on (flopscope's backward passes never use ``create_graph``, so gradient
  formulas run with it off). Its ``forward`` is the forward op it repeats (same op,
  input shapes and innermost module), whose module stack and roles it takes: hardware
  FLOPs (HFU) count it, model FLOPs (MFU) do not;
- ``value``: for small integer / boolean tensors whose values are known (index lists
  such as ``x[..., [-1], :]``; real-mode results), a copy of the values, so later stages
  can replay indexing;
- ``leaf``: for get_attr / placeholder nodes, ``"parameter"``, ``"buffer"``, ``"input"``
  or ``"constant"``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import torch
from torch import fx

from ..enums import StrEnum
from ..formulas.registry import OpSpec
from .module_tracker import ModuleCall
from .undispatched import OutsideWork, notes_of

Shape = tuple[int, ...]


FORWARD, BACKWARD, RECOMPUTE = "forward", "backward", "recompute"
"""The phases of a capture (plain strings: they are keys of :meth:`Profile.by_phase`);
``RECOMPUTE`` is the forward work that activation checkpointing runs again during the
backward pass."""


class Cost(StrEnum):
    """How an op's work is counted."""

    FORMULA = "formula"  # a registered MAC formula (counted in total())
    ELEMENTWISE = "elementwise"  # an elementwise rule (counted apart, never MACs)
    ZERO = "zero"  # no arithmetic: views, data movement, allocation, lookups
    # a collective (flopscope.communication): listed by Profile.collectives()
    COMMUNICATION = "communication"
    UNSUPPORTED = "unsupported"  # none of the above: listed by Profile.unsupported()


class LeafKind(StrEnum):
    """Where a tensor that enters the forward from outside comes from."""

    PARAMETER = "parameter"
    BUFFER = "buffer"
    INPUT = "input"
    CONSTANT = "constant"


@dataclass(frozen=True, slots=True)
class LeafName:
    """The name of an outside tensor: a ``get_attr`` of a parameter or buffer, or a
    ``placeholder``."""

    node_op: str  # "get_attr" or "placeholder"
    name: str  # "encoder.weight", "input_ids"
    kind: LeafKind


UNROUTED_NOTE = "counted as an upper bound under expert parallelism"
"""How the notes begin to say that a grouped matmul of an expert-parallel rank counted
every route (:attr:`Capture.unrouted`)."""


@dataclass(eq=False, slots=True, repr=False)
class CapturedOp:
    """One recorded op (or one outside tensor: a leaf), before and after it becomes an
    fx node.

    ``args`` / ``kwargs`` hold other :class:`CapturedOp` s where the op took a tensor
    (the dataflow). The fx graph is built only when someone asks for it
    (:func:`build_graph`); counting totals needs only these records. Units: ``macs`` in
    MACs, ``seconds`` wall time.
    """

    node_op: str  # fx node op: "call_function", "get_attr" or "placeholder"
    target: Any  # the ATen op overload (call_function), or the leaf's name
    args: Any
    kwargs: Any
    name: str
    phase: str = FORWARD
    module_stack: tuple[ModuleCall, ...] = ()
    input_shapes: tuple[Shape, ...] = ()
    output_shapes: tuple[Shape, ...] = ()
    dtype: torch.dtype | None = None
    cost: Cost = Cost.ZERO
    spec: OpSpec | None = None  # the registry's entry for an op with a formula
    macs: int = 0  # MACs of the op's formula (0 without one); public meta key "multiplies"
    # minimum bytes read and written (flopscope.formulas.traffic); public meta key
    # "bytes"
    bytes: int = 0
    parts: dict[str, int] | None = None  # {part: MACs} of a fused op's formula
    elementwise: tuple[str, int] | None = None  # (category, elementwise ops)
    seconds: float | None = None  # real mode: wall time of the kernel
    started: float | None = None  # real mode: time.perf_counter() when the kernel started
    # backward op: the forward op whose autograd node ran it; recompute: the
    forward: CapturedOp | None = None
    # forward op it repeats
    # a small index tensor's known values (or a one-element constant leaf's)
    value: torch.Tensor | None = None
    leaf: LeafKind | None = None
    # (kind, message bytes, group size) of a collective
    collective: tuple[str, int, int | None] | None = None
    # the dataflow, set by link() (the role passes walk it without an fx graph)
    index: int = -1  # position among the capture's records (graph order)
    # the records among args / kwargs, each once, in order (fx's all_input_nodes)
    inputs: tuple[CapturedOp, ...] = ()
    users: tuple[CapturedOp, ...] = ()  # the records that take this one's output, in order

    def __repr__(self) -> str:
        # short: its arguments, forward op, inputs and users lead through the whole
        # graph
        where = f", module={self.module!r}" if self.module_stack else ""
        return (f"CapturedOp({self.name}, {self.op_name}{where}, phase={self.phase}, "
                f"inputs={list(self.input_shapes)}, outputs={list(self.output_shapes)}, "
                f"macs={self.macs})")

    @property
    def module(self) -> str | None:
        """Path of the innermost module call running the op (``None`` for a leaf)."""
        return self.module_stack[-1].path if self.module_stack else None

    @property
    def op_name(self) -> str:
        """``"aten.mm"`` for a call; the leaf's node op otherwise."""
        return op_name(self.target) if self.node_op == "call_function" else self.node_op


def link(ops: Sequence[CapturedOp], again: bool = False) -> None:
    """Set each record's :attr:`~CapturedOp.index`, :attr:`~CapturedOp.inputs` and
    :attr:`~CapturedOp.users` (once: a capture's records do not change after the run;
    ``again``: also when they were linked, as after a link of part of them). A record
    whose inputs are set already keeps them (a replayed call's copies are made with
    theirs), but with ``again``: records made with :func:`dataclasses.replace` carry
    their originals'."""
    # (set last: a link interrupted or running elsewhere is redone)
    if ops and ops[-1].index == len(ops) - 1 and not again:
        return
    users: dict[CapturedOp, list[CapturedOp]] = {}
    for op in ops:
        if again or not op.inputs:
            op.inputs = records_in(op.args, op.kwargs)
        for source in op.inputs:
            users.setdefault(source, []).append(op)
    for i, op in enumerate(ops):
        op.users = tuple(users.get(op, ()))
        op.index = i


def records_in(*values: Any) -> tuple[CapturedOp, ...]:
    """The records inside ``values`` (a record's args and kwargs: their tuples, lists
    and dicts), each once, in order: what :func:`map_records` maps, without building a
    copy."""
    found: dict[CapturedOp, None] = {}
    _gather(values, found)
    return tuple(found)


def _gather(values: Iterable[Any], found: dict[CapturedOp, None]) -> None:
    """Add the records inside ``values`` (and inside their tuples, lists and dicts) to
    ``found``, in order: :func:`map_records` without building a copy."""
    for v in values:
        kind = type(v)
        if kind is CapturedOp:
            found[v] = None
        elif kind is int or kind is float or kind is bool or v is None:
            continue
        elif isinstance(v, CapturedOp):
            found[v] = None
        elif isinstance(v, (tuple, list)):
            _gather(v, found)
        elif isinstance(v, dict):
            _gather(v.values(), found)


def map_records(x: Any, fn: Callable[[CapturedOp], Any]) -> Any:
    """``x`` (a record's args or kwargs) with ``fn(record)`` for each record inside its
    tuples, lists and dicts."""
    if isinstance(x, CapturedOp):
        return fn(x)
    if isinstance(x, (tuple, list)):
        return type(x)([map_records(v, fn) for v in x])
    if isinstance(x, dict):
        return {k: map_records(v, fn) for k, v in x.items()}
    return x


def argument_shape(op: CapturedOp, position: int) -> Shape | None:
    """The (first output) shape of the record ``op`` takes at argument ``position``;
    ``None`` where that argument is not a record (a number, ``None``, past the end)."""
    arg = op.args[position] if position < len(op.args) else None
    return arg.output_shapes[0] if isinstance(arg, CapturedOp) and arg.output_shapes else None


CAPTURED = "flopscope.op"
"""The ``node.meta`` key of a node's :class:`CapturedOp`."""


def captured(node: fx.Node) -> CapturedOp:
    """The :class:`CapturedOp` behind a node of a captured graph."""
    op: CapturedOp = node.meta[CAPTURED]
    return op


def op_name(func: Any) -> str:
    """``"aten.mm"`` for ``torch.ops.aten.mm.default``; ``"flopscope.after_write"`` for
    :func:`after_write`."""
    if func is after_write:
        return "flopscope.after_write"
    return str(getattr(func, "overloadpacket", func))


def after_write(value: Any, write: Any) -> Any:
    """The target of a version record: the value a tensor holds after ``write`` (an
    in-place op, a copy into a slice or view, an ``out=`` op) changed its storage,
    where ``value`` is what it held before (its producer). It runs nothing (cost
    zero); it makes the dataflow single-assignment: every later read of a written
    storage takes the write as an input, as functionalization's ``*_scatter`` ops do
    for ``torch.export``."""
    return value


def build_graph(ops: list[CapturedOp]) -> fx.Graph:
    """The fx graph of the recorded ops, in order; each node's ``meta`` holds its
    :class:`CapturedOp` under :data:`CAPTURED` and the public keys of the module
    docstring."""
    graph = fx.Graph()
    nodes: dict[CapturedOp, fx.Node] = {}

    for op in ops:
        # arguments set after creation: ``create_node`` walks them with pytree (to warn
        # of raw SymInts), which took a third of the time of building a large graph; the
        # setters keep users and uses the same way
        node = nodes[op] = graph.create_node(op.node_op, op.target, name=op.name)
        if op.args:
            node.args = map_records(op.args, nodes.__getitem__)
        if op.kwargs:
            node.kwargs = map_records(op.kwargs, nodes.__getitem__)
        # (an attribute set would re-file the node in fx's lookup table)
        node.meta.update(_public_meta(op, nodes))
    return graph


def _public_meta(op: CapturedOp, nodes: Mapping[CapturedOp, fx.Node]) -> dict[str, Any]:
    meta: dict[str, Any] = {
        CAPTURED: op, "module": op.module, "module_stack": op.module_stack,
        "input_shapes": op.input_shapes,
        "output_shapes": op.output_shapes, "dtype": op.dtype, "multiplies": op.macs,
        "bytes": op.bytes,
        "multiply_parts": op.parts, "elementwise": op.elementwise, "cost": op.cost.value,
        "phase": op.phase,
    }
    if op.collective is not None:
        meta["collective"] = op.collective
    if op.seconds is not None:
        meta["seconds"] = op.seconds
    if op.forward is not None:
        meta["forward"] = nodes[op.forward]
    if op.value is not None:
        meta["value"] = op.value
    if op.leaf is not None:
        meta["leaf"] = op.leaf.value
    return meta


@dataclass(frozen=True)
class Capture:
    """What one recorded run produced: the ops in order, the ops without a formula, and
    per module call its input shapes (how reconciliation reads token counts) and call
    counts."""

    ops: list[CapturedOp]
    unsupported: Mapping[str, int]
    undeclared_kernels: tuple[str, ...]
    unchecked_lookups: int
    decomposed: Mapping[str, int]
    module_inputs: Mapping[ModuleCall, tuple[tuple[int | str, Shape], ...]]
    module_calls: Mapping[str, int]
    # wall time of each call of the root module (call number -> seconds)
    root_seconds: Mapping[int, float]
    # op -> calls counted as upper bounds
    upper_bounds: Mapping[str, int] = field(default_factory=dict)
    outside: tuple[OutsideWork, ...] = ()  # real mode: tensors computed outside the ATen dispatcher
    # fake mode: bytes of the largest tensor an op made (a real run needs at least it)
    largest_tensor_bytes: int = 0
    # a replayed call's record -> the record
    copies: Mapping[CapturedOp, CapturedOp] = field(default_factory=dict)
    # of the earlier call it copies (flopscope.capture.replay): the same op on the same
    # shapes, in the same place of a block of the same structure
    # the grouped matmuls of expert-parallel experts counted with every route, each with
    # the share of its layer's experts the rank holds (flopscope.capture.expert_parallel)
    unrouted: Mapping[CapturedOp, Fraction | None] = field(default_factory=dict)

    def notes(self, unchecked: bool = True) -> list[str]:
        """What the recording could not establish: an op whose formula returns attention
        parts but is not registered as an attention kernel (its projections cannot be
        found); with ``unchecked``, on fake tensors, embedding lookups whose index
        values were unknown (not checked against the table, as a real forward would:
        inputs on ``device="meta"`` have no values)."""
        notes = [f"the formula of {op} returns attention parts but is not registered with family="
                 "OpFamily.ATTENTION and its (q, k, v) operand positions, so its projections get "
                 "role 'other' "
                 "(see docs/extending.md)" for op in self.undeclared_kernels]
        for op, calls in self.upper_bounds.items():
            notes.append(f"{op} x{calls}: counted as an upper bound, since the values its work "
                         "depends on were not known (variable-length offsets on fake tensors: "
                         "every sequence as long as the longest); mode='real' counts it exactly")
        for op, calls in Counter(record.op_name for record in self.unrouted).items():
            notes.append(f"{op} x{calls}: {UNROUTED_NOTE}: which routes "
                         "reach this rank's experts is data, not known on fake tensors, so every route was "
                         "counted as if it did; mode='real' counts the routes that do")
        notes += notes_of(self.outside)
        if unchecked and self.unchecked_lookups:
            notes.append(f"fake mode: the index values of {self.unchecked_lookups} embedding "
                         "lookup(s) were not known, so they were not checked against their tables' "
                         "sizes (a real forward refuses out-of-range ids)")
        return notes
