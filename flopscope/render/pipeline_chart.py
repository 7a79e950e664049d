"""A diffusion pipeline's call in two inline SVG pictures (no script, no network), drawn
from plain data (never a profile):

- **by component**: one bar as wide as the page, a segment per component as wide as its
  share of the call's MACs, named where it is wide enough;
- **by step**: a bar per part of the call in the order it ran: the calls before the
  denoising loop (the prompt's encoding), one bar per denoising step (its denoisers
  stacked: a UNet and a ControlNet), the calls after the loop (the VAE decode); a linear
  axis of MACs on the left, of FLOPs (2 x MACs) on the right, and each run of identical
  steps labelled once (``28 steps × 37.19 TMAC``).

A component has one colour in both (:func:`component_colours`). Each bar is a ``<g
class=bar>`` carrying ``data-kind`` (``before``, ``step``, ``after``), ``data-step`` (a
step's index) and ``data-macs`` (its MACs, exact digits); each of its segments a ``<rect
class=segment>`` with ``data-component`` and ``data-macs``, and a ``<title>`` giving
MACs and FLOPs exactly: what a person hovers and what the browser test reads back.
Units: MACs (FLOPs = 2 x MACs)."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

from .numbers import human

PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
           "#9c755f",
           "#bab0ac")
"""Component colours, in the pipeline's order of its components (then round again)."""

WIDTH, HEIGHT = 980, 330
# margins: MACs axis left, FLOPs axis and legend right, labels below
LEFT, RIGHT, TOP, BOTTOM = 84, 200, 30, 54
# width of the slot of the calls before / after the loop (its label and value fit in it)
OUTSIDE = 84
GAP = 14  # between the parts of the call
STRIP = 34  # height of the by-component bar


def component_colours(components: Sequence[str]) -> dict[str, str]:
    """A colour per component, by its place in the pipeline's order."""
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(components)}


def call_bars(before: Mapping[str, int], steps: Sequence[Any],
              after: Mapping[str, int]) -> list[dict[str, Any]]:
    """The bars of the by-step picture, JSON-ready: ``{"kind", "label", "step", "macs":
    {component: MACs}, "calls": {component: calls}, "guidance"}`` for the calls before
    the loop (if any MACs), each :class:`flopscope.pipeline.DenoisingStep`, and the
    calls after it (if any MACs); without steps, every call is before them
    (:meth:`flopscope.PipelineProfile.around_steps`), one bar labelled ``the call``."""
    bars = []
    if any(before.values()):  # (without steps, the whole call)
        bars.append({"kind": "before", "label": "before steps" if steps else "the call",
                     "step": None,
                     "macs": {c: m for c, m in before.items() if m}, "calls": {}, "guidance": None})
    bars += [{"kind": "step", "label": str(s.step), "step": s.step,
              "macs": {c: m for c, m in s.macs.items() if m},
              "calls": dict(s.calls), "guidance": s.guidance} for s in steps]
    if any(after.values()):
        bars.append({"kind": "after", "label": "after steps", "step": None,
                     "macs": {c: m for c, m in after.items() if m}, "calls": {}, "guidance": None})
    return bars


def runs(bars: Sequence[Mapping[str, Any]]) -> list[tuple[int, int]]:
    """``(first, last)`` indices of each run of consecutive step bars with the same MACs
    per component."""
    out: list[tuple[int, int]] = []
    for i, bar in enumerate(bars):
        if bar["kind"] != "step":
            continue
        if out and out[-1][1] == i - 1 and bars[i - 1]["macs"] == bar["macs"]:
            out[-1] = (out[-1][0], i)
        else:
            out.append((i, i))
    return out


def components_svg(totals: Mapping[str, int], colours: Mapping[str, str]) -> str:
    """The by-component bar: each component (with MACs) as wide as its share of the
    call."""
    total = sum(totals.values())
    if not total:
        return ""
    width = WIDTH - LEFT - RIGHT
    parts = [f"<svg id=components-chart class=pipeline-chart viewBox='0 0 {WIDTH} {STRIP + 4}' "
             f"width={WIDTH} height={STRIP + 4} role=img aria-label='MACs of the call by "
             "component' xmlns='http://www.w3.org/2000/svg' font-family='system-ui, sans-serif' "
             "font-size=12>"]
    x = float(LEFT)
    for name, macs in totals.items():
        if not macs:
            continue
        w = width * macs / total
        share = 100 * macs / total
        parts.append(f"<rect class=segment data-component='{html.escape(name)}' data-macs={macs} "
                     f"x={x:.2f} y=2 width={w:.2f} height={STRIP} "
                     f"fill='{colours.get(name, '#999')}' stroke=white><title>{_said(name, macs)}, "
                     f"{share:.1f}% of the call</title></rect>")
        text = f"{name} {share:.1f}%"
        if w >= 7 * len(text) + 8:
            parts.append(f"<text x={x + 5:.2f} y={2 + STRIP / 2 + 4:.1f} "
                         f"fill='#111'>{html.escape(text)}</text>")
        x += w
    parts.append(f"<text x={LEFT - 6} y={2 + STRIP / 2 + 4:.1f} text-anchor=end>the call</text>"
                 f"<text x={LEFT + width + 6} y={2 + STRIP / 2 + 4:.1f}>{human(total, 'MAC')} = "
                 f"{human(2 * total, 'FLOP')}</text></svg>")
    return "".join(parts)


def steps_svg(bars: Sequence[Mapping[str, Any]], colours: Mapping[str, str]) -> str:
    """The by-step picture of :func:`call_bars`' ``bars``."""
    totals = [sum(bar["macs"].values()) for bar in bars]
    if not bars or not max(totals):
        return ""
    top_value, ticks = _ticks(max(totals))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    outside = sum(1 for bar in bars if bar["kind"] != "step")
    stepped = len(bars) - outside
    slot = (plot_w - outside * (OUTSIDE + GAP)) / stepped if stepped else 0.0

    def y(macs: float) -> float:
        return TOP + plot_h * (1 - macs / top_value)

    parts = [f"<svg id=steps-chart class=pipeline-chart viewBox='0 0 {WIDTH} {HEIGHT}' "
             f"width={WIDTH} height={HEIGHT} role=img aria-label='MACs of each part of the call: "
             "before the steps, each denoising step, after the steps' "
             "xmlns='http://www.w3.org/2000/svg' font-family='system-ui, sans-serif' font-size=11>"]
    right = LEFT + plot_w
    for value in ticks:
        at = y(value)
        parts.append(f"<line x1={LEFT} x2={right} y1={at:.1f} y2={at:.1f} stroke='#eee'/>"
                     f"<text x={LEFT - 6} y={at + 4:.1f} "
                     f"text-anchor=end>{_short(value, 'MAC')}</text><text x={right + 6} "
                     f"y={at + 4:.1f}>{_short(2 * value, 'FLOP')}</text>")
    x, placed = float(LEFT), []
    for bar, total in zip(bars, totals, strict=True):
        width = OUTSIDE if bar["kind"] != "step" else slot
        if bar["kind"] == "after" and stepped:
            x += GAP
        inner = width - (max(1.0, min(0.2 * width, 12.0)) if width >= 3 else 0.0)
        left = x + (width - inner) / 2
        step = f" data-step={bar['step']}" if bar["step"] is not None else ""
        parts.append(f"<g class=bar data-kind={bar['kind']}{step} data-macs={total}>")
        base = 0
        for name, macs in bar["macs"].items():
            calls = bar["calls"].get(name)
            said = (f"{'step ' + bar['label'] if bar['kind'] == 'step' else bar['label']} · "
                    f"{_said(name, macs)}"
                    + (f" ({calls} call{'s' * (calls != 1)}" if calls else "")
                    + (f"; guidance by {bar['guidance']}" if calls and bar["guidance"] not in (None, "none") else "")
                    + (")" if calls else ""))
            parts.append(f"<rect class=segment data-component='{html.escape(name)}' "
                         f"data-macs={macs} x={left:.2f} y={y(base + macs):.2f} width={inner:.2f} "
                         f"height={y(base) - y(base + macs):.2f} "
                         f"fill='{colours.get(name, '#999')}'><title>{said}</title></rect>")
            base += macs
        parts.append("</g>")
        placed.append((x, width, total))
        x += width
        if bar["kind"] == "before" and stepped:
            x += GAP
    parts += _labels(bars, placed, slot, y)
    parts.append(f"<path class=frame d='M{LEFT},{TOP} L{LEFT},{TOP + plot_h} "
                 f"L{right},{TOP + plot_h} L{right},{TOP}' fill=none stroke='#444'/>"
                 f"<text transform='translate(14 {TOP + plot_h / 2:.1f}) rotate(-90)' "
                 f"text-anchor=middle>MACs per bar</text><text transform='translate({right + 76} "
                 f"{TOP + plot_h / 2:.1f}) rotate(90)' text-anchor=middle>FLOPs = 2 × MACs</text>")
    for i, name in enumerate(dict.fromkeys(c for bar in bars for c in bar["macs"])):
        top = TOP + 4 + 18 * i
        parts.append(f"<rect x={right + 92} y={top} width=12 height=12 "
                     f"fill='{colours.get(name, '#999')}'/><text x={right + 110} "
                     f"y={top + 10}>{html.escape(name)}</text>")
    parts.append("</svg>")
    return "".join(parts)


def _labels(bars: Sequence[Mapping[str, Any]], placed: Sequence[tuple[float, float, int]],
            slot: float,
            y: Any) -> list[str]:
    """Below the bars their names (every k-th step's number where the bars are narrow);
    above them their MACs, a run of identical steps labelled once over the run."""
    bottom = HEIGHT - BOTTOM
    out = []
    every = max(1, math.ceil(26 / slot)) if slot else 1
    for bar, (x, width, total) in zip(bars, placed, strict=True):
        middle = x + width / 2
        if bar["kind"] != "step":
            out.append(f"<text x={middle:.1f} y={bottom + 15} "
                       f"text-anchor=middle>{bar['label']}</text><text class=value x={middle:.1f} "
                       f"y={y(total) - 5:.1f} text-anchor=middle>{human(total, 'MAC')}</text>")
        elif bar["step"] % every == 0:
            out.append(f"<text x={middle:.1f} y={bottom + 15} "
                       f"text-anchor=middle>{bar['label']}</text>")
    for first, last in runs(bars):
        left, _, total = placed[first]
        right = placed[last][0] + placed[last][1]
        count = last - first + 1
        text = f"{count} steps × {human(total, 'MAC')}" if count > 1 else human(total, "MAC")
        out.append(f"<text class=value x={(left + right) / 2:.1f} y={y(total) - 5:.1f} "
                   f"text-anchor=middle>{text}</text>")
    stepped = [i for i, bar in enumerate(bars) if bar["kind"] == "step"]
    if stepped:
        left, (x, width, _) = placed[stepped[0]][0], placed[stepped[-1]]
        out.append(f"<text x={(left + x + width) / 2:.1f} y={bottom + 34} "
                   f"text-anchor=middle>denoising step ({len(stepped)})</text>")
    return out


def _ticks(highest: int) -> tuple[float, list[float]]:
    """The axis' top and its ticks: multiples of 1, 2 or 5 times a power of ten, four to
    eight of them."""
    rough = highest / 5
    power = 10 ** math.floor(math.log10(rough))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= rough)
    top = step * math.ceil(highest * 1.08 / step)  # (room above the tallest bar for its label)
    return top, [step * k for k in range(round(top / step) + 1)]


def _short(value: float, unit: str) -> str:
    """An axis tick: ``200 GMAC``, ``1.5 TFLOP`` (no trailing zeros)."""
    text = human(value, unit)
    number, _, rest = text.partition(" ")
    return (number.rstrip("0").rstrip(".") if "." in number else number) + " " + rest


def _said(name: str, macs: int) -> str:
    return f"{html.escape(name)}: {macs:,} MACs = {2 * macs:,} FLOPs"
