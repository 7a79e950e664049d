"""How long does an exact scaling sweep take? Five lengths of the Llama-7B shape, on fake tensors.

    python benchmarks/scaling_speed.py [--reps 5]

The model (32 layers, d 4096, 32 heads, d_ff 11008) is built on device="meta"; each repetition runs
``flopscope.scaling`` over n = 128, 256, 512, 1024, 2048 after a ``gc.collect()`` and prints the median
wall time (target: under 3 s) and the recovered polynomials.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import flopscope


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096)
    with torch.device("meta"):
        model = LlamaModel(config)

    def make_inputs(n: int) -> torch.Tensor:
        return torch.zeros((1, n), dtype=torch.long, device="meta")

    lengths = (128, 256, 512, 1024, 2048)
    flopscope.scaling(model, make_inputs, lengths=(16, 32, 64, 128))  # warm-up: imports, fake-tensor caches
    times = []
    for _ in range(args.reps):
        gc.collect()
        start = time.perf_counter()
        result = flopscope.scaling(model, make_inputs, lengths=lengths)
        times.append(time.perf_counter() - start)
    print(result.to_table())
    print(f"\nsweep of {len(lengths)} lengths, Llama-7B shape on meta: median {statistics.median(times):.2f} s "
          f"(min {min(times):.2f}, max {max(times):.2f}, {args.reps} runs; target < 3 s)")


if __name__ == "__main__":
    main()
