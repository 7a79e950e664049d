"""Per-module figures from plain data (never a profile): parameters inclusive of
submodules, the dominant role."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping

Shape = tuple[int, ...]


def params_inclusive(param_shapes: Mapping[str, Mapping[str, Shape]]) -> dict[str, int]:
    """Parameters per module path, inclusive of submodules, from ``{path: {local name:
    shape}}`` (a shared parameter counted where it is declared)."""
    out: dict[str, int] = defaultdict(int)
    for path, shapes in param_shapes.items():
        count = sum(math.prod(shape) for shape in shapes.values())
        parts = path.split(".") if path else []
        for i in range(len(parts) + 1):
            out[".".join(parts[:i])] += count
    return dict(out)


def dominant_roles(ops: Iterable[tuple[Iterable[str], Mapping[str, int]]]) -> dict[str, str]:
    """Per module path, the role with most MACs among the ops run inside it (inclusive),
    from one ``(module stack, {role: MACs})`` per op."""
    per: dict[str, Counter[str]] = defaultdict(Counter)
    for stack, roles in ops:
        for path in set(stack):
            for role, macs in roles.items():
                per[path][role] += macs
    return {path: counter.most_common(1)[0][0] for path, counter in per.items() if counter}
