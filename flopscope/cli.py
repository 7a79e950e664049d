"""The ``flopscope`` command line (also ``python -m flopscope``). The only module that prints."""

from __future__ import annotations

import argparse
import sys

import torch

from . import report
from .api import profile
from .models import TransformerBlock

EXAMPLES = """examples:
  flopscope demo                     profile the seed study's Transformer block (n = d = 512, h = 8)
  flopscope demo --n 1024 --depth 1  a longer sequence, top-level modules only
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flopscope", description="Exact multiply counts of PyTorch models.",
                                     epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="profile the Transformer block the package ships",
                               description="Profile flopscope.models.TransformerBlock on one sequence.")
    demo.add_argument("--n", type=int, default=512, help="sequence length (default 512)")
    demo.add_argument("--d", type=int, default=512, help="model width (default 512)")
    demo.add_argument("--h", type=int, default=8, help="heads (default 8)")
    demo.add_argument("--d-ff", type=int, default=2048, help="FFN width (default 2048)")
    demo.add_argument("--mode", choices=["auto", "fake", "real"], default="fake")
    demo.add_argument("--depth", type=int, default=2, help="module tree depth shown (default 2)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        return _demo(args)
    return 2  # pragma: no cover  (argparse enforces the choices)


def _demo(args: argparse.Namespace) -> int:
    n, d, h, d_ff = args.n, args.d, args.h, args.d_ff
    block = TransformerBlock(d, h, d_ff).eval()
    with torch.no_grad():
        prof = profile(block, torch.randn(1, n, d), mode=args.mode)
    params = sum(p.numel() for p in block.parameters())
    closed = n * (4 * d * d + 2 * d * d_ff) + 2 * n * n * d
    print(f"Transformer block n={n} d={d} h={h} d_ff={d_ff}: {params:,} parameters "
          f"(12·d² + 13·d = {12 * d * d + 13 * d:,} when d_ff = 4d)")
    print(report.summary(prof, depth=args.depth))
    print(f"\nclosed form n·(4d² + 2·d·d_ff) + 2n²d = {closed:,} MACs: "
          f"{'matches' if closed == prof.total() else 'DIFFERS FROM'} the measured total")
    return 0 if closed == prof.total() else 1


if __name__ == "__main__":
    sys.exit(main())
