"""Generation step by step, FLOPs per generated token, and the roofline: decode is
memory-bound.

    python examples/generation_roofline.py [--prompt 32] [--new 8] [--out roofline.png]

A tiny Llama (random weights, bf16) generates for real inside a profiler block: one
prefill, then one decode forward per new token against the KV cache. Each step's MACs
and bytes are exact; the decode steps give FLOPs per token as an exact polynomial in the
context c. On an H100 SXM in bf16 the ridge is ~295 FLOPs per byte: anything below it
waits on memory. Then a 7B shape, built on the meta device (nothing allocated): one
decode step at context 2,048 reads every weight for one token (about 1 FLOP per byte:
memory-bound), a 2,048-token prefill reuses each weight 2,048 times (compute-bound).
"""

from __future__ import annotations

import argparse
import inspect

import torch
from tabulate import tabulate
from transformers import LlamaConfig, LlamaForCausalLM

import flopscope
from flopscope.workloads.generation import steps_table
from flopscope.workloads.roofline import roofline

H100 = {"device": "H100 SXM", "dtype": torch.bfloat16}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new", type=int, default=8)
    parser.add_argument("--out", default="roofline.png")
    args = parser.parse_args(argv)

    # 1. a tiny Llama generates; every forward in the block is a step
    config = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=1000)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    ids = torch.randint(1, config.vocab_size, (1, args.prompt))
    with torch.no_grad(), flopscope.profiler(model, mode="real") as prof:
        model.generate(ids, attention_mask=torch.ones_like(ids),
                       max_new_tokens=args.new, min_new_tokens=args.new,
                       do_sample=False, pad_token_id=0)
    steps = prof.steps()
    print(steps_table(steps))

    # 2. per generated token: exact polynomials in the context c, per role (MACs per
    # sequence)
    scaling = prof.decode_scaling()
    per_token = scaling.total()  # every role together
    assert per_token is not None  # every role is a polynomial of the context here
    kv = scaling.attention()  # scores + weighted sum: the part that reads the KV cache
    terms = ((per_token, 1), (per_token, 0), (kv, 1))
    slope, constant, kv_slope = (int(2 * p.coefficient(i)) for p, i in terms)
    print(f"\nFLOPs per generated token at context c: {slope:,}·c + {constant:,} "
          f"(KV cache: {kv_slope:,}·c)")

    # 3. the roofline of those steps on an H100 (the tiny model at batch 1 is
    # memory-bound throughout); a named device: the times measured on this CPU are left
    # out
    tiny = roofline(prof, **H100)
    print(tiny.to_table())
    print("wrote", tiny.plot(args.out, title="tiny Llama, batch 1, on H100 SXM (bf16)"))

    # 4. a 7B shape on the meta device: a decode step at context 2,048 and a 2,048-token
    # prefill
    big = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=32, vocab_size=32000)
    with torch.device("meta"):
        llama_7b = LlamaForCausalLM(big).to(torch.bfloat16).eval()
        arguments = inspect.signature(llama_7b.forward).parameters
        key = "cache" if "cache" in arguments else "past_key_values"  # 5.x
        prompt = torch.zeros(1, 2048, dtype=torch.long)
        cache = llama_7b(prompt, use_cache=True)[key]  # 2,048 positions
    one = torch.zeros(1, 1, dtype=torch.long)
    decode = flopscope.profile(llama_7b, one, mode="fake", **{key: cache})
    prefill = flopscope.profile(llama_7b, prompt, mode="fake")
    at_decode, at_prefill = roofline(decode, **H100), roofline(prefill, **H100)
    rows = [[p.name, f"{p.intensity:.2f}", p.bound, f"{q.intensity:.1f}", q.bound]
            for p, q in zip(at_decode.roles, at_prefill.roles, strict=True) if p.flops]
    print(f"\n7B shape (bf16) on H100 SXM, ridge {at_decode.ridge:.0f} FLOPs/byte:")
    headers = ["role", "decode FLOPs/byte", "bound", "prefill FLOPs/byte", "bound"]
    print(tabulate(rows, headers=headers, disable_numparse=True))
    return {"steps": steps, "scaling": scaling, "roofline": tiny, "decode": at_decode,
            "prefill": at_prefill}


if __name__ == "__main__":
    main()
