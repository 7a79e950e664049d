"""The error contract and the code's own rules: every deliberate error is a FlopscopeError (and the built-in
it resembles); no module reaches into another's private names; a profiler block is queried after it ends."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import flopscope
from flopscope.models import TransformerBlock

PACKAGE = Path(flopscope.__file__).parent
BUILTIN_ERRORS = {"ValueError", "KeyError", "TypeError", "RuntimeError", "IndexError", "LookupError", "Exception",
                  "AssertionError", "NotImplementedError"}  # AttributeError: the __getattr__ protocol


def _modules() -> list[tuple[Path, ast.Module]]:
    return [(path, ast.parse(path.read_text(), str(path))) for path in sorted(PACKAGE.rglob("*.py"))]


def test_no_module_imports_another_modules_private_names() -> None:
    found = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level > 0:  # from .x import _y (flopscope's own modules)
                found += [f"{path.name}: from {'.' * node.level}{node.module} import {a.name}"
                          for a in node.names if a.name.startswith("_") and not a.name.endswith("__")]
    assert found == []


def test_no_bare_builtin_raise_and_no_assert_for_runtime_checks() -> None:
    """Deliberate errors are FlopscopeError subclasses (``raise ValueError`` inside an ``except`` that
    re-raises is not deliberate, so only ``raise Builtin(...)`` calls are looked for)."""
    found = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Assert):
                found.append(f"{path.name}:{node.lineno}: assert")
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                name = getattr(node.exc.func, "id", None)
                if name in BUILTIN_ERRORS:
                    found.append(f"{path.name}:{node.lineno}: raise {name}")
    assert found == []


@pytest.mark.parametrize("mode", ["real", "fake"])
def test_every_query_inside_a_profiler_block_gives_the_same_clear_error(mode: str) -> None:
    model = TransformerBlock(32, 4, 64)
    messages = set()
    with flopscope.profiler(model, mode=mode) as prof:
        model(torch.zeros(1, 8, 32))
        for query in (lambda: prof.total(), lambda: prof.by_role(), lambda: prof.by_module(),
                      lambda: prof.unsupported(), lambda: prof.reconcile(), lambda: prof.graph, lambda: prof.records):
            with pytest.raises(flopscope.FlopscopeError) as caught:
                query()
            messages.add(str(caught.value))
    assert len(messages) == 1 and "after the `with` block" in messages.pop()
    n, d, d_ff = 8, 32, 64
    assert prof.total() == n * (4 * d * d + 2 * d * d_ff) + 2 * n * n * d
    assert isinstance(prof.result, flopscope.Profile) and prof.result.total() == prof.total()


def test_errors_are_flopscope_errors_and_the_builtin_they_resemble() -> None:
    prof = flopscope.profile(TransformerBlock(32, 4, 64), torch.zeros(1, 8, 32))
    with pytest.raises(flopscope.FlopscopeError) as caught:
        prof.role_of("no_such_node")
    assert isinstance(caught.value, KeyError) and "no_such_node" in str(caught.value)
    with pytest.raises(flopscope.FlopscopeError) as caught:
        prof.total("no.such.module")
    assert isinstance(caught.value, KeyError)
    with pytest.raises(flopscope.FlopscopeError) as caught:
        flopscope.compare(n=8, d=30, h=4)
    assert isinstance(caught.value, ValueError) and "d=30" in str(caught.value) and "h=4" in str(caught.value)
    with pytest.raises(flopscope.FlopscopeError) as caught:
        flopscope.compare(n=8, d=32, h=4).row("no_such_row")
    assert isinstance(caught.value, KeyError)
    with pytest.raises(flopscope.FlopscopeError) as caught:
        flopscope.scaling(TransformerBlock(32, 4, 64), lambda n: torch.zeros(1, n, 32), lengths=(8, 16))
    assert isinstance(caught.value, ValueError)
    with pytest.raises(flopscope.FlopscopeError) as caught:
        flopscope.profile(TransformerBlock(32, 4, 64), torch.zeros(1, 8, 32), mode="sometimes")
    assert isinstance(caught.value, ValueError) and "sometimes" in str(caught.value)
    with pytest.raises(flopscope.FlopscopeError) as caught:
        flopscope.RoleRule("mixer.*", "q_projection")
    assert isinstance(caught.value, ValueError) and "q_projection" in str(caught.value)


def test_a_profiler_runs_one_block() -> None:
    model = TransformerBlock(32, 4, 64)
    prof = flopscope.profiler(model, mode="fake")
    with prof:
        model(torch.zeros(1, 8, 32))
    with pytest.raises(flopscope.FlopscopeError, match="already ran"), prof:
        pass
