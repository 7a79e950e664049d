"""The compatibility matrix: the suite in a fresh virtual environment per cell, one torch and one transformers each.

    python tools/matrix.py                      # every cell, one after the other
    python tools/matrix.py floor newest         # some cells
    python tools/matrix.py --list               # the cells and their versions
    python tools/matrix.py floor -- -x -k fft   # arguments after -- go to pytest
    python tools/matrix.py --venvs DIR floor    # keep the cell's venv in DIR/floor (default: a temporary folder,
                                                # each venv removed once its cell has run)
    python tools/matrix.py --venvs DIR --prepare floor newest  # only make the venvs and install their requirements
                                                # (not the checkout, no tests); a later run with the same --venvs
                                                # reuses them and installs the checkout

A cell: ``python -m venv``, then ``pip install torch==T transformers==H -e ".[dev]"`` with a constraints file that
holds those two pins (given as PIP_CONSTRAINT, in place of any machine-wide one, so that no other package moves
them and a release newer than a local cap can be asked for), then the README's ``python -m pytest`` in the
repository root. ``pin`` is CI's torch (the local CPU wheel) with the transformers pip picks for the dev extra;
``floor`` pins both; ``newest`` takes the newest release of each that the package index serves, asked when the cell
is made (``pip index versions``; the last known newest, :data:`KNOWN_NEWEST`, where the index cannot be asked), so
that a new release's regression shows the day it appears, also beyond pyproject.toml's caps (a pinned package's
requirement of the checkout is its pin, and the checkout is installed without its dependencies, which are in by
then). torch from the package index is a CUDA build of several GB (it runs on the CPU).
Prints one line per cell (the versions installed, pytest's counts, minutes) and the table at the end; exits 1
if a cell fails. ``kernels`` adds flash-linear-attention's and Liger's kernels and runs only the tests that need them.
``.ci/run`` prepares ``floor``, ``newest`` and ``kernels`` in the background (the downloads overlap the pinned suite)
and runs them after it. The compatibility table (docs/guide/compatibility.md) holds what these cells measured;
pyproject.toml declares floor torch and floor transformers.
"""

from __future__ import annotations

import argparse
import dataclasses
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


NEWEST = "newest"
"""A cell's version that is the newest release the package index serves (:func:`newest_release`)."""
KNOWN_NEWEST = {"torch": "2.15.0", "transformers": "5.25.0"}
"""The newest releases when this was last measured (docs/guide/compatibility.md): a ``newest`` cell's versions where
the index cannot be asked."""


@dataclass(frozen=True)
class Cell:
    torch: str  # a version, or NEWEST
    transformers: str | None  # None: what pip picks for the dev extra; NEWEST
    about: str
    extra: tuple[str, ...] = ()  # more packages the cell installs (pinned here)
    tests: tuple[str, ...] = ()  # the tests it runs (default: the whole suite)
    built: tuple[str, ...] = ()  # source packages built against the cell's torch after the rest (no build isolation,
    # no dependencies), their CUDA extensions skipped (BUILD_ENV): mamba-ssm's Python and Triton parts on a CPU


BUILD_ENV = {"MAMBA_SKIP_CUDA_BUILD": "TRUE", "MAMBA_FORCE_BUILD": "TRUE"}
"""mamba-ssm builds without CUDA (its extension skipped), and from source: its setup would otherwise look for a
prebuilt wheel by CUDA version, which a CPU torch has none of."""


CELLS = {
    "floor": Cell("2.6.0", "5.15.0", "the oldest torch and transformers pyproject.toml admits"),
    "pin": Cell("2.13.0", None, "CI's torch (the local CPU wheel), the newest transformers"),
    "newest": Cell(NEWEST, NEWEST, "the newest torch and transformers the package index serves, asked when the cell "
                   "is made (Python 3.11)"),
    "kernels": Cell("2.13.0", "5.24.0", "CI's torch with flash-linear-attention's kernels library (fla-core, CPU "
                    "build: Triton imports, its kernels cannot launch) and Liger's: the kernel catalog's tests, apart "
                    "because transformers binds fla's kernels for every Qwen3-Next of the suite once fla is installed "
                    "(and mamba-ssm's for every Mamba)",
                    extra=("fla-core[cpu]==0.6.0", "liger-kernel==0.8.5", "packaging", "einops"),
                    tests=("tests/test_fla_kernels.py", "tests/test_liger_kernels.py", "tests/test_mamba_kernels.py",
                           "tests/test_triton_launches.py"),
                    built=("mamba-ssm==2.3.2.post1",)),
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


INSTALLED = ".flopscope-cell"
"""A file in a cell's venv holding the pins its requirements were installed with (written once that succeeded)."""


def requirements(pinned: tuple[str, ...] = ()) -> list[str]:
    """The checkout's requirements with its ``dev`` extra, from ``pyproject.toml`` (what ``-e ".[dev]"`` pulls), but
    those of the packages ``pinned`` (their pins stand for them: a ``newest`` cell's release may be beyond a cap)."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [r for r in [*project["dependencies"], *project["optional-dependencies"]["dev"]]
            if _name(r) not in {_name(p) for p in pinned}]


def _name(requirement: str) -> str:
    """The package a requirement or pin names, normalised (``Torch>=2.6`` -> ``torch``)."""
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    return re.sub(r"[-_.]+", "-", match.group(0)).lower() if match else requirement


_RESOLVED: dict[str, str] = {}


def newest_release(package: str) -> str:
    """The newest final release of ``package`` that the package index serves to this Python (``pip index versions``:
    no pre-release, no local build such as ``2.13.0+cpu``), asked once per run; :data:`KNOWN_NEWEST`'s, said so,
    where pip cannot ask the index (offline, a pip without ``index``)."""
    found = _RESOLVED.get(package)
    if found is None:
        try:
            asked = subprocess.run([sys.executable, "-m", "pip", "index", "versions", package], capture_output=True,
                                   text=True, timeout=300)
            listed = next(line.split(":", 1)[1] for line in asked.stdout.splitlines()
                          if line.startswith("Available versions:"))
            found = max((v.strip() for v in listed.split(",") if re.fullmatch(r"\d+(\.\d+)*", v.strip())),
                        key=lambda v: tuple(int(part) for part in v.split(".")))
        except (OSError, subprocess.TimeoutExpired, StopIteration, ValueError):
            found = KNOWN_NEWEST[package]
            print(f"   (could not ask the package index for {package}'s releases: the last known newest, {found})",
                  flush=True)
        _RESOLVED[package] = found
    return found


def resolved(cell: Cell) -> Cell:
    """``cell`` with its :data:`NEWEST` versions asked of the package index."""
    return dataclasses.replace(
        cell, torch=newest_release("torch") if cell.torch == NEWEST else cell.torch,
        transformers=newest_release("transformers") if cell.transformers == NEWEST else cell.transformers)


def install_cell(name: str, cell: Cell, venvs: Path, *, checkout: bool = True
                 ) -> tuple[list[str], dict[str, str], str | None]:
    """Make the cell's venv and install the cell's pins and the checkout's requirements, unless ``venvs / name``
    already holds them; then, with ``checkout``, the checkout itself (its requirements but the pinned packages', then
    ``-e .`` without dependencies: quick once they are in, and a pin beyond a cap of the checkout's stands).
    ``checkout=False`` (``--prepare``) writes nothing into the checkout, so it may run beside other installs and
    builds of it. Returns (pins, the cell's environment, pip's output if it failed)."""
    venv = venvs / name
    cell = resolved(cell)
    pins = [f"torch=={cell.torch}"] + ([f"transformers=={cell.transformers}"] if cell.transformers else [])
    pins += [*cell.extra, *cell.built]
    constraints = venv / "constraints.txt"
    env = {**os.environ, "PIP_CONSTRAINT": str(constraints)}
    env.pop("VIRTUAL_ENV", None)
    python = str(venv / "bin" / "python")
    marker = venv / INSTALLED
    if not (marker.is_file() and marker.read_text() == " ".join(pins)):
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        constraints.write_text("\n".join(pin.replace("[cpu]", "") for pin in pins) + "\n")  # (no extras there)
        plain = [pin for pin in pins if pin not in cell.built]
        install = subprocess.run([python, "-m", "pip", "install", "-q", *plain, *requirements(tuple(plain))], env=env,
                                 capture_output=True, text=True)
        if install.returncode == 0 and cell.built:
            install = subprocess.run([python, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps",
                                      *cell.built], env={**env, **BUILD_ENV}, capture_output=True, text=True)
        if install.returncode != 0:
            return pins, env, _without_noise(install.stdout + install.stderr)
        marker.write_text(" ".join(pins))
    if checkout:  # (the requirements first, for those pyproject.toml gained since the venv was made; then the checkout
        # alone, so that a pin beyond a cap of its own stands)
        install = subprocess.run([python, "-m", "pip", "install", "-q", *requirements(tuple(pins))], env=env,
                                 capture_output=True, text=True)
        if install.returncode == 0:
            install = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "-e", "."], cwd=ROOT,
                                     env=env, capture_output=True, text=True)
        if install.returncode != 0:
            return pins, env, _without_noise(install.stdout + install.stderr)
    return pins, env, None


def run_cell(name: str, cell: Cell, venvs: Path, pytest_args: list[str]) -> Result:
    start = time.monotonic()
    python = str(venvs / name / "bin" / "python")
    cell = resolved(cell)
    print(f"== {name}: {cell.torch} / {cell.transformers or '(newest)'} ({cell.about})", flush=True)
    pins, env, failed = install_cell(name, cell, venvs)
    if failed is not None:
        print(failed, flush=True)
        return Result(name, " ".join(pins), {}, (time.monotonic() - start) / 60, ok=False)
    versions = subprocess.run([python, "-c", "import torch, transformers; "
                               "print(f'torch {torch.__version__}, transformers {transformers.__version__}')"],
                              capture_output=True, text=True, check=True).stdout.strip()
    print(f"   {versions}", flush=True)
    tests = subprocess.run([python, "-m", "pytest", *cell.tests, *pytest_args], cwd=ROOT, env=env,
                           capture_output=True, text=True)
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
    parser.add_argument("--prepare", action="store_true", help="only make and install the cells' venvs (--venvs)")
    args = parser.parse_args(argv)
    if args.list:
        for name, cell in CELLS.items():
            cell = resolved(cell)
            print(f"{name:7s} torch {cell.torch:8s} transformers {cell.transformers or '(newest)':9s} {cell.about}")
        return 0
    names = args.cells or list(CELLS)
    unknown = [name for name in names if name not in CELLS]
    if unknown:
        parser.error(f"unknown cell {', '.join(unknown)}; the cells: {', '.join(CELLS)}")
    if args.prepare:
        if args.venvs is None:
            parser.error("--prepare needs --venvs (where the next run finds them)")
        failures = [(name, failed) for name in names
                    if (failed := install_cell(name, CELLS[name], args.venvs, checkout=False)[2])]
        for name, failed in failures:
            print(f"== {name}: install failed\n{failed}", flush=True)
        print(f"prepared: {', '.join(n for n in names if n not in dict(failures))}", flush=True)
        return 1 if failures else 0
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
