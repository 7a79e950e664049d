"""Which tensor arguments of an ATen op it takes but does not read the values of, for
the arguments it was given.

A real run's check for memory filled outside the dispatcher
(:mod:`flopscope.capture.undispatched`) flags an op that reads an ``empty`` no recorded
op wrote; an argument whose values the op never reads is no such read. Two rules, from
PyTorch's documented semantics (no list of models):

- **metadata only**: a factory named ``*_like`` or ``new_*`` (``empty_like``,
  ``zeros_like``, ``full_like``, ``new_zeros``, ...) reads its ``self``'s shape, dtype
  and device, never its values;
- **scaled by zero**: ``addmm``, ``baddbmm``, ``addbmm``, ``addmv``, ``addr``,
  ``sspaddmm`` and ``_addmm_activation`` compute ``beta * self + alpha * (product)``,
  and "if beta is 0, then input will be ignored, and nan and inf in it will not be
  propagated" (their docs): ``self`` is not read when ``beta == 0`` (diffusers' classic
  ``AttnProcessor`` computes its scores as ``baddbmm(torch.empty(...), q, k.T, beta=0,
  alpha=scale)``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

aten = torch.ops.aten

_IGNORED_WHEN_ZERO: dict[Any, tuple[str, str]] = {
    packet: ("self", "beta") for packet in (aten.addmm, aten.baddbmm, aten.addbmm, aten.addmv,
                                            aten.addr,
                                            aten.sspaddmm, aten._addmm_activation)}
"""``{op packet: (argument not read, the scalar argument that, when 0, makes it so)}``."""

def _metadata_only(func: torch._ops.OpOverload) -> bool:
    """A ``*_like`` / ``new_*`` factory: its ``self`` gives only shape, dtype and
    device."""
    name = func.overloadpacket.__name__
    return name.endswith("_like") or name.startswith("new_")


def _position(schema: Any, name: str) -> int | None:
    return next((i for i, a in enumerate(schema.arguments) if a.name == name), None)


def _value(func: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: Mapping[str, Any],
           name: str) -> Any:
    """The value ``func`` was given for its argument ``name`` (positional or keyword),
    else its schema's default."""
    schema = func._schema
    at = _position(schema, name)
    if at is None:
        return None
    argument = schema.arguments[at]
    if not argument.kwarg_only and at < len(args):
        return args[at]
    return kwargs.get(name, argument.default_value)


def unread_tensors(func: Any, args: tuple[Any, ...],
                   kwargs: Mapping[str, Any]) -> list[torch.Tensor]:
    """The tensors among ``func``'s arguments (``args`` / ``kwargs`` as dispatched)
    whose values this call does not read (the rules of the module docstring); ``[]``
    for most ops, a higher-order op or one without a schema."""
    if not isinstance(func, torch._ops.OpOverload):
        return []
    names: list[str] = []
    if _metadata_only(func):
        names.append("self")
    rule = _IGNORED_WHEN_ZERO.get(func.overloadpacket)
    if rule is not None:
        argument, scale = rule
        beta = _value(func, args, kwargs, scale)
        if isinstance(beta, (int, float, complex)) and beta == 0:
            names.append(argument)
    found: list[torch.Tensor] = []
    for name in names:
        value = _value(func, args, kwargs, name)
        if isinstance(value, torch.Tensor):
            found.append(value)
    return found
