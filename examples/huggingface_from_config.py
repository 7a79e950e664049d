"""Wrap a Hugging Face model built from its config (no download) and read where its
multiplies go.

    python examples/huggingface_from_config.py [--layers 4] [--n 128]
"""

from __future__ import annotations

import argparse

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import flopscope
from flopscope.render import text as report


def main(argv: list[str] | None = None) -> flopscope.Profile:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--n", type=int, default=128)
    args = parser.parse_args(argv)
    config = LlamaConfig(hidden_size=512, intermediate_size=1376,
                         num_hidden_layers=args.layers, num_attention_heads=8,
                         num_key_value_heads=2, vocab_size=32000)
    model = LlamaForCausalLM(config).eval()
    ids = torch.randint(0, config.vocab_size, (1, args.n))
    prof = flopscope.profile(model, ids)  # fake tensors: nothing is computed
    print(f"{prof.total():,} MACs = {prof.total_flops():,} FLOPs for {args.n} tokens")
    print(report.role_table(prof))
    print(prof.reconcile().to_table())
    print(prof.model_formulas().to_table())
    return prof


if __name__ == "__main__":
    main()
