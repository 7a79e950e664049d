"""Capture: record every ATen op a forward executes into a ``torch.fx`` graph, with costs.

:class:`Recorder` is a ``TorchDispatchMode``: it sees each op below autograd, after Python-level
composites (``linear``, ``matmul``, ``einsum``, ``@``, ``F.scaled_dot_product_attention``) have
dispatched to what really runs. Each op becomes one ``call_function`` node whose arguments are the
nodes that produced its input tensors (the dataflow), so later stages can follow Q, K and V through
views, transposes and splits. Parameters and buffers enter as ``get_attr`` nodes named by their
qualified names; forward inputs and other outside tensors as ``placeholder`` nodes.

``node.meta`` holds:

- ``module``: path of the innermost module call running the op (``""`` is the root);
- ``module_stack``: the :class:`~flopscope.module_tracker.ModuleCall` frames, outermost first;
- ``input_shapes`` / ``output_shapes``: shapes of the tensor arguments / outputs, in order;
- ``dtype``: dtype of the first tensor output (``None`` if there is none);
- ``multiplies``: MACs of the op (0 for ops without a formula); ``multiply_parts``: the formula's
  ``{part: MACs}`` split for fused ops, else ``None``;
- ``elementwise``: ``(category, ops)`` for elementwise work, else ``None``;
- ``cost``: ``"formula"``, ``"elementwise"``, ``"zero"`` or ``"unsupported"``;
- ``seconds``: wall time of the op (real mode only);
- ``phase``: ``"forward"`` or ``"backward"``; a backward op also has ``forward``: the forward node whose
  autograd node ran it (matched by autograd sequence number), whose module stack it inherits;
- ``value``: for small integer / boolean tensors whose values are known (index lists such as
  ``x[..., [-1], :]``; real-mode results), a copy of the values, so later stages can replay indexing.

Ops run only while a module of the profiled model is on the stack are recorded.
"""

from __future__ import annotations

import operator
import time
import weakref
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from . import elementwise, formulas
from .formulas import FormulaRegistry, shape_of
from .module_tracker import ModuleTracker


@dataclass(frozen=True, slots=True)
class OpFailure:
    """Where an op raised: the op, the innermost module path and the shapes of its tensor inputs."""

    op: str
    module: str
    input_shapes: tuple[tuple[int, ...], ...]

    def describe(self) -> str:
        shapes = ", ".join(str(list(s)) for s in self.input_shapes) or "no tensor inputs"
        return f"op {self.op} in module '{self.module}' with input shapes {shapes}"


def _classify(func: Any, registry: FormulaRegistry) -> tuple[Any, Any, str]:
    """(formula, elementwise rule, cost) of an op; cost "decompose" means: try ``func.decompose()`` first."""
    formula = registry.get(func)
    if formula is not None:
        return formula, None, "formula"
    if elementwise.is_zero_cost(func):
        return None, None, "zero"
    rule = elementwise.rule_for(func)
    if rule is not None:
        return None, rule, "elementwise"
    return None, None, "decompose"


def op_name(func: Any) -> str:
    """``"aten.mm"`` for ``torch.ops.aten.mm.default``."""
    return str(getattr(func, "overloadpacket", func))


class Entry:
    """One recorded op (or outside tensor) before it becomes an fx node: the fx graph is built only when
    someone asks for it (:func:`build_graph`), since counting totals needs only the metadata."""

    __slots__ = ("args", "kind", "kwargs", "meta", "name", "target")

    def __init__(self, kind: str, target: Any, args: Any, kwargs: Any, name: str, meta: dict[str, Any]) -> None:
        self.kind, self.target, self.args, self.kwargs, self.name, self.meta = kind, target, args, kwargs, name, meta


def build_graph(entries: list[Entry]) -> fx.Graph:
    """The fx graph of the recorded entries, in order; ``node.meta`` is the entry's metadata (with a
    backward node's ``forward`` pointing at the forward *node*)."""
    graph = fx.Graph()
    nodes: dict[int, fx.Node] = {}

    def node_of(x: Any) -> Any:
        if isinstance(x, Entry):
            return nodes[id(x)]
        if isinstance(x, (tuple, list)):
            return type(x)(node_of(v) for v in x)
        if isinstance(x, dict):
            return {k: node_of(v) for k, v in x.items()}
        return x

    for entry in entries:
        node = graph.create_node(entry.kind, entry.target, node_of(entry.args), node_of(entry.kwargs),
                                 name=entry.name)
        node.meta = entry.meta
        nodes[id(entry)] = node
    for entry in entries:
        forward = entry.meta.get("forward")
        if isinstance(forward, Entry):
            entry.meta["forward"] = nodes[id(forward)]
    return graph


class Recorder(TorchDispatchMode):
    """Records ops as :class:`Entry` s while the tracker's model is running (:meth:`graph` builds fx).

    ``leaf_names`` maps ``id(tensor)`` to ``(node op, name, leaf kind)`` for the tensors that enter the
    forward from outside: ``("get_attr", "encoder.weight", "parameter" | "buffer")`` or
    ``("placeholder", "input_ids", "input")``. Other outside tensors become ``placeholder`` nodes of
    kind ``"constant"``; the kind is in ``node.meta["leaf"]``.
    """

    def __init__(self, tracker: ModuleTracker, registry: FormulaRegistry,
                 leaf_names: Mapping[int, tuple[str, str, str]]) -> None:
        super().__init__()
        self.entries: list[Entry] = []
        self.tracker = tracker
        self.registry = registry
        self.leaf_names = dict(leaf_names)
        self.unsupported: Counter[str] = Counter()
        self.decomposed: Counter[str] = Counter()
        self.failure: OpFailure | None = None
        self.backward = False  # set while the backward pass runs: record ops outside any module call
        self.timed = False  # record each op's wall time (real execution on the CPU: ops are synchronous)
        self.fake = False  # running on fake tensors: FAKE_SHAPE_RULES stand in for over-strict fake kernels
        self._producers: dict[int, tuple[weakref.ref[torch.Tensor], Entry]] = {}
        self._by_sequence_nr: dict[int, Entry] = {}  # autograd sequence number -> forward entry
        self._classes: dict[Any, tuple[Any, Any, str]] = {}  # op -> (formula, elementwise rule, cost)

    def graph(self) -> fx.Graph:
        """The recorded ops as an fx graph (built anew on each call)."""
        return build_graph(self.entries)

    def add_leaf_names(self, leaf_names: Mapping[int, tuple[str, str, str]]) -> None:
        self.leaf_names.update(leaf_names)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        stack = self.tracker.stack
        forward_node = None
        if self.backward and not stack:
            forward_node = self._forward_node()
            stack = forward_node.meta["module_stack"] if forward_node is not None else ()
        elif not stack:
            return func(*args, **kwargs)
        if func in elementwise.METADATA_OPS or not isinstance(func, torch._ops.OpOverload):
            return func(*args, **kwargs)
        known = self._classes.get(func)
        if known is None:
            known = self._classes[func] = _classify(func, self.registry)
        formula, rule, cost = known
        if cost == "decompose":
            with self:
                decomposed = func.decompose(*args, **kwargs)
            if decomposed is not NotImplemented:
                self.decomposed[op_name(func)] += 1
                return decomposed
            self._classes[func] = (None, None, "unsupported")
            cost = "unsupported"
        start = time.perf_counter()
        try:
            out = func(*args, **kwargs)
        except Exception:
            maker = FAKE_SHAPE_RULES.get(func.overloadpacket) if self.fake else None
            if maker is None:
                if self.failure is None:
                    path = stack[-1].path if stack else ""
                    self.failure = OpFailure(op_name(func), path, _shapes((args, kwargs)))
                raise
            out = maker(*args, **kwargs)  # a fake kernel stricter than the real one: make the output here
        seconds = time.perf_counter() - start
        node = self._add_node(func, args, kwargs, out, stack)
        meta = node.meta
        if self.timed:
            meta["seconds"] = seconds
        if self.backward:
            meta["phase"] = "backward"
            meta["forward"] = forward_node
        else:
            meta["phase"] = "forward"
            if torch.is_grad_enabled() and _any_requires_grad((args, kwargs)):
                # the autograd node of this op was created just before it was dispatched here
                self._by_sequence_nr[torch.autograd._get_sequence_nr() - 1] = node
        meta["cost"] = cost
        meta["multiplies"] = 0
        meta["multiply_parts"] = None
        meta["elementwise"] = None
        if formula is not None:
            macs = formulas.count(formula, args, kwargs, _first_shape(out))
            meta["multiplies"] = formulas.total_of(macs)
            if not isinstance(macs, int):
                meta["multiply_parts"] = dict(macs)
        elif rule is not None:
            meta["elementwise"] = (rule.category, elementwise.elementwise_ops(rule, args, out))
        elif cost == "unsupported":
            self.unsupported[op_name(func)] += 1
        return out

    def _forward_node(self) -> Entry | None:
        """The forward entry whose autograd node is running now (backward pass), if it was recorded."""
        grad_fn = torch._C._current_autograd_node()
        return None if grad_fn is None else self._by_sequence_nr.get(grad_fn._sequence_nr())

    # ---------------------------------------------------------------------------------------------
    def _add_node(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                  stack: tuple[Any, ...]) -> Entry:
        shapes: list[tuple[int, ...]] = []

        def to_entry(t: torch.Tensor) -> Entry:
            shapes.append(shape_of(t))
            return self._entry_of(t)

        meta: dict[str, Any] = {}
        entry = Entry("call_function", func, _map_tensors(args, to_entry), _map_tensors(kwargs, to_entry),
                      func.overloadpacket.__name__, meta)
        self.entries.append(entry)
        meta["module"] = stack[-1].path if stack else None
        meta["module_stack"] = stack
        meta["input_shapes"] = tuple(shapes)
        if isinstance(out, torch.Tensor):
            meta["output_shapes"] = (shape_of(out),)
            meta["dtype"] = out.dtype
            if out.dtype in _INDEX_DTYPES and out.numel() <= _MAX_VALUE_NUMEL:
                meta["value"] = _known_value(out)
            self._producers[id(out)] = (weakref.ref(out), entry)
        else:
            outs = out if isinstance(out, (tuple, list)) else ()
            shapes, dtype = [], None
            for i, item in enumerate(outs):
                if isinstance(item, torch.Tensor):
                    shapes.append(shape_of(item))
                    dtype = dtype or item.dtype
                    getter = Entry("call_function", operator.getitem, (entry, i), {}, f"{entry.name}_{i}", {
                        "phase": "backward" if self.backward else "forward", "module": meta["module"],
                        "module_stack": stack, "cost": "zero", "multiplies": 0, "multiply_parts": None,
                        "elementwise": None, "input_shapes": (), "output_shapes": (shapes[-1],),
                        "dtype": item.dtype})
                    self.entries.append(getter)
                    self._producers[id(item)] = (weakref.ref(item), getter)
            meta["output_shapes"] = tuple(shapes)
            meta["dtype"] = dtype
        return entry

    def _entry_of(self, t: torch.Tensor) -> Entry:
        known = self._producers.get(id(t))
        if known is not None and known[0]() is t:
            return known[1]
        kind, name, leaf = self.leaf_names.get(id(t), ("placeholder", "constant", "constant"))
        meta: dict[str, Any] = {"leaf": leaf, "module": None, "module_stack": (), "cost": "zero", "multiplies": 0,
                "multiply_parts": None, "elementwise": None, "input_shapes": (), "output_shapes": (shape_of(t),),
                "dtype": t.dtype}
        if t.dtype in _INDEX_DTYPES and t.numel() <= _MAX_VALUE_NUMEL:
            meta["value"] = _known_value(t)
        entry = Entry(kind, name, (), {}, name.replace(".", "_"), meta)
        self.entries.append(entry)
        self._producers[id(t)] = (weakref.ref(t), entry)
        return entry


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


FAKE_SHAPE_RULES: dict[Any, Callable[..., Any]] = {torch.ops.aten._grouped_mm: _grouped_mm_output}
"""Output makers for ops whose fake kernel rejects what the real kernel runs (used only if it raises)."""

_INDEX_DTYPES = (torch.int64, torch.int32, torch.bool)
_MAX_VALUE_NUMEL = 4096


def _known_value(t: torch.Tensor) -> torch.Tensor | None:
    """The values of a small index tensor: a real tensor's own, a fake tensor's constant if it has one."""
    source: torch.Tensor | None = t.constant if isinstance(t, FakeTensor) else t
    if source is None or source.is_meta:
        return None
    with _disable_current_modes():  # a copy of real data, not a fake tensor of the mode below us
        return source.detach().clone()


def _map_tensors(x: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """Replace tensors inside (nested) tuples, lists and dicts by ``fn(tensor)``."""
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, (tuple, list)):
        if not any(isinstance(v, _CONTAINERS) for v in x):
            return x  # sizes, strides, dims: nothing to map
        mapped = [_map_tensors(v, fn) for v in x]
        return tuple(mapped) if isinstance(x, tuple) else mapped
    if isinstance(x, dict):
        return {k: _map_tensors(v, fn) for k, v in x.items()} if x else x
    return x


_CONTAINERS = (torch.Tensor, tuple, list, dict)


def _any_requires_grad(x: Any) -> bool:
    found: list[bool] = []
    _map_tensors(x, lambda t: found.append(t.requires_grad))
    return any(found)


def _shapes(x: Any) -> tuple[tuple[int, ...], ...]:
    """Shapes of the tensors inside ``x``, in order."""
    found: list[tuple[int, ...]] = []
    _map_tensors(x, lambda t: found.append(shape_of(t)))
    return tuple(found)


def _first_shape(out: Any) -> tuple[int, ...] | None:
    if isinstance(out, torch.Tensor):
        return shape_of(out)
    if isinstance(out, (tuple, list)):
        for item in out:
            if isinstance(item, torch.Tensor):
                return shape_of(item)
    return None
