"""Flame-graph files (flopscope.render.flame): folded stacks and speedscope, parsed back, weights against closed forms
and against by_module().

Weights are *self* MACs: a line (sample) holds the MACs of the ops its innermost module ran outside any submodule;
a frame's inclusive MACs (the sum over the stacks through it) are the module's by_module() MACs."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch import nn

import flopscope
from flopscope.render.flame import ROOT_FRAME, folded_paths, frame_name

N, D, D_H, D_OUT = 128, 512, 1024, 256


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(D, D_H, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x)  # n·d·d_h, in block.up
        return h @ h.transpose(-1, -2)  # n·n·d_h, in block itself (its self MACs)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(D, D, bias=False)
        self.block = Block()
        self.w = nn.Parameter(torch.zeros(D, D_OUT))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(self.proj(x)).sum() + (x @ self.w).sum()  # x @ w: n·d·d_out, the root's own


# self MACs per stack (frames as written), forward: closed forms
SELF = {
    (ROOT_FRAME, "proj"): N * D * D,
    (ROOT_FRAME, "block", "block.up"): N * D * D_H,
    (ROOT_FRAME, "block"): N * N * D_H,
    (ROOT_FRAME,): N * D * D_OUT,
}
# inclusive MACs per module path, forward
INCLUSIVE = {"": sum(SELF.values()), "proj": N * D * D, "block": N * D * D_H + N * N * D_H, "block.up": N * D * D_H}


def parse_folded(path: Path) -> dict[tuple[str, ...], int]:
    out: dict[tuple[str, ...], int] = {}
    for line in path.read_text().splitlines():
        stack, weight = line.rsplit(" ", 1)
        assert weight.isdigit(), line  # integer weights
        frames = tuple(stack.split(";"))
        assert frames not in out, f"stack written twice: {line}"
        out[frames] = int(weight)
    return out


def inclusive(stacks: dict[tuple[str, ...], int]) -> Counter[str]:
    """A frame's width in the drawn graph: the sum over the stacks through it (once per stack)."""
    out: Counter[str] = Counter()
    for stack, weight in stacks.items():
        for frame in set(stack):
            out[frame] += weight
    return out


def frame(path: str) -> str:
    return frame_name(path)


def test_folded_single_phase_self_weights_and_inclusive_widths(tmp_path: Path) -> None:
    prof = flopscope.profile(Net(), torch.zeros(1, N, D))
    written = prof.export_folded(tmp_path / "net.folded")
    assert written == [tmp_path / "net.folded"]  # one phase: the path itself
    stacks = parse_folded(written[0])
    assert stacks == SELF
    widths = inclusive(stacks)
    assert {path: widths[frame(path)] for path in INCLUSIVE} == INCLUSIVE
    by_module = prof.by_module()
    assert all(widths[frame(path)] == macs for path, macs in by_module.items() if macs)
    assert sum(stacks.values()) == prof.total() == INCLUSIVE[""]


def test_folded_one_file_per_phase(tmp_path: Path) -> None:
    x = torch.zeros(1, N, D, requires_grad=True)  # every operand needs its gradient: backward = 2 x forward
    prof = flopscope.profile(Net(), x, backward=True)
    written = prof.export_folded(tmp_path / "net.folded")
    assert written == [tmp_path / "net.forward.folded", tmp_path / "net.backward.folded"]
    forward, backward = (parse_folded(p) for p in written)
    assert forward == SELF
    # each product C = A·B of the forward costs A's gradient (dC·Bᵀ) and B's (Aᵀ·dC), both its size
    assert backward == {stack: 2 * macs for stack, macs in SELF.items()}
    for phase, stacks in (("forward", forward), ("backward", backward)):
        widths = inclusive(stacks)
        assert all(widths[frame(path)] == prof.total(path, phase=phase) for path in prof.by_module() if path
                   and prof.total(path, phase=phase))
    both = inclusive(forward) + inclusive(backward)
    assert {path: both[frame(path)] for path in INCLUSIVE} == {path: 3 * macs for path, macs in INCLUSIVE.items()}
    assert {path: both[frame(path)] for path in INCLUSIVE} == {path: prof.by_module()[path] for path in INCLUSIVE}


def test_folded_paths_naming() -> None:
    assert folded_paths("out.folded", ["forward"]) == {"forward": Path("out.folded")}
    assert folded_paths("a/out.folded", ["forward", "backward", "recompute"]) == {
        "forward": Path("a/out.forward.folded"), "backward": Path("a/out.backward.folded"),
        "recompute": Path("a/out.recompute.folded")}
    assert folded_paths("stacks", ["forward", "backward"])["backward"] == Path("stacks.backward")


def test_frame_names_never_break_the_format() -> None:
    assert frame_name("") == ROOT_FRAME
    assert frame_name("layers.0.attn") == "layers.0.attn"
    assert frame_name("odd;name\nhere") == "odd_name_here"


def test_speedscope_document_parses_back(tmp_path: Path) -> None:
    x = torch.zeros(1, N, D, requires_grad=True)
    prof = flopscope.profile(Net(), x, backward=True)
    path = prof.export_speedscope(tmp_path / "net.speedscope.json")
    doc = json.loads(path.read_text())
    assert doc["$schema"] == "https://www.speedscope.app/file-format-schema.json"
    frames = [f["name"] for f in doc["shared"]["frames"]]
    assert len(frames) == len(set(frames)) and all(isinstance(f, str) for f in frames)
    assert [p["name"] for p in doc["profiles"]] == ["flopscope forward (MACs)", "flopscope backward (MACs)"]
    for profile, scale in zip(doc["profiles"], (1, 2), strict=True):
        assert profile["type"] == "sampled" and profile["unit"] == "none"
        assert len(profile["samples"]) == len(profile["weights"])
        assert all(isinstance(w, int) and w > 0 for w in profile["weights"])
        assert profile["startValue"] == 0 and profile["endValue"] == sum(profile["weights"])
        stacks = {tuple(frames[i] for i in sample): w for sample, w in zip(profile["samples"], profile["weights"],
                                                                            strict=True)}
        assert stacks == {stack: scale * macs for stack, macs in SELF.items()}
        assert profile["endValue"] == scale * INCLUSIVE[""]
    assert doc["profiles"][0]["samples"][0] == [frames.index(ROOT_FRAME), frames.index("proj")]  # first-run order


def test_unwritable_path_is_named(tmp_path: Path) -> None:
    prof = flopscope.profile(Net(), torch.zeros(1, N, D))
    missing = tmp_path / "no" / "such" / "dir" / "net.folded"
    with pytest.raises(flopscope.FlopscopeError, match=r"net\.folded"):
        prof.export_folded(missing)
    with pytest.raises(flopscope.FlopscopeError, match=r"net\.json"):
        prof.export_speedscope(tmp_path / "no" / "net.json")


def test_by_stack_sums_to_the_queries() -> None:
    prof = flopscope.profile(Net(), torch.zeros(1, N, D, requires_grad=True), backward=True)
    for phase in ("forward", "backward"):
        assert sum(prof.by_stack(phase).values()) == prof.total(phase=phase)
    assert sum(prof.by_stack().values()) == prof.total()
    assert prof.by_stack("forward") == {tuple("" if f == ROOT_FRAME else f for f in stack): macs
                                        for stack, macs in SELF.items()}


def test_cli_writes_both_formats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from flopscope.cli import main
    from flopscope.studies.models import TransformerBlock

    n, d, h, d_ff = 32, 64, 4, 256
    folded, speedscope = tmp_path / "block.folded", tmp_path / "block.json"
    assert main(["profile", "flopscope.studies.models:TransformerBlock", "--set", f"d={d}", "--set", f"h={h}", "--set",
                 f"d_ff={d_ff}", "--input", f"1x{n}x{d}", "--backward", "--folded", str(folded), "--speedscope",
                 str(speedscope)]) == 0
    forward_file, backward_file = tmp_path / "block.forward.folded", tmp_path / "block.backward.folded"
    assert f"wrote {forward_file}, {backward_file}" in capsys.readouterr().out
    forward = parse_folded(forward_file)
    for projection in ("q_proj", "k_proj", "v_proj", "out_proj"):
        assert forward[(ROOT_FRAME, "attention", f"attention.{projection}")] == n * d * d
    assert forward[(ROOT_FRAME, "attention")] == 2 * n * n * d  # the attention core, in the module's own forward
    assert forward[(ROOT_FRAME, "ffn", "ffn.up")] == forward[(ROOT_FRAME, "ffn", "ffn.down")] == n * d * d_ff
    assert sum(forward.values()) == n * (4 * d * d + 2 * d * d_ff) + 2 * n * n * d
    prof = flopscope.profile(TransformerBlock(d, h, d_ff), torch.zeros(1, n, d), backward=True)
    assert parse_folded(backward_file) == {tuple(frame(p) for p in stack): macs
                                           for stack, macs in prof.by_stack("backward").items() if macs}
    doc = json.loads(speedscope.read_text())
    assert [p["endValue"] for p in doc["profiles"]] == [prof.total(phase="forward"), prof.total(phase="backward")]
