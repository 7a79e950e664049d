"""The error contract and the code's own rules: every deliberate error is a FlopscopeError (and the built-in
it resembles); no module reaches into another's private names; a profiler block is queried after it ends."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torch import nn

import flopscope
from flopscope.capture.records import captured
from flopscope.studies.models import TransformerBlock

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


class _NeedsRealData(torch.nn.Module):
    """A forward that reads a tensor's value (``.item()``): fake tensors cannot run it."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) * float(x.abs().max().item() > -1)


def test_warnings_point_at_the_users_call() -> None:
    with pytest.warns(flopscope.FlopscopeWarning, match="counted in real mode") as caught:
        flopscope.profile(_NeedsRealData(), torch.randn(4, 8))  # mode="auto" falls back to real
    assert {Path(w.filename) for w in caught if issubclass(w.category, flopscope.FlopscopeWarning)} == {
        Path(__file__)}
    with pytest.warns(flopscope.FlopscopeWarning, match="no formula for") as caught:
        flopscope.profile(_Unsupported(), torch.randn(4, 8), mode="real")
    assert {Path(w.filename) for w in caught if issubclass(w.category, flopscope.FlopscopeWarning)} == {
        Path(__file__)}


class _Unsupported(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.qr(x).Q.abs()  # aten.linalg_qr: no formula, no decomposition


def test_inside_a_profiler_block_hasattr_and_getattr_with_a_default_still_work() -> None:
    model = TransformerBlock(32, 4, 64)
    with flopscope.profiler(model, mode="fake") as prof:
        model(torch.zeros(1, 8, 32))
        assert not hasattr(prof, "total") and getattr(prof, "total", None) is None
        with pytest.raises(flopscope.RecordingError):
            prof.result  # noqa: B018
    assert hasattr(prof, "total") and prof.total() == prof.result.total()


def test_role_assignments_are_read_only() -> None:
    prof = flopscope.profile(TransformerBlock(32, 4, 64), torch.zeros(1, 8, 32))
    assignments = prof.role_assignments()
    node, assignment = next(iter(assignments.items()))
    with pytest.raises(TypeError):
        assignment.parts["q_proj"] = 10**9  # type: ignore[index]
    with pytest.raises(TypeError):
        assignments[node] = assignment  # type: ignore[index]


def test_role_assignments_on_nodes_and_on_records_agree_in_order_and_records_print_short() -> None:
    """The fx-keyed and record-keyed assignments list the same ops in the same order; a record's repr is one line
    (linked records lead through the whole graph: a repr that followed them grew exponentially with depth)."""
    prof = flopscope.profile(nn.Sequential(*(TransformerBlock(32, 4, 64) for _ in range(6))), torch.zeros(1, 8, 32))
    by_op = prof.role_assignments_by_op()
    assert [captured(node) for node in prof.role_assignments()] == list(by_op)
    assert [a for a in prof.role_assignments().values()] == list(by_op.values())
    assert max(len(repr(captured(node))) for node in prof.graph.nodes) < 1000


def test_the_records_dataflow_is_the_fx_graphs() -> None:
    """The role passes walk the records (capture.link): each record's inputs and users are its fx node's
    ``all_input_nodes`` and ``users``, in the same order, forward and backward."""
    model = TransformerBlock(32, 4, 64)
    prof = flopscope.profile(model, torch.zeros(2, 8, 32), backward=True)
    prof.by_role()  # links the records
    nodes = list(prof.graph.nodes)
    assert [captured(node).index for node in nodes] == list(range(len(nodes)))
    for node in nodes:
        op = captured(node)
        assert list(op.inputs) == [captured(x) for x in node.all_input_nodes]
        assert list(op.users) == [captured(x) for x in node.users]


def test_a_profiler_block_warns_at_the_with_statement() -> None:
    model = _Unsupported()
    with pytest.warns(flopscope.FlopscopeWarning, match="no formula for") as caught, flopscope.profiler(model):
        model(torch.randn(4, 8))
    assert {Path(w.filename) for w in caught if issubclass(w.category, flopscope.FlopscopeWarning)} == {
        Path(__file__)}
