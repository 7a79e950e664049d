"""Triton kernels launched from plain Python functions (``kernel[grid](*args)``),
outside any ``autograd.Function`` the catalog wraps
(:mod:`flopscope.capture.catalog`): mamba-ssm's ``selective_state_update``, fla's
``fused_recurrent_kda``, and any other kernel. transformers binds such functions by
value when a model's module is imported, so no name is left to wrap; the launch is
the boundary every one of them crosses.

While a profile runs, in its thread, the ``[grid]`` of every ``@triton.jit`` kernel
(autotuned or not: ``triton.runtime.jit.KernelInterface.__getitem__``) is wrapped. A
launch inside the model's module calls is one record: priced where the catalog has an
entry for the kernel's name (:data:`PREFIX` + the ``@triton.jit`` function's name as the
entry's ``function``; its formula reads the launch's arguments by the kernel's parameter
names), else listed by :meth:`Profile.unsupported()
<flopscope.profile.Profile.unsupported>` as ``"triton kernel <name>"``: never a silent
zero. On fake tensors and meta it is not launched (Triton cannot launch on them); its
outputs are the buffers its caller allocated. The tensors it writes (the entry's
``writes``; for a kernel without an entry, its arguments that an ``empty`` made and
nothing wrote yet) are written by its record, so the ops reading them read its work.
Launches inside a catalog Function run as they are: the Function's record covers them.
flopscope imports no Triton: nothing is wrapped unless a library has imported it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

from ..errors import RunError
from .recorder import Recorder

PREFIX = "triton:"
"""How a catalog entry names the Triton kernel it prices:
``"triton:_selective_scan_update_kernel"``."""

UNKNOWN = "triton kernel "
"""The prefix of an unpriced launch's key in ``Profile.unsupported()``."""

_original: list[Any] = []  # KernelInterface.__getitem__ while wrapped


class UnpricedLaunch:
    """The record target of a launch of a kernel the catalog does not price (an fx
    node's target: callable)."""

    def __init__(self, name: str) -> None:
        self.name = UNKNOWN + name
        self.__name__ = self.__qualname__ = name  # (as fx prints a call's target)

    def __str__(self) -> str:
        return self.name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RunError(f"{self.name} is a launch's record: it is listed, not run again")


_unpriced: dict[str, UnpricedLaunch] = {}


def install(entry_of: Callable[[str], Any], recorder_of: Callable[[], Recorder | None]) -> None:
    """Wrap Triton's launches (if Triton is imported): ``entry_of(name)`` is the
    catalog's kernel for a ``@triton.jit`` function's name (or ``None``),
    ``recorder_of()`` this thread's recorder (``None`` in another thread)."""
    jit = sys.modules.get("triton.runtime.jit")
    interface = getattr(jit, "KernelInterface", None)
    if interface is None or _original:
        return
    original = interface.__getitem__
    _original.append(original)

    def launch_of(kernel: Any, grid: Any) -> Any:
        launch = original(kernel, grid)
        recorder = recorder_of()
        if recorder is None or not recorder.recording:
            return launch

        def counted(*args: Any, **kwargs: Any) -> Any:
            name, parameters = _named(kernel)
            named = {**dict(zip(parameters, args, strict=False)), **kwargs}
            result = None if recorder.fake else launch(*args, **kwargs)
            entry = entry_of(name)
            tensors = [v for v in named.values() if isinstance(v, torch.Tensor)]
            if entry is None:  # (its outputs: the buffers an `empty` made that nothing wrote yet)
                target = _unpriced.setdefault(name, UnpricedLaunch(name))
                recorder.record_kernel(target, None, tuple(tensors), None,
                                       writes=[t for t in tensors if recorder.unwritten_allocation(t)])
            else:
                entry.record(recorder, named, None)
            return result

        return counted

    interface.__getitem__ = launch_of


def uninstall() -> None:
    """Put Triton's launches back."""
    if _original:
        sys.modules["triton.runtime.jit"].KernelInterface.__getitem__ = _original.pop()


def _named(kernel: Any) -> tuple[str, list[str]]:
    """The ``@triton.jit`` function's name under autotuners and heuristics, and the
    kernel's parameter names."""
    parameters = list(getattr(kernel, "arg_names", ()) or ())
    inner = kernel
    # (an autotuner's fn is a heuristics' or the JITFunction, whose fn is the Python
    # function)
    for _ in range(8):
        if not hasattr(getattr(inner, "fn", None), "fn"):
            break
        inner = inner.fn
    function = getattr(inner, "fn", None)
    return getattr(function, "__name__", type(kernel).__name__), parameters
