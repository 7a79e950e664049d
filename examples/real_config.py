"""The count of *the* Llama-3.1-8B, from its own config.json: no weights, built on meta,
counted on fake tensors.

    python examples/real_config.py [--n 2048] [--layers 32]

The same from the command line: ``flopscope profile path/to/config.json --input 1x2048``
(a file, or the directory holding it), or ``flopscope profile
hf:meta-llama/Llama-3.1-8B`` to fetch the config.json from the hub.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

import flopscope
from flopscope.cli.targets import load_target

# the published config.json (the values that matter for the count): GQA 32/8, llama3
# rope
LLAMA_3_1_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
    "rope_theta": 500000.0, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
    "rms_norm_eps": 1e-05, "hidden_act": "silu", "bos_token_id": 128000,
    "eos_token_id": 128001,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"}}


def main(argv: list[str] | None = None) -> flopscope.Profile:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=2048, help="tokens in the forward")
    parser.add_argument("--layers", type=int,
                        help="fewer layers than the config's 32 (a quicker run)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        # as downloaded from the model card
        (Path(tmp) / "config.json").write_text(json.dumps(LLAMA_3_1_8B))
        # the CLI's --set
        settings = [f"num_hidden_layers={args.layers}"] if args.layers else []
        target = load_target(str(Path(tmp) / "config.json"), settings)
    # LlamaForCausalLM on device="meta", in bfloat16: nothing allocated
    model = target.model
    parameters = sum(p.numel() for p in model.parameters())
    ids = torch.zeros(1, args.n, dtype=torch.long)
    prof = flopscope.profile(model, ids, mode="fake")

    config = model.config
    layers, d, vocab = config.num_hidden_layers, config.hidden_size, config.vocab_size
    per_token = prof.total() // args.n
    # every weight multiplies once per token, except the embedding table (a lookup) and
    # the RMSNorm scales; then attention's scores and weighted sum over the n keys
    # (counted densely, as the kernel runs): 2·L·n·d per token
    weights = parameters - vocab * d - (2 * layers + 1) * d
    attention = 2 * layers * args.n * d
    print(f"Llama-3.1-8B ({type(model).__name__}, {layers} layers): {parameters:,} "
          f"parameters, {prof.total():,} MACs = {prof.total_flops():,} FLOPs for "
          f"{args.n:,} tokens")
    print(f"per token: {per_token:,} MACs = {weights:,} (a MAC per weight) + "
          f"{attention:,} (attention, 2·L·n·d)")
    for role, macs in prof.by_role().items():
        if macs:
            print(f"  {role:<18} {macs:>22,}  {100 * macs / prof.total():5.1f} %")
    return prof


if __name__ == "__main__":
    main()
