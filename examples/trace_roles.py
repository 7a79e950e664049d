"""Roles in traces: flopscope's own trace of a GPT-2 forward, role ranges over a
torch.profiler trace of the same run, and the timeline as a PNG (docs/trace_gpt2.png is
this script's, at its defaults).

    python examples/trace_roles.py [--out traces/] [--png docs/trace_gpt2.png]

Open the two JSON files in https://ui.perfetto.dev or chrome://tracing.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel

import flopscope
from flopscope.render.plots import trace_plot
from flopscope.render.trace import merge_torch_trace


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("traces"))
    parser.add_argument("--png", type=Path, help="default: OUT/trace.png")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--n", type=int, default=128)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=50257)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    config = GPT2Config(n_layer=args.layers, n_embd=args.width, n_head=args.heads,
                        vocab_size=args.vocab)
    model = GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, args.vocab, (1, args.n))

    with torch.no_grad():
        model(ids)  # warm up, so that first-call costs stay out of the measured times
        # 1. flopscope alone: each op at its measured start and duration, on the track
        # of its role
        prof = flopscope.profile(model, ids, mode="real")
        own = prof.export_chrome_trace(args.out / "flopscope_trace.json")

        # 2. the same kind of run under torch.profiler: trace=True makes every module
        # call a range
        activities = [torch.profiler.ProfilerActivity.CPU]
        with torch.profiler.profile(activities=activities) as torch_prof, \
                flopscope.profiler(model, mode="real", trace=True) as recorder:
            model(ids)
    torch_prof.export_chrome_trace(str(args.out / "torch_trace.json"))
    # roles on torch's own events
    merged = merge_torch_trace(args.out / "torch_trace.json", recorder.result)
    (args.out / "torch_trace_roles.json").write_text(json.dumps(merged))
    module_ranges = {e.key: e.count for e in torch_prof.key_averages()
                     if e.key.startswith("flopscope/")}

    roles_file = args.out / "torch_trace_roles.json"
    print(f"{prof.total():,} MACs; wrote {own} and {roles_file}")
    matched = merged["otherData"]["flopscope"]["matched_ops"]
    print(f"torch.profiler's key_averages() groups by {len(module_ranges)} module "
          f"ranges, such as {', '.join(list(module_ranges)[:3])}; roles matched to "
          f"{matched} of torch's op events")
    title = (f"GPT-2, {args.layers} layers, n = {args.n}: "
             "ops by role at their measured times")
    png = trace_plot(own, args.png or args.out / "trace.png", title=title)
    print("wrote", png)
    return {"profile": prof, "trace": json.loads(own.read_text()), "merged": merged,
            "module_ranges": module_ranges, "png": png}


if __name__ == "__main__":
    main()
