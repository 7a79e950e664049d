"""Fake kernels: where fake tensors' kernels differ from the real ones.

A fake kernel checks shapes only. :func:`check_as_the_real_kernel` checks what a real
kernel would refuse besides (operands of different dtypes, an index outside its table)
and raises :class:`RefusedInput`. Some fake kernels refuse what the real kernel runs:
:data:`FAKE_SHAPE_RULES` make those ops' outputs instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

from ...formulas import registry as formulas
from ...formulas.elementwise import EMBEDDING_LOOKUPS
from ...formulas.registry import OpFamily, OpSpec
from ..records import op_name
from ._classify import packet
from ._failures import RefusedInput
from ._known_values import KnownValues

MIXED_DTYPE_OPS = frozenset({torch.ops.aten._scaled_mm, *formulas.aten_ops("_scaled_grouped_mm")})
"""Products whose kernels take operands of different dtypes (fp8 formats with
scales)."""


def check_as_the_real_kernel(func: Any, args: tuple[Any, ...], spec: OpSpec | None,
                             known: KnownValues) -> None:
    """Operands of one dtype for products, convolutions and attention; indices inside
    embedding tables (where ``known`` has their values)."""
    if spec is not None and packet(func) not in MIXED_DTYPE_OPS:
        positions = spec.operands or (range(3) if spec.family is OpFamily.CONV else ())
        operands = [args[i] for i in positions if i < len(args) and isinstance(args[i], torch.Tensor)]
        dtypes = {t.dtype for t in operands}
        if len(dtypes) > 1:
            raise RefusedInput(f"{op_name(func)} got operands of dtypes "
                               f"{', '.join(str(t.dtype) for t in operands)}; a real kernel "
                               "refuses operands of different dtypes")
    if packet(func) in EMBEDDING_LOOKUPS and len(args) > 1 and isinstance(args[1], torch.Tensor):
        rows = int(args[0].shape[0])
        values = known.value_of(args[1])
        if values is None:
            known.tallies.unchecked_lookups += 1
        elif values.numel():
            known.tallies.value_reads += 1
            # real values: no fake mode below may take them
            with _disable_current_modes():
                low, high = int(values.min()), int(values.max())
            if high < rows and low >= 0:
                return
            bad = high if high >= rows else low
            raise RefusedInput(f"index {bad} is out of range for an embedding table of {rows} "
                               "rows; a real forward refuses it (token ids >= vocab_size, or more "
                               "positions than the table)")


def _grouped_mm_output(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None = None,
                       bias: Any = None,
                       out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The output of ``_grouped_mm`` (PyTorch's fake kernel accepts only bfloat16; the
    CPU kernel runs float32): ``[M, K] x [G, K, N] -> [M, N]``, ``[G, M, K] x [G, K, N]
    -> [G, M, N]``, ``[M, K] x [K, N]`` with offsets over K ``-> [G, M, N]``, ``[G, M,
    K] x [K, N] -> [M, N]``."""
    if a.dim() == 2 and b.dim() == 3:
        shape: tuple[int, ...] = (a.shape[0], b.shape[-1])
    elif a.dim() == 3 and b.dim() == 3:
        shape = (a.shape[0], a.shape[1], b.shape[-1])
    elif a.dim() == 2 and b.dim() == 2:
        shape = (offs.shape[0] if offs is not None else 1, a.shape[0], b.shape[-1])
    else:
        shape = (a.shape[1], b.shape[-1])
    return torch.empty(shape, dtype=out_dtype or a.dtype, device=a.device)


FAKE_SHAPE_RULES: dict[Any, Callable[..., Any]] = dict.fromkeys(formulas.aten_ops("_grouped_mm"),
                                                                _grouped_mm_output)
"""Output makers for ops whose fake kernel rejects what the real kernel runs (used only
if it raises)."""
