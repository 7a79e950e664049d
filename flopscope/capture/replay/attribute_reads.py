"""Which plain attributes of its modules a call reads: what a block's records can depend
on besides its arguments, parameters and structure (:mod:`flopscope.capture.replay`
keys a block on these alone; what a call changes it finds by comparing the attributes
before and after).

While a block is watched (:func:`watching`), each of its modules is an instance of a
subclass of its own class (made once per class, with the same name) whose
``__getattribute__`` notes a read of an attribute in the module's own ``__dict__``
(``self.layer_idx``, ``self.scale``; a parameter, buffer or submodule is read through
the module's tables, which a key holds by structure). Reading the whole ``__dict__``
(``vars(self)``) reads every attribute; ``nn.Module``'s own ``__getattr__`` /
``__setattr__`` reading it to find a parameter or submodule does not. The class is put
back when the block returns (also when it raises).

An attribute whose value differs between the blocks of a list (a layer's own
``layer_idx``) may be **passed on**: read, it is an :class:`StandIn`, which stands for
the number and notes a read at its first use as one (compared, hashed, used as an index,
in arithmetic, formatted, converted); handed to a method of an object the block is given
(a KV cache's ``update(k, v, self.layer_idx)``:
:mod:`flopscope.capture.replay.given_objects`) it is no read of the block's, so the
block's key does not hold it, and a replay hands its own block's value to that method.

Only modules no one else runs may be watched (another thread would see their class
change): the fake run's shadow of a model (:func:`flopscope.capture.fake.shadow_of`), or
the user's modules in a fake ``profiler`` block or pipeline count, whose parameters are
swapped for fake ones for its duration (other threads must not run them meanwhile:
``docs/conventions.md``); never the user's modules in a real run. The swap keeps
``isinstance``, the class's name and its methods; only an identity test of the class
itself (``type(self) is Cls``) sees the subclass: torch's modules, transformers' models
and caches and diffusers' models make none (searched in their sources, torch 2.13,
transformers 5.24, diffusers 0.42). A stand-in a call leaves where it can see (the
lists, dicts and objects it was given, its modules' attributes, its outputs) is the
number again when the call returns (:func:`settle`).
"""

from __future__ import annotations

import collections
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..fake import ATOMS

EVERY = "*"
"""The attribute name of a read of a module's whole ``__dict__``."""
_MODULE_INTERNALS = frozenset(vars(nn.Module()))
"""The attributes every module has (its tables of parameters, buffers, submodules and
hooks, ``training``): not noted (a key holds them itself)."""
_INTERNAL_DICT_READERS = frozenset(f.__code__ for f in (nn.Module.__getattr__,
                                                        nn.Module.__setattr__,
                                                         nn.Module.__delattr__))


@dataclass
class Log:
    """The attributes a watched call read, as ``(module name in the block, attribute
    name)`` (``""`` the block itself; :data:`EVERY` the whole ``__dict__``)."""

    reads: set[tuple[str, str]] = field(default_factory=set)


@dataclass
class _Watch:
    name: str  # the module's name in the watched block
    own: frozenset[str]  # its own attributes a read is noted of
    log: Log
    passed: frozenset[str] = frozenset()  # the int attributes read as an StandIn


class StandIn:
    """An int attribute of a watched module as a read gives it (:func:`watching`'s
    ``passed``): it behaves as the number, and its first use as one notes the read in
    ``logs``; :func:`value_of` is the number without a use."""

    __slots__ = ("_reads", "_value")

    def __init__(self, value: int, reads: list[tuple[Log, tuple[str, str]]]) -> None:
        self._value, self._reads = value, reads

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # isinstance(index, int), as of the number (type() still tells)
        return int

    def _use(self) -> int:
        for log, read in self._reads:
            log.reads.add(read)
        return self._value

    def __repr__(self) -> str:
        return repr(self._use())

    def __getattr__(self, name: str) -> Any:  # (bit_length, real, numerator, ...)
        return getattr(self._use(), name)


def _use_as_int(name: str) -> Any:
    def method(self: StandIn, *args: Any) -> Any:
        return getattr(self._use(), name)(*(value_of(a) for a in args))

    method.__name__ = name
    return method


for _name in ("__index__", "__int__", "__float__", "__complex__", "__bool__", "__hash__", "__str__",
              "__format__",
              "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__neg__", "__pos__",
              "__abs__", "__invert__",
              "__round__", "__trunc__", "__floor__", "__ceil__", "__add__", "__radd__", "__sub__",
              "__rsub__",
              "__mul__", "__rmul__", "__floordiv__", "__rfloordiv__", "__truediv__", "__rtruediv__",
              "__mod__",
              "__rmod__", "__divmod__", "__rdivmod__", "__pow__", "__rpow__", "__lshift__",
              "__rlshift__",
              "__rshift__", "__rrshift__", "__and__", "__rand__", "__or__", "__ror__", "__xor__",
              "__rxor__",
              "__getnewargs__", "__reduce__", "__reduce_ex__", "__copy__", "__deepcopy__",
              "__sizeof__"):
    setattr(StandIn, _name, _use_as_int(_name))


def value_of(value: Any) -> Any:
    """``value``, or the number an :class:`StandIn` stands for (no use of it)."""
    return value._value if type(value) is StandIn else value


def settle(root: Any, depth: int = 6) -> Any:
    """``root`` with every :class:`StandIn` it holds replaced by its number: in lists,
    dicts (keys too), sets and deques in place, in tuples and frozensets by a new one
    put where the old one was, in the ``__dict__`` of plain objects; ``depth``
    levels. Returns ``root`` itself (changed in place), or what stands for it where
    it cannot change (a stand-in, a tuple). A stand-in never outlives the call that
    read it (a block may put its index in a list or on an object it is given, or
    return it; that call is no template, and what it left is the number a run
    leaves)."""
    seen: dict[int, Any] = {}

    def settled(value: Any, level: int) -> Any:
        """``value`` with its stand-ins replaced: itself (changed in place where it
        holds any), or a new tuple or frozenset."""
        kind = type(value)
        if kind is StandIn:
            return value._value
        if kind in ATOMS or level > depth or isinstance(value, (type, torch.Tensor, nn.Module)):
            return value
        if id(value) in seen:
            return seen[id(value)]
        seen[id(value)] = value
        if isinstance(value, (list, collections.deque)):
            for i, item in enumerate(value):
                now = settled(item, level + 1)
                if now is not item:
                    value[i] = now
        elif isinstance(value, dict):
            items = [(k0, settled(k0, level + 1), v0, settled(v0, level + 1)) for k0, v0 in value.items()]
            # (a key: the dict made again, in its order)
            if any(k is not k0 for k0, k, _, _ in items):
                value.clear()
                value.update((k, v) for _, k, _, v in items)
            # (values only: each set again, as a dict subclass that refuses clear()
            # takes them)
            else:
                for k, _, v0, v in items:
                    if v is not v0:
                        value[k] = v
        elif isinstance(value, set):
            items = [settled(item, level + 1) for item in value]
            if any(a is not b for a, b in zip(items, value, strict=True)):
                value.clear()
                value.update(items)
        elif isinstance(value, (tuple, frozenset)):
            items = [settled(item, level + 1) for item in value]
            if any(a is not b for a, b in zip(items, value, strict=True)):
                remade = frozenset(items) if isinstance(value, frozenset) else \
                    kind._make(items) if hasattr(kind, "_make") else tuple(items)
                seen[id(value)] = remade
                return remade
        else:
            attrs = getattr(value, "__dict__", None)
            if type(attrs) is dict:
                settled(attrs, level)
        return value

    return settled(root, 0)


# id(module) -> the watches it is in (a block inside a watched block: two)
_WATCHES: dict[int, list[_Watch]] = {}
_LOCK = threading.Lock()
# (what it watches for, a class) -> its watching subclass
_WATCHERS: dict[tuple[str, type], type] = {}
_WATCHING: set[type] = set()  # the watching subclasses


def watching_subclass(cls: type, kind: str, make: Callable[[type], dict[str, Any]]) -> type:
    """The subclass of ``cls`` (same name, module and qualified name) that watches its
    instances for ``kind``, made once from the methods ``make(cls)`` gives (here:
    attribute reads; :mod:`flopscope.capture.replay.given_objects`: calls of a given
    object's methods)."""
    found = _WATCHERS.get((kind, cls))
    if found is None:
        found = type(cls.__name__, (cls,), {**make(cls), "__module__": cls.__module__,
                                            "__qualname__": cls.__qualname__})
        with _LOCK:
            found = _WATCHERS.setdefault((kind, cls), found)
            _WATCHING.add(found)
    return found


def is_watching(cls: type) -> bool:
    """Whether ``cls`` is a watching subclass (its instances are watched now, by a block
    around this one)."""
    return cls in _WATCHING


def own_attributes(module: nn.Module) -> dict[str, Any]:
    """The attributes of ``module`` a read is noted of: its own ``__dict__`` but the
    tables every module has (and a ``forward`` set on the instance)."""
    return {k: v for k, v in vars(module).items() if k not in _MODULE_INTERNALS and k != "forward"}


def note(module: nn.Module, name: str) -> None:
    """Note a read of ``module``'s attribute ``name`` in every watch it is in (a
    replayed block's reads, for the block watched around it)."""
    for watch in _WATCHES.get(id(module), ()):
        watch.log.reads.add((watch.name, name))


@contextmanager
def watching(modules: Mapping[str, nn.Module], passed: Mapping[str, frozenset[str]] | None = None
             ) -> Iterator[Log]:
    """For the block, the reads of the plain attributes of ``modules`` (name in the
    block -> module) are noted in the :class:`Log` it yields; ``passed``: per module
    name, the int attributes read as an :class:`StandIn`. A module whose class cannot be
    swapped (a compiled or extension class) is noted as read whole."""
    log = Log()
    swapped: list[tuple[nn.Module, type]] = []
    entered: list[tuple[int, _Watch]] = []
    try:
        for name, module in modules.items():
            watch = _Watch(name, frozenset(own_attributes(module)), log,
                           (passed or {}).get(name, frozenset()))
            with _LOCK:
                _WATCHES.setdefault(id(module), []).append(watch)
            entered.append((id(module), watch))
            cls = type(module)
            if cls in _WATCHING:
                continue  # (watched already, by a block around this one)
            try:
                object.__setattr__(module, "__class__", watching_subclass(cls, "reads", _reading))
            except TypeError:
                log.reads.add((name, EVERY))
                continue
            swapped.append((module, cls))
        yield log
    finally:
        with _LOCK:
            for key, watch in entered:
                watches = _WATCHES[key]
                watches.remove(watch)
                if not watches:
                    del _WATCHES[key]
        for module, cls in swapped:
            object.__setattr__(module, "__class__", cls)


def _reading(cls: type) -> dict[str, Any]:
    """The methods of the subclass of ``cls`` whose instances note reads of their own
    attributes."""
    get: Any = cls.__getattribute__  # (unbound: the class's own, called with the instance)

    def __getattribute__(self: Any, name: str) -> Any:  # noqa: N807
        value = get(self, name)
        watches = _WATCHES.get(id(self))
        if watches:
            if name == "__dict__":
                if sys._getframe(1).f_code not in _INTERNAL_DICT_READERS:
                    for watch in watches:
                        watch.log.reads.add((watch.name, EVERY))
            elif type(value) is int and all(name in watch.passed for watch in watches):
                return StandIn(value, [(watch.log, (watch.name, name)) for watch in watches])
            else:
                for watch in watches:
                    if name in watch.own:
                        watch.log.reads.add((watch.name, name))
        return value

    return {"__getattribute__": __getattribute__}
