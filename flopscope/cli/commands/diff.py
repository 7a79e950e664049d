"""``flopscope diff BEFORE AFTER``: what changed between two models, explained.

Each side is a JSON report of ``flopscope profile --json``, or a target as for
``profile``, built on meta and counted on fake tensors. It prints the total, every role
with the closed-form hyper-parameters that moved, the attention core's useful pairs, and
the modules and ops that changed, largest first (:mod:`flopscope.render.diff`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from ...api import profile
from ...render import text as report
from ...render.diff import diff
from .._common import on_meta
from .._options import (
    FORMATS,
    Commands,
    as_input_dtype,
    as_output_path,
    as_positive,
    as_setting,
    as_shape,
)
from ..targets import make_inputs

DIFF_EXAMPLES = """examples:
  flopscope diff hf:llama hf:llama --set num_hidden_layers=2 --set-after num_key_value_heads=8   MHA -> GQA
  flopscope diff before.json after.json --json diff.json     two reports of flopscope profile --json
"""
"""The epilog of ``flopscope diff --help``."""


def register(commands: Commands) -> None:
    """Add ``diff`` and its options to ``commands``."""
    dif = commands.add_parser("diff", help="what changed between two models: per role, module and "
                                           "op, each role's change explained by its closed form",
                              description="Profile BEFORE and AFTER (JSON reports of flopscope "
                                          "profile --json, or targets as for profile, built on "
                                          "meta and counted on fake tensors) and print what "
                                          "changed: the total, every role with the closed-form "
                                          "hyper-parameters that moved (n_kv 8 -> 2 in k_proj = "
                                          "B·n_k·d·(n_kv·d_k)), the attention core's useful pairs "
                                          "(a sliding window), and the modules and "
                                          "ops that changed, largest first.", epilog=DIFF_EXAMPLES,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    dif.add_argument("before", help="a JSON report (flopscope profile TARGET --json FILE) or a "
                                    "target")
    dif.add_argument("after", help="the same, after")
    dif.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", type=as_setting,
                     help="config / factory argument for both targets, repeatable")
    dif.add_argument("--set-before", action="append", default=[], metavar="KEY=VALUE",
                     type=as_setting,
                     help="config / factory argument for BEFORE only, repeatable")
    dif.add_argument("--set-after", action="append", default=[], metavar="KEY=VALUE",
                     type=as_setting,
                     help="config / factory argument for AFTER only, repeatable")
    dif.add_argument("--input", action="append", default=[], metavar="SHAPE", type=as_shape,
                     help="input shape for both targets, repeatable (default: as for profile)")
    dif.add_argument("--dtype", type=as_input_dtype, help="input dtype for both targets")
    dif.add_argument("--limit", type=as_positive, default=20, help="module and op rows shown "
                                                                   "(default 20; all in "
                                                                  "--json)")
    dif.add_argument("--json", type=as_output_path,
                     help="write the diff (schema flopscope.diff/1) here")
    dif.add_argument("--html", type=as_output_path,
                     help="write the diff's page here (one self-contained file)")
    dif.add_argument("--format", choices=FORMATS, default="simple", help="table format (tabulate)")
    dif.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Each side read or counted on fake tensors, then the diff printed and written."""
    sides: list[dict[str, Any]] = []
    for spec, settings in ((args.before, [*args.set, *args.set_before]),
                           (args.after, [*args.set, *args.set_after])):
        document = _report_file(spec)
        if document is None:
            target = on_meta(spec, settings)
            inputs, kwargs = make_inputs(target, args.input, args.dtype)(None)
            with torch.no_grad():
                document = report.to_dict(profile(target.model, *inputs, mode="fake", **kwargs))
        sides.append(document)
    changes = diff(sides[0], sides[1], _side_label(args.before, args.set_before),
                   _side_label(args.after, args.set_after))
    print(changes.to_table(args.format, limit=args.limit))
    if args.json:
        args.json.write_text(json.dumps(changes.to_dict(), indent=2) + "\n")
        print(f"wrote {args.json}")
    if args.html:
        print(f"wrote {changes.to_html(args.html)}")
    return 0


def _report_file(spec: str) -> dict[str, Any] | None:
    """The JSON report at ``spec``, else ``None`` (a target).

    A report is a file whose ``schema`` is flopscope's profile schema: a config.json
    is a target too.
    """
    path = Path(spec)
    if path.suffix != ".json" or not path.is_file():
        return None
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) and document.get("schema") == report.JSON_SCHEMA else None


def _side_label(spec: str, settings: list[str]) -> str:
    return " ".join([spec, *settings])
