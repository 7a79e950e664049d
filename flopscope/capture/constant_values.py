"""Values that follow from a capture's own records: a tensor made from sizes and
constants alone, evaluated again, for real, on the CPU, in any mode.

A causal mask built as ``torch.ones(n, n, dtype=torch.bool).tril()``, the one SDPA's
composite math path builds for ``is_causal=True`` (what runs on ``meta``),
``torch.full((n, n), -inf).triu(1)`` or ``arange(n)[:, None] >= arange(n)`` has the same
values whatever the run executed on: real tensors, fake tensors or meta tensors.
:class:`ConstantValues` answers such a record's values by running its records again on
CPU tensors, from the constructors up, so what is priced from them
(:mod:`flopscope.predict.attention`) is the same number on every path. A record is
evaluable when every input is: a constructor that reads no memory and draws no random
numbers, an op without a multiply formula (views, copies, comparisons, elementwise
arithmetic, in-place writes of an evaluable tensor) over evaluable inputs, or a record
whose values the run kept (:attr:`CapturedOp.value`). Anything computed from the model's
parameters or inputs is not.

Evaluation is memoised by the records' recipe (target, constant arguments, inputs'
recipes), so the identical masks of a model's layers are made once. A tensor of more
than :data:`MAX_BYTES` bytes is not made.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Hashable
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

from .recorder import UNINITIALISED
from .records import CapturedOp, Cost, after_write

MAX_BYTES = 1 << 26
"""The most bytes one evaluated tensor may have (64 MiB: a boolean causal mask over
8,192 positions, a float32 one over 4,096)."""

_MAX_DEPTH = 64  # the longest chain of records followed back to constructors
_UNKNOWN: Any = object()  # memo entry of a record whose values cannot be evaluated


class ConstantValues:
    """``values(record)``: the values of a record's output when they follow from the
    capture alone, else ``None``.

    Values are real CPU tensors (shared between calls: never write to them); a
    multi-output op's are a list.
    """

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        # id(record) -> its recipe (None: not evaluable)
        self._recipes: dict[int, Hashable | None] = {}
        self._values: dict[Hashable, Any] = {}  # recipe -> values (or _UNKNOWN)
        # the records keyed by id() above, kept alive while this object is
        self._held: list[CapturedOp] = []
        self._depth = 0  # records being keyed (recursion over inputs)
        self.too_large = 0  # tensors not made because they have more than max_bytes bytes

    def __call__(self, op: Any) -> torch.Tensor | None:
        value = self._evaluate(op)
        return value if isinstance(value, torch.Tensor) else None

    # ---------------------------------------------------------------------------------------------
    def _evaluate(self, op: Any) -> Any:
        if not isinstance(op, CapturedOp):
            return None
        if op.value is not None:
            return op.value
        recipe = self._recipe(op)
        if recipe is None:
            return None
        found = self._values.get(recipe)
        if found is None:
            # real CPU values, whatever modes the caller runs in
            with _disable_current_modes(), torch.no_grad():
                found = self._run(op)
            self._values[recipe] = _UNKNOWN if found is None else found
        return None if found is _UNKNOWN else found

    def _run(self, op: CapturedOp) -> Any:
        target = op.target
        if target is operator.getitem:
            parent = self._evaluate(op.args[0])
            return parent[op.args[1]] if isinstance(parent, list) else None
        # the value a tensor holds after a write: evaluable when the write was to it
        # whole
        if target is after_write:
            producer, write = op.args
            if not (isinstance(write, CapturedOp) and write.args and write.args[0] is producer):
                return None
            return self._evaluate(write)
        if not isinstance(target, torch._ops.OpOverload) or not self._fits(op):
            return None
        try:
            args, kwargs = _lift(op.args, self._evaluate), _lift(op.kwargs, self._evaluate)
        except _UnknownValueError:
            return None
        if any(argument.name == "device" for argument in target._schema.arguments):
            kwargs["device"] = torch.device("cpu")
            kwargs.pop("pin_memory", None)
        # an in-place write: onto a copy (the values of its input are shared)
        if target._schema.is_mutable:
            args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        try:
            out = target(*args, **kwargs)
        except (RuntimeError, TypeError, ValueError, IndexError, NotImplementedError):
            return None
        if isinstance(out, torch.Tensor):
            return out if out.device.type == "cpu" else None
        if isinstance(out, (tuple, list)) and all(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in out):
            return list(out)
        return None

    def _fits(self, op: CapturedOp) -> bool:
        """An op that may run again here: no multiply formula, no memory read
        uninitialised, no random draw, every output of a known size within
        :attr:`max_bytes`."""
        target = op.target
        if (op.cost not in (Cost.ZERO, Cost.ELEMENTWISE) or target.overloadpacket in UNINITIALISED
                or torch.Tag.nondeterministic_seeded in target.tags):
            return False
        itemsize = op.dtype.itemsize if op.dtype is not None else 8
        for shape in op.output_shapes:
            if not all(isinstance(size, int) for size in shape):
                return False  # (a symbolic size)
            if math.prod(shape) * itemsize > self.max_bytes:
                self.too_large += 1
                return False
        return True

    def _recipe(self, op: CapturedOp) -> Hashable | None:
        """A hashable description of how ``op``'s values are made (``None``: not from
        constants alone)."""
        key = id(op)
        if key in self._recipes:
            return self._recipes[key]
        # (a cycle cannot occur in a capture; this also stops a malformed one)
        self._recipes[key] = None
        self._held.append(op)
        recipe = None
        if op.node_op == "call_function" and op.cost in (Cost.ZERO, Cost.ELEMENTWISE) and self._depth < _MAX_DEPTH:
            self._depth += 1
            try:
                parts = [_constant(op.target), _constant(op.args, self._recipe),
                         _constant(op.kwargs, self._recipe)]
            finally:
                self._depth -= 1
            if all(part is not _UNKNOWN for part in parts):
                recipe = (*parts, op.output_shapes)
        self._recipes[key] = recipe
        return recipe


def _constant(value: Any, recipe_of: Any = None) -> Any:
    """``value`` (an argument) as a hashable recipe part, records by their recipe;
    ``_UNKNOWN`` if it has none."""
    if isinstance(value, CapturedOp):
        if value.value is not None:
            return ("value", id(value))  # (a record whose values the run kept: its own)
        found = recipe_of(value) if recipe_of is not None else None
        return _UNKNOWN if found is None else found
    if isinstance(value, (list, tuple)):
        items = tuple(_constant(item, recipe_of) for item in value)
        return _UNKNOWN if any(item is _UNKNOWN for item in items) else items
    if isinstance(value, dict):
        items = tuple((k, _constant(v, recipe_of)) for k, v in value.items() if k not in ("device", "pin_memory"))
        return _UNKNOWN if any(item is _UNKNOWN for _, item in items) else items
    if isinstance(value, torch.device):
        return "device"
    if isinstance(value, torch.Tensor):
        return _UNKNOWN
    try:
        hash(value)
    except TypeError:
        return _UNKNOWN
    return value


class _UnknownValueError(Exception):
    """An argument's values are not known."""


def _lift(value: Any, evaluate: Any) -> Any:
    """``value`` with every record replaced by its values (raises
    :class:`_UnknownValueError` if one has none)."""
    if isinstance(value, CapturedOp):
        found = evaluate(value)
        if found is None:
            raise _UnknownValueError
        return found
    if isinstance(value, (list, tuple)):
        items = [_lift(item, evaluate) for item in value]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        return {k: _lift(v, evaluate) for k, v in value.items()}
    return value
