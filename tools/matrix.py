"""The compatibility matrix: the suite in a fresh virtual environment per cell, one torch and one transformers each.

    python tools/matrix.py                      # every cell, one after the other
    python tools/matrix.py floor newest         # some cells
    python tools/matrix.py --list               # the cells and their versions
    python tools/matrix.py floor -- -x -k fft   # arguments after -- go to pytest
    python tools/matrix.py --venvs DIR floor    # keep the cell's venv in DIR/floor (default: a temporary folder,
                                                # each venv removed once its cell has run)

A cell: ``python -m venv``, then ``pip install torch==T transformers==H -e ".[dev]"`` with a constraints file that
holds those two pins (given as PIP_CONSTRAINT, in place of any machine-wide one, so that no other package moves
them and a release newer than a local cap can be asked for), then the README's ``python -m pytest`` in the
repository root. ``pin`` is CI's torch (the local CPU wheel) with the transformers pip picks for the dev extra;
``floor`` and ``newest`` pin both. torch from the package index is a CUDA build of several GB (it runs on the CPU).
Prints one line per cell (the versions installed, pytest's counts, minutes) and the table at the end; exits 1
if a cell fails. ``.ci/run`` runs ``floor`` and ``newest`` after the pinned suite. The README's compatibility
table holds what these cells measured; pyproject.toml declares floor torch and floor transformers.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Cell:
    torch: str
    transformers: str | None  # None: what pip picks for the dev extra
    about: str


CELLS = {
    "floor": Cell("2.6.0", "5.15.0", "the oldest torch and transformers pyproject.toml admits"),
    "pin": Cell("2.13.0", None, "CI's torch (the local CPU wheel), the newest transformers"),
    "newest": Cell("2.15.0", "5.24.0", "the newest torch and transformers on the index (Python 3.11)"),
}
COUNTS = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)")


@dataclass
class Result:
    name: str
    versions: str
    counts: dict[str, int]
    minutes: float
    ok: bool

    def line(self) -> str:
        counts = ", ".join(f"{n} {kind}" for kind, n in self.counts.items()) or "no tests ran"
        return f"{self.name:7s} {self.versions:40s} {counts} ({self.minutes:.1f} min){'' if self.ok else '  FAILED'}"


def run_cell(name: str, cell: Cell, venvs: Path, pytest_args: list[str]) -> Result:
    start = time.monotonic()
    venv = venvs / name
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    pins = [f"torch=={cell.torch}"] + ([f"transformers=={cell.transformers}"] if cell.transformers else [])
    constraints = venv / "constraints.txt"
    constraints.write_text("\n".join(pins) + "\n")
    env = {**os.environ, "PIP_CONSTRAINT": str(constraints)}
    env.pop("VIRTUAL_ENV", None)
    print(f"== {name}: {' '.join(pins)} ({cell.about})", flush=True)
    install = subprocess.run([python, "-m", "pip", "install", "-q", *pins, "-e", ".[dev]"], cwd=ROOT, env=env,
                             capture_output=True, text=True)
    if install.returncode != 0:
        print(_without_noise(install.stdout + install.stderr), flush=True)
        return Result(name, " ".join(pins), {}, (time.monotonic() - start) / 60, ok=False)
    versions = subprocess.run([python, "-c", "import torch, transformers; "
                               "print(f'torch {torch.__version__}, transformers {transformers.__version__}')"],
                              capture_output=True, text=True, check=True).stdout.strip()
    print(f"   {versions}", flush=True)
    tests = subprocess.run([python, "-m", "pytest", *pytest_args], cwd=ROOT, env=env, capture_output=True, text=True)
    output = tests.stdout + tests.stderr
    summary = next((line for line in reversed(output.splitlines()) if COUNTS.search(line)), "")
    counts = {kind: int(n) for n, kind in COUNTS.findall(summary)}
    if tests.returncode != 0:
        print(output[-20000:], flush=True)
    return Result(name, versions, counts, (time.monotonic() - start) / 60, ok=tests.returncode == 0)


def _without_noise(text: str) -> str:
    """pip's output without its lines about index locations it ignores."""
    return "\n".join(line for line in text.splitlines() if "is ignored: it is neither" not in line)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    pytest_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("cells", nargs="*", help=f"cells to run: {', '.join(CELLS)} (default: all)")
    parser.add_argument("--list", action="store_true", help="list the cells and exit")
    parser.add_argument("--venvs", type=Path, help="keep the venvs in this folder (default: temporary, removed)")
    args = parser.parse_args(argv)
    if args.list:
        for name, cell in CELLS.items():
            print(f"{name:7s} torch {cell.torch:8s} transformers {cell.transformers or '(newest)':9s} {cell.about}")
        return 0
    names = args.cells or list(CELLS)
    unknown = [name for name in names if name not in CELLS]
    if unknown:
        parser.error(f"unknown cell {', '.join(unknown)}; the cells: {', '.join(CELLS)}")
    venvs = args.venvs or Path(tempfile.mkdtemp(prefix="flopscope-matrix-"))
    results = []
    try:
        for name in names:
            results.append(run_cell(name, CELLS[name], venvs, pytest_args))
            print(results[-1].line(), flush=True)
            if args.venvs is None:
                shutil.rmtree(venvs / name, ignore_errors=True)  # several GB each
    finally:
        if args.venvs is None:
            shutil.rmtree(venvs, ignore_errors=True)
    print("\n".join(["", "matrix:", *(r.line() for r in results)]))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
