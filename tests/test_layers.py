"""The package's layers, as data: which folder or module sits where, and that every import points down.

An AST walk over every ``import`` of flopscope's own modules in ``flopscope/`` (module top level, inside functions
and under ``if TYPE_CHECKING:`` alike): a module may import its own layer and the layers below it, never one above;
the import graph has no cycle; no function imports a flopscope module (a deferred import is for an optional
dependency or import time, never to keep a cycle apart). The same walk answers ``python tests/test_layers.py``
with the graph's cycles (none) and the arrows that go up (none).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

try:
    import flopscope
except ImportError:  # run as a script from a checkout that is not installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import flopscope

PACKAGE = Path(flopscope.__file__).resolve().parent  # the package the tests import (installed, in CI's wheel run)

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (  # lowest first: (layer, its top-level modules and folders)
    ("vocabulary", ("errors", "enums", "role", "conventions", "version")),
    ("formulas: what one op costs", ("formulas",)),
    ("hardware: peaks and memory", ("hardware",)),
    ("capture: run the model, record its ops", ("capture",)),
    ("attribute: a role for every multiply", ("attribute",)),
    ("predict: closed forms and conventions over data", ("predict",)),
    ("render: a result's data written for people", ("render",)),
    ("the façade", ("profile",)),
    ("entry points", ("api",)),
    ("workloads: ways of running a model", ("workloads",)),
    ("testing and the seed study", ("testing", "studies")),
    ("tools", ("__init__", "__main__", "cli", "peers", "integrations")),
)
LAYER_OF = {name: index for index, (_, names) in enumerate(LAYERS) for name in names}
FOLDERS = {"formulas", "hardware", "capture", "attribute", "predict", "render", "workloads", "testing", "studies",
           "cli", "peers", "integrations"}


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path, known: dict[str, Path], root: Path = PACKAGE) -> Iterator[tuple[str, int, bool]]:
    """(module of ``known`` imported, line, inside a function) for every import in ``path``, a file of the package
    ``root``."""
    tree = ast.parse(path.read_text(), str(path))
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    local: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            local |= {id(inner) for inner in ast.walk(node) if inner is not node}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            named = [f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in known]
            found = named or ([target] if target in known else [])
        elif isinstance(node, ast.Import):
            found = [alias.name for alias in node.names if alias.name in known]
        else:
            continue
        for target in found:
            if target != name:
                yield target, node.lineno, id(node) in local


def place(module: str) -> str:
    """The top-level module or folder a module belongs to (``"__init__"`` for the package itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: {target for target, _, _ in imports(path, known)} for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def upward() -> list[str]:
    known = modules()
    found = []
    for name, path in known.items():
        for target, line, _ in imports(path, known):
            if LAYER_OF[place(target)] > LAYER_OF[place(name)]:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {name} ({LAYERS[LAYER_OF[place(name)]][0]})"
                             f" imports {target} ({LAYERS[LAYER_OF[place(target)]][0]})")
    return found


def test_every_module_and_folder_has_a_layer() -> None:
    tops = {path.stem for path in PACKAGE.glob("*.py")} | {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert tops == set(LAYER_OF)
    assert {path.parent.name for path in PACKAGE.glob("*/__init__.py")} == FOLDERS


def test_imports_point_down_the_layers() -> None:
    assert upward() == []


def test_the_import_graph_has_no_cycle() -> None:
    assert cycles(graph()) == []


def test_no_function_imports_a_flopscope_module() -> None:
    known = modules()
    deferred = [f"{path.relative_to(PACKAGE.parent)}:{line}: {target}" for path in known.values()
                for target, line, inside in imports(path, known) if inside]
    assert deferred == []


def test_the_tests_own_walk_sees_imports_of_every_kind(tmp_path: Path) -> None:
    """The walk finds top-level, TYPE_CHECKING and function-local imports, relative and absolute, and the cycle and
    the upward arrow they make."""
    fake = {"pkg.a": tmp_path / "pkg" / "a.py", "pkg.b": tmp_path / "pkg" / "b.py", "pkg.c": tmp_path / "pkg" / "c.py"}
    (tmp_path / "pkg").mkdir()
    fake["pkg.a"].write_text("from . import b\n")
    fake["pkg.b"].write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import X\n")
    fake["pkg.c"].write_text("def f():\n    from pkg.a import y\n")
    root = tmp_path / "pkg"
    edges = {name: {t for t, _, _ in imports(path, fake, root)} for name, path in fake.items()}
    inside = [i for path in fake.values() for _, _, i in imports(path, fake, root)]
    assert edges == {"pkg.a": {"pkg.b"}, "pkg.b": {"pkg.c"}, "pkg.c": {"pkg.a"}}
    assert inside == [False, False, True]
    assert cycles(edges) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_each_layer_folder_says_what_it_does_and_may_import() -> None:
    for folder in sorted(FOLDERS - {"peers", "integrations"}):
        doc = ast.get_docstring(ast.parse((PACKAGE / folder / "__init__.py").read_text())) or ""
        assert doc.startswith("Layer ") and "May import" in doc, folder


if __name__ == "__main__":
    found = cycles(graph())
    print(f"import cycles (every import, TYPE_CHECKING and function-local included): {len(found)}")
    for component in found:
        print("  " + ", ".join(component))
    arrows = upward()
    print(f"imports that go up a layer: {len(arrows)}")
    for arrow in arrows:
        print("  " + arrow)
    sys.exit(1 if found or arrows else 0)


MAX_TOP_MODULES, MAX_MODULE_LINES, MAX_PUBLIC_NAMES = 12, 600, 25
"""The house's figures (issue 48): modules at the package's top (``__init__`` and ``__main__`` aside), lines of the
longest module, names in ``flopscope.__all__``."""


def test_the_top_keeps_the_public_surface_and_the_vocabulary_only() -> None:
    top = sorted(path.stem for path in PACKAGE.glob("*.py") if path.stem not in ("__init__", "__main__"))
    assert len(top) <= MAX_TOP_MODULES, top
    assert len(flopscope.__all__) <= MAX_PUBLIC_NAMES


def test_no_module_is_longer_than_a_newcomer_reads() -> None:
    long = {str(path.relative_to(PACKAGE.parent)): n for path in PACKAGE.rglob("*.py")
            if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}
