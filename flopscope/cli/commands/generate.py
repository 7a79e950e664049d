"""``flopscope generate TARGET``: greedy generation, step by step, and its roofline.

One prefill forward over the prompt, then one decode forward per new token after the
first, against the KV cache, as Hugging Face's ``generate()`` runs them. Each forward is
reported as a step; the FLOPs per generated token as an exact polynomial in the context;
then the roofline on a device.

By default the model is built on meta and the forwards run on fake tensors
(:func:`flopscope.workloads.decoding.greedy_decode`): ``generate()`` itself reads values
and cannot run there. ``--mode real``, or ``auto``'s fall-back, runs ``generate()``
itself with real (random) weights, refused before they are allocated when they would not
fit (:mod:`flopscope.cli._common`).
"""

from __future__ import annotations

import argparse
import json
import sys
from fractions import Fraction
from typing import Any

import torch
from tabulate import tabulate

from ...api import profiler
from ...conventions import EXECUTED
from ...errors import FlopscopeError
from ...predict.polynomial import Polynomial, Scaling
from ...role import PAIR_ROLES
from ...workloads.generation import DECODE, profile_generation, steps_table
from ...workloads.roofline import Roofline, roofline
from .._common import MODE_FAKE, largest_activation, materialised, on_meta
from .._options import (
    EXAMPLES,
    FORMATS,
    Commands,
    as_float_dtype,
    as_output_path,
    as_plot_path,
    as_positive,
    as_positive_float,
    as_setting,
    attention_option,
    check_plot,
)
from ..targets import Target


def register(commands: Commands) -> None:
    """Add ``generate`` and its options to ``commands``."""
    gen = commands.add_parser("generate", help="generation step by step: prefill, decode, "
                                               "per-token polynomial, "
                                               "roofline", epilog=EXAMPLES,
                              formatter_class=argparse.RawDescriptionHelpFormatter,
                              description="Count TARGET's greedy generation (random token ids, "
                                          "exactly --new tokens) step by step: one prefill forward "
                                          "over the prompt, then one decode forward per new token "
                                          "after the first against the KV cache, as Hugging Face's "
                                          "generate() runs them; report each forward as a step, "
                                          "the FLOPs per generated token as an exact polynomial in "
                                          "the context, and the roofline. By default the model is "
                                          "built on meta and the forwards run on fake tensors "
                                          "(flopscope.decoding.greedy_decode; generate() itself "
                                          "reads values and cannot run there): nothing is "
                                          "allocated, any size counts in seconds. --mode real runs "
                                          "generate() itself with real (random) weights, refused "
                                          "before they are allocated when the weights and the "
                                          "largest activation do not fit in the memory available.")
    gen.add_argument("target", help="hf:FAMILY (the causal-lm head unless another is named) or "
                                    "package.module:factory giving a model with a generate() method")
    gen.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", type=as_setting,
                     help="config / factory argument, repeatable (e.g. --set num_hidden_layers=2)")
    gen.add_argument("--prompt", type=as_positive, default=128,
                     help="prompt tokens per sequence (default 128)")
    gen.add_argument("--new", type=as_positive, default=32,
                     help="tokens to generate (default 32; at least 4 for the per-token polynomial)")
    gen.add_argument("--batch", type=as_positive, default=1, help="sequences (default 1)")
    gen.add_argument("--dtype", type=as_float_dtype, default=torch.float32,
                     help="the model's dtype, and the roofline's (default float32; e.g. bfloat16)")
    gen.add_argument("--mode", choices=["auto", "fake", "real"], default="auto",
                     help="fake: greedy decoding on fake tensors (nothing computed or allocated); "
                          "real: HF generate() executed on this CPU (times per step and role); "
                          "auto (default): fake, and real when the model cannot be counted on fake "
                          "tensors")
    gen.add_argument("--device", help="the device whose peak and bandwidth place the roofline: a "
                                      "table name such as 'H100 SXM' (see flopscope peak --table); "
                                      "default: this CPU, measured (takes a few seconds). A real "
                                      "run runs on this CPU either way")
    gen.add_argument("--peak", type=as_positive_float, metavar="FLOP/S",
                     help="peak FLOP/s (overrides the device's)")
    gen.add_argument("--bandwidth", type=as_positive_float, metavar="BYTES/S",
                     help="memory bandwidth in bytes/s (overrides the device's)")
    gen.add_argument("--json", type=as_output_path,
                     help="write steps, polynomials and roofline rows (schema "
                          "flopscope.generate/1) here")
    gen.add_argument("--plot", type=as_plot_path,
                     help="write the roofline plot (PNG, or another format by the suffix)")
    attention_option(gen, "the step table and the FLOPs per generated token (the roofline stays "
                          "executed work)")
    gen.add_argument("--format", choices=FORMATS, default="simple", help="table format (tabulate)")
    gen.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Count the generation, print its steps, per-token polynomial and roofline."""
    check_plot(args.plot)
    spec = args.target
    if spec.startswith("hf:") and "/" not in spec:
        # generating needs the language-model head
        spec += "/causal-lm"
    # nothing allocated: built for real only if generate() has to run for real
    target = on_meta(spec, args.set)
    model = target.model
    generate: Any = getattr(model, "generate", None)
    can_generate: Any = getattr(model, "can_generate", None)
    if not callable(generate) or (callable(can_generate) and not can_generate()):
        raise FlopscopeError(f"{target.description} ({type(model).__name__}) has no generate() "
                             "method: give a model that generates, such as hf:llama (its causal-lm "
                             "head) or a factory returning a Hugging Face ...ForCausalLM")
    target.check_sequence(args.prompt + args.new - 1,
                          "--prompt + --new - 1 (the last new token is not fed back): "
                          "a sequence")
    vocab = target.vocab_size or getattr(getattr(model, "config", None), "vocab_size", None) or 2
    ids = torch.randint(1, max(vocab, 2), (args.batch, args.prompt),
                        generator=torch.Generator().manual_seed(0))
    dtype = str(args.dtype).removeprefix("torch.")
    what = f"generating {args.new} tokens after a prompt of {args.prompt}, batch {args.batch}"
    prof = _on_fake_tensors(args, target, ids, what) if args.mode != "real" else None
    if prof is None:
        # --mode real, or auto's fall-back: HF's generate() for real, refused ahead when
        # it cannot fit
        meta = target
        how = "--mode real" if args.mode == "real" else "auto's fall-back"
        target = materialised(target, spec, args.set,
                              f"generate() of {target.description} ({how}: it runs for "
                              "real)", lambda: largest_activation(meta, (ids,), {}),
                              dtype=args.dtype,
                              instead=MODE_FAKE if args.mode == "real" else
                              f"count one forward on fake tensors (flopscope profile {spec} "
                              f"--input {args.batch}x{args.prompt}; nothing allocated)")
        model = target.model.to(args.dtype)
        generate = model.generate
        print(f"{target.description}: {sum(p.numel() for p in model.parameters()):,} parameters, "
              f"{dtype}; {what} "
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
        print("\nmeasuring this CPU's peak FLOP/s and memory bandwidth (a few seconds) ...",
              file=sys.stderr,
              flush=True)
    where = "this CPU" if args.device in (None, "cpu") else args.device
    # the times were measured here: against another device's figures they mean nothing;
    # a fake run has none
    timed = prof.mode == "real" and where == "this CPU"
    result: Roofline = roofline(prof, device=args.device or "cpu", dtype=args.dtype, peak=args.peak,
                                bandwidth=args.bandwidth, measured=timed)
    untimed = (" (counted on fake tensors: nothing ran, no time measured)" if prof.mode != "real" else
               "" if timed else " (times measured on this CPU: not shown)")
    print(f"\nroofline on {where}{untimed}:")
    print(result.to_table(args.format))
    if args.json:
        args.json.write_text(json.dumps(_generate_json(args, target.description, steps, decode,
                                                       result, where,
                                                       prof.mode), indent=2) + "\n")
        print(f"wrote {args.json}")
    if args.plot:
        title = f"{target.description}, batch {args.batch}, prompt {args.prompt} + {args.new} new, on {where}"
        print(f"wrote {result.plot(args.plot, title=title)}")
    return 0


def _on_fake_tensors(args: argparse.Namespace, target: Target, ids: torch.Tensor, what: str) -> Any:
    """The profile of greedy decoding of ``target`` on fake tensors, or ``None``.

    :func:`flopscope.workloads.generation.profile_generation` runs the forwards HF's
    ``generate()`` runs, on ``target`` as built on meta: nothing allocated. ``None`` in
    ``--mode auto`` when it cannot be counted there (a model greedy_decode does not
    mimic, a forward fake tensors cannot run), said on stderr: the caller runs
    ``generate()`` for real.
    """
    # (on meta: nothing converted)
    model = target.model.to(args.dtype)
    where = "built on meta: nothing allocated" if any(p.is_meta for p in model.parameters()) else "built"
    dtype = str(args.dtype).removeprefix("torch.")
    print(f"{target.description}: {sum(p.numel() for p in model.parameters()):,} parameters, "
          f"{dtype} ({where}); "
          f"{what}, counted on fake tensors", flush=True)
    try:
        return profile_generation(model, ids, args.new, mode="fake")
    except Exception as failed:
        # auto: any failure of the fake run means a real one
        if args.mode == "fake":
            raise
        print(f"flopscope: generation cannot be counted on fake tensors ({type(failed).__name__}: "
              f"{failed}); "
              "running generate() for real instead", file=sys.stderr, flush=True)
        return None


def _in_context(poly: Polynomial, scale: int = 1) -> str:
    """A polynomial in n (as :class:`Polynomial` prints) times ``scale``, in context c."""
    return Polynomial(tuple(scale * c for c in poly.coefficients)).text("c")


def _total(polys: list[Polynomial | None]) -> Polynomial | None:
    """The sum of ``polys``; ``None`` when one of them is not a polynomial."""
    if any(p is None for p in polys):
        return None
    out = Polynomial((Fraction(0),))
    for poly in polys:
        if poly is not None:
            out = out + poly
    return out


def _per_token_text(decode: Scaling, tablefmt: str, attention: str = EXECUTED) -> str:
    """FLOPs per generated token (one decode step): by role, total, the KV-cache term.

    For one sequence, with the attention core priced by ``attention``.
    """
    polys = decode.polynomials
    rows = [[role, "not a polynomial" if poly is None else _in_context(poly, 2)] for role, poly in polys.items()]
    total = _total(list(polys.values()))
    kv = _total([polys[role] for role in PAIR_ROLES if role in polys])
    rest = _total([poly for role, poly in polys.items() if role not in PAIR_ROLES])
    priced = "" if attention == EXECUTED else f", attention core priced {attention!r}"
    lines = ["FLOPs per generated token (one decode step, one sequence) in the context c "
             f"(positions attended: cached + new){priced}, exact at c = "
             f"{decode.lengths[0]}..{decode.lengths[-1]}:",
             tabulate(rows, headers=["role", "FLOPs per token"], tablefmt=tablefmt,
                      disable_numparse=True)]
    if total is not None:
        lines.append(f"total: {_in_context(total, 2)} FLOPs per generated token")
    if kv is not None:
        lines.append("  KV-cache term (attention core, scores + weighted sum, reads the cache): "
                     f"{_in_context(kv, 2)}")
    if rest is not None:
        lines.append("  per new token, whatever the context (projections, FFN, logits, ...): "
                     f"{_in_context(rest, 2)}")
    return "\n".join(lines)


def _coefficients(poly: Polynomial | None, scale: int = 1) -> list[str] | None:
    """Constant term first, exact (``"3/2"``)."""
    return None if poly is None else [str(scale * c) for c in poly.coefficients[:poly.degree + 1]]


def _generate_json(args: argparse.Namespace, description: str, steps: list[Any],
                   decode: Scaling | None,
                   result: Any, where: str, mode: str) -> dict[str, Any]:
    """The ``--json`` document (schema ``flopscope.generate/1``)."""
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
            rows.append({"kind": kind, "name": p.name, "flops": p.flops, "bytes": p.bytes,
                         "intensity": p.intensity,
                         "bound": p.bound, "predicted_seconds": p.predicted_seconds,
                         "measured_seconds": p.measured_seconds, "mfu": mfu, "mbu": mbu})
    return {"schema": "flopscope.generate/1", "target": description, "mode": mode,
            "batch": args.batch,
            "prompt": args.prompt, "new": args.new, "dtype": str(args.dtype).removeprefix("torch."),
            "units": "MACs, FLOPs = 2 x MACs, bytes", "attention": args.attention,
            "steps": [s.row() for s in steps],
            "decode_steps": sum(s.phase == DECODE for s in steps),
            "polynomials": polynomials,
            "roofline": {"device": where, "peak_flops": result.peak_flops,
                         "bandwidth": result.bandwidth,
                         "ridge": result.ridge, "rows": rows}}
