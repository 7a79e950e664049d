"""Module paths: ``"encoder.layer.0.attention"``; ``""`` is the root module, which contains every path."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def within(path: str, block: str) -> bool:
    """``path`` is ``block`` or one of its submodules (every path is within the root ``""``)."""
    return block == "" or path == block or path.startswith(block + ".")


def inside(paths: Iterable[str], block: str) -> list[str]:
    """The paths within ``block``, in order."""
    return [p for p in paths if within(p, block)]


def common_path(paths: Sequence[str]) -> str:
    """The deepest module path containing every path (``""`` is the root)."""
    if not paths:
        return ""
    split = [p.split(".") if p else [] for p in paths]
    common: list[str] = []
    for parts in zip(*split, strict=False):
        if len(set(parts)) != 1:
            break
        common.append(parts[0])
    return ".".join(common)
