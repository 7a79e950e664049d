"""PyTorch's ``torch.utils.flop_counter.FlopCounterMode``: its runner for
:func:`~.common.crosscheck`, and :func:`flop_counter_mapping`, the plug-in that gives it
flopscope's formulas.

``FlopCounterMode`` counts **FLOPs** = 2 x MACs: the runner halves its counts, the
plug-in returns 2 x flopscope's MACs. It keys its counts by ATen op packet, as flopscope
does, so the comparison is per op.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..formulas.registry import REGISTRY, FormulaRegistry, MacFormula, Shape, packet_named, total_of
from ..profile import Profile
from .common import Difference, PeerCount, copy_for, ordered, quiet, sum_roles

TOOL = "FlopCounterMode"


def _run_flop_counter(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                      prof: Profile,
                      plugins: bool) -> PeerCount:
    """``FlopCounterMode`` on a copy of ``model``; per op, its count (halved) against
    flopscope's."""
    from torch.utils.flop_counter import FlopCounterMode, flop_registry

    twin = copy_for(model, {})  # its forward may update buffers (running stats, caches)
    mapping = flop_counter_mapping() if plugins else {}
    counter = FlopCounterMode(display=False, custom_mapping=mapping or None)
    with quiet(), counter:
        twin(*args, **kwargs)
    flops = {str(op): int(v) for op, v in counter.get_flop_counts().get("Global", {}).items()}
    by_op = {op: v // 2 for op, v in flops.items()}
    known = {str(p) for p in flop_registry} | {str(p) for p in mapping}
    ours = prof.by_op()
    differences = []
    for op in [*ours, *(op for op in by_op if op not in ours)]:
        theirs, mine = by_op.get(op, 0), ours.get(op, 0)
        if theirs == mine:
            continue
        records = [r for r in prof.records if r.op == op]
        if theirs == 0:
            reason = f"no formula for {op}" if op not in known else f"counts 0 for {op}"
            differences.append(Difference(TOOL, "missing", -mine, reason, sum_roles(records)))
        elif mine == 0:
            differences.append(Difference(TOOL, "extra", theirs,
                                          f"{op}, which flopscope does not count"))
        else:
            kind = "under" if theirs < mine else "over"
            differences.append(Difference(TOOL, kind, theirs - mine,
                                          f"its formula for {op} gives {theirs:,}, flopscope's "
                                          f"{mine:,}",
                                          sum_roles(records)))
    return PeerCount(TOOL, sum(by_op.values()), prof.total(), by_op=by_op,
                     differences=ordered(differences))


# --------------------------------------------------------------------------------------------------
# plug-in
# --------------------------------------------------------------------------------------------------
def _plain(x: Any) -> Any:
    """``torch.Size`` -> tuple of ints, recursively through lists and tuples of shapes."""
    if isinstance(x, torch.Size):
        return tuple(int(s) for s in x)
    if isinstance(x, list):
        return [_plain(v) for v in x]
    if isinstance(x, tuple):
        return tuple(_plain(v) for v in x)
    return x


def _first_shape(out: Any) -> Shape | None:
    if isinstance(out, torch.Size):
        return tuple(int(s) for s in out)
    if isinstance(out, (list, tuple)):
        for item in out:
            shape = _first_shape(item)
            if shape is not None:
                return shape
    return None


def _flop_counter_formula(fn: MacFormula) -> Callable[..., int]:
    """A flopscope formula (MACs) in ``FlopCounterMode``'s convention: shapes in, FLOPs
    (2 x MACs) out."""

    @functools.wraps(fn)
    def flops(*args: Any, out_shape: Any = None, **kwargs: Any) -> int:
        return 2 * total_of(fn(*_plain(args), out_shape=_first_shape(out_shape), **_plain(kwargs)))

    return flops


def flop_counter_mapping(registry: FormulaRegistry | None = None) -> dict[Any, Callable[..., int]]:
    """``custom_mapping`` for ``torch.utils.flop_counter.FlopCounterMode``: every op of
    flopscope's registry that PyTorch's ``flop_registry`` lacks (CPU SDPA
    ``_scaled_dot_product_flash_attention_for_cpu``, the fused
    ``_native_multi_head_attention`` / ``_transformer_encoder_layer_fwd`` fast paths,
    the CPU LSTM kernel ``mkldnn_rnn_layer``, ``_grouped_mm``, ...), keyed by op
    packet.

    Each function follows FlopCounterMode's convention (tensors replaced by shapes,
    ``out_shape=``) and returns **FLOPs** = 2 x flopscope's MACs::

        with FlopCounterMode(custom_mapping=flopscope.peers.flop_counter_mapping()) as counter:
            model(x)
    """
    from torch.utils.flop_counter import flop_registry

    registry = registry if registry is not None else REGISTRY
    mapping: dict[Any, Callable[..., int]] = {}
    for name in registry.ops():
        packet = packet_named(name)
        if packet is None or packet in flop_registry:
            continue
        fn = registry.get(packet)
        if fn is not None:
            mapping[packet] = _flop_counter_formula(fn)
    return mapping
