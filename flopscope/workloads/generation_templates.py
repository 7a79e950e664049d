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
per step. Roles are found once per piece, on a concrete profile of the same two steps
(role passes compare sizes), and carried to the symbolic records op by op
(:func:`flopscope.profile.reuse_roles`).

Refused with a :class:`~flopscope.errors.SymbolicError` naming the reason: a model
whose forward reads a value (a data-dependent size, a ``.item()``), or one that needs
more than ``max_traces`` pieces. Units: MACs and bytes (FLOPs = 2 x MACs).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from tabulate import tabulate
from torch import nn

from ..attribute.roles import RoleRule
from ..capture import CapturePlan, fake_converter
from ..errors import SymbolicError
from ..formulas.registry import FormulaRegistry
from ..predict.steps import DECODE, PREFILL, Step
from ..profile import Profile, reuse_roles
from ..role import ROLE_ORDER
from .decoding import check_decoding
from .generation import _decoding, profile_generation
from .symbolic import Count, SizeFunction, SymbolicTrace, _quiet_symbolic_graph, trace

__all__ = ["GenerationCount", "StepTemplate", "count_generation"]

_FIELDS = ("macs", "bytes", "kv_macs", "kv_bytes")


@dataclass(frozen=True)
class StepTemplate:
    """One forward of the generation (the prefill, or a decode step) as exact functions
    of ``n``, the positions in the cache before it (the prompt's length for the
    prefill)."""

    phase: str  # "prefill" or "decode"
    batch: int | None
    tokens: SizeFunction | None  # new positions per sequence
    context: SizeFunction | None  # positions each new one attends to
    counts: Mapping[str, SizeFunction]  # "macs", "bytes", "kv_macs", "kv_bytes"
    by_role: Mapping[str, SizeFunction]  # MACs
    _modules: functools.partial[dict[str, SizeFunction]] = field(repr=False, compare=False)

    @functools.cached_property
    def by_module(self) -> dict[str, SizeFunction]:
        """MACs per module path, inclusive of submodules (made on first use: a large
        model has thousands of modules)."""
        return self._modules()

    def step(self, number: int, n: int) -> Step:
        """The step at cache length ``n``, as :meth:`Profile.steps` lists it."""
        return Step(number, self.phase, self.batch, None if self.tokens is None else self.tokens.at(n),
                    None if self.context is None else self.context.at(n), self.counts["macs"].at(n),
                    {role: f.at(n) for role, f in self.by_role.items() if f.at(n)}, self.counts["bytes"].at(n),
                    self.counts["kv_macs"].at(n), self.counts["kv_bytes"].at(n))


@dataclass(frozen=True)
class Piece:
    """One trace: the prefill and decode templates, and the cache lengths of the
    generation it stands for (runs ``(first, last)``, inclusive)."""

    hint: int  # the cache length it was traced at
    prefill: StepTemplate
    decode: StepTemplate
    lengths: tuple[tuple[int, int], ...]
    conditions: tuple[str, ...]  # its guards, in n
    symbolic: bool  # False: traced at a length the symbolic shapes keep constant (0 or 1)
    roles: tuple[str, ...]  # the roles its records have, 0 MACs included (as Profile.by_role() lists them)


@dataclass(frozen=True)
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

    def _decode_runs(self) -> Iterator[tuple[StepTemplate, int, int]]:
        for piece in self.pieces:
            for first, last in piece.lengths:
                yield piece.decode, first, last

    def _sum(self, pick: str, key: str | None = None) -> int:
        """The prefill's count at the prompt plus the decode template's, summed over the
        decode steps' cache lengths."""
        def function(template: StepTemplate) -> SizeFunction | None:
            table = template.counts if key is None else getattr(template, pick)
            return table.get(pick if key is None else key)

        first = function(self.pieces[0].prefill)
        total = 0 if first is None else first.at(self.prompt)
        for template, a, b in self._decode_runs():
            found = function(template)
            total += 0 if found is None else found.sum_over(a, b)
        return total

    def total(self) -> int:
        """MACs of the whole generation (prefill and every decode step)."""
        return self._sum("macs")

    def total_flops(self) -> int:
        return 2 * self.total()

    def total_bytes(self) -> int:
        """Bytes moved by every op of every step (:meth:`Profile.total_bytes`)."""
        return self._sum("bytes")

    def by_role(self) -> dict[str, int]:
        """MACs per role over the whole generation (:meth:`Profile.by_role`)."""
        roles = {role for piece in self.pieces for role in piece.roles}
        return {role: self._sum("by_role", role) for role in ROLE_ORDER if role in roles}

    def by_module(self) -> dict[str, int]:
        """MACs per module path over the whole generation, inclusive of submodules
        (:meth:`Profile.by_module`)."""
        paths = dict.fromkeys(p for piece in self.pieces for t in (piece.prefill, piece.decode) for p in t.by_module)
        return {path: self._sum("by_module", path) for path in paths}

    def steps(self) -> list[Step]:
        """One :class:`~flopscope.predict.steps.Step` per forward, as :meth:`Profile.steps` lists a
        step-by-step count's (``seconds`` is ``None``: nothing ran)."""
        out = [self.pieces[0].prefill.step(1, self.prompt)]
        decodes = sorted((a, b, t) for t, a, b in self._decode_runs())
        for first, last, template in decodes:
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
                rows.append([where, template.phase, "MACs", template.counts["macs"].text])
                rows.extend(["", "", role, f.text] for role, f in template.by_role.items() if f.text != "0")
                rows.append(["", "", "bytes", template.counts["bytes"].text])
            if piece.conditions:
                rows.append(["", "guards", "", "; ".join(piece.conditions)])
        return tabulate(rows, headers=["cache lengths n", "step", "count", "as a function of n"],
                        disable_numparse=True)


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
    started = time.perf_counter()
    batch, prompt = (int(d) for d in input_ids.shape)
    # the cache lengths the steps start from: the prompt (the prefill's), then one more per decode step
    todo = list(range(prompt, prompt + max(new_tokens - 1, 1)))
    pieces: list[Piece] = []
    notes: list[str] = []
    while todo:
        if len(pieces) == max_traces:
            raise SymbolicError(f"{type(model).__name__}: {max_traces} traces stand for cache lengths up to "
                                f"{todo[0] - 1}, not beyond; the last trace's guards: "
                                f"{'; '.join(pieces[-1].conditions) or 'none'}")
        piece, holds, piece_notes = _piece(model, batch, todo, input_ids.dtype, registry, tuple(roles))
        covered = [n for n, ok in zip(todo, holds, strict=True) if ok]
        if not covered or covered[0] != todo[0]:
            raise SymbolicError(f"{type(model).__name__}: the trace at cache length {todo[0]} does not stand for "
                                "that length itself")
        if new_tokens == 1:  # only the prefill is counted
            covered = []
        pieces.append(_with_lengths(piece, _runs(covered)))
        notes.extend(piece_notes)
        todo = [n for n, ok in zip(todo, holds, strict=True) if not ok] if covered else []
    where = "; ".join(f"cache lengths {', '.join(f'{a}..{b}' for a, b in p.lengths)} from the trace at {p.hint}"
                      f" ({'; '.join(p.conditions) or 'no guards'})" for p in pieces if p.lengths)
    if where:
        notes.append(f"{len(pieces)} trace(s) of a prefill and a decode step stand for the "
                     f"{new_tokens - 1} decode steps: {where}")
    return GenerationCount(type(model).__name__, batch, prompt, new_tokens, tuple(pieces),
                           time.perf_counter() - started, tuple(dict.fromkeys(notes)))


def _piece(model: nn.Module, batch: int, todo: list[int], dtype: torch.dtype, registry: FormulaRegistry | None,
           roles: tuple[RoleRule, ...]) -> tuple[Piece, list[bool], list[str]]:
    """The templates traced at the first cache length ``n`` of ``todo``, and for each
    length of ``todo`` whether they stand for it: a concrete count of the prefill at
    ``n`` and its first decode step (its roles), then the same two steps with ``n`` a
    symbol where the symbolic shapes allow it (``n >= 2``)."""
    n = todo[0]
    ids = functools.partial(torch.zeros, dtype=dtype)
    concrete = profile_generation(model, ids(batch, n), 2, registry=registry, roles=roles)
    if n < 2:  # sizes 0 and 1 are constants of the symbolic shapes: the concrete count is the template
        prefill, decode = (_constant_template(concrete, s) for s in _two_steps(concrete.steps(), model))
        piece = Piece(n, prefill, decode, (), (), False, tuple(concrete.by_role()))
        return piece, [m == n for m in todo], list(concrete.notes)
    plan = CapturePlan.of("fake", registry, reuse=True, driver=functools.partial(_decoding, 2),
                          converter=fake_converter())
    found = trace(model, (((ids(batch, n + 1),), {}), ((ids(batch, n),), {})), (n + 1, n), plan, roles, {})
    with _quiet_symbolic_graph():
        if not reuse_roles(found.profile, concrete):
            raise SymbolicError(f"{type(model).__name__} ran other ops with a symbolic cache length than at "
                                f"{n}: its roles cannot be carried over")
        steps = _two_steps(found.profile.steps(), model)
        listed = tuple(found.profile.by_role())
    prefill, decode = (_symbolic_template(found, s) for s in steps)
    piece = Piece(n, prefill, decode, (), found.conditions(), True, listed)
    return piece, found.holds(todo), list(found.profile.notes)


def _two_steps(steps: list[Step], model: nn.Module) -> tuple[Step, Step]:
    if len(steps) != 2 or steps[0].phase != PREFILL:
        raise SymbolicError(f"{type(model).__name__}: {[s.phase for s in steps]} traced, not a prefill and a "
                            "decode step")
    return steps[0], steps[1]


def _symbolic_template(found: SymbolicTrace, step: Step) -> StepTemplate:
    """``step`` of a symbolic trace, its counts as functions of the symbol."""
    function = found.function

    def optional(value: Count | None) -> SizeFunction | None:
        return None if value is None else function(value)

    def modules() -> dict[str, SizeFunction]:
        with _quiet_symbolic_graph():
            return {path: function(macs) for path, macs in found.profile.by_module(step.step).items()}

    counts = {"macs": step.macs, "bytes": step.bytes, "kv_macs": step.kv_macs, "kv_bytes": step.kv_bytes}
    return StepTemplate(DECODE if step.phase == DECODE else PREFILL, step.batch, optional(step.tokens),
                        optional(step.context), {key: function(value) for key, value in counts.items()},
                        {role: function(macs) for role, macs in step.by_role.items()}, functools.partial(modules))


def _constant_template(prof: Profile, step: Step) -> StepTemplate:
    """``step`` of a concrete count: constant functions."""
    def modules() -> dict[str, SizeFunction]:
        return {path: SizeFunction.constant(macs) for path, macs in prof.by_module(step.step).items()}

    constant = SizeFunction.constant
    counts = {"macs": step.macs, "bytes": step.bytes, "kv_macs": step.kv_macs, "kv_bytes": step.kv_bytes}
    return StepTemplate(step.phase, step.batch, None if step.tokens is None else constant(step.tokens),
                        None if step.context is None else constant(step.context),
                        {key: constant(value) for key, value in counts.items()},
                        {role: constant(macs) for role, macs in step.by_role.items()}, functools.partial(modules))


def _with_lengths(piece: Piece, lengths: tuple[tuple[int, int], ...]) -> Piece:
    return Piece(piece.hint, piece.prefill, piece.decode, lengths, piece.conditions, piece.symbolic, piece.roles)


def _runs(values: list[int]) -> tuple[tuple[int, int], ...]:
    """Sorted integers as runs of consecutive ones, ``(first, last)``."""
    runs: list[tuple[int, int]] = []
    for n in values:
        if runs and runs[-1][1] == n - 1:
            runs[-1] = (runs[-1][0], n)
        else:
            runs.append((n, n))
    return tuple(runs)
