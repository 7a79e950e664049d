"""Real-mode time per role: every timed op lands in one row; fake mode has no times to give."""

from __future__ import annotations

import pytest
import torch

import flopscope
from flopscope.models import TransformerBlock
from flopscope.timing import NO_MACS


def test_time_per_role_covers_every_op_and_keeps_macs():
    block = TransformerBlock(64, 4, 256).eval()
    with torch.no_grad():
        prof = flopscope.profile(block, torch.randn(1, 32, 64), mode="real")
    timing = prof.timing()
    rows = {row.name: row for row in timing.rows}
    assert {row.name: row.macs for row in timing.rows if row.macs} == prof.by_role()
    assert NO_MACS in rows and rows[NO_MACS].macs == 0  # softmax, layer norms, activations, copies
    ops = sum(n.meta["seconds"] for n in prof.graph.nodes if "seconds" in n.meta)
    assert timing.seconds == pytest.approx(ops)
    assert timing.modules[""] == pytest.approx(ops)
    assert all(row.seconds >= 0 for row in timing.rows)
    assert "GFLOP/s" in timing.to_table()


def test_fake_mode_has_no_times():
    prof = flopscope.profile(TransformerBlock(16, 2, 32), torch.randn(1, 4, 16), mode="fake")
    with pytest.raises(flopscope.FlopscopeError, match="mode='real'"):
        prof.timing()
