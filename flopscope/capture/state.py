"""Leave the user's model exactly as it was: snapshot before a profile, restore after
(even on error).

What is restored: every module's attribute dict (attributes a forward added are removed,
replaced ones put back), its parameter / buffer / submodule tables, its training flag,
each parameter's ``requires_grad`` and ``.grad`` (after a counted backward pass), and,
when the run executed for real, the values of buffers the forward changed in place
(BatchNorm running statistics in training mode).

What is not restored, but reported: a parameter whose values a real forward changed in
place (its version counter moved; cloning every parameter to restore it would double the
model's memory). :meth:`ModelSnapshot.restore` never raises: each step runs even when
another fails, and what failed is returned, so a restore can neither mask the forward's
own error nor skip the rest.

With ``tables=False`` (fake mode, where a shadow of the model runs and the user's
objects are never written) only ``.grad`` is saved and restored: a TorchScript submodule
runs its own parameters even on fake tensors.

TorchScript modules keep their tables in C++ (they cannot be changed from Python code):
only their training flag, ``requires_grad``, ``.grad`` and buffer values are restored.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn


def named_state(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Every parameter and buffer of ``model`` by its qualified name (a tied or shared
    tensor under each name)."""
    return itertools.chain(model.named_parameters(remove_duplicate=False),
                           model.named_buffers(remove_duplicate=False))


class ModelSnapshot:
    def __init__(self, model: nn.Module, *, buffer_values: bool, grads: bool = False,
                 tables: bool = True) -> None:
        modules = list(model.modules()) if tables else []
        self._tables = [(m, dict(m.__dict__), dict(m._parameters), dict(m._buffers),
                         dict(m._modules))
                        for m in modules if not isinstance(m, torch.jit.ScriptModule)]
        # hook tables are changed in place (register_forward_hook during a forward):
        # their contents
        hook_tables = [table for m, *_ in self._tables for name, table in vars(m).items()
                       if "hook" in name and isinstance(table, dict)]
        self._hooks = [(table, dict(table)) for table in hook_tables if table]
        # most: checked for emptiness only
        self._empty_hooks = [table for table in hook_tables if not table]
        self._training = [(m, m.training) for m in modules]
        named = list(model.named_parameters()) if tables or grads else []
        self._requires_grad = [(p, p.requires_grad) for _, p in named] if tables else []
        # inference tensors have no version counter (a model built under
        # torch.inference_mode)
        self._versions = [(name, p, p._version) for name, p in named if tables and not p.is_inference()]
        self._grads = [(p, p.grad) for _, p in named] if grads else []
        # a counted backward accumulates into fresh tensors, not into these
        for p, _ in self._grads:
            p.grad = None
        self._buffers: list[tuple[torch.Tensor, torch.Tensor]] = []
        if buffer_values:
            with torch.no_grad():
                self._buffers = [(b, b.clone()) for b in model.buffers() if not b.is_meta]

    def restore(self) -> list[str]:
        """Put everything back; returns one line per step that failed (empty when all
        went well)."""
        failed: list[str] = []

        def step(what: str, action: Callable[..., object], *args: Any) -> None:
            try:
                action(*args)
            # a restore step must not stop the others nor mask the run's error
            except Exception as error:
                failed.append(f"{what}: {type(error).__name__}: {error}")

        # only what changed is put back (most of a model is never touched): a profile's
        # fixed cost
        for module, attrs, params, buffers, children in self._tables:
            tables = ((module.__dict__, attrs, "attributes"),
                      (module._parameters, params, "parameters"),
                      (module._buffers, buffers, "buffers"),
                      (module._modules, children, "submodules"))
            for current, before, table in tables:
                if not _unchanged(current, before):
                    step(f"{type(module).__name__} {table}", _restore_dict, current, before)
        for hooks, saved_hooks in self._hooks:
            if not _unchanged(hooks, saved_hooks):
                step("a hook table", _restore_dict, hooks, saved_hooks)
        for hooks in self._empty_hooks:
            if hooks:
                step("a hook table", hooks.clear)
        for module, training in self._training:
            if module.training is not training:
                step(f"{type(module).__name__} training flag", setattr, module, "training",
                     training)
        for p, grad in self._grads:
            step("a parameter's .grad", setattr, p, "grad", grad)
        for p, requires_grad in self._requires_grad:
            if p.requires_grad != requires_grad:
                step("a parameter's requires_grad", p.requires_grad_, requires_grad)
        with torch.no_grad():
            for b, saved in self._buffers:  # kernels such as batch norm do not bump _version
                step("a buffer's values", b.copy_, saved)
        return failed

    def changed_parameters(self) -> list[str]:
        """Names of the parameters whose values were changed in place since the
        snapshot."""
        return [name for name, p, version in self._versions if p._version != version]


def _unchanged(current: dict[str, Any], saved: dict[str, Any]) -> bool:
    """The same keys, in the same order, holding the same objects."""
    return (len(current) == len(saved) and all(map(operator.is_, current.values(), saved.values()))
            and list(current) == list(saved))


def _restore_dict(current: dict[str, Any], saved: dict[str, Any]) -> None:
    for key in [k for k in current if k not in saved]:
        del current[key]
    for key, value in saved.items():
        if current.get(key, _MISSING) is not value:
            current[key] = value


_MISSING = object()
