"""Floors: the least work a counter of each kind must do, timed beside flopscope to show what a target allows.

- :class:`OpRecorder`: a dispatch mode that keeps, per ATen op, the op, its tensor arguments' shapes and the innermost
  module running it (kept by global forward hooks), and nothing else: no dataflow, no formula, no bytes.
- :class:`DataflowRecorder`: the same, and each tensor argument mapped to the record of the op that made it (by
  ``id``, checked through a weak reference, as any dataflow recorder must): the least a counter that attributes work
  through the captured dataflow does per op.
- :func:`bare_decode_steps`: decode steps of a causal LM on fake tensors with nothing recorded (a plain
  ``FakeTensorMode``, the model built inside it, a ``DynamicCache``): the least a count that runs each step costs.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode


class OpRecorder(TorchDispatchMode):
    """Per op: ``(op, input shapes, innermost module)``, appended to :attr:`ops`."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[Any] = []
        self.stack: tuple[nn.Module, ...] = ()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.ops.append((func, [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)],
                         self.stack[-1] if self.stack else None))
        return out


class _Record:
    __slots__ = ("args", "func", "out_shapes", "shapes", "stack")


class DataflowRecorder(OpRecorder):
    """Per op: a record holding the op, its arguments with each tensor replaced by its producer's record (or the
    tensor itself, a leaf), input and output shapes and the module stack; outputs registered as made by it."""

    def __init__(self) -> None:
        super().__init__()
        self._producers: dict[int, tuple[weakref.ref[torch.Tensor], _Record]] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        producers, shapes = self._producers, []

        def mapped(a: Any) -> Any:
            if isinstance(a, torch.Tensor):
                shapes.append(tuple(a.shape))
                found = producers.get(id(a))
                return found[1] if found is not None and found[0]() is a else a
            if isinstance(a, (list, tuple)):
                return [mapped(v) for v in a]
            return a

        record = _Record()
        record.func, record.stack = func, self.stack
        record.args = [mapped(a) for a in args]
        record.shapes = tuple(shapes)
        outs = [out] if isinstance(out, torch.Tensor) else [o for o in (
            out if isinstance(out, (tuple, list)) else ()) if isinstance(o, torch.Tensor)]
        record.out_shapes = tuple(tuple(o.shape) for o in outs)
        for o in outs:
            producers[id(o)] = (weakref.ref(o), record)
        self.ops.append(record)
        return out


@contextmanager
def recording(recorder: OpRecorder) -> Iterator[OpRecorder]:
    """``recorder`` active, its module stack kept by global forward hooks (as a per-module counter keeps it)."""

    def enter(module: nn.Module, args: Any) -> None:
        recorder.stack = (*recorder.stack, module)

    def leave(module: nn.Module, args: Any, out: Any) -> None:
        recorder.stack = recorder.stack[:-1]

    hooks = [register_module_forward_pre_hook(enter), register_module_forward_hook(leave)]
    try:
        with recorder:
            yield recorder
    finally:
        for hook in hooks:
            hook.remove()


def recorded(kind: type[OpRecorder], call: Callable[[], Any]) -> Callable[[], int]:
    """A variant for :func:`rounds.rounds`: ``call`` under a fresh recorder of ``kind``; returns the ops recorded."""

    def run() -> int:
        with recording(kind()) as recorder:
            call()
        return len(recorder.ops)

    return run


def bare_decode_steps(make_model: Callable[[], nn.Module], prompt: int, steps: int) -> list[float]:
    """Wall seconds of each of ``steps`` greedy decode steps (one new token, batch 1) after a ``prompt``-token prefill
    of the causal LM ``make_model()`` builds, on fake tensors, nothing recorded."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import DynamicCache

    seconds = []
    with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
        model = make_model().eval()
        cache = DynamicCache(config=model.config)
        model(torch.zeros(1, prompt, dtype=torch.long), past_key_values=cache, use_cache=True)
        for _ in range(steps):
            start = time.perf_counter()
            model(torch.zeros(1, 1, dtype=torch.long), past_key_values=cache, use_cache=True)
            seconds.append(time.perf_counter() - start)
    return seconds
