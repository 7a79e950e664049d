"""Real-mode time per role: every timed op lands in one row; fake mode has no times to give."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

import flopscope
from flopscope.role import NO_MULTIPLY
from flopscope.studies.models import TransformerBlock

from closed_forms import add, attention, ffn


def timed(model: nn.Module, x: torch.Tensor) -> tuple[flopscope.Profile, float]:
    """A real-mode profile and the wall time of the whole profile() call around it."""
    start = time.perf_counter()
    with torch.no_grad():
        prof = flopscope.profile(model.eval(), x, mode="real")
    return prof, time.perf_counter() - start


def test_role_times_partition_the_timed_ops():
    d, h, d_ff, n = 128, 4, 512, 64  # matmul-dominated: the FFN holds 2/3 of the multiplies
    prof, wall = timed(TransformerBlock(d, h, d_ff), torch.randn(1, n, d))
    timing = prof.timing()
    rows = {row.name: row for row in timing.rows}
    expected = add(attention(1, n, n, d, h), ffn(1, n, d, d_ff))
    # one row per role that ran, with its closed-form MACs, and one for the ops without multiplies;
    # roles without ops (logits, gate, conv, ...) have no row and so no time
    assert {name: row.macs for name, row in rows.items() if name != NO_MULTIPLY} == expected
    assert {name: row.macs for name, row in rows.items() if row.macs} == prof.by_role()
    assert rows[NO_MULTIPLY].macs == 0 and rows[NO_MULTIPLY].seconds > 0  # softmax, layer norms, activations, copies
    assert all(row.seconds > 0 for row in timing.rows)
    heaviest = max(expected, key=expected.__getitem__)
    assert heaviest in ("ffn_up", "ffn_down") and rows[heaviest].seconds > 0
    # the rows partition the ops' time: their sum is the root module's time, counted through the module tree
    assert sum(row.seconds for row in timing.rows) == pytest.approx(timing.modules[""], rel=1e-9)
    assert timing.seconds == pytest.approx(timing.modules[""], rel=1e-9)
    assert 0 < timing.seconds <= wall  # no op is timed twice: the ops ran inside the profile() call
    # inclusive module times: a module's time covers its submodules' times
    assert set(timing.modules) >= {"", "attention", "attention.q_proj", "ffn", "ffn.up", "ffn.down"}
    for path, seconds in timing.modules.items():
        if path:
            assert 0 <= seconds <= timing.modules[path.rpartition(".")[0]] * (1 + 1e-9), path
    assert timing.modules["ffn.up"] + timing.modules["ffn.down"] <= timing.modules["ffn"] * (1 + 1e-9)
    # the table's MAC share is the closed-form share
    total = sum(expected.values())
    line = next(line for line in timing.to_table().splitlines() if line.startswith("ffn_up "))
    assert f"{100 * n * d * d_ff / total:.1f}%" in line.split()
    assert "GFLOP/s" in timing.to_table().splitlines()[0]


def test_a_fused_op_splits_its_time_between_its_roles_by_macs():
    """The fast path of nn.MultiheadAttention is one kernel: each role gets its MAC share of that op's time."""
    d, h, n, B = 64, 4, 16, 2

    class SelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = nn.MultiheadAttention(d, h, batch_first=True)

        def forward(self, x):
            return self.mha(x, x, x, need_weights=False)[0]

    prof, _ = timed(SelfAttention(), torch.randn(B, n, d))
    assert set(prof.by_op()) == {"aten._native_multi_head_attention"}
    timing = prof.timing()
    expected = attention(B, n, n, d, h)
    assert {row.name: row.macs for row in timing.rows} == expected  # no row for ops without multiplies
    op_seconds = timing.modules["mha"]  # the module ran the one op and nothing else
    assert timing.modules[""] == pytest.approx(op_seconds, rel=1e-9)
    total = sum(expected.values())
    for row in timing.rows:
        assert row.seconds == pytest.approx(op_seconds * expected[row.name] / total, rel=1e-9), row.name


def test_fake_mode_has_no_times():
    prof = flopscope.profile(TransformerBlock(16, 2, 32), torch.randn(1, 4, 16), mode="fake")
    with pytest.raises(flopscope.FlopscopeError, match="mode='real'"):
        prof.timing()


def test_print_shows_a_table_with_units():
    """``print(prof.timing())`` printed the dataclass (``Timing(rows=(TimingRow(name='q_proj', ...``); it prints a
    caption with the total time in ms, the MACs and GFLOP/s, and the table of rows with their units."""
    d, h, d_ff, n = 32, 2, 64, 8
    prof, _ = timed(TransformerBlock(d, h, d_ff), torch.randn(1, n, d))
    timing = prof.timing()
    text = str(timing)
    caption, *table = text.splitlines()
    macs = sum(add(attention(1, n, n, d, h), ffn(1, n, d, d_ff)).values())
    assert timing.macs == macs
    assert caption == (f"wall time of the timed ops: {1e3 * timing.seconds:.3f} ms for {macs:,} MACs "
                       f"({2 * macs / timing.seconds / 1e9:.2f} GFLOP/s; 1 MAC = 2 FLOPs)")
    assert "\n".join(table) == timing.to_table()
    assert table[0].split() == ["role", "time", "ms", "time", "share", "MAC", "share", "GFLOP/s"]
    assert "TimingRow" not in text
