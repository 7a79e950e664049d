"""Plots (the ``plot`` extra: matplotlib): the scaling plot, the role-share bar chart and the roofline, saved as
PNG."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import FlopscopeError

if TYPE_CHECKING:
    from .profile import Profile
    from .roofline import Roofline
    from .scaling import Scaling


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise FlopscopeError("plots need matplotlib: pip install 'flopscope[plot]'") from e
    return plt


def scaling_plot(result: Scaling, path: str | Path, title: str = "") -> Path:
    """Measured points and exact polynomial per role on log-log axes, reference slopes 1 (n·d²) and 2
    (n²·d), and the length at which attention overtakes projections + FFN."""
    plt = _pyplot()
    lengths = list(result.lengths)
    fig, ax = plt.subplots(figsize=(8, 5.5))
    steps = int(8 * math.log2(lengths[-1] / lengths[0])) + 1
    dense = sorted({round(lengths[0] * 2 ** (i / 8)) for i in range(steps)} | set(lengths))
    for role, poly in result.polynomials.items():
        values = result.measured[role]
        if not any(values) or poly is None:
            continue
        (line,) = ax.plot(dense, [float(poly(n)) for n in dense], linewidth=1.2, label=f"{role}: {poly}")
        ax.plot(lengths, values, "o", color=line.get_color(), markersize=4)
    top = max(max(v) for v in result.measured.values() if any(v))
    for slope, style in ((1, ":"), (2, "--")):
        anchor = top / 8
        ax.plot(lengths, [anchor * (n / lengths[-1]) ** slope for n in lengths], style, color="grey",
                label=f"slope {slope} ({'n·d²' if slope == 1 else 'n²·d'})")
    crossover = result.crossover()
    if crossover is not None and lengths[0] <= crossover <= 4 * lengths[-1]:
        ax.axvline(crossover, color="black", linewidth=0.8)
        ax.annotate(f"attention > projections + FFN from n = {crossover:,}", (crossover, top / 100),
                    rotation=90, fontsize=8, ha="right")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length n")
    ax.set_ylabel("MACs (1 MAC = 2 FLOPs)")
    ax.set_title(title or "multiplies per role against sequence length (points measured, lines exact)")
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(True, which="both", alpha=0.2)
    return _save(fig, plt, path)


def role_share_plot(prof: Profile, path: str | Path, title: str = "") -> Path:
    """A horizontal bar per role: its share of all multiplies, with its MACs."""
    plt = _pyplot()
    roles = {role: macs for role, macs in prof.by_role().items() if macs}
    total = sum(roles.values()) or 1
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(roles) + 1.5))
    names = list(roles)[::-1]
    shares = [100 * roles[r] / total for r in names]
    bars = ax.barh(names, shares)
    for bar, role in zip(bars, names, strict=True):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {roles[role]:,} MACs", va="center",
                fontsize=8)
    ax.set_xlabel("share of multiplies (%)")
    ax.set_xlim(0, max(shares) * 1.35)
    ax.set_title(title or f"roles: {total:,} MACs = {2 * total:,} FLOPs")
    return _save(fig, plt, path)


def _save(fig: Any, plt: Any, path: str | Path) -> Path:
    out = Path(path)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def roofline_plot(result: Roofline, path: str | Path, title: str = "") -> Path:
    """Log-log roofline: attainable FLOP/s against arithmetic intensity, a point per role (circles) and per step
    (squares) at its intensity and its roofline-limited rate (the measured rate in real mode, hollow)."""
    plt = _pyplot()
    if result.peak_flops is None or result.bandwidth is None:
        raise FlopscopeError("a roofline plot needs the device's peak FLOP/s and bandwidth (pass peak= and "
                             "bandwidth=)")
    peak, bandwidth = result.peak_flops, result.bandwidth
    points = [p for p in (*result.roles, *result.steps) if p.intensity]
    lows = [p.intensity for p in points if p.intensity] + [result.ridge or 1.0]
    x = [min(lows) / 4, max(lows) * 4]
    fig, ax = plt.subplots(figsize=(8, 5.5))
    ridge = peak / bandwidth
    ax.plot([x[0], ridge, x[1]], [x[0] * bandwidth, peak, peak], color="black", linewidth=1.5)
    for p in points:
        intensity = p.intensity or 0.0
        attainable = min(peak, intensity * bandwidth)
        marker = "s" if p in result.steps else "o"
        ax.scatter([intensity], [attainable], marker=marker, zorder=3)
        ax.annotate(p.name, (intensity, attainable), fontsize=7, xytext=(3, 3), textcoords="offset points")
        if p.measured_seconds:
            ax.scatter([intensity], [p.flops / p.measured_seconds], marker=marker, facecolors="none",
                       edgecolors="grey", zorder=3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOPs per byte)")
    ax.set_ylabel("FLOP/s")
    ax.set_title(title or f"roofline: ridge at {ridge:.1f} FLOPs/byte ({result.dtype})")
    return _save(fig, plt, path)
