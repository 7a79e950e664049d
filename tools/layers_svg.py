"""Draw the package's layers and the imports between them as an SVG (docs/layers.svg).

The layers are ``tests/test_layers.py``'s ``LAYERS`` (lowest at the bottom); each box lists its folders and modules
with their lines of code; an arc on the right joins two layers when a module of the upper one imports a module of
the lower one (its label: how many modules import across). The same walk as the layering test measures the imports,
so the picture is redrawn from the code:

    python tools/layers_svg.py [docs/layers.svg]
"""

from __future__ import annotations

import sys
from collections import Counter
from html import escape
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

import test_layers  # noqa: E402  (the layering test's own walk and layer table)

WIDTH, BOX, GAP, LEFT = 760, 46, 14, 20
"""Picture width, box height, gap between boxes, left margin (pixels)."""


def _lines(place: str) -> int:
    """Lines of code of a top-level module or folder of the package."""
    path = test_layers.PACKAGE / place
    files = sorted(path.rglob("*.py")) if path.is_dir() else [path.with_suffix(".py")]
    return sum(len(f.read_text().splitlines()) for f in files if f.exists())


def layer_edges() -> Counter[tuple[int, int]]:
    """``{(upper layer, lower layer): modules of the upper that import the lower}``."""
    edges: Counter[tuple[int, int]] = Counter()
    for name, targets in test_layers.graph().items():
        here = test_layers.LAYER_OF[test_layers.place(name)]
        for below in {test_layers.LAYER_OF[test_layers.place(t)] for t in targets} - {here}:
            edges[here, below] += 1
    return edges


def draw() -> str:
    layers = test_layers.LAYERS
    count = len(layers)
    top = 40
    height = top + count * (BOX + GAP) + 20
    y = {i: top + (count - 1 - i) * (BOX + GAP) for i in range(count)}  # lowest layer at the bottom
    box_width = 470
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
             f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">',
             '<defs><marker id="a" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="7" markerHeight="7" '
             'orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#6b7280"/></marker></defs>',
             f'<text x="{LEFT}" y="22" font-size="14" font-weight="bold">flopscope: layers, lowest at the bottom; '
             'arcs: imports (count of importing modules)</text>']
    for i, (title, names) in enumerate(layers):
        shown = [f"{n}/" if (test_layers.PACKAGE / n).is_dir() else f"{n}.py" for n in names]
        loc = sum(_lines(n) for n in names)
        parts.append(f'<rect x="{LEFT}" y="{y[i]}" width="{box_width}" height="{BOX}" rx="6" fill="#eef2ff" '
                     'stroke="#6366f1"/>')
        parts.append(f'<text x="{LEFT + 10}" y="{y[i] + 18}" font-weight="bold">{escape(title)}</text>')
        parts.append(f'<text x="{LEFT + 10}" y="{y[i] + 36}" fill="#374151">{escape("  ".join(shown))} '
                     f'({loc:,} lines)</text>')
    right = LEFT + box_width
    for k, ((upper, lower), n) in enumerate(sorted(layer_edges().items(), key=lambda e: (e[0][0] - e[0][1], e[0]))):
        x = right + 14 + 9 * (k % 26)
        y0, y1 = y[upper] + BOX / 2, y[lower] + BOX / 2
        parts.append(f'<path d="M{right},{y0} C{x},{y0} {x},{y1} {right + 2},{y1}" fill="none" stroke="#6b7280" '
                     f'stroke-opacity="0.55" marker-end="url(#a)"><title>{escape(layers[upper][0])} imports '
                     f'{escape(layers[lower][0])}: {n} modules</title></path>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else ROOT / "docs" / "layers.svg"
    out.write_text(draw())
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
