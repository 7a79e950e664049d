"""A 70B-shaped Llama trained with tensor parallel 8 x FSDP 8 on 64 GPUs, counted on one
CPU in seconds.

    python examples/distributed_70b.py [--layers 80] [--tokens 4096] [--tp 8] [--dp 8]

The model (Llama-3-70B's shape: 80 layers, width 8,192, 64 query heads, 8 key/value
heads, SwiGLU FFN 28,672, vocabulary 128,256) is built on ``device="meta"`` in bf16:
nothing is allocated. A fake world of 64 ranks (``fake_world`` of
``flopscope.workloads.distributed``: torch's fake process group, mesh ("dp", "tp")) lets
the model be sharded with its own Hugging Face tensor-parallel plan
(``tensor_parallel``); one forward and backward of a 4,096-token sequence is then
counted on fake tensors as rank 0 runs it: its MACs per role beside the unsharded
model's (every projection and the attention core 1/8, the LM head too), every collective
it issues against Megatron-LM's closed form, and the communication per MAC of each
layer. FSDP2 cannot run on fake tensors, so its collectives over the 8 data-parallel
ranks are predicted from the bytes of each layer's shard.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import flopscope
from flopscope.predict.communication import compare
from flopscope.workloads import distributed as dist


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=80)
    parser.add_argument("--width", type=int, default=8192)
    parser.add_argument("--heads", type=int, default=64)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--ffn", type=int, default=28672)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--tokens", type=int, default=4096, help="sequence length")
    parser.add_argument("--batch", type=int, default=1, help="sequences per rank")
    parser.add_argument("--tp", type=int, default=8, help="tensor-parallel ranks")
    parser.add_argument("--dp", type=int, default=8, help="data-parallel (FSDP) ranks")
    args = parser.parse_args(argv)

    config = LlamaConfig(hidden_size=args.width, intermediate_size=args.ffn,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.kv_heads, vocab_size=args.vocab)
    with torch.device("meta"):  # no memory: every parameter is a shape
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    seeded = torch.Generator().manual_seed(0)
    ids = torch.randint(0, args.vocab, (args.batch, args.tokens), generator=seeded)
    parameters = sum(p.numel() for p in model.parameters())

    started = time.perf_counter()
    # one device, for the comparison
    unsharded = flopscope.profile(model, ids, mode="fake", backward=True)
    seconds_unsharded = time.perf_counter() - started
    world = args.dp * args.tp
    shape, names = (args.dp, args.tp), ("dp", "tp")
    with dist.fake_world(world, mesh_shape=shape, mesh_dim_names=names) as mesh:
        dist.tensor_parallel(model, mesh)  # the model's own plan, on the "tp" dimension
        started = time.perf_counter()
        prof = flopscope.profile(model, ids, mode="fake", backward=True)  # rank 0
        seconds_sharded = time.perf_counter() - started
        # the root, then each decoder layer: this rank's parameter bytes
        units = dist.fsdp_units(model)
        predicted = dist.predicted_collectives(model, args.batch, args.tokens,
                                               backward=True)

    print(f"Llama {parameters / 1e9:.1f}B ({args.layers} layers, d {args.width}, "
          f"{args.heads} heads, {args.kv_heads} KV heads, FFN {args.ffn}, "
          f"vocab {args.vocab}) in bf16 on meta; TP {args.tp} x DP {args.dp} = "
          f"{world} ranks (fake world); one forward + backward of {args.batch} x "
          f"{args.tokens} tokens per rank; counted in {seconds_unsharded:.1f} s "
          f"unsharded, {seconds_sharded:.1f} s as rank 0\n")
    print("MACs by role, forward + backward "
          "(share: this rank's part of the unsharded model's):")
    print(dist.role_table(prof, unsharded))
    print(f"\ncollectives of rank 0 (tensor parallel, group {args.tp}; layers folded):")
    print(dist.collective_table(prof.collectives()))
    print("\nmeasured against Megatron-LM's closed form (its backward fuses Q/K/V and "
          "gate/up into one all-reduce each; DTensor's plan gives each projection its "
          "own):")
    print(compare(prof.collectives(), predicted))
    print(f"\nFSDP over {args.dp} data-parallel ranks, per decoder-layer unit: "
          "predicted (FSDP2 does not run on fake tensors):")
    print(dist.fsdp_table(units, args.dp))
    print("\ncommunication per MAC "
          "(collective message bytes per multiply-accumulate of this rank):")
    print(dist.communication_per_mac(prof, units, fsdp_backward=True))
    return {"unsharded": unsharded, "sharded": prof, "units": units,
            "predicted": predicted, "seconds": (seconds_unsharded, seconds_sharded)}


if __name__ == "__main__":
    main()
