"""Expert parallelism's work that depends on data: which routes reach this rank's experts.

Under expert parallelism (transformers' ``ep_plan``: each rank holds some of a layer's
experts and runs them on the routes that picked them; the others are masked to an id
past its own) a rank's grouped matmuls compute the rows of its own experts' routes only:
the masked ones sort after ``offs[-1]`` and the kernel skips them
(:func:`flopscope.formulas.linear_algebra.grouped_mm` counts up to ``offs[-1]`` where
the offsets' values are known). Which routes those are is data: on fake tensors every
route is counted, as if all had picked this rank's experts, an upper bound.
:func:`unrouted_counts` finds those counts so that the capture's notes say so.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from torch import nn

from .records import CapturedOp

__all__ = ["expert_parallel_paths", "unrouted_counts"]

SPLIT_FLAG = "_is_expert_parallel"
"""The attribute transformers sets on an experts module whose experts it split over the
ranks of an expert-parallel group (``MoEParamShard``)."""

_GROUPED = ("aten._grouped_mm", "aten._scaled_grouped_mm")


def expert_parallel_paths(roots: Iterable[nn.Module]) -> frozenset[str]:
    """The paths of the modules under ``roots`` whose experts are split over ranks."""
    return frozenset(name for root in roots for name, module in root.named_modules()
                     if vars(module).get(SPLIT_FLAG) is True)


def unrouted_counts(ops: Sequence[CapturedOp], paths: frozenset[str]) -> Counter[str]:
    """Per op name, the grouped matmuls run by a module of ``paths`` (or inside one)
    whose offsets' values were not known: counted with every route."""
    found: Counter[str] = Counter()
    if not paths:
        return found
    for op in ops:
        if op.macs and op.op_name in _GROUPED and _offsets_unknown(op) and \
                any(frame.path in paths for frame in op.module_stack):
            found[op.op_name] += 1
    return found


def _offsets_unknown(op: CapturedOp) -> bool:
    schema = getattr(op.target, "_schema", None)
    names = [argument.name for argument in schema.arguments] if schema is not None else []
    at = names.index("offs") if "offs" in names else None
    offs = op.kwargs.get("offs") if at is None or at >= len(op.args) else op.args[at]
    return isinstance(offs, CapturedOp) and offs.value is None
