"""Which module call is running: a stack of module paths kept by forward pre/post hooks.

The hooks are the global module hooks of ``torch.nn`` (removable handles, no patching).
Per-module hooks would change what runs: ``nn.TransformerEncoderLayer`` leaves its fused
eval fast path when any of its submodules carries a hook. Modules outside the profiled
model are ignored, and so are calls made by other threads than the one that entered the
tracker (global hooks fire in every thread): those are counted in
:attr:`ModuleTracker.foreign_calls` instead.

A frame of the stack is a :class:`ModuleCall`: the module's path (``""`` is the root)
and the ordinal of this call of that path, so a module called twice is attributed per
call.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.nn.modules import module as nn_module

from ..formulas.registry import shape_of


class ModuleCall(NamedTuple):
    path: str  # "encoder.layer.0.attention"; "" is the root module
    call: int  # 1 for the first call of this path in the profile, 2 for the second, ...


class ModuleTracker:
    """Context manager keeping :attr:`stack`, the tuple of module calls now running
    (outermost first), and :attr:`inputs`: per module call, the shapes of its tensor
    arguments (by position or keyword)."""

    def __init__(self, root: nn.Module, *, ranges: bool = False) -> None:
        self.paths: dict[int, str] = {id(m): name for name, m in root.named_modules()}
        self.stack: tuple[ModuleCall, ...] = ()
        self.calls: Counter[str] = Counter()
        self.inputs: dict[ModuleCall, tuple[tuple[int | str, tuple[int, ...]], ...]] = {}
        # outermost calls of the model's modules made by other threads while tracking
        self.foreign_calls = 0
        # call number of the root module -> wall time of that call
        self.root_seconds: dict[int, float] = {}
        self._root_start = 0.0
        # backward pass: a module called now re-runs its forward (activation
        # checkpointing)
        self.replaying = False
        # open a torch.profiler range (record_function "flopscope/<path>") per module
        # call
        self.ranges = ranges
        self._open: list[Any] = []  # the ranges now open, innermost last
        # per other thread: how many of its calls are running
        self._foreign_depth = threading.local()
        self._failed_in: dict[int, tuple[ModuleCall, ...]] = {}
        self._handles: list[Any] = []
        self._thread = threading.get_ident()
        # told of each module call that returns (module, its call, args, kwargs,
        # output): flopscope.capture.undispatched
        self.on_return: Callable[[nn.Module, ModuleCall, tuple[Any, ...], dict[str, Any], Any], None] | None = None
        self._roots = [root]
        # id(parameter) -> (not a Linear, path)
        self._holders: dict[int, list[tuple[bool, str]]] | None = None

    @property
    def roots(self) -> tuple[nn.Module, ...]:
        """The modules whose calls are attributed (the model, and its shadow)."""
        return tuple(self._roots)

    def add_paths(self, root: nn.Module) -> None:
        """Also attribute the calls of ``root``'s modules (the same paths: a model and
        its shadow)."""
        for name, module in root.named_modules():
            self.paths.setdefault(id(module), name)
        self._roots.append(root)
        self._holders = None

    def holder_of(self, t: Any) -> str | None:
        """The path of a module holding ``t`` (or the tensor ``t`` views) as a
        parameter: a ``Linear`` first (a tied ``lm_head``, not the embedding sharing
        its weight), then the first by path; ``None`` for a tensor no module holds."""
        if self._holders is None:
            self._holders = {}
            for root in self._roots:
                for name, module in root.named_modules():
                    for p in module._parameters.values():
                        if p is not None:
                            self._holders.setdefault(id(p), []).append((not isinstance(module, nn.Linear), name))
        found = self._holders.get(id(t))
        # a view of it (``weight.squeeze(1)``)
        if not found and isinstance(t, torch.Tensor) and t._base is not None:
            found = self._holders.get(id(t._base))
        return min(found)[1] if found else None

    def call_of(self, path: str, stack: tuple[ModuleCall, ...]) -> tuple[ModuleCall, ...]:
        """A new call of the module at ``path`` made inside the calls of ``stack`` that
        hold it (its ancestors): the stack of work done for a module that was not
        called (a fused kernel computing with its weight)."""
        self.calls[path] += 1
        ancestors = tuple(c for c in stack if c.path == "" or path.startswith(c.path + "."))
        return (*ancestors, ModuleCall(path, self.calls[path]))

    @contextmanager
    def inside(self, path: str | None) -> Iterator[None]:
        """For the block, ops run in a new call of the module at ``path``
        (:meth:`call_of`): a fused kernel's step that is that module's work
        (Mamba-2's fused scan computes ``out_proj``'s product with its weight); a
        no-op for ``None`` (a weight no module holds)."""
        if path is None or not self.stack or self.stack[-1].path == path:
            yield
            return
        saved = self.stack
        self.stack = self.call_of(path, saved)
        try:
            yield
        finally:
            self.stack = saved

    def __enter__(self) -> ModuleTracker:
        self._thread = threading.get_ident()
        self._handles = [
            nn_module.register_module_forward_pre_hook(self._pre),
            nn_module.register_module_forward_hook(self._post, with_kwargs=True, always_call=True),
        ]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
            # torch's handle does not know the with_kwargs table its hook id was also
            # put in (it leaks one entry per registration): remove it here, so profiles
            # leave every global hook table as it was
            nn_module._global_forward_hooks_with_kwargs.pop(handle.id, None)
        self._handles = []
        while self._open:  # a forward that raised past its hooks
            self._open.pop().__exit__(None, None, None)
        self.stack = ()

    def failed_in(self, error: BaseException) -> tuple[ModuleCall, ...]:
        """The module calls that were running when ``error`` was raised (innermost
        last), if seen."""
        return self._failed_in.get(id(error), ())

    def _pre(self, module: nn.Module, args: Any) -> None:
        path = self.paths.get(id(module))
        if path is None:
            return
        if threading.get_ident() != self._thread:
            depth = getattr(self._foreign_depth, "value", 0)
            self._foreign_depth.value = depth + 1
            if depth == 0:  # the outermost call of that thread: the model or one of its submodules
                self.foreign_calls += 1
            return
        # a re-run is not a new call: it keeps the number of the last forward call
        if not self.replaying:
            self.calls[path] += 1
        self.stack = (*self.stack, ModuleCall(path, self.calls[path]))
        if self.ranges:
            span = torch.autograd.profiler.record_function(f"flopscope/{path or '(root)'}")
            span.__enter__()
            self._open.append(span)
        if path == "" and len(self.stack) == 1:
            self._root_start = time.perf_counter()

    def _post(self, module: nn.Module, args: Any, *rest: Any) -> None:
        # (kwargs, output) normally; torch calls always-called hooks of a raising
        # forward with (output,) only
        path = self.paths.get(id(module))
        if path is None:
            return
        if threading.get_ident() != self._thread:
            self._foreign_depth.value = max(0, getattr(self._foreign_depth, "value", 0) - 1)
            return
        kwargs = rest[0] if len(rest) == 2 else {}
        if path == "" and len(self.stack) == 1 and not self.replaying:
            self.root_seconds[self.stack[0].call] = time.perf_counter() - self._root_start
        if self.stack and self.stack[-1].path == path and not self.replaying:
            shapes = [(i, shape_of(a)) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
            shapes += [(k, shape_of(v)) for k, v in (kwargs or {}).items() if isinstance(v, torch.Tensor)]
            self.inputs[self.stack[-1]] = tuple(shapes)
        error = sys.exc_info()[1]  # set while the always-called hook runs for a raising forward
        if (self.on_return is not None and error is None and len(rest) == 2 and self.stack
                and self.stack[-1].path == path and not self.replaying):
            self.on_return(module, self.stack[-1], args, kwargs or {}, rest[1])
        if error is not None and id(error) not in self._failed_in:
            self._failed_in[id(error)] = self.stack
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i].path == path:
                # close this call's range (and any left open inside)
                while self.ranges and len(self._open) > i:
                    self._open.pop().__exit__(None, None, None)
                self.stack = self.stack[:i]
                return

