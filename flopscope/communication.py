"""Collectives: which ops communicate, what kind of collective each is, and how many bytes it carries.

Both families of torch.distributed ops reach the dispatcher, so a profile sees every collective a rank issues
from Python (DTensor redistribution, FSDP2, functional collectives, ``dist.all_reduce``): the functional ones
(``_c10d_functional.all_reduce``, ``all_gather_into_tensor``, ``reduce_scatter_tensor``, ``all_to_all_single``,
``broadcast``) and the in-place c10d ones (``c10d.allreduce_``, ``_allgather_base_``, ``_reduce_scatter_base_``,
``alltoall_base_``, ``broadcast_``, ``send``, ``recv_``), DDP's gradient all-reduce included (its reducer goes
through ``c10d.allreduce_``). Conventions: ``docs/conventions.md`` §12.

**Message bytes** are the size of the whole (unsharded) buffer, as NCCL's tests print a collective's size: the
larger of what the collective reads and what it writes, so the input of an all-reduce, a reduce-scatter or a
broadcast, the output of an all-gather, and for an all-to-all the larger of the tokens sent and received. Bus
traffic per rank follows from it (an all-reduce ring moves ``2·(p-1)/p`` of it per rank).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from tabulate import tabulate

from .formulas.traffic import nbytes

if TYPE_CHECKING:
    from torch import fx

    from .profile import Profile

ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, BROADCAST, SEND, RECV = (
    "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send", "recv")

_KINDS: dict[str, str] = {
    # functional collectives (torch.distributed._functional_collectives, DTensor, FSDP2)
    "all_reduce": ALL_REDUCE, "all_reduce_": ALL_REDUCE, "all_reduce_coalesced": ALL_REDUCE,
    "all_reduce_coalesced_": ALL_REDUCE, "all_gather_into_tensor": ALL_GATHER,
    "all_gather_into_tensor_out": ALL_GATHER, "all_gather_into_tensor_coalesced": ALL_GATHER,
    "reduce_scatter_tensor": REDUCE_SCATTER, "reduce_scatter_tensor_coalesced": REDUCE_SCATTER,
    "all_to_all_single": ALL_TO_ALL, "broadcast": BROADCAST, "broadcast_": BROADCAST,
    # c10d in-place ops (torch.distributed.all_reduce and friends)
    "allreduce_": ALL_REDUCE, "allreduce_coalesced_": ALL_REDUCE, "allgather_": ALL_GATHER,
    "_allgather_base_": ALL_GATHER, "allgather_into_tensor_coalesced_": ALL_GATHER,
    "allgather_coalesced_": ALL_GATHER, "reduce_scatter_": REDUCE_SCATTER, "_reduce_scatter_base_": REDUCE_SCATTER,
    "reduce_scatter_tensor_coalesced_": REDUCE_SCATTER, "alltoall_": ALL_TO_ALL, "alltoall_base_": ALL_TO_ALL,
    "send": SEND, "recv_": RECV, "recv_any_source_": RECV,
}
_NAMESPACES = ("_c10d_functional", "c10d", "_c10d_functional_autograd")
_FIRST_WRITTEN = frozenset({
    "allreduce_", "allreduce_coalesced_", "broadcast_", "recv_", "recv_any_source_", "allgather_", "_allgather_base_",
    "allgather_coalesced_", "allgather_into_tensor_coalesced_", "reduce_scatter_", "_reduce_scatter_base_",
    "reduce_scatter_tensor_coalesced_", "alltoall_", "alltoall_base_"})
"""c10d ops whose first argument is what they write (their schemas do not say so)."""


def kind_of(func: Any) -> str | None:
    """The collective ``func`` is (``"all_reduce"``, ...), or ``None`` for any other op (``wait_tensor``
    included: it only waits)."""
    namespace = getattr(func, "namespace", None)
    if namespace not in _NAMESPACES:
        return None
    return _KINDS.get(func.overloadpacket.__name__)


def is_bookkeeping(func: Any) -> bool:
    """A torch.distributed op that communicates nothing: ``wait_tensor``, autograd wrappers, barriers, and
    FSDP2's copies into and out of its communication buffers (``fsdp.all_gather_copy_in``, ``chunk_cat``,
    ``split_with_sizes_copy``: data movement, no arithmetic; their bytes are counted as any op's)."""
    namespace = getattr(func, "namespace", None)
    return namespace == "fsdp" or (namespace in _NAMESPACES and kind_of(func) is None)


def message_bytes(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], outputs: list[torch.Tensor]) -> int:
    """The collective's message size in bytes: the larger of what it reads and what it writes. Written are the
    tensors it returns, the arguments its schema marks as written (``Tensor(a!)``) and the first argument of the
    c10d ops, whose schemas do not mark it (their output buffer, or the tensors an all-reduce overwrites); read
    are the other tensor arguments (see the module docstring)."""
    written: dict[int, torch.Tensor] = {id(t): t for t in outputs}
    read: dict[int, torch.Tensor] = {}
    schema = getattr(func, "_schema", None)
    for i, argument in enumerate(schema.arguments if schema is not None else ()):
        value = args[i] if i < len(args) else kwargs.get(argument.name)
        tensors = [value] if isinstance(value, torch.Tensor) else [
            t for t in (value if isinstance(value, (list, tuple)) else ()) if isinstance(t, torch.Tensor)]
        alias = argument.alias_info
        writes = (alias is not None and alias.is_write) or (i == 0 and func.overloadpacket.__name__ in _FIRST_WRITTEN)
        target = written if writes else read
        target.update((id(t), t) for t in tensors)
    taken = sum(nbytes(t) for key, t in read.items() if key not in written)
    return max(taken, sum(nbytes(t) for t in written.values()))


def group_size(args: Any, kwargs: dict[str, Any]) -> int | None:
    """Ranks in the collective's group: from its group name (functional collectives) or its process group
    object (c10d ops); ``None`` if neither can be read."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, str):
            try:
                from torch.distributed.distributed_c10d import _resolve_process_group

                return int(_resolve_process_group(value).size())  # type: ignore[arg-type]  # a GroupName is a str
            except Exception:  # not a group name
                continue
        if isinstance(value, torch.ScriptObject) and value._type().qualified_name().endswith("c10d.ProcessGroup"):
            import torch.distributed as dist

            return int(dist.ProcessGroup.unbox(value).size())
    return None


@dataclass(frozen=True)
class CollectiveRow:
    """Collectives of one kind, group size, module, role and phase: how many calls and their message bytes."""

    kind: str  # "all_reduce", "all_gather", ...
    group: int | None  # ranks in the group
    module: str  # the module of the multiply whose result it carries (else where it ran; "" is the root)
    role: str  # the role of that multiply ("" if none: a parameter's all-gather, for instance)
    phase: str  # "forward", "backward" or "recompute"
    calls: int
    bytes: int  # message bytes of all the calls together

    def row(self) -> dict[str, Any]:
        return {"kind": self.kind, "group": self.group, "module": self.module, "role": self.role,
                "phase": self.phase, "calls": self.calls, "bytes": self.bytes}


def collectives(prof: Profile) -> list[CollectiveRow]:
    """Every collective of the profile, grouped (see :class:`CollectiveRow`), in first-seen order."""
    from .capture.recorder import captured

    assignments = prof.role_assignments()
    calls: Counter[tuple[str, int | None, str, str, str]] = Counter()
    sizes: Counter[tuple[str, int | None, str, str, str]] = Counter()
    for node in prof.graph.nodes:
        op = captured(node)
        if op.collective is None:
            continue
        kind, size, group = op.collective
        source = _carried(node, assignments)
        role = "" if source is None else max(assignments[source].parts, key=assignments[source].parts.__getitem__)
        module = captured(source).module if source is not None else op.module  # the caller, not the hook's parent
        key = (kind, group, module or "", role, op.phase)
        calls[key] += 1
        sizes[key] += size
    return [CollectiveRow(*key, calls[key], sizes[key]) for key in calls]


def _carried(node: fx.Node, assignments: Any, depth: int = 8) -> fx.Node | None:
    """The nearest multiply upstream of ``node`` through ops that do not multiply (whose result it carries)."""
    frontier = list(node.all_input_nodes)
    for _ in range(depth):
        for candidate in frontier:
            assignment = assignments.get(candidate)
            if assignment is not None and any(assignment.parts.values()):
                return candidate
        frontier = [arg for candidate in frontier for arg in candidate.all_input_nodes]
        if not frontier:
            break
    return None


# -------------------------------------------------------------------------------------------------- closed forms
@dataclass(frozen=True)
class PredictedCollective:
    """What a parallelism scheme's closed form says a rank sends: ``calls`` collectives of ``kind`` in ``phase``,
    ``bytes`` of messages in all; ``basis`` names the source."""

    kind: str
    phase: str
    calls: int
    bytes: int
    basis: str


def megatron(batch: int, tokens: int, width: int, layers: int, *, element_bytes: int, backward: bool = False,
             sequence_parallel: bool = False) -> list[PredictedCollective]:
    """Megatron-LM tensor parallelism (Shoeybi et al. 2019, §3: the f and g operators): per layer, one all-reduce
    of the ``[batch, tokens, width]`` activation after each row-parallel GEMM (attention output, FFN down) in
    the forward pass, and one per column-parallel block (its input gradient) in the backward pass. With sequence
    parallelism (Korthikanti et al. 2022, §4.2.2) each all-reduce becomes an all-gather and a reduce-scatter of
    the same volume. Messages are whole activations (:func:`message_bytes`)."""
    volume = batch * tokens * width * element_bytes
    basis = "Megatron-LM sequence parallel" if sequence_parallel else "Megatron-LM tensor parallel"
    phases = ("forward", "backward") if backward else ("forward",)
    out = []
    for phase in phases:
        if sequence_parallel:
            out += [PredictedCollective(ALL_GATHER, phase, 2 * layers, 2 * layers * volume, basis),
                    PredictedCollective(REDUCE_SCATTER, phase, 2 * layers, 2 * layers * volume, basis)]
        else:
            out.append(PredictedCollective(ALL_REDUCE, phase, 2 * layers, 2 * layers * volume, basis))
    return out


def fsdp(unit_bytes: Sequence[int], *, resharded: Sequence[bool] | None = None,
         backward: bool = True) -> list[PredictedCollective]:
    """FSDP (ZeRO-3; FSDP2's ``fully_shard``): every unit's parameters (``unit_bytes``, unsharded) are all-gathered
    once in the forward pass, again in the backward pass for each unit resharded after its forward (default:
    all but the first, the root, which FSDP2 keeps), and every gradient is reduce-scattered once."""
    again = list(resharded) if resharded is not None else [False, *([True] * (len(unit_bytes) - 1))]
    out = [PredictedCollective(ALL_GATHER, "forward", len(unit_bytes), sum(unit_bytes), "FSDP: gather per forward")]
    if backward:
        gathered = [size for size, redo in zip(unit_bytes, again, strict=True) if redo]
        out += [PredictedCollective(ALL_GATHER, "backward", len(gathered), sum(gathered),
                                    "FSDP: resharded units gathered again"),
                PredictedCollective(REDUCE_SCATTER, "backward", len(unit_bytes), sum(unit_bytes),
                                    "FSDP: gradients reduce-scattered")]
    return out


def ddp(gradient_bytes: int, buckets: int = 1) -> list[PredictedCollective]:
    """DDP: every gradient all-reduced once per backward pass, in ``buckets`` messages."""
    return [PredictedCollective(ALL_REDUCE, "backward", buckets, gradient_bytes, "DDP: gradient all-reduce")]


def compare(measured: Sequence[CollectiveRow], predicted: Sequence[PredictedCollective],
            tablefmt: str = "simple") -> str:
    """Measured against predicted collectives, per kind and phase: calls and bytes side by side."""
    keys = list(dict.fromkeys([(p.kind, p.phase) for p in predicted] + [(m.kind, m.phase) for m in measured]))
    rows = []
    for kind, phase in keys:
        got = [m for m in measured if (m.kind, m.phase) == (kind, phase)]
        want = [p for p in predicted if (p.kind, p.phase) == (kind, phase)]
        got_calls, got_bytes = sum(m.calls for m in got), sum(m.bytes for m in got)
        want_calls, want_bytes = sum(p.calls for p in want), sum(p.bytes for p in want)
        same = "yes" if (got_calls, got_bytes) == (want_calls, want_bytes) else "NO"
        rows.append([kind, phase, got_calls, f"{got_bytes:,}", want_calls, f"{want_bytes:,}", same,
                     "; ".join(dict.fromkeys(p.basis for p in want)) or "-"])
    return tabulate(rows, headers=["collective", "phase", "calls", "bytes", "predicted calls", "predicted bytes",
                                   "match", "basis"], tablefmt=tablefmt, disable_numparse=True)
