"""How each op is counted: :class:`OpClass`, worked out once per op overload.

An op with a formula is counted by it, a collective by its message, an elementwise op by
its rule; an op without any is tried as its decomposition first, and listed as
unsupported if it has none. Metadata queries run unrecorded. The recorder keeps an
:class:`OpClass` per op overload (:func:`class_of` fills its cache).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from ...formulas import collectives, elementwise, traffic
from ...formulas.elementwise import EMBEDDING_LOOKUPS, ElementwiseRule
from ...formulas.registry import FormulaRegistry, OpSpec
from ..records import Cost


@dataclass(frozen=True, slots=True)
class OpClass:
    """How one op overload is counted (classified once per recorder)."""

    cost: Cost
    spec: OpSpec | None = None
    rule: ElementwiseRule | None = None
    decompose: bool = False
    """No formula and no rule: try ``func.decompose()`` first."""
    collective: str | None = None
    """The kind of collective (``Cost.COMMUNICATION``)."""
    name: str = "op"
    """The packet's name, the stem of its nodes' names."""
    passed: bool = False
    """A metadata query or a callable that is no op: run, not recorded."""
    access: str = traffic.ANY
    """How it touches its tensors (``traffic.access_of``)."""
    checked: bool = False
    """Fake tensors: checked as the real kernel would (operand dtypes, lookup
    indices)."""
    constructor: bool = False
    """Makes a tensor from no tensor, on the device its ``device`` argument names."""


OP_TYPES = (torch._ops.OpOverload, torch._ops.HigherOrderOperator)
UNSUPPORTED = OpClass(Cost.UNSUPPORTED)
PASSED = OpClass(Cost.ZERO, passed=True)


def class_of(cache: dict[int, OpClass], func: Any, registry: FormulaRegistry) -> OpClass:
    """How ``func`` is counted, kept in ``cache`` by ``id(func)`` if ``func`` is an op
    (the recorder's look-up of ``cache`` comes first: this is its miss)."""
    found = classify(func, registry)
    # another callable may not live long: its id could be reused
    if isinstance(func, OP_TYPES):
        cache[id(func)] = found
    return found


def classify(func: Any, registry: FormulaRegistry) -> OpClass:
    """How ``func`` is counted."""
    if func in elementwise.METADATA_OPS or not isinstance(func, OP_TYPES):
        return PASSED
    found = _classify_op(func, registry)
    return dataclasses.replace(found, name=getattr(packet(func), "__name__", "op"),
                               access=traffic.access_of(func),
                               checked=found.spec is not None or packet(func) in EMBEDDING_LOOKUPS,
                               constructor=_is_constructor(func))


def packet(func: Any) -> Any:
    """An op overload's packet (``aten.mm`` for ``aten.mm.default``); a higher-order op
    is its own."""
    return getattr(func, "overloadpacket", func)


def _is_constructor(func: Any) -> bool:
    """An op with a ``device`` argument and no tensor argument (``zeros``, ``randn``,
    ``arange``, ``full``, ...)."""
    arguments = getattr(getattr(func, "_schema", None), "arguments", ())
    return any(a.name == "device" for a in arguments) and not any("Tensor" in str(a.type) for a in arguments)


def _classify_op(func: Any, registry: FormulaRegistry) -> OpClass:
    spec = registry.spec(func)
    if spec is not None:
        return OpClass(Cost.FORMULA, spec=spec)
    # without a formula: run as it is, listed as unsupported
    if isinstance(func, torch._ops.HigherOrderOperator):
        return UNSUPPORTED
    kind = collectives.kind_of(func)
    if kind is not None:
        return OpClass(Cost.COMMUNICATION, collective=kind)
    if elementwise.is_zero_cost(func) or collectives.is_bookkeeping(func):
        return OpClass(Cost.ZERO)
    rule = elementwise.rule_for(func)
    if rule is not None:
        return OpClass(Cost.ELEMENTWISE, rule=rule)
    return OpClass(Cost.UNSUPPORTED, decompose=True)
