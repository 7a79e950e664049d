"""Peebles & Xie's DiT Table 4 (Gflops of every DiT) beside flopscope's count of diffusers' DiT, built on meta.

    python benchmarks/dit_table.py [--write docs/dit.md]

For each of the paper's 13 adaLN-Zero configurations (DiT-S/B/L/XL at patch 2, 4, 8 on a 256x256 image, i.e. a
32x32x4 latent, and DiT-XL/2 at 512x512, a 64x64x4 latent) diffusers' ``DiTTransformer2DModel`` is built on
``device="meta"`` with the released checkpoints' arguments (``out_channels=8``: the learned sigma; every other
argument is the class default, as in facebook/DiT-XL-2-256's config) and counted with
``flopscope.profile(..., mode="fake")`` on meta inputs, batch 1. Printed per configuration: the paper's Gflops,
flopscope's MACs, the closed form (which it must equal), the difference to the paper split into its two terms and
what is left, and the seconds the count took (the build on meta is timed apart). ``--write PATH`` replaces the table
between the markers in PATH (docs/dit.md). The explanation of each column is docs/dit.md.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
import warnings
from dataclasses import dataclass

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import flopscope

FREQUENCIES = 256  # the sinusoidal timestep features both implementations feed their timestep MLP
C_IN, C_OUT = 4, 8  # latent channels in; out: noise and the learned diagonal covariance (learn_sigma)
BEGIN, END = "<!-- dit-table:begin -->", "<!-- dit-table:end -->"

SIZES = {"S": (12, 384, 6), "B": (12, 768, 12), "L": (24, 1024, 16), "XL": (28, 1152, 16)}  # paper Table 1: L, d, h


@dataclass(frozen=True)
class Row:
    size: str
    p: int
    image: int
    gflops: float  # Peebles & Xie (ICCV 2023, arXiv 2212.09748v2) Table 4, "Flops (G)"

    @property
    def name(self) -> str:
        return f"DiT-{self.size}/{self.p}"

    @property
    def side(self) -> int:
        return self.image // 8  # the SD VAE's latent: 256² -> 32², 512² -> 64²

    @property
    def n(self) -> int:
        return (self.side // self.p) ** 2


TABLE_4 = [Row("S", 8, 256, 0.36), Row("S", 4, 256, 1.41), Row("S", 2, 256, 6.06),
           Row("B", 8, 256, 1.42), Row("B", 4, 256, 5.56), Row("B", 2, 256, 23.01),
           Row("L", 8, 256, 5.01), Row("L", 4, 256, 19.70), Row("L", 2, 256, 80.71),
           Row("XL", 8, 256, 7.39), Row("XL", 4, 256, 29.05), Row("XL", 2, 256, 118.64),
           Row("XL", 2, 512, 524.60)]


def timestep_mlp(d: int) -> int:
    """Linear(256 -> d), SiLU, Linear(d -> d) on one vector per sample."""
    return FREQUENCIES * d + d * d


def reference_macs(L: int, d: int, p: int, n: int) -> int:  # noqa: N803 L as in the paper
    """facebookresearch/DiT models.py: the timestep MLP once per forward, shared by every block and the final layer."""
    patch = n * d * C_IN * p * p  # Conv2d(4 -> d, kernel p, stride p)
    block = 4 * n * d * d + 2 * n * n * d + 2 * n * d * 4 * d + d * 6 * d  # q,k,v,out; QK^T and AV; FFN d->4d->d; adaLN
    final = d * 2 * d + n * d * p * p * C_OUT  # the final layer's modulation d -> 2d, its projection d -> p²·8
    return patch + timestep_mlp(d) + L * block + final  # the label embedding is a lookup: 0 MACs


def diffusers_macs(L: int, d: int, p: int, n: int) -> int:  # noqa: N803 L as in the paper
    """diffusers' DiTTransformer2DModel: each block's AdaLayerNormZero embeds the timestep again (its own
    CombinedTimestepLabelEmbeddings), and the final layer calls block 0's once more: L + 1 timestep MLPs."""
    return reference_macs(L, d, p, n) + L * timestep_mlp(d)


def layer_norm_elements(L: int, d: int, n: int) -> int:  # noqa: N803 L as in the paper
    """Elements the 2L + 1 LayerNorms normalise (two per block, the final one), n·d each."""
    return (2 * L + 1) * n * d


def build(row: Row) -> torch.nn.Module:
    import diffusers

    L, d, h = SIZES[row.size]
    with torch.device("meta"):
        return diffusers.DiTTransformer2DModel(
            num_attention_heads=h, attention_head_dim=d // h, in_channels=C_IN, out_channels=C_OUT, num_layers=L,
            sample_size=row.side, patch_size=row.p, num_embeds_ada_norm=1000, norm_type="ada_norm_zero").eval()


def count(row: Row) -> tuple[int, int, float, float]:
    """(MACs, LayerNorm elementwise ops, seconds to build on meta, seconds to count)."""
    start = time.perf_counter()
    model = build(row)
    built = time.perf_counter() - start
    meta = dict(hidden_states=torch.empty(1, C_IN, row.side, row.side, device="meta"),
                timestep=torch.zeros(1, dtype=torch.long, device="meta"),
                class_labels=torch.zeros(1, dtype=torch.long, device="meta"))
    start = time.perf_counter()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prof = flopscope.profile(model, **meta, mode="fake")
    counted = time.perf_counter() - start
    return prof.total(), prof.elementwise_by_op().get("aten.native_layer_norm", 0), built, counted


def g(x: float) -> str:
    return f"{x / 1e9:+.4f}"


def table() -> str:
    lines = ["| model | image (latent) | tokens n | paper Gflops | flopscope MACs | = closed form "
             "| flopscope − paper (G) | + L·(256d+d²) (G) | − (2L+1)·n·d (G) | + left (G) | count (s) | build (s) |",
             "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    count(TABLE_4[0])  # warm-up: imports, fake-tensor caches
    for row in TABLE_4:
        L, d, _ = SIZES[row.size]
        macs, norm_ops, built, counted = count(row)
        closed = diffusers_macs(L, d, row.p, row.n)
        extra, norms = L * timestep_mlp(d), layer_norm_elements(L, d, row.n)
        left = macs - extra + norms - round(row.gflops * 1e9)
        # flopscope prices a LayerNorm as 5 elementwise ops per element (docs/conventions.md), never as MACs
        norm_check = "" if norm_ops == 5 * norms else f" (LayerNorm ops {norm_ops:,} != 5·{norms:,})"
        lines.append(
            f"| {row.name} | {row.image}² ({row.side}²×4) | {row.n:,} | {row.gflops:.2f} | {macs:,} | "
            f"{'yes' if macs == closed else f'**no: {closed:,}**'}{norm_check} | {g(macs - row.gflops * 1e9)} | "
            f"{g(extra)} | {g(-norms)} | {g(left)} | {counted:.2f} | {built:.2f} |")
        print(lines[-1], flush=True)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", metavar="PATH", help="replace the table between the markers in PATH")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads\n")
    text = table()
    if args.write:
        with open(args.write, encoding="utf-8") as f:
            doc = f.read()
        pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
        if not pattern.search(doc):
            sys.exit(f"{args.write}: no {BEGIN} ... {END} markers")
        doc = pattern.sub(lambda _: f"{BEGIN}\n{text}\n{END}", doc)
        with open(args.write, "w", encoding="utf-8") as f:
            f.write(doc)
        print(f"\nwrote {args.write}")


if __name__ == "__main__":
    main()
