"""Plots (the ``plot`` extra: matplotlib): the scaling plot, the role-share bar chart,
the roofline and a trace's timeline, saved as PNG."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import FlopscopeError
from .numbers import human

if TYPE_CHECKING:
    from ..predict.polynomial import Scaling
    from .view import ProfileView


def pyplot() -> Any:
    """matplotlib's pyplot on the headless Agg backend (a clear error naming the extra
    without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise FlopscopeError("plots need matplotlib: pip install 'torch-flopscope[plot]'") from e
    return plt


def scaling_plot(result: Scaling, path: str | Path, title: str = "") -> Path:
    """Measured points and exact polynomial per role on log-log axes, reference slopes 1
    (n·d²) and 2 (n²·d), and the length at which attention overtakes projections +
    FFN."""
    plt = pyplot()
    lengths = list(result.lengths)
    fig, ax = plt.subplots(figsize=(8, 5.5))
    steps = int(8 * math.log2(lengths[-1] / lengths[0])) + 1
    dense = sorted({round(lengths[0] * 2 ** (i / 8)) for i in range(steps)} | set(lengths))
    for role, poly in result.polynomials.items():
        values = result.measured[role]
        if not any(values) or poly is None:
            continue
        (line,) = ax.plot(dense, [float(poly(n)) for n in dense], linewidth=1.2,
                          label=f"{role}: {poly}")
        ax.plot(lengths, values, "o", color=line.get_color(), markersize=4)
    top = max(max(v) for v in result.measured.values() if any(v))
    for slope, style in ((1, ":"), (2, "--")):
        anchor = top / 8
        ax.plot(lengths, [anchor * (n / lengths[-1]) ** slope for n in lengths], style,
                color="grey",
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
    ax.set_title(title or "multiplies per role against sequence length (points measured, lines "
                          "exact)")
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(True, which="both", alpha=0.2)
    return save_figure(fig, plt, path)


def role_share_plot(prof: ProfileView, path: str | Path, title: str = "") -> Path:
    """A horizontal bar per role: its share of all multiplies, with its MACs."""
    plt = pyplot()
    roles = {role: macs for role, macs in prof.by_role().items() if macs}
    total = sum(roles.values()) or 1
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(roles) + 1.5))
    names = list(roles)[::-1]
    shares = [100 * roles[r] / total for r in names]
    bars = ax.barh(names, shares)
    for bar, role in zip(bars, names, strict=True):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {roles[role]:,} MACs",
                va="center",
                fontsize=8)
    ax.set_xlabel("share of multiplies (%)")
    ax.set_xlim(0, max(shares) * 1.35)
    ax.set_title(title or f"roles: {total:,} MACs = {2 * total:,} FLOPs")
    return save_figure(fig, plt, path)


DPI = 120
"""Dots per inch of every saved plot (and of the figures whose labels are laid out: the
same pixels)."""


def save_figure(fig: Any, plt: Any, path: str | Path, layout: bool = True) -> Path:
    """Write ``fig`` to ``path`` (PNG, :data:`DPI`) and close it; ``layout=False`` when
    its layout is done (labels placed in pixels: :func:`place_labels`)."""
    out = Path(path)
    if layout:
        fig.tight_layout()
    fig.savefig(out, dpi=DPI)
    plt.close(fig)
    return out


_SAME_PLACE = 6.0  # pixels: points closer than this in both directions share one label
_OFFSETS = tuple((radius * math.cos(math.radians(angle)), radius * math.sin(math.radians(angle)))
                 for radius in (5, 12, 20, 30, 42, 56, 72, 90, 110, 135, 165)
                 for angle in (30, -30, 90, -90, 150, -150, 0, 180, 60, -60, 120, -120))
"""Where a label may go, nearest first: offsets from its point in points (1/72 inch),
around it at growing distances."""


def place_labels(fig: Any, ax: Any, points: Sequence[tuple[float, float, str]],
                 obstacles: Sequence[tuple[float, float]] = (), fontsize: float = 7) -> list[Any]:
    """Label ``points`` (``(x, y, text)`` in data coordinates) on ``ax`` so that no two
    labels overlap, no label covers a point (``points`` and ``obstacles``, data
    coordinates) and each stays inside the axes: points at the same place (within a
    few pixels) share one label (their texts joined, :func:`_joined`); each label
    goes to the nearest free place around its point (:data:`_OFFSETS`), with a thin
    line to its point when it is not next to it. Call it once the axes' limits and
    the figure's layout are final (it measures text in pixels); returns the labels
    (matplotlib ``Annotation`` s)."""
    renderer = fig.canvas.get_renderer()
    to_pixels = ax.transData.transform
    groups: list[tuple[tuple[float, float], list[str], list[tuple[float, float]]]] = []
    for x, y, text in points:
        px, py = to_pixels((x, y))
        for anchor, texts, members in groups:
            if abs(anchor[0] - px) <= _SAME_PLACE and abs(anchor[1] - py) <= _SAME_PLACE:
                texts.append(text)
                members.append((x, y))
                break
        else:
            groups.append(((px, py), [text], [(x, y)]))
    area = ax.get_window_extent(renderer)
    marks = [to_pixels(xy) for xy in [(x, y) for x, y, _ in points] + list(obstacles)]
    taken: list[Any] = []
    labels = []
    for _, texts, members in sorted(groups, key=lambda g: (-len(g[1]), g[0][0], -g[0][1])):
        text, xy = _joined(texts), members[0]
        for dx, dy in _OFFSETS:
            label = _label(ax, text, xy, dx, dy, fontsize)
            box = text_box(label, renderer).padded(2)
            inside = box.x0 >= area.x0 and box.x1 <= area.x1 and box.y0 >= area.y0 and box.y1 <= area.y1
            if inside and not any(box.overlaps(other) for other in taken) and not any(
                    box.x0 <= mx <= box.x1 and box.y0 <= my <= box.y1 for mx, my in marks):
                break
            label.remove()
        else:  # no free place anywhere: the nearest one
            dx, dy = _OFFSETS[0]
            label = _label(ax, text, xy, dx, dy, fontsize)
            box = text_box(label, renderer).padded(2)
        if math.hypot(dx, dy) > 6:  # away from its point: a thin line to it
            label.remove()
            label = _label(ax, text, xy, dx, dy, fontsize, line=True)
        taken.append(box)
        labels.append(label)
    return labels


def text_box(label: Any, renderer: Any) -> Any:
    """The box (display pixels) of an ``Annotation``'s text alone, not of its line to
    its point."""
    from matplotlib.text import Text

    label.update_positions(renderer)
    return Text.get_window_extent(label, renderer)


def _label(ax: Any, text: str, xy: tuple[float, float], dx: float, dy: float, fontsize: float,
           line: bool = False) -> Any:
    """``text`` at ``(dx, dy)`` points from ``xy``, aligned away from it (a thin grey
    line to it with ``line``)."""
    arrow = {"arrowstyle": "-", "color": "grey", "linewidth": 0.5, "shrinkA": 0, "shrinkB": 3} if line else None
    return ax.annotate(text, xy, xytext=(dx, dy), textcoords="offset points", fontsize=fontsize,
                       ha="left" if dx > 1e-9 else "right" if dx < -1e-9 else "center",
                       va="bottom" if dy > 1e-9 else "top" if dy < -1e-9 else "center",
                       arrowprops=arrow)


def _joined(texts: Sequence[str]) -> str:
    """The texts of points at one place as one label: ``step 2 (decode)`` ... ``step 5
    (decode)`` as ``steps 2–5 (decode)``, the rest joined by commas, lines of at most
    :data:`_LINE` characters where they fit."""
    steps: dict[str, list[int]] = {}
    others: list[str] = []
    for text in texts:
        found = re.fullmatch(r"step (\d+) \((.+)\)", text)
        if found:
            steps.setdefault(found[2], []).append(int(found[1]))
        else:
            others.append(text)
    for phase, numbers in steps.items():
        numbers.sort()
        runs: list[list[int]] = []
        for number in numbers:
            if runs and number == runs[-1][-1] + 1:
                runs[-1].append(number)
            else:
                runs.append([number])
        shown = ", ".join(f"{run[0]}–{run[-1]}" if len(run) > 1 else f"{run[0]}" for run in runs)
        others.append(f"step{'s' if len(numbers) > 1 else ''} {shown} ({phase})")
    lines: list[str] = []
    for text in others:
        if lines and len(lines[-1]) + 2 + len(text) <= _LINE:
            lines[-1] += ", " + text
        else:
            lines.append(text)
    return "\n".join(lines)


_LINE = 40  # characters of a label's line


def trace_plot(trace: Mapping[str, Any] | str | Path, path: str | Path, title: str = "") -> Path:
    """A timeline of a trace (:meth:`Profile.export_chrome_trace`'s JSON, its dict, or a
    ``torch.profiler`` trace that :func:`flopscope.trace.merge_torch_trace` laid role
    ranges over): one row per role track, a bar at each op's start and duration,
    labelled with the role and its MACs; above them one row of module calls, nested
    calls in lanes below their callers (``profiler(trace=True)``'s
    ``flopscope/<path>`` ranges in a torch trace), each named where it is wide
    enough. Headless (matplotlib's Agg backend): what a trace viewer shows, as a PNG."""
    plt = pyplot()
    doc = _trace_doc(trace)
    roles, calls = _trace_rows(doc)
    if not roles and not calls:
        raise FlopscopeError("no flopscope events in this trace: give the JSON of "
                             "Profile.export_chrome_trace, or a torch.profiler trace after "
                             "flopscope.trace.merge_torch_trace")
    starts = [s for bars in roles.values() for s, *_ in bars] + [s for _, s, _, _ in calls]
    ends = [s + d for bars in roles.values() for s, d, *_ in bars] + [e for _, _, e, _ in calls]
    origin, span = min(starts), max(max(ends) - min(starts), 1e-9)
    scale, unit = (1e-3, "ms") if span > 5e3 else (1.0, "µs")
    lanes = 1 + max((depth for *_, depth in calls), default=0) if calls else 0
    # the module row: up to three rows high, a lane per depth of nesting
    module_height = 0.8 * min(lanes, 3)
    lane = module_height / max(lanes, 1)
    fig, ax = plt.subplots(figsize=(12, 0.42 * len(roles) + 0.42 * module_height / 0.8 + 1.6))
    colours = plt.get_cmap("tab20").colors
    ticks, labels = [], []
    if calls:
        for name, start, end, depth in calls:
            y = depth * lane
            ax.broken_barh([((start - origin) * scale, (end - start) * scale)], (y, lane * 0.92),
                           facecolors="#c8d3e0", edgecolors="#5a6b80", linewidth=0.4)
            if (end - start) > 0.035 * span:
                ax.text((start - origin + (end - start) / 2) * scale, y + lane * 0.46, _short(name),
                        ha="center",
                        va="center", fontsize=6, clip_on=True)
        ticks.append(module_height / 2)
        labels.append("module calls")
    top = module_height + (0.3 if calls else 0.0)
    for k, (role, bars) in enumerate(roles.items()):
        y = top + k
        macs = sum(m for _, _, m, _ in bars)
        ax.broken_barh([((s - origin) * scale, max(d * scale, span * scale * 1e-3)) for s, d, _, _ in bars],
                       (y, 0.8), facecolors=colours[k % len(colours)])
        ticks.append(y + 0.4)
        # a fused QKV GEMM: 3
        carried = list(dict.fromkeys([role, *(r for *_, parts in bars for r in parts)]))
        labels.append(f"{', '.join(carried)} ({human(macs, 'MACs')})" if macs else role)
    ax.set_yticks(ticks, labels, fontsize=8)
    ax.set_ylim(top + len(roles) + 0.1, -0.1)
    ax.set_xlim(0, span * scale * 1.01)
    ax.set_xlabel(f"time ({unit})")
    other = doc.get("otherData", {})
    clock = other.get("time", "torch.profiler's clock" if "flopscope" in other else "")
    total = other.get("total_macs", other.get("flopscope", {}).get("total_macs"))
    ax.set_title(title or (human(total, "MACs") if total else "trace") + (f"; time: {clock}" if clock else ""),
                 fontsize=10)
    ax.grid(True, axis="x", alpha=0.2)
    return save_figure(fig, plt, path)


def _trace_doc(trace: Mapping[str, Any] | str | Path) -> Mapping[str, Any]:
    if not isinstance(trace, (str, Path)):
        return trace
    try:
        doc = json.loads(Path(trace).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FlopscopeError(f"cannot read the trace {trace}: {e}") from e
    if not isinstance(doc, dict):
        raise FlopscopeError(f"{trace} is not a trace (a JSON object with traceEvents)")
    return doc


def _trace_rows(doc: Mapping[str, Any]) -> tuple[dict[str, list[tuple[float, float, int,
                                                                      list[str]]]],
                                                 list[tuple[str, float, float, int]]]:
    """``({track role: [(start, duration, MACs, roles with MACs)]}, [(module, start,
    end, depth)])`` of a trace's flopscope events."""
    events = [e for e in doc.get("traceEvents", []) if isinstance(e, dict)]
    processes = {e.get("pid"): e.get("args", {}).get("name") for e in events
                 if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {(e.get("pid"), e.get("tid")): e.get("args", {}).get("name") for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    role_pids = {pid for pid, name in processes.items() if name in ("ops by role",
                                                                    "flopscope roles")}
    roles: dict[str, list[tuple[float, float, int, list[str]]]] = {}
    for e in sorted((e for e in events if e.get("ph") == "X" and e.get("pid") in role_pids),
                    key=lambda e: (e.get("tid", 0), float(e["ts"]))):
        args = e.get("args", {})
        role = threads.get((e["pid"], e.get("tid"))) or args.get("role") or e["name"]
        parts = [r for r, macs in args.get("roles", {}).items() if macs]
        roles.setdefault(role, []).append((float(e["ts"]), float(e.get("dur", 0)),
                                           int(args.get("macs", 0)), parts))
    spans: list[tuple[str, float, float]] = []
    module_pids = {pid for pid, name in processes.items() if name == "module calls"}
    open_calls: dict[Any, list[tuple[str, float]]] = {}
    for e in events:
        if e.get("pid") in module_pids and e.get("ph") in ("B", "E"):
            stack = open_calls.setdefault((e["pid"], e.get("tid")), [])
            if e["ph"] == "B":
                stack.append((e["name"], float(e["ts"])))
            elif stack:
                name, start = stack.pop()
                spans.append((name, start, float(e["ts"])))
        # profiler(trace=True)
        elif e.get("ph") == "X" and str(e.get("name", "")).startswith("flopscope/"):
            spans.append((e["name"][len("flopscope/"):], float(e["ts"]),
                          float(e["ts"]) + float(e.get("dur", 0))))
    calls: list[tuple[str, float, float, int]] = []
    enclosing: list[float] = []  # the ends of the calls the next one may sit in
    for name, start, end in sorted(spans, key=lambda s: (s[1], -s[2])):
        while enclosing and start >= enclosing[-1]:
            enclosing.pop()
        calls.append((name, start, end, len(enclosing)))
        enclosing.append(end)
    return roles, calls


def _short(module: str) -> str:
    """The last part of a module path (with its parent's for a numbered layer: ``h.0``)."""
    parts = module.split(".")
    return ".".join(parts[-2:]) if len(parts) > 1 and parts[-1].isdigit() else parts[-1]

