"""Bytes an op must move at minimum: the memory side of the roofline.

The model (``docs/conventions.md`` §9): each distinct tensor an op reads is read once
and each tensor it writes is written once, at its dtype's size (``numel ·
element_size``); caches, tiling and re-reads are the kernel's business and are not
modelled. So a GEMM ``[m, k] @ [k, n]`` moves ``(m·k + k·n + m·n)`` elements, whatever
its MACs. The exceptions are ops that touch only part of a tensor they are given:

- **views** (``view``, ``transpose``, ``expand``, ``slice``, ...: the schema says the
  output aliases the input; also ``_unsafe_view``, which reshapes a fresh result in
  place) move nothing;
- **gathers** (``embedding``, ``index_select``, ``gather``, ``x[ids]``) read the rows
  they return and the indices, not the whole table: ``indices + 2 · output``;
- **in-place scatters** (``index_copy_``, ``index_put_``, ``scatter_``: a static KV
  cache's update) read the indices and the values and write the values' worth of the
  destination: ``indices + 2 · values``;
- **pure writes** (``copy_``, ``fill_``, ``zero_``) do not read their destination:
  sources + destination.

Units: bytes. Nested (jagged) tensors count 0 (their size is not a plain ``numel``).
"""

from __future__ import annotations

from typing import Any

import torch

aten = torch.ops.aten

GATHERS = frozenset({aten.embedding, aten.index_select, aten.gather, aten.index})
"""Ops that read only the rows they return (and their indices)."""
SCATTERS = frozenset({aten.index_copy_, aten.index_put_, aten._index_put_impl_, aten.scatter_})
"""In-place ops that write only the slots their indices name."""
PURE_WRITES = frozenset({aten.copy_, aten.fill_, aten.zero_})
"""In-place ops that overwrite their first argument without reading it."""
UNSAFE_VIEWS = frozenset({aten._unsafe_view})
"""Ops that return a view but whose schema does not say so (``matmul`` reshapes its
result with it)."""


def nbytes(t: torch.Tensor) -> int:
    """``numel · element_size`` (0 for a nested tensor; ``Tensor.nbytes`` refuses
    symbolic sizes)."""
    return 0 if t.is_nested else t.numel() * t.element_size()


VIEW, GATHER, SCATTER, PURE_WRITE, ANY = "view", "gather", "scatter", "pure write", ""
"""How an op touches its tensors (:func:`access_of`), read once per op overload."""


def access_of(func: Any) -> str:
    """Which of the module docstring's cases ``func`` is: :data:`VIEW`, :data:`GATHER`,
    :data:`SCATTER`, :data:`PURE_WRITE`, or :data:`ANY` (reads each input once, writes
    each output once)."""
    packet = getattr(func, "overloadpacket", func)
    if getattr(func, "is_view", False) or packet in UNSAFE_VIEWS:
        return VIEW
    return (GATHER if packet in GATHERS else SCATTER if packet in SCATTERS else PURE_WRITE if packet in PURE_WRITES
            else ANY)


def bytes_moved(access: str, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> int:
    """Minimum bytes read and written by an op of ``access`` (:func:`access_of`) given
    its tensor arguments ``inputs`` (in order, duplicates allowed) and tensor results
    ``outputs`` (see the module docstring)."""
    if access == VIEW:
        return 0
    distinct = list({id(t): t for t in inputs}.values()) if len(inputs) > 1 else inputs
    written = sum(map(nbytes, outputs))
    if access == GATHER:
        return sum(map(nbytes, distinct[1:])) + 2 * written
    if access == SCATTER and len(distinct) > 1:
        rest = distinct[1:]  # indices and values; the destination is written only where they point
        return sum(map(nbytes, rest)) + nbytes(rest[-1])
    if access == PURE_WRITE and distinct:
        return sum(map(nbytes, distinct[1:])) + written
    return sum(map(nbytes, distinct)) + written
