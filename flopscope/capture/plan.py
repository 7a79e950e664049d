"""How a capture runs, decided before it runs: :class:`CapturePlan`.

A plan holds what the caller asks: the mode, the formula registry, the backward pass and
its loss, the limit of a fall-back, reuse, the driver and a converter to reuse. Planned
for a model and its inputs (:meth:`CapturePlan.planned`), it also holds what the engine
(:mod:`.engine`) will do: the module counted, the converter of the fake run (the
caller's fake mode, meta kernels or a fresh fake mode) and a fake run refused in
advance.

Every refusal that can be known before the model runs is raised while planning:

- a model that is not a module, an unknown mode, inputs its forward does not take;
- a caller's fake tensors in a real run (``mode="real"``, or a block of
  ``mode="real"``);
- FSDP2 on fake tensors (``mode="fake"``; with ``"auto"`` the real run follows).

What is refused once a fake run failed, a real fall-back that is too large or cannot
run, is :func:`fall_back`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from ..errors import DoesNotFitError, FakeTensorError, ForwardError
from ..formulas.registry import REGISTRY, FormulaRegistry
from ..hardware import memory
from ..hardware.memory import gib, least_available, state_bytes
from .checks import check_inputs, check_mode, check_model
from .compiled import eager_module
from .fake import (
    Converter,
    CountingFakeTensorMode,
    FakeConverter,
    MetaConverter,
    callers_fake_mode,
    loaded_dtensor,
    tensors_in,
)
from .state import named_state

MODES = ("auto", "fake", "real")
"""``profile()`` modes: fake tensors, real execution, or fake with a real fall-back."""
BLOCK_MODES = ("real", "fake")
"""``profiler()`` modes: no ``auto`` (a block of the user's calls cannot run again)."""

Loss = Callable[[Any], torch.Tensor]
Driver = Callable[[nn.Module, tuple[Any, ...], dict[str, Any]], Any]
"""Runs a counted model on the run's ``(args, kwargs)`` and returns the output.

The model it is given is the fake run's shadow, or the model itself."""


@dataclass(frozen=True)
class CapturePlan:
    """What to count and how, and, once planned, what the engine does.

    The first fields are what the caller asks. ``loss(output) -> scalar`` chooses what
    the backward pass differentiates (default: the sum of every floating output). The
    converter and the last four fields are set by :meth:`planned` (for a block,
    :meth:`for_block`) and read by the engine.
    """

    mode: str = "auto"
    registry: FormulaRegistry = REGISTRY
    backward: bool = False
    loss: Loss | None = None
    fallback_limit_bytes: int | None = None
    """Mode ``"auto"``: the most a real fall-back may need (``None``: a default)."""
    reuse: bool = True
    """Fake runs: a block provably the same as an earlier one replays its records."""
    driver: Driver | None = None
    """How the run calls the model. ``None``: once, as ``model(*args, **kwargs)``.

    A generation's greedy decoding calls it once per step
    (:func:`flopscope.workloads.generation.profile_generation`)."""
    converter: Converter | None = None
    """Asked: one reused across runs (a sweep). Planned: the fake run's converter."""
    module: Any = None
    """Planned: the module counted; ``None``: not planned yet.

    It is a compiled model's eager module, an exported program's unflattened one."""
    notes: tuple[str, ...] = ()
    """Planned: the plan's notes (a compiled model counted through its eager module)."""
    sharded: str | None = None
    """Planned, mode ``"auto"``: the module sharded with FSDP2 (no fake run then)."""
    callers_fake: bool = False
    """Planned: the model's state or inputs are fake tensors of the caller's mode."""

    @classmethod
    def of(cls, mode: str = "auto", registry: FormulaRegistry | None = None, backward: bool = False,
           loss: Loss | None = None, fallback_limit_bytes: int | None = None, reuse: bool = True,
           driver: Driver | None = None, converter: Converter | None = None) -> CapturePlan:
        """A plan from the public keyword arguments (``registry=None``: the default)."""
        return cls(mode, registry if registry is not None else REGISTRY, backward, loss,
                   fallback_limit_bytes,
                   reuse, driver, converter)

    @property
    def is_planned(self) -> bool:
        """Whether :meth:`planned` made this plan (for one model and its inputs)."""
        return self.module is not None

    def planned(self, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> CapturePlan:
        """This plan for ``model`` and its inputs, with what the engine will do.

        Validates the model, the mode and the inputs, and raises every other refusal
        that is known before the model runs. A ``torch.compile``'d model is counted
        through its eager module, an ``ExportedProgram`` through its unflattened module
        (:mod:`flopscope.capture.compiled`; the plan's notes say so).
        """
        module, counted_as = eager_module(model)
        check_model(module)
        check_mode(self.mode, MODES)
        check_inputs(module, args, kwargs)
        callers = _callers_fake_mode(module, args, kwargs)
        plan = replace(self, module=module, notes=(counted_as,) if counted_as else (),
                       callers_fake=callers is not None)
        if self.mode == "real":
            if callers is not None:
                raise FakeTensorError(f"{type(module).__name__} cannot run for real (mode='real'): "
                                      "its state or inputs are fake tensors made under a "
                                      "FakeTensorMode of the caller's; count it with mode='fake' "
                                      "(flopscope then runs on that mode)",
                                      where="the model's state and inputs",
                                      reason="fake tensors cannot execute")
            return plan
        converter = self.converter
        ours = isinstance(converter, FakeConverter) and converter.mode is callers
        # a meta model with fake inputs: meta kernels
        meta = converter is None and on_meta_kernels(module, self)
        if callers is not None and not ours and not meta:
            # the caller's mode, not a second one beside it
            converter = FakeConverter(callers)
        sharded = _fully_sharded(module)
        if sharded is not None and self.mode == "fake":
            raise sharded_refusal(module, sharded)
        if converter is None and meta:
            converter = MetaConverter()
        return replace(plan, converter=converter, sharded=sharded)

    def for_block(self, model: nn.Module) -> CapturePlan:
        """This plan for a block of the caller's calls of ``model``.

        The mode is ``"fake"`` or ``"real"``. The converter is the caller's fake mode
        where the model's state is made of fake tensors, else a fresh one. A real block
        of such a model is refused.
        """
        callers = _callers_fake_mode(model, (), {})
        if callers is not None and self.mode != "fake":
            raise FakeTensorError(f"{type(model).__name__}'s state is fake tensors made under a "
                                  "FakeTensorMode of the caller's, which a real run cannot "
                                  "execute; use mode='fake'",
                                  where="the model's state", reason="fake tensors cannot execute")
        converter = None
        if self.mode == "fake":
            converter = FakeConverter(callers) if callers is not None else new_converter()
        return replace(self, module=model, converter=converter, callers_fake=callers is not None)


def sharded_refusal(model: nn.Module, sharded: str) -> FakeTensorError:
    """Why a fake run of ``model`` is refused: its module ``sharded`` uses FSDP2."""
    reason = "FSDP2 (fully_shard) swaps its parameters on the original modules, which a fake run does not touch"
    return FakeTensorError(f"module '{sharded}' of {type(model).__name__} is sharded with FSDP2: "
                           f"{reason}; use mode='real' or 'auto' (on a fake world nothing is "
                           "communicated)",
                           on_fake_tensors=True, where=f"module '{sharded}'", reason=reason)


def fall_back(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], plan: CapturePlan,
              failed: FakeTensorError | ForwardError) -> str:
    """The note of a real run in place of a fake one that ``failed`` (``mode="auto"``).

    Raises where that real run is refused: a model made on ``device="meta"``, a model
    made of the caller's fake tensors, a run whose largest tensor is above the
    fall-back's limit.
    """
    devices = _devices(model, args, kwargs)
    if any(d.type == "meta" for d in devices):
        _refuse_meta_fallback(model, devices, failed)
    if plan.callers_fake:
        raise FakeTensorError(f"{type(model).__name__} cannot be counted on fake tensors "
                              f"({failed.where}: {failed.reason}), and it is made of fake tensors, "
                              "so it cannot run for real; "
                              "build it on a real device and use mode='real'") from failed.__cause__
    limit = (plan.fallback_limit_bytes if plan.fallback_limit_bytes is not None
             else default_fallback_limit(devices))
    if limit is not None and failed.largest_tensor_bytes > limit:
        raise FakeTensorError(
            f"{type(model).__name__} cannot be counted on fake tensors ({failed.where}: "
            f"{failed.reason}), and a real run would need at least "
            f"{failed.largest_tensor_bytes / 2**30:,.2f} GiB (the largest tensor the fake run made "
            f"before it stopped), above the limit of {limit / 2**30:,.2f} GiB for a fall-back: not "
            "run. Pass fallback_limit_bytes= to profile() to allow it, or count smaller inputs",
            where=failed.where, reason=failed.reason) from failed.__cause__
    return f"{failed.where} could not run on fake tensors ({failed.reason}); counted in real mode instead"


def _refuse_meta_fallback(model: nn.Module, devices: set[torch.device],
                          failed: FakeTensorError | ForwardError
                          ) -> None:
    """Refuse a real run of a model made on ``device="meta"`` whose fake run failed.

    It cannot run for real without being built again on a real device. Raises
    :class:`~flopscope.errors.DoesNotFitError` when that real run would not fit where it
    would allocate (its parameters and buffers plus the largest tensor of the fake run,
    bytes; :mod:`flopscope.hardware.memory`), else
    :class:`~flopscope.errors.FakeTensorError`. Both name the sizes.
    """
    why = f"{type(model).__name__} cannot be counted on fake tensors ({failed.where}: {failed.reason})"
    parameters, activation = state_bytes(model), failed.largest_tensor_bytes
    need = parameters + activation
    free = least_available({d for d in devices if d.type != "meta"})
    sizes = (f"a real run needs at least {gib(need)} ({gib(parameters)} of parameters and buffers, "
             f"{gib(activation)} for the largest tensor of the fake run)"
             + ("" if free is None else f", {gib(free)} are available"))
    if free is not None and need > free:
        raise DoesNotFitError(f"{why}, and it is made on device='meta': {sizes}, so it is not "
                              "built for real; count "
                              "a smaller configuration (fewer layers)", needed_bytes=need,
                              available_bytes=free) from failed.__cause__
    raise FakeTensorError(f"{why}, and it is made on device='meta', so it cannot run for real "
                          f"({sizes}); build it "
                          "on a real device and use mode='real'") from failed.__cause__


def default_fallback_limit(devices: Collection[torch.device] = ()) -> int | None:
    """Half of the memory available now where a real run would allocate, in bytes.

    On each CUDA device among ``devices``: its free memory (``torch.cuda.mem_get_info``)
    and what PyTorch's caching allocator holds unused. For the CPU and the rest: the
    system's (``MemAvailable`` of ``/proc/meminfo``). The least of them; ``None`` (no
    limit) where none of that can be read.
    """
    free: list[int | None] = [memory.cuda_available(d) for d in set(devices) if d.type == "cuda"]
    # the CPU's tensors (and any other's): the system's
    if not free or any(d.type != "cuda" for d in devices):
        free.append(memory.system_available())
    known = [bytes_free for bytes_free in free if bytes_free is not None]
    return min(known) // 2 if known else None


def new_converter(model: nn.Module | None = None, plan: CapturePlan | None = None) -> Converter:
    """A converter for fake runs of ``model`` with ``plan``, reused across a sweep.

    Meta tensors where :func:`on_meta_kernels`, else a fresh fake-tensor mode (real
    tensors from outside are allowed in).
    """
    if model is not None and plan is not None and on_meta_kernels(model, plan):
        return MetaConverter()
    return fake_converter()


def fake_converter() -> FakeConverter:
    """A converter of a fresh fake-tensor mode (real tensors from outside let in)."""
    return FakeConverter(CountingFakeTensorMode(allow_non_fake_inputs=True))


def on_meta_kernels(model: nn.Module, plan: CapturePlan) -> bool:
    """Whether a fake run of ``model`` goes to meta kernels directly.

    So it does for a forward-only count of a model whose state is all on
    ``device="meta"``. With a backward pass the kernels differ: a fused attention's
    backward computes the scores again, the math path's does not.
    """
    return not plan.backward and _state_on_meta(model)


def _state_on_meta(model: nn.Module) -> bool:
    """Whether every parameter and buffer of ``model`` (at least one) is on meta."""
    state = [t for _, t in named_state(model)]
    return bool(state) and all(t.is_meta for t in state)


def _fully_sharded(model: nn.Module) -> str | None:
    """The path of the first module sharded with FSDP2 (``fully_shard``), if any."""
    # FSDP2 makes DTensor parameters: none before torch.distributed.tensor is imported
    if loaded_dtensor() is None:
        return None
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover  (a torch build without torch.distributed)
        return None
    return next((path for path, module in model.named_modules() if isinstance(module, FSDPModule)),
                None)


def _callers_fake_mode(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The caller's FakeTensorMode: of the fake tensors in the state and inputs."""
    return callers_fake_mode(itertools.chain((t for _, t in named_state(model)),
                                             tensors_in((args, kwargs))))


def _devices(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> set[torch.device]:
    """The devices of the model's parameters and buffers and of the inputs."""
    return {t.device for t in itertools.chain((t for _, t in named_state(model)),
                                              tensors_in((args, kwargs)))}
