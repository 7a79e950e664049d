"""Entry points: :func:`profile` (one forward), :class:`profiler` (a block's forwards).

Both are thin: they check the public arguments, make a
:class:`~flopscope.capture.CapturePlan`, run :func:`~flopscope.capture.capture` (or a
:class:`~flopscope.capture.Session`) and build the :class:`~flopscope.profile.Profile`
from its result. The workloads do the same through :func:`profile_with_plan`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from .attribute.roles import RoleRule
from .capture import BLOCK_MODES, CapturePlan, Session, capture
from .capture.checks import check_mode, check_model
from .capture.compiled import BLOCK_WARNING, is_compiled
from .errors import FlopscopeError, FlopscopeWarning, RecordingError
from .formulas.registry import FormulaRegistry
from .profile import Profile


def profile(model: nn.Module, *args: Any, mode: str = "auto",
            registry: FormulaRegistry | None = None,
            roles: Sequence[RoleRule] = (), backward: bool = False,
            loss: Callable[[Any], torch.Tensor] | None = None,
            forward_kwargs: dict[str, Any] | None = None, fallback_limit_bytes: int | None = None,
            reuse: bool = True, **kwargs: Any) -> Profile:
    """Run ``model(*args, **kwargs)`` once and count its multiplies.

    Args:
        model: any ``nn.Module`` (a Hugging Face model, a torchvision-style CNN, your
            own block).
        mode: ``"fake"`` counts on fake tensors (nothing is computed, no activation
            memory; a model built on ``device="meta"`` works); ``"real"`` executes
            (``prof.output`` is the result); ``"auto"`` (default) counts on fake tensors
            and, if the run fails there (most often because the model needs real data: a
            data-dependent op such as ``.item()`` or ``nonzero`` in routing code), runs
            it for real instead and says so in one warning naming the op.
        registry: the formula registry (default
            :data:`flopscope.formulas.registry.REGISTRY`).
        roles: :class:`~flopscope.attribute.roles.RoleRule` s for your own blocks
            (module pattern or type -> role); they override what the dataflow finds
            inside the modules they match.
        backward: also run and count the backward pass (grad is enabled for it); each
            gradient op is attributed to the forward op whose autograd node ran it, so
            to its role and module (``prof.by_phase()``,
            ``prof.by_role(phase="backward")``). Parameter ``.grad`` is restored.
        loss: ``loss(output) -> scalar`` to differentiate (default: the sum of every
            floating output).
        forward_kwargs: keyword arguments for the model whose names clash with ``mode``
            / ``registry`` / ``roles``.
        fallback_limit_bytes: in ``mode="auto"``, a fall-back to a real run is refused
            (with a :class:`~flopscope.errors.FakeTensorError` naming the op and the
            estimate) when the largest tensor the fake run made is bigger than this;
            default: half the memory available now where the real run would allocate
            (the host's; a CUDA model's GPU's).
        reuse: on fake tensors, a block of a layer list (``nn.ModuleList`` of one class)
            whose records are provably those of an earlier block (the same structure,
            the same values of the plain attributes its first call read, input shapes
            and plain arguments, no value read, nothing outside it written, no attribute
            changed: :mod:`flopscope.capture.replay`; grad mode may be on) is not run
            again: its records are copies of the earlier block's, moved to its own
            module calls. The count and the records are the same (``prof.notes`` says
            which lists were replayed); ``False`` captures every block. Not with
            ``backward``.

    The model is left exactly as it was (see :mod:`flopscope.capture.state`), also when
    its forward raises. The current grad mode is kept: call under ``torch.no_grad()`` to
    count what inference runs (some fused fast paths are taken only then; the counts are
    the same either way).
    """
    kwargs = {**kwargs, **(forward_kwargs or {})}
    plan = CapturePlan.of(mode, registry, backward, loss, fallback_limit_bytes, reuse).planned(model, args, kwargs)
    return Profile(capture(model, args, kwargs, plan, stacklevel=3), role_rules=tuple(roles))


def profile_with_plan(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                      plan: CapturePlan,
                      roles: Sequence[RoleRule] = (), *, stacklevel: int = 2) -> Profile:
    """One capture of ``model(*args, **kwargs)`` as ``plan`` says, as a Profile.

    What the workloads call (a sweep, a generation, a symbolic trace). ``roles``: the
    role rules of the profile. ``stacklevel``: of a warning issued by the capture, as
    :func:`~flopscope.capture.capture`'s.
    """
    return Profile(capture(model, args, kwargs, plan, stacklevel=stacklevel + 1),
                   role_rules=tuple(roles))


def split_inputs(inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A model's inputs as ``(args, kwargs)``, as ``make_inputs(n)`` may give them.

    ``make_inputs(n)`` (:func:`flopscope.scaling`, :func:`flopscope.measure_flops`)
    gives a dict of keywords, an ``(args tuple, kwargs dict)`` pair, a tuple of
    positional arguments, or one positional argument.
    """
    if isinstance(inputs, dict):
        return (), dict(inputs)
    if isinstance(inputs, tuple) and len(inputs) == 2 and isinstance(inputs[0], tuple) and isinstance(inputs[1], dict):
        return inputs[0], inputs[1]
    if isinstance(inputs, tuple):
        return inputs, {}
    return (inputs,), {}


_RECORDING = "the profiler is still recording (or never ran): query it after the `with` block"


class profiler:  # noqa: N801  (used as a context manager, like torch.profiler.profile)
    """Count every forward of ``model`` run inside a ``with`` block; query the object
    after the block.

    ``mode="real"`` (default) runs the calls as written. ``mode="fake"`` swaps in fake
    tensors: nothing is computed and the calls return fake tensors. Only ops executed
    while the model (or one of its submodules) runs are counted.

    ``trace=True`` marks each module call as a ``torch.profiler`` range named
    ``flopscope/<module path>``, so a ``torch.profiler.profile()`` around the block
    shows them in its trace and ``key_averages()`` groups by them;
    :func:`flopscope.trace.merge_torch_trace` then lays the roles over its exported
    trace.

    After the block, every query of :class:`~flopscope.profile.Profile` works on this
    object (``prof.total()``, ``prof.by_role()``, ...), and :attr:`result` is that
    ``Profile``; inside the block every query raises the same
    :class:`~flopscope.errors.FlopscopeError`.
    """

    def __init__(self, model: nn.Module, mode: str = "real",
                 registry: FormulaRegistry | None = None,
                 roles: Sequence[RoleRule] = (), trace: bool = False) -> None:
        check_model(model)
        check_mode(mode, BLOCK_MODES, "profiler mode")
        # the block's calls would leave it uncompiled (flopscope.capture.compiled)
        if is_compiled(model):
            warnings.warn(f"flopscope: {BLOCK_WARNING}", FlopscopeWarning, stacklevel=2)
        self._session = Session(model, CapturePlan.of(mode, registry), ranges=trace)
        self._roles = tuple(roles)
        self._result: Profile | None = None

    def __enter__(self) -> profiler:
        if self._result is not None:
            raise FlopscopeError("this profiler already ran its block; make a new "
                                 "flopscope.profiler")
        self._session.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._result = Profile(self._session.finish(stacklevel=3), role_rules=self._roles)

    @property
    def result(self) -> Profile:
        """The :class:`~flopscope.profile.Profile` of the block (after it ends)."""
        if self._result is None:
            raise RecordingError(_RECORDING)
        return self._result

    def __getattr__(self, name: str) -> Any:  # only called for names the profiler itself lacks
        if name.startswith("_") or not (name == "result" or hasattr(Profile, name)):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        if self._result is None:  # also reached when the `result` property raised
            raise RecordingError(_RECORDING)
        return getattr(self._result, name)

    def __repr__(self) -> str:
        return repr(self._result) if self._result is not None else f"<{type(self).__name__} recording>"
