"""What a notebook shows for a profile, without a notebook: Jupyter renders
``prof._repr_html_()`` (or ``_repr_markdown_()``) when a cell ends with ``prof``; this
script prints the Markdown, and writes the HTML fragment and the full report
(``prof.to_html``) where asked.

    python examples/notebook_view.py [--n 128] [--d 512]
        [--fragment cell.html] [--report report.html]

The model is the package's Transformer block (Vaswani et al.'s encoder block, h = 8,
d_ff = 4d): the role table holds n·d² per projection, n²·d for the scores and for the
weighted sum, n·d·d_ff for each FFN matrix, in MACs (FLOPs = 2 x MACs beside them).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import flopscope
from flopscope.studies.models import TransformerBlock


def main(argv: list[str] | None = None) -> flopscope.Profile:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=128, help="tokens (default 128)")
    parser.add_argument("--d", type=int, default=512,
                        help="model width (default 512; h = 8, d_ff = 4d)")
    parser.add_argument("--fragment", type=Path,
                        help="write the notebook's HTML (prof._repr_html_()) here")
    parser.add_argument("--report", type=Path,
                        help="write the full HTML report (prof.to_html) here")
    args = parser.parse_args(argv)
    block = TransformerBlock(args.d, 8, 4 * args.d)
    # fake tensors: nothing is computed
    prof = flopscope.profile(block, torch.zeros(1, args.n, args.d))
    print(prof._repr_markdown_())
    if args.fragment:
        args.fragment.write_text(prof._repr_html_())
        print(f"wrote {args.fragment}")
    if args.report:
        print(f"wrote {prof.to_html(args.report)}")
    return prof


if __name__ == "__main__":
    main()
