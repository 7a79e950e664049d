"""Count sharded jobs on one machine: a fake world of N ranks, and a device mesh over it.

torch ships a fake process group (``torch.testing._internal.distributed.fake_pg``, backend ``"fake"``): every
collective returns at once and moves nothing, so a model can be sharded for any world size in one process and
counted as the rank it plays would run it (local shapes: what its kernels execute). A profile of a sharded model
(DTensor tensor / sequence parallel, FSDP2, functional collectives) reports that rank's MACs and its collectives
(:meth:`flopscope.Profile.collectives`), whether the world is fake or real (``torchrun`` with gloo / NCCL). In a
real world, :func:`gather` brings every rank's summary to one rank and :func:`rank_table` sets them side by side
(the job's total is their sum: exact, also when ranks differ). DDP's backward cannot run on torch's fake process
group (its reducer needs a real one); profile it in a real world.

    with flopscope.distributed.fake_world(8) as mesh:          # 8 ranks; this process is rank 0
        parallelize_module(model, mesh, plan)
        prof = flopscope.profile(model, ids)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from tabulate import tabulate

from .errors import ConfigurationError

if TYPE_CHECKING:
    from .profile import Profile

__all__ = ["fake_world", "gather", "rank_table"]


@contextmanager
def fake_world(world_size: int, *, rank: int = 0, mesh_shape: Sequence[int] | None = None,
               mesh_dim_names: Sequence[str] | None = None) -> Iterator[Any]:
    """A fake world of ``world_size`` ranks in which this process is ``rank``; yields a CPU
    ``DeviceMesh`` of ``mesh_shape`` (default: one dimension of ``world_size``), named ``mesh_dim_names``.

    The default process group is created on entry and destroyed on exit. If one exists already (the user's),
    nothing is created or destroyed: a :class:`~flopscope.errors.ConfigurationError` says so, since a fake world
    cannot share the process with a real one."""
    import torch.distributed as dist

    if not dist.is_available():
        raise ConfigurationError("this torch build has no torch.distributed")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ConfigurationError(f"world_size must be an int >= 1; got {world_size!r}")
    if not 0 <= rank < world_size:
        raise ConfigurationError(f"rank must be in [0, {world_size}); got {rank}")
    shape = tuple(mesh_shape) if mesh_shape is not None else (world_size,)
    if _product(shape) != world_size:
        raise ConfigurationError(f"mesh_shape {list(shape)} has {_product(shape)} ranks, not the world's {world_size}")
    if dist.is_initialized():
        raise ConfigurationError(f"a process group is already initialised (backend {dist.get_backend()}, world size "
                                 f"{dist.get_world_size()}); profile within it, or destroy it before a fake world")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        names = tuple(mesh_dim_names) if mesh_dim_names is not None else None
        yield init_device_mesh("cpu", shape, mesh_dim_names=names)
    finally:
        dist.destroy_process_group()


def _product(shape: Sequence[int]) -> int:
    out = 1
    for size in shape:
        out *= int(size)
    return out



def summary(prof: Profile) -> dict[str, Any]:
    """What one rank reports: its rank and world size, MACs (total and by role), bytes moved, and its
    collectives (:meth:`flopscope.CollectiveRow.row`)."""
    import torch.distributed as dist

    ready = dist.is_available() and dist.is_initialized()
    return {"rank": dist.get_rank() if ready else 0, "world": dist.get_world_size() if ready else 1,
            "macs": prof.total(), "by_role": prof.by_role(), "bytes": prof.total_bytes(),
            "collectives": [row.row() for row in prof.collectives()]}


def gather(prof: Profile, *, dst: int = 0, group: Any = None) -> list[dict[str, Any]] | None:
    """Every rank's :func:`summary` of its profile, on rank ``dst`` (in rank order); ``None`` on the others.
    Call it on every rank of ``group`` (default: the world), as any collective."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise ConfigurationError("gather needs an initialised process group (call it on every rank of the job)")
    mine = summary(prof)
    gathered: list[Any] | None = [None] * dist.get_world_size(group) if dist.get_rank() == dst else None
    dist.gather_object(mine, gathered, dst=dst, group=group)
    return None if gathered is None else sorted(gathered, key=lambda s: s["rank"])


def rank_table(summaries: Sequence[dict[str, Any]], tablefmt: str = "simple") -> str:
    """Per rank: MACs, FLOPs, collective calls and bytes; then the job's total (their sum) and the imbalance
    (the busiest rank's MACs over the mean)."""
    rows = [[s["rank"], f"{s['macs']:,}", f"{2 * s['macs']:,}", sum(c["calls"] for c in s["collectives"]),
             f"{sum(c['bytes'] for c in s['collectives']):,}"] for s in summaries]
    total = sum(s["macs"] for s in summaries)
    mean = total / len(summaries) if summaries else 0
    imbalance = max(s["macs"] for s in summaries) / mean if mean else 1.0
    table = tabulate(rows, headers=["rank", "MACs", "FLOPs", "collectives", "collective bytes"], tablefmt=tablefmt,
                     disable_numparse=True)
    return f"{table}\njob: {total:,} MACs over {len(summaries)} ranks; imbalance (max / mean) {imbalance:.3f}"
