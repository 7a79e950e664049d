"""Module paths: ``"encoder.layer.0.attention"``; ``""`` is the root module, which
contains every path."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence


def within(path: str, block: str) -> bool:
    """``path`` is ``block`` or one of its submodules (every path is within the root
    ``""``)."""
    return block == "" or path == block or path.startswith(block + ".")


def inside(paths: Iterable[str], block: str) -> list[str]:
    """The paths within ``block``, in order."""
    return [p for p in paths if within(p, block)]


def enclosing(stack: Iterable[str], uncalled: Collection[str]) -> frozenset[str]:
    """The paths of a module call stack, with the modules that hold one of them and
    never ran themselves (a ``ModuleList`` / ``ModuleDict`` of layers, a root the
    caller never called): the modules an op run on that stack is inside of, by call
    or by structure. A module that ran is on the stacks of its own calls only (a
    module called from another's forward counts under its caller, not under a parent
    that ran elsewhere)."""
    paths = set(stack)
    if uncalled:
        for path in list(paths):
            parts = path.split(".") if path else []
            for i in range(len(parts)):
                parent = ".".join(parts[:i])
                if parent in uncalled:
                    paths.add(parent)
    return frozenset(paths)


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
