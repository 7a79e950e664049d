"""A serving cost model from the model's own code: the MACs of any scheduler step as
polynomials in each request's new tokens ``t`` and cached context ``c``.

A serving engine (vLLM, SGLang) runs steps that mix requests: fresh prompts, chunks of a
chunked prefill, single-token decodes, each against its own cache. Per request, a step
is one of three computations, traced on fake tensors with its sizes as symbols
(:mod:`flopscope.workloads.symbolic`):

- ``prefill``: a fresh prompt of ``t`` positions (``c = 0``), a polynomial in ``t``;
- ``decode``: one new position on a cache of ``c`` (``t = 1``), a polynomial in ``c``
  (the templates of :mod:`flopscope.workloads.generation_templates`);
- ``chunk``: ``t`` new positions on a cache of ``c``, a polynomial in ``t`` and ``c``:
  one forward of ``t`` token ids on the cache earlier forwards filled with ``c``
  positions (:func:`~flopscope.workloads.decoding.prefill_then_chunk`).

The first piece of each comes from one run: a prefill of ``c`` positions (a symbol), a
decode step on its cache, then a chunk of ``t`` (a second symbol) on the ``c + 1``
positions the decode step left (:class:`_ServingTrace`). The prefill and the decode step
hold where the guards made before the chunk hold, within the bounds of ``c`` as the chunk
found them (a guard the chunk added changes nothing before it); the chunk where all of
them do.

A step's MACs are the sum over its requests (:meth:`StepCost.iteration`): every multiply
of a decoder-only model belongs to one request, its projections to its tokens and its
attention to its own cache. Only the last position's logits are computed, per request,
as ``generate()`` and the engines do. The attention core is priced as executed (the
kernels' work over the whole ``t x (c + t)`` block, ``docs/conventions.md``). A request
outside the guards a template's traces recorded (a sliding window from ``W`` on) is
traced again where it falls: a new piece of the template (:meth:`StepCost.piece`). A
size the symbolic shapes keep constant (0 or 1, besides ``c = 0`` and ``t = 1`` above)
is counted concretely. The notes say which. Units: MACs (FLOPs = 2 x MACs).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import torch
from torch import nn

from ..api import profile_with_plan
from ..attribute.roles import RoleRule
from ..capture import CapturePlan, fake_converter
from ..errors import ConfigurationError, InputError, SymbolicError
from ..formulas.registry import FormulaRegistry
from ..hardware.peaks import peak_bandwidth, peak_flops
from ..predict.polynomial import Polynomial, Polynomial2
from ..predict.steps import Step, root_call
from ..profile import Profile
from ..role import ROLE_ORDER
from .decoding import check_decoding, prefill_then_chunk
from .generation import profile_generation
from .generation_templates import GenerationTrace, carry_roles
from .symbolic import SymbolicTrace, python_code, quiet_symbolic_graph, require_symbolic_sizes, trace_dispatched

__all__ = ["COST_SCHEMA", "CountedRequest", "RequestCount", "StepCost", "StepPrice", "TemplatePiece", "cost_model",
           "count_request"]

COST_SCHEMA = "flopscope.cost/1"
"""The name and version of :meth:`StepCost.to_json`'s document (``docs/schemas/cost-1.json``)."""


@dataclass(frozen=True)
class RequestCount:
    """MACs of one role of one template as an exact function of the request's sizes
    (``variables``, e.g. ``("t", "c")``): a polynomial where it is one, else a Python
    expression (a floor division: a layer padding its chunks)."""

    variables: tuple[str, ...]
    polynomial: Polynomial | Polynomial2 | None
    expression: str  # Python, in the variables
    evaluate: Callable[..., Any] = field(repr=False, compare=False)

    def at(self, *values: int) -> int:
        return _integer(self.evaluate(*values), f"{self.text()} at {self.variables} = {values}")

    def text(self) -> str:
        if isinstance(self.polynomial, Polynomial):
            return self.polynomial.text(self.variables[0])
        if isinstance(self.polynomial, Polynomial2):
            return self.polynomial.text((self.variables[0], self.variables[1]))
        return self.expression

    def to_json(self) -> dict[str, Any]:
        """``{"terms": [[power, ..., "p/q"], ...]}``, or ``{"expression": "..."}`` (Python,
        ``//`` a floor division) where the count is no polynomial."""
        if isinstance(self.polynomial, Polynomial):
            return {"terms": [[i, str(c)] for i, c in enumerate(self.polynomial.coefficients) if c]}
        if isinstance(self.polynomial, Polynomial2):
            return {"terms": [[i, j, str(c)] for i, j, c in self.polynomial.terms()]}
        return {"expression": self.expression}


def _integer(value: Any, what: str) -> int:
    """``value``, a count of MACs, as an int; :class:`~flopscope.errors.SymbolicError`
    naming ``what`` where it is none (a fraction)."""
    if int(value) != value:
        raise SymbolicError(f"{what} is not an integer: {value}")
    return int(value)


@dataclass(frozen=True)
class StepPrice:
    """A scheduler step on a roofline (:meth:`StepCost.price`). ``seconds`` is a lower
    bound: the step cannot run faster than its FLOPs at the (derated) peak nor than its
    bytes at the bandwidth; kernels reach neither. Units: FLOPs, bytes, seconds."""

    requests: int
    flops: int
    bytes: int
    compute_seconds: float  # FLOPs at the peak (per role, derated by its efficiency)
    memory_seconds: float  # bytes at the bandwidth
    bound: str  # "compute" or "memory": the larger of the two

    @property
    def seconds(self) -> float:
        """The roofline's time: a lower bound, labelled as one wherever it is printed."""
        return max(self.compute_seconds, self.memory_seconds)

    @property
    def intensity(self) -> float:
        """FLOPs per byte."""
        return self.flops / self.bytes if self.bytes else float("inf")


@dataclass(frozen=True)
class TemplatePiece:
    """One trace of a template: each role's MACs, the bytes and the state's bytes of a
    request, as exact functions of its sizes, and the guards under which they hold."""

    by_role: Mapping[str, RequestCount]
    bytes: RequestCount
    weights: int  # bytes of the parameters and buffers a request's step reads
    conditions: tuple[str, ...]
    holds: Callable[[int, int], bool] = field(repr=False, compare=False)
    at: tuple[int, int] = (0, 0)  # the request (t, c) it was traced at: it holds there

    def to_json(self) -> dict[str, Any]:
        return {"conditions": list(self.conditions), "bytes": self.bytes.to_json(), "weight_bytes": self.weights,
                "macs_by_role": {role: count.to_json() for role, count in self.by_role.items()}}


@dataclass(frozen=True)
class StepCost:
    """MACs per role of one request in a step, by its new tokens ``t`` and cached
    context ``c`` (:func:`cost_model`); a step's are the sum over its requests."""

    model: str
    # template -> its traces, the first at the sizes cost_model was given, the others made where a request fell
    # outside every one's guards: "prefill" (c = 0, t >= 2), "decode" (t = 1, c >= 2), "chunk" (t, c >= 2)
    pieces: Mapping[str, list[TemplatePiece]]
    _trace: Callable[[str, int, int], dict[str, TemplatePiece]] = field(repr=False, compare=False)
    _concrete: Callable[[int, int], CountedRequest] = field(repr=False, compare=False)
    notes: list[str] = field(default_factory=list, compare=False)
    # one rank's model: {"tp": ranks, "rank": its index, "experts_split": bool, "routing": a convention or None}
    # (flopscope.workloads.rank_cost); None for the whole model
    parallel: Mapping[str, Any] | None = None

    @property
    def prefill(self) -> Mapping[str, RequestCount]:
        """Role -> MACs of a fresh prompt of ``t`` positions (the first piece)."""
        return self.pieces["prefill"][0].by_role

    @property
    def decode(self) -> Mapping[str, RequestCount]:
        """Role -> MACs of one new position on a cache of ``c`` (the first piece)."""
        return self.pieces["decode"][0].by_role

    @property
    def chunk(self) -> Mapping[str, RequestCount]:
        """Role -> MACs of ``t`` new positions on a cache of ``c`` (the first piece)."""
        return self.pieces["chunk"][0].by_role

    @property
    def conditions(self) -> dict[str, tuple[str, ...]]:
        """Template -> the guards its first piece holds under."""
        return {kind: pieces[0].conditions for kind, pieces in self.pieces.items()}

    def piece(self, t: int, c: int) -> TemplatePiece | None:
        """The piece of the request's template that stands for ``(t, c)``: one already
        traced, else one traced there (sizes the symbolic shapes keep constant, 0 and 1,
        have none: ``None``)."""
        kind = self.template_of(t, c)
        found = next((piece for piece in self.pieces[kind] if piece.holds(t, c)), None)
        if found is not None or _constant_sizes(kind, t, c):
            return found
        for name, made in self._trace(kind, t, c).items():
            self.pieces[name].append(made)
        note = f"t = {t}, c = {c}: outside the {kind} template's traces' guards, traced again there"
        self.notes.append(note)
        return next((piece for piece in self.pieces[kind] if piece.holds(t, c)), None)

    def template_of(self, t: int, c: int) -> str:
        """``"prefill"``, ``"decode"`` or ``"chunk"``: the computation of a request of
        ``t`` new positions on a cache of ``c``."""
        if t < 1 or c < 0:
            raise InputError(f"a request brings t >= 1 new positions on a cache of c >= 0; got t = {t}, c = {c}")
        return "prefill" if c == 0 else "decode" if t == 1 else "chunk"

    def request(self, t: int, c: int) -> dict[str, int]:
        """MACs per role of a request of ``t`` new positions on a cache of ``c``: from its
        template's piece that stands for ``(t, c)`` (:meth:`piece`), else counted concretely
        (and noted)."""
        kind = self.template_of(t, c)
        found = self.piece(t, c)
        if found is not None:
            sizes = (t,) if kind == "prefill" else (c,) if kind == "decode" else (t, c)
            return {role: v for role, count in found.by_role.items() if (v := count.at(*sizes))}
        note = (f"t = {t}, c = {c}: sizes the symbolic shapes keep constant, counted concretely"
                if _constant_sizes(kind, t, c) else
                f"t = {t}, c = {c}: in a piece too narrow to fit (it holds at too few sizes), counted concretely")
        if note not in self.notes:
            self.notes.append(note)
        return {role: _integer(v, f"{role} of {self.model} at t = {t}, c = {c} (a share of the routes under "
                                  "balanced routing)") for role, v in self._concrete(t, c).by_role.items()}

    def request_bytes(self, t: int, c: int) -> tuple[int, int]:
        """``(bytes, weights)`` of a request of ``t`` new positions on a cache of ``c``:
        the bytes its ops move (:mod:`flopscope.formulas.traffic`: each tensor an op
        reads read once, each it writes written once), and the parameters' share, which
        a step batching several requests reads once."""
        kind = self.template_of(t, c)
        found = self.piece(t, c)
        if found is not None:
            sizes = (t,) if kind == "prefill" else (c,) if kind == "decode" else (t, c)
            return found.bytes.at(*sizes), found.weights
        counted = self._concrete(t, c)
        return counted.bytes, counted.weights

    def iteration_bytes(self, requests: Sequence[tuple[int, int]]) -> int:
        """Bytes of a scheduler step running ``requests``: each request's bytes without its
        weights, plus the weights once (the largest any request reads: every request
        runs the same layers). Exact for a dense model batching equal requests; with
        experts, the weights of the experts each request reaches."""
        found = [self.request_bytes(t, c) for t, c in requests]
        return sum(size - weights for size, weights in found) + max((w for _, w in found), default=0)

    def iteration(self, requests: Sequence[tuple[int, int]]) -> dict[str, int]:
        """MACs per role of a scheduler step running ``requests``, each ``(t, c)``: the sum
        of :meth:`request` over them (a prefill chunk and eight decodes of other contexts,
        say)."""
        total: Counter[str] = Counter()
        for t, c in requests:
            total.update(self.request(t, c))
        return {role: total[role] for role in ROLE_ORDER if total[role]}

    def price(self, requests: Sequence[tuple[int, int]], *, device: str | torch.device | None = None,
              dtype: torch.dtype = torch.bfloat16, peak: float | None = None, bandwidth: float | None = None,
              efficiency: Mapping[str, float] | None = None, memory_efficiency: float = 1.0) -> StepPrice:
        """A scheduler step's roofline on ``device`` (a table name such as ``"H100 SXM"``,
        ``"cuda"``, or ``None``: this machine; ``peak`` FLOP/s and ``bandwidth`` bytes/s
        override): its FLOPs and bytes (:meth:`iteration`, :meth:`iteration_bytes`), the
        time each would take at the peak, and the larger, a lower bound on the step's
        time. ``efficiency``: measured fractions of the peak per role (a GEMM's achieved
        / peak; 1.0 where a role is not named); ``memory_efficiency``: the bandwidth's.
        Units: FLOPs (2 x MACs), bytes, seconds."""
        roles = self.iteration(requests)
        flops = 2 * sum(roles.values())
        moved = self.iteration_bytes(requests)
        top = peak_flops(device, dtype, peak=peak)
        band = peak_bandwidth(device, bandwidth=bandwidth)
        if not top or not band:
            raise ConfigurationError(f"no peak FLOP/s or bandwidth for {device!r} ({dtype}): pass peak= and "
                                     "bandwidth=")
        rates = efficiency or {}
        compute = sum(2 * macs / (top * rates.get(role, 1.0)) for role, macs in roles.items())
        memory = moved / (band * memory_efficiency)
        return StepPrice(len(requests), flops, moved, compute, memory,
                         "compute" if compute >= memory else "memory")

    def to_json(self) -> dict[str, Any]:
        """The cost model as a document a simulator reads without flopscope (schema
        :data:`COST_SCHEMA`, ``docs/schemas/cost-1.json``): each template's MACs per
        role as exact polynomials, coefficients as strings (``"3/2"``)."""
        def one(table: Mapping[str, RequestCount]) -> dict[str, dict[str, Any]]:
            return {role: count.to_json() for role, count in table.items()}

        domains = {"prefill": "c = 0, t >= 2", "decode": "t = 1, c >= 2", "chunk": "t >= 2, c >= 2"}
        terms = {"prefill": "[power of t, coefficient]", "decode": "[power of c, coefficient]",
                 "chunk": "[power of t, power of c, coefficient]"}
        return {
            "schema": COST_SCHEMA, "model": self.model, "units": "MACs per request (FLOPs = 2 x MACs); bytes",
            "attention": "executed",
            "variables": {"t": "new positions of the request in the step",
                          "c": "positions in the request's cache before the step"},
            "step": "a step's MACs are the sum over its requests; its bytes the sum of the requests' bytes less "
                    "their weight_bytes, plus the largest weight_bytes once",
            "templates": {kind: {"domain": domains[kind], "terms": terms[kind], **pieces[0].to_json(),
                                 "pieces": [piece.to_json() for piece in pieces[1:]]}
                          for kind, pieces in self.pieces.items()},
            **({"parallel": dict(self.parallel)} if self.parallel is not None else {}),
        }

    def table(self) -> str:
        """Each template's MACs per role, as a text table."""
        from tabulate import tabulate

        rows: list[list[str]] = []
        for kind in ("prefill", "decode", "chunk"):
            found: Mapping[str, RequestCount] = getattr(self, kind)
            rows.extend([kind if i == 0 else "", role, count.text()] for i, (role, count) in enumerate(found.items()))
        return tabulate(rows, headers=["template", "role", "MACs per request"], disable_numparse=True)


def cost_model(model: nn.Module, *, context: int = 64, chunk: int = 16, registry: FormulaRegistry | None = None,
               roles: Sequence[RoleRule] = ()) -> StepCost:
    """The serving cost model of ``model`` (a Hugging Face decoder that generates), from
    one symbolic trace (see the module docstring): a prefill of ``context`` positions, a
    decode step on its cache, and a chunk of ``chunk`` positions on the ``context + 1``
    the decode step left, each size a symbol. ``registry``, ``roles``: as :func:`flopscope.profile`.
    Units: MACs (FLOPs = 2 x MACs)."""
    if context < 2 or chunk < 2:
        raise InputError(f"context and chunk are the traced sizes, at least 2 each; got {context}, {chunk}")
    check_decoding(model, torch.zeros(1, context, dtype=torch.long), 1)
    name = type(model).__name__
    require_symbolic_sizes("cost_model")
    if any(type(p).__name__ == "DTensor" for p in model.parameters()):
        raise SymbolicError(f"{name} is sharded with DTensor, whose sharding propagation hashes sizes: a symbolic "
                            "size cannot pass it. Count a rank step by step instead: profile_generation(model, ids, "
                            "new_tokens) inside flopscope.distributed.fake_world (docs/guide/distributed.md)")
    trace = functools.partial(_trace_pieces, model, registry, tuple(roles))
    # (the three templates from one run where it gives them)
    first = _ServingTrace(model, context, chunk, 1, registry, tuple(roles)).pieces()
    if "decode" not in first:
        first |= trace("decode", 1, context)
    notes = [note for piece in first.values() for note in getattr(piece, "notes", ())]
    return StepCost(name, {kind: [piece] for kind, piece in first.items()}, trace,
                    functools.cache(functools.partial(count_request, model, registry, tuple(roles))), notes)


def _trace_pieces(model: nn.Module, registry: FormulaRegistry | None, roles: tuple[RoleRule, ...], kind: str,
                  t: int, c: int) -> dict[str, TemplatePiece]:
    """New pieces traced where a request of ``kind`` at ``(t, c)`` falls: the prefill and
    the decode step at a cache of ``t`` (a prefill) or ``c`` (a decode), or the chunk."""
    name = type(model).__name__
    if kind != "chunk":
        steps = GenerationTrace(model, 1, t if kind == "prefill" else c, torch.long, registry, roles)
        found = steps.symbolic
        if found is None:
            raise SymbolicError(f"{name}: a cache of {c} is not symbolic")
        holds = functools.partial(_holds_one, found)
        out = {}
        for index, (template, names) in enumerate((("prefill", ("t",)), ("decode", ("c",)))):
            by_role = {role: _request_count(found, macs, names) for role, macs in steps.steps[index].by_role.items()}
            moved = _request_count(found, steps.profile.step_totals(index + 1)[1], names)
            check: Callable[[int, int], bool] = ((lambda t, c: t >= 2 and holds(t)) if template == "prefill" else
                                                 (lambda t, c: c >= 2 and holds(c)))
            out[template] = TemplatePiece(by_role, moved, int(steps.profile.weight_bytes(index + 1)),
                                          found.conditions(), check, (steps.n, 0) if index == 0 else (1, steps.n))
        return out
    return _ServingTrace(model, c, t, 0, registry, roles).pieces()


def _constant_sizes(kind: str, t: int, c: int) -> bool:
    """Whether a request of ``kind`` at ``(t, c)`` has a size the symbolic shapes keep
    constant (0 and 1): no trace stands for it."""
    return (kind == "chunk" and min(t, c) < 2) or max(t, c) < 2


def _request_count(found: SymbolicTrace, count: Any, names: tuple[str, ...],
                   symbols: tuple[Any, ...] | None = None, shift: Mapping[Any, Any] | None = None
                   ) -> RequestCount:
    """``count`` of a symbolic trace as a :class:`RequestCount` in ``names`` (the trace's
    ``symbols``, default its one symbol), each symbol first replaced as ``shift`` says
    (``{c: c - 1}``: the count in the size one larger)."""
    import sympy

    symbols = symbols or (found.symbol,)
    expr = sympy.expand(found.expression(count).xreplace(shift or {}))
    code = python_code(expr, dict(zip(symbols, names, strict=True)))
    evaluate = eval(f"lambda {', '.join(names)}: {code}", {"max": max, "min": min})
    polynomial: Polynomial | Polynomial2 | None = None
    if expr.free_symbols <= set(symbols) and expr.is_polynomial(*symbols):
        if len(symbols) == 1 and not shift:
            coefficients = found.coefficients(count)
            polynomial = None if coefficients is None else Polynomial(coefficients)
        else:
            terms = sympy.Poly(expr, *symbols).terms()
            polynomial = Polynomial2({(int(i), int(j)): Fraction(int(v.p), int(v.q)) for (i, j), v in terms})
    return RequestCount(names, polynomial, code, evaluate)


def _holds_one(found: SymbolicTrace, n: int) -> bool:
    return found.holds([n])[0]


class _ServingTrace:
    """A prefill of ``c`` positions (a symbol), ``decodes`` decode steps on its cache, then
    a chunk of ``t`` positions (a second symbol of the same shape environment, made by
    the driver) on the cache of ``c + decodes``; its roles carried from a concrete count
    of the same forwards. Each forward's counts hold where the guards it depends on do:
    the prefill's and the decode step's on the guards made before the chunk and the
    bounds of ``c`` then (a later guard, naming ``t`` or not, changes nothing they ran),
    the chunk's on all of them."""

    def __init__(self, model: nn.Module, context: int, chunk: int, decodes: int,
                 registry: FormulaRegistry | None, roles: tuple[RoleRule, ...]) -> None:
        self.name, self.decodes, self.context, self.chunk = type(model).__name__, decodes, context, chunk
        made: dict[str, Any] = {}
        plan = CapturePlan.of("fake", registry, reuse=True,
                              driver=functools.partial(_chunk_driver, chunk, decodes, made),
                              converter=fake_converter())
        ids = functools.partial(torch.zeros, dtype=torch.long)
        inputs: tuple[Any, Any] = (((ids(1, context + 1),), {}), ((ids(1, context),), {}))
        self.symbolic = trace_dispatched(model, inputs, (context + 1, context), plan, roles)
        self.t, self.c = made["t"], self.symbolic.symbol
        # (the guards, the bounds of c and the replaced symbols the forwards before the chunk left)
        self._before: tuple[int, Any, set[Any]] = made["before"]
        with quiet_symbolic_graph():
            def twin(length: int) -> Profile:
                return _chunk_profile(model, length, chunk, registry, roles, decodes)

            if not carry_roles(self.symbolic.profile, twin, context):
                raise SymbolicError(f"{self.name} ran other ops with symbolic sizes than at c = {context}, "
                                    f"t = {chunk}: its roles cannot be carried over")
            self.steps: list[Step] = self.symbolic.profile.steps()
        if len(self.steps) != decodes + 2:
            raise SymbolicError(f"{self.name}: {len(self.steps)} forwards traced, not a prefill, {decodes} decode "
                                "step(s) and a chunk")

    def holds(self, at: Mapping[Any, int], before_chunk: bool = False) -> bool:
        """Whether every guard of the trace (and each symbol's bounds) holds at ``at``
        (``{symbol: value}``); ``before_chunk``: the guards and bounds as the chunk found
        them (what the forwards before it depend on). A guard on another symbol (a
        data-dependent size) holds only where the trace ran."""
        import sympy

        env = self.symbolic.shape_env
        guards = env.guards[:self._before[0]] if before_chunk else env.guards
        for symbol, value in at.items():
            bounds = self._before[1] if before_chunk and symbol == self.c else env.var_to_range.get(symbol)
            if bounds is not None and not bounds.lower <= value <= bounds.upper:
                return False
        values = {symbol: sympy.Integer(value) for symbol, value in at.items()}
        traced = all(value == {self.c: self.context, self.t: self.chunk}.get(symbol) for symbol, value in at.items())
        for guard in guards:
            free = guard.expr.free_symbols
            if not free <= values.keys():
                if not traced:
                    return False
            elif guard.expr.xreplace(values) is not sympy.true:
                return False
        return True

    def pieces(self) -> dict[str, TemplatePiece]:
        """The templates of its forwards as pieces: the prefill (in ``t``, the symbol
        ``c`` of the trace) and the decode step (in ``c``) where it ran one, and the
        chunk, its context ``c`` the trace's ``c + decodes``."""
        import sympy

        out: dict[str, TemplatePiece] = {}
        profile, found = self.symbolic.profile, self.symbolic
        # (a symbol the chunk's guards replaced, c by an expression in t say, would change what the counts of the
        # forwards before it read: then only the chunk is the trace's)
        if self.decodes and not set(found.shape_env.replacements) - self._before[2] - {self.t}:
            for index, kind, names in ((0, "prefill", ("t",)), (1, "decode", ("c",))):
                at = (self.context, 0) if kind == "prefill" else (1, self.context)
                check = self._holds_prefill if kind == "prefill" else self._holds_decode
                conditions = tuple(dict.fromkeys(found.text(g.expr)
                                                 for g in found.shape_env.guards[:self._before[0]]))
                out[kind] = TemplatePiece(
                    {role: _request_count(found, macs, names) for role, macs in self.steps[index].by_role.items()},
                    _request_count(found, profile.step_totals(index + 1)[1], names),
                    int(profile.weight_bytes(index + 1)), conditions, check, at)
        index = len(self.steps)
        # (the chunk's context is the trace's c + decodes: its counts in that context)
        shift = {self.c: self.c - self.decodes}
        written = {self.t: sympy.Symbol("t"), self.c: sympy.Symbol("c")}
        conditions = tuple(dict.fromkeys(str(g.expr.xreplace(shift).xreplace(written))
                                         for g in found.shape_env.guards))
        out["chunk"] = TemplatePiece(
            {role: _request_count(found, macs, ("t", "c"), (self.t, self.c), shift)
             for role, macs in self.steps[-1].by_role.items()},
            _request_count(found, profile.step_totals(index)[1], ("t", "c"), (self.t, self.c), shift),
            int(profile.weight_bytes(index)), conditions, self._holds_chunk, (self.chunk, self.context + self.decodes))
        return out

    def _holds_prefill(self, t: int, c: int) -> bool:
        return t >= 2 and self.holds({self.c: t}, before_chunk=True)

    def _holds_decode(self, t: int, c: int) -> bool:
        return c >= 2 and self.holds({self.c: c}, before_chunk=True)

    def _holds_chunk(self, t: int, c: int) -> bool:
        return t >= 2 and c - self.decodes >= 2 and self.holds({self.t: t, self.c: c - self.decodes})


def _chunk_driver(chunk: int, decodes: int, made: dict[str, Any], model: nn.Module, args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> None:
    """A capture's driver: :func:`prefill_then_chunk` of the run's token ids with
    ``decodes`` decode steps, the chunk of ``chunk`` positions, a symbol of the ids'
    shape environment where their length is one (recorded in ``made["t"]``). Where it
    is, ``made["before"]`` is the shape environment as the chunk found it: its number
    of guards, the bounds of the ids' length and the symbols replaced so far."""
    ids = args[0]
    size = ids.shape[1]
    length: Any = chunk
    if isinstance(size, torch.SymInt):
        from torch._dynamo.source import ConstantSource
        from torch.fx.experimental.symbolic_shapes import DimDynamic

        env = size.node.shape_env
        symbol = env.create_symbol(chunk, source=ConstantSource("t"), dynamic_dim=DimDynamic.DYNAMIC)
        made["t"] = symbol
        length = env.create_symintnode(symbol, hint=chunk)

    def chunk_ids() -> torch.Tensor:
        if isinstance(size, torch.SymInt):
            made["before"] = (len(env.guards), env.var_to_range.get(size.node.expr), set(env.replacements))
        return torch.zeros(ids.shape[0], length, dtype=ids.dtype, device=ids.device)

    prefill_then_chunk(model, ids, chunk_ids, decodes)


def _chunk_profile(model: nn.Module, context: int, chunk: int, registry: FormulaRegistry | None,
                   roles: tuple[RoleRule, ...], decodes: int = 0) -> Profile:
    plan = CapturePlan.of("fake", registry, reuse=True, driver=functools.partial(_chunk_driver, chunk, decodes, {}),
                          converter=fake_converter())
    return profile_with_plan(model, (torch.zeros(1, context, dtype=torch.long),), {}, plan, roles, stacklevel=4)


@dataclass(frozen=True)
class CountedRequest:
    """A request counted concretely: MACs per role, bytes, and the weights' share of them."""

    by_role: dict[str, int | Fraction]
    bytes: int
    weights: int


def count_request(model: nn.Module, registry: FormulaRegistry | None, roles: tuple[RoleRule, ...], t: int,
                  c: int, *, balanced: bool = False) -> CountedRequest:
    """A request counted concretely: a fresh prompt of ``t`` (``c = 0``), else a prefill
    of ``c`` then ``t`` positions on its cache (``t = 1``: a decode step as
    :func:`~flopscope.workloads.generation.profile_generation` counts it). ``balanced``:
    an expert-parallel rank's grouped matmuls counted with every route
    (:meth:`~flopscope.profile.Profile.unrouted`) at the share of the routes its experts
    get under balanced routing (:func:`balanced_routes`); else every route, an upper
    bound."""
    ids = torch.zeros(1, c or t, dtype=torch.long)
    if c == 0:
        prof, step = profile_generation(model, ids, 1, registry=registry, roles=roles), 1
    elif t == 1:
        prof, step = profile_generation(model, ids, 2, registry=registry, roles=roles), 2
    else:
        prof, step = _chunk_profile(model, c, t, registry, roles), 2
    found = prof.steps()[step - 1]
    by_role: dict[str, int | Fraction] = dict(found.by_role)
    if balanced:
        by_role = balanced_routes(prof, found.step, by_role)
    return CountedRequest({role: v for role, v in by_role.items() if v}, prof.step_totals(step)[1],
                          prof.weight_bytes(step))


def balanced_routes(prof: Profile, step: int, by_role: Mapping[str, int | Fraction]) -> dict[str, int | Fraction]:
    """``by_role``, one call of the root module's MACs per role (``step``, 1 for the
    first), with each grouped matmul counted with every route on an expert-parallel rank
    (:meth:`~flopscope.profile.Profile.unrouted`) at the share of the routes balanced
    routing gives the rank's experts: the share of the layer's experts it holds (each
    expert gets as many routes as any other). Exact: a count that is no integer is kept
    as a fraction (a share of 1/3: a cost model's polynomials then refuse the sizes
    where they are none). Raises :class:`~flopscope.errors.ConfigurationError` where
    the shards do not say the share."""
    out: dict[str, int | Fraction] = dict(by_role)
    assignments = prof.role_assignments_by_op()
    for op, share in prof.unrouted().items():
        if root_call(op) != step:
            continue
        if share is None:
            raise ConfigurationError(f"{op.op_name} in '{op.module_stack[-1].path}': the experts' shards do not say "
                                     "which share of the layer's experts this rank holds; no balanced routing")
        assignment = assignments.get(op)
        # (a record without roles is in no role's MACs: by_role leaves it out too)
        for role, macs in (assignment.parts if assignment is not None else {}).items():
            value = out.get(role, 0) - macs * (1 - share)
            out[role] = int(value) if value == int(value) else value
    return out
