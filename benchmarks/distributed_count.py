"""Counting a rank of a sharded job vs counting the model on one device: the Llama-7B shape at tensor parallel 8.

    python benchmarks/distributed_count.py [--reps 3] [--tokens 2048] [--backward] [--cprofile 25]

Two copies of the model (32 layers, d 4096, 32 heads, d_ff 11008, vocab 32000, with its LM head) are built on
device="meta". One is counted as it is (fake mode, one device); the other is sharded with its own Hugging Face
tensor-parallel plan (``workloads.distributed.tensor_parallel``) on a fake world of 8 ranks and counted as rank 0
(fake mode: DTensor dispatch, local-shard ops, collectives recorded). Each repetition times both, interleaved, after
a ``gc.collect()``; the medians are printed side by side with their ratio (target: sharded <= 1.5x single-device).
``--cprofile N`` profiles one more sharded count with cProfile and prints the N costliest functions (cumulative).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import pstats
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import flopscope
from flopscope.workloads.distributed import fake_world, tensor_parallel

TARGET = 1.5


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--backward", action="store_true", help="count forward and backward (default: forward)")
    parser.add_argument("--cprofile", type=int, default=0, metavar="N", help="print the N costliest functions of a "
                                                                             "sharded count (cProfile, cumulative)")
    args = parser.parse_args(argv)
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=args.layers,
                         num_attention_heads=32, num_key_value_heads=32, vocab_size=32000)
    with torch.device("meta"):
        single, sharded = LlamaForCausalLM(config), LlamaForCausalLM(config)
    ids = torch.zeros((1, args.tokens), dtype=torch.long)
    small = torch.zeros((1, 16), dtype=torch.long)

    def count(model: torch.nn.Module, inputs: torch.Tensor) -> tuple[float, flopscope.Profile]:
        gc.collect()
        start = time.perf_counter()
        prof = flopscope.profile(model, inputs, mode="fake", backward=args.backward)
        return time.perf_counter() - start, prof

    times: dict[str, list[float]] = {"single": [], "sharded": []}
    with fake_world(args.tp) as mesh:
        tensor_parallel(sharded, mesh)
        count(single, small), count(sharded, small)  # warm-up: imports, fake-tensor and DTensor caches
        for _ in range(args.reps):
            seconds, one = count(single, ids)
            times["single"].append(seconds)
            seconds, rank = count(sharded, ids)
            times["sharded"].append(seconds)
        if args.cprofile:
            profiler = cProfile.Profile()
            profiler.enable()
            flopscope.profile(sharded, ids, mode="fake", backward=args.backward)
            profiler.disable()
    single_s, sharded_s = statistics.median(times["single"]), statistics.median(times["sharded"])
    ratio = sharded_s / single_s
    what = "forward + backward" if args.backward else "forward"
    print(f"Llama-7B shape ({args.layers} layers) on meta, {what} of 1 x {args.tokens} tokens, fake mode; "
          f"medians of {args.reps}")
    print(f"  single device:        {single_s:7.2f} s  ({', '.join(f'{t:.2f}' for t in times['single'])})  "
          f"{one.total():,} MACs")
    print(f"  rank 0 of TP {args.tp}:        {sharded_s:7.2f} s  ({', '.join(f'{t:.2f}' for t in times['sharded'])})  "
          f"{rank.total():,} MACs, {sum(r.calls for r in rank.collectives())} collectives")
    print(f"  ratio sharded / single: {ratio:.2f}x (target <= {TARGET}x): {'PASS' if ratio <= TARGET else 'FAIL'}"
          f"  (of the fastest runs: {min(times['sharded']) / min(times['single']):.2f}x)")
    if args.cprofile:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(args.cprofile)
        print(text.getvalue())
    return ratio


if __name__ == "__main__":
    main()
