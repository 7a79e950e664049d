"""Repeated calls counted once: a call whose records are provably an earlier call's.

On fake tensors, such a call is not run again. Its records are copies of the earlier
call's, moved to its own module calls.

On fake tensors (and meta) nothing is computed. What a call records is decided by what
it is given and what it reads, not by its data:

- the module: its code, its submodules, their parameters and plain attributes (in a
  block's key, a module held as a plain attribute, with no tensors, hooks or ``forward``
  of its own, by its structure);
- the structure of its arguments;
- each tensor argument's shape, strides, dtype, device and whether its values are known;
- every non-tensor argument's value;
- the values it reads.

:class:`CallReplayer` makes one decision per call: **key -> template ? replay : first**.
The **key** is everything but the values read (:class:`~.key.CallKey`). The first call
of a key runs for real, watched (:meth:`~flopscope.capture.recorder.Recorder.watching`).
Its records are kept as a :class:`~.template.CallTemplate` when they are provably the
same for every call of that key:

- it read no value (:attr:`~flopscope.capture.recorder.Recorder.value_reads`: no
  ``.item()``, no output made from known values, no formula or index check reading them,
  no ``.tolist()`` or ``.numpy()`` of a real tensor). Values are not part of the key, so
  a call reading them could differ with them;
- it wrote nothing it did not allocate (an input, a parameter, a cache made before it);
- what it left in the lists and dicts it was given (a cache:
  ``feat_cache[idx] = frames``, ``feat_idx[0] += 1``) a replay can leave the same:
  entries they held before, its tensor arguments, tensors it made (remade as outputs
  are) and plain values;
- its outputs are tensors it allocated, none with known values, its tensor arguments
  handed back as they are (a replay hands back its own call's), and plain values
  (numbers, strings, ``None``). No parameter or view of an input is handed back. Outputs
  viewing one storage are remade as views of one storage, an output given twice as one
  tensor;
- it changed no plain attribute of its modules (compared before and after: a replay
  would not change it);
- where its modules are watched (:attr:`CallReplayer.reads`: a block of the fake run's
  shadow, :mod:`.attribute_reads`), the key holds the plain attributes by name, and the
  template the values of those the call read. A layer's own index, read only with a
  cache, keys nothing when there is none. A call of other values of what it read is
  captured, and may become a template of its own;
- where it was given objects (a KV cache; :attr:`CallReplayer.reads` only), it read none
  of their state. It called their methods with tensors, plain values and attributes its
  blocks differ in. Each call is a call-out that a replay calls again
  (:mod:`.given_objects`), once a copy of the object shows that it gives outputs of the
  template's sizes;
- grad mode is off (no autograd graph to build). For a count that runs no backward
  (:attr:`CallReplayer.grad`), the graph is never used, and a replay's outputs require
  grad as the template's did;
- autocast is off;
- the module and its submodules carry no hooks of their own and no instance-level
  ``forward`` (offloading, caching hooks: state the key cannot see);
- no parameter appeared during the call.

A later call of the same key is then **replayed**. Each record of the template is copied
with its arguments mapped (the template's inputs to this call's, its parameters kept).
Its module calls are renumbered after the calls made so far. Its outputs are new fake
tensors of the same sizes, strides and dtypes, produced by the copied records. The lists
and dicts it was given are changed as the template's were (a call whose lists alias
otherwise than the template's, one list given twice, is captured). The capture is the
same as running the call again: the same ops, shapes, MACs, module calls and dataflow.
Only the order in which the call's inputs first appear as leaves may differ.

A call whose key has no template is captured again every time. The reason is kept in
:attr:`CallReplayer.refused`. **Every refusal is listed in one place**, with its words
and the function that decides it: :data:`~._refusals.REFUSALS`; the reasons a block
missed an earlier block's template are :data:`~._refusals.MISSES`.

What the key cannot see: state a module keeps outside its own attributes (a mutable
object's contents, a global), and values of real inputs read by other means than ATen
ops, ``.tolist()`` and ``.numpy()`` (a raw ``data_ptr()``, a C++ extension). Such a
module is profiled with reuse off (``profile_pipeline(..., reuse=False)``).

The package, in the order of a call's life:

- ``__init__``: :class:`CallReplayer`, wrapping the modules and deciding each call;
- ``key``: :class:`~.key.CallKey`, the keying and its refusals;
- ``template``: :class:`~.template.CallTemplate`, watching a first call and its
  refusals;
- ``copy``: copying a template into a call, its records then its outputs;
- ``containers``: the lists and dicts a call changes;
- ``attribute_reads``: the plain attributes a block reads;
- ``given_objects``: the methods a block calls on the objects it is given;
- ``_refusals``: every refusal and miss, with its words.
"""

from __future__ import annotations

import functools
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..module_tracker import ModuleTracker
from ..recorder import Recorder
from . import given_objects
from ._refusals import MISSES, OTHER_READS, OTHER_SIZES, REFUSALS, REPLACED_FORWARD, SHARED_MODULE, Refusal, Refused
from .attribute_reads import StandIn
from .containers import lists_and_dicts
from .copy import callouts_agree, replay
from .key import CallKey, call_key, key_difference, owns_its_paths, read_values
from .template import CallTemplate, Candidate, first_call, passed_attributes

__all__ = ["MISSES", "REFUSALS", "CallKey", "CallReplayer", "CallTemplate", "Refusal",
           "stand_in_refused"]

# The templates a key keeps (CallReplayer._keep).
_KEPT = 4


@dataclass
class CallReplayer:
    """Replays repeated calls of the wrapped modules (:meth:`wrapping`) into
    ``recorder``'s capture; see the module docstring. :attr:`replayed` and
    :attr:`captured` count calls per module path, :attr:`refused` the reasons a
    call's key got no template (each reason once per key), :attr:`missed` per list of
    blocks the first reason a block call was not replayed from an earlier block's (a
    refusal, or what kept its key from an earlier block's template)."""

    recorder: Recorder
    tracker: ModuleTracker
    replayed: Counter[str] = field(default_factory=Counter)
    captured: Counter[str] = field(default_factory=Counter)
    refused: dict[str, list[str]] = field(default_factory=dict)
    missed: dict[str, str] = field(default_factory=dict)
    # Also replay a block of a ModuleList from another block of the same structure.
    blocks: bool = True
    # Grad mode may be on: no backward follows (a forward's count), so the autograd
    # graph is never used; a replay's outputs require grad as the template's did (the
    # inputs' and parameters' requires_grad are keyed).
    grad: bool = False
    # A block is keyed by the plain attributes its first call read, not all it holds
    # (the modules are the run's for its duration, so their classes may be swapped while
    # watched: replay.attribute_reads).
    reads: bool = False
    # Where a block is given objects, the int attributes its blocks differ in are read
    # as stand-ins (attribute_reads.StandIn); a torch function refusing one fails the
    # run (the runner counts again without: stand_in_refused).
    stand_ins: bool = True
    # Whether a first call ran with stand-ins (a failure of the run is then counted
    # again without: some torch functions refuse a stand-in with a RuntimeError that
    # does not name it).
    stood_in: bool = False
    _templates: dict[CallKey, list[Candidate]] = field(default_factory=dict)
    # id() of the modules whose forward is our wrapper
    _ours: set[int] = field(default_factory=set)
    # the ModuleLists whose blocks are replayed from one another
    _groups: set[str] = field(default_factory=set)
    # a list of blocks' path -> the list
    _lists: dict[str, nn.Module] = field(default_factory=dict)
    # a list of blocks' path -> its attributes read as stand-ins (_passed)
    _passing: dict[str, dict[str, frozenset[str]]] = field(default_factory=dict)
    # a list of blocks' path -> the key of its first call
    _firsts: dict[str, CallKey] = field(default_factory=dict)
    # The lists one of whose blocks' calls could not be keyed (an argument of another
    # type, a shared module): their blocks' calls are captured without a key's cost. (A
    # call whose records were refused refuses its key only: T5's first block reads
    # values, the others are replayed.)
    _unkeyed: set[str] = field(default_factory=set)
    # id(block) -> _own_paths
    _owned: dict[int, bool] = field(default_factory=dict)
    # the wrapped modules
    _roots: list[nn.Module] = field(default_factory=list)
    # id(module) -> its modules by name (_modules_of, of the calls running)
    _named: dict[int, dict[str, nn.Module]] = field(default_factory=dict)
    # id() of the objects the modules hold (given_objects.held_objects), once needed
    _held: set[int] | None = None
    # the thread whose calls are counted
    _thread: int = field(default_factory=threading.get_ident)

    @contextmanager
    def wrapping(self, modules: Mapping[str, nn.Module], *,
                 blocks_only: bool = False) -> Iterator[CallReplayer]:
        """For the block, each module's ``forward`` replays calls whose key has a
        template (a wrapper set on the instance, removed afterwards; a module with an
        instance-level ``forward`` already is not wrapped). ``blocks_only``: only the
        blocks of the lists inside them (a model called once: its layers)."""
        with ExitStack() as stack:
            self._roots.extend(modules.values())
            for path, module in modules.items():
                if "forward" in vars(module) and not blocks_only:
                    self.refused.setdefault(path, []).append(REPLACED_FORWARD.say())
                    continue
                targets = [] if blocks_only else [(path, module, path, False)]
                if self.blocks:
                    targets += [(f"{inside}.{i}", block, inside, True)
                                for name, blocks in module.named_modules() if _blocks(blocks)
                                for inside in (f"{path}.{name}" if path else name,)
                                for i, block in enumerate(blocks) if "forward" not in vars(block)]
                for name, blocks in (module.named_modules() if self.blocks else ()):
                    if _blocks(blocks):
                        self._lists[f"{path}.{name}" if path else name] = blocks
                for where, target, label, structural in targets:
                    self._ours.add(id(target))
                    target.forward = self._wrapped(where, target, target.forward, label, structural)
                    stack.callback(vars(target).pop, "forward", None)
                    stack.callback(self._ours.discard, id(target))
            yield self

    def notes(self, refusals: bool = True) -> list[str]:
        """One line per module whose calls were replayed, and per list of blocks none of
        whose calls was, the first reason (:attr:`missed`); ``refusals``: also one
        line per reason a call was refused."""
        lines = []
        for path in sorted(set(self.replayed) | set(self.captured) | set(self.refused)):
            replayed, captured = self.replayed[path], self.captured[path]
            missed = not replayed and captured > 1 and path in self._groups and path in self.missed
            if not refusals and not replayed and not missed:
                continue
            if replayed and path in self._groups:
                lines.append(f"{path}: {replayed} of {replayed + captured} block calls replayed "
                             "from an earlier call of a block of the same structure on the same "
                             "inputs' shapes (fake tensors: the same records)")
            elif replayed:
                lines.append(f"{path}: {replayed} of {replayed + captured} calls replayed from an "
                             "earlier call of the same inputs' shapes (fake tensors: the same "
                             "records)")
            elif captured > 1 and path not in self.refused and path not in self._groups:
                lines.append(f"{path}: {captured} calls, each captured (no two had the same "
                             "inputs' shapes and plain arguments)")
            reasons = dict.fromkeys(self.refused.get(path, ()) if refusals else ())
            for reason in reasons:
                lines.append(f"{path}: {'some calls' if replayed else 'not replayed, each call'} "
                             f"captured: {reason}")
            if missed and self.missed[path] not in reasons:
                lines.append(f"{path}: not replayed, each of its {captured} block calls captured: "
                             f"{self.missed[path]}")
        return lines

    def _wrapped(self, path: str, module: nn.Module, forward: Callable[..., Any], label: str,
                 structural: bool) -> Callable[..., Any]:
        """``module.forward`` replaying where it can; ``label`` names its calls in the
        notes (a block's: its list); ``structural``: keyed by the module's structure,
        not its identity (a block of a list)."""
        if structural:
            self._groups.add(label)

        @functools.wraps(forward)
        def call(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() != self._thread or (structural and label in self._unkeyed):
                # Another thread's call (not counted: the tracker's rule), or a block of
                # a list one of whose calls could not be keyed: captured without a key's
                # cost.
                return forward(*args, **kwargs)
            # (its submodules as they are at this call: a forward may add some)
            self._named.pop(id(module), None)
            try:
                if structural and not self._own_paths(path, module):
                    raise SHARED_MODULE.refused()
                key, tensors, objects = call_key(
                    module, args, kwargs, self.recorder, grad=self.grad,
                    watch_objects=self.reads and structural,
                    ours=self._ours, held=self._held_objects, structural=structural,
                    by_name=structural and self.reads)
            except Refused as why:
                self._refuse(label, str(why))
                self._unkeyed.add(label)
                self.captured[label] += 1
                return forward(*args, **kwargs)
            if structural:
                self._firsts.setdefault(label, key)
            modules = functools.partial(self._modules_of, module)
            # (the newest first)
            for template in self._found(key, module):
                if isinstance(template, CallTemplate) and (
                        not template.changes or lists_and_dicts((args, kwargs))[1] == template.containers):
                    if template.callouts and not callouts_agree(template, objects, self.recorder,
                                                                modules):
                        # (its objects' methods give other sizes here: a decoding step's
                        # grown cache)
                        continue
                    self.replayed[label] += 1
                    return replay(template, self.recorder, self.tracker, path, module,
                                  (args, kwargs), tensors,
                                  objects, modules)
                # (refused, or its lists and dicts alias otherwise than the template's)
                self.captured[label] += 1
                return forward(*args, **kwargs)
            # (no template, or none whose call-outs give this call's sizes: a new one)
            self.captured[label] += 1
            if structural and label not in self.missed and self.captured[label] + self.replayed[label] > 1:
                self.missed[label] = self._missed(label, key, module)
            return self._first(path, key, forward, args, kwargs, tensors, label, module, structural,
                               objects)

        return call

    def _first(self, path: str, key: CallKey, forward: Callable[..., Any], args: tuple[Any, ...],
               kwargs: dict[str, Any], tensors: list[torch.Tensor], label: str, module: nn.Module,
               structural: bool, objects: list[Any]) -> Any:
        """Run the call of ``module``, watched (:func:`~.template.first_call`); keep
        its records as the key's template if they are provably every call's, else the
        refusal (``structural``: a block, keyed by its structure)."""
        watched = self.reads and structural
        passed = self._passed(label) if objects and self.stand_ins and watched else None
        self.stood_in = self.stood_in or bool(passed)
        out, candidate = first_call(
            forward, args, kwargs, recorder=self.recorder, tracker=self.tracker, path=path,
            module=module,
            modules=self._modules_of(module), tensors=tensors, objects=objects,
            structural=structural,
            watched=watched, passed=passed, grad=self.grad)
        self._keep(key, candidate)
        if isinstance(candidate.found, str):
            self._refuse(label, candidate.found)
        return out

    def _passed(self, label: str) -> dict[str, frozenset[str]]:
        """Per module name in a block of the list ``label``, the attributes read as
        stand-ins (:func:`~.template.passed_attributes`), found once per list."""
        found = self._passing.get(label)
        if found is None:
            found = self._passing[label] = passed_attributes(self._lists.get(label, ()))
        return found

    def _own_paths(self, path: str, module: nn.Module) -> bool:
        """:func:`~.key.owns_its_paths` for ``module`` (at ``path``), found once per
        module."""
        found = self._owned.get(id(module))
        if found is None:
            found = self._owned[id(module)] = owns_its_paths(path, module, self.tracker.paths)
        return found

    def _held_objects(self) -> set[int]:
        """``id()`` of the objects the wrapped modules hold
        (:func:`~.given_objects.held_objects`), found once."""
        if self._held is None:
            self._held = given_objects.held_objects(m for root in self._roots for m in root.modules())
        return self._held

    def _found(self, key: CallKey, module: nn.Module) -> Iterator[CallTemplate | str]:
        """The templates of ``key`` for this call of ``module`` (or why its calls are
        captured), the newest first: those whose attributes read hold this call's
        values (several where their call-outs gave other sizes)."""
        for candidate in reversed(self._templates.get(key, ())):
            if not candidate.reads or read_values(self._modules_of(module), candidate.reads) == candidate.values:
                yield candidate.found

    def _keep(self, key: CallKey, candidate: Candidate) -> None:
        """Keep ``candidate`` for ``key``; a key keeps its :data:`_KEPT` newest
        templates (a decoding step's grown cache gives each step's call-outs new
        sizes: the older steps' templates are never replayed again)."""
        kept = self._templates.setdefault(key, [])
        kept.append(candidate)
        if len(kept) > _KEPT:
            del kept[0]

    def _modules_of(self, module: nn.Module) -> dict[str, nn.Module]:
        """``dict(module.named_modules())``, made once per call of ``module`` (the
        wrapper drops it at each call: a forward may add submodules between two
        calls)."""
        found = self._named.get(id(module))
        if found is None:
            found = self._named[id(module)] = dict(module.named_modules())
        return found

    def _refuse(self, path: str, reason: str) -> None:
        """Note why a call of ``path`` (a module, or a list of blocks) got no
        template."""
        self.refused.setdefault(path, []).append(reason)
        if path in self._groups:
            self.missed.setdefault(path, reason)

    def _missed(self, label: str, key: CallKey, module: nn.Module) -> str:
        """Why a call of a block of the list ``label`` (its key ``key``, its module
        ``module``) found no template of an earlier block's to replay: what its key
        or the attributes it reads hold otherwise than the first block's, or (the
        same key and reads) the sizes its given objects' methods gave."""
        first = self._firsts.get(label)
        if first is not None and first != key:
            return key_difference(first, key)
        modules = self._modules_of(module)
        differ = sorted({f"{name or '(block)'}.{attribute}"
                         for candidate in self._templates.get(key, ()) if candidate.reads
                         for (name, attribute), was, now in zip(candidate.reads, candidate.values,
                                                                read_values(modules, candidate.reads), strict=True)
                         if was != now})
        if differ:
            return OTHER_READS.say(names=", ".join(differ[:3]),
                                   more=", ..." if len(differ) > 3 else "")
        return OTHER_SIZES.say()


def stand_in_refused(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it) is a function refusing an attribute's
    stand-in (a torch function taking an ``int`` argument:
    ``histc(bins=self.num_experts)``): the run is made again without stand-ins."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, TypeError) and StandIn.__name__ in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _blocks(modules: nn.Module) -> bool:
    """Whether ``modules`` is a list of blocks one may be replayed from another: an
    ``nn.ModuleList`` of at least two modules of one class that hold modules
    themselves (layers, resnets; not ``[Linear, Dropout]``, not a list holding
    ``None``)."""
    return (isinstance(modules, nn.ModuleList) and len(modules) > 1 and len({type(m) for m in modules}) == 1
            and all(m is not None and next(iter(m.children()), None) is not None for m in modules))
