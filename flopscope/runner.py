"""The one internal entry point: run a counted capture of a model from :class:`CaptureOptions`.

:func:`flopscope.profile`, :class:`flopscope.profiler` and :func:`flopscope.scaling` (and every later
integration) call :func:`run` or :class:`Session`; none calls another's internals. A run:

1. reads the model's declared facts and snapshots its state (restored in ``finally``, see
   :mod:`flopscope.capture.state`);
2. on fake tensors (``fake=True``) converts the state and the inputs, or executes for real;
3. runs the forward (and, with ``backward=True``, the backward pass) under the module tracker and the
   recorder;
4. returns a :class:`~flopscope.profile.Profile` built once from what was recorded.

Errors are :class:`~flopscope.errors.RunError` s naming the module path, the op and the shapes.
"""

from __future__ import annotations

import gc
import inspect
import itertools
import logging
import sys
import threading
import warnings
import weakref
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.nn.utils.stateless import _reparametrize_module

from . import memory
from .attribute.roles import RoleRule
from .capture import undispatched
from .capture.catalog import counting_kernels
from .capture.checks import check_inputs, check_mode, check_model, forward_signature
from .capture.compiled import eager_module
from .capture.facts import read_facts
from .capture.fake import (
    Converter,
    CountingFakeTensorMode,
    FakeConverter,
    MetaConverter,
    callers_fake_mode,
    isolated_copy,
    loaded_dtensor,
    map_tensors,
    needs_real_data,
    shadow_of,
    tensors_in,
)
from .capture.model_caches import CacheGuard, fake_tensors_held
from .capture.module_tracker import ModuleTracker
from .capture.recorder import (
    CONSTRUCTORS_FROM_DATA,
    INDEX_DTYPES,
    MAX_KNOWN_NUMEL,
    FakeTensorInRealRun,
    OpFailure,
    Recorder,
    RefusedInput,
    capture_of,
    fake_run_of,
    from_known_data,
)
from .capture.records import Capture, LeafKind, LeafName, op_name
from .capture.replay import CallReplayer, stand_in_refused
from .capture.state import ModelSnapshot, named_state
from .errors import (
    ConfigurationError,
    DoesNotFitError,
    FakeTensorError,
    FlopscopeWarning,
    ForwardError,
    cause_of_kind,
)
from .formulas.registry import REGISTRY, FormulaRegistry
from .memory import gib, least_available, state_bytes
from .profile import Profile

MODES = ("auto", "fake", "real")
"""``profile()`` modes: fake tensors, real execution, or fake with a fall-back to real."""
BLOCK_MODES = ("real", "fake")
"""``profiler()`` modes (a block of the user's own calls cannot be re-run, so no ``auto``)."""

Loss = Callable[[Any], torch.Tensor]
Driver = Callable[[nn.Module, tuple[Any, ...], dict[str, Any]], Any]
"""Runs a counted model (the fake run's shadow, or the model) on the run's ``(args, kwargs)`` and returns the output."""


@dataclass(frozen=True)
class CaptureOptions:
    """What to count and how: the formula registry, the user's role rules, and the backward pass
    (``loss(output) -> scalar`` chooses what to differentiate; default: the sum of every floating output)."""

    registry: FormulaRegistry = REGISTRY
    roles: tuple[RoleRule, ...] = ()
    backward: bool = False
    loss: Loss | None = None
    fallback_limit_bytes: int | None = None  # mode "auto": refuse a real fall-back needing more (None: default)
    reuse: bool = True  # fake runs: a block replayed from an earlier block's records where provably the same
    driver: Driver | None = None  # how the run calls the model: None, once as model(*args, **kwargs); a generation's
    # greedy decoding calls it once per step (flopscope.generation.profile_generation)

    @classmethod
    def of(cls, registry: FormulaRegistry | None = None, roles: Sequence[RoleRule] = (), backward: bool = False,
           loss: Loss | None = None, fallback_limit_bytes: int | None = None, reuse: bool = True) -> CaptureOptions:
        """Options from the public keyword arguments (``registry=None``: the default registry)."""
        return cls(registry if registry is not None else REGISTRY, tuple(roles), backward, loss, fallback_limit_bytes,
                   reuse)


# -------------------------------------------------------------------------------------------------
def run_in_mode(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], options: CaptureOptions,
                mode: str, *, converter: Converter | None = None, stacklevel: int = 2) -> Profile:
    """One counted run in ``mode`` (``"auto"`` falls back to real execution where fake tensors cannot
    go, with one :class:`~flopscope.errors.FlopscopeWarning` naming the op). ``converter`` reuses a
    fake mode and the model's converted state across runs (a sweep). Validates model, mode and inputs.
    ``stacklevel``: of a warning issued here, so that it points at the user's call (``profile()`` passes 3).
    A ``torch.compile``'d model is counted through its eager module, an ``ExportedProgram`` through its
    unflattened module (:mod:`flopscope.capture.compiled`; ``prof.notes`` says so)."""
    model, counted_as = eager_module(model)
    notes = (counted_as,) if counted_as else ()
    check_model(model)
    check_mode(mode, MODES)
    check_inputs(model, args, kwargs)
    if mode == "real":
        return run(model, args, kwargs, options, fake=False, notes=notes, stacklevel=stacklevel + 1)
    try:
        return run(model, args, kwargs, options, fake=True, converter=converter, notes=notes,
                   stacklevel=stacklevel + 1)
    except (FakeTensorError, ForwardError) as failed:
        if mode == "fake" or not failed.on_fake_tensors:
            raise
        devices = _devices(model, args, kwargs)
        if any(d.type == "meta" for d in devices):
            _refuse_meta_fallback(model, devices, failed)
        if _callers_fake_mode(model, args, kwargs) is not None:
            raise FakeTensorError(f"{type(model).__name__} cannot be counted on fake tensors ({failed.where}: "
                                  f"{failed.reason}), and it is made of fake tensors, so it cannot run for real; "
                                  "build it on a real device and use mode='real'") from failed.__cause__
        limit = (options.fallback_limit_bytes if options.fallback_limit_bytes is not None
                 else default_fallback_limit(devices))
        if limit is not None and failed.largest_tensor_bytes > limit:
            raise FakeTensorError(
                f"{type(model).__name__} cannot be counted on fake tensors ({failed.where}: {failed.reason}), and a "
                f"real run would need at least {failed.largest_tensor_bytes / 2**30:,.2f} GiB (the largest tensor "
                f"the fake run made before it stopped), above the limit of {limit / 2**30:,.2f} GiB for a "
                "fall-back: not run. Pass fallback_limit_bytes= to profile() to allow it, or count smaller inputs",
                where=failed.where, reason=failed.reason) from failed.__cause__
        note = f"{failed.where} could not run on fake tensors ({failed.reason}); counted in real mode instead"
    prof = run(model, args, kwargs, options, fake=False, notes=(*notes, note), stacklevel=stacklevel + 1)
    warnings.warn(f"flopscope: {note}", FlopscopeWarning, stacklevel=stacklevel)
    return prof


def _refuse_meta_fallback(model: nn.Module, devices: set[torch.device], failed: FakeTensorError | ForwardError
                          ) -> None:
    """``mode="auto"`` on a model made on ``device="meta"`` whose fake run failed: it cannot run for real without
    being built again on a real device. Raises :class:`~flopscope.errors.DoesNotFitError` when that real run would
    not fit where it would allocate (its parameters and buffers plus the largest tensor of the fake run, bytes;
    :mod:`flopscope.memory`), else :class:`~flopscope.errors.FakeTensorError`; both name the sizes."""
    why = f"{type(model).__name__} cannot be counted on fake tensors ({failed.where}: {failed.reason})"
    parameters, activation = state_bytes(model), failed.largest_tensor_bytes
    need = parameters + activation
    free = least_available({d for d in devices if d.type != "meta"})
    sizes = (f"a real run needs at least {gib(need)} ({gib(parameters)} of parameters and buffers, "
             f"{gib(activation)} for the largest tensor of the fake run)"
             + ("" if free is None else f", {gib(free)} are available"))
    if free is not None and need > free:
        raise DoesNotFitError(f"{why}, and it is made on device='meta': {sizes}, so it is not built for real; count "
                              "a smaller configuration (fewer layers)", needed_bytes=need,
                              available_bytes=free) from failed.__cause__
    raise FakeTensorError(f"{why}, and it is made on device='meta', so it cannot run for real ({sizes}); build it "
                          "on a real device and use mode='real'") from failed.__cause__


def run(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], options: CaptureOptions, *, fake: bool,
        converter: Converter | None = None, notes: Sequence[str] = (), stacklevel: int = 2) -> Profile:
    """One counted forward (and backward), on fake tensors or for real; the model is left as it was.
    ``stacklevel`` is that of a warning issued here (unsupported ops). Real runs of one model are serialised
    (their snapshots and restores of the model's state must not interleave); fake runs run side by side."""
    callers = _callers_fake_mode(model, args, kwargs)
    if not fake and callers is not None:
        raise FakeTensorError(f"{type(model).__name__} cannot run for real (mode='real'): its state or inputs are "
                              "fake tensors made under a FakeTensorMode of the caller's; count it with mode='fake' "
                              "(flopscope then runs on that mode)", where="the model's state and inputs",
                              reason="fake tensors cannot execute")
    if fake:
        ours = isinstance(converter, FakeConverter) and converter.mode is callers
        meta = converter is None and on_meta_kernels(model, options)  # (a meta model with fake inputs: meta kernels)
        if callers is not None and not ours and not meta:
            converter = FakeConverter(callers)  # the caller's mode, not a second one beside it
        sharded = _fully_sharded(model)
        if sharded is not None:
            reason = ("FSDP2 (fully_shard) swaps its parameters on the original modules, which a fake run does not "
                      "touch")
            raise FakeTensorError(f"module '{sharded}' of {type(model).__name__} is sharded with FSDP2: {reason}; "
                                  "use mode='real' or 'auto' (on a fake world nothing is communicated)",
                                  on_fake_tensors=True, where=f"module '{sharded}'", reason=reason)
        if converter is None and meta:  # (asked once: a walk over the model's state)
            converter = MetaConverter()
        if isinstance(converter, MetaConverter) and converter.fallback is None:
            try:  # on meta kernels directly: no fake-tensor mode in between (a model too large to build)
                return _run(model, args, kwargs, options, True, converter, notes, stacklevel + 1)
            except Exception as error:
                if not meta_kernels_cannot(error):
                    raise  # the model's own error (fake tensors would meet it too), or what a real kernel refuses
                converter.fallback = fake_converter()  # this run and the next ones of a sweep: fake CPU tensors
        if isinstance(converter, MetaConverter):
            converter = converter.fallback
        return _run(model, args, kwargs, options, True, converter, notes, stacklevel + 1)
    with _real_run_lock(model):
        return _run(model, args, kwargs, options, False, None, notes, stacklevel + 1)


def _fully_sharded(model: nn.Module) -> str | None:
    """The path of the first module sharded with FSDP2 (``fully_shard``), if any."""
    if loaded_dtensor() is None:  # FSDP2 makes DTensor parameters: none before torch.distributed.tensor is imported
        return None
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover  (a torch build without torch.distributed)
        return None
    return next((path for path, module in model.named_modules() if isinstance(module, FSDPModule)), None)


_REAL_RUNS: weakref.WeakKeyDictionary[nn.Module, threading.RLock] = weakref.WeakKeyDictionary()
_REAL_RUNS_LOCK = threading.Lock()


def _real_run_lock(model: nn.Module) -> threading.RLock:
    with _REAL_RUNS_LOCK:
        lock = _REAL_RUNS.get(model)
        if lock is None:
            lock = _REAL_RUNS[model] = threading.RLock()
        return lock


def _run(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], options: CaptureOptions, fake: bool,
         converter: Converter | None, notes: Sequence[str], stacklevel: int, stand_ins: bool = True) -> Profile:
    facts = read_facts(model)
    # fake: the shadow runs, so the user's tables are not restored (another thread may be changing them)
    snapshot = ModelSnapshot(model, buffer_values=not fake, grads=options.backward, tables=not fake)
    caches = CacheGuard(model) if fake else None  # what the model's code keeps must not keep fake tensors
    state: dict[str, torch.Tensor] = {}
    given, refused = (args, kwargs), False
    try:
        with ExitStack() as stack:
            stack.enter_context(paused_gc(promote=fake))
            stack.enter_context(deeper_recursion())
            stack.enter_context(eager_flex_attention())
            convert = (converter or new_converter()) if fake else None
            # fake: a shadow of the model holds the fake state, so the user's module objects are never
            # written to (another thread may be running them); real: the model itself runs
            target = shadow_of(model, convert) if convert is not None else model
            tracker = ModuleTracker(target)
            if target is not model:  # an original module reached through a closure still has its path
                tracker.add_paths(model)
            own_state = list(named_state(model))
            recorder, state = _recorder(own_state, tracker, options.registry, convert)
            if convert is not None:
                stack.enter_context(_quiet_fake_tensor_log())
                real = tensors_in((args, kwargs)) + [t for _, t in own_state]
                args, kwargs = map_tensors((args, kwargs), convert, objects=lambda obj: isolated_copy(obj, convert))
                recorder.known_values.leaf_values.update(_index_values(real, convert))
                stack.enter_context(convert.mode)
            recorder.add_leaf_names(_input_names(model, args, kwargs))
            stack.enter_context(tracker)
            stack.enter_context(recorder)
            stack.enter_context(counting_kernels(recorder))
            if convert is not None:
                stack.enter_context(known_tensor_data())
                stack.enter_context(fake_run_of(recorder))
            if options.backward:
                stack.enter_context(torch.enable_grad())
            replayer = None
            if convert is not None and options.reuse and not options.backward:
                # (no backward: grad mode's graph is never used; reads: the shadow's classes may be swapped, never
                # the model's)
                replayer = stack.enter_context(CallReplayer(recorder, tracker, grad=True, reads=target is not model,
                                                            stand_ins=stand_ins)
                                               .wrapping({"": target}, blocks_only=True))
            try:
                output = target(*args, **kwargs) if options.driver is None else options.driver(target, args, kwargs)
            except Exception as error:  # the model's own code: re-raised as a RunError naming op and module
                if replayer is None or not stand_ins or not (replayer.stood_in or stand_in_refused(error)):
                    raise _explain(model, error, recorder, tracker, fake) from error
                refused, output = True, None  # (a torch function refused a layer attribute's stand-in: counted
                # again without)
            if inspect.isgenerator(output):
                raise ForwardError(f"{type(model).__name__}.forward is a generator function: calling it ran none "
                                   "of its code, so there is nothing to count; profile a module whose forward "
                                   "returns its outputs")
            if options.backward:
                _backward(model, output, options.loss, recorder, tracker, fake)
    finally:
        unrestored = snapshot.restore()  # never raises: an error of the run is not masked
        if caches is not None:
            unrestored += [line for line in caches.restore() if line.startswith("could not")]
        if fake and options.backward:  # a reused converter's fake parameters must not carry .grad to the next run
            for t in state.values():
                t.grad = None
    for problem in unrestored:
        warnings.warn(f"flopscope: could not restore {problem}", FlopscopeWarning, stacklevel=stacklevel)
    if refused:  # (the shadow is discarded and the model restored: the run leaves nothing behind)
        return _run(model, *given, options, fake, converter, notes, stacklevel + 1, stand_ins=False)
    changed = snapshot.changed_parameters()
    if changed:
        warnings.warn(f"flopscope: the forward of {type(model).__name__} changed parameters in place "
                      f"({', '.join(changed[:5])}{', ...' if len(changed) > 5 else ''}); a real run keeps such "
                      "changes, as it would without flopscope", FlopscopeWarning, stacklevel=stacklevel)
    if isinstance(convert, MetaConverter) and any(op.target is _SDPA_MATH_SOFTMAX for op in recorder.ops):
        notes = (*notes, META_ATTENTION_NOTE)
    if replayer is not None:
        notes = (*notes, *replayer.notes(refusals=False))
    capture = capture_of(recorder, tracker)
    prof = Profile(capture, facts, "fake" if fake else "real", output, notes=notes,
                   role_rules=options.roles)
    warn_incomplete(capture, stacklevel + 1)
    return prof


class Session:
    """Counting every forward of ``model`` run inside a ``with`` block (:class:`flopscope.profiler`):
    :meth:`start` before the block, :meth:`finish` after it returns the :class:`Profile`.

    ``fake=True`` swaps the model's parameters and buffers for fake ones for the block (nothing is
    computed); the swap is undone in :meth:`finish`, also when the block raised. ``fake_block=False``: the fake
    mode is not entered for the block, so only ops on the fake state (and what they make) are fake, and the caller's
    own code runs on real tensors (a diffusion pipeline's scheduler, :mod:`flopscope.pipeline`). ``ranges=True``
    marks each module call as a ``torch.profiler`` range (``record_function("flopscope/<path>")``).
    """

    def __init__(self, model: nn.Module, options: CaptureOptions, *, fake: bool, ranges: bool = False,
                 fake_block: bool = True) -> None:
        check_model(model)
        self.model, self.options, self.fake, self.ranges = model, options, fake, ranges
        self.fake_block = fake_block
        self._stack = ExitStack()
        self._tracker: ModuleTracker | None = None
        self._recorder: Recorder | None = None

    def start(self) -> None:
        tracker = ModuleTracker(self.model, ranges=self.ranges)
        callers = _callers_fake_mode(self.model, (), {})
        if callers is not None and not self.fake:
            raise FakeTensorError(f"{type(self.model).__name__}'s state is fake tensors made under a FakeTensorMode "
                                  "of the caller's, which a real run cannot execute; use mode='fake'",
                                  where="the model's state", reason="fake tensors cannot execute")
        convert = (FakeConverter(callers) if callers is not None else new_converter()) if self.fake else None
        own_state = list(named_state(self.model))
        recorder, state = _recorder(own_state, tracker, self.options.registry, convert)
        if convert is not None:  # (the block's inputs are real tensors the recorder reads the values of)
            recorder.known_values.leaf_values.update(_index_values([t for _, t in own_state], convert))
        try:
            self._stack.enter_context(deeper_recursion())
            self._stack.enter_context(eager_flex_attention())
            if convert is not None:
                self._stack.callback(_restore_caches, CacheGuard(self.model, own_attributes=True))  # runs last,
                # after the swap back
                self._stack.enter_context(_reparametrize_module(self.model, state, tie_weights=True))
                if self.fake_block:
                    self._stack.enter_context(convert.mode)
            self._stack.enter_context(tracker)
            self._stack.enter_context(recorder)
            self._stack.enter_context(counting_kernels(recorder))
            if convert is not None:
                self._stack.enter_context(known_tensor_data())
                self._stack.enter_context(fake_run_of(recorder))
        except BaseException:
            self._stack.close()
            raise
        self._tracker, self._recorder = tracker, recorder

    @contextmanager
    def replaying(self, modules: Mapping[str, nn.Module]) -> Iterator[CallReplayer]:
        """Inside the started block, on fake tensors, a call of one of ``modules`` whose records are provably an
        earlier call's is replayed from them, not run (:mod:`flopscope.capture.replay`)."""
        if self._recorder is None or self._tracker is None:
            raise ConfigurationError("the profiler block was never entered")
        # (reads: in a fake block the modules are the run's for its duration, their parameters swapped for fake ones
        # (other threads must not run them: docs/conventions.md), so their classes may be swapped while a first call
        # is watched; no stand-ins: a function refusing one would fail the user's block, which is not run again)
        with CallReplayer(self._recorder, self._tracker, reads=self.fake, stand_ins=False).wrapping(modules) \
                as replayer:
            yield replayer

    def calls_by_path(self) -> Counter[str]:
        """Calls of each module path so far in the block (a copy: ``{"unet": 3, "unet.conv_in": 3, ...}``)."""
        return Counter(self._tracker.calls) if self._tracker is not None else Counter()

    @contextmanager
    def backward_pass(self) -> Iterator[None]:
        """Record a backward pass run inside the block (attributed to the forward ops it differentiates)."""
        if self._recorder is None:
            raise ConfigurationError("the profiler block was never entered")
        with self._recorder.backward_pass():
            yield

    def finish(self, stacklevel: int = 2) -> Profile:
        self._stack.close()
        if self._tracker is None or self._recorder is None:
            raise ConfigurationError("the profiler block was never entered")
        capture = capture_of(self._recorder, self._tracker)
        prof = Profile(capture, read_facts(self.model),
                       "fake" if self.fake else "real", role_rules=self.options.roles)
        warn_incomplete(capture, stacklevel + 1)
        foreign = self._tracker.foreign_calls
        if foreign:
            warnings.warn(f"flopscope: {foreign} forward(s) of {type(self.model).__name__} ran in other threads "
                          "during the profiler block and are not counted (a profiler counts the thread that "
                          "opened it)", FlopscopeWarning, stacklevel=stacklevel + 1)
        return prof


def _restore_caches(caches: CacheGuard) -> None:
    for line in caches.restore():
        if line.startswith("could not"):
            warnings.warn(f"flopscope: {line}", FlopscopeWarning, stacklevel=4)


# -------------------------------------------------------------------------------------------------
def new_converter(model: nn.Module | None = None, options: CaptureOptions | None = None) -> Converter:
    """A converter for fake runs, to reuse across runs of ``model`` with ``options`` (a sweep): meta tensors where
    :func:`on_meta_kernels`, else a fresh fake-tensor mode (real tensors from outside are allowed in)."""
    if model is not None and options is not None and on_meta_kernels(model, options):
        return MetaConverter()
    return fake_converter()


def fake_converter() -> FakeConverter:
    """A fresh fake-tensor mode (real tensors from outside are allowed in) and its converter."""
    return FakeConverter(CountingFakeTensorMode(allow_non_fake_inputs=True))


def on_meta_kernels(model: nn.Module, options: CaptureOptions) -> bool:
    """Whether a fake run of ``model`` goes to meta kernels directly: a forward-only count of a model whose state
    is all on ``device="meta"`` (with a backward pass the kernels differ: a fused attention's backward computes
    the scores again, the math path's does not)."""
    return not options.backward and _state_on_meta(model)


def _recorder(own_state: list[tuple[str, torch.Tensor]], tracker: ModuleTracker, registry: FormulaRegistry,
              convert: Converter | None) -> tuple[Recorder, dict[str, torch.Tensor]]:
    """The recorder of one run (timing ops when real), and for a fake run the model's state (``own_state``:
    :func:`~flopscope.capture.state.named_state`) as fake tensors."""
    if convert is None:
        recorder = Recorder(tracker, registry, _state_names(own_state, lambda t: t), timed=True)
        undispatched.watch(recorder, tracker)  # work outside the dispatcher, reported by module path
        return recorder, {}
    state = {name: convert(t) for name, t in own_state}
    if isinstance(convert, MetaConverter):
        recorder = Recorder(tracker, registry, _state_names(own_state, convert), fake=True, device=convert.device)
    else:
        recorder = Recorder(tracker, registry, _state_names(own_state, convert), fake=True, fake_mode=convert.mode)
    return recorder, state


def _backward(model: nn.Module, output: Any, loss: Loss | None, recorder: Recorder, tracker: ModuleTracker,
              fake: bool) -> None:
    if loss is not None:
        value = loss(output)
    else:
        floats = [t for t in tensors_in(output) if t.is_floating_point() and t.requires_grad]
        if not floats:
            raise ForwardError(f"backward=True: no output of {type(model).__name__} requires grad (are its "
                               "parameters frozen?); pass loss= to choose what to differentiate")
        value = sum((t.sum() for t in floats[1:]), floats[0].sum())
    with recorder.backward_pass():
        try:
            value.backward()
        except Exception as error:  # autograd or the model's backward hooks: re-raised as a RunError
            raise _explain(model, error, recorder, tracker, fake, backward=True) from error


def _explain(model: nn.Module, error: Exception, recorder: Recorder, tracker: ModuleTracker,
             fake: bool, *, backward: bool = False) -> Exception:
    """The error to raise for a forward (or, ``backward``, its backward pass) that raised: where it happened, and
    what to do. On fake tensors it may be theirs, and ``mode="auto"`` runs the model for real (a fake kernel's
    backward can fail where the real one runs: a fake cuDNN RNN has no flat weight buffer); not when a real kernel
    would refuse the same input."""
    failure: OpFailure | None = recorder.failure
    frames = tracker.failed_in(error)
    module = frames[-1].path if frames else (failure.module if failure else "")
    name = type(model).__name__
    what = f"the backward pass of {name}" if backward else f"{name}.forward"
    where = failure.describe() if failure is not None else f"module '{module}'" if frames or not backward else what
    at = f" at {where}" if where != what else ""
    met = cast(FakeTensorInRealRun | None, cause_of_kind(error, FakeTensorInRealRun))
    if met is not None:
        if met.ours:
            held = fake_tensors_held(model, possible=True)
            origin = ("it was made by an earlier fake run of flopscope and kept by the model's code"
                      + (f", probably in {'; '.join(held)}" if held else " where flopscope cannot see it")
                      + "; empty that cache (cache_clear()) and count again")
        else:
            origin = ("it was made under a FakeTensorMode of the caller's (a tensor the model's code keeps, or "
                      "one reached from outside its state and inputs); count the model with mode='fake'")
        return ForwardError(f"{what} cannot be counted for real: {met.where.describe()} got a fake tensor, which a "
                            f"real run cannot execute; {origin}")
    limitation = needs_real_data(error) if fake else None
    if limitation is not None:
        func = getattr(limitation, "func", None)
        if func is not None and (failure is None or failure.op != op_name(func)):
            where = f"op {op_name(func)} in module '{module}'"
        return FakeTensorError(f"{name} cannot be counted on fake tensors: {where} needs real data; use mode='real'",
                               on_fake_tensors=True, where=where,
                               reason=f"it needs real data: {type(limitation).__name__}",
                               largest_tensor_bytes=recorder.tallies.largest_out)
    refused = cause_of_kind(error, RefusedInput)
    if refused is not None:  # what the real kernel would refuse: the same error in every mode, no fall-back
        return ForwardError(f"{what} cannot run{at}: {refused}")
    if fake and undispatched.converts_to_numpy(error):
        reason = "it converts a tensor to NumPy (.numpy()), work outside the ATen dispatcher a fake tensor cannot do"
        return FakeTensorError(f"{name} cannot be counted on fake tensors{at}: {reason}; count it with mode='real', "
                               "which lists that work in prof.unsupported() (its multiplies are not counted)",
                               on_fake_tensors=True, where=where, reason=reason,
                               largest_tensor_bytes=recorder.tallies.largest_out)
    message = f"{what} raised {type(error).__name__}{at}: {error}"
    if not fake:
        return ForwardError(message)
    return ForwardError(message + " (on fake tensors: if the model runs with mode='real', fake tensors are the "
                        "cause)", on_fake_tensors=True, where=where,
                        reason=f"{type(error).__name__}: {_first_line(str(error))}",
                        largest_tensor_bytes=recorder.tallies.largest_out)


class WhileCapturing:
    """A process-wide setting changed while any capture runs: the first capture to enter saves it and sets it,
    the last one to leave puts it back (captures may run in several threads at once)."""

    def __init__(self, read: Callable[[], Any], write: Callable[[Any], None], value: Callable[[Any], Any]) -> None:
        self._read, self._write, self._value = read, write, value  # value: the setting while capturing, from the old
        self._lock = threading.Lock()
        self._users = 0
        self._saved: Any = None

    @contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            if self._users == 0:
                self._saved = self._read()
                self._write(self._value(self._saved))
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    self._write(self._saved)


EXTRA_FRAMES = 400
"""Python frames flopscope adds to a forward's deepest call (hooks and dispatch at every nesting level): the
recursion limit is raised by this much while a capture runs, so a model as deep as a plain forward can run
is as deep as flopscope can count."""
deeper_recursion = WhileCapturing(sys.getrecursionlimit, sys.setrecursionlimit, lambda limit: limit + EXTRA_FRAMES)
"""Raise the recursion limit by :data:`EXTRA_FRAMES` while any capture runs (the limit is one per interpreter)."""


def _flex_module() -> Any:
    return sys.modules.get("torch.nn.attention.flex_attention")


def _set_flex_debug(value: Any) -> None:
    module = _flex_module()
    if module is not None and value is not None:
        module._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = value


eager_flex_attention = WhileCapturing(lambda: getattr(_flex_module(), "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG", None),
                                      _set_flex_debug, lambda old: None if old is None else True)
"""While a capture runs, FlexAttention (once imported) calls its op directly, as its documented debug switch makes
it do: outside ``torch.compile`` it wraps the op in ``torch.compile(fullgraph=True)``, which Dynamo refuses under
any dispatch mode; called directly, the op runs the same eager (dense) implementation it compiles to there."""


def _constructors() -> tuple[Any, ...]:
    return tuple(getattr(torch, name) for name in CONSTRUCTORS_FROM_DATA)


def _set_constructors(functions: tuple[Any, ...]) -> None:
    for name, function in zip(CONSTRUCTORS_FROM_DATA, functions, strict=True):
        setattr(torch, name, function)


known_tensor_data = WhileCapturing(_constructors, _set_constructors,
                                   lambda old: tuple(from_known_data(function) for function in old))
"""While a fake run counts, ``torch.tensor`` / ``as_tensor`` / ``asarray`` take one-element fake tensors in their data
at the values the recorder knows (:func:`~flopscope.capture.recorder.from_known_data`; in other threads, and for
other data, the original functions run); put back when the last capture ends."""


@contextmanager
def paused_gc(promote: bool = False) -> Iterator[None]:
    """Pause Python's cyclic garbage collector: a capture allocates tens of thousands of small objects
    (fake tensors, graph records), and the full collections they trigger cost 10-20 % of the run. Cycles
    made meanwhile are collected once it is re-enabled.

    ``promote`` (a fake run, whose objects hold no memory of note): when the collector is re-enabled, the objects the
    block allocated (the capture's records, alive as long as the profile) are moved to the oldest generation at once
    (``gc.freeze()`` then ``gc.unfreeze()``: two list splices) instead of being traversed by the two young
    collections that would move them there (0.4-0.5 s of a 2.6 s count of a 28-step Flux.1-dev pipeline: 565
    thousand objects). The cycles left by the block, and the caller's young objects, are then collected by the next
    full collection (``gc.collect()``), not the next young one. Not where the process has frozen objects
    (``gc.get_freeze_count()``, a pre-fork server's): ``unfreeze`` would thaw them."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            if promote and not gc.get_freeze_count():
                gc.freeze()
                gc.unfreeze()
            gc.enable()


class _ThisThreadOnly(logging.Filter):
    """Drops the records of one thread (the logger's level, a global, is never touched)."""

    def __init__(self) -> None:
        super().__init__()
        self.thread = threading.get_ident()

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread != self.thread


@contextmanager
def _quiet_fake_tensor_log() -> Iterator[None]:
    """FakeTensorMode logs a traceback when an op's fake kernel fails; flopscope reports that itself. Only
    this thread's records are dropped, by a filter of its own, so concurrent profiles cannot leave the
    logger changed."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    quiet = _ThisThreadOnly()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def _first_line(text: str, limit: int = 120) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def warn_incomplete(capture: Capture, stacklevel: int) -> None:
    """Say what the count may miss (``stacklevel`` of a warning issued here): one warning listing the ops
    without a formula that may do arithmetic (a count is never silently 0), and one per note of the
    capture (an attention kernel registered without its family)."""
    unsupported = dict(capture.unsupported)
    if unsupported:  # (work outside the dispatcher: a note of its own, below)
        listed = ", ".join(f"{op} x{calls}" for op, calls in sorted(unsupported.items()))
        warnings.warn(f"flopscope: no formula for {listed}; they may do arithmetic that total() leaves out "
                      "(see prof.unsupported())", FlopscopeWarning, stacklevel=stacklevel)
    for note in capture.notes(unchecked=False):  # unchecked lookups are notes, not warnings
        warnings.warn(f"flopscope: {note}", FlopscopeWarning, stacklevel=stacklevel)


def _state_names(own_state: list[tuple[str, torch.Tensor]], convert: Callable[[torch.Tensor], torch.Tensor]
                 ) -> dict[int, LeafName]:
    names: dict[int, LeafName] = {}
    for name, t in own_state:
        kind = LeafKind.PARAMETER if isinstance(t, nn.Parameter) else LeafKind.BUFFER
        converted = convert(t)
        names.setdefault(id(converted), LeafName("get_attr", name, kind))
        shard = getattr(converted, "_local_tensor", None)  # a DTensor's shard: what its local ops read
        if isinstance(shard, torch.Tensor):
            names.setdefault(id(shard), LeafName("get_attr", name, kind))
    return names


def _input_names(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[int, LeafName]:
    signature = forward_signature(model)
    params = list(signature.parameters) if signature is not None else []
    names: dict[int, LeafName] = {}
    labelled = [(params[i] if i < len(params) else f"arg{i}", a) for i, a in enumerate(args)] + list(kwargs.items())
    for label, value in labelled:
        found = tensors_in(value)
        for j, t in enumerate(found):
            names.setdefault(id(t), LeafName("placeholder", label if len(found) == 1 else f"{label}_{j}",
                                             LeafKind.INPUT))
    return names


def default_fallback_limit(devices: Collection[torch.device] = ()) -> int | None:
    """Half of the memory available now where a real run would allocate, in bytes: on each CUDA device among
    ``devices``, its free memory (``torch.cuda.mem_get_info``) and what PyTorch's caching allocator holds unused;
    the system's (``MemAvailable`` of ``/proc/meminfo``) for the CPU and the rest; the least of them. ``None`` (no
    limit) where none of that can be read."""
    free: list[int | None] = [memory.cuda_available(d) for d in set(devices) if d.type == "cuda"]
    if not free or any(d.type != "cuda" for d in devices):  # the CPU's tensors (and any other's): the system's
        free.append(memory.system_available())
    known = [bytes_free for bytes_free in free if bytes_free is not None]
    return min(known) // 2 if known else None


def _callers_fake_mode(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The FakeTensorMode of the fake tensors among the model's state and the inputs (the caller's), if any."""
    return callers_fake_mode(itertools.chain((t for _, t in named_state(model)), tensors_in((args, kwargs))))


def _devices(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> set[torch.device]:
    """The devices of the model's parameters and buffers and of the inputs."""
    return {t.device for t in itertools.chain((t for _, t in named_state(model)), tensors_in((args, kwargs)))}


def _index_values(tensors: Sequence[torch.Tensor], convert: Converter) -> dict[int, torch.Tensor]:
    """``id(fake) -> values`` of the small index tensors among ``tensors`` (inputs' ids, integer buffers such as
    position ids): fake tensors keep shapes only, and a lookup's ids are checked against its table."""
    return {id(convert(t)): t.detach().clone() for t in tensors
            if t.dtype in INDEX_DTYPES and not t.is_meta and not isinstance(t, FakeTensor)
            and t.numel() <= MAX_KNOWN_NUMEL}


def meta_kernels_cannot(error: BaseException) -> bool:
    """Whether a run on meta kernels failed because they cannot do what the model asks (an op without a meta
    kernel, a value read from a meta tensor, a CPU tensor met on the way): then fake CPU tensors can."""
    if cause_of_kind(error, RefusedInput) is not None:
        return False
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, NotImplementedError) or "meta" in str(seen).lower():
            return True
        seen = seen.__cause__ or seen.__context__
    return False


_SDPA_MATH_SOFTMAX = torch.ops.aten._safe_softmax.default
"""The softmax of ``scaled_dot_product_attention``'s math path (no other PyTorch code calls it)."""
META_ATTENTION_NOTE = ("on device='meta', scaled_dot_product_attention (and nn.MultiheadAttention's fast path) ran "
                       "the composite math path (two bmm's around a softmax): the same multiplies as a fused kernel, "
                       "but its bytes include the n x n scores, which a fused kernel on a real device does not write")


def _state_on_meta(model: nn.Module) -> bool:
    """Whether every parameter and buffer of ``model`` (at least one) is on ``device="meta"``."""
    state = [t for _, t in named_state(model)]
    return bool(state) and all(t.is_meta for t in state)


def split_inputs(inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A model's inputs as ``(args, kwargs)``, as ``make_inputs(n)`` (:func:`flopscope.scaling`,
    :func:`flopscope.measure_flops`) may give them: a dict of keywords, an ``(args tuple, kwargs dict)`` pair, a
    tuple of positional arguments, or one positional argument."""
    if isinstance(inputs, dict):
        return (), dict(inputs)
    if isinstance(inputs, tuple) and len(inputs) == 2 and isinstance(inputs[0], tuple) and isinstance(inputs[1], dict):
        return inputs[0], inputs[1]
    if isinstance(inputs, tuple):
        return inputs, {}
    return (inputs,), {}
