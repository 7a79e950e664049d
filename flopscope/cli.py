"""The ``flopscope`` command line (also ``python -m flopscope``). The only module that prints.

Exit codes: 0 done; 1 a measured count differs from its closed form (demo, compare) or a cross-checked
peer fails or differs by MACs that no per-op / per-module evidence explains; 2 bad usage (argparse's
message names the option: a negative ``--depth``, a ``--sweep`` / ``--lengths`` item that is not a
positive integer, a ``--json`` / ``--csv`` / ``--plot`` path whose directory is missing or not writable,
or that names a directory, an image format matplotlib cannot write; all checked before anything is
built or profiled); 3 a flopscope error (bad target, inputs that do not fit, such as a token sequence
longer than the model's learned position table, refused before the inputs are built; a missing optional
dependency; a forward that raised).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import torch

from . import report
from .api import profile
from .errors import FlopscopeError
from .models import TransformerBlock
from .peaks import register_cli as register_peak_cli
from .scaling import MIN_LENGTHS, scaling
from .targets import load_target, make_inputs, parse_shape
from .why_self_attention import compare, compare_lengths

EXAMPLES = """examples:
  flopscope demo                                  the seed study's Transformer block, n = d = 512, h = 8
  flopscope profile hf:gpt2 --set n_layer=2 --input 1x128
  flopscope profile hf:llama/causal-lm --set num_hidden_layers=2 --sweep 128,256,512,1024 --plot scaling.png
  flopscope profile flopscope.models:TransformerBlock --input 1x512x512 --backward --format github
  flopscope profile torchvision.models:resnet18 --input 1x3x224x224 --json resnet.json
  flopscope compare --n 512 --d 512 --h 8 --k 5 --r 64 --lengths 256,512,1024
  flopscope crosscheck hf:gpt2 --set n_layer=2 --input 1x128

units: MACs (multiply-accumulates) everywhere; FLOPs = 2 x MACs, always labelled (--units flops).
"""

FORMATS = ["simple", "github", "pipe", "grid", "html", "plain"]


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except FlopscopeError as e:
        print(f"flopscope: error: {e}", file=sys.stderr)
        return 3
    except Exception as e:  # a target's own code failing: say what and where, without a traceback
        print(f"flopscope: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 3


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flopscope", description="Exact multiply counts of PyTorch models: "
                                     "per module, per semantic role, against closed forms.", epilog=EXAMPLES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    register_peak_cli(commands)  # flopscope peak: this CPU's measured GEMM throughput

    demo = commands.add_parser("demo", help="profile the Transformer block the package ships",
                               description="Roles, reconciliation and the layer-type comparison for "
                                           "flopscope.models.TransformerBlock on one sequence.")
    demo.add_argument("--n", type=int, default=512, help="sequence length (default 512)")
    demo.add_argument("--d", type=int, default=512, help="model width (default 512)")
    demo.add_argument("--h", type=int, default=8, help="heads (default 8)")
    demo.add_argument("--d-ff", type=int, default=2048, help="FFN width (default 2048)")
    _output_options(demo)
    demo.set_defaults(run=_demo)

    prof = commands.add_parser("profile", help="profile a model: hf:FAMILY or package.module:factory",
                               description="Profile one forward of TARGET.", epilog=EXAMPLES,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    _target_options(prof)
    prof.add_argument("--mode", choices=["auto", "fake", "real"], default="auto",
                      help="fake: count without computing; real: execute (times per role); auto (default)")
    prof.add_argument("--sweep", type=_sweep_lengths, metavar="N,N,...",
                      help=f"comma-separated lengths (at least {MIN_LENGTHS}): exact polynomial per role in n")
    prof.add_argument("--backward", action="store_true", help="count the backward pass too")
    prof.add_argument("--json", type=_output_path, help="write the JSON report (schema flopscope.profile/1) here")
    prof.add_argument("--csv", type=_output_path, help="write one CSV row per counted op here")
    prof.add_argument("--plot", type=_plot_path, help="write a PNG (or another format matplotlib writes, by the "
                                                      "suffix): the scaling plot with --sweep, else role shares")
    _output_options(prof)
    prof.set_defaults(run=_profile)

    comp = commands.add_parser("compare", help="Vaswani et al. Table 1, measured",
                               description="Self-attention against convolution, recurrence, FFN and a fully "
                                           "connected layer, built for real and profiled.")
    comp.add_argument("--n", type=int, default=512)
    comp.add_argument("--d", type=int, default=512)
    comp.add_argument("--h", type=int, default=8)
    comp.add_argument("--k", type=int, default=5, help="convolution width")
    comp.add_argument("--r", type=int, default=64, help="neighbourhood of restricted attention")
    comp.add_argument("--lengths", type=_lengths, metavar="N,N,...",
                      help="comma-separated lengths: self-attention against recurrence")
    comp.add_argument("--format", choices=FORMATS, default="simple")
    comp.set_defaults(run=_compare)

    cross = commands.add_parser("crosscheck", help="flopscope beside fvcore, thop and FlopCounterMode",
                                description="Run every installed counter and explain each difference per role.")
    _target_options(cross)
    cross.add_argument("--format", choices=FORMATS, default="simple")
    cross.set_defaults(run=_crosscheck)
    return parser


def _target_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", help="hf:FAMILY[/causal-lm|seq2seq-lm|masked-lm|classification] (built from "
                                       "its config, no download) or package.module:factory")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="config / factory argument, repeatable (e.g. --set n_layer=2)")
    parser.add_argument("--input", action="append", default=[], metavar="SHAPE",
                        help="input shape, repeatable for several inputs (default 1x128 token ids for hf:)")
    parser.add_argument("--dtype", help="input dtype: long for token ids, float32 (default for factories), ...")


def _output_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=FORMATS, default="simple", help="table format (tabulate)")
    parser.add_argument("--units", choices=["macs", "flops"], default="macs")
    parser.add_argument("--depth", type=_depth, default=2,
                        help="module tree depth shown (default 2; 0: the model only)")


# argument types: a bad value is bad usage (exit 2), and argparse's message names the option
def _integer(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def _depth(text: str) -> int:
    depth = _integer(text)
    if depth < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (0: the model only); got {depth}")
    return depth


def _lengths(text: str) -> list[int]:
    """``"128,256"`` -> ``[128, 256]``: positive integers, each bad item named."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"give comma-separated lengths such as 128,256,512; got {text!r}")
    lengths = []
    for item in items:
        try:
            lengths.append(int(item))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item!r} is not a length (a positive integer) in {text!r}") from None
        if lengths[-1] < 1:
            raise argparse.ArgumentTypeError(f"length {item} is not positive in {text!r}")
    return lengths


def _sweep_lengths(text: str) -> list[int]:
    lengths = _lengths(text)
    if len(set(lengths)) < MIN_LENGTHS:
        raise argparse.ArgumentTypeError(f"give at least {MIN_LENGTHS} distinct lengths (a quadratic takes 3 and "
                                         f"is checked at one more); got {text!r}")
    return lengths


def _output_path(text: str) -> Path:
    """A file flopscope can write: not a directory, in a directory that exists and is writable."""
    path = Path(text).expanduser()
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; give a file name in it")
    directory = path.parent
    if not directory.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {text}: directory {directory} does not exist")
    if not os.access(directory, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"cannot write {text}: permission denied")
    return path


def _plot_path(text: str) -> Path:
    """An output path whose suffix names an image format matplotlib writes (when matplotlib is there;
    without it the command stops before profiling, exit 3)."""
    path = _output_path(text)
    if importlib.util.find_spec("matplotlib") is not None:
        from matplotlib.backend_bases import FigureCanvasBase

        formats = FigureCanvasBase.get_supported_filetypes()
        if path.suffix[1:].lower() not in formats:
            raise argparse.ArgumentTypeError(f"{text}: give a file name ending in .png (or "
                                             f"{', '.join('.' + f for f in sorted(formats) if f != 'png')})")
    return path


# --------------------------------------------------------------------------------------------------
def _demo(args: argparse.Namespace) -> int:
    n, d, h, d_ff = args.n, args.d, args.h, args.d_ff
    block = TransformerBlock(d, h, d_ff).eval()
    with torch.no_grad():
        prof = profile(block, torch.zeros(1, n, d), mode="fake")
    params = sum(p.numel() for p in block.parameters())
    closed = n * (4 * d * d + 2 * d * d_ff) + 2 * n * n * d
    print(f"Transformer block n={n} d={d} h={h} d_ff={d_ff}: {params:,} parameters "
          f"(12·d² + 13·d = {12 * d * d + 13 * d:,} when d_ff = 4d)")
    print(report.summary(prof, depth=args.depth, units=args.units, tablefmt=args.format))
    print(f"\nclosed form n·(4d² + 2·d·d_ff) + 2n²d = {closed:,} MACs: "
          f"{'matches' if closed == prof.total() else 'DIFFERS FROM'} the measured total")
    table = compare(n=n, d=d, h=h, d_ff=d_ff)
    print(f"\nlayer types (Vaswani et al. 2017, Table 1), measured at n={n} d={d} h={h}:")
    print(table.to_table(args.format))
    return 0 if closed == prof.total() and table.all_match else 1


def _profile(args: argparse.Namespace) -> int:
    if args.plot and importlib.util.find_spec("matplotlib") is None:  # say so now, not after profiling
        raise FlopscopeError("--plot needs matplotlib: pip install 'flopscope[plot]'")
    target = load_target(args.target, args.set)
    build = make_inputs(target, [parse_shape(s) for s in args.input], args.dtype)  # refuses too long sequences
    if target.token_inputs:
        for n in args.sweep or ():
            target.check_sequence(n, "--sweep length: a sequence")
    inputs, kwargs = build(None)
    print(f"{target.description}: {sum(p.numel() for p in target.model.parameters()):,} parameters", flush=True)
    with torch.no_grad() if not args.backward else torch.enable_grad():
        prof = profile(target.model, *inputs, mode=args.mode, backward=args.backward, **kwargs)
    print(report.summary(prof, depth=args.depth, units=args.units, tablefmt=args.format))
    if target.token_inputs and getattr(target.model, "config", None) is not None:
        with contextlib.suppress(FlopscopeError):  # not a language model: no model-level formulas
            print("\n" + prof.model_formulas().to_table(args.format))
    result = None
    if args.sweep:
        result = scaling(target.model, build, lengths=args.sweep, mode="fake" if args.mode != "real"
                         else "real", progress=_progress("sweep"))
        print("\nscaling in n (exact polynomials, checked at one more length than their degree needs):")
        print(result.to_table(args.format))
    if args.json:
        args.json.write_text(report.to_json(prof))
        print(f"wrote {args.json}")
    if args.csv:
        args.csv.write_text(report.to_csv(prof))
        print(f"wrote {args.csv}")
    if args.plot:
        from .plots import role_share_plot, scaling_plot

        written = scaling_plot(result, args.plot) if result is not None else role_share_plot(prof, args.plot)
        print(f"wrote {written}")
    return 0


def _compare(args: argparse.Namespace) -> int:
    table = compare(n=args.n, d=args.d, h=args.h, k=args.k, r=args.r)
    print(table.to_table(args.format))
    if args.lengths:
        print("\n" + compare_lengths(args.lengths, d=args.d, h=args.h).to_table(args.format))
    return 0 if table.all_match else 1


def _crosscheck(args: argparse.Namespace) -> int:
    from .peers import crosscheck

    target = load_target(args.target, args.set)
    inputs, kwargs = make_inputs(target, [parse_shape(s) for s in args.input], args.dtype)(None)
    with torch.no_grad():
        result = crosscheck(target.model, *inputs, **kwargs)
    print(result.to_table(args.format))
    return 0 if result.all_explained else 1  # 1: a peer failed, or disagrees by MACs no evidence explains


def _progress(label: str) -> Any:
    def show(done: int, total: int) -> None:
        bar = "#" * (20 * done // total)
        end = "\n" if done == total else ""
        print(f"\r{label} [{bar:<20}] {done}/{total}", end=end, file=sys.stderr, flush=True)
    return show


if __name__ == "__main__":
    sys.exit(main())
