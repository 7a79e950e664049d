"""An op's costs, once it ran: the bytes it moved, a collective's message, its
multiplies (by formula) or elementwise work (by rule), and what they add to the run's
tallies.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from ...formulas import collectives, elementwise, traffic
from ...formulas import registry as formulas
from ...formulas.registry import OpFamily
from ..records import CapturedOp, Cost, op_name
from ._classify import OpClass
from ._tallies import Tallies
from ._tensors import first_shape

_ATTENTION_FAMILIES = (OpFamily.ATTENTION, OpFamily.FUSED_LAYER)


def set_costs(op: CapturedOp, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
              inputs: list[torch.Tensor], results: list[torch.Tensor], op_class: OpClass, tallies: Tallies,
              read_value: Callable[[torch.Tensor], torch.Tensor | None]) -> None:
    """Set ``op``'s costs: ``inputs`` and ``results`` are the tensors it read and made,
    ``read_value`` what its formula may read of known values. An op counted as an upper
    bound, a formula returning attention parts without the attention family and an op
    without a formula or rule are tallied."""
    op.bytes = traffic.bytes_moved(op_class.access, inputs, results)
    if op_class.collective is not None:
        op.collective = (op_class.collective, collectives.message_bytes(func, args, kwargs, results),
                         collectives.group_size(args, kwargs))
    if op_class.spec is not None:
        macs = formulas.count(op_class.spec.formula, args, kwargs, first_shape(out), values=read_value, target=func)
        if isinstance(macs, formulas.UpperBound):
            tallies.upper_bounds[op_name(func)] += 1
        op.macs = formulas.total_of(macs)
        op.parts = dict(macs) if isinstance(macs, Mapping) else None
        if op.parts and "attn_scores" in op.parts and op_class.spec.family not in _ATTENTION_FAMILIES:
            tallies.undeclared_kernels.add(op_name(func))
    elif op_class.rule is not None:
        op.elementwise = (op_class.rule.category, elementwise.elementwise_ops(op_class.rule, args, out))
    elif op_class.cost is Cost.UNSUPPORTED:
        tallies.unsupported[op_name(func)] += 1


def note_largest(results: list[torch.Tensor], tallies: Tallies) -> None:
    """The least memory a real run would need: the bytes of the largest of ``results``
    an op made, if larger than any before (a symbolic size, in a symbolic trace, is not
    compared: no guard)."""
    for t in results:
        size = traffic.nbytes(t)
        if isinstance(size, int) and size > tallies.largest_out:
            tallies.largest_out = size
