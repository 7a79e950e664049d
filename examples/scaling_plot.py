"""Exact scaling in sequence length, and the plot: where O(n·d²) gives way to O(n²·d).

    python examples/scaling_plot.py [--out scaling.png]
"""

from __future__ import annotations

import argparse

import torch

import flopscope
from flopscope.render.plots import scaling_plot
from flopscope.studies.models import TransformerBlock


def main(argv: list[str] | None = None) -> flopscope.Scaling:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="scaling.png")
    parser.add_argument("--d", type=int, default=512)
    args = parser.parse_args(argv)
    block = TransformerBlock(args.d, 8, 4 * args.d)
    result = flopscope.scaling(block, lambda n: torch.zeros(1, n, args.d),
                               lengths=(256, 512, 1024, 2048, 4096, 8192))
    print(result.to_table())
    title = f"Transformer block, d = {args.d}"
    print("wrote", scaling_plot(result, args.out, title=title))
    return result


if __name__ == "__main__":
    main()
