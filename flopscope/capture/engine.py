"""The capture engine: :func:`capture` runs a model once, :class:`Session` a block.

:func:`capture` is the one lower entry, as ``torch.export.export()`` is export's. It
records without roles and returns a :class:`CaptureResult`: the records, the model's
facts, the mode that ran, the output and the notes. A run:

1. is planned (:meth:`~flopscope.capture.plan.CapturePlan.planned`): what it will refuse
   is raised before anything runs;
2. reads the model's declared facts and snapshots its state (restored in ``finally``,
   see :mod:`flopscope.capture.state`);
3. on fake tensors converts the state and the inputs, or executes for real;
4. runs the forward (and, with ``backward=True``, the backward pass) under the module
   tracker and the recorder, in the context stack :func:`capture_contexts` builds;
5. with ``mode="auto"``, runs for real where fake tensors could not go, with one
   warning.

Errors are :class:`~flopscope.errors.RunError` s naming the module path, the op and the
shapes (:mod:`._explain`).
"""

from __future__ import annotations

import inspect
import threading
import warnings
import weakref
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.nn.utils.stateless import _reparametrize_module

from ..errors import ConfigurationError, FakeTensorError, FlopscopeWarning, ForwardError, cause_of_kind
from ..formulas.registry import FormulaRegistry
from . import undispatched
from ._explain import explain
from ._process import deeper_recursion, eager_flex_attention, known_tensor_data, paused_gc, quiet_fake_tensor_log
from .catalog import counting_kernels
from .checks import check_model, forward_signature
from .facts import ModelFacts, read_facts
from .fake import Converter, MetaConverter, isolated_copy, map_tensors, shadow_of, tensors_in
from .model_caches import CacheGuard
from .module_tracker import ModuleTracker
from .plan import CapturePlan, Loss, fake_converter, fall_back, new_converter, sharded_refusal
from .recorder import INDEX_DTYPES, MAX_KNOWN_NUMEL, Recorder, RefusedInput, capture_of, fake_run_of
from .records import Capture, LeafKind, LeafName
from .replay import CallReplayer, stand_in_refused
from .state import ModelSnapshot, named_state


@dataclass(frozen=True)
class CaptureResult:
    """What one capture produced, before any role is found.

    ``capture``: the records and what the recorder could not establish. ``facts``: what
    the model declares, read before it ran. ``mode``: ``"fake"`` or ``"real"``, the run
    that counted. ``output``: the forward's output (a block's: ``None``). ``notes``:
    what the count leaves to say (a fall-back, a replay, a compiled model counted
    eagerly).
    """

    capture: Capture
    facts: ModelFacts
    mode: str
    output: Any = None
    notes: tuple[str, ...] = ()


def capture(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], plan: CapturePlan, *,
            stacklevel: int = 2) -> CaptureResult:
    """One counted run of ``model(*args, **kwargs)`` as ``plan`` says.

    The model is left as it was. An unplanned ``plan`` is planned first
    (:meth:`CapturePlan.planned`), which raises what is refused before the run.
    ``mode="auto"`` falls back to real execution where fake tensors cannot go, with one
    :class:`~flopscope.errors.FlopscopeWarning` naming the op. A plan's converter is
    reused across runs (a sweep). ``stacklevel``: of a warning issued here, so that it
    points at the user's call (``profile()`` passes 3).
    """
    if not plan.is_planned:
        plan = plan.planned(model, args, kwargs)
    model = plan.module
    if plan.mode == "real":
        return _attempt(model, args, kwargs, plan, fake=False, notes=plan.notes,
                        stacklevel=stacklevel + 1)
    try:
        if plan.sharded is not None:
            raise sharded_refusal(model, plan.sharded)
        return _attempt(model, args, kwargs, plan, fake=True, notes=plan.notes,
                        stacklevel=stacklevel + 1)
    except (FakeTensorError, ForwardError) as failed:
        if plan.mode == "fake" or not failed.on_fake_tensors:
            raise
        note = fall_back(model, args, kwargs, plan, failed)
    result = _attempt(model, args, kwargs, plan, fake=False, notes=(*plan.notes, note),
                      stacklevel=stacklevel + 1)
    warnings.warn(f"flopscope: {note}", FlopscopeWarning, stacklevel=stacklevel)
    return result


def _attempt(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], plan: CapturePlan, *,
             fake: bool,
             notes: Sequence[str], stacklevel: int) -> CaptureResult:
    """One counted forward (and backward), on fake tensors or for real.

    ``stacklevel`` is that of a warning issued here (unsupported ops). Real runs of one
    model are serialised: their snapshots and restores of the model's state must not
    interleave. Fake runs run side by side. On meta kernels, a run they cannot do goes
    again on fake CPU tensors (this run and the next ones of a sweep).
    """
    if not fake:
        with _real_run_lock(model):
            return _record(model, args, kwargs, plan, False, None, notes, stacklevel + 1)
    converter = plan.converter
    if isinstance(converter, MetaConverter) and converter.fallback is None:
        # on meta kernels directly: no fake-tensor mode in between (a model too large to
        # build)
        try:
            return _record(model, args, kwargs, plan, True, converter, notes, stacklevel + 1)
        except Exception as error:
            if not meta_kernels_cannot(error):
                # the model's own error (fake tensors would meet it too), or what a real
                # kernel refuses
                raise
            converter.fallback = fake_converter()
    if isinstance(converter, MetaConverter):
        converter = converter.fallback
    return _record(model, args, kwargs, plan, True, converter, notes, stacklevel + 1)


_REAL_RUNS: weakref.WeakKeyDictionary[nn.Module, threading.RLock] = weakref.WeakKeyDictionary()
_REAL_RUNS_LOCK = threading.Lock()


def _real_run_lock(model: nn.Module) -> threading.RLock:
    with _REAL_RUNS_LOCK:
        lock = _REAL_RUNS.get(model)
        if lock is None:
            lock = _REAL_RUNS[model] = threading.RLock()
        return lock


def _record(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], plan: CapturePlan,
            fake: bool,
            converter: Converter | None, notes: Sequence[str], stacklevel: int,
            stand_ins: bool = True) -> CaptureResult:
    """Run and record once; the body of :func:`_attempt`."""
    facts = read_facts(model)
    # fake: the shadow runs, so the user's tables are not restored (another thread may
    # be changing them)
    snapshot = ModelSnapshot(model, buffer_values=not fake, grads=plan.backward, tables=not fake)
    # what the model's code keeps must not keep fake tensors
    caches = CacheGuard(model) if fake else None
    state: dict[str, torch.Tensor] = {}
    refused = False
    try:
        with ExitStack() as stack:
            held = capture_contexts(stack, model, plan.registry, fake, converter,
                                    inputs=(args, kwargs),
                                    pause_gc=True)
            state = held.state
            if plan.backward:
                stack.enter_context(torch.enable_grad())
            replayer = None
            if held.convert is not None and plan.reuse and not plan.backward:
                # no backward: grad mode's graph is never used; reads: the shadow's
                # classes may be swapped, never the model's
                replayer = stack.enter_context(
                    CallReplayer(held.recorder, held.tracker, grad=True,
                                 reads=held.target is not model,
                                 stand_ins=stand_ins).wrapping({"": held.target}, blocks_only=True))
            try:
                output = (held.target(*held.args, **held.kwargs) if plan.driver is None
                          else plan.driver(held.target, held.args, held.kwargs))
            # the model's own code: re-raised as a RunError naming op and module
            except Exception as error:
                if replayer is None or not stand_ins or not (replayer.stood_in or stand_in_refused(error)):
                    raise explain(model, error, held.recorder, held.tracker, fake) from error
                # a torch function refused a layer attribute's stand-in: counted again
                # without
                refused, output = True, None
            if inspect.isgenerator(output):
                raise ForwardError(f"{type(model).__name__}.forward is a generator function: "
                                   "calling it ran none of its code, so there is nothing to count; "
                                   "profile a module whose forward returns its outputs")
            if plan.backward:
                _backward(model, output, plan.loss, held.recorder, held.tracker, fake)
    finally:
        # never raises: an error of the run is not masked
        unrestored = snapshot.restore()
        if caches is not None:
            unrestored += [line for line in caches.restore() if line.startswith("could not")]
        # a reused converter's fake parameters must not carry .grad to the next run
        if fake and plan.backward:
            for t in state.values():
                t.grad = None
    for problem in unrestored:
        warnings.warn(f"flopscope: could not restore {problem}", FlopscopeWarning,
                      stacklevel=stacklevel)
    # the shadow is discarded and the model restored: the run leaves nothing behind
    if refused:
        return _record(model, args, kwargs, plan, fake, converter, notes, stacklevel + 1,
                       stand_ins=False)
    changed = snapshot.changed_parameters()
    if changed:
        warnings.warn(f"flopscope: the forward of {type(model).__name__} changed parameters in "
                      f"place ({', '.join(changed[:5])}{', ...' if len(changed) > 5 else ''}); a "
                      "real run keeps such "
                      "changes, as it would without flopscope", FlopscopeWarning,
                      stacklevel=stacklevel)
    if isinstance(held.convert, MetaConverter) and any(op.target is _SDPA_MATH_SOFTMAX for op in held.recorder.ops):
        notes = (*notes, META_ATTENTION_NOTE)
    if replayer is not None:
        notes = (*notes, *replayer.notes(refusals=False))
    result = CaptureResult(capture_of(held.recorder, held.tracker), facts,
                           "fake" if fake else "real", output,
                           tuple(notes))
    warn_incomplete(result.capture, stacklevel + 1)
    return result


class Session:
    """Counting every forward of ``model`` run in a block (:class:`flopscope.profiler`).

    :meth:`start` before the block, :meth:`finish` after it returns the
    :class:`CaptureResult`. ``plan.mode`` is ``"fake"`` or ``"real"``. ``"fake"`` swaps
    the model's parameters and buffers for fake ones for the block (nothing is
    computed); the swap is undone in :meth:`finish`, also when the block raised.
    ``fake_block=False``: the fake mode is not entered for the block, so only ops on the
    fake state (and what they make) are fake, and the caller's own code runs on real
    tensors (a diffusion pipeline's scheduler, :mod:`flopscope.workloads.pipeline`).
    ``ranges=True`` marks each module call as a ``torch.profiler`` range
    (``record_function("flopscope/<path>")``).
    """

    def __init__(self, model: nn.Module, plan: CapturePlan, *, ranges: bool = False,
                 fake_block: bool = True) -> None:
        check_model(model)
        self.model, self.plan, self.ranges = model, plan, ranges
        self.fake = plan.mode == "fake"
        self.fake_block = fake_block
        self._stack = ExitStack()
        self._tracker: ModuleTracker | None = None
        self._recorder: Recorder | None = None

    def start(self) -> None:
        plan = self.plan.for_block(self.model)
        try:
            held = capture_contexts(self._stack, self.model, plan.registry, self.fake,
                                    plan.converter,
                                    ranges=self.ranges, fake_block=self.fake_block)
        except BaseException:
            self._stack.close()
            raise
        self._tracker, self._recorder = held.tracker, held.recorder

    @contextmanager
    def replaying(self, modules: Mapping[str, nn.Module]) -> Iterator[CallReplayer]:
        """Replay a call of ``modules`` from an earlier call's records, where the same.

        Inside the started block, on fake tensors, such a call is not run
        (:mod:`flopscope.capture.replay`).
        """
        if self._recorder is None or self._tracker is None:
            raise ConfigurationError("the profiler block was never entered")
        # reads: in a fake block the modules are the run's for its duration, their
        # parameters swapped for fake ones (other threads must not run them:
        # docs/conventions.md), so their classes may be swapped while a first call is
        # watched. No stand-ins: a function refusing one would fail the user's block,
        # which is not run again.
        with CallReplayer(self._recorder, self._tracker, reads=self.fake, stand_ins=False).wrapping(modules) \
                as replayer:
            yield replayer

    def calls_by_path(self) -> Counter[str]:
        """Calls of each module path so far in the block.

        A copy: ``{"unet": 3, "unet.conv_in": 3, ...}``."""
        return Counter(self._tracker.calls) if self._tracker is not None else Counter()

    @contextmanager
    def backward_pass(self) -> Iterator[None]:
        """Record a backward pass run inside the block.

        Its ops are attributed to the forward ops they differentiate."""
        if self._recorder is None:
            raise ConfigurationError("the profiler block was never entered")
        with self._recorder.backward_pass():
            yield

    def finish(self, stacklevel: int = 2) -> CaptureResult:
        """End the block: the swap undone, what it recorded.

        Warns of what the count may miss."""
        self._stack.close()
        if self._tracker is None or self._recorder is None:
            raise ConfigurationError("the profiler block was never entered")
        result = CaptureResult(capture_of(self._recorder, self._tracker), read_facts(self.model),
                               "fake" if self.fake else "real")
        warn_incomplete(result.capture, stacklevel + 1)
        foreign = self._tracker.foreign_calls
        if foreign:
            warnings.warn(f"flopscope: {foreign} forward(s) of {type(self.model).__name__} ran in "
                          "other threads during the profiler block and are not counted (a profiler "
                          "counts the thread that "
                          "opened it)", FlopscopeWarning, stacklevel=stacklevel + 1)
        return result


@dataclass(frozen=True)
class Held:
    """What a capture's context stack holds (:func:`capture_contexts`).

    The module that runs, the module tracker, the recorder, the converter (``None``: a
    real run), the model's state as the run sees it, and the inputs (converted on fake
    tensors).
    """

    target: nn.Module
    tracker: ModuleTracker
    recorder: Recorder
    convert: Converter | None
    state: dict[str, torch.Tensor]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def capture_contexts(stack: ExitStack, model: nn.Module, registry: FormulaRegistry, fake: bool,
                     converter: Converter | None, *,
                     inputs: tuple[tuple[Any, ...], dict[str, Any]] | None = None,
                     pause_gc: bool = False, ranges: bool = False, fake_block: bool = True) -> Held:
    """Build on ``stack`` the context stack of one capture, in its one order.

    It returns what runs in it (:class:`Held`). With ``inputs``, a run of flopscope's
    own (:func:`capture`); without, a block of the caller's calls (:class:`Session`). In
    order:

    1. the process-wide switches (:mod:`._process`): the paused collector (``pause_gc``;
       it promotes on fake tensors), the deeper recursion limit, eager flex attention;
    2. under them, the run's pieces: the module tracker (``ranges``: with profiler
       ranges), the recorder and, on fake tensors (``fake``), the model's state
       converted by ``converter`` (``None``: a fresh fake mode);
    3. on fake tensors, a run's inputs converted under the quiet fake-tensor log, and a
       shadow of the model holding the fake state, so the user's module objects are
       never written to (another thread may be running them). A block swaps the model's
       own state instead, and puts back what its code cached when the stack closes;
    4. the fake mode (a block's: if ``fake_block``), the tracker, the recorder, the
       counting of kernels outside the dispatcher and, on fake tensors, known tensor
       data and the fake run's hooks.
    """
    if pause_gc:
        stack.enter_context(paused_gc(promote=fake))
    stack.enter_context(deeper_recursion())
    stack.enter_context(eager_flex_attention())
    convert = (converter or new_converter()) if fake else None
    target = shadow_of(model, convert) if convert is not None and inputs is not None else model
    tracker = ModuleTracker(target, ranges=ranges)
    # an original module reached through a closure still has its path
    if target is not model:
        tracker.add_paths(model)
    own_state = list(named_state(model))
    recorder, state = _recorder(own_state, tracker, registry, convert)
    args, kwargs = inputs if inputs is not None else ((), {})
    if convert is not None:
        real = [t for _, t in own_state]
        if inputs is not None:
            stack.enter_context(quiet_fake_tensor_log())
            real = tensors_in(inputs) + real
            args, kwargs = map_tensors((args, kwargs), convert,
                                       objects=lambda obj: isolated_copy(obj, convert))
        recorder.known_values.leaf_values.update(_index_values(real, convert))
        if inputs is None:
            # runs last, after the swap back
            stack.callback(_restore_caches, CacheGuard(model, own_attributes=True))
            stack.enter_context(_reparametrize_module(model, state, tie_weights=True))
        if fake_block:
            stack.enter_context(convert.mode)
    if inputs is not None:
        recorder.add_leaf_names(_input_names(model, args, kwargs))
    stack.enter_context(tracker)
    stack.enter_context(recorder)
    stack.enter_context(counting_kernels(recorder))
    if convert is not None:
        stack.enter_context(known_tensor_data())
        stack.enter_context(fake_run_of(recorder))
    return Held(target, tracker, recorder, convert, state, args, kwargs)


def _restore_caches(caches: CacheGuard) -> None:
    for line in caches.restore():
        if line.startswith("could not"):
            warnings.warn(f"flopscope: {line}", FlopscopeWarning, stacklevel=4)


def _recorder(own_state: list[tuple[str, torch.Tensor]], tracker: ModuleTracker,
              registry: FormulaRegistry,
              convert: Converter | None) -> tuple[Recorder, dict[str, torch.Tensor]]:
    """The recorder of one run (timing ops when real), and the state it sees.

    On fake tensors that is the model's state converted. ``own_state``:
    :func:`~flopscope.capture.state.named_state` of the model.
    """
    if convert is None:
        recorder = Recorder(tracker, registry, _state_names(own_state, lambda t: t), timed=True)
        # work outside the dispatcher, reported by module path
        undispatched.watch(recorder, tracker)
        return recorder, {}
    state = {name: convert(t) for name, t in own_state}
    if isinstance(convert, MetaConverter):
        recorder = Recorder(tracker, registry, _state_names(own_state, convert), fake=True,
                            device=convert.device)
    else:
        recorder = Recorder(tracker, registry, _state_names(own_state, convert), fake=True,
                            fake_mode=convert.mode)
    return recorder, state


def _backward(model: nn.Module, output: Any, loss: Loss | None, recorder: Recorder,
              tracker: ModuleTracker,
              fake: bool) -> None:
    if loss is not None:
        value = loss(output)
    else:
        floats = [t for t in tensors_in(output) if t.is_floating_point() and t.requires_grad]
        if not floats:
            raise ForwardError(f"backward=True: no output of {type(model).__name__} requires grad "
                               "(are its parameters frozen?); pass loss= to choose what to "
                               "differentiate")
        value = sum((t.sum() for t in floats[1:]), floats[0].sum())
    with recorder.backward_pass():
        try:
            value.backward()
        # autograd or the model's backward hooks: re-raised as a RunError
        except Exception as error:
            raise explain(model, error, recorder, tracker, fake, backward=True) from error


def warn_incomplete(capture: Capture, stacklevel: int) -> None:
    """Say what the count may miss (``stacklevel`` of a warning issued here).

    One warning lists the ops without a formula that may do arithmetic (a count is never
    silently 0), and one more per note of the capture (an attention kernel registered
    without its family). Work outside the dispatcher has a note of its own; unchecked
    lookups are notes, not warnings.
    """
    unsupported = dict(capture.unsupported)
    if unsupported:
        listed = ", ".join(f"{op} x{calls}" for op, calls in sorted(unsupported.items()))
        warnings.warn(f"flopscope: no formula for {listed}; they may do arithmetic that total() "
                      "leaves out "
                      "(see prof.unsupported())", FlopscopeWarning, stacklevel=stacklevel)
    for note in capture.notes(unchecked=False):
        warnings.warn(f"flopscope: {note}", FlopscopeWarning, stacklevel=stacklevel)


def _state_names(own_state: list[tuple[str, torch.Tensor]],
                 convert: Callable[[torch.Tensor], torch.Tensor]
                 ) -> dict[int, LeafName]:
    names: dict[int, LeafName] = {}
    for name, t in own_state:
        leaf = LeafName("get_attr", name, LeafKind.PARAMETER if isinstance(t, nn.Parameter) else LeafKind.BUFFER)
        # the tensor the run reads, and the model's own: code reaching the user's module
        # through a closure (a forward wrapped when the model was sharded) reads that
        for held in dict.fromkeys((convert(t), t)):
            names.setdefault(id(held), leaf)
            # a DTensor's shard: what its local ops read
            shard = getattr(held, "_local_tensor", None)
            if isinstance(shard, torch.Tensor):
                names.setdefault(id(shard), leaf)
    return names


def _input_names(model: nn.Module, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> dict[int, LeafName]:
    signature = forward_signature(model)
    params = list(signature.parameters) if signature is not None else []
    names: dict[int, LeafName] = {}
    labelled = [(params[i] if i < len(params) else f"arg{i}", a) for i, a in enumerate(args)] + list(kwargs.items())
    for label, value in labelled:
        found = tensors_in(value)
        for j, t in enumerate(found):
            names.setdefault(id(t), LeafName("placeholder",
                                             label if len(found) == 1 else f"{label}_{j}",
                                             LeafKind.INPUT))
    return names


def _index_values(tensors: Sequence[torch.Tensor], convert: Converter) -> dict[int, torch.Tensor]:
    """``id(fake) -> values`` of the small index tensors among ``tensors``.

    They are the inputs' ids and integer buffers such as position ids: fake tensors keep
    shapes only, and a lookup's ids are checked against its table.
    """
    return {id(convert(t)): t.detach().clone() for t in tensors
            if t.dtype in INDEX_DTYPES and not t.is_meta and not isinstance(t, FakeTensor)
            and t.numel() <= MAX_KNOWN_NUMEL}


def meta_kernels_cannot(error: BaseException) -> bool:
    """Whether a run on meta kernels failed because they cannot do what the model asks.

    That is an op without a meta kernel, a value read from a meta tensor, or a CPU
    tensor met on the way: then fake CPU tensors can.
    """
    if cause_of_kind(error, RefusedInput) is not None:
        return False
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, NotImplementedError) or "meta" in str(seen).lower():
            return True
        seen = seen.__cause__ or seen.__context__
    return False


_SDPA_MATH_SOFTMAX = torch.ops.aten._safe_softmax.default
"""The softmax of ``scaled_dot_product_attention``'s math path (and of nothing else)."""
META_ATTENTION_NOTE = ("on device='meta', scaled_dot_product_attention (and "
                       "nn.MultiheadAttention's fast path) ran the composite math path (two bmm's "
                       "around a softmax): the same multiplies as a fused kernel, but its bytes "
                       "include the n x n scores, which a fused kernel on a real device does not "
                       "write")
