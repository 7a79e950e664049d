"""The ``flopscope`` command line (also ``python -m flopscope``). The only module that prints.

Exit codes: 0 done; 1 a measured count differs from its closed form (demo, compare) or a cross-checked
peer fails or differs by MACs that no per-op / per-module evidence explains; 2 bad usage; 3 a flopscope
error (bad target, inputs that do not fit, a forward that raised).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any

import torch

from . import report
from .api import profile
from .errors import FlopscopeError
from .models import TransformerBlock
from .scaling import scaling
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
    prof.add_argument("--sweep", help="comma-separated lengths: exact polynomial per role in n")
    prof.add_argument("--backward", action="store_true", help="count the backward pass too")
    prof.add_argument("--json", type=Path, help="write the JSON report (schema flopscope.profile/1) here")
    prof.add_argument("--csv", type=Path, help="write one CSV row per counted op here")
    prof.add_argument("--plot", type=Path, help="write a PNG: the scaling plot with --sweep, else role shares")
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
    comp.add_argument("--lengths", help="comma-separated lengths: self-attention against recurrence")
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
    parser.add_argument("--depth", type=int, default=2, help="module tree depth shown (default 2)")


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
    target = load_target(args.target, args.set)
    build = make_inputs(target, [parse_shape(s) for s in args.input], args.dtype)
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
        lengths = [int(x) for x in args.sweep.split(",") if x.strip()]
        result = scaling(target.model, build, lengths=lengths, mode="fake" if args.mode != "real"
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
        lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
        print("\n" + compare_lengths(lengths, d=args.d, h=args.h).to_table(args.format))
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
