"""Copying a template into a call: its records first, then its outputs.

:func:`replay` is a replayed call. :func:`_copy_records` copies each record of the
template with its arguments mapped (the template's inputs to this call's, its parameters
kept or renamed), its module calls renumbered after the calls made so far, and calls the
template's call-outs again on this call's given objects where they fall
(:func:`_call_out`). :func:`_make_outputs` makes the outputs anew as fake tensors of the
same sizes, strides and dtypes, produced by the copied records; outputs viewing one
storage view one storage. The lists and dicts the call was given are then changed as the
template's call changed them (:func:`.containers.apply`).

Before a template with call-outs is replayed, :func:`callouts_agree` calls them on
copies of this call's objects, to check that they give outputs of the template's sizes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils import _pytree as pytree

from ..fake import empty_tensor, non_leaf
from ..module_tracker import ModuleCall, ModuleTracker
from ..recorder import Recorder, storage_of
from ..records import CapturedOp, map_records
from ..state import named_state
from . import attribute_reads, containers, given_objects
from .given_objects import CallOut
from .template import Argument, CallTemplate

Modules = Callable[[], Mapping[str, nn.Module]]
"""The modules of the call's module by name, made once per call when first asked for."""


def replay(template: CallTemplate, recorder: Recorder, tracker: ModuleTracker, path: str,
           module: nn.Module,
           given: tuple[tuple[Any, ...], dict[str, Any]], tensors: list[torch.Tensor],
           objects: list[Any],
           modules: Modules) -> Any:
    """Copy the template's records into this call of ``module`` (at ``path``: the
    template's module, or another of the same structure, whose parameters and module
    paths its copies take) given ``(args, kwargs)``, calling its call-outs again on
    this call's ``objects`` where they fall; change the lists and dicts it was given
    as the template's call did; return its outputs, made anew."""
    mapped = _copy_records(template, recorder, tracker, path, module, tensors, objects, modules)
    template.counts.add_to(recorder)
    recorder.largest_out = max(recorder.largest_out, template.largest_out)
    leaves = _make_outputs(template, recorder, tracker, tensors, mapped)
    out, made = pytree.tree_unflatten(leaves, template.output_spec)
    if template.changes:
        containers.apply(template.changes, given, tensors, made)
    return out


def _copy_records(template: CallTemplate, recorder: Recorder, tracker: ModuleTracker, path: str,
                  module: nn.Module,
                  tensors: list[torch.Tensor], objects: list[Any],
                  modules: Modules) -> dict[int, CapturedOp]:
    """Add the copies of the template's records to the capture, count its module
    calls, and return the records this call has for the template's (``id()`` ->
    record)."""
    stack, depth = tracker.stack, len(template.stack)
    rename = renaming(template.path, path)
    offset = {name: tracker.calls[rename(name)] - template.calls_before[name] for name in template.inner_calls}
    # (a leaf's stack is empty)
    stacks = [frames and (*stack, *(ModuleCall(rename(f.path), f.call + offset.get(f.path, 0))
                                    for f in frames[depth:]))
              for frames in template.stacks]
    mapped: dict[int, CapturedOp] = {}
    clones: list[CapturedOp] = []
    # (each copy -> the record it copies: the role passes run over the distinct records)
    copies = recorder.copies
    state = dict(named_state(module)) if template.parameters else {}
    # (what the template read, this call read: for a block watched around this one)
    if template.reads:
        named = modules()
        for name, attribute in template.reads:
            attribute_reads.note(named[name], attribute)

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
                # a parameter, a buffer, a constant: the same in every call
                return record
            mapped[id(record)] = found
        return found

    plan, done = template.plan, 0
    get = mapped.get
    for until, callout in (*template.callouts, (len(plan), None)):
        # (the hot loop of a replay: one pass, no call per record but the copy's)
        for step in plan[done:until]:
            op = step.op
            at = step.records_at
            if at is None:
                # (a leaf of this call's input, made where the template's was)
                new(op)
                continue
            args = op.args
            if at:
                listed = list(args)
                for i in at:
                    record = listed[i]
                    if type(record) is CapturedOp:
                        # (an input's, the first time)
                        listed[i] = mapped.get(id(record)) or new(record)
                    else:
                        # (records inside a list, a tuple, a dict)
                        listed[i] = map_records(record, new)
                args = tuple(listed)
            clone = CapturedOp(op.node_op, op.target, args,
                               map_records(op.kwargs, new) if step.kwargs_records else op.kwargs,
                               op.name,
                               op.phase, stacks[step.stack_at], *step.rest)
            if step.inputs:
                # (what link() would gather from its arguments: the template's, mapped
                # as they were above; a parameter's the same)
                found = tuple([get(id(record), record) for record in step.inputs])
                clone.inputs = tuple(dict.fromkeys(found)) if step.inputs_may_repeat else found
            mapped[id(op)] = clone
            clones.append(clone)
            copies[clone] = op
        done = until
        recorder.add_records(clones)
        clones = []
        # (its records are made by calling it: after the copies before it)
        if callout is not None:
            frames = (*stack, *(ModuleCall(rename(f.path), f.call + offset.get(f.path, 0))
                                for f in callout.stack[depth:]))
            _call_out(callout, objects[callout.at], recorder, tracker, modules, frames, mapped, new)
    for call, shapes in template.module_inputs.items():
        tracker.inputs[ModuleCall(rename(call.path), call.call + offset[call.path])] = shapes
    for name, n in template.inner_calls.items():
        tracker.calls[rename(name)] += n
    return mapped


def _make_outputs(template: CallTemplate, recorder: Recorder, tracker: ModuleTracker,
                  tensors: list[torch.Tensor],
                  mapped: dict[int, CapturedOp]) -> list[Any]:
    """The leaves of a replayed call's output: its tensor arguments handed back,
    plain values, and tensors made anew, each produced by its copied record
    (``mapped``)."""
    leaves: list[Any] = []
    stack = tracker.stack
    # (so that the recorder passes the allocations below: they are the copies' outputs)
    tracker.stack = ()
    try:
        # id(template's output) -> the tensor made for it
        made_for: dict[int, torch.Tensor] = {}
        # storage of the template's outputs -> the storage made for them
        bases: dict[int, torch.Tensor] = {}
        shared = Counter(storage_of(t) for t in template.output_tensors if t is not None)
        for value, like in zip(template.outputs, template.output_tensors, strict=True):
            if like is None:
                leaves.append(tensors[value.position] if isinstance(value, Argument) else value)
                continue
            made = made_for.get(id(like))
            # (an output twice is one tensor twice; outputs viewing one storage view
            # one)
            if made is None:
                storage = storage_of(like)
                # (the run's, on the stack or not)
                mode = like.fake_mode if isinstance(like, FakeTensor) else None
                cloned = like.requires_grad and like.storage_offset() == 0 and _dense(like)
                # (outputs viewing one storage: views of one base, as a run's are)
                if shared[storage] > 1 or (like.requires_grad and not cloned):
                    base = bases.get(storage)
                    # (one requires_grad for a storage's outputs: template._outputs)
                    if base is None:
                        size = like.untyped_storage().nbytes() // like.element_size()
                        base = bases[storage] = empty_tensor((size,), (1,), like.dtype, like.device,
                                                             mode=mode)
                        # (a run's output is no leaf: an in-place op on it is allowed)
                        if like.requires_grad:
                            base = bases[storage] = non_leaf(base.requires_grad_())
                    made = base.as_strided(like.shape, like.stride(), like.storage_offset())
                elif cloned:
                    # (no leaf, as a run's output: a clone keeps the strides of a dense
                    # tensor)
                    made = non_leaf(empty_tensor(like.shape, like.stride(), like.dtype, like.device,
                                                 True, mode))
                else:
                    made = empty_tensor(like.shape, like.stride(), like.dtype, like.device,
                                        mode=mode)
                made_for[id(like)] = made
                recorder.set_producer(made, mapped.get(id(value), value))
                # (made by this call, inside any call being watched)
                for window in recorder.windows:
                    window.storages.add(storage_of(made))
            leaves.append(made)
    finally:
        tracker.stack = stack
    return leaves


def callouts_agree(template: CallTemplate, objects: list[Any], recorder: Recorder,
                   modules: Modules) -> bool:
    """Whether the template's call-outs, called on copies of this call's ``objects``
    with the recorder suspended, give outputs of the template's sizes (so that a
    replay calling them on the objects themselves is the call); the objects are not
    touched."""
    # (a block around this one watches them: its first call would take our calls as its
    # own)
    if any(given_objects.watched(obj) for obj in objects):
        return False
    named = modules()
    twins: dict[int, Any] = {}
    made: dict[int, torch.Tensor] = {}
    with recorder.suspended():
        for _, callout in template.callouts:
            obj = objects[callout.at]
            twin = twins.get(id(obj))
            if twin is None:
                try:
                    twin = twins[id(obj)] = given_objects.detached(obj)
                except given_objects.NotDetachable:
                    # (a copy its methods could change without changing it cannot be
                    # made)
                    return False
            args, kwargs = _callout_arguments(callout, named,
                                              lambda record, meta: made.get(id(record))
                                              or _empty(meta))
            try:
                out = getattr(twin, callout.method)(*args, **kwargs)
            except Exception:
                # (the call itself raises it again, for the user to see)
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


def _call_out(callout: CallOut, obj: Any, recorder: Recorder, tracker: ModuleTracker,
              modules: Modules,
              frames: tuple[ModuleCall, ...], mapped: dict[int, CapturedOp],
              new: Callable[[CapturedOp], CapturedOp]) -> None:
    """Call ``callout``'s method again on ``obj`` in a replay (in the module calls
    ``frames``): its tensor arguments made anew with the replay's records, its
    attribute arguments this block's (``modules``); its outputs' records are then the
    replay's (``mapped``)."""
    made: dict[int, torch.Tensor] = {}

    def tensor(record: CapturedOp, meta: given_objects.Meta) -> torch.Tensor:
        found = made.get(id(record))
        if found is None:
            found = made[id(record)] = _empty(meta)
            recorder.set_producer(found, mapped.get(id(record)) or new(record))
        return found

    saved = tracker.stack
    # (the recorder passes the allocations of its arguments)
    tracker.stack = ()
    try:
        args, kwargs = _callout_arguments(callout, modules(), tensor)
        tracker.stack = frames
        out = getattr(obj, callout.method)(*args, **kwargs)
    finally:
        tracker.stack = saved
    for leaf, (kind, *rest) in zip(pytree.tree_leaves(out), callout.outputs, strict=True):
        if kind == "record":
            mapped[id(rest[0])] = recorder.record_of(leaf)


def _callout_arguments(callout: CallOut, modules: Mapping[str, nn.Module],
                       tensor: Callable[[CapturedOp, given_objects.Meta], torch.Tensor]
                       ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``callout``'s ``(args, kwargs)`` in a call of a block whose modules are
    ``modules``: a tensor argument as ``tensor(record, meta)`` gives it, an attribute
    argument as that block's module holds it, a plain value as it was."""
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


def _dense(t: torch.Tensor) -> bool:
    """Whether ``t``'s elements fill its storage without gaps or overlaps in some order
    of its dims (a transpose of a contiguous tensor is; an expanded or sliced one is
    not): a clone keeps its strides."""
    expected = 1
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride(), strict=True) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return t.numel() > 0


def _empty(meta: given_objects.Meta) -> torch.Tensor:
    """A tensor of ``meta``'s sizes, strides, dtype, device and ``requires_grad`` (fake,
    or meta: nothing allocated)."""
    return empty_tensor(*meta)


def renaming(old: str, new: str) -> Callable[[str], str]:
    """The module path ``p`` under ``old`` as the same path under ``new`` (paths outside
    ``old`` unchanged)."""
    if old == new:
        return lambda p: p
    prefix = old + "."
    return lambda p: new + p[len(old):] if p == old or p.startswith(prefix) else p
