"""Leave the user's model exactly as it was: snapshot before a profile, restore after (even on error).

What is restored: every module's attribute dict (attributes a forward added are removed, replaced ones
put back), its parameter / buffer / submodule tables, its training flag, each parameter's
``requires_grad`` and ``.grad`` (after a counted backward pass), and, when the run executed for real,
the values of buffers the forward changed in place (BatchNorm running statistics in training mode).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class ModelSnapshot:
    def __init__(self, model: nn.Module, *, buffer_values: bool, grads: bool = False) -> None:
        self._modules = [
            (m, dict(m.__dict__), dict(m._parameters), dict(m._buffers), dict(m._modules), m.training)
            for m in model.modules()
        ]
        self._requires_grad = [(p, p.requires_grad) for p in model.parameters()]
        self._grads = [(p, p.grad) for p in model.parameters()] if grads else []
        for p, _ in self._grads:  # a counted backward accumulates into fresh tensors, not into these
            p.grad = None
        self._buffers: list[tuple[torch.Tensor, torch.Tensor]] = []
        if buffer_values:
            with torch.no_grad():
                self._buffers = [(b, b.clone()) for b in model.buffers() if not b.is_meta]

    def restore(self) -> None:
        for module, attrs, params, buffers, children, training in self._modules:
            _restore_dict(module.__dict__, attrs)
            _restore_dict(module._parameters, params)
            _restore_dict(module._buffers, buffers)
            _restore_dict(module._modules, children)
            module.training = training
        for p, grad in self._grads:
            p.grad = grad
        for p, requires_grad in self._requires_grad:
            if p.requires_grad != requires_grad:
                p.requires_grad_(requires_grad)
        with torch.no_grad():
            for b, saved in self._buffers:  # kernels such as batch norm do not bump _version
                b.copy_(saved)


def _restore_dict(current: dict[str, Any], saved: dict[str, Any]) -> None:
    if current.keys() == saved.keys() and all(current[k] is v for k, v in saved.items()):
        return
    for key in [k for k in current if k not in saved]:
        del current[key]
    for key, value in saved.items():
        if current.get(key, _MISSING) is not value:
            current[key] = value


_MISSING = object()
