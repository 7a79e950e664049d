"""Fake tensors for counting without computing: the model's state and inputs as ``FakeTensor``\\ s.

Tensors on ``device="meta"`` become fake *CPU* tensors, so a model built on meta takes the same
kernels (and is counted the same) as one built on the CPU.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
    UnsupportedFakeTensorException,
    UnsupportedOperatorException,
    _BypassDispatchCache,
)
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

from .errors import FakeTensorError, cause_of_kind

NEEDS_REAL_DATA = (DataDependentOutputException, DynamicOutputShapeException, GuardOnDataDependentSymNode,
                   UnsupportedOperatorException)
"""Exceptions meaning "this model needs real tensor data here", not "this model is wrong"."""


class CountingFakeTensorMode(FakeTensorMode):
    """The fake mode of a capture. Its dispatch cache (torch's, shared by every fake mode of the process and
    keyed on an op's arguments) skips ops with a TorchScript-object argument: packed quantized weights come
    in a fresh wrapper on every call and cannot be compared (their ``__eq__`` raises). ``_cache_key`` and
    ``_BypassDispatchCache`` are torch's private hook for exactly this; here is the one place that uses it."""

    def _cache_key(self, state: Any, func: Any, args: Any, kwargs: Any) -> Any:
        if any(isinstance(a, torch.ScriptObject) for a in (*args, *kwargs.values())):
            raise _BypassDispatchCache("script object argument")
        return super()._cache_key(state, func, args, kwargs)


class FakeConverter:
    """Converts real or meta tensors to fake ones (memoised, so tied weights stay tied)."""

    def __init__(self, mode: FakeTensorMode) -> None:
        self.mode = mode
        self._memo: dict[int, torch.Tensor] = {}
        self._keep: list[torch.Tensor] = []  # keeps sources alive so their ids stay unique

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        fake = self._memo.get(id(t))
        if fake is None:
            if t.is_meta:
                with self.mode:
                    fake = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu")
                fake.requires_grad_(t.requires_grad)
            elif t.requires_grad and not t.is_leaf:  # its history is outside the model: a leaf that needs grad
                fake = self.mode.from_tensor(t.detach()).requires_grad_(True)
            else:
                try:
                    fake = self.mode.from_tensor(t)
                except UnsupportedFakeTensorException as error:  # quantized tensors, among others
                    where = f"a {t.dtype} tensor of shape {list(t.shape)}"
                    raise FakeTensorError(f"{where} cannot be a fake tensor ({error}); use mode='real'",
                                          on_fake_tensors=True, where=where, reason=str(error)) from error
            self._memo[id(t)] = fake
            self._keep.append(t)
        return fake


def map_tensors(obj: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """Apply ``fn`` to every tensor in nested tuples, named tuples, lists, dicts and dataclasses."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_make"):  # named tuple (PackedSequence among them)
        return obj._make(map_tensors(v, fn) for v in obj)
    if isinstance(obj, (tuple, list)):
        return type(obj)(map_tensors(v, fn) for v in obj)
    if isinstance(obj, dict):
        mapped = {k: map_tensors(v, fn) for k, v in obj.items()}
        try:
            return type(obj)(mapped)
        except Exception:  # a dict subclass with its own constructor
            return mapped
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {f.name: map_tensors(getattr(obj, f.name), fn) for f in dataclasses.fields(obj) if f.init}
        return dataclasses.replace(obj, **changes)
    return obj


def tensors_in(obj: Any) -> list[torch.Tensor]:
    """The tensors inside ``obj`` (the structures of :func:`map_tensors`), in order."""
    found: list[torch.Tensor] = []

    def collect(t: torch.Tensor) -> torch.Tensor:
        found.append(t)
        return t

    map_tensors(obj, collect)
    return found


def needs_real_data(error: BaseException) -> BaseException | None:
    """The fake-tensor limitation behind ``error`` (itself or a cause in its chain), if any."""
    return cause_of_kind(error, NEEDS_REAL_DATA)


_CONTAINERS = (list, dict, set)


def shadow_of(model: nn.Module, convert: Callable[[torch.Tensor], torch.Tensor]) -> nn.Module:
    """A stand-in for ``model`` to run on fake tensors: every module is shallow-copied with its own attribute
    dict, its own parameter / buffer / submodule tables holding ``convert(t)`` of each tensor, and its own
    copy of each list / dict / set attribute. Running the shadow never writes to the user's module objects
    (other threads may run the model meanwhile), and nothing it stores in a container outlives the run.
    Shared modules and tied weights stay shared (``convert`` is memoised). A TorchScript module runs its
    own compiled parameters, so it is its own shadow (the fake mode converts them as they are read)."""
    if isinstance(model, torch.jit.ScriptModule):
        return model
    copies: dict[int, nn.Module] = {}

    def shadow(module: nn.Module) -> nn.Module:
        known = copies.get(id(module))
        if known is not None:
            return known
        twin = object.__new__(type(module))  # not copy.copy: parametrized modules refuse to be pickled
        twin.__dict__.update(module.__dict__)
        copies[id(module)] = twin
        attrs = twin.__dict__
        for name, value in list(attrs.items()):
            if type(value) in _CONTAINERS and not name.startswith("_"):
                attrs[name] = copy.copy(value)
        attrs["_parameters"] = {k: None if p is None else convert(p) for k, p in module._parameters.items()}
        attrs["_buffers"] = {k: None if b is None else convert(b) for k, b in module._buffers.items()}
        attrs["_modules"] = {k: None if m is None else shadow(m) for k, m in module._modules.items()}
        return twin

    return shadow(model)
