"""Validators for the arguments of flopscope's own functions: one function per rule,
each raising a :class:`~flopscope.errors.FlopscopeError` subclass that names the
argument and its value."""

from __future__ import annotations

import inspect
import types
import weakref
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..errors import ConfigurationError, InputError, NotAModuleError
from .fake import loaded_dtensor


def check_positive(**values: int) -> None:
    """Every named value is an integer >= 1 (``check_positive(n=n, d=d)``)."""
    for name, value in values.items():
        if value < 1:
            raise ConfigurationError(f"{name} must be >= 1; got {value}")


def check_heads(d: int, h: int) -> None:
    """``h`` heads split the width ``d`` evenly (each head is ``d / h`` wide)."""
    check_positive(d=d, h=h)
    if d % h:
        raise ConfigurationError(f"d={d} must be divisible by h={h} (heads split the width)")


def check_model(model: Any) -> None:
    if not isinstance(model, nn.Module):
        raise NotAModuleError("flopscope profiles torch.nn.Module objects; got "
                              f"{type(model).__name__}")
    check_process_group(model)


def check_process_group(model: nn.Module) -> None:
    """A model holding DTensors (sharded with torch.distributed) runs only inside its
    job: its collectives need the process group it was sharded on."""
    DTensor = loaded_dtensor()
    if DTensor is None or torch.distributed.is_initialized():
        return
    for name, tensor in model.named_parameters():
        if isinstance(tensor, DTensor):
            mesh = getattr(tensor, "device_mesh", None)
            raise ConfigurationError(
                f"parameter '{name}' of {type(model).__name__} is a DTensor on mesh {mesh}, but no "
                "process group is initialised: profile it inside the job that sharded it (or "
                "inside flopscope.distributed.fake_world)")


def check_mode(mode: str, allowed: Sequence[str], what: str = "mode") -> None:
    """``mode`` is one of ``allowed``."""
    if mode not in allowed:
        raise ConfigurationError(f"{what} must be one of {', '.join(map(repr, allowed))}; got "
                                 f"{mode!r}")


_SIGNATURES: weakref.WeakKeyDictionary[Any, inspect.Signature] = weakref.WeakKeyDictionary()


def forward_signature(model: nn.Module) -> inspect.Signature | None:
    """The signature of ``model.forward`` (``None`` if it has none), read once per
    forward function: reading one costs more than a small model's whole fake count."""
    forward = model.forward
    func = getattr(forward, "__func__", None) if getattr(forward, "__self__", None) is model else None
    # (a callable object may not be hashable)
    func = func if isinstance(func, types.FunctionType) else None
    signature = _SIGNATURES.get(func) if func is not None else None
    if signature is None:
        try:
            signature = inspect.signature(forward)
        except (TypeError, ValueError):
            return None
        if func is not None:
            _SIGNATURES[func] = signature
    return signature


def check_inputs(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """The inputs bind to ``model.forward``'s signature (else an :class:`InputError`
    listing them)."""
    signature = forward_signature(model)
    if signature is None:
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as e:
        given = ", ".join([describe(a) for a in args] + [f"{k}={describe(v)}" for k, v in kwargs.items()])
        raise InputError(f"inputs do not fit {type(model).__name__}.forward{signature}: {e} "
                         f"(given: {given})") from e


def describe(x: Any) -> str:
    """``Tensor[2, 8]`` for a tensor, the type name of anything else (for error
    messages)."""
    return f"Tensor{list(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
