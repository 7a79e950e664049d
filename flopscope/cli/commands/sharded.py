"""``flopscope profile TARGET --tp T [--dp D]``: rank 0 of a fake world, counted.

The model is built on meta, sharded with its own Hugging Face plan on a fake world of
D x T ranks, and rank 0 is counted on fake tensors. It prints MACs per role beside the
unsharded model's, the collectives against Megatron-LM's closed form, FSDP's collectives
per decoder layer (predicted: FSDP2 does not run on fake tensors) and the bytes
communicated per MAC (:mod:`flopscope.workloads.distributed`).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any

import torch

from ...api import profile
from ...conventions import EXECUTED
from ...errors import FlopscopeError
from ...predict.communication import compare as compare_collectives
from ...workloads import distributed as dist
from .._common import write_reports
from .._options import as_positive
from ..targets import load_target, make_inputs


def add_options(parser: argparse.ArgumentParser) -> None:
    """``--tp`` and ``--dp``, the options of ``profile`` that shard the model."""
    parser.add_argument("--tp", type=as_positive, metavar="T",
                        help="tensor-parallel ranks: shard the model (built on meta) with its own "
                             "Hugging Face plan on a fake world and count rank 0 on fake tensors: "
                             "MACs per role beside the unsharded model's, its collectives against "
                             "Megatron-LM, bytes per MAC per layer")
    parser.add_argument("--ep", action="store_true",
                        help="with --tp: split a mixture of experts' experts over the T ranks too (expert "
                             "parallelism, as transformers' ep_size = tp_size); on fake tensors every route is "
                             "counted on this rank's experts, an upper bound (the notes say so)")
    parser.add_argument("--dp", "--fsdp", type=as_positive, default=1, metavar="D",
                        help="data-parallel (FSDP) ranks with --tp (mesh D x T): FSDP's "
                             "collectives per decoder layer, predicted (FSDP2 does not run on fake "
                             "tensors)")


def run(args: argparse.Namespace) -> int:
    """Count rank 0 of a fake world of ``--dp`` x ``--tp`` ranks, and what it sends."""
    conflicts = [flag for flag, given in (("--sweep", args.sweep), ("--plot", args.plot),
                                          ("--mode real", args.mode == "real"),
                                          (f"--attention {args.attention}", args.attention != EXECUTED)) if given]
    usage = ("--dp needs --tp (--tp 1: data parallel only)" if args.tp is None and args.dp > 1
             else "--ep splits the experts over the --tp ranks: give --tp T (T > 1) and no --dp"
             if args.ep and (args.tp is None or args.tp < 2 or args.dp > 1)
             else f"--tp counts on fake tensors; it cannot be combined with {', '.join(conflicts)}" if conflicts
             else None)
    if usage is not None:
        print(f"flopscope profile: error: {usage}", file=sys.stderr)
        return 2
    tp, dp = args.tp, args.dp
    # nothing allocated: any size counts
    target, build = _target_and_inputs(args, device="meta")
    model = target.model
    # before anything is counted
    dist.check_tensor_parallel(model, tp)
    inputs, kwargs = build(None)
    ids = next((t for t in (*inputs, *kwargs.values()) if isinstance(t, torch.Tensor)), None)
    parameters = sum(p.numel() for p in model.parameters())
    world = dp * tp
    print(f"{target.description}: {parameters:,} parameters; rank 0 of a fake world of {world} "
          f"ranks (mesh dp {dp} x "
          f"tp {tp}), counted on fake tensors", flush=True)
    with torch.no_grad() if not args.backward else torch.enable_grad():
        unsharded = profile(model, *inputs, mode="fake", backward=args.backward, **kwargs)
        with dist.fake_world(world, mesh_shape=(dp, tp), mesh_dim_names=("dp", "tp")) as mesh:
            dist.tensor_parallel(model, mesh, experts=args.ep)
            prof = profile(model, *inputs, mode="fake", backward=args.backward, **kwargs)
            units = dist.fsdp_units(model)
            predicted = None
            if ids is not None and ids.dim() == 2:
                # not a decoder with a width and layers
                with contextlib.suppress(FlopscopeError):
                    predicted = dist.predicted_collectives(model, ids.shape[0], ids.shape[1],
                                                           backward=args.backward)
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
        print(f"\nFSDP over {dp} data-parallel ranks, per decoder-layer unit: predicted (FSDP2 "
              "does not run on fake tensors):")
        print(dist.fsdp_table(units, dp, backward=args.backward, tablefmt=args.format))
    print("\ncommunication per MAC (collective message bytes per multiply-accumulate of this rank):")
    fsdp_backward = args.backward if dp > 1 else None
    print(dist.communication_per_mac(prof, units, fsdp_backward=fsdp_backward,
                                     tablefmt=args.format))
    write_reports(args, prof)
    return 0


def _target_and_inputs(args: argparse.Namespace, device: str | None = None) -> tuple[Any, Any]:
    """The target of ``args``, built on ``device``, and the builder of its inputs.

    The inputs follow ``--input`` and ``--dtype``. A sequence longer than the model's
    position table is refused here, before any input is built.
    """
    target = load_target(args.target, args.set, device)
    return target, make_inputs(target, args.input, args.dtype)
