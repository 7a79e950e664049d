"""Sums of counts some of which are symbolic (``torch.SymInt``, from a trace with
symbolic sizes), in one step.

Adding ``SymInt`` s pairwise with ``+`` builds a new sympy expression at each addition,
flattening the sum so far again: summing thousands of ops' MACs or bytes that way costs
seconds. :func:`exact_sum` adds the integers as integers and the symbolic terms in one
``torch.sym_sum`` (one sympy ``Add``); :class:`SumsBy` collects terms by key and sums
each key once. The result is the same exact count.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar, cast

import torch

__all__ = ["Count", "SumsBy", "exact_sum"]

Count = int | torch.SymInt
"""A count of MACs or bytes: an ``int``, or a ``torch.SymInt`` in a symbolic trace."""

K = TypeVar("K", bound=Hashable)


def exact_sum(values: Iterable[int]) -> int:
    """The sum of ``values``: an ``int`` where none is symbolic. (Counts are typed
    ``int``, as in the records; a ``torch.SymInt`` stands in for one in a symbolic
    trace.)"""
    total = 0
    symbolic: list[torch.SymInt] = []
    for value in values:
        if isinstance(value, torch.SymInt):
            symbolic.append(value)
        else:
            total += value
    if not symbolic:
        return total
    summed = torch.sym_sum(symbolic) if len(symbolic) > 1 else symbolic[0]
    return cast(int, summed + total if total else summed)


class SumsBy(Generic[K]):
    """Counts collected by key, each key's summed once (:func:`exact_sum`) when read."""

    def __init__(self) -> None:
        self._terms: defaultdict[K, list[int]] = defaultdict(list)

    def add(self, key: K, value: int) -> None:
        self._terms[key].append(value)

    def keys(self) -> list[K]:
        return list(self._terms)

    def total(self, key: K) -> int:
        """The sum for ``key`` (0 where nothing was added)."""
        return exact_sum(self._terms.get(key, ()))

    def totals(self) -> dict[K, int]:
        return {key: exact_sum(terms) for key, terms in self._terms.items()}
