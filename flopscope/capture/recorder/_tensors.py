"""The tensors in an op's arguments: found inside nested containers, their shapes, the
storage each lives on and the arguments an op writes.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ...formulas.registry import shape_of
from ..records import CapturedOp

Producers = dict[int, tuple[weakref.ref[torch.Tensor], CapturedOp]]
"""``id(tensor)`` -> (the tensor, the record of its value): the recorder's dataflow."""


def map_tensors(x: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """Replace tensors inside (nested) tuples, lists and dicts by ``fn(tensor)``."""
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, (tuple, list)):
        mapped = [fn(v) if isinstance(v, torch.Tensor) else map_tensors(v, fn) if isinstance(v, _NESTED) else v
                  for v in x]
        return tuple(mapped) if isinstance(x, tuple) else mapped
    if isinstance(x, dict):
        return {k: map_tensors(v, fn) for k, v in x.items()} if x else x
    return x


_NESTED = (tuple, list, dict)


def tensors(x: Any) -> list[torch.Tensor]:
    """The tensors inside (nested) tuples, lists and dicts, in order."""
    found: list[torch.Tensor] = []
    map_tensors(x, found.append)
    return found


def any_requires_grad(x: Any) -> bool:
    return any(t.requires_grad for t in tensors(x))


def shapes(x: Any) -> tuple[tuple[int, ...], ...]:
    """Shapes of the tensors inside ``x``, in order."""
    return tuple(shape_of(t) for t in tensors(x))


def first_shape(out: Any) -> tuple[int, ...] | None:
    """The shape of ``out``, or of the first tensor in a tuple or list ``out``."""
    if isinstance(out, torch.Tensor):
        return shape_of(out)
    if isinstance(out, (tuple, list)):
        for item in out:
            if isinstance(item, torch.Tensor):
                return shape_of(item)
    return None


def storage_of(t: torch.Tensor) -> int:
    """The identity of ``t``'s storage (views of one tensor share it); ``id(t)`` where
    it has none."""
    try:
        return int(t.untyped_storage()._cdata)
    except (RuntimeError, NotImplementedError):
        return id(t)


class WrittenArguments:
    """The arguments each op writes: its schema's mutable arguments (``self`` of an
    in-place op, ``out=``). Read from the schema once per op."""

    def __init__(self) -> None:
        self._positions: dict[Any, tuple[str | int, ...]] = {}

    def positions(self, func: Any) -> tuple[str | int, ...]:
        """Positions (or names, for keyword-only arguments) of the arguments ``func``
        writes."""
        positions = self._positions.get(func)
        if positions is None:
            # a higher-order op has no schema
            schema = getattr(func, "_schema", None)
            arguments = schema.arguments if schema is not None else ()
            positions = self._positions[func] = tuple(
                i if not a.kwarg_only else a.name for i, a in enumerate(arguments)
                if a.alias_info is not None and a.alias_info.is_write)
        return positions

    def tensors(self, func: Any, args: tuple[Any, ...],
                kwargs: Mapping[str, Any]) -> list[torch.Tensor]:
        """The tensors ``func`` writes to, among ``args`` and ``kwargs``."""
        found: list[torch.Tensor] = []
        positions = self._positions.get(func)
        for at in positions if positions is not None else self.positions(func):
            value = (args[at] if at < len(args) else None) if isinstance(at, int) else kwargs.get(at)
            found.extend(v for v in (value if isinstance(value, (list, tuple)) else (value,))
                         if isinstance(v, torch.Tensor))
        return found
