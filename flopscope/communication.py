"""Collectives: which ops communicate, what kind of collective each is, and how many bytes it carries.

Both families of torch.distributed ops reach the dispatcher, so a profile sees every collective a rank issues
from Python (DTensor redistribution, FSDP2, functional collectives, ``dist.all_reduce``): the functional ones
(``_c10d_functional.all_reduce``, ``all_gather_into_tensor``, ``reduce_scatter_tensor``, ``all_to_all_single``,
``broadcast``) and the in-place c10d ones (``c10d.allreduce_``, ``_allgather_base_``, ``_reduce_scatter_base_``,
``alltoall_base_``, ``broadcast_``, ``send``, ``recv_``). DDP's gradient all-reduce is issued by its C++
reducer, not through the dispatcher, and is not seen (``docs/conventions.md`` §12).

**Message bytes** are the size of the whole (unsharded) buffer, as NCCL's tests print a collective's size: the
input of an all-reduce, a reduce-scatter, an all-to-all, a broadcast or a send; the output of an all-gather or a
receive. Bus traffic per rank follows from it (an all-reduce ring moves ``2·(p-1)/p`` of it per rank).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from .traffic import nbytes

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


def message_bytes(inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> int:
    """The collective's message size in bytes: the larger of what it takes (tensor arguments that it does not
    also return: an in-place op's buffer is its output) and what it returns (see the module docstring)."""
    returned = {id(t) for t in outputs}
    taken = sum(nbytes(t) for t in {id(t): t for t in inputs if id(t) not in returned}.values())
    return max(taken, sum(nbytes(t) for t in {id(t): t for t in outputs}.values()))


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
    from .capture import captured

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
