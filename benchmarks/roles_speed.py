"""The Llama-7B shape's count with roles, two checkouts side by side.

Each repetition runs one process per checkout (the order alternating), which builds ``LlamaForCausalLM(LlamaConfig())``
on the meta device, counts 2,048 tokens on fake tensors once to warm up, then times ``flopscope.profile(mode="fake")``
and ``.by_role()`` once, and ``find_roles`` (the role passes alone) five times (their minimum). Medians over
repetitions, and the median of the per-repetition ratios (after / before), are printed: the machine's drift cancels in
a ratio of two runs made back to back.

Usage::

    python benchmarks/roles_speed.py --before /path/to/old/checkout [--after .] [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r'''
import sys, time, warnings, gc
sys.path.insert(0, sys.argv[1])
warnings.simplefilter("ignore")
import torch, transformers, flopscope
from flopscope.attribute.roles import find_roles
assert flopscope.__file__.startswith(sys.argv[1]), flopscope.__file__
with torch.device("meta"):
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig())
ids = torch.randint(0, 32000, (1, 2048), device="meta")
with torch.no_grad():
    flopscope.profile(model, ids, mode="fake").by_role()
    gc.collect()
    t0 = time.perf_counter()
    prof = flopscope.profile(model, ids, mode="fake")
    t1 = time.perf_counter()
    prof.by_role()
    t2 = time.perf_counter()
passes = []
for _ in range(5):
    t = time.perf_counter()
    find_roles(prof._ops, prof._facts.types)
    passes.append(time.perf_counter() - t)
print(t1 - t0, t2 - t0, min(passes), prof.total())
'''


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", required=True, help="the other checkout (its flopscope/ is imported)")
    parser.add_argument("--after", default=str(Path(__file__).resolve().parent.parent), help="default: this one")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    roots = {"before": str(Path(args.before).resolve()), "after": str(Path(args.after).resolve())}
    runs: dict[str, list[tuple[float, float, float, int]]] = {name: [] for name in roots}
    for rep in range(args.reps):
        for name in (list(roots) if rep % 2 == 0 else list(roots)[::-1]):
            out = subprocess.run([sys.executable, "-c", CHILD, roots[name]], capture_output=True, text=True,
                                 check=True)
            count, with_roles, passes, total = out.stdout.split()
            runs[name].append((float(count), float(with_roles), float(passes), int(total)))
    for name, values in runs.items():
        count, with_roles, passes = (statistics.median(v[i] for v in values) for i in range(3))
        print(f"{name:6s} profile {count:.3f} s, profile + by_role {with_roles:.3f} s, find_roles {passes * 1e3:.1f} ms"
              f", total {values[0][3]:,} MACs")
    for i, what in ((1, "profile + by_role"), (2, "find_roles")):
        ratios = [a[i] / b[i] for a, b in zip(runs["after"], runs["before"], strict=True)]
        listed = ", ".join(f"{r:.2f}" for r in ratios)
        print(f"after / before, {what}: median {statistics.median(ratios):.3f} ({listed})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
