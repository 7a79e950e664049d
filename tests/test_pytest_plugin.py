"""The pytest plug-in and flopscope.testing, run through pytest's own pytester (a pytest inside the test)."""

from __future__ import annotations

import json

import pytest
import torch

import flopscope
from flopscope.studies.models import TransformerBlock
from flopscope.testing import assert_macs

D, H, D_FF, N = 64, 4, 256, 16

BLOCK_TEST = """
import torch
from flopscope.studies.models import TransformerBlock

def test_block(flops):
    torch.manual_seed(0)
    flops.check(TransformerBlock(64, 4, {d_ff}), torch.randn(1, 16, 64))
"""


def test_assert_macs_passes_on_the_closed_form_and_fails_with_a_role_table() -> None:
    block, x = TransformerBlock(D, H, D_FF), torch.randn(1, N, D)
    projections, scores = 4 * N * D * D, N * N * D
    assert_macs(block, x, expected=projections + 2 * scores + 2 * N * D * D_FF, roles={"attn_scores": scores})
    with pytest.raises(AssertionError, match=r"(?s)attn_scores\s+16,384\s+16,384.*ffn_up\s+1\s+262,144\s+\+262,143"):
        assert_macs(block, x, roles={"attn_scores": scores, "ffn_up": 1})
    assert_macs(block, x, expected=projections + 2 * scores + 2 * N * D * D_FF + 100, rel=0.01)  # within 1 %
    with pytest.raises(flopscope.ConfigurationError, match=r"expected= .* or roles="):
        assert_macs(block, x)


def test_a_snapshot_is_created_then_held_then_updated(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_budget=BLOCK_TEST.format(d_ff=D_FF))
    pytester.runpytest().assert_outcomes(passed=1)  # no baseline yet: written
    baseline = pytester.path / "__flops__" / "test_block.json"
    saved = json.loads(baseline.read_text())
    assert saved["macs"] == 4 * N * D * D + 2 * N * N * D + 2 * N * D * D_FF
    assert saved["roles"]["ffn_up"] == N * D * D_FF
    pytester.runpytest().assert_outcomes(passed=1)  # unchanged: holds

    pytester.makepyfile(test_budget=BLOCK_TEST.format(d_ff=2 * D_FF))  # a config change doubles the FFN
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    up = N * D * D_FF  # one FFN GEMM before the change
    result.stdout.fnmatch_lines(["*MACs differ from the snapshot*", f"*ffn_up*{up:,}*{2 * up:,}*+{up:,}*CHANGED*",
                                 "*by module (changed only)*", f"*ffn.up*{up:,}*{2 * up:,}*CHANGED*"])
    assert not any("attn_scores" in line and "CHANGED" in line for line in result.outlines)  # only the FFN moved

    pytester.runpytest("--flops-update").assert_outcomes(passed=1)
    assert json.loads(baseline.read_text())["roles"]["ffn_up"] == N * D * 2 * D_FF
    pytester.runpytest().assert_outcomes(passed=1)


def test_a_model_that_needs_real_data_is_budgeted_in_real_mode(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_routed="""
import warnings
import torch

class Routed(torch.nn.Module):  # .item() on data: fake tensors cannot run it, mode="auto" runs it for real
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
    def forward(self, x):
        return self.a(x) if x.sum().item() > 0 else self.b(x)

def test_routed(flops):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prof = flops.check(Routed(), torch.ones(4, 8))
    assert prof.mode == "real"
    assert any("real mode" in str(w.message) for w in caught)
""")
    pytester.runpytest().assert_outcomes(passed=1)
    assert json.loads((pytester.path / "__flops__" / "test_routed.json").read_text())["macs"] == 4 * 8 * 8


@pytest.mark.parametrize(("content", "says"), [
    ('{"macs": 1, ', "is not JSON"),  # cut short
    ("\x89PNG\r\n", "is not JSON"),  # not even text
    ('{"schema": "flopscope.snapshot/0", "macs": 1}', "it has schema 'flopscope.snapshot/0'"),
    ('[1, 2]', "it has no schema"),
])
def test_a_baseline_that_is_not_a_snapshot_says_which_file_and_how_to_fix_it(pytester: pytest.Pytester, content,
                                                                            says) -> None:
    pytester.makepyfile(test_budget=BLOCK_TEST.format(d_ff=D_FF))
    baseline = pytester.path / "__flops__" / "test_block.json"
    baseline.parent.mkdir()
    baseline.write_bytes(content.encode("latin-1"))
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*ConfigurationError*{baseline}*{says}*delete it, or run pytest --flops-update*"])
    assert baseline.read_bytes() == content.encode("latin-1")  # left for the user to look at
    pytester.runpytest("--flops-update").assert_outcomes(passed=1)
    assert json.loads(baseline.read_text())["schema"] == "flopscope.snapshot/1"
    pytester.runpytest().assert_outcomes(passed=1)


def test_snapshots_are_written_whole(tmp_path, monkeypatch) -> None:
    import os

    from flopscope.testing import FlopBudget

    block, x = TransformerBlock(D, H, D_FF), torch.randn(1, N, D)
    budget = FlopBudget(tmp_path / "__flops__", "test_block")
    budget.check(block, x)
    path = tmp_path / "__flops__" / "test_block.json"
    before = path.read_text()

    def interrupted(source, destination):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(flopscope.FlopscopeError, match=r"cannot write the snapshot to .*test_block\.json: No space"):
        FlopBudget(tmp_path / "__flops__", "test_block", update=True).check(TransformerBlock(D, H, 2 * D_FF), x)
    monkeypatch.undo()
    assert path.read_text() == before  # the old baseline, whole
    assert [p.name for p in path.parent.iterdir()] == ["test_block.json"]  # no temporary file left
    budget.check(block, x)
