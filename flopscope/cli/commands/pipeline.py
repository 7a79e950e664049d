"""``flopscope profile diffusers:SOURCE``: one call of a diffusers pipeline, counted.

The pipeline's components are built from their configs on meta and counted on fake
tensors (:mod:`flopscope.workloads.pipeline`,
:mod:`flopscope.workloads.pipeline_configs`). It prints the call by component, by
denoising step, by role and component, and as a workload.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from typing import Any

import torch
from tabulate import tabulate

from ...errors import FlopscopeError
from ...workloads.pipeline import profile_pipeline
from ...workloads.pipeline_configs import pipeline_from_configs
from .._common import write_reports
from .._options import as_image_size, as_positive
from ..settings import parse_settings


def add_options(parser: argparse.ArgumentParser) -> None:
    """The options of ``profile`` only a ``diffusers:`` target takes, as one group."""
    pipeline = parser.add_argument_group("diffusers:SOURCE targets (a pipeline folder or hub repo, "
                                         "built from its configs on meta: one whole generation, by "
                                         "component and by step)")
    pipeline.add_argument("--steps", type=as_positive, metavar="N",
                          help="denoising steps (default: the pipeline's)")
    pipeline.add_argument("--size", type=as_image_size, metavar="HxW",
                          help="image size in pixels, e.g. 1024x1024")
    pipeline.add_argument("--frames", type=as_positive, metavar="F",
                          help="video frames (video pipelines)")
    pipeline.add_argument("--guidance", type=float, metavar="G",
                          help="guidance_scale (default: the pipeline's)")
    pipeline.add_argument("--prompt", default="a photo of a cat",
                          help="the prompt (only its padded length counts)")


def run(args: argparse.Namespace) -> int:
    """Count one call of the pipeline ``args.target`` on fake tensors, and print it."""
    conflicts = [flag for flag, given in (("--input", args.input), ("--sweep", args.sweep),
                                          ("--backward", args.backward),
                                          ("--tp", args.tp is not None),
                                          ("--dp", args.dp > 1), ("--plot", args.plot),
                                          ("--mode real", args.mode == "real")) if given]
    if conflicts:
        print("flopscope profile: error: a diffusers: target counts one pipeline call on fake "
              "tensors; it cannot be "
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
        raise FlopscopeError(f"{type(pipe).__name__} takes no {', '.join(unknown)} (from --steps / "
                             "--size / --frames / --guidance / --prompt)")
    modules = {name: c for name, c in pipe.components.items() if isinstance(c, torch.nn.Module)}
    parameters = sum(p.numel() for m in modules.values() for p in m.parameters())
    print(f"diffusers:{source} ({type(pipe).__name__}): {parameters:,} parameters in "
          f"{len(modules)} components "
          "(built on meta: nothing allocated)", flush=True)
    with torch.no_grad():
        prof = profile_pipeline(pipe, **call)
    print(prof.summary_table(args.format))
    print(f"\ndenoising steps ({len(prof.steps())}; denoiser: "
          f"{', '.join(prof.denoisers) or 'none found'}):")
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
    # written above: the other reports are the whole call's profile
    args.json = None
    html_path, args.html = args.html, None
    write_reports(args, prof.profile)
    if html_path:
        # the whole call's page, with the pipeline's section
        print(f"wrote {prof.to_html(html_path, title=f'flopscope: {args.target}')}")
    return 0


def _pipeline_json(target: str, call: dict[str, Any], prof: Any) -> dict[str, Any]:
    """The ``--json`` document of a pipeline call (schema ``flopscope.pipeline/1``)."""
    return {"schema": "flopscope.pipeline/1", "target": target, "call": call,
            "units": "MACs (FLOPs = 2 x MACs)",
            "total": prof.total(), "components": prof.by_component(),
            "roles": prof.by_component_role(),
            "denoisers": list(prof.denoisers),
            "steps": [{"step": s.step, "macs": dict(s.macs), "calls": dict(s.calls),
                       "latents_batch": s.batch,
                       "denoiser_batch": s.denoiser_batch, "guidance": s.guidance} for s in prof.steps()],
            "workload": [{"component": t.component, "entry": t.entry, "calls": t.calls,
                          "macs_per_call": t.macs_per_call, "steps": t.steps, "passes": t.passes,
                          "batch": t.batch,
                          "guidance": t.guidance} for t in prof.workload().terms],
            "reuse": list(prof.reuse)}
