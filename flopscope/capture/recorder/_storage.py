"""Storage versions: which op last wrote each storage, and the records of a tensor's
value after a write.

An op that writes in place (``add_``, ``copy_``, an ``out=`` argument) changes every
tensor on the storage it writes. :class:`StorageVersions` remembers each storage's last
write; a tensor read after a write to its storage gets a version record
(:func:`~flopscope.capture.records.after_write`) that takes both its producer and the
write. It also finds memory an ``empty`` allocated that no recorded op wrote (a kernel
outside the dispatcher filled it), and keeps the :class:`Window` s of calls being
watched.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ...formulas.registry import shape_of
from ..module_tracker import ModuleCall, ModuleTracker
from ..records import CapturedOp, after_write
from ..unread import unread_tensors
from ._autograd_link import phase_now
from ._known_values import UNINITIALISED, KnownValues
from ._tensors import Producers, WrittenArguments, storage_of


@dataclass(eq=False)
class Window:
    """A call being watched (:meth:`Recorder.watching`): its records start at ``start``
    in :attr:`Recorder.ops`; ``storages``: the storages the ops recorded since allocated
    (views excluded); ``outside_writes``: writes since to a storage not among them (an
    input's, a parameter's, a cache's made before the call)."""

    start: int
    storages: set[int] = dataclasses.field(default_factory=set)
    outside_writes: int = 0

    def allocated(self, t: torch.Tensor) -> bool:
        """Whether ``t``'s storage was allocated by an op recorded in the window."""
        return storage_of(t) in self.storages


UnwrittenRead = Callable[[torch.Tensor, ModuleCall, ModuleCall, Any], None]
"""Told of a read of unwritten memory: the tensor read, the module call that allocated
it, the module call of the op reading it, the op."""


class StorageVersions:
    """The writes to each storage, and the version records they make.

    Args:
        ops: the recorder's records (a version record is appended to them).
        tracker: the module tracker (a version record is made in its innermost call).
        producers: the recorder's dataflow (a tensor read after a write gets its version
            record).
        windows: the calls being watched (a write outside one's storages is counted).
        written: the arguments each op writes.
        known: the known values (a version record has its producer's).
    """

    def __init__(self, ops: list[CapturedOp], tracker: ModuleTracker, producers: Producers,
                 windows: list[Window],
                 written: WrittenArguments, known: KnownValues) -> None:
        self.last_write: dict[int, tuple[int, CapturedOp]] = {}
        """Storage -> (position in ops, the latest write)."""
        self.made_at: dict[int, int] = {}
        """``id(record)`` -> its position in ops when its tensor was made."""
        self.versions: dict[tuple[int, int], CapturedOp] = {}
        """``(id(producer), id(write))`` -> version record."""
        self.unwritten: dict[int, ModuleCall] = {}
        """Storage of an ``empty`` no recorded op wrote yet -> its module call (real
        runs)."""
        self._ops, self._tracker, self._producers, self._windows = ops, tracker, producers, windows
        self._written, self._known = written, known

    def note_writes(self, func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any],
                    op: CapturedOp) -> None:
        """After ``op`` ran: the storages it wrote to were last written by it
        (:meth:`current`)."""
        if not isinstance(func, torch._ops.OpOverload):
            return
        for t in self._written.tensors(func, args, kwargs):
            self.wrote(t, op)

    def wrote(self, t: torch.Tensor, op: CapturedOp) -> None:
        """``op`` wrote ``t``'s storage: its last write."""
        storage = storage_of(t)
        self.last_write[storage] = (len(self._ops), op)
        if self.unwritten:
            self.unwritten.pop(storage, None)
        for window in self._windows:
            if storage not in window.storages:
                window.outside_writes += 1

    def current(self, t: torch.Tensor, producer: CapturedOp, backward: bool) -> CapturedOp:
        """The record of ``t``'s value now: ``producer``, or a version record
        (:func:`after_write`) when an op wrote to ``t``'s storage after ``producer``
        made it (through ``t``, a view of it or the tensor it views). (``t`` held its
        storage all the while, so a write to that storage since was a write to ``t``'s.)
        ``backward``: the backward pass runs (the version record's phase)."""
        if not self.last_write:
            return producer
        last = self.last_write.get(storage_of(t))
        if last is None or last[1] is producer or last[0] <= self.made_at.get(id(producer), -1):
            return producer
        write = last[1]
        key = (id(producer), id(write))
        version = self.versions.get(key)
        if version is None:
            version = self.versions[key] = CapturedOp(
                "call_function", after_write, (producer, write), {},
                f"{producer.name}_after_{write.name}",
                phase=phase_now(backward), module_stack=self._tracker.stack or write.module_stack,
                output_shapes=(shape_of(t),), dtype=t.dtype)
            self.made_at[id(version)] = len(self._ops)
            self._ops.append(version)
            self._known.carry(producer, version)
        self._producers[id(t)] = (weakref.ref(t), version)
        return version

    def unwritten_allocation(self, t: torch.Tensor) -> bool:
        """Whether ``t`` (or what it views) was made by an allocation of uninitialised
        memory (``empty``, ``empty_like``, ``new_empty``, ``empty_strided``) that no
        recorded op has written since: what a kernel outside the dispatcher fills (a
        C++ / CUDA extension's ``torch::empty_like`` and a loop over its data
        pointer)."""
        found = self._producers.get(id(t))
        op = found[1] if found is not None and found[0]() is t else None
        # back through the views of it
        for _ in range(64):
            if op is None or not isinstance(op.target, torch._ops.OpOverload):
                return False
            if op.target.overloadpacket in UNINITIALISED:
                last = self.last_write.get(storage_of(t))
                return last is None or last[0] <= self.made_at.get(id(op), -1)
            if not op.target.is_view or not op.args or not isinstance(op.args[0], CapturedOp):
                return False
            op = op.args[0]
        return False

    def watch_unwritten(self, func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any],
                        inputs: list[torch.Tensor], out: Any, stack: tuple[ModuleCall, ...],
                        on_unwritten_read: UnwrittenRead) -> None:
        """Real mode: tell ``on_unwritten_read`` of each tensor this op reads (not a
        view of it, not an argument it writes or does not read the values of) whose
        memory an ``empty`` made and no recorded op wrote since (a kernel outside the
        dispatcher filled it: a Triton or C++ kernel handed the buffer); remember the
        ``empty`` this op makes."""
        unwritten = self.unwritten
        if unwritten and inputs and stack and not getattr(func, "is_view", False):
            written: set[int] | None = None
            for t in inputs:
                storage = storage_of(t)
                allocated = unwritten.get(storage)
                if allocated is None:
                    continue
                if written is None:
                    written = {id(w) for w in (*self._written.tensors(func, args, kwargs),
                                               *unread_tensors(func, args, kwargs))} if isinstance(
                        func, torch._ops.OpOverload) else set()
                if id(t) in written:
                    # filled by this op: copy_, fill_, an out= argument; or not read:
                    # the input of addmm(..., beta=0), the self of empty_like
                    # (flopscope.capture.unread)
                    continue
                del unwritten[storage]
                # its own producer, through views: not another tensor that came to live
                # at a freed storage's address
                if self.unwritten_allocation(t):
                    on_unwritten_read(t, allocated, stack[-1], func)
        if (stack and isinstance(out, torch.Tensor) and isinstance(func, torch._ops.OpOverload)
                and func.overloadpacket in UNINITIALISED and out.numel()):
            unwritten[storage_of(out)] = stack[-1]
