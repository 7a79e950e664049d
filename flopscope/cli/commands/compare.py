"""``flopscope compare``: Vaswani et al. 2017, Table 1, measured.

Self-attention against convolution, recurrence, FFN and a fully connected layer, built
for real and profiled. Exit 1 when a measured count differs from its closed form.
"""

from __future__ import annotations

import argparse

from ...studies.why_self_attention import compare, compare_lengths
from .._options import FORMATS, Commands, as_lengths


def register(commands: Commands) -> None:
    """Add ``compare`` and its options to ``commands``."""
    comp = commands.add_parser("compare", help="Vaswani et al. Table 1, measured",
                               description="Self-attention against convolution, recurrence, FFN "
                                           "and a fully connected layer, built for real and "
                                           "profiled.")
    comp.add_argument("--n", type=int, default=512)
    comp.add_argument("--d", type=int, default=512)
    comp.add_argument("--h", type=int, default=8)
    comp.add_argument("--k", type=int, default=5, help="convolution width")
    comp.add_argument("--r", type=int, default=64, help="neighbourhood of restricted attention")
    comp.add_argument("--lengths", type=as_lengths, metavar="N,N,...",
                      help="comma-separated lengths: self-attention against recurrence")
    comp.add_argument("--format", choices=FORMATS, default="simple")
    comp.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Print the table, and self-attention against recurrence over ``--lengths``."""
    table = compare(n=args.n, d=args.d, h=args.h, k=args.k, r=args.r)
    print(table.to_table(args.format))
    if args.lengths:
        print("\n" + compare_lengths(args.lengths, d=args.d, h=args.h).to_table(args.format))
    return 0 if table.all_match else 1
