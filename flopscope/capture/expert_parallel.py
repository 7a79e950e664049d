"""Expert parallelism's work that depends on data: which routes reach this rank's experts.

Under expert parallelism (transformers' ``ep_plan``: each rank holds some of a layer's
experts and runs them on the routes that picked them; the others are masked to an id
past its own) a rank's grouped matmuls compute the rows of its own experts' routes only:
the masked ones sort after ``offs[-1]`` and the kernel skips them
(:func:`flopscope.formulas.linear_algebra.grouped_mm` counts up to ``offs[-1]`` where
the offsets' values are known). Which routes those are is data: on fake tensors every
route is counted, as if all had picked this rank's experts, an upper bound.
:func:`unrouted_records` finds those records, each with the share of the layer's experts
the rank holds, so that the capture's notes say so and a routing convention can be
applied to them (balanced routing: the rank's experts get that share of the routes).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from fractions import Fraction

import torch
from torch import nn

from ..formulas.registry import OpFamily, argument
from .records import CapturedOp

__all__ = ["SPLIT_FLAG", "unrouted_records"]

SPLIT_FLAG = "_is_expert_parallel"
"""The attribute transformers sets on an experts module whose experts it split over the
ranks of an expert-parallel group (``MoEParamShard``)."""


def unrouted_records(ops: Sequence[CapturedOp], roots: Sequence[nn.Module],
                     values: Callable[[CapturedOp], torch.Tensor | None]) -> dict[CapturedOp, Fraction | None]:
    """The grouped matmuls whose offsets' values were not known (``values``: the run's
    known values of a record), run inside an experts module of ``roots`` (the model and
    its shadow: the same paths) that transformers split over ranks: counted with every
    route. Each with the share of the layer's experts the rank holds
    (:func:`expert_share`; ``None`` where it cannot be read). Only the modules running
    grouped matmuls are looked up."""
    found: dict[CapturedOp, Fraction | None] = {}
    # path -> (whether the module there is split experts, the share it holds)
    split: dict[str, tuple[bool, Fraction | None]] = {}

    def split_at(path: str) -> tuple[bool, Fraction | None]:
        if path not in split:
            modules = [m for m in (_module_at(root, path) for root in roots) if m is not None]
            flagged = next((m for m in modules if vars(m).get(SPLIT_FLAG) is True), None)
            split[path] = (flagged is not None, None if flagged is None else expert_share(flagged))
        return split[path]

    for op in ops:
        # (the registry's grouped matmuls: _grouped_mm, _scaled_grouped_mm, transformers' fallback)
        if not op.macs or op.spec is None or op.spec.family is not OpFamily.GROUPED_MATMUL:
            continue
        offs = argument(op.target, op.args, op.kwargs, "offs")
        if not isinstance(offs, CapturedOp) or values(offs) is not None:
            continue
        # (the innermost split module the matmul ran in)
        for frame in reversed(op.module_stack):
            is_split, share = split_at(frame.path)
            if is_split:
                found[op] = share
                break
    return found


def expert_share(module: nn.Module) -> Fraction | None:
    """The share of its layer's experts an experts module split over ranks holds: its
    parameters' local size along their first dim (the experts of transformers' grouped
    weights, ``[E, ...]``), over their global size, where they are DTensors sharded on
    that dim alone; ``None`` where no parameter says it."""
    for parameter in module.parameters(recurse=False):
        placements = getattr(parameter, "placements", None)
        dims = {p.dim for p in placements or () if hasattr(p, "dim") and p.is_shard()}
        if dims == {0}:
            local = parameter.to_local().shape[0]  # type: ignore[attr-defined]
            return Fraction(local, parameter.shape[0])
    return None


def _module_at(root: nn.Module, path: str) -> nn.Module | None:
    try:
        return root.get_submodule(path)
    except AttributeError:
        return None


