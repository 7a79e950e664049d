"""Known values: what a fake run knows of the data of its small tensors.

Fake tensors carry no data. Yet some of a forward's work depends on the values of small
integer tensors: token ids index embedding tables, positions come from ``arange``, a
``.item()`` decides a loop. :class:`KnownValues` keeps the real values of such tensors:
an input's ids, and what ops compute from known values (the op runs again, for real, on
the CPU). A write to a tensor's storage updates the values, or forgets them.

:func:`from_known_data` answers ``torch.tensor(data)`` from known values, where ``data``
holds one-element fake tensors (:func:`fake_run` names the thread's run).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _disable_current_modes

from ..records import CapturedOp, Cost, LeafKind
from ._tallies import Tallies
from ._tensors import Producers, WrittenArguments, map_tensors, storage_of, tensors

INDEX_DTYPES = (torch.int64, torch.int32, torch.bool)
_MAX_VALUE_NUMEL = 4096
MAX_KNOWN_NUMEL = 1 << 16
"""On fake tensors, index tensors up to this many elements keep their values (inputs'
real ids, ``arange`` positions and what is computed from them), so lookups can be
checked as a real forward would."""
MAX_KNOWN_FLOAT_NUMEL = 1 << 10
"""On fake tensors, floating-point tensors up to this many elements computed only from
known values keep theirs (``torch.arange(t) * time_interval`` before ``.long()``:
Qwen2-VL's temporal positions)."""
UNINITIALISED = frozenset({torch.ops.aten.empty, torch.ops.aten.empty_like,
                           torch.ops.aten.new_empty,
                           torch.ops.aten.empty_strided, torch.ops.aten.new_empty_strided})
"""Ops whose output's values are whatever memory held: never known."""
SCALAR_READS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default)
"""Reads of a one-element tensor's value into Python (``.item()``, ``.tolist()``,
``int(t)``): on fake tensors they are answered from the values the recorder knows (an
integer input's, and what is computed from known values)."""
CONSTRUCTORS_FROM_DATA = ("tensor", "as_tensor", "asarray")
"""The ``torch`` functions that make a tensor from Python data: on fake tensors,
:func:`from_known_data` stands in for them while a fake run counts
(``runner.known_tensor_data``)."""

class KnownValues:
    """The values a run knows: of leaf tensors (by ``id``) and of records' outputs.

    Args:
        producers: the recorder's dataflow (:data:`Producers`), read, never written.
        written: the arguments each op writes.
        tallies: the run's tallies (values read, counted in ``value_reads``).
        fake_mode: the fake-tensor mode of a fake run, for what is made from known
            values where that mode is not on the stack.
    """

    def __init__(self, producers: Producers, written: WrittenArguments, tallies: Tallies,
                 fake_mode: FakeTensorMode | None) -> None:
        self.leaf_values: dict[int, torch.Tensor] = {}
        """``id(fake tensor)`` -> the values it stands for."""
        self.by_record: dict[int, torch.Tensor] = {}
        """``id(captured op)`` -> values propagated to its output."""
        self.stale: set[int] = set()
        """``id(captured op)`` whose output's storage was written since: values
        unknown."""
        self.tallies = tallies
        self.fake_mode = fake_mode
        self._producers = producers
        self._written = written

    def learn(self, t: torch.Tensor, values: torch.Tensor) -> None:
        """``t`` (a fake tensor just made) holds ``values`` (real)."""
        known = self._producers.get(id(t))
        if known is not None and known[0]() is t:
            self.by_record[id(known[1])] = values
        else:
            self.leaf_values[id(t)] = values

    def value_of(self, t: torch.Tensor) -> torch.Tensor | None:
        """The known values of an index tensor (an input's real values, or what
        propagated to it)."""
        known = self._producers.get(id(t))
        if known is not None and known[0]() is t:
            return self.of_record(known[1])
        return self.leaf_values.get(id(t))

    def of_record(self, op: CapturedOp) -> torch.Tensor | None:
        """The known values of the tensor the record ``op`` made (``None`` once it was
        written over)."""
        return None if id(op) in self.stale else self.by_record.get(id(op), op.value)

    def read_value(self, t: torch.Tensor) -> torch.Tensor | None:
        """:meth:`value_of`, counted in ``value_reads`` when known (what runs, or what
        it costs, depends on it)."""
        value = self.value_of(t)
        if value is not None:
            self.tallies.value_reads += 1
        return value

    def carry(self, producer: CapturedOp, version: CapturedOp) -> None:
        """``version``, a record of what ``producer``'s tensor holds after a write, has
        the values known of ``producer``'s (what the tensor holds now is known under its
        producer, or not at all)."""
        if id(producer) in self.stale:
            self.stale.add(id(version))
        elif id(producer) in self.by_record:
            self.by_record[id(version)] = self.by_record[id(producer)]

    def stand_in(self, real: torch.Tensor) -> torch.Tensor:
        """``real`` (an op's output computed from known values) as a tensor of this run:
        a fake tensor of the run's fake mode (below the recorder, or :attr:`fake_mode`
        where none is on the stack), or a meta tensor on meta kernels."""
        mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) or self.fake_mode
        if mode is None:
            return real.to("meta")
        return mode.from_tensor(real)

    def propagate(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], cost: Cost
                  ) -> torch.Tensor | list[torch.Tensor] | None:
        """On fake tensors, the values of a small index tensor made from known values
        (``arange``, views and arithmetic on known ids): the op is run again on those
        values, for real, on the CPU. Not for ops that write to an argument (the known
        values of what shares its storage would go stale: all are forgotten when an
        index tensor is written), nor for uninitialised memory or random numbers."""
        writes, written = self.writes(func, args, kwargs)
        if writes:
            # an in-place or out= op returns the tensor it wrote
            return written
        if (cost not in (Cost.ZERO, Cost.ELEMENTWISE) or func.overloadpacket in UNINITIALISED
                or torch.Tag.nondeterministic_seeded in func.tags
                or any(isinstance(a, torch.SymInt) for a in pytree.tree_leaves((args, kwargs)))):
            # a symbolic size, as in arange(n), would be pinned to its value by running
            # for real
            return None
        known: dict[int, torch.Tensor] = {}
        for t in tensors((args, kwargs)):
            value = self.value_of(t)
            if value is None:
                return None
            known[id(t)] = value
        with _disable_current_modes():
            try:
                out = func(*map_tensors(args, lambda t: known[id(t)]),
                           **map_tensors(kwargs, lambda t: known[id(t)]))
            except (RuntimeError, TypeError, ValueError, IndexError, NotImplementedError):
                return None
        if isinstance(out, (tuple, list)) and all(isinstance(t, torch.Tensor) and not t.is_meta for t in out):
            # a multi-output op (unbind, split): the values of each output
            return list(out)
        return out if isinstance(out, torch.Tensor) and not out.is_meta else None

    def of_outputs(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                   cost: Cost
                   ) -> list[torch.Tensor] | None:
        """The values of each item of a tuple or list ``out``, where they follow from
        known values: small index tensors only (:meth:`propagate`)."""
        outputs = [item for item in (out if isinstance(out, (tuple, list)) else ()) if isinstance(item, torch.Tensor)]
        if (outputs and all(item.dtype in INDEX_DTYPES for item in outputs)
                and isinstance(func, torch._ops.OpOverload)
                and sum(item.numel() for item in outputs) <= MAX_KNOWN_NUMEL):
            found = self.propagate(func, args, kwargs, cost)
            return found if isinstance(found, list) and len(found) == len(out) else None
        return None

    def writes(self, func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]
               ) -> tuple[bool, torch.Tensor | None]:
        """Whether ``func`` writes to one of its arguments, and the values of the first
        one it writes after the write, if known. When it writes to an index tensor, the
        known values of every tensor sharing its storage are updated
        (:meth:`_write_values`: the op is run on the values of the whole storage), or,
        where they cannot be, forgotten."""
        written = [t for t in self._written.tensors(func, args, kwargs) if t.dtype in INDEX_DTYPES]
        values = []
        for t in written:
            value = self._write_values(func, args, kwargs, t)
            if value is None:
                self._forget_storage(storage_of(t))
            values.append(value)
        return bool(self._written.positions(func)), values[0] if values else None

    def _write_values(self, func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any],
                      t: torch.Tensor
                      ) -> torch.Tensor | None:
        """Run the in-place op ``func`` for real on the known values of the storage of
        ``t`` (the tensor it writes, or the one it views), give every tensor on that
        storage its values after the write, and return ``t``'s. ``None`` where a value
        is not known or the known values are not laid out as the storage (then nothing
        changed)."""
        root = t._base if t._base is not None else t
        whole = self.value_of(root)
        if whole is None or root.storage_offset() != 0 or not root.is_contiguous() or whole.shape != root.shape:
            return None
        known: dict[int, torch.Tensor] = {}
        with _disable_current_modes():
            whole = whole.contiguous().clone()
            known[id(t)] = whole.as_strided(t.size(), t.stride(), t.storage_offset())
        for x in tensors((args, kwargs)):
            if id(x) not in known:
                value = self.value_of(x)
                if value is None:
                    return None
                known[id(x)] = value
        storage = storage_of(t)
        with _disable_current_modes():
            try:
                func(*map_tensors(args, lambda x: known[id(x)]),
                     **map_tensors(dict(kwargs), lambda x: known[id(x)]))
            except (RuntimeError, TypeError, ValueError, IndexError, NotImplementedError):
                return None
            for key, (ref, op) in list(self._producers.items()):
                alias = ref()
                if alias is None or alias.dtype != whole.dtype or storage_of(alias) != storage:
                    continue
                try:
                    value = whole.as_strided(alias.size(), alias.stride(), alias.storage_offset()).clone()
                except RuntimeError:
                    value = None
                if value is None:
                    self.by_record.pop(id(op), None)
                    self.stale.add(id(op))
                    self.leaf_values.pop(key, None)
                else:
                    self.by_record[id(op)] = value
                    self.stale.discard(id(op))
            return known[id(t)].clone()

    def _forget_storage(self, storage: int) -> None:
        """The known values of every index tensor on ``storage`` are forgotten (it was
        written)."""
        for key, (ref, op) in list(self._producers.items()):
            t = ref()
            if t is not None and t.dtype in INDEX_DTYPES and storage_of(t) == storage:
                self.by_record.pop(id(op), None)
                self.stale.add(id(op))
                self.leaf_values.pop(key, None)


def leaf_value(t: torch.Tensor, kind: LeafKind) -> torch.Tensor | None:
    """The values a leaf record of ``t`` carries (a small index tensor's, a one-element
    constant's), if any."""
    return small_index_value(t) if t.dtype in INDEX_DTYPES else _scalar_constant(t, kind)


def small_index_value(t: torch.Tensor) -> torch.Tensor | None:
    """The values of a small index tensor (int64 / int32 / bool, at most 4,096
    elements): a real tensor's own, a fake tensor's constant if it has one; ``None`` for
    anything else."""
    if t.dtype not in INDEX_DTYPES or not at_most(t, _MAX_VALUE_NUMEL):
        return None
    source: torch.Tensor | None = t.constant if isinstance(t, FakeTensor) else t
    if source is None or source.is_meta:
        return None
    # a copy of real data, not a fake tensor of the mode below us
    with _disable_current_modes():
        return source.detach().clone()


def _scalar_constant(t: torch.Tensor, kind: LeafKind) -> torch.Tensor | None:
    """The value of a one-element constant the forward made from data
    (``torch.tensor(0.0)``: an additive mask's "allowed" value, read by
    :mod:`flopscope.predict.attention`); ``None`` for anything else."""
    if kind is not LeafKind.CONSTANT or isinstance(t, FakeTensor) or t.is_meta or t.numel() != 1:
        return None
    with _disable_current_modes():
        return t.detach().clone()


def at_most(t: torch.Tensor, numel: int) -> bool:
    """``t`` has at most ``numel`` elements, a plain number: a tensor whose size is a
    symbol (a symbolic trace, :mod:`flopscope.symbolic`) has no known values, and
    comparing its size would add a guard on the symbol."""
    size = t.numel()
    return isinstance(size, int) and size <= numel


# .values: the known values of this thread's fake run, if one is running
_FAKE_RUN = threading.local()


@contextmanager
def fake_run(values: KnownValues) -> Iterator[None]:
    """This thread runs a fake run that knows ``values``: :func:`from_known_data` may
    answer from them."""
    outer = getattr(_FAKE_RUN, "values", None)
    _FAKE_RUN.values = values
    try:
        yield
    finally:
        _FAKE_RUN.values = outer


def from_known_data(original: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.tensor`` (or ``as_tensor``, ``asarray``) that, in a thread running a fake
    run, takes one-element fake tensors in its Python data at the values the recorder
    knows (``torch.tensor([positions.max() + 1 - n, ...])``: Qwen2-VL's rotary position
    deltas). torch reads such data's memory directly, which a fake tensor has not, and
    no op reaches a dispatch mode; a torch function mode would see the call, but any
    such mode also turns ``nn.MultiheadAttention``'s fast path off
    (``has_torch_function``). The new tensor's values are known too. Other calls (other
    threads, data without fake tensors, a value not known) are the original's."""

    @functools.wraps(original)
    def constructor(data: Any, *args: Any, **kwargs: Any) -> Any:
        values: KnownValues | None = getattr(_FAKE_RUN, "values", None)
        known = _known_data(values, data) if values is not None and isinstance(data, (list, tuple)) else None
        if values is None or known is None:
            return original(data, *args, **kwargs)
        out = original(known, *args, **kwargs)
        values.tallies.value_reads += 1
        if isinstance(out, torch.Tensor) and out.dtype in INDEX_DTYPES:
            with _disable_current_modes():
                values.learn(out, original(known, dtype=out.dtype))
        return out

    constructor.__flopscope_original__ = original  # type: ignore[attr-defined]
    return constructor


def _known_data(values: KnownValues, data: Any) -> Any:
    """``data`` with each one-element fake tensor replaced by its known value; ``None``
    if one is unknown or there is none."""
    found = False

    def value(x: Any) -> Any:
        nonlocal found
        if isinstance(x, (list, tuple)):
            return type(x)(value(v) for v in x)
        if isinstance(x, FakeTensor):
            known = values.value_of(x)
            if known is None or known.numel() != 1:
                raise LookupError
            found = True
            with _disable_current_modes():
                return known.item()
        return x

    try:
        out = value(data)
    except LookupError:
        return None
    return out if found else None
