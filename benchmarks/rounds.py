"""Timing variants side by side: the benchmarks' one way to measure a ratio on a noisy machine.

Each round runs every variant once, in turn, the first of the round rotating (so none always runs first), each
after a ``gc.collect()`` outside its timing; the first ``warmup`` rounds are discarded. A ratio is the median of the
per-round ratios, so slow drift of the machine cancels.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def rounds(calls: Mapping[str, Callable[[], Any]], reps: int, warmup: int = 1
           ) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """Wall seconds of each variant per kept round, and what each variant returned in the last round."""
    names = list(calls)
    times: dict[str, list[float]] = {name: [] for name in names}
    last: dict[str, Any] = {}
    for rep in range(warmup + reps):
        for name in names[rep % len(names):] + names[: rep % len(names)]:
            last.pop(name, None)  # the previous result is freed before the next call, not during it
            gc.collect()
            start = time.perf_counter()
            result = calls[name]()
            elapsed = time.perf_counter() - start
            last[name] = result
            if rep >= warmup:
                times[name].append(elapsed)
            del result
    return times, last


def median_ratio(numerator: Sequence[float], denominator: Sequence[float]) -> float:
    """The median of the per-round ratios."""
    return statistics.median(a / b for a, b in zip(numerator, denominator, strict=True))
