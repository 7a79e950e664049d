"""The roofline: each role (and each generation step) against a device's peak FLOP/s and
memory bandwidth.

A kernel that does ``F`` FLOPs and must move ``Q`` bytes
(:mod:`flopscope.formulas.traffic`) takes at least ``max(F / peak, Q / bandwidth)``
seconds. Its arithmetic intensity ``I = F / Q`` (FLOPs per byte) against the device's
ridge point ``peak / bandwidth`` says which bound applies: **memory-bound** when ``I <
ridge``, **compute-bound** otherwise (Williams, Waterman, Patterson, "Roofline", CACM
2009). A decode step at batch 1 reads every weight to use it for one token (``I ≈ 1`` at
16-bit weights): memory-bound on any accelerator; a long prefill reuses each weight for
every token: compute-bound.

Peaks come from :mod:`flopscope.peaks` (``peak=`` / ``bandwidth=`` override); a device
without a figure gives one warning and rows without a classification (the counts stay).
In real mode each row also carries the measured time of its ops
(:mod:`flopscope.predict.timing`; a step's is the wall time of its forward), and steps
carry MFU and MBU (memory-bandwidth utilisation: bytes moved per second over the
bandwidth).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tabulate import tabulate

from ..capture.records import captured
from ..errors import FlopscopeError
from ..hardware.peaks import peak_bandwidth, peak_flops
from ..render.plots import DPI, place_labels, pyplot, save_figure

if TYPE_CHECKING:
    from ..profile import Profile

COMPUTE, MEMORY = "compute", "memory"


@dataclass(frozen=True)
class RooflinePoint:
    """One role or step: its work, its traffic and what bounds it."""

    name: str  # a role, or "step 3 (decode)"
    flops: int  # 2 per MAC
    bytes: int
    bound: str | None  # "compute" / "memory"; None without both device figures
    predicted_seconds: float | None  # max(flops / peak, bytes / bandwidth)
    measured_seconds: float | None = None  # real mode

    @property
    def intensity(self) -> float | None:
        """FLOPs per byte (``None`` when nothing is moved)."""
        return self.flops / self.bytes if self.bytes else None


@dataclass(frozen=True)
class Roofline:
    peak_flops: float | None  # FLOP/s
    bandwidth: float | None  # bytes/s
    dtype: torch.dtype | None
    roles: tuple[RooflinePoint, ...]
    # one per forward (generation steps); empty for a single forward
    steps: tuple[RooflinePoint, ...]

    @property
    def ridge(self) -> float | None:
        """FLOPs per byte where the two bounds meet."""
        return self.peak_flops / self.bandwidth if self.peak_flops and self.bandwidth else None

    def point(self, name: str) -> RooflinePoint:
        return next(p for p in (*self.roles, *self.steps) if p.name == name)

    def utilisation(self, point: RooflinePoint) -> tuple[float | None, float | None]:
        """``(MFU, MBU)`` of a measured point: achieved FLOP/s over the peak, bytes/s
        over the bandwidth."""
        seconds = point.measured_seconds
        if not seconds:
            return None, None
        return (point.flops / seconds / self.peak_flops if self.peak_flops else None,
                point.bytes / seconds / self.bandwidth if self.bandwidth else None)

    def to_table(self, tablefmt: str = "simple") -> str:
        rows = []
        for p in (*self.roles, *self.steps):
            mfu, mbu = self.utilisation(p)
            rows.append([p.name, f"{p.flops:,}", f"{p.bytes:,}", _fmt(p.intensity, ".2f"),
                         p.bound or "-",
                         _fmt(p.predicted_seconds and p.predicted_seconds * 1e6, ".3f"),
                         _fmt(p.measured_seconds and p.measured_seconds * 1e6, ".1f"),
                         _fmt(mfu, ".2%"),
                         _fmt(mbu, ".2%")])
        head = (f"peak {_fmt(self.peak_flops and self.peak_flops / 1e12, '.1f')} TFLOP/s, "
                f"bandwidth {_fmt(self.bandwidth and self.bandwidth / 1e9, '.0f')} GB/s, ridge "
                f"{_fmt(self.ridge, '.1f')} FLOPs/byte ({self.dtype})")
        return head + "\n" + tabulate(rows, headers=["role / step", "FLOPs", "bytes", "FLOPs/byte",
                                                     "bound",
                                                     "roofline µs", "measured µs", "MFU", "MBU"],
                                      tablefmt=tablefmt, disable_numparse=True)

    def plot(self, path: str | Path, title: str = "") -> Path:
        """The roofline on log-log axes, a point per role and per step (PNG)."""
        return roofline_plot(self, path, title)


def roofline(prof: Profile, *, device: Any = None, dtype: torch.dtype | None = None,
             peak: float | None = None,
             bandwidth: float | None = None, measured: bool | None = None) -> Roofline:
    """Place every role and, when the profile holds several forwards, every step on the
    roofline of ``device`` (default: the current CUDA device, else this CPU,
    measured) for ``dtype`` (default: the dtype most of the multiplies ran in).
    ``peak`` (FLOP/s) and ``bandwidth`` (bytes/s) override. ``measured``: put a
    real-mode profile's measured times beside the roofline (default: only when no
    other ``device`` is named, since times taken here say nothing about another
    device)."""
    dtype = dtype if dtype is not None else _main_dtype(prof)
    top = peak_flops(device, dtype or torch.float32, peak=peak)
    band = peak_bandwidth(device, bandwidth=bandwidth)
    timed = prof.mode == "real" and (measured if measured is not None else device is None)
    measured_by_role = _measured_by_role(prof) if timed else {}
    macs, moved = prof.by_role(), prof.bytes_by_role()
    roles = tuple(_point(role, 2 * macs.get(role, 0), moved.get(role, 0), top, band,
                         measured_by_role.get(role))
                  for role in (*macs, *(r for r in moved if r not in macs)) if macs.get(role) or moved.get(role))
    steps = prof.steps()
    step_points = tuple(_point(f"step {s.step} ({s.phase})", s.flops, s.bytes, top, band,
                               s.seconds if timed else None)
                        for s in steps) if len(steps) > 1 else ()
    return Roofline(top, band, dtype, roles, step_points)


def _point(name: str, flops: int, size: int, peak: float | None, bandwidth: float | None,
           measured: float | None) -> RooflinePoint:
    if peak and bandwidth:
        bound = MEMORY if flops / peak < size / bandwidth else COMPUTE
        return RooflinePoint(name, flops, size, bound, max(flops / peak, size / bandwidth),
                             measured)
    return RooflinePoint(name, flops, size, None, None, measured)


def _main_dtype(prof: Profile) -> torch.dtype | None:
    dtypes: Counter[torch.dtype] = Counter()
    for node in prof.graph.nodes:
        op = captured(node)
        if op.macs and op.dtype is not None:
            dtypes[op.dtype] += op.macs
    return dtypes.most_common(1)[0][0] if dtypes else None


def _measured_by_role(prof: Profile) -> dict[str, float]:
    rows = prof.timing().rows
    return {row.name: row.seconds for row in rows}


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def bounds(points: Sequence[RooflinePoint]) -> dict[str, str | None]:
    """``{name: "compute" / "memory" / None}``."""
    return {p.name: p.bound for p in points}


def roofline_plot(result: Roofline, path: str | Path, title: str = "") -> Path:
    """Log-log roofline: attainable FLOP/s against arithmetic intensity, a point per
    role (circles) and per step (squares) at its intensity and its roofline-limited
    rate (the measured rate in real mode, hollow); labels laid out so that none
    overlaps another (points at one place share one:
    :func:`flopscope.plots.place_labels`)."""
    plt = pyplot()
    fig, _ = roofline_figure(result, title)
    return save_figure(fig, plt, path, layout=False)


def roofline_figure(result: Roofline, title: str = "") -> tuple[Any, list[Any]]:
    """The figure of :func:`roofline_plot` (laid out at :data:`flopscope.plots.DPI`) and
    its labels (matplotlib ``Annotation`` s), not saved."""
    plt = pyplot()
    if result.peak_flops is None or result.bandwidth is None:
        raise FlopscopeError("a roofline plot needs the device's peak FLOP/s and bandwidth (pass "
                             "peak= and bandwidth=)")
    peak, bandwidth = result.peak_flops, result.bandwidth
    points = [p for p in (*result.roles, *result.steps) if p.intensity]
    lows = [p.intensity for p in points if p.intensity] + [result.ridge or 1.0]
    x = [min(lows) / 4, max(lows) * 4]
    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=DPI)
    ridge = peak / bandwidth
    ax.plot([x[0], ridge, x[1]], [x[0] * bandwidth, peak, peak], color="black", linewidth=1.5)
    placed: list[tuple[float, float, str]] = []
    measured: list[tuple[float, float]] = []
    for p in points:
        intensity = p.intensity or 0.0
        attainable = min(peak, intensity * bandwidth)
        marker = "s" if p in result.steps else "o"
        ax.scatter([intensity], [attainable], marker=marker, zorder=3)
        placed.append((intensity, attainable, p.name))
        if p.measured_seconds:
            measured.append((intensity, p.flops / p.measured_seconds))
            ax.scatter(*zip(measured[-1], strict=True), marker=marker, facecolors="none",
                       edgecolors="grey",
                       zorder=3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(x[0], x[1])
    low = min([y for _, y in measured] + [x[0] * bandwidth])
    ax.set_ylim(low / 3, peak * 4)  # room for labels above the roof
    ax.set_xlabel("arithmetic intensity (FLOPs per byte)")
    ax.set_ylabel("FLOP/s")
    ax.set_title(title or f"roofline: ridge at {ridge:.1f} FLOPs/byte ({result.dtype})")
    fig.tight_layout()  # (before the labels: they are placed in pixels)
    return fig, place_labels(fig, ax, placed, measured)
