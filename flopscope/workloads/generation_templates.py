"""Generation of any length from two templates: a prefill and one decode step, traced
once with the cache's length as a symbol.

A decode step at cache length ``c`` is the decode step at cache length ``c - 1`` with
the cache one position longer: the same ops, their sizes one larger. So instead of
running every forward (:func:`~flopscope.workloads.generation.profile_generation`),
:func:`count_generation` runs the forwards of greedy ``generate()``
(:func:`~flopscope.workloads.decoding.greedy_decode`) twice, a prefill and one decode
step, on fake tensors whose prompt length is a symbol ``n``
(:mod:`flopscope.workloads.symbolic`): the prefill fills the KV cache with ``n``
positions, so the decode step attends to ``n + 1`` and each count of both steps is an
exact function of ``n`` (a polynomial, or an expression such as a floor division).
Step ``k`` of a generation of ``N`` tokens after a prompt of ``P`` is the prefill at
``n = P`` (``k = 1``) or the decode step at ``n = P + k - 2``; the sums over steps are
closed forms (Faulhaber's sums of powers).

Every Python decision the model made on a size (a sliding window that drops old
positions from ``W`` on, a rope scaling that switches at a length) is a guard of the
trace, true at the traced length. The guards are checked at every cache length the
generation reaches; where one fails, those lengths are traced again at the first of
them, and so on: a piecewise result, each piece named with its conditions. A piece
holds only where all its guards hold, so the numbers are those of step-by-step
counting (``profile_generation(..., reuse=False)``), total, per role, per module and
per step. A step that feeds more than one position is traced as it runs: Phi-3's
LongRoPE drops the cache where the sequence first passes its original context and feeds
the whole sequence, so the trace there (a guard that holds at one length) is a forward
over all of it. What the templates assume: the state a prefill of ``n`` positions leaves
(a cache of ``n``) is the state any earlier steps leave at that length. Roles are found
once per piece, on a concrete profile of the same two steps (role passes compare sizes),
and carried to the symbolic records op by op (:func:`flopscope.profile.reuse_roles`).

Refused with a :class:`~flopscope.errors.SymbolicError` naming the reason: a model
whose forward reads a value (a data-dependent size, a ``.item()``), or one that needs
more than ``max_traces`` pieces. Units: MACs and bytes (FLOPs = 2 x MACs).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tabulate import tabulate
from torch import nn

from ..attribute.roles import RoleRule
from ..capture import CapturePlan, fake_converter
from ..errors import SymbolicError
from ..formulas.registry import FormulaRegistry
from ..predict.steps import PREFILL, Step
from ..profile import Profile, reuse_roles
from ..role import ROLE_ORDER
from .decoding import check_decoding, decoding_driver
from .generation import profile_generation
from .symbolic import Count, SizeFunction, SymbolicTrace, quiet_symbolic_graph, require_symbolic_sizes, trace_dispatched

__all__ = ["GenerationCount", "Piece", "StepTemplate", "count_generation"]


class GenerationTrace:
    """The two steps traced at one cache length ``n``: symbolic where the symbolic shapes
    allow it (``n >= 2``), else concrete; its roles found on first use, on a concrete
    count of the same two steps (role passes compare sizes), and carried to the symbolic
    records op by op."""

    def __init__(self, model: nn.Module, batch: int, n: int, dtype: torch.dtype,
                 registry: FormulaRegistry | None, roles: tuple[RoleRule, ...]) -> None:
        self.name, self.n = type(model).__name__, n
        def concrete(length: int) -> Profile:
            return profile_generation(model, torch.zeros(batch, length, dtype=dtype), 2, registry=registry,
                                      roles=roles)

        self._concrete = concrete
        self.symbolic: SymbolicTrace | None = None
        if n < 2:  # sizes 0 and 1 are constants of the symbolic shapes: the concrete count is the template
            self.profile = self._concrete(n)
            return
        ids = functools.partial(torch.zeros, dtype=dtype)
        inputs: tuple[Any, Any] = (((ids(batch, n + 1),), {}), ((ids(batch, n),), {}))
        plan = CapturePlan.of("fake", registry, reuse=True, driver=functools.partial(decoding_driver, 2),
                              converter=fake_converter())
        self.symbolic = trace_dispatched(model, inputs, (n + 1, n), plan, roles)
        self.profile = self.symbolic.profile

    def function(self, count: Count) -> SizeFunction:
        if self.symbolic is None:
            return SizeFunction.constant(int(count))
        return self.symbolic.function(count)

    def holds(self, lengths: list[int]) -> list[bool]:
        return [m == self.n for m in lengths] if self.symbolic is None else self.symbolic.holds(lengths)

    @functools.cached_property
    def steps(self) -> tuple[Step, Step]:
        """The two steps with their roles (the role passes run here, once)."""
        with quiet_symbolic_graph():
            if self.symbolic is not None and not carry_roles(self.profile, self._concrete, self.n):
                raise SymbolicError(f"{self.name} ran other ops with a symbolic cache length than at {self.n}: "
                                    "its roles cannot be carried over")
            found = self.profile.steps()
        if len(found) != 2 or found[0].phase != PREFILL:
            raise SymbolicError(f"{self.name}: {[s.phase for s in found]} traced, not a prefill and a decode step")
        return found[0], found[1]

    @functools.cached_property
    def roles(self) -> tuple[str, ...]:
        """The roles its records have, 0 MACs included (as :meth:`Profile.by_role` lists them)."""
        self.steps  # noqa: B018  (the roles are found there)
        with quiet_symbolic_graph():
            return tuple(self.profile.by_role())


class StepTemplate:
    """One forward of the generation (the prefill, or a decode step) as exact functions
    of ``n``, the positions in the cache before it (the prompt's length for the
    prefill). MACs and bytes are read from the records; roles, the attention core's
    share and the context on first use (they need the role passes)."""

    def __init__(self, traced: GenerationTrace, index: int) -> None:
        self._trace, self._index = traced, index  # 0: the prefill, 1: the decode step

    @functools.cached_property
    def macs(self) -> SizeFunction:
        with quiet_symbolic_graph():
            return self._trace.function(self._trace.profile.step_totals(self._index + 1)[0])

    @functools.cached_property
    def bytes(self) -> SizeFunction:
        with quiet_symbolic_graph():
            return self._trace.function(self._trace.profile.step_totals(self._index + 1)[1])

    @functools.cached_property
    def _step(self) -> Step:
        return self._trace.steps[self._index]

    @functools.cached_property
    def by_role(self) -> dict[str, SizeFunction]:
        """MACs per role."""
        return {role: self._trace.function(macs) for role, macs in self._step.by_role.items()}

    @functools.cached_property
    def _counts(self) -> dict[str, SizeFunction | None]:
        step, function = self._step, self._trace.function
        return {"kv_macs": function(step.kv_macs), "kv_bytes": function(step.kv_bytes),
                "tokens": None if step.tokens is None else function(step.tokens),
                "context": None if step.context is None else function(step.context)}

    @functools.cached_property
    def by_module(self) -> dict[str, SizeFunction]:
        """MACs per module path, inclusive of submodules."""
        with quiet_symbolic_graph():
            found = self._trace.profile.by_module(self._index + 1)
            return {path: self._trace.function(macs) for path, macs in found.items()}

    def count(self, key: str) -> SizeFunction | None:
        """``"macs"``, ``"bytes"``, ``"kv_macs"``, ``"kv_bytes"``, ``"tokens"``,
        ``"context"`` as a function of ``n``."""
        return getattr(self, key) if key in ("macs", "bytes") else self._counts[key]

    def step(self, number: int, n: int) -> Step:
        """The step at cache length ``n``, as :meth:`Profile.steps` lists it."""
        def at(key: str) -> int | None:
            found = self.count(key)
            return None if found is None else found.at(n)

        by_role = {role: f.at(n) for role, f in self.by_role.items()}
        return Step(number, self._step.phase, self._step.batch, at("tokens"), at("context"), self.macs.at(n),
                    {role: v for role, v in by_role.items() if v}, self.bytes.at(n), at("kv_macs") or 0,
                    at("kv_bytes") or 0)


@dataclass(frozen=True)
class Piece:
    """One trace: the prefill and decode templates, and the cache lengths of the
    generation it stands for (runs ``(first, last)``, inclusive)."""

    traced: GenerationTrace
    lengths: tuple[tuple[int, int], ...]
    conditions: tuple[str, ...]  # its guards, in n

    @functools.cached_property
    def prefill(self) -> StepTemplate:
        return StepTemplate(self.traced, 0)

    @functools.cached_property
    def decode(self) -> StepTemplate:
        return StepTemplate(self.traced, 1)

    @property
    def hint(self) -> int:
        """The cache length it was traced at."""
        return self.traced.n


@dataclass(frozen=True, repr=False)
class GenerationCount:
    """Greedy generation of ``new_tokens`` tokens after a prompt of ``prompt`` positions
    (``batch`` sequences), counted from its templates (:func:`count_generation`). The
    queries of :class:`~flopscope.profile.Profile` that a generation's totals answer,
    each a sum of the templates' functions over the steps. Units: MACs (FLOPs = 2 x
    MACs) and bytes."""

    model: str
    batch: int
    prompt: int
    new_tokens: int
    pieces: tuple[Piece, ...]
    seconds: float  # the count's own wall time
    notes: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return (f"GenerationCount({self.model}, batch {self.batch}, prompt {self.prompt}, {self.new_tokens} new "
                f"tokens: {self.total():,} MACs, {len(self.pieces)} piece(s), counted in {self.seconds:.2f} s)")

    def _decode_runs(self) -> Iterator[tuple[StepTemplate, int, int]]:
        for piece in self.pieces:
            for first, last in piece.lengths:
                yield piece.decode, first, last

    def _sum(self, value: Callable[[StepTemplate], SizeFunction | None]) -> int:
        """The prefill's ``value`` at the prompt plus the decode template's, summed over
        the decode steps' cache lengths."""
        first = value(self.pieces[0].prefill)
        total = 0 if first is None else first.at(self.prompt)
        for template, a, b in self._decode_runs():
            found = value(template)
            total += 0 if found is None else found.sum_over(a, b)
        return total

    def total(self) -> int:
        """MACs of the whole generation (prefill and every decode step)."""
        return self._sum(lambda t: t.macs)

    def total_flops(self) -> int:
        return 2 * self.total()

    def total_bytes(self) -> int:
        """Bytes moved by every op of every step (:meth:`Profile.total_bytes`)."""
        return self._sum(lambda t: t.bytes)

    def by_role(self) -> dict[str, int]:
        """MACs per role over the whole generation (:meth:`Profile.by_role`)."""
        roles = {role for piece in self.pieces for role in piece.traced.roles}
        return {role: self._sum(functools.partial(_role, role)) for role in ROLE_ORDER if role in roles}

    def by_module(self) -> dict[str, int]:
        """MACs per module path over the whole generation, inclusive of submodules
        (:meth:`Profile.by_module`)."""
        paths = dict.fromkeys(p for piece in self.pieces for t in (piece.prefill, piece.decode) for p in t.by_module)
        return {path: self._sum(functools.partial(_module, path)) for path in paths}

    def steps(self) -> list[Step]:
        """One :class:`~flopscope.predict.steps.Step` per forward, as :meth:`Profile.steps` lists a
        step-by-step count's (``seconds`` is ``None``: nothing ran)."""
        out = [self.pieces[0].prefill.step(1, self.prompt)]
        decodes = sorted(self._decode_runs(), key=lambda run: run[1])
        for template, first, last in decodes:
            out.extend(template.step(n - self.prompt + 2, n) for n in range(first, last + 1))
        return out

    def templates(self) -> str:
        """Each piece's templates as a table: the cache lengths it stands for, its
        guards, and per step MACs per role as functions of ``n`` (positions in the
        cache before the step)."""
        rows = []
        for piece in self.pieces:
            where = ", ".join(f"{a}..{b}" for a, b in piece.lengths) or "-"
            for template in (piece.prefill, piece.decode):
                rows.append([where, template._step.phase, "MACs", template.macs.text])
                rows.extend(["", "", role, f.text] for role, f in template.by_role.items() if f.text != "0")
                rows.append(["", "", "bytes", template.bytes.text])
            if piece.conditions:
                rows.append(["", "guards", "", "; ".join(piece.conditions)])
        return tabulate(rows, headers=["cache lengths n", "step", "count", "as a function of n"],
                        disable_numparse=True)


def carry_roles(traced: Profile, concrete: Callable[[int], Profile], length: int) -> bool:
    """Give ``traced`` (a symbolic trace at ``length``) the roles of ``concrete(length)``, a
    concrete count of the same computation (:func:`flopscope.profile.reuse_roles`). Not
    from a shorter count: column labels replayed through a layer that pads its chunks
    split a fused projection otherwise at 2 positions than at 8 (Qwen3-Next's gated
    DeltaNet), so roles are taken at the traced length only."""
    return reuse_roles(traced, concrete(length))


def _role(role: str, template: StepTemplate) -> SizeFunction | None:
    return template.by_role.get(role)


def _module(path: str, template: StepTemplate) -> SizeFunction | None:
    return template.by_module.get(path)


def count_generation(model: nn.Module, input_ids: torch.Tensor, new_tokens: int, *,
                     registry: FormulaRegistry | None = None, roles: Sequence[RoleRule] = (),
                     max_traces: int = 8) -> GenerationCount:
    """Count greedy generation of ``new_tokens`` tokens after ``input_ids`` (``[batch,
    prompt]`` token ids, no padding; only their shape is read) from a prefill and a
    decode step traced with a symbolic cache length (see the module docstring): the
    numbers of :func:`~flopscope.workloads.generation.profile_generation`, in the
    cost of a few of its steps whatever ``new_tokens`` is. ``registry``, ``roles``: as
    :func:`flopscope.profile`. ``max_traces``: the most pieces (traces) to make before
    giving up with a :class:`~flopscope.errors.SymbolicError` that names the guard
    that keeps splitting the range. Units: MACs (FLOPs = 2 x MACs) and bytes."""
    check_decoding(model, input_ids, new_tokens)
    require_symbolic_sizes("count_generation")
    started = time.perf_counter()
    batch, prompt = (int(d) for d in input_ids.shape)
    # the cache lengths the steps start from: the prompt (the prefill's), then one more per decode step
    todo = list(range(prompt, prompt + max(new_tokens - 1, 1)))
    pieces: list[Piece] = []
    notes: list[str] = []
    while todo:
        if len(pieces) == max_traces:
            last = pieces[-1].traced.symbolic
            why = last.specialisation([todo[0]]) if last is not None else None
            raise SymbolicError(f"{type(model).__name__}: {max_traces} traces stand for cache lengths up to "
                                f"{todo[0] - 1}, not beyond: {why or 'the last trace is concrete'}")
        traced = GenerationTrace(model, batch, todo[0], input_ids.dtype, registry, tuple(roles))
        holds = traced.holds(todo)
        if not holds[0]:
            raise SymbolicError(f"{type(model).__name__}: the trace at cache length {todo[0]} does not stand for "
                                "that length itself")
        covered = [n for n, ok in zip(todo, holds, strict=True) if ok] if new_tokens > 1 else []
        conditions = () if traced.symbolic is None else traced.symbolic.conditions()
        pieces.append(Piece(traced, _runs(covered), conditions))
        notes.extend(traced.profile.notes)
        todo = [n for n, ok in zip(todo, holds, strict=True) if not ok] if covered else []
    where = "; ".join(f"cache lengths {', '.join(f'{a}..{b}' for a, b in p.lengths)} from the trace at {p.hint}"
                      f" ({'; '.join(p.conditions) or 'no guards'})" for p in pieces if p.lengths)
    if where:
        notes.append(f"{len(pieces)} trace(s) of a prefill and a decode step stand for the "
                     f"{new_tokens - 1} decode steps: {where}")
    return GenerationCount(type(model).__name__, batch, prompt, new_tokens, tuple(pieces),
                           time.perf_counter() - started, tuple(dict.fromkeys(notes)))


def _runs(values: list[int]) -> tuple[tuple[int, int], ...]:
    """Sorted integers as runs of consecutive ones, ``(first, last)``."""
    runs: list[tuple[int, int]] = []
    for n in values:
        if runs and runs[-1][1] == n - 1:
            runs[-1] = (runs[-1][0], n)
        else:
            runs.append((n, n))
    return tuple(runs)
