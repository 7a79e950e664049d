"""Fake tensors for counting without computing: the model's state and inputs as ``FakeTensor``\\ s.

Tensors on ``device="meta"`` become fake *CPU* tensors, so a model built on meta takes
the same kernels (and is counted the same) as one built on the CPU.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import functools
import sys
import threading
import types
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

import torch
from torch import nn
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
    UnsupportedFakeTensorException,
    UnsupportedOperatorException,
    _BypassDispatchCache,
)

from ..errors import FakeTensorError, cause_of_kind

NEEDS_REAL_DATA = (DataDependentOutputException, DynamicOutputShapeException,
                   UnsupportedOperatorException)
"""Exceptions meaning "this model needs real tensor data here", not "this model is
wrong" (and symbolic shapes' ``GuardOnDataDependentSymNode``:
:func:`needs_real_data`)."""


class CountingFakeTensorMode(FakeTensorMode):
    """The fake mode of a capture. Its dispatch cache (torch's, shared by every fake
    mode of the process and keyed on an op's arguments) skips ops with a
    TorchScript-object argument: packed quantized weights come in a fresh wrapper on
    every call and cannot be compared (their ``__eq__`` raises). ``_cache_key`` and
    ``_BypassDispatchCache`` are torch's private hook for exactly this; here is the
    one place that uses it."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        _share_fake_rules()

    def _cache_key(self, state: Any, func: Any, args: Any, kwargs: Any) -> Any:
        if any(isinstance(a, torch.ScriptObject) for a in (*args, *kwargs.values())):
            raise _BypassDispatchCache("script object argument")
        return super()._cache_key(state, func, args, kwargs)


_RULES_LOCK = threading.Lock()


def _share_fake_rules() -> None:
    """Give :class:`CountingFakeTensorMode` the fake-tensor rule of every higher-order
    op that has one (FlexAttention's, say): an op looks its rule up by the exact
    class of the mode, so a subclass has none. Run at each new mode, as higher-order
    ops are made when their module is first imported; under a lock, as modes are made
    in several threads at once (registering a rule twice is an error)."""
    with _RULES_LOCK:
        for op in list(torch._ops._higher_order_ops.values()):
            rule = op.python_key_table.get(FakeTensorMode)
            if rule is not None and CountingFakeTensorMode not in op.python_key_table:
                op.py_impl(CountingFakeTensorMode)(rule)


class FakeConverter:
    """Converts real or meta tensors to fake ones (memoised, so tied weights stay tied)."""

    def __init__(self, mode: FakeTensorMode) -> None:
        self.mode = mode
        self._memo: dict[int, torch.Tensor] = {}
        self._keep: list[torch.Tensor] = []  # keeps sources alive so their ids stay unique

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        fake = self._memo.get(id(t))
        if fake is None:
            local = getattr(t, "_local_tensor", None)
            # the caller's own fake tensor: a new one of the same mode
            if isinstance(t, FakeTensor):
                fake = self._refake(t)
            # a DTensor sharded on device="meta": a fake shard, same layout
            elif local is not None and local.is_meta:
                fake = _dtensor_like(t, self(local))
            elif t.is_meta:
                fake = self._direct_fake(t, torch.device("cpu"))
            # its history is outside the model: a clone of a fake leaf
            elif t.requires_grad and not t.is_leaf:
                fake = self.mode.from_tensor(t.detach()).requires_grad_(True)
            elif self._plain(t):
                fake = self._direct_fake(t, t.device)
            # its fake needs symbolic sizes (its ragged dim)
            elif t.is_nested and t.layout == torch.jagged:
                where = f"a jagged nested tensor of {t.size(0)} entries"
                reason = "a jagged tensor's fake stand-in needs symbolic shapes, which a fake count does not use"
                raise FakeTensorError(f"{where} cannot be a fake tensor ({reason}); use mode='real'",
                                      on_fake_tensors=True, where=where, reason=reason)
            else:
                try:
                    fake = self.mode.from_tensor(t)
                except UnsupportedFakeTensorException as error:  # quantized tensors, among others
                    where = f"a {t.dtype} tensor of shape {list(t.shape)}"
                    raise FakeTensorError(f"{where} cannot be a fake tensor ({error}); use "
                                          "mode='real'",
                                          on_fake_tensors=True, where=where, reason=str(error)) from error
            if t.requires_grad and not t.is_leaf and fake.is_leaf:
                fake = non_leaf(fake)
            self._memo[id(t)] = fake
            self._keep.append(t)
        return fake

    def _refake(self, t: FakeTensor) -> torch.Tensor:
        """A new fake tensor of ``t``'s shape, strides, dtype and device in the same
        mode (the run must not write to the caller's tensor: its ``.grad``, its
        version counter); ``t`` itself when its sizes are symbolic."""
        if t.fake_mode is not self.mode:
            where = f"a fake tensor of shape {list(t.shape)}"
            reason = "it belongs to another FakeTensorMode than the model's other fake tensors"
            raise FakeTensorError(f"{where} cannot be counted: {reason}; make the model and its "
                                  "inputs under one mode",
                                  where=where, reason=reason)
        if any(isinstance(n, torch.SymInt) for n in (*t.shape, *t.stride())):
            return t
        with torch._C._DisableTorchDispatch():
            meta = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
        fake = FakeTensor(self.mode, meta, t.device)
        fake.requires_grad_(t.requires_grad)
        if isinstance(t, nn.Parameter):
            fake._is_param = True
        return fake

    def _plain(self, t: torch.Tensor) -> bool:
        """A dense tensor that owns its memory from the start and carries nothing else
        (no view, offset, grad, quantization, conjugate bit, subclass), converted
        while no shape is symbolic."""
        return (type(t) in (torch.Tensor, nn.Parameter) and t.layout == torch.strided and not t._is_view()
                and t.storage_offset() == 0 and t.grad is None and not t.is_quantized and not t.is_conj()
                and not t.is_neg() and not t.is_inference() and self.mode.shape_env is None)

    def _direct_fake(self, t: torch.Tensor, device: torch.device) -> torch.Tensor:
        """The fake of a :meth:`_plain` or meta tensor on ``device``, made directly (its
        shape, strides, dtype): what the fake mode's own conversion makes of a plain
        tensor, at a fifth of the cost (that conversion describes every property a
        tensor can have). The mode remembers it, so the mode converts the tensor to
        the same fake if the model reaches it some other way."""
        with torch._C._DisableTorchDispatch():
            meta = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
        fake = FakeTensor(self.mode, meta, device)
        fake.requires_grad_(t.requires_grad)
        if isinstance(t, nn.Parameter):
            # isinstance(fake, nn.Parameter), as the mode's own conversion makes it
            fake._is_param = True
        self.mode.fake_tensor_converter.set_tensor_memo(t, fake)
        return fake


class MetaConverter:
    """Converts tensors to new ``device="meta"`` tensors (memoised, so tied weights stay
    tied), for a model whose state is already on meta: its ops then run on PyTorch's
    meta kernels directly, with no fake-tensor mode between them and the recorder (the
    fast way to count a model too large to build). Even a meta tensor gets a new one, so
    the run never touches the user's (their ``.grad``, their version counters). A run
    enters :attr:`mode` as it enters a :class:`FakeConverter`'s fake mode; its recorder
    makes every new tensor on :attr:`device` (``Recorder(device=...)``)."""

    device = torch.device("meta")

    def __init__(self) -> None:
        self._memo: dict[int, torch.Tensor] = {}
        self._keep: list[torch.Tensor] = []  # keeps sources alive so their ids stay unique
        # set when meta kernels could not run the model: used instead
        self.fallback: FakeConverter | None = None

    @property
    def mode(self) -> Any:
        """Nothing to enter: the tensors are meta tensors, and the recorder makes new
        ones on meta too."""
        return contextlib.nullcontext()

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        meta = self._memo.get(id(t))
        if meta is None:
            local = getattr(t, "_local_tensor", None)
            if local is not None:  # a DTensor: a new meta shard in the same spec
                meta = _dtensor_like(t, self(local))
            else:
                meta = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
                meta.requires_grad_(t.requires_grad)
                if isinstance(t, nn.Parameter):
                    meta = nn.Parameter(meta, requires_grad=t.requires_grad)
                # its history is outside the model: a clone of a leaf
                elif t.requires_grad and not t.is_leaf:
                    meta = non_leaf(meta)
            self._memo[id(t)] = meta
            self._keep.append(t)
        return meta


def empty_tensor(shape: Sequence[int], stride: Sequence[int], dtype: torch.dtype,
                 device: torch.device,
                 requires_grad: bool = False, mode: FakeTensorMode | None = None) -> torch.Tensor:
    """A tensor of these sizes, strides, dtype and device that holds nothing: a fake
    tensor of ``mode`` (else of the fake-tensor mode on the stack) made directly
    around a meta tensor, as the mode makes its outputs (no op is dispatched: six
    times cheaper than ``torch.empty_strided`` through the mode, and no mode on the
    stack sees it); without a mode, an ``empty_strided`` (on meta: nothing
    allocated). Pass the mode of the fake tensor this one stands for: a run whose
    caller's code runs outside the fake mode (a diffusion pipeline,
    :mod:`flopscope.pipeline`) has none on the stack, and a real tensor there would
    be computed on for real by every op that takes no fake one."""
    mode = mode or torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)
    if mode is None or device.type == "meta":
        return torch.empty_strided(shape, stride, dtype=dtype, device=device,
                                   requires_grad=requires_grad)
    with torch._C._DisableTorchDispatch():
        made = FakeTensor(mode, torch.empty_strided(shape, stride, dtype=dtype, device="meta"),
                          device)
    return made.requires_grad_() if requires_grad else made


def non_leaf(leaf: torch.Tensor) -> torch.Tensor:
    """A non-leaf stand-in for a tensor that requires grad and is not a leaf (``x =
    w.clone()`` made before the forward): a clone of the leaf ``leaf``, so the
    forward may change it in place (``x.relu_()``) as a real run does; a leaf that
    requires grad refuses in-place ops. Made before the run's recorder is entered:
    not counted."""
    with torch.enable_grad():
        return leaf.clone()


def _dtensor_like(t: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """The DTensor ``t``'s spec (mesh, placements, global shape, stride, dtype) makes
    around the shard ``local`` (DTensor's own constructor, as ``from_local`` ends in,
    without its autograd function and checks); a parameter if ``t`` is one."""
    from torch.distributed.tensor import DTensor

    out = DTensor(local, cast(DTensor, t)._spec, requires_grad=t.requires_grad)
    return nn.Parameter(out, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else out


def callers_fake_mode(tensors: Iterable[torch.Tensor]) -> FakeTensorMode | None:
    """The ``FakeTensorMode`` of the fake tensors among ``tensors`` (a model and inputs
    the caller made under a mode of their own), ``None`` if there are none; an error
    if they belong to several modes."""
    modes = {id(t.fake_mode): t.fake_mode for t in tensors if isinstance(t, FakeTensor)}
    if len(modes) > 1:
        reason = f"the model's state and inputs hold fake tensors of {len(modes)} different FakeTensorModes"
        raise FakeTensorError(f"{reason}; make the model and its inputs under one mode",
                              where="the model's state",
                              reason=reason)
    return next(iter(modes.values()), None)


Converter = FakeConverter | MetaConverter
"""What turns a run's tensors into the ones it computes on: fake tensors, or meta
tensors for a meta model."""


def map_tensors(obj: Any, fn: Callable[[torch.Tensor], Any],
                objects: Callable[[Any], Any] | None = None) -> Any:
    """Apply ``fn`` to every tensor in nested tuples, named tuples, lists, dicts and
    dataclasses, and ``objects`` (if given) to every other object with attributes
    found there (a KV cache, say)."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_make"):  # named tuple (PackedSequence among them)
        return obj._make(map_tensors(v, fn, objects) for v in obj)
    if isinstance(obj, (tuple, list)):
        return type(obj)(map_tensors(v, fn, objects) for v in obj)
    if isinstance(obj, dict):
        mapped = {k: map_tensors(v, fn, objects) for k, v in obj.items()}
        try:
            return type(obj)(mapped)
        except Exception:  # a dict subclass with its own constructor
            return mapped
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {f.name: map_tensors(getattr(obj, f.name), fn, objects) for f in dataclasses.fields(obj) if f.init}
        return dataclasses.replace(obj, **changes)
    if objects is not None and hasattr(obj, "__dict__") and not (isinstance(obj, (type, nn.Module)) or callable(obj)):
        return objects(obj)
    return obj


def isolated_copy(obj: Any, convert: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """A deep copy of an argument object (a KV cache, a config holding tensors) whose
    tensors are ``convert``'s fake ones: no memory is allocated, and the run can
    append to it without touching the user's object."""
    memo: dict[int, Any] = {id(t): convert(t) for t in _reachable_tensors(obj)}
    return copy.deepcopy(obj, memo)


def _reachable_tensors(obj: Any, depth: int = 6) -> list[torch.Tensor]:
    """Tensors reachable from ``obj`` through attributes, lists, tuples and dicts
    (``depth`` levels)."""
    found: list[torch.Tensor] = []
    seen: set[int] = set()

    def walk(x: Any, level: int) -> None:
        if id(x) in seen or level > depth:
            return
        seen.add(id(x))
        if isinstance(x, torch.Tensor):
            found.append(x)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v, level + 1)
        elif isinstance(x, (list, tuple, set)):
            for v in x:
                walk(v, level + 1)
        elif hasattr(x, "__dict__") and not isinstance(x, (type, nn.Module)):
            walk(vars(x), level + 1)

    walk(obj, 0)
    return found


def tensors_in(obj: Any) -> list[torch.Tensor]:
    """The tensors inside ``obj`` (the structures of :func:`map_tensors`), in order."""
    found: list[torch.Tensor] = []

    def collect(t: torch.Tensor) -> torch.Tensor:
        found.append(t)
        return t

    map_tensors(obj, collect)
    return found


def loaded_dtensor() -> type | None:
    """``DTensor`` if ``torch.distributed.tensor`` is imported, else ``None``: no tensor
    is a DTensor before that (importing it takes half a second, so flopscope leaves
    it to the models that use it)."""
    return getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)


def needs_real_data(error: BaseException) -> BaseException | None:
    """The fake-tensor limitation behind ``error`` (itself or a cause in its chain), if
    any."""
    # symbolic_shapes (with sympy: most of a second) is not imported here: what raised
    # its guard error imported it
    shapes = sys.modules.get("torch.fx.experimental.symbolic_shapes")
    guard = getattr(shapes, "GuardOnDataDependentSymNode", None)
    return cause_of_kind(error, NEEDS_REAL_DATA if guard is None else (*NEEDS_REAL_DATA, guard))


_CONTAINERS = (list, tuple, dict, set, collections.deque)
ATOMS = frozenset({int, float, str, bool, bytes, type(None)})
"""Types whose values hold nothing (nothing to rewire, copy or settle inside)."""
# an empty one is copied as a new one
_EMPTY_COPIES = frozenset({dict, collections.OrderedDict, list, set})
# a module's tables: made anew by shadow_of
_TABLES = frozenset({"_parameters", "_buffers", "_modules"})


def shadow_of(model: nn.Module, convert: Callable[[torch.Tensor], torch.Tensor]) -> nn.Module:
    """A stand-in for ``model`` to run on fake tensors. Every module is copied with its
    own attribute dict, its own parameter / buffer / submodule tables holding
    ``convert(t)`` of each tensor, and its own copies of the containers among its
    attributes (lists, dicts, sets, deques, hook tables); plain tensor attributes
    become fake too, and every reference an attribute holds to one of the model's
    modules (a bound method, a ``functools.partial`` forward patch, a weak reference,
    a list of modules) is pointed at that module's twin. Running the shadow never
    writes to the user's module objects (other threads may run the model meanwhile)
    and nothing it stores outlives the run. Shared modules and tied weights stay
    shared (``convert`` is memoised). A TorchScript module runs its own compiled
    parameters, so it is its own shadow (the fake mode converts them as they are
    read)."""
    if isinstance(model, torch.jit.ScriptModule):
        return model
    originals = modules_of(model)
    # not copy.copy: parametrized modules refuse to be pickled
    twins: dict[int, nn.Module] = {key: object.__new__(type(m)) for key, m in originals.items()}

    def rewire(value: Any, depth: int = 0) -> Any:
        """``value`` with the model's modules replaced by their twins and tensors by
        fake ones (containers copied, two levels deep). Tested by type
        (``issubclass``): ``isinstance`` of an object that is none of these asks its
        ``__class__``, a Python call on a Hugging Face config."""
        kind = type(value)
        if kind in ATOMS:
            return value
        if kind in _EMPTY_COPIES and not value:  # most hook tables: a new empty one
            return kind()
        if issubclass(kind, nn.Module):
            return twins.get(id(value), value)
        if issubclass(kind, torch.Tensor):
            return convert(value)
        if kind is types.MethodType and isinstance(value.__self__, nn.Module):
            return types.MethodType(value.__func__, rewire(value.__self__))
        if issubclass(kind, functools.partial):
            return functools.partial(rewire(value.func, depth),
                                     *(rewire(a, depth) for a in value.args),
                                     **{k: rewire(v, depth) for k, v in value.keywords.items()})
        if issubclass(kind, weakref.ref) and not issubclass(kind, weakref.WeakMethod):
            target = value()
            return weakref.ref(twins[id(target)]) if target is not None and id(target) in twins else value
        if depth < 2 and (kind in _CONTAINERS or issubclass(kind, (dict, collections.deque))):
            return _copy_container(value, lambda v: rewire(v, depth + 1))
        return value

    for key, module in originals.items():
        twin = twins[key]
        attrs = {name: value if type(value) in ATOMS or name in _TABLES else rewire(value)
                 for name, value in module.__dict__.items()}
        attrs["_parameters"] = {k: None if p is None else convert(p) for k, p in module._parameters.items()}
        attrs["_buffers"] = {k: None if b is None else convert(b) for k, b in module._buffers.items()}
        attrs["_modules"] = {k: None if m is None else twins[id(m)] for k, m in module._modules.items()}
        object.__setattr__(twin, "__dict__", attrs)
        for slot in _slots(type(module)):  # __slots__ values live outside __dict__
            if hasattr(module, slot):
                object.__setattr__(twin, slot, getattr(module, slot))
    return twins[id(model)]


def _slots(cls: type) -> tuple[str, ...]:
    """The ``__slots__`` names of ``cls`` and its bases (``__dict__`` aside), read once
    per class."""
    found = _SLOTS.get(cls)
    if found is None:
        names: list[str] = []
        for c in cls.__mro__:
            declared = getattr(c, "__slots__", ())
            names += [declared] if isinstance(declared, str) else declared
        found = _SLOTS[cls] = tuple(name for name in names if name != "__dict__")
    return found


_SLOTS: weakref.WeakKeyDictionary[type, tuple[str, ...]] = weakref.WeakKeyDictionary()
""":func:`_slots`' cache, weak: classes are made at run time too (a parametrized module
gets one of its own)."""


def modules_of(model: nn.Module) -> dict[int, nn.Module]:
    """``id(module) -> module`` for ``model`` and every module under it, each once
    (``model.modules()`` without the names it builds)."""
    found: dict[int, nn.Module] = {}
    todo = [model]
    while todo:
        module = todo.pop()
        if id(module) not in found:
            found[id(module)] = module
            todo.extend(child for child in module._modules.values() if child is not None)
    return found


def _copy_container(value: Any, item: Callable[[Any], Any]) -> Any:
    """A copy of a list / tuple / set / deque / dict (subclasses such as ``OrderedDict``
    kept) with ``item`` applied to each element (to each value of a dict)."""
    if isinstance(value, dict):
        copied = copy.copy(value)
        for key in list(copied):
            copied[key] = item(copied[key])
        return copied
    if isinstance(value, collections.deque):
        return collections.deque((item(v) for v in value), maxlen=value.maxlen)
    if isinstance(value, tuple) and hasattr(value, "_make"):
        return value._make(item(v) for v in value)
    return type(value)(item(v) for v in value)
