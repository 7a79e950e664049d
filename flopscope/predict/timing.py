"""Measured time (real mode): wall time of the ops that ran, per role and per module,
against their MACs.

Each op's wall time is taken around its kernel on the CPU (ops are synchronous there; on
an accelerator the figures would be launch times). A fused op's time is split between
its roles in proportion to their MACs. Ops without multiplies (softmax, norms,
activations, copies) are a row of their own: they take time with few multiplies, which
is the point of setting time share beside MAC share.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tabulate import tabulate

from ..attribute.roles import Assignment
from ..capture.records import CapturedOp
from ..errors import FlopscopeError
from ..role import NO_MULTIPLY, ROLE_ORDER


@dataclass(frozen=True)
class TimingRow:
    name: str  # a role, or NO_MULTIPLY
    seconds: float  # wall time of its ops
    macs: int

    @property
    def gflops_per_second(self) -> float:
        """Achieved GFLOP/s (2 FLOPs per MAC)."""
        return 2 * self.macs / self.seconds / 1e9 if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class Timing:
    rows: tuple[TimingRow, ...]  # per role
    modules: dict[str, float]  # module path -> seconds, inclusive of submodules

    @property
    def seconds(self) -> float:
        """Wall time of the timed ops, in seconds."""
        return sum(r.seconds for r in self.rows)

    @property
    def macs(self) -> int:
        """MACs of the timed ops."""
        return sum(r.macs for r in self.rows)

    def __str__(self) -> str:
        """A caption (total wall time in ms, MACs, achieved GFLOP/s) and
        :meth:`to_table`: what ``print`` shows."""
        rate = 2 * self.macs / self.seconds / 1e9 if self.seconds > 0 else 0.0
        return (f"wall time of the timed ops: {1e3 * self.seconds:.3f} ms for {self.macs:,} MACs "
                f"({rate:.2f} GFLOP/s; 1 MAC = 2 FLOPs)\n{self.to_table()}")

    def to_table(self, tablefmt: str = "simple") -> str:
        seconds = self.seconds or 1.0
        macs = sum(r.macs for r in self.rows) or 1
        table = [[r.name, f"{1e3 * r.seconds:.3f}", f"{100 * r.seconds / seconds:.1f}%",
                  f"{100 * r.macs / macs:.1f}%",
                  f"{r.gflops_per_second:.2f}" if r.macs else "-"] for r in self.rows]
        return tabulate(table, headers=["role", "time ms", "time share", "MAC share", "GFLOP/s"],
                        tablefmt=tablefmt,
                        colalign=("left", "right", "right", "right", "right"))


def timing(ops: Sequence[CapturedOp], assignments: Mapping[CapturedOp, Assignment]) -> Timing:
    """Time per role and per module of a real-mode capture (its records ``ops`` and
    their role ``assignments``)."""
    timed = [op for op in ops if op.seconds is not None]
    if not timed:
        raise FlopscopeError("no op times: timing needs a profile taken with mode='real'")
    seconds: dict[str, float] = defaultdict(float)
    macs: dict[str, int] = defaultdict(int)
    modules: dict[str, float] = defaultdict(float)
    for op in timed:
        elapsed = op.seconds or 0.0
        for path in {frame.path for frame in op.module_stack}:
            modules[path] += elapsed
        assignment = assignments.get(op)
        total = sum(assignment.parts.values()) if assignment else 0
        if not assignment or not total:
            seconds[NO_MULTIPLY] += elapsed
            continue
        for role, part in assignment.parts.items():
            seconds[role] += elapsed * part / total
            macs[role] += part
    order = [role for role in ROLE_ORDER if role in seconds] + ([NO_MULTIPLY] if NO_MULTIPLY in seconds else [])
    return Timing(tuple(TimingRow(role, seconds[role], macs.get(role, 0)) for role in order),
                  dict(modules))
