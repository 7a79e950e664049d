"""Numbers for people: SI prefixes (``1234567890, "MAC"`` -> ``"1.23 GMAC"``), used by
every report and plot."""

from __future__ import annotations

PREFIXES = ((10**15, "P"), (10**12, "T"), (10**9, "G"), (10**6, "M"), (10**3, "K"))
"""The prefixes of :func:`human`, largest first."""


def human(value: float, unit: str) -> str:
    """``1234567890, "MAC"`` -> ``"1.23 GMAC"``; below a thousand the plain value
    (``"512 MAC"``)."""
    for scale, prefix in PREFIXES:
        if abs(value) >= scale:
            return f"{value / scale:.2f} {prefix}{unit}"
    return f"{value:g} {unit}"


def times(ratio: float) -> str:
    """A ratio for people, as a decimal with three significant digits and an ``x``:
    ``870/427`` -> ``"2.04x"``, ``1/2`` -> ``"0.5x"``, ``2`` -> ``"2x"``; from 1,000
    a whole number with separators (``"1,234x"``)."""
    return f"{ratio:,.0f}x" if abs(ratio) >= 1000 else f"{ratio:.3g}x"
