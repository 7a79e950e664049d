"""``flopscope crosscheck``: flopscope beside the other counters, differences explained.

The peers are FlopCounterMode, fvcore, thop, DeepSpeed's flops profiler, calflops and
torchprofile (:mod:`flopscope.peers`). They execute the model, so it is built with real
weights once they fit. Exit 1 when no peer counted, or one differs by MACs that no
per-op or per-module evidence explains. A peer that fails is reported with why, in its
row.
"""

from __future__ import annotations

import argparse
import sys

import torch

from ...peers import crosscheck
from .._common import largest_activation, materialised, on_meta
from .._options import FORMATS, Commands, target_options
from ..targets import make_inputs


def register(commands: Commands) -> None:
    """Add ``crosscheck`` and its options to ``commands``."""
    cross = commands.add_parser("crosscheck", help="flopscope beside FlopCounterMode, fvcore, "
                                                   "thop, DeepSpeed's flops profiler, calflops and "
                                                   "torchprofile",
                                description="Run every installed counter and explain each "
                                            "difference per role.")
    target_options(cross)
    cross.add_argument("--tools", type=lambda text: [t for t in text.split(",") if t],
                       metavar="TOOL,TOOL,...",
                       help="the peers to run (default: every installed one of "
                            "flopscope.peers.TOOLS)")
    cross.add_argument("--format", choices=FORMATS, default="simple")
    cross.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run flopscope and each peer for real, and print the comparison."""
    # the memory estimate first: the peers need real weights
    target = on_meta(args.target, args.set)
    inputs, kwargs = make_inputs(target, args.input, args.dtype)(None)
    # flopscope's real run, then each peer on its own copy of the model: two copies of
    # the weights at a time
    meta = target
    target = materialised(target, args.target, args.set,
                          f"crosscheck of {target.description} (flopscope and "
                          "the peers run it for real, each peer on its own copy)",
                          lambda: largest_activation(meta, inputs, kwargs), copies=2,
                          instead=f"count it with flopscope profile {args.target} (on fake "
                                  "tensors: nothing allocated)")
    with torch.no_grad():
        result = crosscheck(target.model, *inputs, tools=args.tools, forward_kwargs=kwargs)
    print(result.to_table(args.format))
    if not result.ran:
        print("flopscope crosscheck: no peer counted: " + ("each one failed, for the reason in its "
                                                           "row" if result.peers
              else "none of them is installed (pip install 'torch-flopscope[crosscheck]')"),
              file=sys.stderr)
    # 1: no peer counted, or one disagrees by MACs no evidence explains
    return 0 if result.ran_explained else 1
