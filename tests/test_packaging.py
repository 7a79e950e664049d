"""The distribution: named torch-flopscope on the package index (the index's ``flopscope`` is an unrelated project;
the import package and the command stay ``flopscope``), its version and entry points from the installed metadata,
and no install hint naming the old distribution. ``tools/check_dist.py`` checks the built wheel and sdist."""

from __future__ import annotations

import importlib
import importlib.metadata
import re
from pathlib import Path

import pytest

import flopscope
import flopscope.version

DIST = "torch-flopscope"
ROOT = Path(__file__).resolve().parent.parent  # the checkout (in .ci/run's wheel phase: its copy without flopscope/)
PACKAGE = Path(flopscope.__file__).parent  # the installed package in the wheel phase
# an install command that names the old distribution: pip install flopscope / 'flopscope[x]' / "flopscope[x]",
# or its extras anywhere ("flopscope[hf]" not after "torch-")
OLD_HINT = re.compile(r"""pip install\s+(?:-\S+\s+)*["']?flopscope\b|(?<![\w.-])flopscope\[""")


def _hinted_files() -> list[Path]:
    """The package's modules and everything a user reads: README, changelog, docs/, examples/, benchmarks/."""
    files = sorted(PACKAGE.rglob("*.py"))
    files += [ROOT / name for name in ("README.md", "CHANGELOG.md", "pyproject.toml", ".ci/run")]
    for folder, pattern in (("docs", "*.md"), ("examples", "*.py"), ("benchmarks", "*.py"), ("benchmarks", "*.md")):
        files += sorted((ROOT / folder).rglob(pattern))
    return [path for path in files if "__pycache__" not in path.parts]


@pytest.mark.parametrize("text", ['pip install "flopscope[hf]"', "pip install 'flopscope[plot]'",
                                  "``pip install flopscope[lightning]``", "pip install flopscope",
                                  "pip install -U flopscope", "needs `flopscope[vision]`"])
def test_the_old_hint_pattern_finds(text: str) -> None:
    assert OLD_HINT.search(text)


@pytest.mark.parametrize("text", ['pip install "torch-flopscope[hf]"', "pip install 'torch-flopscope[plot]'",
                                  "pip install torch-flopscope", "pip install torch==2.13.0 -e .",
                                  'pip install torch==2.13.0 -e ".[dev]" && python -m pytest', "import flopscope",
                                  "flopscope profile hf:gpt2"])
def test_the_old_hint_pattern_spares(text: str) -> None:
    assert not OLD_HINT.search(text)


def test_no_install_hint_names_the_old_distribution() -> None:
    files = _hinted_files()
    assert (ROOT / "README.md") in files and (ROOT / "README.md").exists(), f"no README.md in {ROOT}"
    found = [f"{path}:{text[:m.start()].count(chr(10)) + 1}: {m.group()!r}"
             for path in files if path.exists()
             for text in [path.read_text(encoding="utf-8")] for m in OLD_HINT.finditer(text)]
    assert found == []


def test_version_is_the_installed_metadata() -> None:
    assert flopscope.__version__ == importlib.metadata.version(DIST)
    assert flopscope.__version__ != "0+unknown"


def test_pyproject_declares_the_installed_distribution() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["name"] == DIST
    # installed metadata older than pyproject.toml: reinstall (pip install -e ".[dev]")
    assert project["version"] == importlib.metadata.version(DIST)


def test_version_without_metadata_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    """Imported from a source tree that was never installed: no metadata, so no version to claim."""

    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    try:
        with monkeypatch.context() as patch:
            patch.setattr(importlib.metadata, "version", missing)
            assert importlib.reload(flopscope.version).__version__ == "0+unknown"
    finally:
        importlib.reload(flopscope.version)
        importlib.reload(flopscope)
    assert flopscope.__version__ == flopscope.version.__version__ == importlib.metadata.version(DIST)


def test_entry_points_and_py_typed_are_installed() -> None:
    points = {(p.group, p.name): p.value for p in importlib.metadata.distribution(DIST).entry_points}
    assert points == {("console_scripts", "flopscope"): "flopscope.cli:main",
                      ("pytest11", "flopscope"): "flopscope.testing.pytest_plugin"}
    assert (PACKAGE / "py.typed").is_file()
