"""Entry points: :func:`profile` (one forward) and :func:`profiler` (every forward in a block)."""

from __future__ import annotations

import gc
import inspect
import itertools
import logging
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn.utils.stateless import _reparametrize_module

from .capture import OpFailure, Recorder, op_name
from .errors import FakeTensorError, FlopscopeError, FlopscopeWarning, ForwardError, InputError, NotAModuleError
from .facts import read_facts
from .fake import FakeConverter, map_tensors, needs_real_data, tensors_in
from .formulas import REGISTRY, FormulaRegistry
from .module_tracker import ModuleTracker
from .profile import Profile
from .roles import RoleRule
from .state import ModelSnapshot

MODES = ("auto", "fake", "real")


@dataclass(frozen=True)
class _Options:
    registry: FormulaRegistry
    roles: tuple[RoleRule, ...] = ()
    backward: bool = False
    loss: Callable[[Any], torch.Tensor] | None = None


def profile(model: nn.Module, *args: Any, mode: str = "auto", registry: FormulaRegistry | None = None,
            roles: Sequence[RoleRule] = (), backward: bool = False, loss: Callable[[Any], torch.Tensor] | None = None,
            forward_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> Profile:
    """Run ``model(*args, **kwargs)`` once and count its multiplies.

    Args:
        model: any ``nn.Module`` (a Hugging Face model, a torchvision-style CNN, your own block).
        mode: ``"fake"`` counts on fake tensors (nothing is computed, no activation memory; a model
            built on ``device="meta"`` works); ``"real"`` executes (``prof.output`` is the result);
            ``"auto"`` (default) counts on fake tensors and, only if the model needs real data (a
            data-dependent op such as ``.item()`` or ``nonzero`` in routing code), runs it for real
            instead and says so in one warning naming the op.
        registry: the formula registry (default :data:`flopscope.formulas.REGISTRY`).
        roles: :class:`~flopscope.roles.RoleRule` s for your own blocks (module pattern or type -> role);
            they override what the dataflow finds inside the modules they match.
        backward: also run and count the backward pass (grad is enabled for it); each gradient op is
            attributed to the forward op whose autograd node ran it, so to its role and module
            (``prof.by_phase()``, ``prof.by_role(phase="backward")``). Parameter ``.grad`` is restored.
        loss: ``loss(output) -> scalar`` to differentiate (default: the sum of every floating output).
        forward_kwargs: keyword arguments for the model whose names clash with ``mode`` / ``registry`` /
            ``roles``.

    The model is left exactly as it was (see :mod:`flopscope.state`), also when its forward raises.
    The current grad mode is kept: call under ``torch.no_grad()`` to count what inference runs (some
    fused fast paths are taken only then; the counts are the same either way).
    """
    _check_model(model)
    if mode not in MODES:
        raise FlopscopeError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
    kwargs = {**kwargs, **(forward_kwargs or {})}
    _check_inputs(model, args, kwargs)
    options = _Options(registry if registry is not None else REGISTRY, tuple(roles), backward, loss)
    if mode == "real":
        return _run(model, args, kwargs, options, fake=False)
    try:
        return _run(model, args, kwargs, options, fake=True)
    except _FakeRunError as failed:
        if mode == "fake":
            raise failed.error from failed.__cause__
        if _on_meta(model, args, kwargs):
            raise FakeTensorError(f"{type(model).__name__} cannot be counted on fake tensors ({failed.where}: "
                                  f"{failed.reason}), and it is on device='meta', so it cannot run for real; "
                                  "build it on a real device and use mode='real'") from failed.__cause__
        note = f"{failed.where} could not run on fake tensors ({failed.reason}); counted in real mode instead"
    prof = _run(model, args, kwargs, options, fake=False)
    warnings.warn(f"flopscope: {note}", FlopscopeWarning, stacklevel=2)
    prof._notes.append(note)
    return prof


class profiler(Profile):  # noqa: N801  (used as a context manager, like torch.profiler.profile)
    """Count every forward of ``model`` run inside a ``with`` block; query the object after the block.

    ``mode="real"`` (default) runs the calls as written. ``mode="fake"`` swaps in fake tensors:
    nothing is computed and the calls return fake tensors. Only ops executed while the model (or one
    of its submodules) runs are counted.
    """

    def __init__(self, model: nn.Module, mode: str = "real", registry: FormulaRegistry | None = None,
                 roles: Sequence[RoleRule] = ()) -> None:
        _check_model(model)
        if mode not in ("real", "fake"):
            raise FlopscopeError(f"profiler mode must be 'real' or 'fake'; got {mode!r}")
        self._model = model
        self._mode = mode
        self._registry = registry if registry is not None else REGISTRY
        self._rules = tuple(roles)
        self._ready = False
        self._stack = ExitStack()

    def __enter__(self) -> profiler:
        self._tracker = ModuleTracker(self._model)
        convert = FakeConverter(FakeTensorMode(allow_non_fake_inputs=True)) if self._mode == "fake" else None
        self._recorder, state = _make_recorder(self._model, self._tracker, self._registry, convert)
        if convert is not None:  # the model's parameters and buffers are swapped for fake ones in the block
            self._stack.enter_context(_reparametrize_module(self._model, state, tie_weights=True))
            self._stack.enter_context(convert.mode)
        self._stack.enter_context(self._tracker)
        self._stack.enter_context(self._recorder)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()
        self._set(self._recorder.entries, read_facts(self._model), self._tracker, self._recorder.unsupported,
                  self._mode, None, None, self._recorder.decomposed, self._rules)
        _warn_unsupported(self)


# -------------------------------------------------------------------------------------------------
class _FakeRunError(Exception):
    """A fake-mode run failed: ``error`` is what an explicit ``mode="fake"`` raises."""

    def __init__(self, error: FlopscopeError, where: str, reason: str) -> None:
        super().__init__(str(error))
        self.error, self.where, self.reason = error, where, reason


def _run(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], options: _Options, *, fake: bool,
         converter: FakeConverter | None = None) -> Profile:
    """One counted forward (and backward). ``converter`` reuses a fake mode and its converted state across
    calls (a sweep)."""
    facts = read_facts(model)
    snapshot = ModelSnapshot(model, buffer_values=not fake, grads=options.backward and not fake)
    tracker = ModuleTracker(model)
    try:
        with ExitStack() as stack:
            stack.enter_context(paused_gc())
            convert = (converter or FakeConverter(FakeTensorMode(allow_non_fake_inputs=True))) if fake else None
            recorder, state = _make_recorder(model, tracker, options.registry, convert)
            if convert is not None:
                stack.enter_context(_quiet_fake_tensor_log())
                args, kwargs = map_tensors((args, kwargs), convert)
                stack.enter_context(convert.mode)
            recorder.add_leaf_names(_input_names(model, args, kwargs))
            stack.enter_context(tracker)
            stack.enter_context(recorder)
            if options.backward:
                stack.enter_context(torch.enable_grad())
            try:
                if fake:
                    output = torch.func.functional_call(model, state, args, kwargs, tie_weights=True, strict=False)
                else:
                    output = model(*args, **kwargs)
            except Exception as error:
                raise _explain(model, error, recorder, tracker, fake) from error
            if options.backward:
                _backward(model, output, options.loss, recorder)
    finally:
        snapshot.restore()
    prof = Profile(recorder.entries, facts, tracker, recorder.unsupported, "fake" if fake else "real", output,
                   decomposed=recorder.decomposed, role_rules=options.roles)
    _warn_unsupported(prof)
    return prof


def _make_recorder(model: nn.Module, tracker: ModuleTracker, registry: FormulaRegistry,
                   convert: FakeConverter | None) -> tuple[Recorder, dict[str, torch.Tensor]]:
    """The recorder of one run (timing ops when real), and for a fake run the model's state as fake tensors."""
    if convert is None:
        recorder = Recorder(tracker, registry, _state_names(model, lambda t: t))
        recorder.timed = True
        return recorder, {}
    state = {name: convert(t) for name, t in _named_state(model)}
    recorder = Recorder(tracker, registry, _state_names(model, convert))
    recorder.fake = True
    return recorder, state


def _backward(model: nn.Module, output: Any, loss: Callable[[Any], torch.Tensor] | None, recorder: Recorder) -> None:
    if loss is not None:
        value = loss(output)
    else:
        floats = [t for t in tensors_in(output) if t.is_floating_point() and t.requires_grad]
        if not floats:
            raise FlopscopeError(f"backward=True: no output of {type(model).__name__} requires grad (are its "
                                 "parameters frozen?); pass loss= to choose what to differentiate")
        value = sum((t.sum() for t in floats[1:]), floats[0].sum())
    recorder.backward = True
    try:
        value.backward()
    except Exception as error:
        failure = recorder.failure
        where = f" at {failure.describe()}" if failure is not None else ""
        raise ForwardError(f"the backward pass of {type(model).__name__} raised {type(error).__name__}{where}: "
                           f"{error}") from error
    finally:
        recorder.backward = False


def _explain(model: nn.Module, error: Exception, recorder: Recorder, tracker: ModuleTracker,
             fake: bool) -> Exception:
    """The error to raise for a forward that raised: where it happened, and what to do."""
    failure: OpFailure | None = recorder.failure
    frames = tracker.failed_in(error)
    module = frames[-1].path if frames else (failure.module if failure else "")
    where = failure.describe() if failure is not None else f"module '{module}'"
    name = type(model).__name__
    limitation = needs_real_data(error) if fake else None
    if limitation is not None:
        func = getattr(limitation, "func", None)
        if func is not None and (failure is None or failure.op != op_name(func)):
            where = f"op {op_name(func)} in module '{module}'"
        reason = f"it needs real data: {type(limitation).__name__}"
        message = f"{name} cannot be counted on fake tensors: {where} needs real data; use mode='real'"
        return _FakeRunError(FakeTensorError(message), where, reason)
    message = f"{name}.forward raised {type(error).__name__} at {where}: {error}"
    if not fake:
        return ForwardError(message)
    reason = f"{type(error).__name__}: {_first_line(str(error))}"
    hint = " (on fake tensors: if the model runs with mode='real', fake tensors are the cause)"
    return _FakeRunError(ForwardError(message + hint), where, reason)


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause Python's cyclic garbage collector: a capture allocates tens of thousands of small objects
    (fake tensors, graph entries), and the full collections they trigger cost 10-20 % of the run. Cycles
    made meanwhile are collected once it is re-enabled."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextmanager
def _quiet_fake_tensor_log() -> Iterator[None]:
    """FakeTensorMode logs a traceback when an op's fake kernel fails; flopscope reports that itself."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _first_line(text: str, limit: int = 120) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _warn_unsupported(prof: Profile) -> None:
    unsupported = prof.unsupported()
    if unsupported:
        listed = ", ".join(f"{op} x{calls}" for op, calls in sorted(unsupported.items()))
        warnings.warn(f"flopscope: no formula for {listed}; they may do arithmetic that total() leaves out "
                      "(see prof.unsupported())", FlopscopeWarning, stacklevel=3)


def _check_model(model: Any) -> None:
    if not isinstance(model, nn.Module):
        raise NotAModuleError(f"flopscope profiles torch.nn.Module objects; got {type(model).__name__}")


def _check_inputs(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    try:
        signature = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as e:
        given = ", ".join([_describe(a) for a in args] + [f"{k}={_describe(v)}" for k, v in kwargs.items()])
        raise InputError(f"inputs do not fit {type(model).__name__}.forward{signature}: {e} (given: {given})") from e


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"Tensor{list(x.shape)}"
    return type(x).__name__


def _named_state(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    return itertools.chain(model.named_parameters(remove_duplicate=False),
                           model.named_buffers(remove_duplicate=False))


def _state_names(model: nn.Module, convert: Any) -> dict[int, tuple[str, str, str]]:
    names: dict[int, tuple[str, str, str]] = {}
    for name, t in _named_state(model):
        kind = "parameter" if isinstance(t, nn.Parameter) else "buffer"
        names.setdefault(id(convert(t)), ("get_attr", name, kind))
    return names


def _input_names(model: nn.Module, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> dict[int, tuple[str, str, str]]:
    try:
        params = list(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        params = []
    names: dict[int, tuple[str, str, str]] = {}
    labelled = [(params[i] if i < len(params) else f"arg{i}", a) for i, a in enumerate(args)] + list(kwargs.items())
    for label, value in labelled:
        found = tensors_in(value)
        for j, t in enumerate(found):
            names.setdefault(id(t), ("placeholder", label if len(found) == 1 else f"{label}_{j}", "input"))
    return names


def _on_meta(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    found = tensors_in((args, kwargs))
    return any(t.is_meta for t in itertools.chain((t for _, t in _named_state(model)), found))
