"""Whether a real run fits in memory, decided before anything is allocated. Units: bytes
everywhere (GiB = 2**30 bytes only in messages).

A real run of a model needs at least its parameters and buffers (:func:`state_bytes`)
plus the largest tensor its forward makes (what a fake run of the same inputs records:
``Profile.largest_tensor_bytes``). :func:`check_fits` compares that with the memory
available where the run would allocate (:func:`available_bytes`: on the CPU the system's
``MemAvailable`` and what the address-space limit ``RLIMIT_AS`` leaves this process,
whichever is smaller; on a CUDA device its free memory) and raises
:class:`~flopscope.errors.DoesNotFitError` naming both sizes and the way out.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection

import torch
from torch import nn

from ..errors import DoesNotFitError

GIB = 2**30
"""Bytes in a GiB (messages only)."""


def gib(size: int) -> str:
    """``size`` bytes in GiB for a message: two decimals, three significant digits below
    0.01 GiB."""
    value = size / GIB
    return f"{value:,.2f} GiB" if value >= 0.01 or value == 0 else f"{value:.3g} GiB"


def state_bytes(model: nn.Module, dtype: torch.dtype | None = None) -> int:
    """Bytes of ``model``'s parameters and buffers (each tensor once, tied weights
    once), as their dtype stores them; ``dtype``: as floating-point tensors would be
    stored after ``model.to(dtype)``. A meta model counts the same bytes as the real
    one."""
    seen: set[int] = set()
    total = 0
    for t in itertools.chain(model.parameters(), model.buffers()):
        if id(t) in seen:
            continue
        seen.add(id(t))
        total += t.numel() * (dtype.itemsize if dtype is not None and t.is_floating_point() else t.element_size())
    return total


def system_available() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes (``None`` where it cannot be
    read)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def address_space_left() -> int | None:
    """What the soft ``RLIMIT_AS`` leaves this process in bytes: the limit less the
    address space it maps now (``VmSize`` of ``/proc/self/status``); ``None`` without
    a limit (or where either cannot be read)."""
    try:
        import resource
    except ImportError:  # not on POSIX
        return None
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit == resource.RLIM_INFINITY or limit < 0:
        return None
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return max(0, limit - int(line.split()[1]) * 1024)
    except OSError:
        return None
    return None


def cuda_available(device: torch.device) -> int:
    """Free bytes on a CUDA device: its free memory and what PyTorch's caching allocator
    holds unused."""
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return int(torch.cuda.mem_get_info(device)[0]) + cached


def available_bytes(device: torch.device | str = "cpu") -> int | None:
    """Bytes a run on ``device`` can allocate now: a CUDA device's
    :func:`cuda_available`; otherwise the least of :func:`system_available` and
    :func:`address_space_left`. ``None`` where none of them can be read."""
    device = torch.device(device)
    if device.type == "cuda":
        return cuda_available(device)
    known = [free for free in (system_available(), address_space_left()) if free is not None]
    return min(known) if known else None


def least_available(devices: Collection[torch.device]) -> int | None:
    """The least :func:`available_bytes` over ``devices`` (the CPU's when there is none,
    or a device that is not CUDA among them); ``None`` where none can be read."""
    free = [available_bytes(d) for d in set(devices) if d.type == "cuda"]
    if not free or any(d.type != "cuda" for d in devices):
        free.append(available_bytes("cpu"))
    known = [f for f in free if f is not None]
    return min(known) if known else None


def check_fits(what: str, parameters: int, activation: int | None,
               device: torch.device | str = "cpu", *,
               copies: int = 1, way_out: str = "") -> None:
    """Raise :class:`~flopscope.errors.DoesNotFitError` when ``copies`` x ``parameters``
    bytes (the model's state, and that many copies of it) plus ``activation`` bytes
    (the largest tensor of its forward; ``None``: not estimated, the parameters
    alone) exceed :func:`available_bytes` on ``device``. ``what``: the run refused
    ("a real run of hf:llama"); ``way_out``: what to do instead (appended to the
    message). Unknown availability: no refusal."""
    free = available_bytes(device)
    need = copies * parameters + (activation or 0)
    if free is None or need <= free:
        return
    state = f"{copies} x {gib(parameters)}" if copies > 1 else gib(parameters)
    activations = (" alone, the activations not counted" if activation is None else
                   f", {gib(activation)} for the largest activation of a fake run")
    raise DoesNotFitError(f"{what} needs at least {gib(need)} ({state} of parameters and "
                          f"buffers{activations}) but {gib(free)} are available on "
                          f"{torch.device(device)}: not run"
                          + (f"; {way_out}" if way_out else ""), needed_bytes=need,
                          available_bytes=free)
