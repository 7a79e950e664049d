"""Objects a block is given (a Hugging Face KV cache): which of their methods the block
calls, for a replay to call again.

While a block's first call of a key runs (:mod:`flopscope.capture.replay`), each object
among its arguments that is no tensor, plain value or container (a ``transformers``
``Cache``) is watched: its class is swapped for a subclass (made once per class, with
the same name) whose attribute reads give its methods wrapped, and note any other read
(the object's state: what the block records may depend on it, so the call is no
template). A call of a method from the block is a :class:`CallOut`, recorded with

- its arguments: a tensor as its record and its sizes, strides, dtype, device and
  ``requires_grad``; an :class:`~flopscope.capture.replay.attribute_reads.StandIn` (a
  layer's own ``layer_idx``) as the attribute it stands for, not as a read of it; a
  plain value as it is (anything else: the call is no template);
- the records it made (their positions in the capture), which a replay makes again by
  calling the method;
- its outputs: tensors it made, or plain values.

Inside the method nothing is watched: the object's own code reads its state as it likes.
A replay calls each method again, on its own call's object, with its own tensors and its
own block's attribute values, after calling them first on a copy of the object
(:func:`detached`: the plain objects and containers it holds copied, six levels down)
with the recorder suspended, to check that they give outputs of the same sizes (else the
block is captured, and the object was not touched; so it is where no such copy can be
made: state deeper than that, an object whose copy is itself). Only objects the run made
or copied may be watched (a fake run's, never the user's): an object the model's modules
hold (through their attributes, the lists and dicts there and those objects' own) is
refused by :mod:`flopscope.capture.replay`; one that only a Python module's globals hold
is not seen.
"""

from __future__ import annotations

import collections
import copy
import inspect
import threading
import types
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils import _pytree as pytree

from ..fake import ATOMS
from ..module_tracker import ModuleCall, ModuleTracker
from ..recorder import Recorder
from ._refusals import (
    CALLOUT_TENSOR_NOT_MADE,
    OBJECT_READ,
    OBJECT_SET,
    OTHER_CALLOUT_ARGUMENT,
    OTHER_CALLOUT_OUTPUT,
    OUTSIDE_ATTRIBUTE,
    UNWATCHABLE_OBJECT,
)
from .attribute_reads import Log, StandIn, is_watching, own_attributes, value_of, watching_subclass

Meta = tuple[tuple[int, ...], tuple[int, ...], torch.dtype, torch.device, bool,
             FakeTensorMode | None]
"""A tensor as a call-out takes or gives it: sizes, strides, dtype, device,
``requires_grad``, and the fake-tensor mode of a fake one (what
:func:`~flopscope.capture.fake.empty_tensor` makes it again with)."""


def meta_of(t: torch.Tensor) -> Meta:
    return (tuple(t.shape), t.stride(), t.dtype, t.device, t.requires_grad,
            t.fake_mode if isinstance(t, FakeTensor) else None)


@dataclass
class CallOut:
    """One call of a method of a given object from a block: ``at`` the object's position
    among the block's given objects; ``leaves`` and ``spec`` its ``(args, kwargs)``:
    ``("record", record, meta)``, ``("index", (module name, attribute))`` or
    ``("plain", value)``; ``start``/``end`` the positions of the records it made in
    the recorder's ops; ``stack`` the module calls running; ``outputs`` and
    ``output_spec`` what it returned: ``("record", record, meta)`` or ``("plain",
    value)``; ``tallies`` the recorder's tallies before and after it (what the call
    added)."""

    at: int
    method: str
    leaves: list[tuple[Any, ...]]
    spec: pytree.TreeSpec
    start: int
    end: int
    stack: tuple[ModuleCall, ...]
    outputs: list[tuple[Any, ...]] = field(default_factory=list)
    output_spec: pytree.TreeSpec | None = None
    tallies: tuple[Any, Any] | None = None


@dataclass
class ObjectLog:
    """What a watched call did with the objects it was given: ``calls`` its call-outs,
    in order; ``problems`` why it can be no template (a read of an object's state, an
    argument or output a replay could not give again: the words of refusals in
    :data:`~._refusals.REFUSALS`)."""

    calls: list[CallOut] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


@dataclass
class _Watch:
    at: int
    log: ObjectLog
    block: Log  # the attribute log of the same call (an StandIn is that call's attribute)
    recorder: Recorder
    tracker: ModuleTracker
    tally: Callable[[], Any]
    thread: int
    inside: int = 0


_WATCHES: dict[int, _Watch] = {}  # id(object) -> its watch
_LOCK = threading.Lock()


def can_watch(obj: Any) -> bool:
    """Whether ``obj`` may be a given object: an instance of a plain Python class (not a
    tensor, module, function, class or container), not watched already (by a block
    around this one). Decided once per class."""
    kind = type(obj)
    found = _WATCHABLE.get(kind)
    if found is None:
        found = _WATCHABLE[kind] = (
            getattr(kind, "__dictoffset__", 0) != 0 and not issubclass(kind, (torch.Tensor, nn.Module, type, list,
                                                                              tuple, dict))
            and not inspect.isroutine(obj) and not is_watching(kind))
    return found


_WATCHABLE: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()
""":func:`can_watch` per class (weak: classes are made at run time too)."""


@contextmanager
def watching(objects: Sequence[Any], block: Log, recorder: Recorder, tracker: ModuleTracker,
             tally: Callable[[], Any]) -> Iterator[ObjectLog]:
    """For the block, the calls of the methods of ``objects`` made outside their own
    methods are recorded in the :class:`ObjectLog` it yields (``tally``: the recorder's
    tallies now)."""
    log = ObjectLog()
    swapped: list[tuple[Any, type]] = []
    try:
        for at, obj in enumerate(objects):
            cls = type(obj)
            with _LOCK:
                _WATCHES[id(obj)] = _Watch(at, log, block, recorder, tracker, tally,
                                           threading.get_ident())
            try:
                object.__setattr__(obj, "__class__",
                                   watching_subclass(cls, "calls", _calling_methods))
            except TypeError:
                log.problems.append(UNWATCHABLE_OBJECT.say(kind=cls.__name__))
                continue
            swapped.append((obj, cls))
        yield log
    finally:
        with _LOCK:
            for obj in objects:
                _WATCHES.pop(id(obj), None)
        for obj, cls in swapped:
            object.__setattr__(obj, "__class__", cls)


def _copied_as(kind: type, value: Any) -> str:
    """How :func:`detached` copies an instance of ``kind`` (``value``): ``"dict"``,
    ``"sequence"`` (a list or a deque), ``"set"``, ``"tuple"`` (a tuple or a named
    tuple: made anew), any of their subclasses included; for a plain object,
    ``"plain"`` where its class changes nothing of how it is copied (a new instance,
    its ``__dict__`` copied, as ``copy.copy`` would make it), else ``"object"``
    (``copy.copy``); ``""``, nothing to copy (a tensor, a number, a string, a module,
    a function, a class)."""
    if issubclass(kind, dict):
        return "dict"
    if issubclass(kind, (list, collections.deque)):
        return "sequence"
    if issubclass(kind, set):
        return "set"
    if kind is tuple or (issubclass(kind, tuple) and hasattr(kind, "_make")):
        return "tuple"
    if not can_watch(value) or issubclass(kind, types.ModuleType):
        return ""
    plain = (kind.__reduce_ex__ is object.__reduce_ex__ and kind.__reduce__ is object.__reduce__
             and kind.__new__ is object.__new__ and not hasattr(kind, "__getnewargs_ex__")
             and not hasattr(kind, "__getnewargs__") and not hasattr(kind, "__copy__")
             and not hasattr(kind, "__setstate__")
             and getattr(kind, "__getstate__", None) is getattr(object, "__getstate__", None)
             and not any(name not in ("__dict__", "__weakref__") for c in kind.__mro__
                         # (abc.ABC's empty slots are none)
                         for name in _names(vars(c).get("__slots__", ()))))
    return "plain" if plain else "object"


def _names(slots: Any) -> tuple[str, ...]:
    return (slots,) if isinstance(slots, str) else tuple(slots)


_COPIES: weakref.WeakKeyDictionary[type, str] = weakref.WeakKeyDictionary()
""":func:`_copied_as` per class (weak: classes are made at run time too)."""


def held_objects(modules: Iterable[nn.Module], depth: int = 6) -> set[int]:
    """``id()`` of the objects that could be given objects (:func:`can_watch`) which
    ``modules`` hold: in their own attributes, the lists, tuples and dicts there, and
    those objects' own attributes, ``depth`` levels (a config and its sub-configs, a
    cache a model keeps). They are the user's (a fake run's shadow shares them):
    never watched."""
    found: set[int] = set()
    seen: set[int] = set()

    def visit(value: Any, level: int) -> None:
        if level > depth or id(value) in seen or type(value) in ATOMS:
            return
        seen.add(id(value))
        if isinstance(value, (list, tuple, set, frozenset)):
            for item in value:
                visit(item, level + 1)
        elif isinstance(value, dict):
            for item in value.values():
                visit(item, level + 1)
        elif can_watch(value) and not isinstance(value, types.ModuleType):
            found.add(id(value))
            attrs = getattr(value, "__dict__", None)
            if type(attrs) is dict:
                for item in attrs.values():
                    visit(item, level + 1)

    for module in modules:
        for value in own_attributes(module).values():
            visit(value, 0)
    return found



def watched(obj: Any) -> bool:
    """Whether ``obj`` is watched now (by a first call running)."""
    return id(obj) in _WATCHES


class NotDetachable(Exception):  # noqa: N818  (a signal between two functions of the package, never raised out)
    """:func:`detached` cannot make a copy that a call can change without changing the
    original (why: its text)."""


def detached(obj: Any, depth: int = 6) -> Any:
    """A copy of ``obj`` that a call of its methods can change without changing ``obj``:
    the plain objects and the containers (lists, dicts, sets, deques and their
    subclasses, tuples) it holds copied too, ``depth`` levels down (a cache's layers and
    what they hold), each once (what two of them share, their copies share); tensors,
    modules, numbers and what else holds no state are not copied (a method replaces a
    tensor, as a cache's ``self.keys = torch.cat(...)`` does; a write into one changes
    no data of a fake tensor). Raises :class:`NotDetachable` where it cannot: a
    container or plain object deeper than ``depth``, one whose copy is itself (a
    ``__copy__`` returning ``self``, a logger) or that cannot be copied."""
    memo: dict[int, Any] = {}

    def copied(value: Any, level: int) -> Any:
        kind = type(value)
        how = _COPIES.get(kind)
        if how is None:
            how = _COPIES[kind] = _copied_as(kind, value)
        if not how:
            return value
        found = memo.get(id(value))
        if found is not None:
            return found
        twin: Any
        if how == "tuple":  # (immutable: what it holds is copied, at its own depth)
            items = [copied(v, level + 1) for v in value]
            twin = memo[id(value)] = tuple(items) if kind is tuple else kind._make(items)
            return twin
        if level > depth:
            raise NotDetachable(f"a {kind.__name__} more than {depth} levels inside it")
        if how == "plain":  # (what copy.copy does for it, without its protocol's cost)
            twin = object.__new__(kind)
            object.__setattr__(twin, "__dict__", dict(vars(value)))
        else:
            try:
                twin = copy.copy(value)
            except Exception as error:  # (a lock, a file, a stream: it cannot be copied)
                raise NotDetachable(f"a {kind.__name__} cannot be copied ({type(error).__name__})") from error
            if twin is value:
                raise NotDetachable(f"a copy of a {kind.__name__} is itself")
        memo[id(value)] = twin
        if how == "dict":
            for key in list(twin):
                twin[key] = copied(twin[key], level + 1)
        elif how == "sequence":  # (a list or a deque: the same items, copied, in place)
            items = [copied(v, level + 1) for v in twin]
            twin.clear()
            twin.extend(items)
        elif how == "set":
            items = [copied(v, level + 1) for v in twin]
            twin.clear()
            twin.update(items)
        else:
            own = vars(twin)
            for key, held in list(own.items()):
                # (a tensor, a number: kept as it is, without a call)
                if _COPIES.get(type(held), True):
                    own[key] = copied(held, level + 1)
        return twin

    return copied(obj, 0)


def _calling_methods(cls: type) -> dict[str, Any]:
    """The methods of the subclass of ``cls`` whose instances record calls of their
    methods from a watched block."""
    get: Any = cls.__getattribute__

    def __getattribute__(self: Any, name: str) -> Any:  # noqa: N807
        value = get(self, name)
        watch = _WATCHES.get(id(self))
        if watch is None or watch.inside or threading.get_ident() != watch.thread or name == "__class__":
            return value
        if isinstance(value, types.MethodType) and value.__self__ is self:
            return _calling(watch, name, value)
        watch.log.problems.append(OBJECT_READ.say(name=name, kind=cls.__name__))
        return value

    def changed(self: Any, name: str) -> None:
        watch = _WATCHES.get(id(self))
        if watch is not None and not watch.inside and threading.get_ident() == watch.thread:
            watch.log.problems.append(OBJECT_SET.say(name=name, kind=cls.__name__))

    put: Any = cls.__setattr__
    remove: Any = cls.__delattr__

    def __setattr__(self: Any, name: str, value: Any) -> None:  # noqa: N807
        changed(self, name)
        put(self, name, value)

    def __delattr__(self: Any, name: str) -> None:  # noqa: N807
        changed(self, name)
        remove(self, name)

    return {"__getattribute__": __getattribute__, "__setattr__": __setattr__,
            "__delattr__": __delattr__}


def _calling(watch: _Watch, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    """``method``, recording its calls as call-outs of ``watch``'s block."""

    def call(*args: Any, **kwargs: Any) -> Any:
        recorder, log = watch.recorder, watch.log
        leaves, spec = pytree.tree_flatten((args, kwargs))
        described: list[tuple[Any, ...]] = []
        for leaf in leaves:
            if type(leaf) is StandIn:
                read = next((r for block, r in leaf._reads if block is watch.block), None)
                if read is None:
                    log.problems.append(OUTSIDE_ATTRIBUTE.say(method=name))
                described.append(("index", read))
            elif isinstance(leaf, torch.Tensor):
                described.append(("record", recorder.record_of(leaf), meta_of(leaf)))
            elif leaf is None or isinstance(leaf, (bool, int, float, str, torch.dtype,
                                                   torch.device)):
                described.append(("plain", leaf))
            else:
                log.problems.append(OTHER_CALLOUT_ARGUMENT.say(method=name,
                                                               kind=type(leaf).__name__))
                described.append(("plain", leaf))
        given = pytree.tree_unflatten([value_of(leaf) for leaf in leaves], spec)
        before = watch.tally()
        start, stack = len(recorder.ops), watch.tracker.stack
        watch.inside += 1
        try:
            out = method(*given[0], **given[1])
        finally:
            watch.inside -= 1
        end = len(recorder.ops)
        made = {id(op) for op in recorder.ops[start:end]}
        callout = CallOut(watch.at, name, described, spec, start, end, stack)
        out_leaves, callout.output_spec = pytree.tree_flatten(out)
        for leaf in out_leaves:
            if isinstance(leaf, torch.Tensor):
                record = recorder.record_of(leaf)
                if id(record) not in made:
                    log.problems.append(CALLOUT_TENSOR_NOT_MADE.say(method=name))
                callout.outputs.append(("record", record, meta_of(leaf)))
            elif leaf is None or (isinstance(leaf, (bool, int, float, str)) and type(leaf) is not StandIn):
                callout.outputs.append(("plain", leaf))
            else:
                log.problems.append(OTHER_CALLOUT_OUTPUT.say(method=name, kind=type(leaf).__name__))
                callout.outputs.append(("plain", leaf))
        callout.end = len(recorder.ops)
        callout.tallies = (before, watch.tally())
        log.calls.append(callout)
        return out

    return call
