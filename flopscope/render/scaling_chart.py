"""The scaling picture of the seed study, as an inline SVG (no script, no network): MACs
per role against the sequence length n on log-log axes, each role's exact polynomial
as a line and its measured counts as points on it, the attention core (scores +
weighted sum, ``n²·d``) and the projections + FFN (``n·d²``) summed as two heavier
lines, and the length where the first overtakes the second marked and labelled.

Every measured point is a ``<circle class=point>`` carrying ``data-role``, ``data-n``
and ``data-macs`` (the profile's own count, exact digits); the crossover a ``<line
class=crossover data-n>`` and its label ``<text id=crossover data-n>``: what a browser
test reads back. Units: MACs (FLOPs = 2 x MACs)."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from typing import Any

WIDTH, HEIGHT = 760, 440
LEFT, RIGHT, TOP, BOTTOM = 78, 210, 16, 44  # margins: the legend on the right
SAMPLES = 96  # points of each line, evenly spaced in log n


def chart_data(scaling: Any) -> dict[str, Any]:
    """The picture's numbers from a :class:`flopscope.Scaling`: ``points`` ``[role, n,
    MACs]`` measured, ``lines`` ``{name: [[n, MACs], ...]}`` of the polynomials
    (roles, then ``"attention core"`` and ``"projections + FFN"``), ``crossover``
    (the smallest n where the core costs more, ``None`` if never or past 64 times the
    longest length measured) and the ``span`` of n drawn: the lengths measured, and
    on to 1.25 times the crossover (the polynomials are exact there too)."""
    # (every attribute value of a self-closing element is quoted: an unquoted one would
    # take the "/" of "/>")
    lengths = list(scaling.lengths)
    crossover = scaling.crossover()
    shown = crossover if crossover is not None and lengths[0] <= crossover <= 64 * lengths[-1] else None
    low, high = lengths[0], max(lengths[-1], int(shown * 1.25) if shown else 0)
    grid = sorted({round(low * (high / low) ** (i / (SAMPLES - 1))) for i in range(SAMPLES)} | set(lengths))
    points, lines = [], {}
    for role, poly in scaling.polynomials.items():
        values = scaling.measured[role]
        if poly is None or not any(values):
            continue
        points += [[role, n, int(macs)] for n, macs in zip(lengths, values, strict=True) if macs > 0]
        lines[role] = [[n, int(poly(n))] for n in grid]
    for name, poly in (("attention core", scaling.attention()),
                       ("projections + FFN", scaling.per_token())):
        if poly.degree >= 0 and any(poly(n) > 0 for n in grid):
            lines[name] = [[n, int(poly(n))] for n in grid]
    return {"points": points, "lines": lines, "crossover": shown, "span": [low, high],
            "variable": scaling.variable}


def chart_svg(chart: Mapping[str, Any], colours: Mapping[str, str]) -> str:
    """The inline SVG of :func:`chart_data`'s ``chart``; ``colours`` by role (the
    report's)."""
    values = [m for _, m in (pair for line in chart["lines"].values() for pair in line) if m > 0]
    values += [m for _, _, m in chart["points"]]
    if not values:
        return ""
    low, high = chart["span"]
    bottom_value = 10 ** math.floor(math.log10(min(values)))
    top_value = 10 ** math.ceil(math.log10(max(values)))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(n: float) -> float:
        return LEFT + plot_w * (math.log(n / low) / math.log(high / low) if high > low else 0.5)

    def y(macs: float) -> float:
        return TOP + plot_h * (1 - math.log(macs / bottom_value) / math.log(top_value / bottom_value))

    parts = [f"<svg id=scaling-chart viewBox='0 0 {WIDTH} {HEIGHT}' width={WIDTH} height={HEIGHT} "
             "role=img aria-label='MACs per role against n, log-log' "
             "xmlns='http://www.w3.org/2000/svg' font-family='system-ui, sans-serif' font-size=11>"]
    parts += _axes(x, y, low, high, bottom_value, top_value, chart["variable"])
    legend = []
    for name, line in chart["lines"].items():
        aggregate = name in ("attention core", "projections + FFN")
        colour = "#111" if name == "attention core" else "#777" if aggregate else colours.get(name, "#999")
        path = " ".join(f"{'M' if i == 0 else 'L'}{x(n):.1f},{y(m):.1f}" for i, (n, m) in enumerate(
            (n, m) for n, m in line if m > 0))
        if not path:
            continue
        dash = " stroke-dasharray='6 3'" if name == "projections + FFN" else ""
        parts.append(f"<path class='{'aggregate' if aggregate else 'curve'}' "
                     f"data-name='{html.escape(name)}' d='{path}' fill=none stroke='{colour}' "
                     f"stroke-width='{2.4 if aggregate else 1.3}'{dash}/>")
        legend.append((name, colour, dash, aggregate))
    for role, n, macs in chart["points"]:
        parts.append(f"<circle class=point data-role='{html.escape(role)}' data-n={n} "
                     f"data-macs={macs} cx={x(n):.1f} cy={y(macs):.1f} r=3.2 "
                     f"fill='{colours.get(role, '#999')}' stroke=white><title>{html.escape(role)}: "
                     f"{macs:,} MACs at {chart['variable']} = {n:,}</title></circle>")
    crossover = chart["crossover"]
    if crossover is not None:
        at = x(crossover)
        parts.append(f"<line class=crossover data-n={crossover} x1={at:.1f} x2={at:.1f} y1={TOP} "
                     f"y2={TOP + plot_h} stroke='#111' stroke-width=1 stroke-dasharray='2 2'/>")
        left = at > LEFT + plot_w / 2  # (the label on the side of the line with room for it)
        parts.append(f"<text id=crossover data-n={crossover} x={at - 4 if left else at + 4:.1f} "
                     f"y={TOP + 14} text-anchor={'end' if left else 'start'} fill='#111'>attention "
                     f"core &gt; projections + FFN from {chart['variable']} = {crossover:,}</text>")
    for i, (name, colour, dash, aggregate) in enumerate(legend):
        top = TOP + 6 + 16 * i
        parts.append(f"<line x1={WIDTH - RIGHT + 14} x2={WIDTH - RIGHT + 38} y1={top} y2={top} "
                     f"stroke='{colour}' stroke-width='{2.4 if aggregate else 1.6}'{dash}/><text "
                     f"x={WIDTH - RIGHT + 44} y={top + 4}>{html.escape(name)}</text>")
    parts.append("</svg>")
    return "".join(parts)


def _axes(x: Any, y: Any, low: int, high: int, bottom: float, top: float,
          variable: str) -> list[str]:
    """Frame, log ticks (powers of 2 in n, of 10 in MACs) and the axis titles."""
    plot_bottom, plot_right = HEIGHT - BOTTOM, WIDTH - RIGHT
    parts = [f"<path class=frame d='M{LEFT},{TOP} L{LEFT},{plot_bottom} "
             f"L{plot_right},{plot_bottom}' fill=none stroke='#444'/>"]
    power = 2 ** math.floor(math.log2(low))
    while power <= high:
        if power >= low:
            parts.append(f"<line x1={x(power):.1f} x2={x(power):.1f} y1={TOP} y2={plot_bottom} "
                         f"stroke='#eee'/><text x={x(power):.1f} y={plot_bottom + 16} "
                         f"text-anchor=middle>{power:,}</text>")
        power *= 2
    exponent = round(math.log10(bottom))
    while 10 ** exponent <= top:
        at = y(10 ** exponent)
        parts.append(f"<line x1={LEFT} x2={plot_right} y1={at:.1f} y2={at:.1f} stroke='#eee'/>"
                     f"<text x={LEFT - 6} y={at + 4:.1f} text-anchor=end>1e{exponent}</text>")
        exponent += 1
    parts.append(f"<text x={LEFT + (plot_right - LEFT) / 2:.1f} y={HEIGHT - 8} "
                 f"text-anchor=middle>sequence length {variable} (log scale)</text><text "
                 f"transform='translate(16 {TOP + (plot_bottom - TOP) / 2:.1f}) rotate(-90)' "
                 "text-anchor=middle>MACs (1 MAC = 2 FLOPs), log scale</text>")
    return parts
