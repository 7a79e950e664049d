"""The counters people use, on the 17 public cases, against the closed form: the table of docs/peers.md §8.

    python benchmarks/peers.py [--only 1a,5_gpt2] [--threads 2] [--markdown docs/peers_table.md]

The cases are the suite's (``tests/zoo.py``'s ``CASES``: the attention variants, the fused ``nn.MultiheadAttention``
/ encoder-layer fast paths, BERT, GPT-2, Llama and ViT from their configs, Conv1d, LSTM), each with its exact
closed form in MACs (``tests/closed_forms.py``). Each case runs once through :func:`flopscope.crosscheck` with every
installed peer (``flopscope.peers.TOOLS``: PyTorch's ``FlopCounterMode``, fvcore, thop, DeepSpeed's flops profiler,
calflops, torchprofile), each on its own copy of the model, in its own unit converted to MACs, with what it leaves
behind undone before the next (``PeerCount.leaks``). Printed, every number from this run:

- per tool: how many cases it counts exactly (== the closed form), within 0.5 %, and the others with their ratio
  (or the error);
- per case and tool, the ratio to the closed form;
- for DeepSpeed, calflops and torchprofile, every difference from flopscope as ``crosscheck`` explains it, and
  whether any MAC of a difference is left unexplained.

flopscope itself is the ``mode="real"`` profile ``crosscheck`` makes. Torch CPU, no_grad, eval mode, float32.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # the flopscope checkout
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))  # zoo.py, closed forms
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from flopscope.peers import TOOLS, Crosscheck, crosscheck

from zoo import CASES, fastpath  # tests/: the cases and their closed forms

DISTRIBUTIONS = {"FlopCounterMode": "torch", "fvcore": "fvcore", "thop": "ultralytics-thop",
                 "deepspeed": "deepspeed", "calflops": "calflops", "torchprofile": "torchprofile"}
LABELS = {"FlopCounterMode": "FlopCounterMode", "deepspeed": "DeepSpeed flops profiler"}
EXPLAINED = ("deepspeed", "calflops", "torchprofile")
NEAR = 0.005  # "within 0.5 %"


def version(tool: str) -> str | None:
    try:
        return importlib.metadata.version(DISTRIBUTIONS[tool])
    except importlib.metadata.PackageNotFoundError:
        return None


def run(names: list[str]) -> dict[str, tuple[int, Crosscheck]]:
    results = {}
    for name in names:
        case = CASES[name]
        model, args, kwargs = case.build()
        start = time.perf_counter()
        with fastpath(case.fastpath), torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            results[name] = (case.total, crosscheck(model, *args, **kwargs))
        print(f"  {name}: {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    return results


def ratio_text(macs: int | None, expected: int) -> str:
    return "error" if macs is None else "1" if macs == expected else f"{macs / expected:.4f}"


def summary(results: dict[str, tuple[int, Crosscheck]], tools: list[str]) -> list[str]:
    lines = [f"| tool (version) | exact of {len(results)} | within 0.5 % | misses |", "|---|---|---|---|"]
    rows = [("flopscope", {name: (cc.macs, None) for name, (_, cc) in results.items()})]
    rows += [(tool, {name: (cc[tool].macs, cc[tool].error) for name, (_, cc) in results.items()}) for tool in tools]
    for tool, counts in rows:
        exact, near, misses = [], [], []
        for name, (macs, error) in counts.items():
            expected = results[name][0]
            if macs == expected:
                exact.append(name)
            elif macs is not None and abs(macs / expected - 1) <= NEAR:
                near.append(f"{name} {macs / expected:.4f}")
            else:
                misses.append(f"{name} " + (f"{macs / expected:.4f}" if macs is not None else
                                            f"error ({(error or '').split(':')[0]})"))
        label = "flopscope" if tool == "flopscope" else f"{LABELS.get(tool, tool)} ({version(tool)})"
        lines.append(f"| {label} | {len(exact)} | {len(near)}{': ' + ', '.join(near) if near else ''} | "
                     f"{', '.join(misses) or 'none'} |")
    return lines


def matrix(results: dict[str, tuple[int, Crosscheck]], tools: list[str]) -> list[str]:
    lines = ["| case | closed form (MACs) | flopscope | " + " | ".join(LABELS.get(t, t) for t in tools) + " |",
             "|---|---|---|" + "---|" * len(tools)]
    for name, (expected, cc) in results.items():
        cells = [ratio_text(cc.macs, expected)] + [ratio_text(cc[t].macs, expected) for t in tools]
        lines.append(f"| {name} | {expected:,} | " + " | ".join(cells) + " |")
    return lines


def explanations(results: dict[str, tuple[int, Crosscheck]], tools: list[str]) -> list[str]:
    lines = []
    for tool in (t for t in EXPLAINED if t in tools):
        unexplained = [name for name, (_, cc) in results.items() if cc[tool].unexplained]
        lines += ["", f"{tool}: differences from flopscope, as crosscheck explains them "
                      f"(unexplained MACs in {', '.join(unexplained) or 'no case'})", ""]
        for name, (_, cc) in results.items():
            for line in cc[tool].lines():
                lines.append(f"- {name}: {line.removeprefix(tool + ': ')}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated case names or prefixes (default: all 17)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--markdown", type=Path, help="also write the output to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    prefixes = args.only.split(",") if args.only else None
    names = [n for n in CASES if prefixes is None or any(n.startswith(p) for p in prefixes)]
    tools = [t for t in TOOLS if version(t) is not None]
    results = run(names)
    header = (f"torch {torch.__version__}, transformers {version_of('transformers')}, "
              f"{torch.get_num_threads()} threads; ratio to the closed form (1 = exact)")
    out = [header, "", *summary(results, tools), "", *matrix(results, tools), *explanations(results, tools)]
    text = "\n".join(out)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    return 0


def version_of(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


if __name__ == "__main__":
    raise SystemExit(main())
