"""Count a training step: the forward, and the backward with every gradient attributed
to its forward role.

    python examples/training_step.py
"""

from __future__ import annotations

import argparse

import torch
from transformers import GPT2Config, GPT2LMHeadModel

import flopscope


def main(argv: list[str] | None = None) -> flopscope.Profile:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--n", type=int, default=64)
    args = parser.parse_args(argv)
    config = GPT2Config(n_layer=args.layers, n_embd=256, n_head=4, vocab_size=1000)
    model = GPT2LMHeadModel(config)
    ids = torch.randint(0, 1000, (2, args.n))

    def loss(output):  # next-token cross-entropy, as in training
        logits = output.logits[:, :-1].flatten(0, 1)
        return torch.nn.functional.cross_entropy(logits, ids[:, 1:].flatten())

    prof = flopscope.profile(model, ids, backward=True, loss=loss)
    phases = prof.by_phase()
    print(f"forward {phases['forward']:,} MACs, backward {phases['backward']:,} MACs "
          f"({phases['backward'] / phases['forward']:.3f}x; the attention kernel's "
          "backward recomputes its scores)")
    forward, backward = prof.by_role(phase="forward"), prof.by_role(phase="backward")
    for role, macs in forward.items():
        if macs:
            back = backward.get(role, 0)
            print(f"  {role:18s} forward {macs:>14,}  backward {back:>14,} "
                  f"({back / macs:.1f}x)")
    return prof


if __name__ == "__main__":
    main()
