"""Steps several commands run: a target on meta, real weights once they fit, reports.

Targets (``hf:``, config files, ``timm:``, factories) are built on ``device="meta"``.
Nothing is allocated, so a count on fake tensors runs on them as they are, whatever the
model's size. That is the default of ``profile`` and ``generate``.

Some runs need real weights: ``--mode real``, ``auto``'s fall-back to a real run, and
``crosscheck``, whose peers execute. Such a run first checks that the parameters and
buffers fit in the memory available, with the largest activation of a fake run
(:mod:`flopscope.hardware.memory`). Only then is the model built again with real
weights. A factory that cannot be built on meta is built for real, as given.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable
from typing import Any

import torch

from ..api import profile
from ..errors import FlopscopeError, RunError
from ..hardware.memory import check_fits, state_bytes
from ..predict.polynomial import Scaling
from ..render import text as report
from .targets import Target, load_target

MODE_FAKE = "use --mode fake (counted on fake tensors: nothing allocated)"
"""The way out of a real run that does not fit, where the command has ``--mode``."""


def on_meta(spec: str, settings: list[str]) -> Target:
    """The target built on ``device="meta"``: nothing allocated, any size in seconds.

    A factory that cannot build there (its constructor reads a tensor's values) is built
    for real, as it was given.
    """
    try:
        return load_target(spec, settings, "meta")
    except FlopscopeError:
        raise
    except Exception:  # the factory's own code failing on meta tensors: build it where it runs
        return load_target(spec, settings)


def materialised(target: Target, spec: str, settings: list[str], what: str,
                 activation: int | Callable[[], int], *,
                 copies: int = 1, dtype: torch.dtype | None = None,
                 instead: str = MODE_FAKE) -> Target:
    """``target`` with real weights, once they are known to fit.

    The same target when it has them. Else it is built again on the CPU, once
    :func:`flopscope.hardware.memory.check_fits` found that ``copies`` of its parameters
    (in ``dtype``) and ``activation`` bytes fit. ``activation`` may be a function: it is
    called only when the parameters alone fit. A
    :class:`~flopscope.errors.DoesNotFitError` naming both sizes otherwise, nothing
    allocated. ``what``: the run that needs real weights. ``instead``: what else to do,
    besides a smaller configuration.
    """
    if not any(t.is_meta for t in itertools.chain(target.model.parameters(),
                                                  target.model.buffers())):
        return target
    way_out = f"{instead + ', or ' if instead else ''}count a smaller configuration ({_fewer_layers(target)})"
    # built as declared, then converted: the larger of the two
    parameters = state_bytes(target.model) if dtype is None else \
        max(state_bytes(target.model), state_bytes(target.model, dtype))
    if callable(activation):
        # the parameters alone first: the estimate's fake run is skipped when they do
        # not fit
        check_fits(what, parameters, None, "cpu", copies=copies, way_out=way_out)
        activation = activation()
    check_fits(what, parameters, activation, "cpu", copies=copies, way_out=way_out)
    return load_target(spec, settings, "cpu")


def _fewer_layers(target: Target) -> str:
    """The ``--set`` that shrinks ``target`` (its layer count), or the general hint."""
    config = getattr(target.model, "config", None)
    for key in ("num_hidden_layers", "n_layer", "num_layers", "n_layers"):
        if isinstance(getattr(config, key, None), int):
            return f"--set {key}=2"
    return "fewer layers or a smaller width with --set"


def largest_activation(target: Target, inputs: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """Bytes of the largest tensor a forward of ``target`` on ``inputs`` makes.

    From a count on fake tensors. Where the count fails, the part of it that ran: a real
    run needs at least that.
    """
    try:
        with torch.no_grad():
            return profile(target.model, *inputs, mode="fake", **kwargs).largest_tensor_bytes
    except RunError as failed:
        return failed.largest_tensor_bytes


def write_reports(args: argparse.Namespace, prof: Any, scaled: Scaling | None = None) -> None:
    """The reports of ``profile`` that its options ask for.

    ``--json`` (its ``attention`` section under ``--attention``), ``--csv``, ``--html``
    (with ``scaled``'s polynomials), ``--folded`` and ``--speedscope``.
    """
    if args.json:
        args.json.write_text(report.to_json(prof, attention=args.attention))
        print(f"wrote {args.json}")
    if args.csv:
        args.csv.write_text(report.to_csv(prof))
        print(f"wrote {args.csv}")
    if args.html:
        print(f"wrote {prof.to_html(args.html, scaling=scaled, title=f'flopscope: {args.target}')}")
    if args.folded:
        print("wrote " + ", ".join(str(path) for path in prof.export_folded(args.folded)))
    if args.speedscope:
        print(f"wrote {prof.export_speedscope(args.speedscope)}")
