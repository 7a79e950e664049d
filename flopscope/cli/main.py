"""The ``flopscope`` command line (also ``python -m flopscope``). The only module that prints.

Targets (``hf:``, config files, ``timm:``, factories) are built on ``device="meta"``: nothing is allocated, and a
count on fake tensors (the default of ``profile`` and ``generate``) runs on them as they are, whatever the model's
size; ``generate`` counts there the forwards of greedy decoding as Hugging Face's ``generate()`` runs them
(:func:`flopscope.decoding.greedy_decode`: ``generate()`` itself reads values). A run that needs real weights
(``--mode real``, ``auto``'s fall-back to a real run, ``crosscheck``, whose peers execute) first checks that the
parameters and buffers, plus the largest activation of a fake run, fit in the memory available
(:mod:`flopscope.memory`), and only then builds the model again with real weights; a factory that cannot be built
on meta is built for real as given.

Exit codes: 0 done; 1 a measured count differs from its closed form (demo, compare), or ``crosscheck`` had no
peer that counted, or one that differs by MACs no per-op / per-module evidence explains (a peer that fails is
reported with why, in its row; a peer that cannot take a Hugging Face model's cache counts the call with
``use_cache=False``); 2 bad usage (argparse's
message names the option: an ``--input`` that is not a shape of positive integers such as ``1x128``, a
``--dtype`` that is not a torch dtype, a negative ``--depth``, a ``--sweep`` / ``--lengths`` item that is not a
positive integer, a ``--prompt`` / ``--new`` / ``--batch`` below 1, a ``generate --dtype`` that is not a
floating-point torch dtype, a ``--peak`` / ``--bandwidth`` that is not a positive number, a ``--json`` /
``--csv`` / ``--html`` / ``--folded`` / ``--speedscope`` / ``--plot`` path whose directory is missing or not
writable, or that names a directory, an
image format matplotlib cannot write, ``--tp`` with ``--sweep`` / ``--plot`` / ``--mode real`` or ``--dp``
without ``--tp``, a ``--set`` that is not ``KEY=VALUE``: all checked before anything is built or profiled; and,
once the target is loaded (:class:`~flopscope.errors.UsageError`, before it is built), a ``--set`` value of another
type than its key's (``num_hidden_layers=two``: booleans, numbers and ``none`` are read as a person writes them,
:func:`flopscope.targets.parse_value`) or one the config's own validation refuses, an ``--input`` of another form
than the model takes: token ids not ``BATCHxSEQUENCE``, an image of other dims or channels); 3 a flopscope
error (bad target, a ``generate`` target without a ``generate()`` method, ``generate --mode fake`` of a model whose
``generate()`` greedy decoding does not mimic (an encoder-decoder, a cache other than the default), inputs that do
not fit, such
as a token sequence longer than the model's learned position table, refused once the model is built on meta and
before the inputs are built; a real run that would not fit in the memory available, refused before any weight is
allocated, its message naming the GiB needed and available and the way out, ``--mode fake`` or fewer layers; a
missing optional dependency; a forward that raised).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import inspect
import itertools
import json
import os
import sys
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import torch
from tabulate import tabulate

from ..api import profile, profiler
from ..conventions import ATTENTION_CONVENTIONS, EXECUTED
from ..errors import FlopscopeError, RunError, UsageError
from ..hardware.memory import check_fits, state_bytes
from ..hardware.peaks import register_cli as register_peak_cli
from ..peers import crosscheck
from ..predict.communication import compare as compare_collectives
from ..predict.polynomial import Polynomial, Scaling
from ..profile import Profile
from ..render import text as report
from ..render.diff import diff
from ..render.plots import role_share_plot, scaling_plot
from ..role import PAIR_ROLES
from ..studies.models import TransformerBlock
from ..studies.why_self_attention import compare, compare_lengths
from ..version import DISTRIBUTION, __version__
from ..workloads import distributed as dist
from ..workloads.generation import DECODE, profile_generation, steps_table
from ..workloads.pipeline import profile_pipeline
from ..workloads.pipeline_configs import pipeline_from_configs
from ..workloads.roofline import Roofline, roofline
from ..workloads.scaling import MIN_LENGTHS, scaling
from .targets import Target, load_target, make_inputs, parse_setting, parse_settings, parse_shape

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

units: MACs (multiply-accumulates) everywhere; FLOPs = 2 x MACs, always labelled (--units flops).
"""

DIFF_EXAMPLES = """examples:
  flopscope diff hf:llama hf:llama --set num_hidden_layers=2 --set-after num_key_value_heads=8   MHA -> GQA
  flopscope diff before.json after.json --json diff.json     two reports of flopscope profile --json
"""

MODE_FAKE = "use --mode fake (counted on fake tensors: nothing allocated)"
"""The way out of a real run that does not fit, where the command has ``--mode``."""

FORMATS = ["simple", "github", "pipe", "grid", "html", "plain"]


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except UsageError as e:  # a --set or --input the target cannot take: bad usage, as argparse's errors
        print(f"{parser.prog} {args.command}: error: {e}", file=sys.stderr)
        return 2
    except FlopscopeError as e:
        print(f"flopscope: error: {e}", file=sys.stderr)
        return 3
    except Exception as e:  # a target's own code failing: say what and where, without a traceback
        print(f"flopscope: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 3


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flopscope", description="Exact multiply counts of PyTorch models: "
                                     "per module, per semantic role, against closed forms.", epilog=EXAMPLES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"{DISTRIBUTION} {__version__}",
                        help="print the distribution's name and version, and exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    register_peak_cli(commands)  # flopscope peak: this CPU's measured GEMM throughput

    demo = commands.add_parser("demo", help="profile the Transformer block the package ships",
                               description="Roles, reconciliation and the layer-type comparison for "
                                           "flopscope.models.TransformerBlock on one sequence.")
    demo.add_argument("--n", type=int, default=512, help="sequence length (default 512)")
    demo.add_argument("--d", type=int, default=512, help="model width (default 512)")
    demo.add_argument("--h", type=int, default=8, help="heads (default 8)")
    demo.add_argument("--d-ff", type=int, default=2048, help="FFN width (default 2048)")
    _output_options(demo)
    demo.set_defaults(run=_demo)

    prof = commands.add_parser("profile", help="profile a model: hf:FAMILY, hf:ORG/NAME, a config.json, timm:NAME "
                                               "or package.module:factory",
                               description="Profile one forward of TARGET.", epilog=EXAMPLES,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    _target_options(prof)
    prof.add_argument("--mode", choices=["auto", "fake", "real"], default="auto",
                      help="fake: count without computing; real: execute (times per role); auto (default)")
    prof.add_argument("--sweep", type=_sweep_lengths, metavar="N,N,...",
                      help=f"comma-separated lengths (at least {MIN_LENGTHS}): exact polynomial per role in n")
    prof.add_argument("--backward", action="store_true", help="count the backward pass too")
    _attention_option(prof, "the total, the role table and the per-token formulas")
    prof.add_argument("--json", type=_output_path, help="write the JSON report (schema flopscope.profile/1) here")
    prof.add_argument("--csv", type=_output_path, help="write one CSV row per counted op here")
    prof.add_argument("--html", type=_output_path, help="write the HTML report here (one self-contained file: the "
                                                        "module tree as an icicle chart by MACs, roles, "
                                                        "reconciliation, unsupported ops, the --sweep polynomials)")
    prof.add_argument("--folded", type=_output_path, help="write folded stacks (flamegraph.pl, inferno, speedscope; "
                                                          "weights in MACs) here, one file per phase with --backward")
    prof.add_argument("--speedscope", type=_output_path, help="write a speedscope profile (weights in MACs) here")
    prof.add_argument("--plot", type=_plot_path, help="write a PNG (or another format matplotlib writes, by the "
                                                      "suffix): the scaling plot with --sweep, else role shares")
    prof.add_argument("--tp", type=_positive, metavar="T",
                      help="tensor-parallel ranks: shard the model (built on meta) with its own Hugging Face plan on "
                           "a fake world and count rank 0 on fake tensors: MACs per role beside the unsharded "
                           "model's, its collectives against Megatron-LM, bytes per MAC per layer")
    prof.add_argument("--dp", "--fsdp", type=_positive, default=1, metavar="D",
                      help="data-parallel (FSDP) ranks with --tp (mesh D x T): FSDP's collectives per decoder layer, "
                           "predicted (FSDP2 does not run on fake tensors)")
    pipeline = prof.add_argument_group("diffusers:SOURCE targets (a pipeline folder or hub repo, built from its "
                                       "configs on meta: one whole generation, by component and by step)")
    pipeline.add_argument("--steps", type=_positive, metavar="N", help="denoising steps (default: the pipeline's)")
    pipeline.add_argument("--size", type=_image_size, metavar="HxW", help="image size in pixels, e.g. 1024x1024")
    pipeline.add_argument("--frames", type=_positive, metavar="F", help="video frames (video pipelines)")
    pipeline.add_argument("--guidance", type=float, metavar="G", help="guidance_scale (default: the pipeline's)")
    pipeline.add_argument("--prompt", default="a photo of a cat", help="the prompt (only its padded length counts)")
    _output_options(prof)
    prof.set_defaults(run=_profile)

    dif = commands.add_parser("diff", help="what changed between two models: per role, module and op, each role's "
                                           "change explained by its closed form",
                              description="Profile BEFORE and AFTER (JSON reports of flopscope profile --json, or "
                                          "targets as for profile, built on meta and counted on fake tensors) and "
                                          "print what changed: the total, every role with the closed-form "
                                          "hyper-parameters that moved (n_kv 8 -> 2 in k_proj = B·n_k·d·(n_kv·d_k)), "
                                          "the attention core's useful pairs (a sliding window), and the modules and "
                                          "ops that changed, largest first.", epilog=DIFF_EXAMPLES,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    dif.add_argument("before", help="a JSON report (flopscope profile TARGET --json FILE) or a target")
    dif.add_argument("after", help="the same, after")
    dif.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", type=_setting,
                     help="config / factory argument for both targets, repeatable")
    dif.add_argument("--set-before", action="append", default=[], metavar="KEY=VALUE", type=_setting,
                     help="config / factory argument for BEFORE only, repeatable")
    dif.add_argument("--set-after", action="append", default=[], metavar="KEY=VALUE", type=_setting,
                     help="config / factory argument for AFTER only, repeatable")
    dif.add_argument("--input", action="append", default=[], metavar="SHAPE", type=_shape,
                     help="input shape for both targets, repeatable (default: as for profile)")
    dif.add_argument("--dtype", type=_input_dtype, help="input dtype for both targets")
    dif.add_argument("--limit", type=_positive, default=20, help="module and op rows shown (default 20; all in "
                                                                  "--json)")
    dif.add_argument("--json", type=_output_path, help="write the diff (schema flopscope.diff/1) here")
    dif.add_argument("--html", type=_output_path, help="write the diff's page here (one self-contained file)")
    dif.add_argument("--format", choices=FORMATS, default="simple", help="table format (tabulate)")
    dif.set_defaults(run=_diff)

    comp = commands.add_parser("compare", help="Vaswani et al. Table 1, measured",
                               description="Self-attention against convolution, recurrence, FFN and a fully "
                                           "connected layer, built for real and profiled.")
    comp.add_argument("--n", type=int, default=512)
    comp.add_argument("--d", type=int, default=512)
    comp.add_argument("--h", type=int, default=8)
    comp.add_argument("--k", type=int, default=5, help="convolution width")
    comp.add_argument("--r", type=int, default=64, help="neighbourhood of restricted attention")
    comp.add_argument("--lengths", type=_lengths, metavar="N,N,...",
                      help="comma-separated lengths: self-attention against recurrence")
    comp.add_argument("--format", choices=FORMATS, default="simple")
    comp.set_defaults(run=_compare)

    cross = commands.add_parser("crosscheck", help="flopscope beside FlopCounterMode, fvcore, thop, DeepSpeed's "
                                                   "flops profiler, calflops and torchprofile",
                                description="Run every installed counter and explain each difference per role.")
    _target_options(cross)
    cross.add_argument("--tools", type=lambda text: [t for t in text.split(",") if t], metavar="TOOL,TOOL,...",
                       help="the peers to run (default: every installed one of flopscope.peers.TOOLS)")
    cross.add_argument("--format", choices=FORMATS, default="simple")
    cross.set_defaults(run=_crosscheck)

    gen = commands.add_parser("generate", help="generation step by step: prefill, decode, per-token polynomial, "
                                               "roofline", epilog=EXAMPLES,
                              formatter_class=argparse.RawDescriptionHelpFormatter,
                              description="Count TARGET's greedy generation (random token ids, exactly --new "
                                          "tokens) step by step: one prefill forward over the prompt, then one decode "
                                          "forward per new token after the first against the KV cache, as Hugging "
                                          "Face's generate() runs them; report each forward as a step, the FLOPs per "
                                          "generated token as an exact polynomial in the context, and the roofline. "
                                          "By default the model is built on meta and the forwards run on fake "
                                          "tensors (flopscope.decoding.greedy_decode; generate() itself reads values "
                                          "and cannot run there): nothing is allocated, any size counts in seconds. "
                                          "--mode real runs generate() itself with real (random) weights, refused "
                                          "before they are allocated when the weights and the largest activation do "
                                          "not fit in the memory available.")
    gen.add_argument("target", help="hf:FAMILY (the causal-lm head unless another is named) or "
                                    "package.module:factory giving a model with a generate() method")
    gen.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", type=_setting,
                     help="config / factory argument, repeatable (e.g. --set num_hidden_layers=2)")
    gen.add_argument("--prompt", type=_positive, default=128, help="prompt tokens per sequence (default 128)")
    gen.add_argument("--new", type=_positive, default=32,
                     help="tokens to generate (default 32; at least 4 for the per-token polynomial)")
    gen.add_argument("--batch", type=_positive, default=1, help="sequences (default 1)")
    gen.add_argument("--dtype", type=_float_dtype, default=torch.float32,
                     help="the model's dtype, and the roofline's (default float32; e.g. bfloat16)")
    gen.add_argument("--mode", choices=["auto", "fake", "real"], default="auto",
                     help="fake: greedy decoding on fake tensors (nothing computed or allocated); real: HF generate() "
                          "executed on this CPU (times per step and role); auto (default): fake, and real when the "
                          "model cannot be counted on fake tensors")
    gen.add_argument("--device", help="the device whose peak and bandwidth place the roofline: a table name such as "
                                      "'H100 SXM' (see flopscope peak --table); default: this CPU, measured "
                                      "(takes a few seconds). A real run runs on this CPU either way")
    gen.add_argument("--peak", type=_positive_float, metavar="FLOP/S", help="peak FLOP/s (overrides the device's)")
    gen.add_argument("--bandwidth", type=_positive_float, metavar="BYTES/S",
                     help="memory bandwidth in bytes/s (overrides the device's)")
    gen.add_argument("--json", type=_output_path,
                     help="write steps, polynomials and roofline rows (schema flopscope.generate/1) here")
    gen.add_argument("--plot", type=_plot_path, help="write the roofline plot (PNG, or another format by the suffix)")
    _attention_option(gen, "the step table and the FLOPs per generated token (the roofline stays executed work)")
    gen.add_argument("--format", choices=FORMATS, default="simple", help="table format (tabulate)")
    gen.set_defaults(run=_generate)
    return parser


def _target_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", help="hf:FAMILY[/causal-lm|seq2seq-lm|masked-lm|classification] (its default "
                                       "config), hf:ORG/NAME or path/to/config.json (that model's config, no "
                                       "weights), timm:NAME, torchvision.models:NAME or package.module:factory")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", type=_setting,
                        help="config / factory argument, repeatable (e.g. --set n_layer=2)")
    parser.add_argument("--input", action="append", default=[], metavar="SHAPE", type=_shape,
                        help="input shape, repeatable for several inputs (default: 1x128 token ids for Hugging "
                             "Face targets; the weights' image size for timm: and torchvision targets)")
    parser.add_argument("--dtype", type=_input_dtype,
                        help="input dtype: long for token ids, float32 (default for factories), ...")


def _attention_option(parser: argparse.ArgumentParser, priced: str) -> None:
    parser.add_argument("--attention", choices=ATTENTION_CONVENTIONS, default=EXECUTED,
                        help=f"what the attention core is charged in {priced}: executed (default; every pair the "
                             "kernel computes), causal (the causal half) or mask (the pairs the mask allows); "
                             "docs/conventions.md section 5.4")


def _target_and_inputs(args: argparse.Namespace, device: str | None = None) -> tuple[Any, Any]:
    """The target of ``args`` (built on ``device``) and the builder of its inputs (``--input`` shapes, ``--dtype``;
    a sequence longer than the model's position table is refused here, before any input is built)."""
    target = load_target(args.target, args.set, device)
    return target, make_inputs(target, args.input, args.dtype)


def _on_meta(spec: str, settings: list[str]) -> Target:
    """The target built on ``device="meta"`` (nothing allocated: any size is built in seconds); a factory that
    cannot build there (its constructor reads a tensor's values) is built for real, as it was given."""
    try:
        return load_target(spec, settings, "meta")
    except FlopscopeError:
        raise
    except Exception:  # the factory's own code failing on meta tensors: build it where it runs
        return load_target(spec, settings)


def _materialised(target: Target, spec: str, settings: list[str], what: str, activation: int | Callable[[], int], *,
                  copies: int = 1, dtype: torch.dtype | None = None, instead: str = MODE_FAKE) -> Target:
    """``target`` with real weights: the same target when it has them, else built again on the CPU once
    :func:`flopscope.memory.check_fits` found that ``copies`` of its parameters (in ``dtype``) and ``activation``
    bytes (or what ``activation()`` gives: called only when the parameters alone fit) fit; a
    :class:`~flopscope.errors.DoesNotFitError` naming both sizes otherwise, nothing allocated. ``what``: the run
    that needs real weights; ``instead``: what else to do, besides a smaller configuration."""
    if not any(t.is_meta for t in itertools.chain(target.model.parameters(), target.model.buffers())):
        return target
    way_out = f"{instead + ', or ' if instead else ''}count a smaller configuration ({_fewer_layers(target)})"
    parameters = state_bytes(target.model) if dtype is None else \
        max(state_bytes(target.model), state_bytes(target.model, dtype))  # built as declared, then converted
    if callable(activation):  # the parameters alone first: the estimate's fake run is skipped when they do not fit
        check_fits(what, parameters, None, "cpu", copies=copies, way_out=way_out)
        activation = activation()
    check_fits(what, parameters, activation, "cpu", copies=copies, way_out=way_out)
    return load_target(spec, settings, "cpu")


def _fewer_layers(target: Target) -> str:
    """The ``--set`` that shrinks ``target`` (its config's layer count), or the general hint."""
    config = getattr(target.model, "config", None)
    for key in ("num_hidden_layers", "n_layer", "num_layers", "n_layers"):
        if isinstance(getattr(config, key, None), int):
            return f"--set {key}=2"
    return "fewer layers or a smaller width with --set"


def _count(args: argparse.Namespace, target: Target, inputs: tuple[Any, ...], kwargs: dict[str, Any],
           estimate: tuple[tuple[Any, ...], dict[str, Any]]) -> tuple[Target, Profile]:
    """``profile`` of ``target`` (built on meta by :func:`_on_meta`) in ``--mode``: on fake tensors the meta model is
    counted as it is; a real run (``--mode real``, ``auto``'s fall-back, a model that cannot be counted on meta
    kernels) first has its memory estimated on fake tensors with the ``estimate`` inputs (the longest of a sweep)
    and is refused ahead when it would not fit, else the model is built for real (:func:`_materialised`)."""
    copies = 2 if args.backward else 1  # the gradients, as large as the parameters
    grad = torch.enable_grad() if args.backward else torch.no_grad()
    if args.mode == "real":
        target = _materialised(target, args.target, args.set, f"a real run (--mode real) of {target.description}",
                               lambda: _largest_activation(target, *estimate), copies=copies)
        with grad:
            return target, profile(target.model, *inputs, mode="real", backward=args.backward, **kwargs)
    try:
        with grad:
            return target, profile(target.model, *inputs, mode="fake", backward=args.backward, **kwargs)
    except RunError as failed:
        if not failed.on_fake_tensors or not any(p.is_meta for p in target.model.parameters()):
            raise
        if args.mode == "fake":  # fake tensors of the real model's state may go where meta kernels cannot
            what = f"{target.description} built for real (its fake run on meta tensors failed: {failed.reason})"
            activation = 0
        else:
            what = (f"auto's fall-back to a real run of {target.description} (it cannot be counted on fake tensors: "
                    f"{failed.where}: {failed.reason})")
            activation = failed.largest_tensor_bytes
        target = _materialised(target, args.target, args.set, what, activation, copies=copies,
                               instead="")  # (--mode fake failed already)
    with grad:
        return target, profile(target.model, *inputs, mode=args.mode, backward=args.backward, **kwargs)


def _largest_activation(target: Target, inputs: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """Bytes of the largest tensor a forward of ``target`` on ``inputs`` makes, from a count on fake tensors (the
    part of it that ran, where the count fails: a real run needs at least that)."""
    try:
        with torch.no_grad():
            return profile(target.model, *inputs, mode="fake", **kwargs).largest_tensor_bytes
    except RunError as failed:
        return failed.largest_tensor_bytes


def _write_reports(args: argparse.Namespace, prof: Any, scaled: Scaling | None = None) -> None:
    """``--json``, ``--csv``, ``--html`` (with ``scaled``'s polynomials), ``--folded`` and ``--speedscope`` of
    ``profile`` (the JSON's ``attention`` section under ``--attention``)."""
    if args.json:
        args.json.write_text(report.to_json(prof, attention=args.attention))
        print(f"wrote {args.json}")
    if args.csv:
        args.csv.write_text(report.to_csv(prof))
        print(f"wrote {args.csv}")
    if args.html:
        print(f"wrote {prof.to_html(args.html, scaling=scaled, title=f'flopscope: {args.target}')}")
    if args.folded:
        print("wrote " + ", ".join(str(path) for path in prof.export_folded(args.folded)))
    if args.speedscope:
        print(f"wrote {prof.export_speedscope(args.speedscope)}")


def _output_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=FORMATS, default="simple", help="table format (tabulate)")
    parser.add_argument("--units", choices=["macs", "flops"], default="macs")
    parser.add_argument("--depth", type=_depth, default=2,
                        help="module tree depth shown (default 2; 0: the model only)")


# argument types: a bad value is bad usage (exit 2), and argparse's message names the option
def _integer(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def _image_size(text: str) -> tuple[int, int]:
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r}: write HEIGHTxWIDTH in pixels, e.g. 1024x1024")
    return int(parts[0]), int(parts[1])


def _positive(text: str) -> int:
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1; got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number (e.g. 989e12); got {text!r}")
    return value


def _float_dtype(text: str) -> torch.dtype:
    dtype = getattr(torch, text.strip().removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise argparse.ArgumentTypeError(f"not a floating-point torch dtype: {text!r} (float32, bfloat16, float16)")
    return dtype


def _setting(text: str) -> str:
    """A ``--set`` item of the form ``KEY=VALUE`` (its value parsed when the target is loaded)."""
    try:
        parse_setting(text)
    except FlopscopeError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--set ")) from None
    return text


def _shape(text: str) -> tuple[int, ...]:
    """``"1x128"`` -> ``(1, 128)``: positive integers (an ``--input``, checked before anything is built)."""
    try:
        return parse_shape(text)
    except FlopscopeError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--input ")) from None


def _input_dtype(text: str) -> str:
    """A dtype name for the inputs: ``long`` / ``int64`` / ``int`` (token ids) or a torch dtype (``float16``)."""
    name = text.strip().removeprefix("torch.")
    if name not in ("long", "int64", "int") and not isinstance(getattr(torch, name, None), torch.dtype):
        raise argparse.ArgumentTypeError(f"not a torch dtype: {text!r} (long for token ids, float32, bfloat16, ...)")
    return name


def _depth(text: str) -> int:
    depth = _integer(text)
    if depth < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (0: the model only); got {depth}")
    return depth


def _lengths(text: str) -> list[int]:
    """``"128,256"`` -> ``[128, 256]``: positive integers, each bad item named."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"give comma-separated lengths such as 128,256,512; got {text!r}")
    lengths = []
    for item in items:
        try:
            lengths.append(int(item))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item!r} is not a length (a positive integer) in {text!r}") from None
        if lengths[-1] < 1:
            raise argparse.ArgumentTypeError(f"length {item} is not positive in {text!r}")
    return lengths


def _sweep_lengths(text: str) -> list[int]:
    lengths = _lengths(text)
    if len(set(lengths)) < MIN_LENGTHS:
        raise argparse.ArgumentTypeError(f"give at least {MIN_LENGTHS} distinct lengths (a quadratic takes 3 and "
                                         f"is checked at one more); got {text!r}")
    return lengths


def _output_path(text: str) -> Path:
    """A file flopscope can write: not a directory, in a directory that exists and is writable."""
    path = Path(text).expanduser()
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; give a file name in it")
    directory = path.parent
    if not directory.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {text}: directory {directory} does not exist")
    if not os.access(directory, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"cannot write {text}: permission denied")
    return path


def _plot_path(text: str) -> Path:
    """An output path whose suffix names an image format matplotlib writes (when matplotlib is there;
    without it the command stops before profiling, exit 3)."""
    path = _output_path(text)
    if importlib.util.find_spec("matplotlib") is not None:
        from matplotlib.backend_bases import FigureCanvasBase

        formats = FigureCanvasBase.get_supported_filetypes()
        if path.suffix[1:].lower() not in formats:
            raise argparse.ArgumentTypeError(f"{text}: give a file name ending in .png (or "
                                             f"{', '.join('.' + f for f in sorted(formats) if f != 'png')})")
    return path


# --------------------------------------------------------------------------------------------------
def _demo(args: argparse.Namespace) -> int:
    n, d, h, d_ff = args.n, args.d, args.h, args.d_ff
    block = TransformerBlock(d, h, d_ff).eval()
    with torch.no_grad():
        prof = profile(block, torch.zeros(1, n, d), mode="fake")
    params = sum(p.numel() for p in block.parameters())
    weights = sum(p.numel() for p in block.parameters() if p.dim() >= 2)  # matrices: biases and norms left out
    closed = n * (4 * d * d + 2 * d * d_ff) + 2 * n * n * d
    print(f"Transformer block n={n} d={d} h={h} d_ff={d_ff}: {weights:,} weights, {params:,} parameters with "
          f"biases and norms (12·d² = {12 * d * d:,} and 12·d² + 13·d = {12 * d * d + 13 * d:,} when d_ff = 4d)")
    print(report.summary(prof, depth=args.depth, units=args.units, tablefmt=args.format))
    print(f"\nclosed form n·(4d² + 2·d·d_ff) + 2n²d = {closed:,} MACs: "
          f"{'matches' if closed == prof.total() else 'DIFFERS FROM'} the measured total")
    table = compare(n=n, d=d, h=h, d_ff=d_ff)
    print(f"\nlayer types (Vaswani et al. 2017, Table 1), measured at n={n} d={d} h={h}:")
    print(table.to_table(args.format))
    return 0 if closed == prof.total() and table.all_match else 1


def _profile(args: argparse.Namespace) -> int:
    if args.target.startswith("diffusers:"):
        return _profile_pipeline(args)
    given = [flag for flag in ("steps", "size", "frames", "guidance") if getattr(args, flag) is not None]
    if given:
        print(f"flopscope profile: error: --{', --'.join(given)}: only for diffusers: targets", file=sys.stderr)
        return 2
    if args.tp is not None or args.dp > 1:
        return _profile_sharded(args)
    if args.plot and importlib.util.find_spec("matplotlib") is None:  # say so now, not after profiling
        raise FlopscopeError("--plot needs matplotlib: pip install 'torch-flopscope[plot]'")
    target = _on_meta(args.target, args.set)  # nothing allocated: built for real only if a real run needs it
    build = make_inputs(target, args.input, args.dtype)  # refuses too long sequences
    if target.token_inputs:
        for n in args.sweep or ():
            target.check_sequence(n, "--sweep length: a sequence")
    inputs, kwargs = build(None)
    where = "built on meta: nothing allocated" if any(p.is_meta for p in target.model.parameters()) else "built"
    print(f"{target.description}: {sum(p.numel() for p in target.model.parameters()):,} parameters ({where})",
          flush=True)
    target, prof = _count(args, target, inputs, kwargs, build(max(args.sweep)) if args.sweep else (inputs, kwargs))
    print(report.summary(prof, depth=args.depth, units=args.units, tablefmt=args.format, attention=args.attention))
    if target.token_inputs and getattr(target.model, "config", None) is not None:
        with contextlib.suppress(FlopscopeError):  # not a language model: no model-level formulas
            print("\n" + prof.model_formulas(args.attention).to_table(args.format))
    result = None
    if args.sweep:
        result = scaling(target.model, build, lengths=args.sweep, mode="fake" if args.mode != "real"
                         else "real", progress=_progress("sweep"))
        print("\nscaling in n (exact polynomials, checked at one more length than their degree needs):")
        print(result.to_table(args.format))
    _write_reports(args, prof, result)
    if args.plot:
        written = scaling_plot(result, args.plot) if result is not None else role_share_plot(prof, args.plot)
        print(f"wrote {written}")
    return 0


def _diff(args: argparse.Namespace) -> int:
    """``diff BEFORE AFTER``: each side a JSON report, or a target built on meta and counted on fake tensors."""
    sides: list[dict[str, Any]] = []
    for spec, settings in ((args.before, [*args.set, *args.set_before]), (args.after, [*args.set, *args.set_after])):
        document = _report_file(spec)
        if document is None:
            target = _on_meta(spec, settings)
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
    """The JSON report at ``spec`` (a file whose ``schema`` is flopscope's profile schema), else ``None`` (a target:
    a config.json is one too)."""
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


def _profile_pipeline(args: argparse.Namespace) -> int:
    """``profile diffusers:SOURCE``: one call of the pipeline, its components built from their configs on meta and
    counted on fake tensors (:mod:`flopscope.pipeline`, :mod:`flopscope.pipeline_configs`)."""
    conflicts = [flag for flag, given in (("--input", args.input), ("--sweep", args.sweep),
                                          ("--backward", args.backward), ("--tp", args.tp is not None),
                                          ("--dp", args.dp > 1), ("--plot", args.plot),
                                          ("--mode real", args.mode == "real")) if given]
    if conflicts:
        print(f"flopscope profile: error: a diffusers: target counts one pipeline call on fake tensors; it cannot be "
              f"combined with {', '.join(conflicts)}", file=sys.stderr)
        return 2
    source = args.target.removeprefix("diffusers:")
    pipe = pipeline_from_configs(source, overrides=parse_settings(args.set))
    call: dict[str, Any] = {"prompt": args.prompt}
    if args.steps is not None:
        call["num_inference_steps"] = args.steps
    if args.size is not None:
        call["height"], call["width"] = args.size
    if args.frames is not None:
        call["num_frames"] = args.frames
    if args.guidance is not None:
        call["guidance_scale"] = args.guidance
    accepted = inspect.signature(pipe.__call__).parameters
    unknown = [k for k in call if k not in accepted and not any(p.kind is p.VAR_KEYWORD for p in accepted.values())]
    if unknown:
        raise FlopscopeError(f"{type(pipe).__name__} takes no {', '.join(unknown)} (from --steps / --size / --frames / "
                             "--guidance / --prompt)")
    modules = {name: c for name, c in pipe.components.items() if isinstance(c, torch.nn.Module)}
    parameters = sum(p.numel() for m in modules.values() for p in m.parameters())
    print(f"diffusers:{source} ({type(pipe).__name__}): {parameters:,} parameters in {len(modules)} components "
          "(built on meta: nothing allocated)", flush=True)
    with torch.no_grad():
        prof = profile_pipeline(pipe, **call)
    print(prof.summary_table(args.format))
    print(f"\ndenoising steps ({len(prof.steps())}; denoiser: {', '.join(prof.denoisers) or 'none found'}):")
    print(prof.steps_table(args.format))
    names, rows = prof.role_rows()
    print("\nMACs by role and component:")
    print(tabulate([[role, *[f"{macs:,}" for macs in values]] for role, *values in rows],
                   headers=["role", *names], tablefmt=args.format, disable_numparse=True))
    print("\nthe call as a workload:")
    print(prof.workload().to_table(args.format))
    for line in prof.reuse:
        print(f"reuse: {line}")
    if args.json:
        args.json.write_text(json.dumps(_pipeline_json(args.target, call, prof), indent=2) + "\n")
        print(f"wrote {args.json}")
    args.json = None  # (written above: the other reports are the whole call's profile)
    html_path, args.html = args.html, None
    _write_reports(args, prof.profile)
    if html_path:  # (the whole call's page, with the pipeline's section)
        print(f"wrote {prof.to_html(html_path, title=f'flopscope: {args.target}')}")
    return 0


def _pipeline_json(target: str, call: dict[str, Any], prof: Any) -> dict[str, Any]:
    return {"schema": "flopscope.pipeline/1", "target": target, "call": call, "units": "MACs (FLOPs = 2 x MACs)",
            "total": prof.total(), "components": prof.by_component(), "roles": prof.by_component_role(),
            "denoisers": list(prof.denoisers),
            "steps": [{"step": s.step, "macs": dict(s.macs), "calls": dict(s.calls), "latents_batch": s.batch,
                       "denoiser_batch": s.denoiser_batch, "guidance": s.guidance} for s in prof.steps()],
            "workload": [{"component": t.component, "entry": t.entry, "calls": t.calls,
                          "macs_per_call": t.macs_per_call, "steps": t.steps, "passes": t.passes, "batch": t.batch,
                          "guidance": t.guidance} for t in prof.workload().terms],
            "reuse": list(prof.reuse)}


def _profile_sharded(args: argparse.Namespace) -> int:
    """``profile --tp T [--dp D]``: rank 0 of a fake world of D x T ranks, counted on fake tensors."""
    conflicts = [flag for flag, given in (("--sweep", args.sweep), ("--plot", args.plot),
                                          ("--mode real", args.mode == "real"),
                                          (f"--attention {args.attention}", args.attention != EXECUTED)) if given]
    usage = ("--dp needs --tp (--tp 1: data parallel only)" if args.tp is None
             else f"--tp counts on fake tensors; it cannot be combined with {', '.join(conflicts)}" if conflicts
             else None)
    if usage is not None:
        print(f"flopscope profile: error: {usage}", file=sys.stderr)
        return 2
    tp, dp = args.tp, args.dp
    target, build = _target_and_inputs(args, device="meta")  # nothing allocated: any size counts
    model = target.model
    dist.check_tensor_parallel(model, tp)  # before anything is counted
    inputs, kwargs = build(None)
    ids = next((t for t in (*inputs, *kwargs.values()) if isinstance(t, torch.Tensor)), None)
    parameters = sum(p.numel() for p in model.parameters())
    world = dp * tp
    print(f"{target.description}: {parameters:,} parameters; rank 0 of a fake world of {world} ranks (mesh dp {dp} x "
          f"tp {tp}), counted on fake tensors", flush=True)
    with torch.no_grad() if not args.backward else torch.enable_grad():
        unsharded = profile(model, *inputs, mode="fake", backward=args.backward, **kwargs)
        with dist.fake_world(world, mesh_shape=(dp, tp), mesh_dim_names=("dp", "tp")) as mesh:
            dist.tensor_parallel(model, mesh)
            prof = profile(model, *inputs, mode="fake", backward=args.backward, **kwargs)
            units = dist.fsdp_units(model)
            predicted = None
            if ids is not None and ids.dim() == 2:
                with contextlib.suppress(FlopscopeError):  # not a decoder with a width and layers
                    predicted = dist.predicted_collectives(model, ids.shape[0], ids.shape[1], backward=args.backward)
    phases = "forward + backward" if args.backward else "forward"
    print(f"\nMACs by role, {phases} (share: this rank's part of the unsharded model's):")
    print(dist.role_table(prof, unsharded, tablefmt=args.format))
    rows = prof.collectives()
    print("\ncollectives of rank 0 (layers folded):")
    print(dist.collective_table(rows, tablefmt=args.format) if rows else "none")
    if predicted:
        print("\nmeasured against Megatron-LM's closed form:")
        print(compare_collectives(rows, predicted, tablefmt=args.format))
    if dp > 1:
        print(f"\nFSDP over {dp} data-parallel ranks, per decoder-layer unit: predicted (FSDP2 does not run on fake "
              "tensors):")
        print(dist.fsdp_table(units, dp, backward=args.backward, tablefmt=args.format))
    print("\ncommunication per MAC (collective message bytes per multiply-accumulate of this rank):")
    fsdp_backward = args.backward if dp > 1 else None
    print(dist.communication_per_mac(prof, units, fsdp_backward=fsdp_backward, tablefmt=args.format))
    _write_reports(args, prof)
    return 0


def _compare(args: argparse.Namespace) -> int:
    table = compare(n=args.n, d=args.d, h=args.h, k=args.k, r=args.r)
    print(table.to_table(args.format))
    if args.lengths:
        print("\n" + compare_lengths(args.lengths, d=args.d, h=args.h).to_table(args.format))
    return 0 if table.all_match else 1


def _crosscheck(args: argparse.Namespace) -> int:
    target = _on_meta(args.target, args.set)  # the memory estimate first: the peers need real weights
    inputs, kwargs = make_inputs(target, args.input, args.dtype)(None)
    # flopscope's real run, then each peer on its own copy of the model: two copies of the weights at a time
    meta = target
    target = _materialised(target, args.target, args.set, f"crosscheck of {target.description} (flopscope and "
                           "the peers run it for real, each peer on its own copy)",
                           lambda: _largest_activation(meta, inputs, kwargs), copies=2,
                           instead=f"count it with flopscope profile {args.target} (on fake tensors: nothing "
                                   "allocated)")
    with torch.no_grad():
        result = crosscheck(target.model, *inputs, tools=args.tools, forward_kwargs=kwargs)
    print(result.to_table(args.format))
    if not result.ran:
        print("flopscope crosscheck: no peer counted: " + ("each one failed, for the reason in its row" if result.peers
              else "none of them is installed (pip install 'torch-flopscope[crosscheck]')"), file=sys.stderr)
    return 0 if result.ran_explained else 1  # 1: no peer counted, or one disagrees by MACs no evidence explains


def _generate(args: argparse.Namespace) -> int:
    if args.plot and importlib.util.find_spec("matplotlib") is None:  # say so now, not after generating
        raise FlopscopeError("--plot needs matplotlib: pip install 'torch-flopscope[plot]'")
    spec = args.target
    if spec.startswith("hf:") and "/" not in spec:
        spec += "/causal-lm"  # generating needs the language-model head
    target = _on_meta(spec, args.set)  # nothing allocated: built for real only if generate() has to run for real
    model = target.model
    generate: Any = getattr(model, "generate", None)
    can_generate: Any = getattr(model, "can_generate", None)
    if not callable(generate) or (callable(can_generate) and not can_generate()):
        raise FlopscopeError(f"{target.description} ({type(model).__name__}) has no generate() method: give a "
                             "model that generates, such as hf:llama (its causal-lm head) or a factory returning a "
                             "Hugging Face ...ForCausalLM")
    target.check_sequence(args.prompt + args.new - 1, "--prompt + --new - 1 (the last new token is not fed back): "
                          "a sequence")
    vocab = target.vocab_size or getattr(getattr(model, "config", None), "vocab_size", None) or 2
    ids = torch.randint(1, max(vocab, 2), (args.batch, args.prompt), generator=torch.Generator().manual_seed(0))
    dtype = str(args.dtype).removeprefix("torch.")
    what = f"generating {args.new} tokens after a prompt of {args.prompt}, batch {args.batch}"
    prof = _generate_on_fake_tensors(args, target, ids, what) if args.mode != "real" else None
    if prof is None:  # --mode real, or auto's fall-back: HF's generate() for real, refused ahead when it cannot fit
        meta = target
        how = "--mode real" if args.mode == "real" else "auto's fall-back"
        target = _materialised(target, spec, args.set, f"generate() of {target.description} ({how}: it runs for "
                               "real)", lambda: _largest_activation(meta, (ids,), {}), dtype=args.dtype,
                               instead=MODE_FAKE if args.mode == "real" else
                               f"count one forward on fake tensors (flopscope profile {spec} --input "
                               f"{args.batch}x{args.prompt}; nothing allocated)")
        model = target.model.to(args.dtype)
        generate = model.generate
        print(f"{target.description}: {sum(p.numel() for p in model.parameters()):,} parameters, {dtype}; {what} "
              "(HF generate(), run for real)", flush=True)
        with torch.no_grad(), profiler(model, mode="real") as recording:
            generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new,
                           min_new_tokens=args.new, do_sample=False, pad_token_id=0)
        prof = recording.result
    steps = prof.steps(args.attention)
    print(steps_table(steps, args.format))
    try:
        decode: Scaling | None = prof.decode_scaling(args.attention)
    except FlopscopeError as e:
        decode = None
        print(f"\nno per-token polynomial: {e}")
    if decode is not None:
        print("\n" + _per_token_text(decode, args.format, args.attention))
    if args.device is None and (args.peak is None or args.bandwidth is None):
        print("\nmeasuring this CPU's peak FLOP/s and memory bandwidth (a few seconds) ...", file=sys.stderr,
              flush=True)
    where = "this CPU" if args.device in (None, "cpu") else args.device
    # the times were measured here: against another device's figures they mean nothing; a fake run has none
    timed = prof.mode == "real" and where == "this CPU"
    result: Roofline = roofline(prof, device=args.device or "cpu", dtype=args.dtype, peak=args.peak,
                                bandwidth=args.bandwidth, measured=timed)
    untimed = (" (counted on fake tensors: nothing ran, no time measured)" if prof.mode != "real" else
               "" if timed else " (times measured on this CPU: not shown)")
    print(f"\nroofline on {where}{untimed}:")
    print(result.to_table(args.format))
    if args.json:
        args.json.write_text(json.dumps(_generate_json(args, target.description, steps, decode, result, where,
                                                       prof.mode), indent=2) + "\n")
        print(f"wrote {args.json}")
    if args.plot:
        title = f"{target.description}, batch {args.batch}, prompt {args.prompt} + {args.new} new, on {where}"
        print(f"wrote {result.plot(args.plot, title=title)}")
    return 0


def _generate_on_fake_tensors(args: argparse.Namespace, target: Target, ids: torch.Tensor, what: str) -> Any:
    """The profile of greedy decoding (:func:`flopscope.generation.profile_generation`: the forwards HF's
    ``generate()`` runs) of ``target`` (built on meta: nothing allocated) on fake tensors; ``None`` in ``--mode auto``
    when it cannot be counted there (a model greedy_decode does not mimic, a forward fake tensors cannot run), said
    on stderr: the caller runs ``generate()`` for real."""
    model = target.model.to(args.dtype)  # (on meta: nothing converted)
    where = "built on meta: nothing allocated" if any(p.is_meta for p in model.parameters()) else "built"
    dtype = str(args.dtype).removeprefix("torch.")
    print(f"{target.description}: {sum(p.numel() for p in model.parameters()):,} parameters, {dtype} ({where}); "
          f"{what}, counted on fake tensors", flush=True)
    try:
        return profile_generation(model, ids, args.new, mode="fake")
    except Exception as failed:  # auto: any failure of the fake run means a real one
        if args.mode == "fake":
            raise
        print(f"flopscope: generation cannot be counted on fake tensors ({type(failed).__name__}: {failed}); "
              "running generate() for real instead", file=sys.stderr, flush=True)
        return None


def _in_context(poly: Polynomial, scale: int = 1) -> str:
    """A polynomial (in n, as :class:`Polynomial` prints) times ``scale``, written in the context c."""
    return Polynomial(tuple(scale * c for c in poly.coefficients)).text("c")


def _total(polys: list[Polynomial | None]) -> Polynomial | None:
    if any(p is None for p in polys):
        return None
    out = Polynomial((Fraction(0),))
    for poly in polys:
        if poly is not None:
            out = out + poly
    return out


def _per_token_text(decode: Scaling, tablefmt: str, attention: str = EXECUTED) -> str:
    """FLOPs per generated token (one decode step, one sequence) by role, the total, and its KV-cache term (the
    attention core priced by ``attention``)."""
    polys = decode.polynomials
    rows = [[role, "not a polynomial" if poly is None else _in_context(poly, 2)] for role, poly in polys.items()]
    total = _total(list(polys.values()))
    kv = _total([polys[role] for role in PAIR_ROLES if role in polys])
    rest = _total([poly for role, poly in polys.items() if role not in PAIR_ROLES])
    priced = "" if attention == EXECUTED else f", attention core priced {attention!r}"
    lines = [f"FLOPs per generated token (one decode step, one sequence) in the context c (positions attended: "
             f"cached + new){priced}, exact at c = {decode.lengths[0]}..{decode.lengths[-1]}:",
             tabulate(rows, headers=["role", "FLOPs per token"], tablefmt=tablefmt, disable_numparse=True)]
    if total is not None:
        lines.append(f"total: {_in_context(total, 2)} FLOPs per generated token")
    if kv is not None:
        lines.append(f"  KV-cache term (attention core, scores + weighted sum, reads the cache): {_in_context(kv, 2)}")
    if rest is not None:
        lines.append(f"  per new token, whatever the context (projections, FFN, logits, ...): {_in_context(rest, 2)}")
    return "\n".join(lines)


def _coefficients(poly: Polynomial | None, scale: int = 1) -> list[str] | None:
    """Constant term first, exact (``"3/2"``)."""
    return None if poly is None else [str(scale * c) for c in poly.coefficients[:poly.degree + 1]]


def _generate_json(args: argparse.Namespace, description: str, steps: list[Any], decode: Scaling | None,
                   result: Any, where: str, mode: str) -> dict[str, Any]:
    polynomials = None
    if decode is not None:
        polys = decode.polynomials
        polynomials = {
            "variable": "c: positions each new token attends to (cached + new)",
            "coefficients": "constant term first; exact, as strings (fractions as 'p/q')",
            "contexts": list(decode.lengths),
            "macs_by_role": {role: _coefficients(poly) for role, poly in polys.items()},
            "flops_per_token": _coefficients(_total(list(polys.values())), 2),
            "kv_cache_flops_per_token": _coefficients(_total([polys[r] for r in PAIR_ROLES if r in polys]), 2),
        }
    rows = []
    for kind, points in (("role", result.roles), ("step", result.steps)):
        for p in points:
            mfu, mbu = result.utilisation(p)
            rows.append({"kind": kind, "name": p.name, "flops": p.flops, "bytes": p.bytes, "intensity": p.intensity,
                         "bound": p.bound, "predicted_seconds": p.predicted_seconds,
                         "measured_seconds": p.measured_seconds, "mfu": mfu, "mbu": mbu})
    return {"schema": "flopscope.generate/1", "target": description, "mode": mode, "batch": args.batch,
            "prompt": args.prompt, "new": args.new, "dtype": str(args.dtype).removeprefix("torch."),
            "units": "MACs, FLOPs = 2 x MACs, bytes", "attention": args.attention, "steps": [s.row() for s in steps],
            "decode_steps": sum(s.phase == DECODE for s in steps),
            "polynomials": polynomials,
            "roofline": {"device": where, "peak_flops": result.peak_flops, "bandwidth": result.bandwidth,
                         "ridge": result.ridge, "rows": rows}}


def _progress(label: str) -> Any:
    def show(done: int, total: int) -> None:
        bar = "#" * (20 * done // total)
        end = "\n" if done == total else ""
        print(f"\r{label} [{bar:<20}] {done}/{total}", end=end, file=sys.stderr, flush=True)
    return show


if __name__ == "__main__":
    sys.exit(main())
