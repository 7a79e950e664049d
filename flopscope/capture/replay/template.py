"""CallTemplate: a key's first call, watched, kept where its records are every call's.

:func:`first_call` runs the call with the recorder watching it (a
:class:`~..recorder.Window`), with its modules' attribute reads noted
(:mod:`.attribute_reads`), its given objects' method calls recorded
(:mod:`.given_objects`) and ``Tensor.tolist()`` / ``.numpy()`` counted as value reads.
It then checks what the call did: the attributes it changed, the lists and dicts it
changed (:mod:`.containers`), its outputs (:func:`_outputs`), what it read and wrote
(:func:`_template`). A call that passes every check is kept as a :class:`CallTemplate`
(its records as :class:`_Copy` steps); one that fails keeps the refusal's words instead
(:class:`Candidate`). The refusals are in :mod:`._refusals`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from collections.abc import Callable, Mapping
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from ..module_tracker import ModuleCall, ModuleTracker
from ..recorder import Recorder, Window, storage_of
from ..records import CapturedOp, LeafKind, records_in
from ..scoped_patch import ScopedPatch
from ..state import named_state
from . import attribute_reads, given_objects
from ._refusals import (
    CALLS_ITSELF,
    CHANGED_ATTRIBUTES,
    FOREIGN_OUTPUT,
    KNOWN_OUTPUT,
    LATE_PARAMETERS,
    MIXED_GRAD_VIEWS,
    OTHER_OUTPUT,
    OUTPUT_REQUIRES_GRAD,
    OUTSIDE_WRITES,
    RECORD_OUTSIDE,
    STAND_IN_OUTPUT,
    VALUE_READS,
    Refused,
)
from .attribute_reads import StandIn
from .containers import Change, contents, lists_and_dicts
from .containers import changes as changes_of
from .given_objects import CallOut
from .key import ABSENT, PLAIN, attribute_values, read_values


@dataclass(frozen=True)
class Argument:
    """An output that is the call's tensor argument at ``position`` (among its tensor
    arguments), handed back."""

    position: int


@dataclass
class _Counts:
    """The recorder's tallies that a call adds to (a replay adds the same)."""

    unsupported: Counter[str]
    decomposed: Counter[str]
    upper_bounds: Counter[str]
    unchecked_lookups: int
    undeclared_kernels: frozenset[str]
    value_reads: int
    late_parameters: int

    @classmethod
    def of(cls, recorder: Recorder) -> _Counts:
        return cls(Counter(recorder.unsupported), Counter(recorder.decomposed),
                   Counter(recorder.upper_bounds),
                   recorder.unchecked_lookups, frozenset(recorder.undeclared_kernels),
                   recorder.value_reads,
                   recorder._late_parameters)

    def since(self, before: _Counts) -> _Counts:
        return _Counts(self.unsupported - before.unsupported, self.decomposed - before.decomposed,
                       self.upper_bounds - before.upper_bounds,
                       self.unchecked_lookups - before.unchecked_lookups,
                       self.undeclared_kernels - before.undeclared_kernels,
                       self.value_reads - before.value_reads,
                       self.late_parameters - before.late_parameters)

    def add_to(self, recorder: Recorder) -> None:
        recorder.unsupported.update(self.unsupported)
        recorder.decomposed.update(self.decomposed)
        recorder.upper_bounds.update(self.upper_bounds)
        recorder.unchecked_lookups += self.unchecked_lookups
        recorder.undeclared_kernels.update(self.undeclared_kernels)


_HEAD = ("node_op", "target", "args", "kwargs", "name", "phase", "module_stack")
"""The first fields of :class:`CapturedOp`, in order, which a copy passes first
(tests/test_replay.py checks it)."""
_REST = tuple(f.name for f in dataclasses.fields(CapturedOp))[len(_HEAD):]
# (the dataflow's fields are set when the capture is linked)
_REST = _REST[:_REST.index("index")]


@dataclass(frozen=True, slots=True)
class _Copy:
    """One record of a template: ``records_at`` the positions in its ``args`` that hold
    records a replay maps (made in the call, or an input's; a parameter's leaf is the
    same in every call), or lists, tuples or dicts holding some, ``None`` for the
    leaf of an input (mapped to the replayed call's, not copied); ``kwargs_records``:
    its ``kwargs`` hold records; ``stack_at``: its module stack's position among the
    template's; ``rest`` its fields after ``module_stack``, as a copy takes them;
    ``inputs``: the records among its ``args`` and ``kwargs``, each once, in order (a
    copy's, mapped, are its :attr:`~CapturedOp.inputs`: the capture's link need not
    look for them); ``inputs_may_repeat``: two of them may map to one record (each
    copy is a record of its own, but what a replay maps otherwise may meet: an input
    that is a parameter, tied parameters, a call-out's output that is its
    argument)."""

    op: CapturedOp
    records_at: tuple[int, ...] | None
    kwargs_records: bool = False
    stack_at: int = 0
    rest: tuple[Any, ...] = ()
    inputs: tuple[CapturedOp, ...] = ()
    inputs_may_repeat: bool = False

    @classmethod
    def of(cls, op: CapturedOp, stack_at: int, mapped: set[int], fresh: set[int], given: set[int]) -> _Copy:
        """``op``'s step; ``mapped``: ``id()`` of the records a replay maps, ``fresh``
        those it maps to a copy of its own, ``given`` those a call-out's output maps
        (to any record, a copy among them)."""
        def maps(value: Any) -> bool:
            return any(id(record) in mapped for record in records_in(value))

        at = tuple(i for i, a in enumerate(op.args) if isinstance(a, (CapturedOp, list, tuple, dict)) and maps(a))
        inputs = records_in(op.args, op.kwargs)
        return cls(op, at, maps(op.kwargs), stack_at, tuple(getattr(op, name) for name in _REST), inputs,
                   len(inputs) > 1 and (sum(id(record) not in fresh for record in inputs) > 1
                                        or any(id(record) in given for record in inputs)))


@dataclass
class CallTemplate:
    """The records of one call of a module, ready to be copied into a later call of the
    same key."""

    # the module's path
    path: str
    # the records the call made that a replay copies or maps, in order
    plan: list[_Copy]
    # the module stacks of its records (_Copy.stack_at)
    stacks: list[tuple[ModuleCall, ...]]
    # id(record) of a tensor argument's value -> its position among the tensor arguments
    inputs: dict[int, int]
    # the module calls running when the call ran (its own last)
    stack: tuple[ModuleCall, ...]
    # calls of each path when the call began (its own counted)
    calls_before: Counter[str]
    # calls of each path inside the call
    inner_calls: Counter[str]
    # the inputs' shapes of the calls inside it
    module_inputs: dict[ModuleCall, tuple[tuple[int | str, tuple[int, ...]], ...]]
    # the output's leaves: a tensor's record (its values made anew), or a plain value
    outputs: list[Any]
    # the output's tensors (sizes, strides, dtypes to make anew)
    output_tensors: list[torch.Tensor | None]
    output_spec: pytree.TreeSpec
    # what the call added to the recorder's tallies
    counts: _Counts
    # bytes of the largest tensor the call made
    largest_out: int
    # structural: id(record) of the module's parameter or buffer -> its name in the
    # module (a replay into another module of the same structure takes that one's)
    parameters: dict[int, str] = field(default_factory=dict)
    # the lists and dicts it was given that it changed, as a replay changes them
    changes: tuple[Change, ...] = ()
    # which of the arguments' lists and dicts are one object
    # (containers.lists_and_dicts)
    containers: tuple[int, ...] = ()
    # the plain attributes it read (module name in it, attribute), where read attributes
    # are keyed (CallReplayer.reads)
    reads: tuple[tuple[str, str], ...] = ()
    # its calls of given objects' methods, each with the number of plan steps before it
    # (a replay calls them again: flopscope.capture.replay.given_objects)
    callouts: list[tuple[int, CallOut]] = field(default_factory=list)


@dataclass(frozen=True)
class Candidate:
    """A template of a key (or why the key's calls are captured) for the calls whose
    modules' attributes ``reads`` hold ``values`` (all calls of the key: ``reads``
    empty)."""

    reads: tuple[tuple[str, str], ...]
    values: tuple[Any, ...]
    found: CallTemplate | str


_PYTHON_READS = ("tolist", "numpy")
"""Tensor methods that read a real tensor's values without an ATen op (a fake tensor's
raise): counted as value reads while a first call is watched."""
# method name -> the original, while any thread watches a call
_patched: dict[str, Any] = {}


def _wrap_python_reads() -> None:
    for name in _PYTHON_READS:
        _patched[name] = vars(torch.Tensor).get(name)
        setattr(torch.Tensor, name, _counted(getattr(torch.Tensor, name)))


def _unwrap_python_reads() -> None:
    for name, original in _patched.items():
        if original is None:
            delattr(torch.Tensor, name)
        else:
            setattr(torch.Tensor, name, original)
    _patched.clear()


_PYTHON_READ_PATCH = ScopedPatch(_wrap_python_reads, _unwrap_python_reads)
"""For a scope, in its thread, ``Tensor.tolist()`` and ``Tensor.numpy()`` count as value
reads of the scope's recorder (the methods are wrapped on ``torch.Tensor`` while any
thread is in such a scope)."""


def _counted(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def read(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        for recorder in _PYTHON_READ_PATCH.values():
            recorder.value_reads += 1
        return method(self, *args, **kwargs)

    return read


def passed_attributes(blocks: Any) -> dict[str, frozenset[str]]:
    """Per module name in a block of ``blocks`` (a list of blocks), the attributes
    whose values differ between its blocks (a layer's own index): read as an
    :class:`~.attribute_reads.StandIn`, which a block may hand to a given object's
    method without the value keying it."""
    values = [attribute_values(dict(block.named_modules())) for block in blocks]
    differ: dict[str, set[str]] = {}
    for key in {k for v in values for k in v}:
        # (blocks of other structures may not have it)
        held = [v[key] for v in values if key in v]
        if all(type(h) is int for h in held) and len(set(held)) > 1:
            differ.setdefault(key[0], set()).add(key[1])
    return {name: frozenset(names) for name, names in differ.items()}


def first_call(forward: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], *,
               recorder: Recorder,
               tracker: ModuleTracker, path: str, module: nn.Module,
               modules: Mapping[str, nn.Module],
               tensors: list[torch.Tensor], objects: list[Any], structural: bool, watched: bool,
               passed: Mapping[str, frozenset[str]] | None, grad: bool) -> tuple[Any, Candidate]:
    """Run the call of ``module`` (at ``path``; ``modules``: its modules by name),
    watched; return its output and the key's :class:`Candidate`: its records as a
    template if they are provably every call's, else the refusal.

    ``structural``: a block, keyed by its structure. ``watched``: its attribute reads
    are noted (read attributes are keyed). ``passed``: the int attributes read as
    stand-ins (:func:`passed_attributes`). ``grad``: grad mode may be on (an output may
    require grad).
    """
    before = _Counts.of(recorder)
    largest = recorder.largest_out
    recorder.largest_out = 0
    calls_before, stack = Counter(tracker.calls), tracker.stack
    found, aliasing = lists_and_dicts((args, kwargs))
    held = [contents(c) for c in found]
    attributes = attribute_values(modules)
    reads: tuple[tuple[str, str], ...] = ()
    values: tuple[Any, ...] = ()
    # (where a stand-in may be left)
    settled = [*found, *objects, *(vars(m) for m in modules.values())]
    with recorder.watching() as window:
        try:
            with ExitStack() as watches:
                watches.enter_context(_PYTHON_READ_PATCH.scope(recorder))
                log = watches.enter_context(attribute_reads.watching(modules, passed)
                                            if watched else nullcontext(attribute_reads.Log()))
                given = watches.enter_context(given_objects.watching(
                    objects, log, recorder, tracker, lambda: _Counts.of(recorder)))
                out = forward(*args, **kwargs)
        except BaseException:
            if passed:
                attribute_reads.settle(settled)
            raise
        finally:
            made_largest = recorder.largest_out
            recorder.largest_out = max(largest, made_largest)
        try:
            if given.problems:
                raise Refused(given.problems[0])
            changed = attribute_values(modules)
            if changed != attributes:
                names = sorted({f"{n or '(module)'}.{k}" for n, k in {*changed, *attributes}
                                if changed.get((n, k), ABSENT) != attributes.get((n, k), ABSENT)})
                raise CHANGED_ATTRIBUTES.refused(names=", ".join(names[:3]))
            if watched:
                reads = tuple(sorted(log.reads))
                values = read_values(modules, reads, attributes)
            changes, made = changes_of(found, held, tensors, window)
            outputs, output_tensors, spec = _outputs((out, made), window, tensors, recorder, grad)
        except Refused as why:
            return attribute_reads.settle(out) if passed else out, Candidate(reads, values, str(why))
        finally:
            if passed:
                attribute_reads.settle(settled)
    try:
        parameters = {} if not structural else {
            id(record): name for name, t in named_state(module) if (record := recorder.made_by(t)) is not None}
        template = _template(recorder, tracker, path, window, tensors, stack, calls_before,
                             _Counts.of(recorder).since(before), outputs, output_tensors, spec,
                             made_largest,
                             parameters, given.calls)
        template.changes, template.containers, template.reads = changes, aliasing, reads
    except Refused as why:
        return out, Candidate(reads, values, str(why))
    return out, Candidate(reads, values, template)


def _outputs(out: Any, window: Window, arguments: list[torch.Tensor], recorder: Recorder, grad: bool
             ) -> tuple[list[Any], list[torch.Tensor | None], pytree.TreeSpec]:
    """The leaves of a first call's output as a template keeps them (a record, an
    :class:`Argument`, a plain value), its tensors and its spec; raises
    :class:`~._refusals.Refused` for an output a replay could not make again."""
    leaves, spec = pytree.tree_flatten(out)
    records: list[Any] = []
    tensors: list[torch.Tensor | None] = []
    for leaf in leaves:
        if type(leaf) is StandIn:
            raise STAND_IN_OUTPUT.refused()
        if isinstance(leaf, torch.Tensor):
            given = next((i for i, t in enumerate(arguments) if t is leaf), None)
            # (an argument handed back as it is: T5's position bias; a replay hands back
            # the same argument of its own call)
            if given is not None:
                records.append(Argument(given))
                tensors.append(None)
                continue
            if not window.allocated(leaf):
                raise FOREIGN_OUTPUT.refused()
            if recorder.value_of(leaf) is not None:
                raise KNOWN_OUTPUT.refused()
            if leaf.requires_grad and not grad:
                raise OUTPUT_REQUIRES_GRAD.refused()
            # (after a write to it: its version record)
            records.append(recorder.record_of(leaf))
            tensors.append(leaf)
        elif isinstance(leaf, PLAIN):
            records.append(leaf)
            tensors.append(None)
        else:
            raise OTHER_OUTPUT.refused(kind=type(leaf).__name__)
    flags: dict[int, set[bool]] = {}
    for t in tensors:
        if t is not None:
            flags.setdefault(storage_of(t), set()).add(t.requires_grad)
    if any(len(f) > 1 for f in flags.values()):
        raise MIXED_GRAD_VIEWS.refused()
    return records, tensors, spec


def _template(recorder: Recorder, tracker: ModuleTracker, path: str, window: Window,
              tensors: list[torch.Tensor],
              stack: tuple[ModuleCall, ...], calls_before: Counter[str], counts: _Counts,
              outputs: list[Any],
              output_tensors: list[torch.Tensor | None], spec: pytree.TreeSpec, largest: int,
              parameters: dict[int, str], callouts: list[CallOut]) -> CallTemplate:
    """The template of a first call whose checks passed; raises
    :class:`~._refusals.Refused` where what it read, wrote or recorded differs with
    what the key cannot see."""
    # (what its call-outs add, a replay's add again)
    for callout in callouts:
        before, after = callout.tallies or (counts, counts)
        counts = counts.since(after.since(before))
    if counts.value_reads:
        raise VALUE_READS.refused(count=counts.value_reads)
    if window.outside_writes:
        raise OUTSIDE_WRITES.refused(count=window.outside_writes)
    if counts.late_parameters:
        raise LATE_PARAMETERS.refused()
    records = recorder.ops[window.start:]
    for op in records:
        if op.node_op == "call_function" and op.module_stack[:len(stack)] != stack:
            raise RECORD_OUTSIDE.refused(op=op.op_name)
    inner = Counter(tracker.calls)
    inner.subtract(calls_before)
    inner = +inner
    if path in inner:
        raise CALLS_ITSELF.refused()
    module_inputs = {}
    for name, n in inner.items():
        for number in range(calls_before[name] + 1, calls_before[name] + n + 1):
            call = ModuleCall(name, number)
            if call in tracker.inputs:
                module_inputs[call] = tracker.inputs[call]
    inputs: dict[int, int] = {}
    for i, t in enumerate(tensors):
        record = recorder.made_by(t)
        if record is not None:
            inputs.setdefault(id(record), i)
    alive = recorder.leaves_alive(records)
    fresh = {id(op) for op in records if op.node_op != "call_function" and op.leaf is LeafKind.CONSTANT
             and id(op) not in alive and id(op) not in inputs}
    stacks: dict[tuple[ModuleCall, ...], int] = {}
    # (a replay's call-outs make them)
    made_out = {id(op) for c in callouts for op in recorder.ops[c.start:c.end]}
    kept_at = [(at, op) for at, op in enumerate(records, window.start) if id(op) not in made_out and (
        id(op) in inputs or op.node_op == "call_function" or id(op) in fresh)]
    kept = [op for _, op in kept_at]
    given = {id(leaf[1]) for c in callouts for leaf in c.outputs if leaf[0] == "record"}
    mapped = {id(op) for op in kept} | set(inputs) | set(parameters) | given
    fresh = {id(op) for op in kept if id(op) not in inputs} - given
    plan = [_Copy(op, None) if id(op) in inputs else
            _Copy.of(op, stacks.setdefault(op.module_stack, len(stacks)), mapped, fresh, given) for op in kept]
    placed = [(sum(1 for at, _ in kept_at if at < c.start), c) for c in callouts]
    return CallTemplate(path, plan, list(stacks), inputs, stack, calls_before, inner, module_inputs,
                        outputs,
                        output_tensors, spec, counts, largest, parameters, callouts=placed)
