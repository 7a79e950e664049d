"""The dataflow: which record holds each tensor's value.

A tensor an op made has that op's record (its producer). A tensor read after a write to
its storage has a version record (:mod:`._storage`). A tensor no recorded op made
(a parameter, a buffer, an input, a constant made outside the model) gets a leaf record
the first time an op reads it. :class:`Dataflow` keeps these by ``id(tensor)``, with a
weak reference to check that the tensor is still the one the record was made for.
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ...formulas.registry import shape_of
from ..module_tracker import ModuleCall
from ..records import CapturedOp, LeafKind, LeafName
from ._known_values import KnownValues, leaf_value
from ._storage import StorageVersions
from ._tallies import Tallies
from ._tensors import Producers, storage_of


class Dataflow:
    """The record of each tensor's value (its producer), and the tensors of each leaf.

    Args:
        producers: ``id(tensor)`` -> (the tensor, its record), shared with the storage
            versions and the known values.
        ops: the recorder's records (a new leaf record is appended to them).
        leaf_names: the names of the tensors that enter the run from outside.
        storage: the storage versions (a tensor's record after a write).
        known: the known values (a new leaf record carries a leaf tensor's).
        tallies: the run's tallies (parameters first seen during the run).
    """

    def __init__(self, producers: Producers, ops: list[CapturedOp],
                 leaf_names: Mapping[int, LeafName],
                 storage: StorageVersions, known: KnownValues, tallies: Tallies) -> None:
        self.producers = producers
        self._leaf_tensors: dict[int, list[weakref.ref[torch.Tensor]]] = {}
        """``id(leaf record)`` -> the tensors it was made the record of
        (:meth:`leaves_alive`: a look-up per leaf, not a scan of every tensor the run
        has seen)."""
        self._ops, self._leaf_names, self._storage = ops, leaf_names, storage
        self._known, self._tallies = known, tallies

    def made_by(self, t: torch.Tensor) -> CapturedOp | None:
        """The record of ``t``'s value, if ``t`` is the tensor it was made for."""
        found = self.producers.get(id(t))
        return found[1] if found is not None and found[0]() is t else None

    def record_of(self, t: torch.Tensor, backward: bool,
                  on_constant: Callable[[torch.Tensor], None] | None) -> CapturedOp:
        """The record of ``t``'s value now (what an op taking ``t`` takes as its
        argument): its producer, a version record after a write to its storage, or a new
        leaf for a tensor the run has not seen. ``backward``: the backward pass runs;
        ``on_constant``: told of a new constant leaf."""
        found = self.producers.get(id(t))
        if found is not None and found[0]() is t:
            return self._storage.current(t, found[1], backward)
        return self._leaf_of(t, on_constant)

    def record_getters(self, op: CapturedOp, out: Any, stack: tuple[ModuleCall, ...],
                       values: list[torch.Tensor] | None) -> None:
        """A record per tensor of a tuple or list ``out`` (``operator.getitem`` of
        ``op``), with ``values``, where known, the values of each item of ``out``."""
        outputs = [(i, item) for i, item in enumerate(out if isinstance(out, (tuple, list)) else ())
                   if isinstance(item, torch.Tensor)]
        op.output_shapes = tuple(shape_of(item) for _, item in outputs)
        op.dtype = outputs[0][1].dtype if outputs else None
        made_at, producers = self._storage.made_at, self.producers
        for i, item in outputs:
            getter = CapturedOp("call_function", operator.getitem, (op, i), {}, f"{op.name}_{i}",
                                phase=op.phase,
                                module_stack=stack, output_shapes=(shape_of(item),),
                                dtype=item.dtype)
            made_at[id(getter)] = len(self._ops)
            self._ops.append(getter)
            producers[id(item)] = (weakref.ref(item), getter)
            if values is not None:
                self._known.by_record[id(getter)] = values[i]

    def set_producer(self, t: torch.Tensor, op: CapturedOp) -> None:
        """``op`` is the record of ``t``'s value (a tensor made outside the dispatch,
        now: a write to its storage from here on is one after ``op``)."""
        ref = weakref.ref(t)
        self.producers[id(t)] = (ref, op)
        self._storage.made_at[id(op)] = len(self._ops)
        if op.node_op != "call_function":
            self._leaf_tensors.setdefault(id(op), []).append(ref)

    def leaves_alive(self, ops: Sequence[CapturedOp]) -> set[int]:
        """``id(record)`` of the leaves among ``ops`` whose tensors are alive (held by
        the model or the caller) and still have them as their record. Looks up each
        leaf's tensors (before: a scan of every tensor the run had seen, per call
        captured: a decoding step's first layer took longer each step)."""
        producers, alive = self.producers, set()
        for op in ops:
            if op.node_op == "call_function":
                continue
            for ref in self._leaf_tensors.get(id(op), ()):
                t = ref()
                found = producers.get(id(t)) if t is not None else None
                if found is not None and found[1] is op and found[0]() is t:
                    alive.add(id(op))
                    break
        return alive

    def known_storage(self, t: torch.Tensor) -> bool:
        """Whether ``t`` shares its storage with a tensor the run has seen (``t.data``
        of a parameter, an alias made outside the dispatcher). A scan of every tensor
        seen: for the rare tensor the run has not seen."""
        storage = storage_of(t)
        return any(seen is not None and storage_of(seen) == storage
                   for seen in (ref() for ref, _ in list(self.producers.values())))

    def values_known(self, t: torch.Tensor) -> bool:
        """Whether the run knows ``t``'s values (an input's, a small real tensor's, what
        propagated to it): what a record of it carries."""
        if self._known.value_of(t) is not None:
            return True
        op = self.made_by(t)
        if op is not None:
            return op.value is not None
        kind = self._leaf_names[id(t)].kind if id(t) in self._leaf_names else LeafKind.CONSTANT
        return leaf_value(t, kind) is not None

    def _leaf_of(self, t: torch.Tensor,
                 on_constant: Callable[[torch.Tensor], None] | None) -> CapturedOp:
        """A new record for a tensor no recorded op made (a parameter, buffer, input or
        outside constant)."""
        leaf = self._leaf_names.get(id(t))
        # a parameter the model registered during the run (FSDP2's unsharded ones) is
        # one still
        if leaf is None:
            if isinstance(t, torch.nn.Parameter):
                # each its own name: a shared one would make them all one tied weight
                self._tallies.late_parameters += 1
                leaf = LeafName("get_attr", f"parameter_{self._tallies.late_parameters}",
                                LeafKind.PARAMETER)
            else:
                leaf = LeafName("placeholder", "constant", LeafKind.CONSTANT)
        value = self._known.leaf_values.get(id(t))
        if value is None:
            value = leaf_value(t, leaf.kind)
        op = CapturedOp(leaf.node_op, leaf.name, (), {}, leaf.name.replace(".", "_"),
                        output_shapes=(shape_of(t),),
                        dtype=t.dtype, value=value, leaf=leaf.kind)
        # a parameter, buffer or input held its storage since before the run: every
        # write to it since counts
        self._storage.made_at[id(op)] = -1 if leaf.kind is not LeafKind.CONSTANT else len(self._ops)
        self._ops.append(op)
        ref = weakref.ref(t)
        self.producers[id(t)] = (ref, op)
        self._leaf_tensors.setdefault(id(op), []).append(ref)
        if on_constant is not None and leaf.kind is LeafKind.CONSTANT:
            on_constant(t)
        return op
