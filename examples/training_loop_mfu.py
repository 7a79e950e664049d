"""MFU in a plain PyTorch training loop: price every batch exactly (padded or not) and
divide by the peak.

    python examples/training_loop_mfu.py --steps 5

The batches have random lengths, as in fine-tuning: ``flops_per_batch`` traces the model
at a few lengths once, then prices each batch from exact polynomials (forward +
backward) without tracing again. The peak is this CPU's measured GEMM throughput
(``flopscope peak``); on a GPU, ``Throughput`` looks up its dense datasheet peak, or
takes ``peak=``.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

import flopscope
from flopscope.hardware.probes import measure_cpu_peak


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=2)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    vocab = 1000
    config = GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=vocab,
                        n_positions=256)
    model = GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    # what training differentiates; the pricer counts the same backward
    def loss_of(output):
        return output.logits.float().mean()

    pricer = flopscope.flops_per_batch(model,
                                       lambda n: torch.zeros(1, n, dtype=torch.long),
                                       lengths=(8, 16, 32, 64, 128), loss=loss_of)
    meter = flopscope.Throughput(pricer, peak=measure_cpu_peak(torch.float32))
    steps = []
    for _ in range(args.steps):
        length = int(torch.randint(16, 128, ()))
        ids = torch.randint(0, vocab, (args.batch, length))
        start = time.perf_counter()
        logits = model(ids).logits[:, :-1].flatten(0, 1)
        loss = torch.nn.functional.cross_entropy(logits, ids[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        step = meter.update(ids, seconds=time.perf_counter() - start)
        steps.append({"length": length, **step})
        print(f"n={length:4d}: {step['flops']:,} FLOPs, "
              f"{step['flops_per_sec'] / 1e9:,.2f} GFLOP/s, MFU {step['mfu']:.1%} of "
              f"{step['peak'] / 1e9:,.1f} GFLOP/s (this CPU's measured fp32 GEMM peak)")
    total = meter.summary()
    print(f"{total['steps']} steps: {total['flops']:,} FLOPs, MFU {total['mfu']:.1%}")
    return steps


if __name__ == "__main__":
    main()
