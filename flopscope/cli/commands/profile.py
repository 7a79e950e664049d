"""``flopscope profile TARGET``: one forward of a model, counted.

The target is built on meta: nothing is allocated until a real run needs it
(:mod:`flopscope.cli._common`). ``--mode`` picks fake tensors, a real run, or
``auto``: fake, falling back to a real run where fake tensors cannot count the model. It
prints the role table, the model-level formulas of a language model, a ``--sweep``'s
polynomials in the sequence length, and writes the reports asked for.

Two kinds of run go elsewhere: a ``diffusers:`` target to :mod:`.pipeline` (one
generation, by component and by step), and ``--tp`` / ``--dp`` to :mod:`.sharded`
(rank 0 of a fake world). Each declares its own options.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any

import torch

from ...api import profile
from ...errors import FlopscopeError, RunError
from ...profile import Profile
from ...render import text as report
from ...render.plots import role_share_plot, scaling_plot
from ...workloads.scaling import MIN_LENGTHS, scaling
from .._common import largest_activation, materialised, on_meta, write_reports
from .._options import (
    EXAMPLES,
    Commands,
    as_output_path,
    as_plot_path,
    as_sweep_lengths,
    attention_option,
    check_plot,
    output_options,
    target_options,
)
from ..targets import Target, make_inputs
from . import pipeline, sharded


def register(commands: Commands) -> None:
    """Add ``profile`` and its options to ``commands``, the pipeline's and --tp's too."""
    prof = commands.add_parser("profile", help="profile a model: hf:FAMILY, hf:ORG/NAME, a "
                                               "config.json, timm:NAME or package.module:factory",
                               description="Profile one forward of TARGET.", epilog=EXAMPLES,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    target_options(prof)
    prof.add_argument("--mode", choices=["auto", "fake", "real"], default="auto",
                      help="fake: count without computing; real: execute (times per role); auto "
                           "(default)")
    prof.add_argument("--sweep", type=as_sweep_lengths, metavar="N,N,...",
                      help=f"comma-separated lengths (at least {MIN_LENGTHS}): exact polynomial "
                           "per role in n")
    prof.add_argument("--backward", action="store_true", help="count the backward pass too")
    attention_option(prof, "the total, the role table and the per-token formulas")
    prof.add_argument("--json", type=as_output_path,
                      help="write the JSON report (schema flopscope.profile/1) here")
    prof.add_argument("--csv", type=as_output_path, help="write one CSV row per counted op here")
    prof.add_argument("--html", type=as_output_path, help="write the HTML report here (one "
                                                          "self-contained file: the "
                                                        "module tree as an icicle chart by MACs, "
                                                        "roles, reconciliation, unsupported ops, "
                                                        "the --sweep polynomials)")
    prof.add_argument("--folded", type=as_output_path, help="write folded stacks (flamegraph.pl, "
                                                            "inferno, speedscope; "
                                                          "weights in MACs) here, one file per "
                                                          "phase with --backward")
    prof.add_argument("--speedscope", type=as_output_path,
                      help="write a speedscope profile (weights in MACs) here")
    prof.add_argument("--plot", type=as_plot_path, help="write a PNG (or another format matplotlib "
                                                        "writes, by the "
                                                      "suffix): the scaling plot with --sweep, "
                                                      "else role shares")
    sharded.add_options(prof)
    pipeline.add_options(prof)
    output_options(prof)
    prof.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Profile one forward of ``args.target``; pipelines, sharded models elsewhere."""
    if args.target.startswith("diffusers:"):
        return pipeline.run(args)
    given = [flag for flag in ("steps", "size", "frames", "guidance") if getattr(args, flag) is not None]
    if given:
        print(f"flopscope profile: error: --{', --'.join(given)}: only for diffusers: targets",
              file=sys.stderr)
        return 2
    if args.tp is not None or args.dp > 1 or args.ep:
        return sharded.run(args)
    check_plot(args.plot)
    # nothing allocated: built for real only if a real run needs it
    target = on_meta(args.target, args.set)
    # refuses too long sequences
    build = make_inputs(target, args.input, args.dtype)
    if target.token_inputs:
        for n in args.sweep or ():
            target.check_sequence(n, "--sweep length: a sequence")
    inputs, kwargs = build(None)
    where = "built on meta: nothing allocated" if any(p.is_meta for p in target.model.parameters()) else "built"
    print(f"{target.description}: {sum(p.numel() for p in target.model.parameters()):,} parameters "
          f"({where})",
          flush=True)
    target, prof = _count(args, target, inputs, kwargs,
                          build(max(args.sweep)) if args.sweep else (inputs, kwargs))
    print(report.summary(prof, depth=args.depth, units=args.units, tablefmt=args.format,
                         attention=args.attention))
    if target.token_inputs and getattr(target.model, "config", None) is not None:
        # not a language model: no model-level formulas
        with contextlib.suppress(FlopscopeError):
            print("\n" + prof.model_formulas(args.attention).to_table(args.format))
    result = None
    if args.sweep:
        result = scaling(target.model, build, lengths=args.sweep, mode="fake" if args.mode != "real"
                         else "real", progress=_progress("sweep"))
        print("\nscaling in n (exact polynomials, checked at one more length than their degree "
              "needs):")
        print(result.to_table(args.format))
    write_reports(args, prof, result)
    if args.plot:
        written = scaling_plot(result, args.plot) if result is not None else role_share_plot(prof, args.plot)
        print(f"wrote {written}")
    return 0


def _count(args: argparse.Namespace, target: Target, inputs: tuple[Any, ...],
           kwargs: dict[str, Any],
           estimate: tuple[tuple[Any, ...], dict[str, Any]]) -> tuple[Target, Profile]:
    """``profile`` of ``target`` in ``--mode``.

    ``target`` is built on meta (:func:`~flopscope.cli._common.on_meta`). On fake
    tensors the meta model is counted as it is. A real run (``--mode real``, ``auto``'s
    fall-back, a model that cannot be counted on meta kernels) first has its memory
    estimated on fake tensors, with the ``estimate`` inputs (the longest of a sweep). It
    is refused ahead when it would not fit. Else the model is built for real
    (:func:`~flopscope.cli._common.materialised`).
    """
    # the gradients, as large as the parameters
    copies = 2 if args.backward else 1
    grad = torch.enable_grad() if args.backward else torch.no_grad()
    if args.mode == "real":
        target = materialised(target, args.target, args.set,
                              f"a real run (--mode real) of {target.description}",
                              lambda: largest_activation(target, *estimate), copies=copies)
        with grad:
            return target, profile(target.model, *inputs, mode="real", backward=args.backward,
                                   **kwargs)
    try:
        with grad:
            return target, profile(target.model, *inputs, mode="fake", backward=args.backward,
                                   **kwargs)
    except RunError as failed:
        if not failed.on_fake_tensors or not any(p.is_meta for p in target.model.parameters()):
            raise
        if args.mode == "fake":
            # fake tensors of the real model's state may go where meta kernels cannot
            what = f"{target.description} built for real (its fake run on meta tensors failed: {failed.reason})"
            activation = 0
        else:
            what = (f"auto's fall-back to a real run of {target.description} (it cannot be counted "
                    f"on fake tensors: {failed.where}: {failed.reason})")
            activation = failed.largest_tensor_bytes
        # no --mode fake way out: it failed already
        target = materialised(target, args.target, args.set, what, activation, copies=copies,
                              instead="")
    with grad:
        return target, profile(target.model, *inputs, mode=args.mode, backward=args.backward,
                               **kwargs)


def _progress(label: str) -> Any:
    """A progress bar on stderr, called with (done, total)."""
    def show(done: int, total: int) -> None:
        bar = "#" * (20 * done // total)
        end = "\n" if done == total else ""
        print(f"\r{label} [{bar:<20}] {done}/{total}", end=end, file=sys.stderr, flush=True)
    return show
