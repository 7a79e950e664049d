"""What does ``import flopscope`` cost on top of ``import torch``?

Run from the repository root (or anywhere flopscope is installed)::

    python benchmarks/import_time.py              # 7 runs of each, alternating
    python benchmarks/import_time.py --runs 11
    python -X importtime -c "import flopscope"    # where the time goes, module by module

Each run is a fresh ``python -c "import torch"`` or ``python -c "import flopscope"`` process, timed from its
start to its exit (so the interpreter's own start-up is in both); the two alternate (torch first in even rounds,
flopscope first in odd ones) so that a slow drift of the machine touches both alike. Bytecode caching is on for
them (``PYTHONDONTWRITEBYTECODE`` is dropped: an installed package's modules load from ``.pyc`` files, torch's
too; a first run, not timed, writes flopscope's). The repository is put on ``sys.path``. Prints the median of
each and their ratio, of wall time and of CPU time (user + system: on a machine that other work shares, it moves
less with the load); the goal is a ratio of at most 1.1 (``--limit``: exit 1 above it; ``--cpu``: on CPU time).
Also lists the heavy modules that ``import flopscope`` brings in beyond ``import torch`` (DTensor, sympy,
dynamo, transformers, matplotlib, lightning, fvcore, thop): each is imported only when a model, an option or a
command needs it.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch.distributed.tensor", "torch._dynamo", "torch.fx.experimental.symbolic_shapes", "sympy",
         "transformers", "matplotlib", "lightning", "fvcore", "thop")
"""Modules ``import torch`` does not import and ``import flopscope`` must not either."""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # what an installed package gets: its modules read from .pyc files
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def _time(module: str, env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of one fresh ``python -c "import MODULE"``."""
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run([sys.executable, "-c", f"import {module}"], env=env, check=True)
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def heavy_imports(env: dict[str, str] | None = None) -> list[str]:
    """The modules of :data:`HEAVY` that are in ``sys.modules`` after ``import flopscope`` (and were not after
    ``import torch``)."""
    code = ("import sys, torch; before = set(sys.modules); import flopscope; "
            f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules and m not in before))")
    out = subprocess.run([sys.executable, "-c", code], env=env or _env(), check=True, capture_output=True, text=True)
    return out.stdout.split()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="runs of each import (default 7)")
    parser.add_argument("--limit", type=float, default=1.1, help="exit 1 if the ratio is above this (default 1.1)")
    parser.add_argument("--cpu", action="store_true",
                        help="hold the CPU-time ratio to the limit, not the wall-time one (on a machine other work "
                             "shares: CPU time moves less with the load)")
    args = parser.parse_args(argv)
    env = _env()
    _time("flopscope", env)  # warm the file cache (and write the .pyc files) before anything is timed
    times: dict[str, list[tuple[float, float]]] = {"torch": [], "flopscope": []}
    for i in range(args.runs):
        for module in ("torch", "flopscope") if i % 2 == 0 else ("flopscope", "torch"):
            times[module].append(_time(module, env))
    ratios = {}
    for k, kind in enumerate(("wall", "CPU")):
        medians = {module: statistics.median(t[k] for t in runs) for module, runs in times.items()}
        ratios[kind] = medians["flopscope"] / medians["torch"]
        for module, runs in times.items():
            print(f"import {module:9s} {kind:4s} median {medians[module]:.3f} s  "
                  f"({', '.join(f'{t[k]:.2f}' for t in runs)})")
    print(f"ratio {ratios['wall']:.2f} wall, {ratios['CPU']:.2f} CPU (limit {args.limit:.2f} on "
          f"{'CPU' if args.cpu else 'wall'} time; {args.runs} alternating runs of each, fresh processes)")
    heavy = heavy_imports(env)
    print(f"heavy modules imported by flopscope: {', '.join(heavy) if heavy else 'none'}")
    return 0 if ratios["CPU" if args.cpu else "wall"] <= args.limit else 1


if __name__ == "__main__":
    sys.exit(main())
