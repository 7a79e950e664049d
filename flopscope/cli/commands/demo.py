"""``flopscope demo``: the Transformer block the package ships, profiled and checked.

Roles, the closed form of the block's multiplies and the layer-type comparison
(Vaswani et al. 2017, Table 1) on one sequence. Exit 1 when a measured count differs
from its closed form.
"""

from __future__ import annotations

import argparse

import torch

from ...api import profile
from ...render import text as report
from ...studies.models import TransformerBlock
from ...studies.why_self_attention import compare
from .._options import Commands, output_options


def register(commands: Commands) -> None:
    """Add ``demo`` and its options to ``commands``."""
    demo = commands.add_parser("demo", help="profile the Transformer block the package ships",
                               description="Roles, reconciliation and the layer-type comparison "
                                           "for flopscope.models.TransformerBlock on one sequence.")
    demo.add_argument("--n", type=int, default=512, help="sequence length (default 512)")
    demo.add_argument("--d", type=int, default=512, help="model width (default 512)")
    demo.add_argument("--h", type=int, default=8, help="heads (default 8)")
    demo.add_argument("--d-ff", type=int, default=2048, help="FFN width (default 2048)")
    output_options(demo)
    demo.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Profile the block on fake tensors, check its closed form, compare layer types."""
    n, d, h, d_ff = args.n, args.d, args.h, args.d_ff
    block = TransformerBlock(d, h, d_ff).eval()
    with torch.no_grad():
        prof = profile(block, torch.zeros(1, n, d), mode="fake")
    params = sum(p.numel() for p in block.parameters())
    # matrices: biases and norms left out
    weights = sum(p.numel() for p in block.parameters() if p.dim() >= 2)
    closed = n * (4 * d * d + 2 * d * d_ff) + 2 * n * n * d
    print(f"Transformer block n={n} d={d} h={h} d_ff={d_ff}: {weights:,} weights, {params:,} "
          f"parameters with biases and norms (12·d² = {12 * d * d:,} and 12·d² + 13·d = "
          f"{12 * d * d + 13 * d:,} when d_ff = 4d)")
    print(report.summary(prof, depth=args.depth, units=args.units, tablefmt=args.format))
    print(f"\nclosed form n·(4d² + 2·d·d_ff) + 2n²d = {closed:,} MACs: "
          f"{'matches' if closed == prof.total() else 'DIFFERS FROM'} the measured total")
    table = compare(n=n, d=d, h=h, d_ff=d_ff)
    print(f"\nlayer types (Vaswani et al. 2017, Table 1), measured at n={n} d={d} h={h}:")
    print(table.to_table(args.format))
    return 0 if closed == prof.total() and table.all_match else 1
