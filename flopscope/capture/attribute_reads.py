"""Which plain attributes of its modules a call reads: what a block's records can depend on besides its arguments,
parameters and structure (:mod:`flopscope.capture.replay` keys a block on these alone; what a call changes it finds by
comparing the attributes before and after).

While a block is watched (:func:`watching`), each of its modules is an instance of a subclass of its own class (made
once per class, with the same name) whose ``__getattribute__`` notes a read of an attribute in the module's own
``__dict__`` (``self.layer_idx``, ``self.scale``; a parameter, buffer or submodule is read through the module's
tables, which a key holds by structure). Reading the whole ``__dict__`` (``vars(self)``) reads every attribute;
``nn.Module``'s own ``__getattr__`` / ``__setattr__`` reading it to find a parameter or submodule does not. The class
is put back when the block returns (also when it raises).

Only modules no one else runs may be watched: the fake run's shadow of a model
(:func:`flopscope.capture.fake.shadow_of`), never the user's modules (another thread would see their class change).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from torch import nn

EVERY = "*"
"""The attribute name of a read of a module's whole ``__dict__``."""
_MODULE_INTERNALS = frozenset(vars(nn.Module()))
"""The attributes every module has (its tables of parameters, buffers, submodules and hooks, ``training``): not
noted (a key holds them itself)."""
_INTERNAL_DICT_READERS = frozenset(f.__code__ for f in (nn.Module.__getattr__, nn.Module.__setattr__,
                                                         nn.Module.__delattr__))


@dataclass
class Log:
    """The attributes a watched call read, as ``(module name in the block, attribute name)`` (``""`` the block itself;
    :data:`EVERY` the whole ``__dict__``)."""

    reads: set[tuple[str, str]] = field(default_factory=set)


@dataclass
class _Watch:
    name: str  # the module's name in the watched block
    own: frozenset[str]  # its own attributes a read is noted of
    log: Log


_WATCHES: dict[int, list[_Watch]] = {}  # id(module) -> the watches it is in (a block inside a watched block: two)
_LOCK = threading.Lock()
_WATCHERS: dict[type, type] = {}  # a module class -> its watching subclass
_WATCHING: set[type] = set()  # the watching subclasses


def own_attributes(module: nn.Module) -> dict[str, Any]:
    """The attributes of ``module`` a read is noted of: its own ``__dict__`` but the tables every module has (and a
    ``forward`` set on the instance)."""
    return {k: v for k, v in vars(module).items() if k not in _MODULE_INTERNALS and k != "forward"}


def note(module: nn.Module, name: str) -> None:
    """Note a read of ``module``'s attribute ``name`` in every watch it is in (a replayed block's reads, for the block
    watched around it)."""
    for watch in _WATCHES.get(id(module), ()):
        watch.log.reads.add((watch.name, name))


@contextmanager
def watching(modules: Mapping[str, nn.Module]) -> Iterator[Log]:
    """For the block, the reads of the plain attributes of ``modules`` (name in the block -> module) are noted in the
    :class:`Log` it yields. A module whose class cannot be swapped (a compiled or extension class) is
    noted as read whole."""
    log = Log()
    swapped: list[tuple[nn.Module, type]] = []
    entered: list[tuple[int, _Watch]] = []
    try:
        for name, module in modules.items():
            watch = _Watch(name, frozenset(own_attributes(module)), log)
            with _LOCK:
                _WATCHES.setdefault(id(module), []).append(watch)
            entered.append((id(module), watch))
            cls = type(module)
            if cls in _WATCHING:
                continue  # (watched already, by a block around this one)
            try:
                object.__setattr__(module, "__class__", _watcher(cls))
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


def _watcher(cls: type) -> type:
    """The subclass of ``cls`` whose instances note reads of their own attributes (made once)."""
    found = _WATCHERS.get(cls)
    if found is not None:
        return found
    get: Any = cls.__getattribute__  # (unbound: the class's own, called with the instance)

    def __getattribute__(self: Any, name: str) -> Any:  # noqa: N807
        value = get(self, name)
        watches = _WATCHES.get(id(self))
        if watches:
            if name == "__dict__":
                if sys._getframe(1).f_code not in _INTERNAL_DICT_READERS:
                    for watch in watches:
                        watch.log.reads.add((watch.name, EVERY))
            else:
                for watch in watches:
                    if name in watch.own:
                        watch.log.reads.add((watch.name, name))
        return value

    found = type(cls.__name__, (cls,), {"__getattribute__": __getattribute__, "__module__": cls.__module__,
                                        "__qualname__": cls.__qualname__})
    with _LOCK:
        found = _WATCHERS.setdefault(cls, found)
        _WATCHING.add(found)
    return found
