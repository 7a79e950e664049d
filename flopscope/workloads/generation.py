"""Generation, step by step: each forward of the model in a profiler block is a step
(prefill or decode).

Wrap ``model.generate(...)`` (or any loop of forwards) in :class:`flopscope.profiler`, then ask
:meth:`Profile.steps` for one :class:`Step` per call of the root module, :meth:`Profile.decode_scaling` for the
decode steps' exact MACs per sequence as polynomials in the context length, and :func:`steps_table` for a table.
On fake tensors, where ``generate()`` cannot run (it reads values), :func:`greedy_decode` runs the forwards that
greedy ``generate()`` runs (:mod:`flopscope.decoding`), and :func:`profile_generation` counts them as
:func:`flopscope.profile` counts one forward: on the fake run's copy of the model, where a layer whose records are
provably an earlier layer's is replayed from them, in the step and across steps. What each field of a step is read
from: :mod:`flopscope.predict.steps`. Units: MACs (FLOPs = 2 x MACs).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from tabulate import tabulate
from torch import nn

from ..api import profile_with_plan
from ..attribute.roles import RoleRule
from ..capture import CapturePlan, fake_converter
from ..formulas.registry import FormulaRegistry
from ..predict.steps import DECODE, PREFILL, Step, decode_scaling, steps
from ..profile import Profile
from .decoding import check_decoding, decoding_driver, greedy_decode

__all__ = ["DECODE", "PREFILL", "Step", "decode_scaling", "greedy_decode", "profile_generation", "steps",
           "steps_table"]


def profile_generation(model: nn.Module, input_ids: torch.Tensor, new_tokens: int, *, mode: str = "fake",
                       registry: FormulaRegistry | None = None, roles: Sequence[RoleRule] = (),
                       reuse: bool = True) -> Profile:
    """Count greedy generation of ``new_tokens`` tokens after ``input_ids`` (``[batch, prompt]`` token ids, no
    padding): the forwards :func:`greedy_decode` runs (those of ``model.generate(ids, max_new_tokens=N,
    min_new_tokens=N, do_sample=False)``), one prefill and ``new_tokens - 1`` decode steps, in one
    :class:`~flopscope.profile.Profile` whose :meth:`~flopscope.profile.Profile.steps` are those forwards and whose
    ``output`` is the sequences ``[batch, prompt + new_tokens]``.

    ``mode``: ``"fake"`` (default: nothing is computed; a model built on ``device="meta"`` works), ``"real"``, or
    ``"auto"`` (fake, else real), as :func:`flopscope.profile`. Fake runs are on fake CPU tensors, never on meta
    kernels (where :func:`flopscope.profile` takes them for a model built on meta): there the values of position ids
    are unknown and scaled-dot-product attention takes its math path, whose bytes differ from a real run's, and a
    step's bytes are what its roofline is made of (:mod:`flopscope.roofline`). ``reuse``: on fake tensors, a layer
    whose records are provably an earlier layer's is replayed from them (:mod:`flopscope.capture.replay`): the
    layers of a step from its first, and a step's first layer from the step before where the KV cache gives the
    same sizes (a decoding step's cache is one position longer than the step before's: its first layer is counted,
    the others replayed from it); the counts are those of ``reuse=False`` (``prof.notes`` say what was replayed).
    ``registry``, ``roles``: as :func:`flopscope.profile`. A model :func:`greedy_decode` does not mimic
    ``generate()`` for (an encoder-decoder, a static cache) raises a
    :class:`~flopscope.errors.ConfigurationError` before any forward: wrap ``generate()`` in
    :class:`flopscope.profiler` (``mode="real"``) instead. Units: MACs (FLOPs = 2 x MACs)."""
    check_decoding(model, input_ids, new_tokens)
    plan = CapturePlan.of(mode, registry, reuse=reuse, driver=functools.partial(decoding_driver, new_tokens),
                          converter=fake_converter())
    return profile_with_plan(model, (input_ids,), {}, plan, roles, stacklevel=3)


def steps_table(rows: list[Step], tablefmt: str = "simple") -> str:
    """The steps as a table: phase, shape, MACs, FLOPs, bytes, the attention core's
    share, wall time."""
    body = [[s.step, s.phase, s.batch, s.tokens, s.context, f"{s.macs:,}", f"{s.flops:,}", f"{s.bytes:,}",
             f"{s.kv_macs:,}", f"{s.kv_bytes:,}", "-" if s.seconds is None else f"{s.seconds * 1e3:.2f}"]
            for s in rows]
    return tabulate(body, headers=["step", "phase", "batch", "tokens", "context", "MACs", "FLOPs", "bytes",
                                   "KV MACs", "KV bytes", "ms"], tablefmt=tablefmt, disable_numparse=True)
