"""Repeated calls counted once: on fake tensors, a call of a module whose records are provably those of an earlier
call is not run again; its records are copies of the earlier call's, moved to its own module calls.

On fake tensors (and meta) nothing is computed, so what a call records is decided by what it is given and what it
reads, not by its data: the module (its code, its submodules, their parameters and plain attributes; in a block's key, a
module held as a plain attribute, with no tensors, hooks or ``forward`` of its own, by its structure), the structure
of its arguments, each tensor argument's shape, strides, dtype, device and whether its values are known, every
non-tensor argument's value, and the values it reads. :class:`CallReplayer` runs the first call of each **key**
(everything but the values read) for real, watching it (:meth:`~flopscope.capture.recorder.Recorder.watching`), and
keeps its records as a :class:`CallTemplate` when they are provably the same for every call of that key:

- it read no value (:attr:`~flopscope.capture.recorder.Recorder.value_reads`: no ``.item()``, no output made from
  known values, no formula or index check reading them, no ``.tolist()`` or ``.numpy()`` of a real tensor): values
  are not part of the key, so a call reading them could differ with them;
- it wrote nothing it did not allocate (an input, a parameter, a cache made before it), and what it left in the lists
  and dicts it was given (a cache: ``feat_cache[idx] = frames``, ``feat_idx[0] += 1``) a replay can leave the same:
  entries they held before, its tensor arguments, tensors it made (remade as outputs are) and plain values;
- its outputs are tensors it allocated (no parameter or view of an input handed back; outputs viewing one storage are
  remade as views of one storage, an output given twice as one tensor), none with known values, its tensor arguments
  handed back as they are (a replay hands back its own call's), and plain values (numbers, strings, ``None``);
- it changed no plain attribute of its modules (compared before and after: a replay would not change it);
- where its modules are watched (:attr:`CallReplayer.reads`: a block of the fake run's shadow,
  :mod:`~flopscope.capture.replay.attribute_reads`), the key holds the plain attributes by name, and the template
  the values of those the call read (a layer's own index, read only with a cache, keys nothing when there is none;
  a call of other values of what it read is captured, and may become a template of its own);
- where it was given objects (a KV cache; :attr:`CallReplayer.reads` only), it read none of their state and called
  their methods with tensors, plain values and attributes its blocks differ in: each call is a call-out that a
  replay calls again (:mod:`~flopscope.capture.replay.given_objects`), once a copy of the object shows that it gives
  outputs of the template's sizes;
- grad mode is off (no autograd graph to build; or, for a count that runs no backward, :attr:`CallReplayer.grad`, the
  graph is never used and a replay's outputs require grad as the template's did), autocast is off, the module and its
  submodules carry no hooks of their own and no instance-level ``forward`` (offloading, caching hooks: state the key
  cannot see), and no parameter appeared during the call.

A later call of the same key is then **replayed**: each record of the template is copied with its arguments mapped
(the template's inputs to this call's, its parameters kept), its module calls renumbered after the calls made so
far, and its outputs are new fake tensors of the same sizes, strides and dtypes, produced by the copied records;
the lists and dicts it was given are changed as the template's were (a call whose lists alias otherwise than the
template's, one list given twice, is captured). The capture is the same as running the call again (the same ops,
shapes, MACs, module calls and dataflow): only the order in which the call's inputs first appear as leaves may
differ. A call whose key has no template (refused, with the reason in :attr:`CallReplayer.refused`) is captured
again every time.

What the key cannot see: state a module keeps outside its own attributes (a mutable object's contents, a global) and
values of real inputs read by other means than ATen ops, ``.tolist()`` and ``.numpy()`` (a raw ``data_ptr()``, a C++
extension). Such a module is profiled with reuse off (``profile_pipeline(..., reuse=False)``).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import threading
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils import _pytree as pytree

from ...formulas.registry import shape_of
from ..fake import empty_tensor, non_leaf
from ..module_tracker import ModuleCall, ModuleTracker
from ..recorder import Recorder, Window, storage_of
from ..records import CapturedOp, LeafKind, map_records
from ..scoped_patch import ScopedPatch
from ..state import named_state
from . import attribute_reads, given_objects
from .attribute_reads import EVERY, StandIn, own_attributes
from .given_objects import CallOut

_PLAIN = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.layout,
          torch.memory_format, enum.Enum)
"""Non-tensor values a key holds by value (immutable); anything else is held by identity, or refused as an argument."""
_MAX_PLAIN_ITEMS = 64  # a longer list / tuple / dict attribute is held by identity
_MAX_DEPTH = 4  # how deep inside an attribute a block's key holds objects alike (_held_alike); deeper, by identity
_ABSENT = object()  # the value of an attribute read that a module does not have
_KEPT = 4  # the templates a key keeps (CallReplayer._keep)


@dataclass(frozen=True)
class _Argument:
    """An output that is the call's tensor argument at ``position`` (among its tensor arguments), handed back."""

    position: int


class _Refused(Exception):  # noqa: N818  (a reason, not an error: caught here)
    """Why a call's records cannot be reused."""


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
        return cls(Counter(recorder.unsupported), Counter(recorder.decomposed), Counter(recorder.upper_bounds),
                   recorder.unchecked_lookups, frozenset(recorder.undeclared_kernels), recorder.value_reads,
                   recorder._late_parameters)

    def since(self, before: _Counts) -> _Counts:
        return _Counts(self.unsupported - before.unsupported, self.decomposed - before.decomposed,
                       self.upper_bounds - before.upper_bounds, self.unchecked_lookups - before.unchecked_lookups,
                       self.undeclared_kernels - before.undeclared_kernels, self.value_reads - before.value_reads,
                       self.late_parameters - before.late_parameters)

    def add_to(self, recorder: Recorder) -> None:
        recorder.unsupported.update(self.unsupported)
        recorder.decomposed.update(self.decomposed)
        recorder.upper_bounds.update(self.upper_bounds)
        recorder.unchecked_lookups += self.unchecked_lookups
        recorder.undeclared_kernels.update(self.undeclared_kernels)


_HEAD = ("node_op", "target", "args", "kwargs", "name", "phase", "module_stack")
"""The first fields of :class:`CapturedOp`, in order, which a copy passes first (tests/test_replay.py checks it)."""
_REST = tuple(f.name for f in dataclasses.fields(CapturedOp))[len(_HEAD):]
_REST = _REST[:_REST.index("index")]  # (the dataflow's fields are set when the capture is linked)


@dataclass(frozen=True, slots=True)
class _Copy:
    """One record of a template: ``records_at`` the positions in its ``args`` that hold records a replay maps (made
    in the call, or an input's; a parameter's leaf is the same in every call), or lists, tuples or dicts holding
    some, ``None`` for the leaf of an input (mapped to the replayed call's, not copied);
    ``kwargs_records``: its ``kwargs`` hold records; ``stack_at``: its module stack's position among the template's;
    ``rest`` its fields after ``module_stack``, as a copy takes them."""

    op: CapturedOp
    records_at: tuple[int, ...] | None
    kwargs_records: bool = False
    stack_at: int = 0
    rest: tuple[Any, ...] = ()

    @classmethod
    def of(cls, op: CapturedOp, stack_at: int, mapped: set[int]) -> _Copy:
        def maps(value: Any) -> bool:
            found: list[CapturedOp] = []
            map_records(value, found.append)
            return any(id(record) in mapped for record in found)

        at = tuple(i for i, a in enumerate(op.args) if isinstance(a, (CapturedOp, list, tuple, dict)) and maps(a))
        return cls(op, at, maps(op.kwargs), stack_at, tuple(getattr(op, name) for name in _REST))


@dataclass
class CallTemplate:
    """The records of one call of a module, ready to be copied into a later call of the same key."""

    path: str  # the module's path
    plan: list[_Copy]  # the records the call made that a replay copies or maps, in order
    stacks: list[tuple[ModuleCall, ...]]  # the module stacks of its records (_Copy.stack_at)
    inputs: dict[int, int]  # id(record) of a tensor argument's value -> its position among the tensor arguments
    stack: tuple[ModuleCall, ...]  # the module calls running when the call ran (its own last)
    calls_before: Counter[str]  # calls of each path when the call began (its own counted)
    inner_calls: Counter[str]  # calls of each path inside the call
    module_inputs: dict[ModuleCall, tuple[tuple[int | str, tuple[int, ...]], ...]]  # of the calls inside it
    outputs: list[Any]  # the output's leaves: a tensor's record (its values made anew), or a plain value
    output_tensors: list[torch.Tensor | None]  # the output's tensors (sizes, strides, dtypes to make anew)
    output_spec: pytree.TreeSpec
    counts: _Counts  # what the call added to the recorder's tallies
    largest_out: int  # bytes of the largest tensor the call made
    parameters: dict[int, str] = field(default_factory=dict)  # structural: id(record) of the module's parameter or
    # buffer -> its name in the module (a replay into another module of the same structure takes that one's)
    changes: tuple[_Change, ...] = ()  # the lists and dicts it was given that it changed, as a replay changes them
    containers: tuple[int, ...] = ()  # which of the arguments' lists and dicts are one object (_containers)
    reads: tuple[tuple[str, str], ...] = ()  # the plain attributes it read (module name in it, attribute), where
    # read attributes are keyed (CallReplayer.reads)
    callouts: list[tuple[int, CallOut]] = field(default_factory=list)  # its calls of given objects' methods, each
    # with the number of plan steps before it (a replay calls them again: flopscope.capture.replay.given_objects)


@dataclass(frozen=True)
class _Candidate:
    """A template of a key (or why the key's calls are captured) for the calls whose modules' attributes ``reads``
    hold ``values`` (all calls of the key: ``reads`` empty)."""

    reads: tuple[tuple[str, str], ...]
    values: tuple[Any, ...]
    found: CallTemplate | str


@dataclass
class CallReplayer:
    """Replays repeated calls of the wrapped modules (:meth:`wrapping`) into ``recorder``'s capture; see the module
    docstring. :attr:`replayed` and :attr:`captured` count calls per module path, :attr:`refused` the reasons a
    call's key got no template (each reason once per key), :attr:`missed` per list of blocks the first reason a block
    call was not replayed from an earlier block's (a refusal, or what kept its key from an earlier block's
    template)."""

    recorder: Recorder
    tracker: ModuleTracker
    replayed: Counter[str] = field(default_factory=Counter)
    captured: Counter[str] = field(default_factory=Counter)
    refused: dict[str, list[str]] = field(default_factory=dict)
    missed: dict[str, str] = field(default_factory=dict)
    blocks: bool = True  # also replay a block of a ModuleList from another block of the same structure
    grad: bool = False  # grad mode may be on: no backward follows (a forward's count), so the autograd graph is never
    # used; a replay's outputs require grad as the template's did (the inputs' and parameters' requires_grad are keyed)
    reads: bool = False  # a block is keyed by the plain attributes its first call read, not all it holds (the modules
    # are the run's for its duration, so their classes may be swapped while watched: replay.attribute_reads)
    stand_ins: bool = True  # where a block is given objects, the int attributes its blocks differ in are read as
    # stand-ins (attribute_reads.StandIn); a torch function refusing one fails the run (the runner counts again
    # without: stand_in_refused)
    stood_in: bool = False  # whether a first call ran with stand-ins (a failure of the run is then counted again
    # without: some torch functions refuse a stand-in with a RuntimeError that does not name it)
    _templates: dict[Any, list[_Candidate]] = field(default_factory=dict)
    _ours: set[int] = field(default_factory=set)  # id() of the modules whose forward is our wrapper
    _groups: set[str] = field(default_factory=set)  # the ModuleLists whose blocks are replayed from one another
    _lists: dict[str, nn.Module] = field(default_factory=dict)  # a list of blocks' path -> the list
    _passing: dict[str, dict[str, frozenset[str]]] = field(default_factory=dict)  # (_passed)
    _firsts: dict[str, Any] = field(default_factory=dict)  # a list of blocks' path -> the key of its first call
    _unkeyed: set[str] = field(default_factory=set)  # the lists one of whose blocks' calls could not be keyed (an
    # argument of another type, a shared module): their blocks' calls are captured without a key's cost
    # (a call whose records were refused refuses its key only: T5's first block reads values, the others are replayed)
    _owned: dict[int, bool] = field(default_factory=dict)  # id(block) -> _own_paths
    _roots: list[nn.Module] = field(default_factory=list)  # the wrapped modules
    _named: dict[int, dict[str, nn.Module]] = field(default_factory=dict)  # (_modules_of, of the calls running)
    _held: set[int] | None = None  # id() of the objects the modules hold (given_objects.held_objects), once needed
    _thread: int = field(default_factory=threading.get_ident)  # the thread whose calls are counted

    @contextmanager
    def wrapping(self, modules: Mapping[str, nn.Module], *, blocks_only: bool = False) -> Iterator[CallReplayer]:
        """For the block, each module's ``forward`` replays calls whose key has a template (a wrapper set on the
        instance, removed afterwards; a module with an instance-level ``forward`` already is not wrapped).
        ``blocks_only``: only the blocks of the lists inside them (a model called once: its layers)."""
        with ExitStack() as stack:
            self._roots.extend(modules.values())
            for path, module in modules.items():
                if "forward" in vars(module) and not blocks_only:
                    self.refused.setdefault(path, []).append(
                        "its forward is replaced on the instance (a hook: offloading, caching), state a key cannot "
                        "see")
                    continue
                targets = [] if blocks_only else [(path, module, path, False)]
                if self.blocks:
                    targets += [(f"{inside}.{i}", block, inside, True)
                                for name, blocks in module.named_modules() if _blocks(blocks)
                                for inside in (f"{path}.{name}" if path else name,)
                                for i, block in enumerate(blocks) if "forward" not in vars(block)]
                for name, blocks in (module.named_modules() if self.blocks else ()):
                    if _blocks(blocks):
                        self._lists[f"{path}.{name}" if path else name] = blocks
                for where, target, label, structural in targets:
                    self._ours.add(id(target))
                    target.forward = self._wrapped(where, target, target.forward, label, structural)
                    stack.callback(vars(target).pop, "forward", None)
                    stack.callback(self._ours.discard, id(target))
            yield self

    def notes(self, refusals: bool = True) -> list[str]:
        """One line per module whose calls were replayed, and per list of blocks none of whose calls was, the first
        reason (:attr:`missed`); ``refusals``: also one line per reason a call was refused."""
        lines = []
        for path in sorted(set(self.replayed) | set(self.captured) | set(self.refused)):
            replayed, captured = self.replayed[path], self.captured[path]
            missed = not replayed and captured > 1 and path in self._groups and path in self.missed
            if not refusals and not replayed and not missed:
                continue
            if replayed and path in self._groups:
                lines.append(f"{path}: {replayed} of {replayed + captured} block calls replayed from an earlier call "
                             "of a block of the same structure on the same inputs' shapes (fake tensors: the same "
                             "records)")
            elif replayed:
                lines.append(f"{path}: {replayed} of {replayed + captured} calls replayed from an earlier call of the "
                             "same inputs' shapes (fake tensors: the same records)")
            elif captured > 1 and path not in self.refused and path not in self._groups:
                lines.append(f"{path}: {captured} calls, each captured (no two had the same inputs' shapes and plain "
                             "arguments)")
            reasons = dict.fromkeys(self.refused.get(path, ()) if refusals else ())
            for reason in reasons:
                lines.append(f"{path}: {'some calls' if replayed else 'not replayed, each call'} captured: {reason}")
            if missed and self.missed[path] not in reasons:
                lines.append(f"{path}: not replayed, each of its {captured} block calls captured: {self.missed[path]}")
        return lines

    # ---------------------------------------------------------------------------------------------
    def _wrapped(self, path: str, module: nn.Module, forward: Callable[..., Any], label: str,
                 structural: bool) -> Callable[..., Any]:
        """``module.forward`` replaying where it can; ``label`` names its calls in the notes (a block's: its list);
        ``structural``: keyed by the module's structure, not its identity (a block of a list)."""
        if structural:
            self._groups.add(label)

        @functools.wraps(forward)
        def call(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() != self._thread or (structural and label in self._unkeyed):
                return forward(*args, **kwargs)  # another thread's call (not counted: the tracker's rule), or a block
                # of a list one of whose calls could not be keyed: captured without a key's cost
            self._named.pop(id(module), None)  # (its submodules as they are at this call: a forward may add some)
            try:
                if structural and not self._own_paths(path, module):
                    raise _Refused("a module inside a block is shared with another place (its calls are attributed "
                                   "to its first path)")
                key, tensors, objects = self._key(module, args, kwargs, structural)
            except _Refused as why:
                self._refuse(label, None, str(why))
                self._unkeyed.add(label)
                self.captured[label] += 1
                return forward(*args, **kwargs)
            if structural:
                self._firsts.setdefault(label, key)
            for template in self._found(key, module):  # (the newest first)
                if isinstance(template, CallTemplate) and (
                        not template.changes or _containers((args, kwargs))[1] == template.containers):
                    if template.callouts and not self._callouts_agree(template, objects, module):
                        continue  # (its objects' methods give other sizes here: a decoding step's grown cache)
                    self.replayed[label] += 1
                    return self._replay(template, tensors, path, module, (args, kwargs), objects)
                self.captured[label] += 1  # (refused, or its lists and dicts alias otherwise than the template's)
                return forward(*args, **kwargs)
            self.captured[label] += 1  # (no template, or none whose call-outs give this call's sizes: a new one)
            if structural and label not in self.missed and self.captured[label] + self.replayed[label] > 1:
                self.missed[label] = self._missed(label, key, module)
            return self._first(path, key, forward, args, kwargs, tensors, label, module, structural, objects)

        return call

    def _passed(self, label: str, module: nn.Module) -> dict[str, frozenset[str]]:
        """Per module name in a block of the list ``label``, the attributes whose values differ between its blocks (a
        layer's own index): read as an :class:`~flopscope.capture.replay.attribute_reads.StandIn`, which a block may
        hand to a given object's method without the value keying it."""
        found = self._passing.get(label)
        if found is None:
            blocks: Any = self._lists.get(label, ())
            values = [_attribute_values(dict(block.named_modules())) for block in blocks]
            differ: dict[str, set[str]] = {}
            for key in {k for v in values for k in v}:
                held = [v[key] for v in values if key in v]  # (blocks of other structures may not have it)
                if all(type(h) is int for h in held) and len(set(held)) > 1:
                    differ.setdefault(key[0], set()).add(key[1])
            found = self._passing[label] = {name: frozenset(names) for name, names in differ.items()}
        return found

    def _callouts_agree(self, template: CallTemplate, objects: list[Any], module: nn.Module) -> bool:
        """Whether the template's call-outs, called on copies of this call's ``objects`` with the recorder suspended,
        give outputs of the template's sizes (so that a replay calling them on the objects themselves is the call);
        the objects are not touched."""
        if any(given_objects.watched(obj) for obj in objects):
            return False  # (a block around this one watches them: its first call would take our calls as its own)
        modules = self._modules_of(module)
        twins: dict[int, Any] = {}
        made: dict[int, torch.Tensor] = {}
        with self.recorder.suspended():
            for _, callout in template.callouts:
                obj = objects[callout.at]
                twin = twins.get(id(obj))
                if twin is None:
                    try:
                        twin = twins[id(obj)] = given_objects.detached(obj)
                    except given_objects.NotDetachable:
                        return False  # (a copy its methods could change without changing it cannot be made)
                args, kwargs = _callout_arguments(callout, modules, lambda record, meta: made.get(id(record))
                                                  or _empty(meta))
                try:
                    out = getattr(twin, callout.method)(*args, **kwargs)
                except Exception:  # (the call itself raises it again, for the user to see)
                    return False
                leaves = pytree.tree_leaves(out)
                if len(leaves) != len(callout.outputs):
                    return False
                for leaf, (kind, *rest) in zip(leaves, callout.outputs, strict=True):
                    if kind != "record":
                        if isinstance(leaf, torch.Tensor) or leaf != rest[0]:
                            return False
                    elif not isinstance(leaf, torch.Tensor) or given_objects.meta_of(leaf) != rest[1]:
                        return False
                    else:
                        made[id(rest[0])] = leaf
        return True

    def _call_out(self, callout: CallOut, obj: Any, module: nn.Module, frames: tuple[ModuleCall, ...],
                  mapped: dict[int, CapturedOp], new: Callable[[CapturedOp], CapturedOp]) -> None:
        """Call ``callout``'s method again on ``obj`` in a replay of a call of ``module`` (in the module calls
        ``frames``): its tensor arguments made anew with the replay's records, its attribute arguments this block's;
        its outputs' records are then the replay's (``mapped``)."""
        recorder, tracker = self.recorder, self.tracker
        made: dict[int, torch.Tensor] = {}

        def tensor(record: CapturedOp, meta: given_objects.Meta) -> torch.Tensor:
            found = made.get(id(record))
            if found is None:
                found = made[id(record)] = _empty(meta)
                recorder.set_producer(found, mapped.get(id(record)) or new(record))
            return found

        saved = tracker.stack
        tracker.stack = ()  # (the recorder passes the allocations of its arguments)
        try:
            args, kwargs = _callout_arguments(callout, self._modules_of(module), tensor)
            tracker.stack = frames
            out = getattr(obj, callout.method)(*args, **kwargs)
        finally:
            tracker.stack = saved
        for leaf, (kind, *rest) in zip(pytree.tree_leaves(out), callout.outputs, strict=True):
            if kind == "record":
                mapped[id(rest[0])] = recorder.record_of(leaf)

    def _own_paths(self, path: str, module: nn.Module) -> bool:
        """Whether every module inside ``module`` (at ``path``) has its path under it in the capture (the tracker
        names a module shared by two places by its first path, which a renamed copy would not)."""
        found = self._owned.get(id(module))
        if found is None:
            paths = self.tracker.paths
            found = self._owned[id(module)] = all(
                paths.get(id(m)) == (f"{path}.{name}" if name else path) for name, m in module.named_modules())
        return found

    def _found(self, key: Any, module: nn.Module) -> Iterator[CallTemplate | str]:
        """The templates of ``key`` for this call of ``module`` (or why its calls are captured), the newest first:
        those whose attributes read hold this call's values (several where their call-outs gave other sizes)."""
        for candidate in reversed(self._templates.get(key, ())):
            if not candidate.reads or _read_values(self._modules_of(module), candidate.reads) == candidate.values:
                yield candidate.found

    def _keep(self, key: Any, candidate: _Candidate) -> None:
        """Keep ``candidate`` for ``key``; a key keeps its :data:`_KEPT` newest templates (a decoding step's grown
        cache gives each step's call-outs new sizes: the older steps' templates are never replayed again)."""
        kept = self._templates.setdefault(key, [])
        kept.append(candidate)
        if len(kept) > _KEPT:
            del kept[0]

    def _modules_of(self, module: nn.Module) -> dict[str, nn.Module]:
        """``dict(module.named_modules())``, made once per call of ``module`` (the wrapper drops it at each call:
        a forward may add submodules between two calls)."""
        found = self._named.get(id(module))
        if found is None:
            found = self._named[id(module)] = dict(module.named_modules())
        return found

    def _refuse(self, path: str, key: Any, reason: str, reads: tuple[tuple[str, str], ...] = (),
                values: tuple[Any, ...] = ()) -> None:
        if key is not None:
            self._keep(key, _Candidate(reads, values, reason))
        self.refused.setdefault(path, []).append(reason)
        if path in self._groups:
            self.missed.setdefault(path, reason)

    def _missed(self, label: str, key: Any, module: nn.Module) -> str:
        """Why a call of a block of the list ``label`` (its key ``key``, its module ``module``) found no template
        of an earlier block's to replay: what its key or the attributes it reads hold otherwise than the first
        block's, or (the same key and reads) the sizes its given objects' methods gave."""
        first = self._firsts.get(label)
        if first is not None and first != key:
            return _key_difference(first, key)
        modules = self._modules_of(module)
        differ = sorted({f"{name or '(block)'}.{attribute}"
                         for candidate in self._templates.get(key, ()) if candidate.reads
                         for (name, attribute), was, now in zip(candidate.reads, candidate.values,
                                                                _read_values(modules, candidate.reads), strict=True)
                         if was != now})
        if differ:
            return (f"its blocks differ in the plain attributes their calls read ({', '.join(differ[:3])}"
                    f"{', ...' if len(differ) > 3 else ''}; an object is held alike only where it is a plain value, "
                    "holds plain values or is a module holding no tensors)")
        return ("the objects it is given (a cache) gave other sizes than at an earlier block's call (a decoding "
                "step's grown cache)")

    def _key(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], structural: bool = False
             ) -> tuple[Any, list[torch.Tensor], list[Any]]:
        """The key of a call, and its tensor arguments in order; raises :class:`_Refused` where a call's records
        cannot be decided by a key. ``structural``: the module by its structure (class, submodules, parameter shapes,
        attributes), so that blocks of the same structure share keys."""
        if not self.recorder.fake:
            raise _Refused("a real run computes every call")
        if torch.is_grad_enabled() and not self.grad:
            raise _Refused("grad mode is on (an autograd graph is built)")
        if torch._C._is_any_autocast_enabled():
            raise _Refused("autocast is on")
        leaves, spec = pytree.tree_flatten((args, kwargs))
        tensors: list[torch.Tensor] = []
        objects: list[Any] = []  # (given objects: a block of the shadow's, given a KV cache)
        storages: dict[int, int] = {}
        described: list[Any] = []
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                if not all(type(s) is int for s in (*leaf.shape, *leaf.stride())):
                    raise _Refused("an argument has a symbolic size")
                storage = storage_of(leaf)
                described.append((tuple(leaf.shape), leaf.stride(), leaf.dtype, leaf.device, leaf.requires_grad,
                                  self.recorder.values_known(leaf), storages.setdefault(storage, len(tensors))))
                tensors.append(leaf)
            elif type(leaf) is StandIn:
                raise _Refused("an argument is a module's attribute as read while a block around it was watched")
            elif isinstance(leaf, _PLAIN):
                described.append((type(leaf), leaf))
            elif self.reads and structural and given_objects.can_watch(leaf) and all(o is not leaf for o in objects):
                if self._held is None:
                    self._held = given_objects.held_objects(m for root in self._roots for m in root.modules())
                if id(leaf) in self._held:
                    raise _Refused(f"it is given a {type(leaf).__name__} its model holds (the user's object: only "
                                   "objects the run made or copied are watched)")
                described.append(("object", type(leaf)))  # (what the block does with it is its call-outs)
                objects.append(leaf)
            else:
                raise _Refused(f"an argument is a {type(leaf).__name__} (only tensors and plain values are keyed)")
        identity = type(module) if structural else id(module)
        state = _state(module, self._ours, structural, by_name=structural and self.reads)
        return (identity, str(spec), tuple(described), state), tensors, objects

    def _first(self, path: str, key: Any, forward: Callable[..., Any], args: tuple[Any, ...],
               kwargs: dict[str, Any], tensors: list[torch.Tensor], label: str, module: nn.Module,
               structural: bool, objects: list[Any]) -> Any:
        """Run the call of ``module``, watched; keep its records as the key's template if they are provably every
        call's (``structural``: a block, keyed by its structure)."""
        recorder, tracker = self.recorder, self.tracker
        before = _Counts.of(recorder)
        largest = recorder.largest_out
        recorder.largest_out = 0
        calls_before, stack = Counter(tracker.calls), tracker.stack
        containers, aliasing = _containers((args, kwargs))
        held = [_contents(c) for c in containers]
        watched = self.reads and structural
        modules = self._modules_of(module)
        attributes = _attribute_values(modules)
        reads: tuple[tuple[str, str], ...] = ()
        values: tuple[Any, ...] = ()
        passed = self._passed(label, module) if objects and self.stand_ins and watched else None
        settled = [*containers, *objects, *(vars(m) for m in modules.values())]  # (where a stand-in may be left)
        with recorder.watching() as window:
            try:
                with ExitStack() as watches:
                    watches.enter_context(_PYTHON_READ_PATCH.scope(recorder))
                    self.stood_in = self.stood_in or bool(passed)
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
                    raise _Refused(given.problems[0])
                changed = _attribute_values(modules)
                if changed != attributes:
                    names = sorted({f"{n or '(module)'}.{k}" for n, k in {*changed, *attributes}
                                    if changed.get((n, k), _ABSENT) != attributes.get((n, k), _ABSENT)})
                    raise _Refused(f"it changed attributes of its modules ({', '.join(names[:3])}): state a replay "
                                   "would not change")
                if watched:
                    reads = tuple(sorted(log.reads))
                    values = _read_values(modules, reads, attributes)
                changes, made = _changes(containers, held, tensors, window)
                outputs, output_tensors, spec = self._outputs((out, made), window, tensors)
            except _Refused as why:
                self._refuse(label, key, str(why), reads, values)
                return attribute_reads.settle(out) if passed else out
            finally:
                if passed:
                    attribute_reads.settle(settled)
        try:
            parameters = {} if not structural else {
                id(record): name for name, t in named_state(module) if (record := recorder.made_by(t)) is not None}
            template = self._template(path, window, tensors, stack, calls_before, _Counts.of(recorder).since(before),
                                      outputs, output_tensors, spec, made_largest, parameters, given.calls)
            template.changes, template.containers, template.reads = changes, aliasing, reads
        except _Refused as why:
            self._refuse(label, key, str(why), reads, values)
        else:
            self._keep(key, _Candidate(reads, values, template))
        return out

    def _outputs(self, out: Any, window: Window, arguments: list[torch.Tensor]
                 ) -> tuple[list[Any], list[torch.Tensor | None], pytree.TreeSpec]:
        leaves, spec = pytree.tree_flatten(out)
        records: list[Any] = []
        tensors: list[torch.Tensor | None] = []
        for leaf in leaves:
            if type(leaf) is StandIn:
                raise _Refused("it returns a module's attribute as read (a replay would return the first block's)")
            if isinstance(leaf, torch.Tensor):
                given = next((i for i, t in enumerate(arguments) if t is leaf), None)
                if given is not None:  # (an argument handed back as it is: T5's position bias; a replay hands back
                    records.append(_Argument(given))  # the same argument of its own call)
                    tensors.append(None)
                    continue
                if not window.allocated(leaf):
                    raise _Refused("it returns a tensor it did not allocate (a parameter, a view of an input or a "
                                   "parameter)")
                if self.recorder.value_of(leaf) is not None:
                    raise _Refused("an output's values are known (a later read of them would differ)")
                if leaf.requires_grad and not self.grad:
                    raise _Refused("an output requires grad")
                records.append(self.recorder.record_of(leaf))  # (after a write to it: its version record)
                tensors.append(leaf)
            elif isinstance(leaf, _PLAIN):
                records.append(leaf)
                tensors.append(None)
            else:
                raise _Refused(f"it returns a {type(leaf).__name__} (only tensors and plain values are remade)")
        flags: dict[int, set[bool]] = {}
        for t in tensors:
            if t is not None:
                flags.setdefault(storage_of(t), set()).add(t.requires_grad)
        if any(len(f) > 1 for f in flags.values()):
            raise _Refused("outputs viewing one storage differ in requires_grad (a replay views one base)")
        return records, tensors, spec

    def _template(self, path: str, window: Window, tensors: list[torch.Tensor], stack: tuple[ModuleCall, ...],
                  calls_before: Counter[str], counts: _Counts, outputs: list[Any],
                  output_tensors: list[torch.Tensor | None], spec: pytree.TreeSpec, largest: int,
                  parameters: dict[int, str], callouts: list[CallOut]) -> CallTemplate:
        recorder, tracker = self.recorder, self.tracker
        for callout in callouts:  # (what its call-outs add, a replay's add again)
            before, after = callout.tallies or (counts, counts)
            counts = counts.since(after.since(before))
        if counts.value_reads:
            raise _Refused(f"it read the values of tensors {counts.value_reads} time(s) (what runs may depend on them)")
        if window.outside_writes:
            raise _Refused(f"it wrote {window.outside_writes} time(s) to storage it did not allocate (an input, a "
                           "parameter, a cache)")
        if counts.late_parameters:
            raise _Refused("parameters appeared during the call")
        records = recorder.ops[window.start:]
        for op in records:
            if op.node_op == "call_function" and op.module_stack[:len(stack)] != stack:
                raise _Refused(f"a record ({op.op_name}) is outside the call's module calls")
        inner = Counter(tracker.calls)
        inner.subtract(calls_before)
        inner = +inner
        if path in inner:
            raise _Refused("it calls itself")
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
        made_out = {id(op) for c in callouts for op in recorder.ops[c.start:c.end]}  # (a replay's call-outs make them)
        kept_at = [(at, op) for at, op in enumerate(records, window.start) if id(op) not in made_out and (
            id(op) in inputs or op.node_op == "call_function" or id(op) in fresh)]
        kept = [op for _, op in kept_at]
        given = {id(leaf[1]) for c in callouts for leaf in c.outputs if leaf[0] == "record"}
        mapped = {id(op) for op in kept} | set(inputs) | set(parameters) | given
        plan = [_Copy(op, None) if id(op) in inputs else
                _Copy.of(op, stacks.setdefault(op.module_stack, len(stacks)), mapped) for op in kept]
        placed = [(sum(1 for at, _ in kept_at if at < c.start), c) for c in callouts]
        return CallTemplate(path, plan, list(stacks), inputs, stack, calls_before, inner, module_inputs, outputs,
                            output_tensors, spec, counts, largest, parameters, callouts=placed)

    def _replay(self, template: CallTemplate, tensors: list[torch.Tensor], path: str, module: nn.Module,
                given: tuple[tuple[Any, ...], dict[str, Any]], objects: list[Any]) -> Any:
        """Copy the template's records into this call of ``module`` (at ``path``: the template's module, or another
        of the same structure, whose parameters and module paths its copies take) given ``(args, kwargs)``, calling
        its call-outs again on this call's ``objects`` where they fall; change the lists and dicts it was given as
        the template's call did; return its outputs, made anew."""
        recorder, tracker = self.recorder, self.tracker
        stack, depth = tracker.stack, len(template.stack)
        rename = _renaming(template.path, path)
        offset = {name: tracker.calls[rename(name)] - template.calls_before[name] for name in template.inner_calls}
        stacks = [frames and (*stack, *(ModuleCall(rename(f.path), f.call + offset.get(f.path, 0))
                                        for f in frames[depth:]))
                  for frames in template.stacks]  # (a leaf's stack is empty)
        mapped: dict[int, CapturedOp] = {}
        clones: list[CapturedOp] = []
        copies = recorder.copies if path == template.path else {}  # (another block's records: their own roles)
        state = dict(named_state(module)) if template.parameters else {}
        if template.reads:  # (what the template read, this call read: for a block watched around this one)
            modules = self._modules_of(module)
            for name, attribute in template.reads:
                attribute_reads.note(modules[name], attribute)

        def new(record: CapturedOp) -> CapturedOp:
            found = mapped.get(id(record))
            if found is None:
                position = template.inputs.get(id(record))
                name = template.parameters.get(id(record))
                if position is not None:
                    found = recorder.record_of(tensors[position])
                elif name is not None and name in state:
                    found = recorder.record_of(state[name])
                else:
                    return record  # a parameter, a buffer, a constant: the same in every call
                mapped[id(record)] = found
            return found

        plan, done = template.plan, 0
        for until, callout in (*template.callouts, (len(plan), None)):
            for step in plan[done:until]:  # (the hot loop of a replay: one pass, no call per record but the copy's)
                op = step.op
                at = step.records_at
                if at is None:
                    new(op)  # (a leaf of this call's input, made where the template's was)
                    continue
                args = op.args
                if at:
                    listed = list(args)
                    for i in at:
                        record = listed[i]
                        if type(record) is CapturedOp:
                            listed[i] = mapped.get(id(record)) or new(record)  # (an input's, the first time)
                        else:  # (records inside a list, a tuple, a dict)
                            listed[i] = map_records(record, new)
                    args = tuple(listed)
                clone = CapturedOp(op.node_op, op.target, args,
                                   map_records(op.kwargs, new) if step.kwargs_records else op.kwargs, op.name,
                                   op.phase, stacks[step.stack_at], *step.rest)
                mapped[id(op)] = clone
                clones.append(clone)
                copies[clone] = op
            done = until
            recorder.add_records(clones)
            clones = []
            if callout is not None:  # (its records are made by calling it: after the copies before it)
                frames = (*stack, *(ModuleCall(rename(f.path), f.call + offset.get(f.path, 0))
                                    for f in callout.stack[depth:]))
                self._call_out(callout, objects[callout.at], module, frames, mapped, new)
        for call, shapes in template.module_inputs.items():
            tracker.inputs[ModuleCall(rename(call.path), call.call + offset[call.path])] = shapes
        for name, n in template.inner_calls.items():
            tracker.calls[rename(name)] += n
        template.counts.add_to(recorder)
        recorder.largest_out = max(recorder.largest_out, template.largest_out)
        leaves: list[Any] = []
        tracker.stack = ()  # (so that the recorder passes the allocations below: they are the copies' outputs)
        try:
            made_for: dict[int, torch.Tensor] = {}  # id(template's output) -> the tensor made for it
            bases: dict[int, torch.Tensor] = {}  # storage of the template's outputs -> the storage made for them
            shared = Counter(storage_of(t) for t in template.output_tensors if t is not None)
            for value, like in zip(template.outputs, template.output_tensors, strict=True):
                if like is None:
                    leaves.append(tensors[value.position] if isinstance(value, _Argument) else value)
                    continue
                made = made_for.get(id(like))
                if made is None:  # (an output twice is one tensor twice; outputs viewing one storage view one)
                    storage = storage_of(like)
                    mode = like.fake_mode if isinstance(like, FakeTensor) else None  # (the run's, on the stack or not)
                    cloned = like.requires_grad and like.storage_offset() == 0 and _dense(like)
                    if shared[storage] > 1 or (like.requires_grad and not cloned):  # (outputs viewing one storage:
                        # views of one base, as a run's are)
                        base = bases.get(storage)
                        if base is None:  # (one requires_grad for a storage's outputs: _outputs)
                            size = like.untyped_storage().nbytes() // like.element_size()
                            base = bases[storage] = empty_tensor((size,), (1,), like.dtype, like.device, mode=mode)
                            if like.requires_grad:  # (a run's output is no leaf: an in-place op on it is allowed)
                                base = bases[storage] = non_leaf(base.requires_grad_())
                        made = base.as_strided(like.shape, like.stride(), like.storage_offset())
                    elif cloned:  # (no leaf, as a run's output: a clone keeps the strides of a dense tensor)
                        made = non_leaf(empty_tensor(like.shape, like.stride(), like.dtype, like.device, True, mode))
                    else:
                        made = empty_tensor(like.shape, like.stride(), like.dtype, like.device, mode=mode)
                    made_for[id(like)] = made
                    recorder.set_producer(made, mapped.get(id(value), value))
                    for window in recorder.windows:  # (made by this call, inside any call being watched)
                        window.storages.add(storage_of(made))
                leaves.append(made)
        finally:
            tracker.stack = stack
        out, made = pytree.tree_unflatten(leaves, template.output_spec)
        if template.changes:
            containers = _containers(given)[0]
            held = [_contents(c) for c in containers]
            for change in template.changes:
                change.apply(containers[change.container], held[change.container], tensors, made)
        return out


_Contents = tuple[tuple[Any, ...] | None, tuple[Any, ...]]
"""What a list or dict holds: its keys (``None`` for a list) and its values, in order."""


def _contents(container: list[Any] | dict[Any, Any]) -> _Contents:
    if isinstance(container, dict):
        return tuple(container), tuple(container.values())
    return None, tuple(container)


def _containers(value: Any) -> tuple[list[list[Any] | dict[Any, Any]], tuple[int, ...]]:
    """The lists and dicts inside ``value`` (through tuples, lists and dicts), each once, in the order first met; and
    for each one met, its position among them (two arguments may be one list: a replay changes it once)."""
    found: list[list[Any] | dict[Any, Any]] = []
    at: dict[int, int] = {}
    met: list[int] = []

    def visit(v: Any) -> None:
        if isinstance(v, (list, dict)):
            first = id(v) not in at
            met.append(at.setdefault(id(v), len(found)))
            if not first:
                return
            found.append(v)
        if isinstance(v, (list, tuple)):
            for item in v:
                visit(item)
        elif isinstance(v, dict):
            for item in v.values():
                visit(item)

    visit(value)
    return found, tuple(met)


@dataclass(frozen=True)
class _Change:
    """A list or dict a call was given and changed, as a replay changes it: ``container`` its position among the
    arguments' lists and dicts (:func:`_containers`), ``keys`` a dict's keys after the call (``None``: a list),
    ``items`` its values after the call, each where a replay finds it: ``("was", j)`` the j-th value it held before
    the call, ``("input", i)`` the i-th tensor argument, ``("made", k)`` the k-th tensor the call made and left in
    a list or dict (remade as outputs are), ``("plain", value)`` a plain value."""

    container: int
    keys: tuple[Any, ...] | None
    items: tuple[tuple[str, Any], ...]

    def apply(self, container: list[Any] | dict[Any, Any], before: _Contents, tensors: list[torch.Tensor],
              made: list[torch.Tensor]) -> None:
        sources = {"was": before[1], "input": tensors, "made": made}
        values = [at if kind == "plain" else sources[kind][at] for kind, at in self.items]
        if isinstance(container, dict):
            container.clear()
            container.update(zip(self.keys or (), values, strict=True))
        else:
            container[:] = values


def _changes(containers: list[list[Any] | dict[Any, Any]], held: list[_Contents], tensors: list[torch.Tensor],
             window: Window) -> tuple[tuple[_Change, ...], list[torch.Tensor]]:
    """How a call changed the lists and dicts it was given (``held``: what they held before it), and the tensors it
    made and left in them; raises :class:`_Refused` for a change a replay could not make the same (a new list or
    object put in one, a tensor it did not make, a dict key that is no plain value)."""
    inputs = {id(t): i for i, t in enumerate(tensors)}
    made: list[torch.Tensor] = []
    made_at: dict[int, int] = {}
    changes = []
    for position, (container, (keys, values)) in enumerate(zip(containers, held, strict=True)):
        now_keys, now = _contents(container)
        if now_keys == keys and len(now) == len(values) and all(a is b for a, b in zip(now, values, strict=True)):
            continue
        if now_keys is not None and not all(isinstance(k, _PLAIN) for k in now_keys):
            raise _Refused("it changed a dict it was given whose keys are not plain values")
        items: list[tuple[str, Any]] = []
        for value in now:
            if isinstance(value, torch.Tensor):
                if id(value) in inputs:
                    items.append(("input", inputs[id(value)]))
                    continue
                if not window.allocated(value):
                    raise _Refused("it put a tensor it did not allocate (a parameter, a view of an input) in a list "
                                   "or dict it was given")
                items.append(("made", made_at.setdefault(id(value), len(made))))
                if len(made_at) > len(made):
                    made.append(value)
            elif isinstance(value, _PLAIN) and type(value) is not StandIn:
                items.append(("plain", value))
            else:
                was = next((j for j, v in enumerate(values) if v is value), None)
                if was is None:
                    raise _Refused(f"it put a new {type(value).__name__} in a list or dict it was given (only "
                                   "tensors and plain values are remade)")
                items.append(("was", was))
        changes.append(_Change(position, now_keys, tuple(items)))
    return tuple(changes), made


_PYTHON_READS = ("tolist", "numpy")
"""Tensor methods that read a real tensor's values without an ATen op (a fake tensor's raise): counted as value reads
while a first call is watched."""
_patched: dict[str, Any] = {}  # method name -> the original, while any thread watches a call


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
"""For a scope, in its thread, ``Tensor.tolist()`` and ``Tensor.numpy()`` count as value reads of the scope's
recorder (the methods are wrapped on ``torch.Tensor`` while any thread is in such a scope)."""


def _counted(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def read(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        for recorder in _PYTHON_READ_PATCH.values():
            recorder.value_reads += 1
        return method(self, *args, **kwargs)

    return read


def _state(module: nn.Module, ours: Collection[int] = (), structural: bool = False, by_name: bool = False
           ) -> tuple[Any, ...]:
    """What a call of ``module`` can read of its modules' state, by value where immutable, else by identity:
    each submodule's identity, mode, parameters and buffers (identity, shape, dtype) and plain attributes. Raises
    :class:`_Refused` for a submodule with hooks of its own or an instance-level ``forward`` (not ours: ``ours``).
    ``structural``: submodules by name and class, tensors by shape, dtype and ``requires_grad``, not by identity
    (two blocks of one structure have the same state), and other objects by class and plain attributes.
    ``by_name``: plain attributes by name only (the values a call reads are keyed apart: :func:`_keyed_reads`)."""
    state: list[Any] = []
    held = _held_alike if structural else _held
    for name, m in module.named_modules():
        own = vars(m)
        if m._forward_hooks or m._forward_pre_hooks or (m is not module and "forward" in own and id(m) not in ours):
            raise _Refused(f"{type(m).__name__} inside it has hooks of its own (state a key cannot see)")
        tensors = tuple(((key, tuple(t.shape), t.dtype, t.requires_grad) if structural else
                         (key, id(t), tuple(t.shape), t.dtype)) if t is not None else (key, None)
                        for table in (m._parameters, m._buffers) for key, t in table.items())
        plain = tuple(own_attributes(m)) if by_name else tuple(
            (key, held(value)) for key, value in own_attributes(m).items())
        state.append(((name, type(m)) if structural else id(m), m.training, tensors, plain))
    return tuple(state)


def stand_in_refused(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it) is a function refusing an attribute's stand-in (a torch function taking
    an ``int`` argument: ``histc(bins=self.num_experts)``): the run is made again without stand-ins."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, TypeError) and StandIn.__name__ in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _key_difference(first: Any, key: Any) -> str:
    """What the key of a block's call (:meth:`CallReplayer._key`: class, argument structure, arguments, state) holds
    otherwise than ``first``, its list's first block call's, in words."""
    if first[0] != key[0]:
        return "its blocks are of different classes"
    if first[1] != key[1] or len(first[2]) != len(key[2]):
        return "a block was given arguments of another structure than the first block"
    for i, (was, now) in enumerate(zip(first[2], key[2], strict=True)):
        if was != now:
            said = [f"shape {list(v[0])}, {v[2]}" if len(v) == 7 else f"{v[-1]!r}" for v in (was, now)]
            return (f"a block was given other arguments than the first block (argument {i}: {said[1]}, the first "
                    f"block's {said[0]})")
    if len(first[3]) != len(key[3]):
        return "its blocks hold different submodules"
    for was, now in zip(first[3], key[3], strict=True):
        if was != now:
            name = was[0][0] if isinstance(was[0], tuple) else ""
            where = f"{name} of the block" if name else "the block itself"
            if was[0] != now[0]:
                return f"its blocks hold different submodules ({where}: {was[0][1].__name__}, {now[0][1].__name__})"
            if was[1] != now[1]:
                return f"its blocks are in different modes ({where}: training or eval)"
            if was[2] != now[2]:
                return f"its blocks' parameters or buffers differ in shape, dtype or requires_grad ({where})"
            names = sorted({str(item[0] if isinstance(item, tuple) else item) for item in set(was[3]) ^ set(now[3])})
            return f"its blocks differ in plain attributes ({where}: {', '.join(names[:3])})"
    return "its blocks' keys differ"


def _dense(t: torch.Tensor) -> bool:
    """Whether ``t``'s elements fill its storage without gaps or overlaps in some order of its dims (a transpose of a
    contiguous tensor is; an expanded or sliced one is not): a clone keeps its strides."""
    expected = 1
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride(), strict=True) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return t.numel() > 0


def _empty(meta: given_objects.Meta) -> torch.Tensor:
    """A tensor of ``meta``'s sizes, strides, dtype, device and ``requires_grad`` (fake, or meta: nothing allocated)."""
    return empty_tensor(*meta)


def _callout_arguments(callout: CallOut, modules: Mapping[str, nn.Module],
                       tensor: Callable[[CapturedOp, given_objects.Meta], torch.Tensor]
                       ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``callout``'s ``(args, kwargs)`` in a call of a block whose modules are ``modules``: a tensor argument as
    ``tensor(record, meta)`` gives it, an attribute argument as that block's module holds it, a plain value as it
    was."""
    values = []
    for kind, *rest in callout.leaves:
        if kind == "index":
            name, attribute = rest[0]
            values.append(vars(modules[name])[attribute])
        elif kind == "record":
            values.append(tensor(rest[0], rest[1]))
        else:
            values.append(rest[0])
    args, kwargs = pytree.tree_unflatten(values, callout.spec)
    return tuple(args), dict(kwargs)


def _attribute_values(modules: Mapping[str, nn.Module]) -> dict[tuple[str, str], Any]:
    """The plain attributes of ``modules`` (name -> module) as a key holds them (:func:`_held_alike`)."""
    return {(name, key): _held_alike(value) for name, m in modules.items()
            for key, value in own_attributes(m).items()}


def _read_values(modules: Mapping[str, nn.Module], reads: tuple[tuple[str, str], ...],
                 values: Mapping[tuple[str, str], Any] | None = None) -> tuple[Any, ...]:
    """The values of the attributes ``reads`` of a block's ``modules`` (name -> module), as a key holds them
    (``values``: those of :func:`_attribute_values`, else read now); a read of a module's whole ``__dict__`` holds
    all its attributes."""
    if values is None:
        values = _attribute_values({name: m for name, m in modules.items() if any(name == read for read, _ in reads)})
    found: list[Any] = []
    for name, attribute in reads:
        if attribute == EVERY:
            found.append(tuple((k, v) for (n, k), v in values.items() if n == name))
        else:
            found.append(values.get((name, attribute), _ABSENT))
    return tuple(found)


def _held_alike(value: Any, depth: int = 0) -> Any:
    """As :func:`_held`, but an object other than a plain value, a container, a tensor, a function or a class by its
    class and its plain attributes (an attention processor of each block: equal where they hold the same settings),
    a module that is no submodule as :func:`_module_alike` holds it, and the items of a list, tuple or dict alike too
    (a dict of such modules: each attention module's own wrappers of kernels' functions, ``_kernel_funcs``); a tensor
    that is no parameter by identity (what it holds is not known). ``depth``: how deep inside an attribute ``value``
    is (beyond :data:`_MAX_DEPTH`, by identity: an object may hold itself)."""
    if isinstance(value, _PLAIN) or depth > _MAX_DEPTH:
        return _held(value)
    if isinstance(value, (tuple, list)) and len(value) <= _MAX_PLAIN_ITEMS:
        return (type(value), tuple(_held_alike(v, depth + 1) for v in value))
    if isinstance(value, dict) and len(value) <= _MAX_PLAIN_ITEMS:
        return (dict, tuple((_held(k), _held_alike(v, depth + 1)) for k, v in value.items()))
    if isinstance(value, nn.Module):
        return _module_alike(value, depth)
    if isinstance(value, (tuple, list, dict, torch.Tensor)):
        return _held(value)
    own = getattr(value, "__dict__", None)
    if isinstance(own, dict) and len(own) <= _MAX_PLAIN_ITEMS and all(isinstance(v, _PLAIN) for v in own.values()) \
            and not inspect.isroutine(value) and not isinstance(value, type):  # (a function, a class: by identity)
        return (type(value), tuple(own.items()))
    return ("id", id(value))


def _module_alike(module: nn.Module, depth: int) -> Any:
    """A module held as a plain attribute of a block's module, not as its submodule (kernels' ``use_kernelized_func``
    gives each attention module its own ``nn.Module`` wrapping a function such as ``apply_rotary_pos_emb``, in a
    dict): by its modules' classes, modes and plain attributes (alike) where none of them holds a parameter or a
    buffer, a hook or a ``forward`` of its own: what its calls record is then decided by its code and its arguments,
    as a block's own submodule's is. Else by identity (a parameter it holds is not the block's, so a replay into
    another block could not take that block's)."""
    found: list[Any] = []
    for name, m in module.named_modules():
        own = vars(m)
        if m._parameters or m._buffers or m._forward_hooks or m._forward_pre_hooks or "forward" in own:
            return ("id", id(module))
        found.append((name, type(m), m.training,
                      tuple((k, _held_alike(v, depth + 1)) for k, v in own_attributes(m).items())))
    return (nn.Module, tuple(found))


def _blocks(modules: nn.Module) -> bool:
    """Whether ``modules`` is a list of blocks one may be replayed from another: an ``nn.ModuleList`` of at least two
    modules of one class that hold modules themselves (layers, resnets; not ``[Linear, Dropout]``, not a list holding
    ``None``)."""
    return (isinstance(modules, nn.ModuleList) and len(modules) > 1 and len({type(m) for m in modules}) == 1
            and all(m is not None and next(iter(m.children()), None) is not None for m in modules))


def _renaming(old: str, new: str) -> Callable[[str], str]:
    """The module path ``p`` under ``old`` as the same path under ``new`` (paths outside ``old`` unchanged)."""
    if old == new:
        return lambda p: p
    prefix = old + "."
    return lambda p: new + p[len(old):] if p == old or p.startswith(prefix) else p


def _held(value: Any) -> Any:
    """``value`` as a key holds it: plain values and short containers of them by value, anything else by identity."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, (tuple, list)) and len(value) <= _MAX_PLAIN_ITEMS:
        return (type(value), tuple(_held(v) for v in value))
    if isinstance(value, dict) and len(value) <= _MAX_PLAIN_ITEMS:
        return (dict, tuple((_held(k), _held(v)) for k, v in value.items()))
    if isinstance(value, torch.Tensor):
        return (torch.Tensor, id(value), shape_of(value))
    return ("id", id(value))
