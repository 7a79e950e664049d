"""The options several commands share, and every argument type of the command line.

An argument type turns a bad value into bad usage (exit 2) before anything is built:
argparse's message names the option. The types keep their underscore names, since
argparse names a type by its function's name in "invalid <name> value", where a type
lets a ``ValueError`` out.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from pathlib import Path
from typing import TypeAlias

import torch

from ..conventions import ATTENTION_CONVENTIONS, EXECUTED
from ..errors import FlopscopeError
from ..workloads.scaling import MIN_LENGTHS
from .settings import parse_setting
from .targets import parse_shape

Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
"""What ``add_subparsers()`` returns: each command module's ``register`` adds its parser
to it."""

EXAMPLES = """examples:
  flopscope demo                                  the seed study's Transformer block, n = d = 512, h = 8
  flopscope profile hf:gpt2 --set n_layer=2 --input 1x128
  flopscope profile hf:llama/causal-lm --set num_hidden_layers=2 --sweep 128,256,512,1024 --plot scaling.png
  flopscope profile flopscope.models:TransformerBlock --input 1x512x512 --backward --format github
  flopscope profile torchvision.models:resnet18 --input 1x3x224x224 --json resnet.json
  flopscope profile hf:gpt2 --set n_layer=2 --input 1x128 --html gpt2.html --folded gpt2.folded
  flopscope compare --n 512 --d 512 --h 8 --k 5 --r 64 --lengths 256,512,1024
  flopscope crosscheck hf:gpt2 --set n_layer=2 --input 1x128
  flopscope generate hf:llama --set num_hidden_layers=2 --prompt 128 --new 32 --device "H100 SXM" --plot roofline.png
  flopscope generate hf:llama --prompt 16 --new 4   Llama-2-7B's shape on meta, counted on fake tensors (seconds)
  flopscope profile hf:llama/causal-lm --set num_hidden_layers=2 --input 1x2048 --tp 8 --dp 4 --backward
  flopscope diff hf:llama hf:llama --set num_hidden_layers=2 --set-after num_key_value_heads=8   MHA -> GQA, explained
  flopscope cost hf:llama --step 1@4096x8,512@2048 --json cost.json   a serving step's MACs per request in t and c

units: MACs (multiply-accumulates) everywhere; FLOPs = 2 x MACs, always labelled (--units flops).
"""
"""The epilog of ``flopscope --help``, ``profile --help`` and ``generate --help``."""

FORMATS = ["simple", "github", "pipe", "grid", "html", "plain"]
"""The table formats of ``--format`` (tabulate's names)."""


def target_options(parser: argparse.ArgumentParser) -> None:
    """The target and how it is built and fed: ``TARGET --set --input --dtype``."""
    parser.add_argument("target", help="hf:FAMILY[/causal-lm|seq2seq-lm|masked-lm|classification] "
                                       "(its default config), hf:ORG/NAME or path/to/config.json "
                                       "(that model's config, no weights), timm:NAME, "
                                       "torchvision.models:NAME or package.module:factory")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", type=as_setting,
                        help="config / factory argument, repeatable (e.g. --set n_layer=2)")
    parser.add_argument("--input", action="append", default=[], metavar="SHAPE", type=as_shape,
                        help="input shape, repeatable for several inputs (default: 1x128 token ids "
                             "for Hugging Face targets; the weights' image size for timm: and "
                             "torchvision targets)")
    parser.add_argument("--dtype", type=as_input_dtype,
                        help="input dtype: long for token ids, float32 (default for factories), ...")


def attention_option(parser: argparse.ArgumentParser, priced: str) -> None:
    """``--attention``: what the attention core is charged in ``priced``."""
    parser.add_argument("--attention", choices=ATTENTION_CONVENTIONS, default=EXECUTED,
                        help=f"what the attention core is charged in {priced}: executed (default; "
                             "every pair the kernel computes), causal (the causal half) or mask "
                             "(the pairs the mask allows); docs/conventions.md section 5.4")


def output_options(parser: argparse.ArgumentParser) -> None:
    """How the tables are printed: ``--format --units --depth``."""
    parser.add_argument("--format", choices=FORMATS, default="simple",
                        help="table format (tabulate)")
    parser.add_argument("--units", choices=["macs", "flops"], default="macs")
    parser.add_argument("--depth", type=as_depth, default=2,
                        help="module tree depth shown (default 2; 0: the model only)")


def check_plot(plot: Path | None) -> None:
    """Refuse ``--plot`` when matplotlib is missing: said now, not after the count."""
    if plot and importlib.util.find_spec("matplotlib") is None:
        raise FlopscopeError("--plot needs matplotlib: pip install 'torch-flopscope[plot]'")


def as_integer(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def as_image_size(text: str) -> tuple[int, int]:
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r}: write HEIGHTxWIDTH in pixels, e.g. 1024x1024")
    return int(parts[0]), int(parts[1])


def as_positive(text: str) -> int:
    value = as_integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1; got {value}")
    return value


def as_positive_float(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number (e.g. 989e12); got {text!r}")
    return value


def as_float_dtype(text: str) -> torch.dtype:
    dtype = getattr(torch, text.strip().removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise argparse.ArgumentTypeError(f"not a floating-point torch dtype: {text!r} (float32, "
                                         "bfloat16, float16)")
    return dtype


def as_setting(text: str) -> str:
    """A ``--set`` item of the form ``KEY=VALUE``.

    Its value is parsed when the target is loaded.
    """
    try:
        parse_setting(text)
    except FlopscopeError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--set ")) from None
    return text


def as_shape(text: str) -> tuple[int, ...]:
    """``"1x128"`` -> ``(1, 128)``: positive integers.

    An ``--input``, checked before anything is built.
    """
    try:
        return parse_shape(text)
    except FlopscopeError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--input ")) from None


def as_input_dtype(text: str) -> str:
    """A dtype name for the inputs.

    ``long`` / ``int64`` / ``int`` (token ids) or a torch dtype (``float16``).
    """
    name = text.strip().removeprefix("torch.")
    if name not in ("long", "int64", "int") and not isinstance(getattr(torch, name, None),
                                                               torch.dtype):
        raise argparse.ArgumentTypeError(f"not a torch dtype: {text!r} (long for token ids, "
                                         "float32, bfloat16, ...)")
    return name


def as_depth(text: str) -> int:
    depth = as_integer(text)
    if depth < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (0: the model only); got {depth}")
    return depth


def as_lengths(text: str) -> list[int]:
    """``"128,256"`` -> ``[128, 256]``: positive integers, each bad item named."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise argparse.ArgumentTypeError("give comma-separated lengths such as 128,256,512; got "
                                         f"{text!r}")
    lengths = []
    for item in items:
        try:
            lengths.append(int(item))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item!r} is not a length (a positive integer) in "
                                             f"{text!r}") from None
        if lengths[-1] < 1:
            raise argparse.ArgumentTypeError(f"length {item} is not positive in {text!r}")
    return lengths


def as_sweep_lengths(text: str) -> list[int]:
    lengths = as_lengths(text)
    if len(set(lengths)) < MIN_LENGTHS:
        raise argparse.ArgumentTypeError(f"give at least {MIN_LENGTHS} distinct lengths (a "
                                         "quadratic takes 3 and is checked at one more); got "
                                         f"{text!r}")
    return lengths


def as_output_path(text: str) -> Path:
    """A file flopscope can write: not a directory, in a writable directory."""
    path = Path(text).expanduser()
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; give a file name in it")
    directory = path.parent
    if not directory.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {text}: directory {directory} does not "
                                         "exist")
    if not os.access(directory, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"cannot write {text}: permission denied")
    return path


def as_plot_path(text: str) -> Path:
    """An output path whose suffix names an image format matplotlib writes.

    Checked when matplotlib is there. Without it the command stops before profiling
    (:func:`check_plot`, exit 3).
    """
    path = as_output_path(text)
    if importlib.util.find_spec("matplotlib") is not None:
        from matplotlib.backend_bases import FigureCanvasBase

        formats = FigureCanvasBase.get_supported_filetypes()
        if path.suffix[1:].lower() not in formats:
            raise argparse.ArgumentTypeError(f"{text}: give a file name ending in .png (or "
                                             f"{', '.join('.' + f for f in sorted(formats) if f != 'png')})")
    return path
