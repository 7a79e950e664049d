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
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ..formulas.registry import OpFamily
from .records import CapturedOp

__all__ = ["unrouted_counts"]

SPLIT_FLAG = "_is_expert_parallel"
"""The attribute transformers sets on an experts module whose experts it split over the
ranks of an expert-parallel group (``MoEParamShard``)."""


def unrouted_counts(ops: Sequence[CapturedOp], roots: Sequence[nn.Module],
                    values: Callable[[CapturedOp], torch.Tensor | None]) -> Counter[str]:
    """Per op name, the grouped matmuls whose offsets' values were not known
    (``values``: the run's known values of a record), run inside an experts module of
    ``roots`` (the model and its shadow: the same paths) that transformers split over
    ranks: counted with every route. Only the modules running grouped matmuls are
    looked up."""
    found: Counter[str] = Counter()
    split: dict[str, bool] = {}

    def is_split(path: str) -> bool:
        known = split.get(path)
        if known is None:
            known = split[path] = any(vars(module).get(SPLIT_FLAG) is True
                                      for module in (_module_at(root, path) for root in roots) if module is not None)
        return known

    for op in ops:
        # (the registry's grouped matmuls: _grouped_mm, _scaled_grouped_mm, transformers' fallback)
        if not op.macs or op.spec is None or op.spec.family is not OpFamily.GROUPED_MATMUL:
            continue
        offs = _offsets(op)
        if isinstance(offs, CapturedOp) and values(offs) is None and \
                any(is_split(frame.path) for frame in op.module_stack):
            found[op.op_name] += 1
    return found


def _module_at(root: nn.Module, path: str) -> nn.Module | None:
    try:
        return root.get_submodule(path)
    except AttributeError:
        return None


def _offsets(op: CapturedOp) -> Any:
    """The ``offs`` argument of a grouped matmul's record (by its schema's name;
    ``None`` for one without)."""
    schema = getattr(op.target, "_schema", None)
    names = [argument.name for argument in schema.arguments] if schema is not None else []
    if "offs" not in names:
        return op.kwargs.get("offs")
    at = names.index("offs")
    return op.args[at] if at < len(op.args) else op.kwargs.get("offs")
