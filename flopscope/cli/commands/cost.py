"""``flopscope cost TARGET``: a serving step's MACs per request, from the model's own code.

Prints the cost model of :func:`flopscope.workloads.step_cost.cost_model`: for a fresh
prompt of ``t`` positions, a decode step on a cache of ``c`` and a chunk of ``t`` on a
cache of ``c``, each role's MACs as an exact function of ``t`` and ``c``, with the
conditions each holds under. ``--step`` prices one scheduler step (its requests' sum);
``--tp N`` gives one rank's under tensor parallelism
(:func:`flopscope.workloads.rank_cost.rank_cost_model`), ``--ep`` with its experts split
over the ranks too, their MACs under the ``--routing`` convention; ``--json`` writes the document
a simulator reads (schema ``flopscope.cost/1``, ``docs/schemas/cost-1.json``). The
model is built on meta and traced on fake tensors: nothing is allocated. Units: MACs
(FLOPs = 2 x MACs).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
from tabulate import tabulate

from ...errors import ConfigurationError, FlopscopeError, UsageError
from ...predict.serving_tools import TOOLS, explain
from ...workloads.rank_cost import ROUTINGS, rank_cost_model
from ...workloads.step_cost import StepCost, cost_model
from .._common import on_meta
from .._options import (
    FORMATS,
    Commands,
    as_float_dtype,
    as_lengths,
    as_output_path,
    as_positive,
    as_setting,
)


def register(commands: Commands) -> None:
    """Add ``cost`` and its options to ``commands``."""
    cmd = commands.add_parser(
        "cost", help="a serving step's MACs per request as exact polynomials in its new tokens and context",
        description="Trace TARGET's prefill, decode step and prefill chunk once each on fake tensors, with the "
                    "request's new tokens t and cached context c as symbols, and print each role's MACs per "
                    "request as an exact function of t and c (a scheduler step's MACs are the sum over its "
                    "requests). Nothing is allocated.")
    cmd.add_argument("target", help="hf:FAMILY (the causal-lm head unless another is named), hf:ORG/NAME, "
                                    "path/to/config.json or package.module:factory: a model that generates")
    cmd.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", type=as_setting,
                     help="config / factory argument, repeatable (e.g. --set num_hidden_layers=2)")
    cmd.add_argument("--context", type=as_positive, default=64,
                     help="the cache length the traces run at (default 64); the polynomials hold where their "
                          "conditions do, other sizes are counted concretely")
    cmd.add_argument("--chunk", type=as_positive, default=16, help="the chunk length traced (default 16)")
    cmd.add_argument("--step", type=as_requests, metavar="T@C[xK],...",
                     help="price one scheduler step: its requests, each T new positions on a cache of C, K times "
                          "(e.g. 1@4096x8,512@2048: eight decodes and one prefill chunk)")
    cmd.add_argument("--device", help="with --step: place the step on this device's roofline, a table name such as "
                                      "'H100 SXM' (see flopscope peak --table)")
    cmd.add_argument("--dtype", type=as_float_dtype, default=torch.bfloat16,
                     help="the model's dtype (its bytes) and --device's peak's (default bfloat16)")
    cmd.add_argument("--decode-sweep", type=as_lengths, metavar="C1,C2,...",
                     help="a step of --batch decodes at each of these contexts: FLOPs, bytes, FLOPs per byte, and "
                          "with --device its roofline and the first context where it turns compute-bound")
    cmd.add_argument("--batch", type=as_positive, default=1, help="--decode-sweep: decodes per step (default 1)")
    cmd.add_argument("--tools", action="store_true",
                     help="set the analytic tools' FLOPs (vLLM's perf metrics, LLM-Viewer, llm-analysis, nanoGPT) "
                          "beside flopscope's for a prefill of --prompt and a decode step at --decode-at, each "
                          "difference named by its cause")
    cmd.add_argument("--prompt", type=as_positive, default=2048, help="--tools: the prefill's tokens (default 2048)")
    cmd.add_argument("--decode-at", type=as_positive, default=2048,
                     help="--tools: the decode step's cached context (default 2048)")
    cmd.add_argument("--tp", type=as_positive, metavar="N",
                     help="one rank's cost model under tensor parallelism over N ranks (the model's own plan, on a "
                          "fake world): its shards' MACs and bytes per request, fitted through concrete counts")
    cmd.add_argument("--rank", type=int, default=0, help="--tp: the rank (default 0)")
    cmd.add_argument("--ep", action="store_true",
                     help="--tp: split a mixture of experts' experts over the N ranks too (expert parallelism, as "
                          "transformers' ep_size = tp_size), their MACs under --routing")
    cmd.add_argument("--routing", choices=ROUTINGS,
                     help="--ep: which routes reach the rank's experts (data, so a convention): balanced (each expert "
                          "as many as any other; default) or upper (every route: an upper bound)")
    cmd.add_argument("--json", type=as_output_path, help="write the cost model (schema flopscope.cost/1) here")
    cmd.add_argument("--format", choices=FORMATS, default="simple", help="table format (tabulate)")
    cmd.set_defaults(run=run)


def as_requests(text: str) -> list[tuple[int, int]]:
    """``"1@4096x8,512@2048"`` as ``[(1, 4096)] * 8 + [(512, 2048)]``."""
    out: list[tuple[int, int]] = []
    for item in text.split(","):
        try:
            sizes, _, times = item.strip().partition("x")
            t, c = (int(v) for v in sizes.split("@"))
            count = int(times) if times else 1
        except ValueError:
            raise argparse.ArgumentTypeError(f"a request is T@C or T@CxK (new positions @ cached positions, "
                                             f"K times); got {item!r}") from None
        if t < 1 or c < 0 or count < 1:
            raise argparse.ArgumentTypeError(f"a request brings T >= 1 new positions on C >= 0, K >= 1 times; "
                                             f"got {item!r}")
        out += [(t, c)] * count
    return out


def run(args: argparse.Namespace) -> int:
    """Print the cost model, the step's price, and write the JSON."""
    sharded = args.tp is not None and args.tp > 1
    if args.ep and not sharded:
        raise UsageError("--ep splits the experts over the --tp ranks: give --tp N (N > 1)")
    if args.routing is not None and not args.ep:
        raise UsageError("--routing says how the routes reach the experts --ep splits: give --ep")
    spec = args.target
    if spec.startswith("hf:") and "/" not in spec:
        spec += "/causal-lm"
    target = on_meta(spec, args.set)
    model = target.model.to(args.dtype)  # (on meta: nothing converted)
    if not callable(getattr(model, "prepare_inputs_for_generation", None)):
        raise FlopscopeError(f"{target.description} ({type(model).__name__}) does not generate: give a model with "
                             "generate(), such as hf:llama (its causal-lm head)")
    whole = cost = cost_model(model, context=args.context, chunk=args.chunk)
    if sharded:
        cost = rank_cost_model(model, args.tp, rank=args.rank, experts=args.ep, routing=args.routing or "balanced",
                               unsharded=whole)
    print(f"{target.description} ({cost.model}): MACs per request, t new positions on a cache of c "
          "(the attention core as executed; FLOPs = 2 x MACs)")
    print(cost.table())
    for kind, conditions in cost.conditions.items():
        if conditions:
            print(f"{kind} holds where {'; '.join(conditions)}; other sizes are counted concretely")
    document = cost.to_json()
    if args.step:
        roles = cost.iteration(args.step)
        total = sum(roles.values())
        rows = [[role, f"{macs:,}", f"{2 * macs:,}"] for role, macs in roles.items()]
        rows.append(["total", f"{total:,}", f"{2 * total:,}"])
        print(f"\none step of {len(args.step)} request(s):")
        print(tabulate(rows, headers=["role", "MACs", "FLOPs"], tablefmt=args.format, disable_numparse=True))
        moved = cost.iteration_bytes(args.step)
        print(f"bytes moved: {moved:,} (the weights once; {2 * total / moved:.1f} FLOPs per byte)")
        document["priced_step"] = {"requests": [list(r) for r in args.step], "macs_by_role": roles, "macs": total,
                                   "bytes": moved}
        if args.device:
            price = cost.price(args.step, device=args.device, dtype=args.dtype)
            dtype = str(args.dtype).removeprefix("torch.")
            print(f"on {args.device} ({dtype}): at least {price.seconds * 1e3:.3f} ms, {price.bound}-bound "
                  f"(compute {price.compute_seconds * 1e3:.3f} ms at the peak, memory "
                  f"{price.memory_seconds * 1e3:.3f} ms at the bandwidth: a roofline's lower bound)")
    if args.decode_sweep:
        print("\n" + _sweep_table(cost, args))
    if args.tools:
        # (the tools model the whole model: beside its count, not a rank's)
        print("\n" + _tools_table(whole, model, args.prompt, args.decode_at, args.format))
    for note in cost.notes:
        print(f"note: {note}")
    if args.json:
        args.json.write_text(json.dumps(document, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def _tools_table(cost: StepCost, model: Any, prompt: int, context: int, tablefmt: str) -> str:
    """Each analytic tool's FLOPs beside flopscope's, per phase, with the causes of the
    difference (:func:`flopscope.predict.serving_tools.explain`)."""
    config = model.config.to_dict()
    rows = []
    for tool in TOOLS.values():
        for phase, ours in (("prefill", cost.request(prompt, 0)), ("decode", cost.request(1, context))):
            if phase not in tool.phases:
                continue
            try:
                found = explain(tool, ours, config, phase=phase, prompt=prompt, context=context)
            except ConfigurationError as refused:
                rows.append([tool.name, phase, "-", "-", "-", f"not modelled: {refused}"])
                continue
            theirs, mine = sum(r.tool_flops for r in found), sum(r.flopscope_flops for r in found)
            causes: dict[str, int] = {}
            for row in found:
                for name, flops in row.causes:
                    causes[name] = causes.get(name, 0) + flops
            named = "; ".join(f"{name} {flops:+,}" for name, flops in causes.items() if flops)
            rows.append([tool.name, phase, f"{theirs:,}", f"{mine:,}", f"{(theirs - mine) / mine:+.2%}", named])
    title = (f"the analytic tools beside flopscope: FLOPs of a prefill of {prompt} and of one decode step at "
             f"{context} (flopscope: the attention core as executed, logits of the last position)")
    return title + "\n" + tabulate(rows, headers=["tool", "phase", "tool FLOPs", "flopscope FLOPs", "difference",
                                                  "causes (FLOPs)"], tablefmt=tablefmt, disable_numparse=True)


def _sweep_table(cost: StepCost, args: argparse.Namespace) -> str:
    """A step of ``--batch`` decodes at each context of ``--decode-sweep``: FLOPs, bytes,
    intensity; on ``--device``, its roofline and the first context that is
    compute-bound."""
    rows, turned = [], None
    for c in args.decode_sweep:
        step = [(1, c)] * args.batch
        flops, moved = 2 * sum(cost.iteration(step).values()), cost.iteration_bytes(step)
        row = [f"{c:,}", f"{flops:,}", f"{moved:,}", f"{flops / moved:.2f}"]
        if args.device:
            price = cost.price(step, device=args.device, dtype=args.dtype)
            row += [price.bound, f"{price.seconds * 1e3:.3f}"]
            if price.bound == "compute" and turned is None:
                turned = c
        rows.append(row)
    headers = ["context", "FLOPs", "bytes", "FLOPs per byte"] + (["bound", "ms (at least)"] if args.device else [])
    title = f"a step of {args.batch} decode(s) against the context"
    if args.device:
        title += (f": compute-bound on {args.device} from c = {turned:,}" if turned is not None else
                  f": memory-bound on {args.device} at every context listed")
    return title + "\n" + tabulate(rows, headers=headers, tablefmt=args.format, disable_numparse=True)
