"""Check what ``python -m build`` made against pyproject.toml and the source tree (CI runs it after the build).

    python tools/check_dist.py [DIST_DIR]        # default: dist/

The wheel must hold every module of ``flopscope/`` (a subpackage that setuptools does not find is missing from it),
the HTML report's style and script (``flopscope/render/html.css``, ``html.js``), ``flopscope/py.typed``, nothing outside
``flopscope/`` and its ``.dist-info``, the metadata pyproject.toml declares (name, version, extras, the README as
Markdown) and the entry points: the ``flopscope`` console script and the ``pytest11`` plug-in. The sdist must hold
the same modules, the README, the changelog and the tests with their helpers. Prints one line per artefact; exits 1
listing every problem found.
"""

from __future__ import annotations

import configparser
import re
import sys
import tarfile
import zipfile
from email.parser import HeaderParser
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "flopscope"


def _source_modules() -> set[str]:
    """The package's files as paths inside a wheel: every .py under flopscope/, the HTML report's .css and .js, and
    py.typed."""
    found = {p.relative_to(ROOT).as_posix() for p in (ROOT / PACKAGE).rglob("*")
             if p.suffix in (".py", ".css", ".js") and "__pycache__" not in p.parts}
    return found | {f"{PACKAGE}/py.typed"}


def check_wheel(path: Path, project: dict) -> list[str]:
    name, version = project["name"], project["version"]
    stem = f"{re.sub(r'[-_.]+', '_', name).lower()}-{version}"
    problems = []
    if path.name != f"{stem}-py3-none-any.whl":
        problems.append(f"wheel is named {path.name}, not {stem}-py3-none-any.whl")
    with zipfile.ZipFile(path) as wheel:
        names = set(wheel.namelist())
        info = next((n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA")), None)
        if info is None:
            return [*problems, "wheel has no .dist-info/METADATA"]
        problems += [f"wheel lacks {m}" for m in sorted(_source_modules() - names)]
        problems += [f"wheel holds {n}, outside {PACKAGE}/ and {info}/"
                     for n in sorted(names) if n.split("/")[0] not in (PACKAGE, info)]
        metadata = HeaderParser().parsestr(wheel.read(f"{info}/METADATA").decode())
        entry_points = configparser.ConfigParser(delimiters=("=",))
        entry_points.optionxform = str  # type: ignore[assignment,method-assign]  # names are case-sensitive
        entry_points.read_string(wheel.read(f"{info}/entry_points.txt").decode())
    expected = {"Name": name, "Version": version, "Description-Content-Type": "text/markdown"}
    problems += [f"METADATA {k}: {metadata[k]!r}, expected {v!r}" for k, v in expected.items() if metadata[k] != v]
    extras, declared = set(metadata.get_all("Provides-Extra") or []), set(project["optional-dependencies"])
    if extras != declared:
        problems.append(f"METADATA extras {sorted(extras)}, pyproject.toml has {sorted(declared)}")
    wanted = {"console_scripts": project["scripts"], **project["entry-points"]}
    for group, points in wanted.items():
        have = dict(entry_points[group]) if entry_points.has_section(group) else {}
        if have != points:
            problems.append(f"entry_points.txt [{group}]: {have}, expected {points}")
    return problems


def check_sdist(path: Path, project: dict) -> list[str]:
    stem = f"{re.sub(r'[-_.]+', '_', project['name']).lower()}-{project['version']}"
    if path.name != f"{stem}.tar.gz":
        return [f"sdist is named {path.name}, not {stem}.tar.gz"]
    with tarfile.open(path) as sdist:
        names = {n.removeprefix(f"{stem}/") for n in sdist.getnames()}
    wanted = _source_modules() | {"pyproject.toml", "README.md", "CHANGELOG.md", "tests/conftest.py",
                                  "tests/closed_forms.py", "tests/zoo.py"}
    return [f"sdist lacks {n}" for n in sorted(wanted - names)]


def main(argv: list[str]) -> int:
    dist = Path(argv[0]) if argv else ROOT / "dist"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        print(f"{dist}: expected one wheel and one sdist, found {[p.name for p in wheels + sdists]}")
        return 1
    problems = []
    for path, check in ((wheels[0], check_wheel), (sdists[0], check_sdist)):
        found = check(path, project)
        print(f"{path.name}: {'ok' if not found else f'{len(found)} problem(s)'}")
        problems += found
    for problem in problems:
        print(f"  {problem}")
    if not problems:
        groups = {"console_scripts": project["scripts"], **project["entry-points"]}
        print(f"  {len(_source_modules())} package files (py.typed included); "
              + "; ".join(f"[{g}] {', '.join(points)}" for g, points in groups.items())
              + f"; extras {', '.join(project['optional-dependencies'])}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
