"""The lists and dicts a call is given and changes (a cache: ``feat_idx[0] += 1``).

:func:`lists_and_dicts` finds them in a call's arguments, each once, and says which
arguments are one list: a call whose lists alias otherwise than the template's is
captured. A first call's changes are found by comparing what they hold before and after
it (:func:`changes`). Each is kept as a :class:`Change`, which a replay makes again on
its own call's lists and dicts (:func:`apply`). The refusals of a change a replay could
not make the same are in :mod:`._refusals` (``containers.changes``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..recorder import Window
from ._refusals import DICT_KEYS, FOREIGN_TENSOR_LEFT, NEW_OBJECT_LEFT
from .attribute_reads import StandIn
from .key import PLAIN

Contents = tuple[tuple[Any, ...] | None, tuple[Any, ...]]
"""What a list or dict holds: its keys (``None`` for a list) and its values, in order."""


def contents(container: list[Any] | dict[Any, Any]) -> Contents:
    if isinstance(container, dict):
        return tuple(container), tuple(container.values())
    return None, tuple(container)


def lists_and_dicts(value: Any) -> tuple[list[list[Any] | dict[Any, Any]], tuple[int, ...]]:
    """The lists and dicts inside ``value`` (through tuples, lists and dicts), each
    once, in the order first met; and for each one met, its position among them (two
    arguments may be one list: a replay changes it once)."""
    found: list[list[Any] | dict[Any, Any]] = []
    at: dict[int, int] = {}
    met: list[int] = []

    def visit(v: Any) -> None:
        if isinstance(v, (list, dict)):
            first = id(v) not in at
            met.append(at.setdefault(id(v), len(found)))
            if not first:
                return
            found.append(v)
        if isinstance(v, (list, tuple)):
            for item in v:
                visit(item)
        elif isinstance(v, dict):
            for item in v.values():
                visit(item)

    visit(value)
    return found, tuple(met)


@dataclass(frozen=True)
class Change:
    """A list or dict a call was given and changed, as a replay changes it:
    ``container`` its position among the arguments' lists and dicts
    (:func:`lists_and_dicts`), ``keys`` a dict's keys after the call (``None``: a
    list), ``items`` its values after the call, each where a replay finds it:
    ``("was", j)`` the j-th value it held before the call, ``("input", i)`` the i-th
    tensor argument, ``("made", k)`` the k-th tensor the call made and left in a list
    or dict (remade as outputs are), ``("plain", value)`` a plain value."""

    container: int
    keys: tuple[Any, ...] | None
    items: tuple[tuple[str, Any], ...]

    def apply(self, container: list[Any] | dict[Any, Any], before: Contents,
              tensors: list[torch.Tensor],
              made: list[torch.Tensor]) -> None:
        sources = {"was": before[1], "input": tensors, "made": made}
        values = [at if kind == "plain" else sources[kind][at] for kind, at in self.items]
        if isinstance(container, dict):
            container.clear()
            container.update(zip(self.keys or (), values, strict=True))
        else:
            container[:] = values


def changes(found: list[list[Any] | dict[Any, Any]], held: list[Contents],
            tensors: list[torch.Tensor],
            window: Window) -> tuple[tuple[Change, ...], list[torch.Tensor]]:
    """How a call changed the lists and dicts it was given (``found``; ``held``: what
    they held before it), and the tensors it made and left in them; raises
    :class:`~._refusals.Refused` for a change a replay could not make the same (a new
    list or object put in one, a tensor it did not make, a dict key that is no plain
    value)."""
    inputs = {id(t): i for i, t in enumerate(tensors)}
    made: list[torch.Tensor] = []
    made_at: dict[int, int] = {}
    changed = []
    for position, (container, (keys, values)) in enumerate(zip(found, held, strict=True)):
        now_keys, now = contents(container)
        if now_keys == keys and len(now) == len(values) and all(a is b for a, b in zip(now, values, strict=True)):
            continue
        if now_keys is not None and not all(isinstance(k, PLAIN) for k in now_keys):
            raise DICT_KEYS.refused()
        items: list[tuple[str, Any]] = []
        for value in now:
            if isinstance(value, torch.Tensor):
                if id(value) in inputs:
                    items.append(("input", inputs[id(value)]))
                    continue
                if not window.allocated(value):
                    raise FOREIGN_TENSOR_LEFT.refused()
                items.append(("made", made_at.setdefault(id(value), len(made))))
                if len(made_at) > len(made):
                    made.append(value)
            elif isinstance(value, PLAIN) and type(value) is not StandIn:
                items.append(("plain", value))
            else:
                was = next((j for j, v in enumerate(values) if v is value), None)
                if was is None:
                    raise NEW_OBJECT_LEFT.refused(kind=type(value).__name__)
                items.append(("was", was))
        changed.append(Change(position, now_keys, tuple(items)))
    return tuple(changed), made


def apply(changed: tuple[Change, ...], given: tuple[tuple[Any, ...], dict[str, Any]],
          tensors: list[torch.Tensor],
          made: list[torch.Tensor]) -> None:
    """Change the lists and dicts of a replayed call's ``(args, kwargs)`` as the
    template's call changed its own: ``tensors`` the call's tensor arguments,
    ``made`` the tensors made for those the template's call left."""
    found = lists_and_dicts(given)[0]
    held = [contents(c) for c in found]
    for change in changed:
        change.apply(found[change.container], held[change.container], tensors, made)
