"""How long does an exact scaling sweep take? Five lengths of the Llama-7B shape, on fake tensors, by profiling
each length (``method="sampled"``) and by one symbolic trace checked at two lengths (``method="symbolic"``).

    python benchmarks/scaling_speed.py [--reps 5] [--layers 32]

The model (32 layers, d 4096, 32 heads, d_ff 11008) is built on device="meta"; the two methods run alternately,
each repetition after a ``gc.collect()``, over n = 128, 256, 512, 1024, 2048. Printed: the polynomials, each
method's median wall time (min, max), the ratio sampled / symbolic (> 1: symbolic faster), and whether the two
methods give identical polynomials and predictions.
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

METHODS = ("symbolic", "sampled")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--layers", type=int, default=32)
    args = parser.parse_args()
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=args.layers,
                         num_attention_heads=32, num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096)
    with torch.device("meta"):
        model = LlamaModel(config)

    def make_inputs(n: int) -> torch.Tensor:
        return torch.zeros((1, n), dtype=torch.long, device="meta")

    lengths = (128, 256, 512, 1024, 2048)
    for method in METHODS:  # warm-up: imports, fake-tensor caches
        flopscope.scaling(model, make_inputs, lengths=(16, 32, 64, 128), method=method)
    times: dict[str, list[float]] = {method: [] for method in METHODS}
    results = {}
    for _ in range(args.reps):
        for method in METHODS:
            gc.collect()
            start = time.perf_counter()
            results[method] = flopscope.scaling(model, make_inputs, lengths=lengths, method=method)
            times[method].append(time.perf_counter() - start)
    symbolic, sampled = results["symbolic"], results["sampled"]
    print(symbolic.to_table())
    print(f"\nLlama-7B shape ({args.layers} layers) on meta, lengths {', '.join(map(str, lengths))}, "
          f"{args.reps} runs each, alternating:")
    for method in METHODS:
        t = times[method]
        print(f"  {method:>8}: median {statistics.median(t):.2f} s (min {min(t):.2f}, max {max(t):.2f})")
    ratio = statistics.median(times["sampled"]) / statistics.median(times["symbolic"])
    print(f"  sampled / symbolic: {ratio:.2f}x   (symbolic method: {symbolic.method}; fall-back: {symbolic.fallback})")
    same = symbolic.polynomials == sampled.polynomials and symbolic.predicted == sampled.predicted
    print(f"  identical polynomials and predictions: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
