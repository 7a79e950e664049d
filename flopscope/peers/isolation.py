"""Each peer run so that it cannot harm the next: what a counter leaves behind is found,
undone and reported.

Counters that patch functions (DeepSpeed's flops profiler and calflops replace
``F.linear``, ``torch.matmul``, ``torch.Tensor.__matmul__``, ...) or add hooks undo that
only when the forward returns: after a forward that raises, the patches stay for
whatever runs next in the process (a second start then wraps the wrapper, and its counts
grow on every run), and the hooks stay on the model. :func:`isolated` snapshots what a
counter could change before it runs (the functions of ``torch``,
``torch.nn.functional``, ``torch.Tensor`` and of the other namespaces named, torch's
global module hooks, the hooks of every copy of the model made for the peer) and, after
it, puts back every function that is not the original, removes the global hooks it added
and lists all of it in :attr:`Isolation.leaks`, one line per finding. The copies
themselves are discarded by the cross-check.
"""

from __future__ import annotations

import contextlib
import threading
import types
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

_SHORT = {"torch.nn.functional": "F", "torch.Tensor": "Tensor"}
_HOOK_TABLES = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
_GLOBAL_HOOK_TABLES = ("_global_forward_hooks", "_global_forward_pre_hooks",
                       "_global_backward_hooks",
                       "_global_backward_pre_hooks")


def _namespaces(extra: Iterable[Any] = ()) -> dict[str, Any]:
    spaces: dict[str, Any] = {"torch": torch, "torch.nn.functional": F,
                              "torch.Tensor": torch.Tensor}
    for space in extra:
        spaces[getattr(space, "__name__", repr(space))] = space
    return spaces


def short_name(space: str, attribute: str) -> str:
    """``("torch.nn.functional", "linear")`` -> ``"F.linear"``; ``("torch.Tensor",
    "__matmul__")`` -> ``"Tensor.__matmul__"``; ``("torch", "matmul")`` ->
    ``"torch.matmul"``."""
    return f"{_SHORT.get(space, space)}.{attribute}"


@dataclass
class Functions:
    """The callables of some namespaces at one moment, by name (``vars`` of each,
    callables only)."""

    spaces: Mapping[str, Any]
    saved: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def snapshot(cls, extra: Iterable[Any] = ()) -> Functions:
        """The functions of ``torch``, ``torch.nn.functional``, ``torch.Tensor`` and the
        ``extra`` namespaces."""
        spaces = _namespaces(extra)
        return cls(spaces, {name: {k: v for k, v in vars(space).items() if callable(v)}
                            for name, space in spaces.items()})

    def changed(self) -> list[tuple[str, str]]:
        """``(namespace, attribute)`` of every saved function that is no longer the same
        object."""
        out: list[tuple[str, str]] = []
        for name, space in self.spaces.items():
            now = vars(space)
            out.extend((name, attribute) for attribute, fn in self.saved[name].items() if now.get(attribute) is not fn)
        return out

    def patched(self) -> list[str]:
        """:meth:`changed` as short names (``"F.linear"``, ``"torch.matmul"``,
        ``"Tensor.__matmul__"``)."""
        return [short_name(space, attribute) for space, attribute in self.changed()]

    def restore(self) -> list[str]:
        """Put every changed function back; the short names of those put back."""
        changed = self.changed()
        for space, attribute in changed:
            setattr(self.spaces[space], attribute, self.saved[space][attribute])
        return [short_name(space, attribute) for space, attribute in changed]


def hook_count(model: nn.Module) -> int:
    """Forward, forward-pre, backward and backward-pre hooks on the modules of ``model``
    (each module once)."""
    return sum(len(getattr(m, table, None) or {}) for m in model.modules() for table in _HOOK_TABLES)


def _global_hooks() -> dict[str, set[int]]:
    from torch.nn.modules import module

    return {table: set(getattr(module, table, {})) for table in _GLOBAL_HOOK_TABLES}


def _remove_global_hooks(before: Mapping[str, set[int]]) -> int:
    from torch.nn.modules import module

    removed = 0
    for table in _GLOBAL_HOOK_TABLES:
        hooks = getattr(module, table, None)
        if hooks is None:
            continue
        for key in [k for k in hooks if k not in before[table]]:
            del hooks[key]
            removed += 1
            for flags in ("_global_forward_hooks_always_called",
                          "_global_forward_hooks_with_kwargs"):
                getattr(module, flags, {}).pop(key, None)
    return removed


@dataclass
class Isolation:
    """What :func:`isolated` found after the block: one line per leak (``[]``: the peer
    left nothing)."""

    leaks: list[str] = field(default_factory=list)


_COPIES = threading.local()


def track_copy(twin: nn.Module, original: nn.Module) -> None:
    """Note a copy of the model made for the peer running in this thread, with the hooks
    it started with (those of ``original``), so that :func:`isolated` can tell which
    hooks the peer left on it."""
    copies = getattr(_COPIES, "list", None)
    if copies is not None:
        copies.append((twin, hook_count(original)))


@contextlib.contextmanager
def isolated(model: nn.Module, extra: Iterable[types.ModuleType] = ()) -> Iterator[Isolation]:
    """Run a peer inside the block; afterwards (also when it raised) restore what it
    left patched, remove the global module hooks it added, and report both, the hooks it
    left on its copies of ``model`` (noted by :func:`track_copy`) and any hook it added
    to ``model`` itself (removed: the caller's model stays as it was). ``extra``:
    namespaces beyond ``torch``, ``torch.nn.functional`` and ``torch.Tensor`` that the
    peer may patch."""
    functions = Functions.snapshot(extra)
    global_hooks = _global_hooks()
    own_hooks = {id(m): {t: dict(getattr(m, t, None) or {}) for t in _HOOK_TABLES} for m in model.modules()}
    outer, _COPIES.list = getattr(_COPIES, "list", None), []
    result = Isolation()
    try:
        yield result
    finally:
        copies, _COPIES.list = _COPIES.list, outer
        restored = functions.restore()
        if restored:
            result.leaks.append(f"left {', '.join(restored)} patched (restored)")
        removed = _remove_global_hooks(global_hooks)
        if removed:
            result.leaks.append(f"left {removed} global module hook{'s' * (removed != 1)} (removed)")
        added = _remove_new_hooks(model, own_hooks)
        if added:
            result.leaks.append(f"added {added} hook{'s' * (added != 1)} to the model itself "
                                "(removed)")
        left = sum(max(hook_count(twin) - start, 0) for twin, start in copies)
        if left:
            result.leaks.append(f"left {left} hook{'s' * (left != 1)} on its copy of the model "
                                "(discarded)")


def _remove_new_hooks(model: nn.Module,
                      before: Mapping[int, Mapping[str, Mapping[int, Any]]]) -> int:
    removed = 0
    for m in model.modules():
        saved = before.get(id(m), {})
        for table in _HOOK_TABLES:
            hooks = getattr(m, table, None)
            if hooks is None:
                continue
            for key in [k for k in hooks if k not in saved.get(table, {})]:
                del hooks[key]
                removed += 1
    return removed
