"""Layer 11, the command line: ``flopscope COMMAND`` (also ``python -m flopscope``).

``main()`` parses the arguments and runs the command; its exit codes are in the table
below. Each command is one module of ``commands/``. Its ``register`` declares the
command and its options, its ``run`` does the work. ``parser.py`` builds the top parser
from them. ``_options.py`` holds the argument types and the options several commands
share. ``_common.py`` holds the steps several commands run: a target built on meta,
real weights once they fit, the reports. ``targets.py`` resolves the targets (``hf:``,
``timm:``, config files, ``module:factory``); ``settings.py`` parses and checks their
``--set KEY=VALUE`` settings.

May import: every layer.

Exit codes:

==== =================================================================================
code meaning
==== =================================================================================
0    Done.
1    A measured count differs from its closed form (``demo``, ``compare``).
     ``crosscheck`` had no peer that counted, or one that differs by MACs no per-op or
     per-module evidence explains. A peer that fails is reported with why, in its row.
     A peer that cannot take a Hugging Face model's cache counts the call with
     ``use_cache=False``.
2    Bad usage, before anything is built or profiled. argparse's message names the
     option:

     - an ``--input`` that is not a shape of positive integers such as ``1x128``;
     - a ``--dtype`` that is not a torch dtype; a ``generate --dtype`` that is not a
       floating-point torch dtype;
     - a negative ``--depth``; a ``--sweep`` / ``--lengths`` item that is not a positive
       integer; a ``--prompt`` / ``--new`` / ``--batch`` below 1;
     - a ``--peak`` / ``--bandwidth`` that is not a positive number;
     - a ``--json`` / ``--csv`` / ``--html`` / ``--folded`` / ``--speedscope`` /
       ``--plot`` path whose directory is missing or not writable, or that names a
       directory; an image format matplotlib cannot write;
     - ``--tp`` with ``--sweep`` / ``--plot`` / ``--mode real``; ``--dp`` without
       ``--tp``;
     - a ``--set`` that is not ``KEY=VALUE``.

     Also bad usage, once the target is loaded and before it is built
     (:class:`~flopscope.errors.UsageError`):

     - a ``--set`` value of another type than its key's (``num_hidden_layers=two``), or
       one the config's own validation refuses. Booleans, numbers and ``none`` are read
       as a person writes them (:func:`flopscope.cli.settings.parse_value`);
     - an ``--input`` of another form than the model takes: token ids not
       ``BATCHxSEQUENCE``, an image of other dims or channels.
3    A flopscope error:

     - a bad target; a ``generate`` target without a ``generate()`` method;
     - ``generate --mode fake`` of a model whose ``generate()`` greedy decoding does not
       mimic (an encoder-decoder, a cache other than the default);
     - inputs that do not fit, such as a token sequence longer than the model's learned
       position table: refused once the model is built on meta, before the inputs are
       built;
     - a real run that would not fit in the memory available, refused before any weight
       is allocated. Its message names the GiB needed and available, and the way out:
       ``--mode fake`` or fewer layers;
     - a missing optional dependency; a forward that raised.
==== =================================================================================
"""

from __future__ import annotations

import sys

from ..errors import FlopscopeError, UsageError
from .parser import build_parser

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run ``flopscope`` on ``argv`` (default: the process's arguments); the exit code.

    argparse exits with 2 itself on bad usage. The other codes are returned: see the
    table above.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except UsageError as e:
        # a --set or --input the target cannot take: bad usage, as argparse's errors
        print(f"{parser.prog} {args.command}: error: {e}", file=sys.stderr)
        return 2
    except FlopscopeError as e:
        print(f"flopscope: error: {e}", file=sys.stderr)
        return 3
    except Exception as e:
        # a target's own code failing: say what and where, without a traceback
        print(f"flopscope: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 3
