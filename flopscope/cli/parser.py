"""The top parser, ``flopscope [--version] COMMAND``: each command adds its own."""

from __future__ import annotations

import argparse

from ..version import DISTRIBUTION, __version__
from ._options import EXAMPLES
from .commands import compare, cost, crosscheck, demo, diff, generate, peak, profile


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``flopscope``: each command's ``args.run`` runs it."""
    parser = argparse.ArgumentParser(prog="flopscope",
                                     description="Exact multiply counts of PyTorch models: "
                                     "per module, per semantic role, against closed forms.",
                                     epilog=EXAMPLES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"{DISTRIBUTION} {__version__}",
                        help="print the distribution's name and version, and exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # in the order --help lists them
    for command in (peak, demo, profile, diff, compare, crosscheck, generate, cost):
        command.register(commands)
    return parser
