"""Where model code keeps tensors between forwards, and the fake tensors a fake run must
not leave there.

A fake run executes the model's own Python code on fake tensors. Code that caches what
it computes keeps those fake tensors after the run: a ``functools.lru_cache``'d position
embedding keyed on ``(shape, device, dtype)`` (fake tensors report the real device, so
the key is the one a real call makes), a module-level dict, an attribute set during the
forward on an object the model's modules share with the caller (a config). Left there,
they poison every later forward, flopscope's and the user's own: a real op given a fake
operand returns a fake tensor. :class:`CacheGuard` is taken before a fake run and
:meth:`CacheGuard.restore` d after it (also when the forward raised, before a fall-back
to real execution).

What it covers, for every class in the method resolution order of every module of the
model (PyTorch's own classes aside):

- the globals of the Python module that defines the class, and the class's own
  ``__dict__``;
- from there, the callables reachable through ``staticmethod`` / ``classmethod`` /
  ``property``, ``__wrapped__``, closures, default arguments and ``functools.partial``
  (transformers' ``compile_compatible_method_lru_cache`` keeps its ``lru_cache`` in a
  closure), three levels deep;
- the mutable stores found there: ``dict`` / ``list`` globals and class attributes,
  closure cells, and the ``__dict__`` of the plain objects the model's modules hold as
  attributes (configs: a fake run's shadow shares them with the model), with the dicts
  and lists those objects hold (a table kept by key) and, three levels down, the same of
  the plain objects they hold (a cache on a holder);
- ``functools.lru_cache`` / ``functools.cache`` wrappers found the same way.

A store's entry that the run added or replaced, and that holds a fake tensor (itself, or
inside tuples, lists, dicts or plain objects, three levels deep), is put back to what it
was (or removed). An ``lru_cache`` that missed during the run is emptied with
``cache_clear()``: its entries cannot be read one by one (the C implementation hides
bounded caches' contents), and emptying a cache only costs recomputation.

What it cannot cover: caches in modules that define none of the model's classes and are
reached only at run time (through ``getattr`` on an imported module, say), caches in C++
extensions, tensors stored on other tensors' attributes, and a forward of the same model
that another thread runs *during* the fake run (it may read a fake entry before the
restore). A real run that meets a fake tensor anyway stops with an error
(:class:`flopscope.capture.recorder.FakeTensorInRealRun`); :func:`fake_tensors_held`
names where they sit.
"""

from __future__ import annotations

import collections
import functools
import gc
import sys
import types
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from .fake import modules_of

_LRU = functools._lru_cache_wrapper
_DEPTH = 3  # levels of callables followed from a root, and of containers searched for a fake tensor
_MISSING = object()
_PLAIN = frozenset({int, float, str, bool, type(None), dict, list, tuple, set,
                    collections.OrderedDict, torch.Tensor,
                    # attribute types skipped at once (most of a module's attributes)
                    nn.Parameter})
# the shadow copies these
_NOT_SHARED = (nn.Module, type, types.ModuleType, torch.Tensor, dict, list, tuple, set)
_SKIPPED_PACKAGES = ("torch", "flopscope", "builtins", "typing", "functools", "abc")


def _holds_fake(value: Any, depth: int = _DEPTH) -> bool:
    """Whether ``value`` is a fake tensor or holds one (tuples, lists, sets, dicts' keys
    and values, plain objects' attributes; ``depth`` levels)."""
    if isinstance(value, FakeTensor):
        return True
    if depth <= 0 or isinstance(value, (str, bytes, int, float, bool, type(None), type, nn.Module,
                                        types.FunctionType, types.ModuleType)):
        return False
    if isinstance(value, dict):
        return any(_holds_fake(k, depth - 1) or _holds_fake(v, depth - 1) for k, v in _entries(value))
    if isinstance(value, (tuple, list, set, frozenset)):
        return any(_holds_fake(v, depth - 1) for v in value)
    attrs = getattr(value, "__dict__", None)
    return isinstance(attrs, dict) and any(_holds_fake(v, depth - 1) for v in attrs.values())


def _entries(table: dict[Any, Any]) -> list[tuple[Any, Any]]:
    """The ``(key, value)`` pairs ``table`` holds, read as a plain dict: a subclass's
    own ``__getitem__`` / ``items`` is not called (transformers' activation table
    ``ACT2FN`` builds an activation module at each ``[key]``, and one of them warns
    when it is built)."""
    return list(dict.items(table))


def _skipped(module_name: str) -> bool:
    return module_name.split(".", 1)[0] in _SKIPPED_PACKAGES


def _model_classes(model: nn.Module) -> list[type]:
    """Every class in the MRO of every module class of ``model`` (PyTorch's own and
    ``object`` aside), once."""
    seen: dict[type, None] = {}
    for cls in dict.fromkeys(type(m) for m in modules_of(model).values()):
        for base in cls.__mro__:
            if base not in seen and not _skipped(base.__module__):
                seen[base] = None
    return list(seen)


def _shared_type(cls: type) -> bool:
    """Whether an attribute of this type is a plain object a fake run's shadow shares
    with the model (a config): its instances have a ``__dict__``, are not callable,
    and it is neither a module, a tensor, a container nor PyTorch's own. Read once
    per class."""
    found = _SHARED.get(cls)
    if found is None:
        found = _SHARED[cls] = (getattr(cls, "__dictoffset__", 0) != 0 and not issubclass(cls, _NOT_SHARED)
                                and not any("__call__" in c.__dict__ for c in cls.__mro__)
                                and not _skipped(cls.__module__))
    return found


_SHARED: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()


def _callables_in(value: Any, depth: int = _DEPTH) -> Iterator[Any]:
    """``value`` and what it wraps: staticmethod / classmethod / property functions,
    ``__wrapped__``, ``functools.partial``'s function, closure cells' contents and
    default arguments (``depth`` levels)."""
    yield value
    if depth <= 0:
        return
    inner: list[Any] = []
    if isinstance(value, (staticmethod, classmethod)):
        inner.append(value.__func__)
    elif isinstance(value, property):
        inner += [value.fget, value.fset]
    elif isinstance(value, functools.partial):
        inner.append(value.func)
    elif isinstance(value, types.FunctionType):
        inner += [cell.cell_contents for cell in value.__closure__ or () if _filled(cell)]
        inner += list(value.__defaults__ or ()) + list((value.__kwdefaults__ or {}).values())
    wrapped = getattr(value, "__wrapped__", None) if isinstance(value, (types.FunctionType, _LRU)) else None
    if wrapped is not None:
        inner.append(wrapped)
    for item in inner:
        if item is not None:
            yield from _callables_in(item, depth - 1)


_WRAPPERS = (types.FunctionType, staticmethod, classmethod, property, functools.partial)


def _defined_in(value: Any, home: Any) -> bool:
    """Whether a function (or what a staticmethod / classmethod / property / partial
    wraps) was defined in the Python module named ``home``: the code scanned is the
    model's own, not every function its modules import."""
    inner = value.fget if isinstance(value, property) else getattr(value, "__func__",
                                                                   getattr(value, "func", value))
    return getattr(inner, "__module__", None) == home


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018  (an empty cell raises)
    except ValueError:
        return False
    return True


class CacheGuard:
    """The caches and stores the code of ``model`` reaches (see the module docstring),
    taken before a fake run: :meth:`restore` afterwards removes what the run left there
    holding fake tensors. ``own_attributes``: also each module's own attributes, for a
    fake run of the model's own modules (a ``profiler`` block, a pipeline: a forward
    that keeps a table it built on itself would keep a fake one; a single count runs a
    shadow, which takes such writes)."""

    def __init__(self, model: nn.Module, own_attributes: bool = False) -> None:
        self._stores: dict[int, tuple[Any, Any]] = {}  # id -> (dict or list, its shallow copy)
        self._caches: dict[int, tuple[Any, int, str]] = {}  # id -> (lru_cache, misses before, name)
        self._names: dict[int, str] = {}  # id(store) -> where it is (for fake_tensors_held)
        for cls in _model_classes(model):
            module = sys.modules.get(cls.__module__)
            if module is not None:
                self._root(vars(module), f"module {module.__name__}")
            self._root(cls.__dict__, f"class {cls.__module__}.{cls.__qualname__}", store=False)
        # the objects the modules share with a fake run's shadow (configs, ...)
        for m in modules_of(model).values():
            if own_attributes:
                self._store(m.__dict__, f"the attributes of a {type(m).__name__} module")
            for name, value in m.__dict__.items():
                kind = type(value)
                if kind not in _PLAIN and _shared_type(kind) and id(value) not in self._stores:
                    self._shared(value, f"{kind.__name__} object in attribute '{name}' of "
                                        f"{type(m).__name__}")

    def _shared(self, obj: Any, where: str, depth: int = _DEPTH) -> None:
        """The stores of a plain object the model's modules share with a fake run's
        shadow: its ``__dict__``, the dicts and lists it holds (a table kept by key)
        and, ``depth`` levels down, the same of the plain objects it holds (a cache
        on a holder)."""
        # (a config's own __getattribute__ is slow)
        attrs = object.__getattribute__(obj, "__dict__")
        self._store(attrs, where, key=id(obj))
        for inner, held in list(attrs.items()):
            kind = type(held)
            if kind in (dict, list):
                self._store(held, f"'{inner}' of the {where}")
            elif depth > 1 and kind not in _PLAIN and _shared_type(kind) and id(held) not in self._stores:
                self._shared(held, f"{kind.__name__} object in '{inner}' of the {where}", depth - 1)

    def _root(self, namespace: Any, where: str, store: bool = True) -> None:
        """The stores and caches of a module's globals (itself a store) or a class's
        ``__dict__`` (a mapping proxy: its dict- and list-valued attributes are
        stores)."""
        if store:
            self._store(namespace, where)
        home = namespace.get("__name__") if store else namespace.get("__module__")
        for name, value in list(namespace.items()):
            if isinstance(value, (dict, list)) and not name.startswith("__"):
                self._store(value, f"'{name}' in {where}")
            elif isinstance(value, _LRU) or (isinstance(value, _WRAPPERS) and _defined_in(value, home)):
                for found in _callables_in(value):
                    if isinstance(found, _LRU):
                        self._cache(found, "functools.lru_cache "
                                           f"'{getattr(found, '__qualname__', name)}' in {where}")
                    elif isinstance(found, (dict, list)) and found is not namespace:
                        self._store(found, f"a {type(found).__name__} reached from '{name}' in "
                                           f"{where}")

    def _store(self, store: Any, where: str, key: int | None = None) -> None:
        key = id(store) if key is None else key
        if key not in self._stores:
            self._stores[key] = (store, dict(_entries(store)) if isinstance(store, dict) else list(store))
            self._names[key] = where

    def _cache(self, cache: Any, where: str) -> None:
        if id(cache) not in self._caches:
            self._caches[id(cache)] = (cache, cache.cache_info().misses, where)

    def restore(self) -> list[str]:
        """Remove what the run left holding fake tensors; returns one line per store or
        cache it changed. Never raises (a failure is a line too): a restore must not
        mask the run's own error."""
        changed: list[str] = []
        for cache, misses, where in self._caches.values():
            try:
                if cache.cache_info().misses != misses:
                    cache.cache_clear()
                    changed.append(f"emptied {where}")
            except Exception as error:  # an lru_cache look-alike
                changed.append(f"could not empty {where}: {type(error).__name__}: {error}")
        for key, (store, saved) in self._stores.items():
            try:
                if _restore_store(store, saved):
                    changed.append(f"removed fake tensors from {self._names[key]}")
            except Exception as error:  # a read-only mapping, a list changed meanwhile
                changed.append(f"could not restore {self._names[key]}: {type(error).__name__}: "
                               f"{error}")
        return changed

    def fake_tensors_held(self, possible: bool = False) -> list[str]:
        """Where the stores hold fake tensors now (an unbounded ``lru_cache``'s entries
        included); ``possible``: also the bounded ``lru_cache`` s that hold entries
        (their contents cannot be read)."""
        found = [self._names[key] for key, (store, _) in self._stores.items()
                 if _holds_fake([v for _, v in _entries(store)] if isinstance(store, dict) else store)]
        for cache, _, where in self._caches.values():
            info = cache.cache_info()
            if info.maxsize is None:
                if any(_holds_fake(v) for v in _unbounded_entries(cache)):
                    found.append(where)
            elif possible and info.currsize:
                found.append(f"perhaps {where} (holds {info.currsize} entries it does not show)")
        return found


def fake_tensors_held(model: nn.Module, possible: bool = False) -> list[str]:
    """Where the caches and stores that ``model``'s code reaches (:class:`CacheGuard`)
    hold fake tensors now; ``possible``: also the bounded ``lru_cache`` s that hold
    entries (they cannot show them)."""
    return CacheGuard(model).fake_tensors_held(possible)


def _unbounded_entries(cache: Any) -> list[Any]:
    """The cached results of an unbounded ``lru_cache`` (``functools.cache``): its dict
    is what it refers to."""
    # a CPython detail: the wrapper's referents include its cache dict, key -> result
    return [v for ref in gc.get_referents(cache) if isinstance(ref, dict) and "__wrapped__" not in ref
            for v in (*ref.keys(), *ref.values())]


def _restore_store(store: Any, saved: Any) -> bool:
    """Put back the entries of ``store`` that changed and hold a fake tensor; whether
    any did."""
    if isinstance(store, dict):
        bad = [k for k, v in _entries(store) if saved.get(k, _MISSING) is not v and _holds_fake((k, v))]
        for key in bad:
            old = saved.get(key, _MISSING)
            if old is _MISSING:
                del store[key]
            else:
                store[key] = old
        return bool(bad)
    if any(_holds_fake(v) for v in store if not any(v is s for s in saved)):
        store[:] = saved
        return True
    return False
