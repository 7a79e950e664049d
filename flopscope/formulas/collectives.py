"""Collective ops: which ops communicate, what kind of collective each is, and how many
bytes it carries (read by the recorder for every op; the rows and closed forms over a
capture are :mod:`flopscope.predict.collectives`).

Both families of torch.distributed ops reach the dispatcher, so a profile sees every
collective a rank issues from Python (DTensor redistribution, FSDP2, functional
collectives, ``dist.all_reduce``): the functional ones (``_c10d_functional.all_reduce``,
``all_gather_into_tensor``, ``reduce_scatter_tensor``, ``all_to_all_single``,
``broadcast``) and the in-place c10d ones (``c10d.allreduce_``, ``_allgather_base_``,
``_reduce_scatter_base_``, ``alltoall_base_``, ``broadcast_``, ``send``, ``recv_``),
DDP's gradient all-reduce included (its reducer goes through ``c10d.allreduce_``).
Conventions: ``docs/conventions.md`` §12.

**Message bytes** are the size of the whole (unsharded) buffer, as NCCL's tests print a
collective's size: the larger of what the collective reads and what it writes, so the
input of an all-reduce, a reduce-scatter or a broadcast, the output of an all-gather,
and for an all-to-all the larger of the tokens sent and received. Bus traffic per rank
follows from it (an all-reduce ring moves ``2·(p-1)/p`` of it per rank).
"""

from __future__ import annotations

from typing import Any

import torch

from .traffic import nbytes

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
    "allgather_coalesced_": ALL_GATHER, "reduce_scatter_": REDUCE_SCATTER,
    "_reduce_scatter_base_": REDUCE_SCATTER,
    "reduce_scatter_tensor_coalesced_": REDUCE_SCATTER, "alltoall_": ALL_TO_ALL,
    "alltoall_base_": ALL_TO_ALL,
    "send": SEND, "recv_": RECV, "recv_any_source_": RECV,
}
_NAMESPACES = ("_c10d_functional", "c10d", "_c10d_functional_autograd")
_FIRST_WRITTEN = frozenset({
    "allreduce_", "allreduce_coalesced_", "broadcast_", "recv_", "recv_any_source_", "allgather_",
    "_allgather_base_",
    "allgather_coalesced_", "allgather_into_tensor_coalesced_", "reduce_scatter_",
    "_reduce_scatter_base_",
    "reduce_scatter_tensor_coalesced_", "alltoall_", "alltoall_base_"})
"""c10d ops whose first argument is what they write (their schemas do not say so)."""


def kind_of(func: Any) -> str | None:
    """The collective ``func`` is (``"all_reduce"``, ...), or ``None`` for any other op
    (``wait_tensor`` included: it only waits)."""
    namespace = getattr(func, "namespace", None)
    if namespace not in _NAMESPACES:
        return None
    return _KINDS.get(func.overloadpacket.__name__)


def is_bookkeeping(func: Any) -> bool:
    """A torch.distributed op that communicates nothing: ``wait_tensor``, autograd
    wrappers, barriers, and FSDP2's copies into and out of its communication buffers
    (``fsdp.all_gather_copy_in``, ``chunk_cat``, ``split_with_sizes_copy``: data
    movement, no arithmetic; their bytes are counted as any op's)."""
    namespace = getattr(func, "namespace", None)
    return namespace == "fsdp" or (namespace in _NAMESPACES and kind_of(func) is None)


def message_bytes(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                  outputs: list[torch.Tensor]) -> int:
    """The collective's message size in bytes: the larger of what it reads and what it
    writes. Written are the tensors it returns, the arguments its schema marks as
    written (``Tensor(a!)``) and the first argument of the c10d ops, whose schemas do
    not mark it (their output buffer, or the tensors an all-reduce overwrites); read
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
    """Ranks in the collective's group: from its group name (functional collectives) or
    its process group object (c10d ops); ``None`` if neither can be read."""
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
