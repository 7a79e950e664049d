"""The recorder's tallies: what a run counted beside its records.

:class:`Tallies` gathers the counters that end up in a
:class:`~flopscope.capture.records.Capture`: ops without a formula, ops decomposed, ops
counted as upper bounds, attention kernels without their family, embedding lookups whose
indices were unknown, the values read, the parameters first seen during the run and the
largest tensor an op made. :meth:`Tallies.copy`, :meth:`Tallies.since` and
:meth:`Tallies.add` let a caller take what one call added and add it again (a replayed
call adds what its first call added).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar


@dataclass
class Tallies:
    """What a run counted beside its records (one per :class:`Recorder`)."""

    unsupported: Counter[str] = field(default_factory=Counter)
    """Op name -> calls of ops without a formula or a rule."""
    decomposed: Counter[str] = field(default_factory=Counter)
    """Op name -> calls run as their decomposition (no formula, no rule)."""
    upper_bounds: Counter[str] = field(default_factory=Counter)
    """Op name -> calls counted as upper bounds (the data their work depends on was not
    known)."""
    undeclared_kernels: set[str] = field(default_factory=set)
    """Ops whose formula returns attention parts without the attention family."""
    unchecked_lookups: int = 0
    """Fake tensors: embedding lookups whose index values were not known."""
    value_reads: int = 0
    """Fake tensors: values of tensors read where they decide what runs or what it
    costs.

    A scalar read, an output made from known values, a formula or an index check reading
    them. :mod:`flopscope.capture.replay` refuses a call that read any."""
    late_parameters: int = 0
    """Parameters first seen during the run (not among the recorder's leaf names)."""
    largest_out: int = 0
    """Fake tensors: bytes of the largest tensor a recorded op made.

    A real run's peak memory is at least this. A maximum, not a count."""

    def copy(self) -> Tallies:
        """A snapshot, which later counts leave as it is."""
        return dataclasses.replace(self, unsupported=Counter(self.unsupported),
                                   decomposed=Counter(self.decomposed),
                                   upper_bounds=Counter(self.upper_bounds),
                                   undeclared_kernels=set(self.undeclared_kernels))

    def since(self, before: Tallies) -> Tallies:
        """What was counted after ``before`` (a :meth:`copy`). The largest output is
        this one's."""
        return Tallies(self.unsupported - before.unsupported, self.decomposed - before.decomposed,
                       self.upper_bounds - before.upper_bounds,
                       self.undeclared_kernels - before.undeclared_kernels,
                       self.unchecked_lookups - before.unchecked_lookups,
                       self.value_reads - before.value_reads,
                       self.late_parameters - before.late_parameters, self.largest_out)

    def add(self, other: Tallies) -> None:
        """Count ``other`` (what a :meth:`since` found) again. The largest output is the
        larger one."""
        self.unsupported.update(other.unsupported)
        self.decomposed.update(other.decomposed)
        self.upper_bounds.update(other.upper_bounds)
        self.undeclared_kernels.update(other.undeclared_kernels)
        self.unchecked_lookups += other.unchecked_lookups
        self.value_reads += other.value_reads
        self.late_parameters += other.late_parameters
        self.largest_out = max(self.largest_out, other.largest_out)


T = TypeVar("T")


class TallyAlias(Generic[T]):
    """A tally read and written on its owner (a recorder) under a name of its own, from
    the owner's ``tallies``: ``recorder.unsupported`` is
    ``recorder.tallies.unsupported``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, owner: Any, owner_type: type | None = None) -> T:
        return getattr(owner.tallies, self.name)

    def __set__(self, owner: Any, value: T) -> None:
        setattr(owner.tallies, self.name, value)
