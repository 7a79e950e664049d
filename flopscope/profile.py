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

from .errors import FlopscopeError

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


class Profile:
    """Counts of one profiled run (or of every forward inside a :func:`flopscope.profiler` block).

    Build it with :func:`flopscope.profile`; the constructor is internal.
    """

    def __init__(self, graph: fx.Graph, module_paths: list[str], module_calls: Mapping[str, int],
                 unsupported: Mapping[str, int], mode: str, output: Any = None,
                 notes: list[str] | None = None, decomposed: Mapping[str, int] | None = None) -> None:
        self._set(graph, module_paths, module_calls, unsupported, mode, output, notes, decomposed)

    def _set(self, graph: fx.Graph, module_paths: list[str], module_calls: Mapping[str, int],
             unsupported: Mapping[str, int], mode: str, output: Any, notes: list[str] | None,
             decomposed: Mapping[str, int] | None) -> None:
        self._graph = graph
        self._module_paths = list(module_paths)
        self._module_calls = dict(module_calls)
        self._unsupported = dict(unsupported)
        self._decomposed = dict(decomposed or {})
        self._mode = mode
        self._output = output
        self._notes = list(notes or [])
        records: list[OpRecord] = []
        elementwise: Counter[str] = Counter()
        elementwise_by_op: Counter[str] = Counter()
        for node in graph.nodes:
            meta = node.meta
            cost = meta.get("cost")
            if cost == "formula":
                records.append(OpRecord(
                    op=str(node.target.overloadpacket), module=meta["module"],
                    module_stack=tuple(frame.path for frame in meta["module_stack"]),
                    call=meta["module_stack"][-1].call, input_shapes=meta["input_shapes"],
                    output_shapes=meta["output_shapes"], multiplies=meta["multiplies"],
                    parts=meta["multiply_parts"], node=node.name))
            elif cost == "elementwise":
                category, ops = meta["elementwise"]
                elementwise[category] += ops
                elementwise_by_op[str(node.target.overloadpacket)] += ops
        self._records = tuple(records)
        self._elementwise = dict(elementwise)
        self._elementwise_by_op = dict(elementwise_by_op)
        self._ready = True

    # ---------------------------------------------------------------------------------------------
    # what was captured
    @property
    def graph(self) -> fx.Graph:
        """The captured ``torch.fx`` graph (one node per ATen op; see :mod:`flopscope.capture`)."""
        self._check_ready()
        return self._graph

    @property
    def records(self) -> tuple[OpRecord, ...]:
        """Every op with a multiply formula, in execution order."""
        self._check_ready()
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
    def notes(self) -> list[str]:
        """One line per thing worth knowing about the run (fall-back to real mode, decompositions)."""
        return list(self._notes)

    # ---------------------------------------------------------------------------------------------
    # totals
    def total(self, module: str = "") -> int:
        """Multiply-accumulates (MACs) of linear-algebra work (matmul, conv, attention, recurrent GEMMs),
        of the whole run (``module=""``) or of one module, inclusive of its submodules."""
        self._check_ready()
        if module == "":
            return sum(r.multiplies for r in self._records)
        self._check_module(module)
        return sum(r.multiplies for r in self._records if module in r.module_stack)

    def total_flops(self, module: str = "") -> int:
        """Floating-point operations of the same work: ``2 * total(module)`` (1 MAC = 2 FLOPs)."""
        return 2 * self.total(module)

    def by_module(self) -> dict[str, int]:
        """MACs per module path, inclusive of submodules, for every module of the model (0 where none);
        ``by_module()[""] == total()``. A module called several times sums its calls."""
        self._check_ready()
        out = dict.fromkeys(self._module_paths, 0)
        for r in self._records:
            for path in set(r.module_stack):
                out[path] = out.get(path, 0) + r.multiplies
        return out

    def by_op(self) -> dict[str, int]:
        """MACs per ATen op (``"aten.mm"``, ``"aten._scaled_dot_product_flash_attention_for_cpu"``)."""
        self._check_ready()
        out: Counter[str] = Counter()
        for r in self._records:
            out[r.op] += r.multiplies
        return dict(out)

    by_operator = by_op  # fvcore's name

    def by_module_and_op(self) -> dict[str, dict[str, int]]:
        """``{module path: {op: MACs}}``, inclusive of submodules."""
        self._check_ready()
        out: dict[str, Counter[str]] = defaultdict(Counter)
        for r in self._records:
            for path in set(r.module_stack):
                out[path][r.op] += r.multiplies
        return {path: dict(out[path]) for path in self._module_paths if path in out}

    def op_calls(self) -> dict[str, int]:
        """How many times each counted op ran."""
        self._check_ready()
        return dict(Counter(r.op for r in self._records))

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
                f"({self.total_flops():,} FLOPs), {len(self._records)} counted ops, "
                f"{sum(self._unsupported.values())} unsupported calls>")

    def _check_ready(self) -> None:
        if not getattr(self, "_ready", False):
            raise FlopscopeError("the profiler is still recording: query it after the `with` block")

    def _check_module(self, module: str) -> None:
        if module not in self._module_paths:
            raise FlopscopeError(f"no module with path {module!r} in the profiled model")
