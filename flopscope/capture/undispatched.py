"""Work done outside the ATen dispatcher, found in real runs, so that a count is never
silently low there either.

The recorder sees every ATen op; a kernel that never reaches the dispatcher records
nothing: a NumPy computation on ``.numpy()`` views brought back with
``torch.from_numpy``, a C++ / CUDA extension that fills a tensor through its data
pointer, either one usually called from an ``autograd.Function``. :class:`OutsideCheck`
watches a real run for the traces such work leaves (three rules, each checked where it
costs nothing on the ops that run normally):

- **foreign memory**: a tensor made from data (``aten.lift_fresh``, which
  ``torch.from_numpy``, ``torch.as_tensor`` and ``torch.tensor`` all dispatch) whose
  memory torch's allocator did not make (its storage cannot be resized: NumPy's, a
  DLPack capsule's), inside a module call. ``torch.tensor(list)`` copies into torch's
  memory: not flagged;
- **unwritten allocation**: a module call returns a tensor (or a view of one) made by
  ``empty`` / ``empty_like`` / ``new_empty`` / ``empty_strided`` that no recorded op
  wrote: an extension's ``torch::empty_like`` filled in C++; or an op (not a view, not
  an op writing it, not an argument whose values it ignores: ``baddbmm(empty, q, k,
  beta=0)``, ``zeros_like(empty)``: :mod:`flopscope.capture.unread`) reads such memory:
  a Triton kernel launched from Python filled the buffer and the module goes on with it
  (a norm, an output projection) before returning; flagged at the module call that
  allocated it;
- **made by no op**: a tensor no recorded op made, that a module call returns or an op
  inside one reads, whose autograd node is a custom ``autograd.Function``'s made during
  the run (its forward dispatched nothing that made it), or that a module returns
  holding foreign memory shared with no tensor the run has seen.

Views and aliases of inputs, parameters returned as they are, tensors made by
constructors and tensors that existed before the run (a module's tensor attributes) are
not flagged. Each finding is one :class:`OutsideWork`: the module path and call, the
tensor's shape, what gave it away and the ``autograd.Function`` it came from, if any.
``Profile.unsupported()`` lists them as ``"outside the ATen dispatcher: <module path>"``
and ``Profile.notes`` (and one warning) say what they are. What cannot be seen is in
``docs/guarantees.md`` §8. Fake tensors cannot reach NumPy at all (``.numpy()`` of a
fake tensor raises; the error names the module), so the check is for real runs.
"""

from __future__ import annotations

import sys
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from ..formulas.registry import shape_of
from .fake import tensors_in
from .module_tracker import ModuleCall, ModuleTracker

OUTSIDE = "outside the ATen dispatcher: "
"""The prefix of the :meth:`Profile.unsupported` keys of such work: ``"outside the ATen
dispatcher: blocks.0.ext"`` (the module path; ``""`` is the root)."""

FOREIGN = "its memory came from NumPy or another library: torch.from_numpy, torch.as_tensor, DLPack"
UNWRITTEN = "it is memory from empty / empty_like that no ATen op wrote"
UNMADE = "no ATen op made it"
READ_UNWRITTEN = "it is memory from empty / empty_like that no ATen op wrote, read by"

_PLAIN = (torch.Tensor, nn.Parameter)
_FUNCTION_NODE = torch.autograd.function.BackwardCFunction


@dataclass(frozen=True, slots=True)
class OutsideWork:
    """One tensor computed outside the ATen dispatcher: where (module path, which call),
    its shape, what gave it away (``source``: :data:`FOREIGN`, :data:`UNWRITTEN` or
    :data:`UNMADE`), and the ``autograd.Function`` whose forward made it, if known."""

    module: str
    call: int
    shape: tuple[int, ...]
    source: str
    function: str | None = None

    def describe(self, calls: int = 1) -> str:
        via = f" made in {self.function}.forward" if self.function else ""
        times = f", {calls} calls" if calls > 1 else ""
        return (f"module '{self.module}'{times}: a tensor of shape {list(self.shape)}{via} was "
                "computed outside the ATen dispatcher: its multiplies are not counted "
                f"({self.source})")


class Watched(Protocol):
    """What the check needs of a run's recorder
    (:class:`flopscope.capture.recorder.Recorder`; not imported here, which would put
    this module in the capture / profile import cycle)."""

    outside_work: list[Any]
    on_lift: Callable[[torch.Tensor], None] | None
    on_constant: Callable[[torch.Tensor], None] | None
    on_unwritten_read: Callable[[torch.Tensor, ModuleCall, ModuleCall, Any], None] | None

    @property
    def leaf_names(self) -> Mapping[int, Any]: ...

    def made_by(self, t: torch.Tensor) -> object | None: ...

    def unwritten_allocation(self, t: torch.Tensor) -> bool: ...

    def known_storage(self, t: torch.Tensor) -> bool: ...


def watch(recorder: Watched, tracker: ModuleTracker) -> OutsideCheck:
    """Watch a real run of ``recorder`` / ``tracker`` (their hooks are set); the
    findings go to ``recorder.outside_work``."""
    return OutsideCheck(recorder, tracker)


class OutsideCheck:
    """The three rules of the module docstring, on the hooks of a real run's recorder
    and module tracker."""

    def __init__(self, recorder: Watched, tracker: ModuleTracker) -> None:
        self._recorder, self._tracker = recorder, tracker
        self.found: list[OutsideWork] = recorder.outside_work
        # autograd nodes made from now on are the run's
        self._start = torch.autograd._get_sequence_nr()
        # storage -> a tensor on it already reported
        self._flagged: dict[int, weakref.ref[torch.Tensor]] = {}
        recorder.on_lift = self._lifted
        recorder.on_constant = self._constant
        recorder.on_unwritten_read = self._read_unwritten
        tracker.on_return = self._returned

    # the rules ---------------------------------------------------------------------------------
    def _lifted(self, t: torch.Tensor) -> None:
        # (empty in the backward pass; a recomputed forward is not new work)
        stack = self._tracker.stack
        if stack and not self._tracker.replaying and _plain(t) and _foreign(t):
            self._flag(t, stack[-1], FOREIGN)

    def _constant(self, t: torch.Tensor) -> None:
        stack = self._tracker.stack
        if not stack or self._tracker.replaying or not _plain(t):
            return
        if self._new_function_output(t):
            self._flag(t, stack[-1], UNMADE)
        # NumPy's memory met inside an autograd.Function
        elif _foreign(t) and _running_function() is not None:
            self._flag(t, stack[-1], FOREIGN)

    def _returned(self, module: nn.Module, call: ModuleCall, args: tuple[Any, ...],
                  kwargs: dict[str, Any],
                  output: Any) -> None:
        if isinstance(output, torch.Tensor):
            returned: Iterable[torch.Tensor] = (output,)
        elif isinstance(output, (tuple, list, dict)):
            returned = tensors_in(output)
        else:
            return
        inputs: set[int] | None = None
        for t in returned:
            if not _plain(t) or self._seen(t):
                continue
            if self._recorder.made_by(t) is not None:
                if self._recorder.unwritten_allocation(t):
                    self._flag(t, call, UNWRITTEN)
                continue
            if self._new_function_output(t):
                self._flag(t, call, UNMADE)
                continue
            if not _foreign(t):
                continue  # an input, a parameter or a tensor from before the run, returned as it is
            if inputs is None:
                inputs = {id(x) for x in tensors_in((args, kwargs))}
            if (id(t) in inputs or id(t) in self._recorder.leaf_names or _attribute_of(module, t)
                    or self._recorder.known_storage(t)):
                continue
            self._flag(t, call, UNMADE)

    def _read_unwritten(self, t: torch.Tensor, allocated: ModuleCall, reader: ModuleCall,
                        op: Any) -> None:
        if self._tracker.replaying or not _plain(t):
            return
        name = getattr(getattr(op, "overloadpacket", op), "__name__", str(op))
        self._flag(t, allocated, f"{READ_UNWRITTEN} {name} in module '{reader.path}': a kernel "
                                 "outside the dispatcher filled it, such as a Triton kernel")

    # helpers -----------------------------------------------------------------------------------
    def _new_function_output(self, t: torch.Tensor) -> bool:
        """``t`` has the autograd node of a custom ``autograd.Function``, made during
        the run."""
        node = t.grad_fn
        return isinstance(node, _FUNCTION_NODE) and node._sequence_nr() >= self._start

    def _seen(self, t: torch.Tensor) -> bool:
        if not self._flagged:
            return False
        ref = self._flagged.get(_storage(t))
        return ref is not None and ref() is not None

    def _flag(self, t: torch.Tensor, call: ModuleCall, source: str) -> None:
        if self._seen(t):
            return
        self._flagged[_storage(t)] = weakref.ref(t)
        self.found.append(OutsideWork(call.path, call.call, shape_of(t), source, _function_of(t)))


def _plain(t: torch.Tensor) -> bool:
    """A dense tensor with memory of its own (not a subclass, whose inner tensors the
    recorder sees; not meta)."""
    return type(t) in _PLAIN and t.layout == torch.strided and not t.is_meta and t.numel() > 0


def _foreign(t: torch.Tensor) -> bool:
    """``t``'s memory was not made by torch's allocator (NumPy's, DLPack's: a storage
    that cannot be resized)."""
    try:
        return not t.untyped_storage().resizable()
    except (RuntimeError, NotImplementedError):
        return False


def _storage(t: torch.Tensor) -> int:
    try:
        return int(t.untyped_storage()._cdata)
    except (RuntimeError, NotImplementedError):
        return id(t)


def _attribute_of(module: nn.Module, t: torch.Tensor) -> bool:
    """``t`` is an attribute of ``module`` (or inside a list, tuple or dict attribute of
    it): a tensor from before."""
    for value in vars(module).values():
        if value is t or (isinstance(value, (list, tuple, dict)) and any(x is t for x in tensors_in(value))):
            return True
    return False


def _function_of(t: torch.Tensor) -> str | None:
    """The ``autograd.Function`` whose forward made ``t``: its autograd node's, else the
    one whose ``forward`` is running now (its forward has not returned yet; with grad
    mode off there is no node)."""
    node = t.grad_fn
    if isinstance(node, _FUNCTION_NODE):
        cls = getattr(node, "_forward_cls", None)
        return getattr(cls, "__qualname__", type(node).__name__)
    return _running_function()


def _running_function() -> str | None:
    """The ``autograd.Function`` whose ``forward`` is running now (64 frames up at
    most), if any.

    Found by its forward's code object among the subclasses of
    ``torch.autograd.Function`` (from torch 2.15 ``Function.apply`` is C code with no
    Python frame to find). Only called for a finding, so the walk over the subclasses
    costs nothing on a clean run."""
    forwards: dict[object, str] = {}
    pending = list(torch.autograd.Function.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        code = getattr(cls.forward, "__code__", None) if "forward" in cls.__dict__ else None
        if code is not None:
            forwards[code] = cls.__qualname__
    frame = sys._getframe(1)
    for _ in range(64):
        if frame is None:
            break
        if frame.f_code in forwards:
            return forwards[frame.f_code]
        frame = frame.f_back  # type: ignore[assignment]
    return None


def unsupported_of(found: Sequence[OutsideWork]) -> dict[str, int]:
    """``{OUTSIDE + module path: tensors}`` (the :meth:`Profile.unsupported` entries of
    the findings)."""
    return dict(Counter(OUTSIDE + work.module for work in found))


def notes_of(found: Sequence[OutsideWork], limit: int = 8) -> list[str]:
    """One note per module path, source, function and shape (its calls summed), at most
    ``limit``, then a count."""
    grouped = Counter(OutsideWork(w.module, 0, w.shape, w.source, w.function) for w in found)
    notes = [work.describe(calls) for work, calls in list(grouped.items())[:limit]]
    if len(grouped) > limit:
        notes.append(f"... and {len(grouped) - limit} more computed outside the ATen dispatcher "
                     "(see prof.unsupported())")
    return notes


def converts_to_numpy(error: BaseException) -> bool:
    """Whether ``error`` (or an error in its chain) is a fake or meta tensor refusing
    ``.numpy()``."""
    seen: BaseException | None = error
    for _ in range(16):
        if seen is None:
            return False
        text = str(seen)
        if ".numpy()" in text or "to numpy" in text.lower():
            return True
        seen = seen.__cause__ or seen.__context__
    return False

