"""Traces: the trace-event JSON flopscope writes validates, and carries the counts."""

from __future__ import annotations

import json
import re
from collections import defaultdict

import numpy as np
import pytest
import torch

import flopscope
import flopscope.render.trace
from flopscope.studies.models import TransformerBlock

D, H, D_FF, N = 64, 4, 256, 16


def validate(doc: dict) -> list[dict]:
    """The trace-event format's rules: required keys and types, monotonic time per track, begin/end matched."""
    assert isinstance(doc["traceEvents"], list)
    events = [e for e in doc["traceEvents"] if e["ph"] != "M"]
    last: dict[tuple[int, int], float] = defaultdict(float)
    open_spans: dict[tuple[int, int], list[str]] = defaultdict(list)
    for e in events:
        assert isinstance(e["name"], str) and e["ph"] in ("X", "B", "E")
        assert isinstance(e["ts"], (int, float)) and isinstance(e["pid"], int) and isinstance(e["tid"], int)
        track = (e["pid"], e["tid"])
        assert e["ts"] >= last[track], f"time goes back on track {track} at {e['name']}"
        last[track] = e["ts"] + (e["dur"] if e["ph"] == "X" else 0)
        if e["ph"] == "X":
            assert e["dur"] >= 0
        elif e["ph"] == "B":
            open_spans[track].append(e["name"])
        else:
            assert open_spans[track] and open_spans[track].pop() == e["name"]
    assert not any(open_spans.values())
    return events


@pytest.mark.parametrize("mode", ["fake", "real"])
def test_the_exported_trace_validates_and_sums_to_the_profile(tmp_path, mode) -> None:
    prof = flopscope.profile(TransformerBlock(D, H, D_FF), torch.randn(1, N, D), mode=mode, backward=True)
    path = prof.export_chrome_trace(tmp_path / "trace.json")
    doc = json.loads(path.read_text())
    events = validate(doc)
    ops = [e for e in events if e["ph"] == "X"]
    assert sum(e["args"]["macs"] for e in ops) == prof.total()
    assert sum(e["args"]["bytes"] for e in ops) == prof.total_bytes()
    assert all(e["args"]["flops"] == 2 * e["args"]["macs"] for e in ops)
    tracks = {e["args"]["name"]: e["tid"] for e in doc["traceEvents"] if e["name"] == "thread_name" and e["pid"] == 1}
    by_track = defaultdict(int)
    for e in ops:
        by_track[e["tid"]] += e["args"]["macs"]
    for role, macs in prof.by_role().items():  # one track per role (an op on its dominant role's)
        if macs:
            assert by_track[tracks[role]] == macs
    calls = [e for e in events if e["ph"] == "B"]
    forward = flopscope.profile(TransformerBlock(D, H, D_FF), torch.randn(1, N, D), mode="fake")
    assert [e["args"]["module"] for e in calls] == [path for path, count in forward.module_calls().items()
                                                  for _ in range(count)]
    root = next(e for e in calls if e["args"]["module"] == "")
    assert root["args"]["macs"] == prof.total(phase="forward")
    assert doc["otherData"]["time"] == ("measured" if mode == "real" else
                                        "order only: 1 us per op (pass peak= and bandwidth= for roofline times)")


def test_a_fake_trace_is_timed_by_the_roofline(tmp_path) -> None:
    prof = flopscope.profile(torch.nn.Linear(D, D_FF), torch.randn(N, D))
    doc = json.loads(prof.export_chrome_trace(tmp_path / "t.json", peak=1e9, bandwidth=1e8).read_text())
    (matmul,) = [e for e in validate(doc) if e["ph"] == "X" and e["args"]["macs"]]
    flops, size = 2 * N * D * D_FF, 4 * (N * D + D * D_FF + D_FF + N * D_FF)
    assert matmul["dur"] == pytest.approx(max(flops / 1e9, size / 1e8) * 1e6)


def test_role_ranges_over_a_torch_profiler_trace_of_the_same_run(tmp_path) -> None:
    from flopscope.render.trace import merge_torch_trace

    block, x = TransformerBlock(D, H, D_FF), torch.randn(1, N, D)
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities) as torch_prof, \
            flopscope.profiler(block, mode="real") as ours:
        block(x)
    torch_prof.export_chrome_trace(str(tmp_path / "torch.json"))
    merged = merge_torch_trace(tmp_path / "torch.json", ours.result)
    assert set(merged["otherData"]["flopscope"]["unmatched"]) <= {"aten.detach"}  # autograd's, no event of its own
    pid = next(e["pid"] for e in merged["traceEvents"] if e.get("args", {}).get("name") == "flopscope roles")
    ranges = [e for e in merged["traceEvents"] if e.get("pid") == pid and e["ph"] == "X"]
    validate({"traceEvents": ranges})
    calls: dict[str, int] = defaultdict(int)
    for e in ranges:
        calls[e["name"]] += 1
    # one range per projection GEMM, one each for the scores and the weighted sum, one per FFN GEMM
    for role in ("q_proj", "k_proj", "v_proj", "out_proj", "attn_scores", "attn_weighted_sum", "ffn_up", "ffn_down"):
        assert calls[role] == 1, role
    assert sum(e["args"]["macs"] for e in ranges) == ours.result.total()
    torch_ops = {e["name"] for e in merged["traceEvents"] if e.get("cat") == "cpu_op"}
    assert {f"aten::{e['args']['op'].split('.')[-1]}" for e in ranges} <= torch_ops  # on torch's own events


def test_profiler_trace_marks_each_module_call_as_a_torch_profiler_range() -> None:
    block, x = TransformerBlock(D, H, D_FF), torch.randn(1, N, D)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as torch_prof, \
            flopscope.profiler(block, mode="real", trace=True) as ours:
        block(x)
        block(x)
    averages = {event.key: event.count for event in torch_prof.key_averages()}
    for path, calls in ours.result.module_calls().items():
        assert averages[f"flopscope/{path or '(root)'}"] == calls == 2
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as plain, \
            flopscope.profiler(block, mode="real"):
        block(x)
    assert not any(event.key.startswith("flopscope/") for event in plain.key_averages())  # only when asked


def test_a_trace_path_that_cannot_be_written_is_named_and_nothing_is_half_written(tmp_path, monkeypatch) -> None:
    import os

    prof = flopscope.profile(torch.nn.Linear(D, D_FF), torch.randn(N, D))
    missing = tmp_path / "no such directory" / "t.json"
    with pytest.raises(flopscope.FlopscopeError, match=rf"cannot write the trace to {re.escape(str(missing))}: No "):
        prof.export_chrome_trace(missing)
    with pytest.raises(flopscope.FlopscopeError, match=rf"cannot write the trace to {re.escape(str(tmp_path))}"):
        prof.export_chrome_trace(tmp_path)  # a directory
    path = tmp_path / "t.json"
    path.write_text("the previous trace")

    def interrupted(source, destination):  # the rename fails: a full disk, a crash
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(flopscope.FlopscopeError, match=r"cannot write the trace to .*t\.json: No space left"):
        prof.export_chrome_trace(path)
    monkeypatch.undo()
    assert path.read_text() == "the previous trace"  # untouched
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"]  # and no temporary file left beside it
    prof.export_chrome_trace(path)
    assert json.loads(path.read_text())["otherData"]["total_macs"] == N * D * D_FF
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # as a plain open() makes it, not a private temp file


def test_module_ranges_are_not_ops_of_the_trace(tmp_path) -> None:
    block, x = TransformerBlock(D, H, D_FF), torch.randn(1, N, D)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as torch_prof, \
            flopscope.profiler(block, mode="real", trace=True) as ours:
        block(x)
    torch_prof.export_chrome_trace(str(tmp_path / "torch.json"))
    merged = flopscope.render.trace.merge_torch_trace(tmp_path / "torch.json", ours.result)
    assert set(merged["otherData"]["flopscope"]["unmatched"]) <= {"aten.detach"}  # record_function's ops: not ours
    ops = [e for e in validate(ours.result.export_chrome_trace(tmp_path / "t.json") and
                               json.loads((tmp_path / "t.json").read_text())) if e["ph"] == "X"]
    assert not any(e["args"]["op"].startswith("profiler.") for e in ops)


def test_a_png_of_a_trace(tmp_path) -> None:
    image = pytest.importorskip("matplotlib.image")
    from flopscope.render.plots import trace_plot
    from flopscope.render.trace import merge_torch_trace

    block, x = TransformerBlock(D, H, D_FF), torch.randn(1, N, D)
    prof = flopscope.profile(block, x, mode="real")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as torch_prof, \
            flopscope.profiler(block, mode="real", trace=True) as ours:
        block(x)
    torch_prof.export_chrome_trace(str(tmp_path / "torch.json"))
    for name, trace in (("own", prof.export_chrome_trace(tmp_path / "t.json")),  # a path
                        ("merged", merge_torch_trace(tmp_path / "torch.json", ours.result))):  # a dict
        png = trace_plot(trace, tmp_path / f"{name}.png")
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000, name
        pixels = image.imread(png)
        assert pixels.shape[1] == 12 * 120 and pixels.shape[0] > 6 * 120  # 12 inches at 120 dpi; nine role rows
        colours = np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)
        assert (np.ptp(colours[:, :3], axis=1) > 0.2).sum() >= 8, name  # the role tracks' bars, in colour
    with pytest.raises(flopscope.FlopscopeError, match="no flopscope events in this trace"):
        trace_plot({"traceEvents": []}, tmp_path / "empty.png")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(flopscope.FlopscopeError, match=r"cannot read the trace .*bad\.json"):
        trace_plot(tmp_path / "bad.json", tmp_path / "bad.png")
