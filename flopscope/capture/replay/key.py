"""The key of a call: what decides its records, and the refusals of keying.

A :class:`CallKey` holds the module (its identity, or a block's class), the structure of
the arguments, each argument as a key holds it, and the modules' state
(:func:`state_of`). Two calls of one key record the same ops, unless they read values
(the template decides that). :func:`call_key` refuses a call no key can decide: a real
run, grad mode or autocast on, a symbolic size, an argument of another type, a user's
object, a module with hooks of its own. :func:`owns_its_paths` refuses a block sharing a
module with another place.

Also here, for a block's misses: :func:`key_difference` says how two blocks' keys
differ, and :func:`attribute_values` and :func:`read_values` give the attributes a block
reads as a key holds them. The refusals' words are in :mod:`._refusals`.
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Callable, Collection, Mapping
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.utils import _pytree as pytree

from ...formulas.registry import shape_of
from ..recorder import Recorder, storage_of
from . import given_objects
from ._refusals import (
    AUTOCAST,
    GRAD_MODE,
    HOOKS_INSIDE,
    OTHER_ARGUMENT,
    OTHER_ARGUMENTS,
    OTHER_ATTRIBUTES,
    OTHER_CLASSES,
    OTHER_KEYS,
    OTHER_MODES,
    OTHER_STRUCTURE,
    OTHER_SUBMODULE_COUNT,
    OTHER_SUBMODULES,
    OTHER_TENSORS,
    REAL_RUN,
    STAND_IN_ARGUMENT,
    SYMBOLIC_SIZE,
    USERS_OBJECT,
)
from .attribute_reads import EVERY, StandIn, own_attributes

PLAIN = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.layout,
         torch.memory_format, enum.Enum)
"""Non-tensor values a key holds by value (immutable).

Anything else is held by identity, or refused as an argument.
"""
# A longer list / tuple / dict attribute is held by identity.
_MAX_PLAIN_ITEMS = 64
# How deep inside an attribute a block's key holds objects alike (_held_alike); deeper,
# by identity.
_MAX_DEPTH = 4
ABSENT = object()
"""The value of an attribute read that a module does not have."""


class CallKey(NamedTuple):
    """What decides a call's records (a tuple: it hashes and compares as one).

    ``module``: the module's ``id()``, or a block's class. ``structure``: the arguments'
    pytree spec, as text. ``arguments``: each leaf as a key holds it (a tensor's sizes,
    strides, dtype, device, ``requires_grad``, known values and storage; a plain value's
    type and value; a given object's class). ``state``: :func:`state_of`.
    """

    module: Any
    structure: str
    arguments: tuple[Any, ...]
    state: tuple[Any, ...]


def call_key(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], recorder: Recorder,
             *,
             grad: bool, watch_objects: bool, ours: Collection[int],
             held: Callable[[], Collection[int]],
             structural: bool = False,
             by_name: bool = False) -> tuple[CallKey, list[torch.Tensor], list[Any]]:
    """The key of a call, its tensor arguments in order and the objects it is given.

    Raises :class:`~._refusals.Refused` where a call's records cannot be decided by a
    key. ``grad``: grad mode may be on. ``watch_objects``: an object among the arguments
    is a given object (a block of the shadow's, given a KV cache), unless ``held()``
    holds its ``id()`` (the model's own). ``ours``: the modules whose ``forward`` is the
    replayer's wrapper. ``structural``: the module by its structure (class, submodules,
    parameter shapes, attributes), so that blocks of the same structure share keys.
    ``by_name``: plain attributes by name only (:func:`state_of`).
    """
    if not recorder.fake:
        raise REAL_RUN.refused()
    if torch.is_grad_enabled() and not grad:
        raise GRAD_MODE.refused()
    if torch._C._is_any_autocast_enabled():
        raise AUTOCAST.refused()
    leaves, spec = pytree.tree_flatten((args, kwargs))
    tensors: list[torch.Tensor] = []
    # (given objects: a block of the shadow's, given a KV cache)
    objects: list[Any] = []
    storages: dict[int, int] = {}
    described: list[Any] = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            storage = storage_of(leaf)
            described.append((_sizes(leaf.shape), _sizes(leaf.stride()), leaf.dtype, leaf.device,
                              leaf.requires_grad,
                              recorder.values_known(leaf),
                              storages.setdefault(storage, len(tensors))))
            tensors.append(leaf)
        elif type(leaf) is StandIn:
            raise STAND_IN_ARGUMENT.refused()
        elif isinstance(leaf, PLAIN):
            described.append((type(leaf), leaf))
        elif watch_objects and given_objects.can_watch(leaf) and all(o is not leaf for o in objects):
            if id(leaf) in held():
                raise USERS_OBJECT.refused(kind=type(leaf).__name__)
            # (what the block does with it is its call-outs)
            described.append(("object", type(leaf)))
            objects.append(leaf)
        else:
            raise OTHER_ARGUMENT.refused(kind=type(leaf).__name__)
    identity = type(module) if structural else id(module)
    state = state_of(module, ours, structural, by_name)
    return CallKey(identity, str(spec), tuple(described), state), tensors, objects


def _sizes(sizes: Any) -> tuple[Any, ...]:
    """A shape or strides as a key holds them: a symbolic size by its expression (two
    calls whose sizes are the same expressions of the symbols record the same ops, in
    those sizes); else refused (:data:`~._refusals.SYMBOLIC_SIZE`: an unbacked size, or
    a float)."""
    out: list[Any] = []
    for size in sizes:
        if type(size) is int:
            out.append(size)
        elif isinstance(size, torch.SymInt) and not size.node.expr.free_symbols - _backed(size.node.shape_env):
            out.append(("symbolic", size.node.expr))
        else:
            raise SYMBOLIC_SIZE.refused()
    return tuple(out)


def _backed(shape_env: Any) -> set[Any]:
    """The symbols of ``shape_env`` with a value at hand (the inputs' sizes, not a
    data-dependent size)."""
    values = getattr(shape_env, "backed_var_to_val", None)  # (torch >= 2.12; var_to_val before)
    return set(values if values is not None else shape_env.var_to_val)


def owns_its_paths(path: str, module: nn.Module, paths: Mapping[int, str]) -> bool:
    """Whether every module inside ``module`` (at ``path``) has its path under it.

    ``paths``: the tracker's path of each module. The tracker names a module shared by
    two places by its first path, which a renamed copy would not: a block sharing one is
    refused.
    """
    return all(paths.get(id(m)) == (f"{path}.{name}" if name else path) for name, m in module.named_modules())


def state_of(module: nn.Module, ours: Collection[int] = (), structural: bool = False,
             by_name: bool = False
             ) -> tuple[Any, ...]:
    """What a call of ``module`` can read of its modules' state, by value where
    immutable, else by identity: each submodule's identity, mode, parameters and buffers
    (identity, shape, dtype) and plain attributes. Raises :class:`~._refusals.Refused`
    for a submodule with hooks of its own or an instance-level ``forward`` (not ours:
    ``ours``). ``structural``: submodules by name and class, tensors by shape, dtype and
    ``requires_grad``, not by identity (two blocks of one structure have the same
    state), and other objects by class and plain attributes. ``by_name``: plain
    attributes by name only (the values a call reads are keyed apart:
    :func:`read_values`)."""
    state: list[Any] = []
    held = _held_alike if structural else _held
    for name, m in module.named_modules():
        own = vars(m)
        if m._forward_hooks or m._forward_pre_hooks or (m is not module and "forward" in own and id(m) not in ours):
            raise HOOKS_INSIDE.refused(kind=type(m).__name__)
        tensors = tuple(((key, tuple(t.shape), t.dtype, t.requires_grad) if structural else
                         (key, id(t), tuple(t.shape), t.dtype)) if t is not None else (key, None)
                        for table in (m._parameters, m._buffers) for key, t in table.items())
        plain = tuple(own_attributes(m)) if by_name else tuple(
            (key, held(value)) for key, value in own_attributes(m).items())
        state.append(((name, type(m)) if structural else id(m), m.training, tensors, plain))
    return tuple(state)


def key_difference(first: CallKey, key: CallKey) -> str:
    """What the key of a block's call holds otherwise than ``first``, its list's first
    block call's, in words."""
    if first[0] != key[0]:
        return OTHER_CLASSES.say()
    if first[1] != key[1] or len(first[2]) != len(key[2]):
        return OTHER_STRUCTURE.say()
    for i, (was, now) in enumerate(zip(first[2], key[2], strict=True)):
        if was != now:
            if len(was) == len(now) == 7:  # (two tensors: their shapes, and whatever else differs)
                said = [_tensor_words(v, was, now, i, [j for j, leaf in enumerate(k[2]) if len(leaf) == 7])
                        for v, k in ((was, first), (now, key))]
            else:
                said = [f"shape {list(v[0])}, {v[2]}" if len(v) == 7 else f"{v[-1]!r}" for v in (was, now)]
            return OTHER_ARGUMENTS.say(at=i, now=said[1], was=said[0])
    if len(first[3]) != len(key[3]):
        return OTHER_SUBMODULE_COUNT.say()
    for was, now in zip(first[3], key[3], strict=True):
        if was != now:
            name = was[0][0] if isinstance(was[0], tuple) else ""
            where = f"{name} of the block" if name else "the block itself"
            if was[0] != now[0]:
                return OTHER_SUBMODULES.say(where=where, was=was[0][1].__name__,
                                            now=now[0][1].__name__)
            if was[1] != now[1]:
                return OTHER_MODES.say(where=where)
            if was[2] != now[2]:
                return OTHER_TENSORS.say(where=where)
            names = sorted({str(item[0] if isinstance(item, tuple) else item) for item in set(was[3]) ^ set(now[3])})
            return OTHER_ATTRIBUTES.say(where=where, names=", ".join(names[:3]))
    return OTHER_KEYS.say()


_TENSOR_FIELDS = ("shape", "strides", "dtype", "device", "requires_grad", "values known")
"""The fields of a tensor argument in a key (:func:`call_key`), as :func:`key_difference` names
them; the last, its storage, is said as the argument it shares it with."""


def _tensor_words(entry: tuple[Any, ...], was: tuple[Any, ...], now: tuple[Any, ...], at: int,
                  tensors: list[int]) -> str:
    """A tensor argument's key ``entry`` (argument ``at``) in words: its shape and dtype,
    and each other field where ``was`` and ``now`` differ (the strides of two tensors of
    one shape). ``tensors``: the argument number of each tensor argument of its key (a
    key holds a storage as the first tensor argument holding it)."""
    words = [f"shape {list(entry[0])}", str(entry[2])]
    for index in (1, 3, 4, 5):
        if was[index] != now[index]:
            value = entry[index]
            words.append(f"{_TENSOR_FIELDS[index]} {list(value) if index == 1 else value}")
    if was[6] != now[6]:
        owner = tensors[entry[6]]
        words.append("its own storage" if owner == at else f"the storage of argument {owner}")
    return ", ".join(words)


def attribute_values(modules: Mapping[str, nn.Module]) -> dict[tuple[str, str], Any]:
    """The plain attributes of ``modules`` (name -> module) as a key holds them
    (:func:`_held_alike`)."""
    return {(name, key): _held_alike(value) for name, m in modules.items()
            for key, value in own_attributes(m).items()}


def read_values(modules: Mapping[str, nn.Module], reads: tuple[tuple[str, str], ...],
                values: Mapping[tuple[str, str], Any] | None = None) -> tuple[Any, ...]:
    """The values of the attributes ``reads`` of a block's ``modules`` (name -> module),
    as a key holds them (``values``: those of :func:`attribute_values`, else read
    now); a read of a module's whole ``__dict__`` holds all its attributes."""
    if values is None:
        values = attribute_values({name: m for name, m in modules.items() if any(name == read for read, _ in reads)})
    found: list[Any] = []
    for name, attribute in reads:
        if attribute == EVERY:
            found.append(tuple((k, v) for (n, k), v in values.items() if n == name))
        else:
            found.append(values.get((name, attribute), ABSENT))
    return tuple(found)


def _held_alike(value: Any, depth: int = 0) -> Any:
    """As :func:`_held`, but an object other than a plain value, a container, a tensor,
    a function or a class by its class and its plain attributes (an attention
    processor of each block: equal where they hold the same settings), a module that
    is no submodule as :func:`_module_alike` holds it, and the items of a list, tuple
    or dict alike too (a dict of such modules: each attention module's own wrappers
    of kernels' functions, ``_kernel_funcs``); a tensor that is no parameter by
    identity (what it holds is not known). ``depth``: how deep inside an attribute
    ``value`` is (beyond :data:`_MAX_DEPTH`, by identity: an object may hold itself)."""
    if isinstance(value, PLAIN) or depth > _MAX_DEPTH:
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
    # (a function, a class: by identity)
    if isinstance(own, dict) and len(own) <= _MAX_PLAIN_ITEMS and all(isinstance(v, PLAIN) for v in own.values()) \
            and not inspect.isroutine(value) and not isinstance(value, type):
        return (type(value), tuple(own.items()))
    return ("id", id(value))


def _module_alike(module: nn.Module, depth: int) -> Any:
    """A module held as a plain attribute of a block's module, not as its submodule
    (kernels' ``use_kernelized_func`` gives each attention module its own
    ``nn.Module`` wrapping a function such as ``apply_rotary_pos_emb``, in a dict):
    by its modules' classes, modes and plain attributes (alike) where none of them
    holds a parameter or a buffer, a hook or a ``forward`` of its own: what its calls
    record is then decided by its code and its arguments, as a block's own
    submodule's is. Else by identity (a parameter it holds is not the block's, so a
    replay into another block could not take that block's)."""
    found: list[Any] = []
    for name, m in module.named_modules():
        own = vars(m)
        if m._parameters or m._buffers or m._forward_hooks or m._forward_pre_hooks or "forward" in own:
            return ("id", id(module))
        found.append((name, type(m), m.training,
                      tuple((k, _held_alike(v, depth + 1)) for k, v in own_attributes(m).items())))
    return (nn.Module, tuple(found))


def _held(value: Any) -> Any:
    """``value`` as a key holds it: plain values and short containers of them by value,
    anything else by identity."""
    if isinstance(value, PLAIN):
        return value
    if isinstance(value, (tuple, list)) and len(value) <= _MAX_PLAIN_ITEMS:
        return (type(value), tuple(_held(v) for v in value))
    if isinstance(value, dict) and len(value) <= _MAX_PLAIN_ITEMS:
        return (dict, tuple((_held(k), _held(v)) for k, v in value.items()))
    if isinstance(value, torch.Tensor):
        return (torch.Tensor, id(value), shape_of(value))
    return ("id", id(value))
