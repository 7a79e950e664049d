"""Generation, step by step: each forward of the model in a profiler block is a step (prefill or decode).

Wrap ``model.generate(...)`` (or any loop of forwards) in :class:`flopscope.profiler`, then ask
:meth:`Profile.steps` for one :class:`Step` per call of the root module, :meth:`Profile.decode_scaling` for the
decode steps' exact MACs per sequence as polynomials in the context length, and :func:`steps_table` for a table.
On fake tensors, where ``generate()`` cannot run (it reads values), :func:`greedy_decode` runs the forwards that
greedy ``generate()`` runs (:mod:`flopscope.decoding`). What each field of a step is read from:
:mod:`flopscope.predict.steps`. Units: MACs (FLOPs = 2 x MACs).
"""

from __future__ import annotations

from tabulate import tabulate

from .decoding import greedy_decode
from .predict.steps import DECODE, PREFILL, Step, decode_scaling, steps

__all__ = ["DECODE", "PREFILL", "Step", "decode_scaling", "greedy_decode", "steps", "steps_table"]


def steps_table(rows: list[Step], tablefmt: str = "simple") -> str:
    """The steps as a table: phase, shape, MACs, FLOPs, bytes, the attention core's share, wall time."""
    body = [[s.step, s.phase, s.batch, s.tokens, s.context, f"{s.macs:,}", f"{s.flops:,}", f"{s.bytes:,}",
             f"{s.kv_macs:,}", f"{s.kv_bytes:,}", "-" if s.seconds is None else f"{s.seconds * 1e3:.2f}"]
            for s in rows]
    return tabulate(body, headers=["step", "phase", "batch", "tokens", "context", "MACs", "FLOPs", "bytes",
                                   "KV MACs", "KV bytes", "ms"], tablefmt=tablefmt, disable_numparse=True)
