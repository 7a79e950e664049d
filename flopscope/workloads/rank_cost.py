"""The serving cost model of one rank under tensor parallelism, from the real shards.

A symbolic size cannot pass DTensor's sharding propagation (it hashes sizes), so a
sharded model is not traced symbolically. :func:`rank_cost_model` takes the unsharded
model's templates (:func:`~flopscope.workloads.step_cost.cost_model`) for what they know
without the shards: which computation a request is, the guards each piece holds under,
and the degree of each count in ``t`` and ``c``. It then shards a copy of the model in a
fake world (:func:`~flopscope.workloads.distributed.fake_world`,
:func:`~flopscope.workloads.distributed.tensor_parallel`: the plan the model declares, or
``plan``) and counts the rank's requests concretely, on its local shapes, at sizes inside
each piece's guards: one more size along each variable than the degree needs. Each
role's MACs and the bytes are the polynomials through those counts, in exact arithmetic,
checked at the extra sizes (:func:`~flopscope.predict.polynomial.interpolate`); a count
that no polynomial of the unsharded degree passes through is refused, never rounded.
The weights a rank reads are its shards'.

Each template's first piece is fitted when the model is made. A request outside every
fitted piece takes the unsharded model's piece there (traced where it falls, as
:meth:`~flopscope.workloads.step_cost.StepCost.piece` does) and fits it on a copy sharded
anew in a fake world of its own; a request at sizes the symbolic shapes keep constant (a
cache of one position) is counted concretely on such a copy. A mixture of experts is
sharded by its own plan (transformers applies the styles of its own:
:func:`~flopscope.workloads.distributed.tensor_parallel`).

With ``experts=True`` its experts are also split over the ranks, as transformers'
expert parallelism splits them (``ep_size = tp_size``: each rank holds its share of each
layer's experts whole and runs them on the batch the group shares). Which routes reach
a rank's experts is data, so a rank's expert MACs need a routing convention, stated in
the model's name and notes: ``"balanced"`` (each expert gets as many of its layer's
routes as any other: a rank's experts get the share of the routes that they are of the
experts; the mean over the ranks, and each rank's count when the router balances its
load) or ``"upper"`` (every route meets this rank's experts: the most any rank can
compute, as a fake count gives it). Bytes are those of the tensors the grouped matmuls
are given and return, whatever the routing (the traffic model's convention). Units:
MACs (FLOPs = 2 x MACs) and bytes, per rank.
"""

from __future__ import annotations

import copy
import functools
import itertools
import re
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from fractions import Fraction
from typing import Any

from torch import nn

from ..attribute.roles import RoleRule
from ..capture.records import UNROUTED_NOTE
from ..errors import ConfigurationError, FlopscopeWarning, SymbolicError
from ..formulas.registry import FormulaRegistry
from ..predict.polynomial import Polynomial, Polynomial2, interpolate
from .distributed import check_experts_plan, fake_world, tensor_parallel
from .step_cost import CountedRequest, RequestCount, StepCost, TemplatePiece, cost_model, count_request

__all__ = ["ROUTINGS", "rank_cost_model"]

ROUTINGS = ("balanced", "upper")
"""The routing conventions of an expert-parallel rank's cost model (module docstring)."""

_VARIABLES = {"prefill": ("t",), "decode": ("c",), "chunk": ("t", "c")}
_SEARCH = 256
"""How far from where a piece was traced sizes inside its guards are looked for."""


def rank_cost_model(model: nn.Module, tp: int, *, rank: int = 0, plan: Mapping[str, Any] | None = None,
                    experts: bool = False, routing: str = "balanced",
                    context: int = 64, chunk: int = 16, registry: FormulaRegistry | None = None,
                    roles: Sequence[RoleRule] = (), unsharded: StepCost | None = None) -> StepCost:
    """The cost model (:class:`~flopscope.workloads.step_cost.StepCost`) of rank ``rank``
    of ``model`` sharded for tensor parallelism over ``tp`` ranks (see the module
    docstring): MACs per role and bytes of one request as exact polynomials in ``t`` and
    ``c``, on the rank's shards. ``plan``: as
    :func:`~flopscope.workloads.distributed.tensor_parallel` (default: the model's own).
    ``experts``: its experts split over the ``tp`` ranks too (expert parallelism), their
    MACs under ``routing`` (:data:`ROUTINGS`, module docstring). ``unsharded``: the
    model's :func:`cost_model`, if made already (else made here with ``context``,
    ``chunk``, ``registry`` and ``roles``). The model is not changed: a copy is sharded.
    Units: MACs (FLOPs = 2 x MACs) and bytes, per rank."""
    if routing not in ROUTINGS:
        raise ConfigurationError(f"routing={routing!r}: one of {', '.join(map(repr, ROUTINGS))}")
    check_experts_plan(plan, experts)
    whole = unsharded or cost_model(model, context=context, chunk=chunk, registry=registry, roles=roles)
    split = f", experts split over the ranks, {routing} routing" if experts else ""
    name = f"{whole.model} (rank {rank} of {tp}, tensor parallel{split})"

    @contextmanager
    def counting() -> Iterator[Callable[[int, int], CountedRequest]]:
        """Concrete counts of a request on the rank's shards: a copy of the model
        sharded in a fake world, for the block."""
        with fake_world(tp, rank=rank) as mesh, warnings.catch_warnings():
            # (every route counted on the experts: the routing convention, in the notes, prices them)
            warnings.filterwarnings("ignore", message=f".*{re.escape(UNROUTED_NOTE)}", category=FlopscopeWarning)
            sharded = tensor_parallel(copy.deepcopy(model), mesh, plan, experts=experts)
            if not any(type(p).__name__ == "DTensor" for p in sharded.parameters()):
                raise ConfigurationError(f"{name}: the tensor-parallel plan shards no parameter of "
                                         f"{type(model).__name__}; pass plan= with the modules to shard")
            yield functools.partial(count_request, sharded, registry, tuple(roles),
                                    balanced=experts and routing == "balanced")

    pieces: dict[str, list[TemplatePiece]] = {}
    with counting() as count:
        for kind, found in whole.pieces.items():
            fitted = _fitted(kind, found[0], count, name)
            if fitted is None:
                raise SymbolicError(f"{name}: the {kind} template's first piece holds at too few sizes near "
                                    f"{found[0].at} to fit and check its polynomials on the shards")
            pieces[kind] = [fitted]

    def trace(kind: str, t: int, c: int) -> dict[str, TemplatePiece]:
        # (the unsharded piece standing for the request, traced there if none does yet)
        found = whole.piece(t, c)
        if found is None:
            raise SymbolicError(f"{name}: no {kind} piece of the unsharded model stands for t = {t}, c = {c}")
        with counting() as count:
            fitted = _fitted(kind, found, count, name)
        # (a piece holding at too few sizes to fit, as a window's edge: its requests counted concretely)
        return {} if fitted is None else {kind: fitted}

    @functools.cache
    def concrete(t: int, c: int) -> CountedRequest:
        with counting() as count:
            return count(t, c)

    notes = [*whole.notes, f"{name}: each template's pieces fitted through concrete counts of the rank's "
                           "shards, checked at one more size along each variable than the degree needs"]
    if experts:
        notes.append(f"{name}: which routes reach this rank's experts is data; " + (
            "balanced routing: each expert gets as many of its layer's routes as any other, so this rank's experts "
            "get the share of the routes that they are of the experts" if routing == "balanced" else
            "every route counted as if it met this rank's experts: an upper bound"))
    return StepCost(name, pieces, trace, concrete, notes,
                    {"tp": tp, "rank": rank, "experts_split": experts, "routing": routing if experts else None})


def _fitted(kind: str, piece: TemplatePiece, count: Callable[[int, int], CountedRequest],
            name: str) -> TemplatePiece | None:
    """``piece``'s counts on the rank: polynomials through concrete counts at sizes
    inside its guards, of its degrees plus one size to check (``None`` where it holds at
    too few sizes near where it was traced)."""
    variables = _VARIABLES[kind]
    degrees = _degrees(piece, kind, name)
    sizes = _sizes(kind, piece, degrees)
    if sizes is None:
        return None
    counted = {point: count(*_request(kind, point)) for point in sizes}
    by_role = {role: _through(kind, sizes, {p: c.by_role.get(role, 0) for p, c in counted.items()}, name, role)
               for role in dict.fromkeys(role for c in counted.values() for role in c.by_role)}
    moved = _through(kind, sizes, {p: c.bytes for p, c in counted.items()}, name, "bytes")
    weights = {c.weights for c in counted.values()}
    if len(weights) != 1:
        raise SymbolicError(f"{name}: the {kind} template's weights read differ with the request's size "
                            f"({sorted(weights)} bytes): no one polynomial piece")
    return TemplatePiece({role: _request_count(variables, p) for role, p in by_role.items() if _nonzero(p)},
                         _request_count(variables, moved), weights.pop(), piece.conditions, piece.holds, piece.at)


def _degrees(piece: TemplatePiece, kind: str, name: str) -> tuple[int, ...]:
    """The highest power of each variable among the unsharded piece's counts."""
    counts = [*piece.by_role.values(), piece.bytes]
    if any(c.polynomial is None for c in counts):
        raise SymbolicError(f"{name}: the {kind} template has counts that are no polynomials "
                            f"({', '.join(c.expression for c in counts if c.polynomial is None)}): per rank they "
                            "would be fitted as polynomials, so none is made")
    if kind != "chunk":
        return (max(c.polynomial.degree for c in counts if isinstance(c.polynomial, Polynomial)),)
    terms = [term for c in counts if isinstance(c.polynomial, Polynomial2) for term in c.polynomial.terms()]
    return max((i for i, _, _ in terms), default=0), max((j for _, j, _ in terms), default=0)


def _sizes(kind: str, piece: TemplatePiece, degrees: tuple[int, ...]) -> list[tuple[int, ...]] | None:
    """Sizes inside the piece's guards: ``degree + 2`` along each variable, the nearest
    to the size it was traced at (a grid for the chunk, containing that size where the
    guards allow); ``None`` where there are too few within :data:`_SEARCH` of it."""
    def inside(point: tuple[int, ...]) -> bool:
        return piece.holds(*_request(kind, point))

    t_at, c_at = piece.at
    if kind != "chunk":
        at = t_at if kind == "prefill" else c_at
        wanted = degrees[0] + 2
        # (outward from the traced size: at, at + 1, at - 1, ...)
        nearest: Iterator[tuple[int, ...]] = ((n,) for n in dict.fromkeys(
            n for step in range(_SEARCH) for n in (at + step, at - step) if n >= 2))
        found = list(itertools.islice((p for p in nearest if inside(p)), wanted))
        return sorted(found) if len(found) == wanted else None
    width, height = degrees[0] + 2, degrees[1] + 2
    # (grids holding the traced request first, then grids further up)
    origins = [*((t0, c0) for t0 in range(max(2, t_at - width + 1), t_at + 1)
                 for c0 in range(max(2, c_at - height + 1), c_at + 1)),
               *((t_at + i, c_at + j) for i in range(1, 9) for j in range(9))]
    for t0, c0 in origins:
        grid: list[tuple[int, ...]] = list(itertools.product(range(t0, t0 + width), range(c0, c0 + height)))
        if all(inside(point) for point in grid):
            return grid
    return None


def _request(kind: str, point: tuple[int, ...]) -> tuple[int, int]:
    """``(t, c)`` of a request of ``kind`` at ``point`` (its variables' values)."""
    return (point[0], 0) if kind == "prefill" else (1, point[0]) if kind == "decode" else (point[0], point[1])


def _through(kind: str, sizes: list[tuple[int, ...]], values: Mapping[tuple[int, ...], int | Fraction], name: str,
             what: str) -> Polynomial | Polynomial2:
    """The polynomial through ``values`` at ``sizes``, checked at the extra ones: along
    ``t`` for each ``c`` of the grid, then each power's coefficient along ``c``."""
    def refuse() -> SymbolicError:
        return SymbolicError(f"{name}: the rank's {what} of the {kind} template passes through no polynomial of "
                             "the unsharded degree at the sizes counted: not fitted")

    if kind != "chunk":
        found = interpolate([p[0] for p in sizes], [values[p] for p in sizes])
        if found is None:
            raise refuse()
        return found
    ts, cs = sorted({p[0] for p in sizes}), sorted({p[1] for p in sizes})
    rows = [interpolate(ts, [values[(t, c)] for t in ts]) for c in cs]
    if any(row is None for row in rows):
        raise refuse()
    coefficients: dict[tuple[int, int], Fraction] = {}
    for i in range(len(ts)):
        along = interpolate(cs, [row.coefficient(i) for row in rows if row is not None])
        if along is None:
            raise refuse()
        for j, value in enumerate(along.coefficients):
            if value:
                coefficients[(i, j)] = value
    return Polynomial2(coefficients)


def _nonzero(polynomial: Polynomial | Polynomial2) -> bool:
    if isinstance(polynomial, Polynomial):
        return any(polynomial.coefficients)
    return bool(polynomial.terms())


def _request_count(variables: tuple[str, ...], polynomial: Polynomial | Polynomial2) -> RequestCount:
    """A fitted polynomial as the cost model's count of a request."""
    text = polynomial.text(variables[0]) if isinstance(polynomial, Polynomial) else \
        polynomial.text((variables[0], variables[1]))
    return RequestCount(variables, polynomial, text, polynomial)
