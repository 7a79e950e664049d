"""Exact scaling in sequence length: each role's multiplies as a polynomial in n, with
exact coefficients.

:func:`scaling` profiles a model at several lengths (fake tensors by default: cheap),
then, per role, finds the lowest-degree polynomial through the measured counts by exact
rational interpolation and *checks* it at every remaining length (so at least one more
length than the degree needs): a role whose counts are not a polynomial of degree <=
len(lengths) - 2 is reported as such, never fitted. Each polynomial is set beside the
one predicted from the model's declared structure (the closed forms of
:mod:`flopscope.predict.reconcile`), coefficient by coefficient.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from ..api import profile_with_plan, split_inputs
from ..attribute.roles import RoleRule
from ..capture import MODES, CapturePlan, new_converter, paused_gc
from ..capture.checks import check_mode, check_positive
from ..capture.records import RECOMPUTE
from ..errors import ConfigurationError, SymbolicError
from ..formulas.registry import FormulaRegistry
from ..predict.polynomial import Polynomial, Scaling, interpolate
from ..predict.reconcile import Reconciliation, TransformerSpec
from ..profile import Profile, reuse_roles
from ..role import ROLE_ORDER
from .symbolic import SymbolicTrace, symbolic_limit_reason, trace

__all__ = ["METHODS", "MIN_LENGTHS", "Polynomial", "Scaling", "interpolate", "scaling"]

MIN_LENGTHS = 4
"""Fewest distinct lengths :func:`scaling` takes: a quadratic (attention) takes 3 and is
checked at one more."""


METHODS = ("sampled", "auto", "symbolic")
"""How :func:`scaling` finds the polynomials: profiles at each length and exact
interpolation; one symbolic trace (:mod:`flopscope.symbolic`); or the symbolic trace
with a fall-back to sampling where the model specialises."""


def scaling(model: nn.Module, make_inputs: Callable[[int], Any],
            lengths: Sequence[int] = (64, 128, 256, 512, 1024),
            *, mode: str = "fake", spec: Callable[[int], TransformerSpec] | None = None,
            progress: Callable[[int, int], None] | None = None,
            registry: FormulaRegistry | None = None,
            roles: Sequence[RoleRule] = (), backward: bool = False,
            loss: Callable[[Any], torch.Tensor] | None = None,
            forward_kwargs: dict[str, Any] | None = None, method: str = "sampled",
            **kwargs: Any) -> Scaling:
    """Profile ``model(*make_inputs(n))`` at each length and recover each role's exact
    polynomial in n.

    ``make_inputs(n)`` returns a tensor, a tuple of positional inputs, a dict of keyword
    inputs, or a ``(args, kwargs)`` pair; n may be any size of the inputs (a batch size
    too). ``spec(n)`` optionally states the hyper-parameters for the predictions.
    ``progress(done, total)`` is called after each profile. ``mode``, ``registry``,
    ``roles``, ``backward``, ``loss``, ``forward_kwargs`` and other keyword arguments
    (inputs for the model, at every length) mean what they mean for
    :func:`flopscope.profile` (with ``backward=True`` the polynomials are of the forward
    and backward MACs together; forward work that activation checkpointing recomputes in
    the backward pass is apart, in ``recomputed``). Every length must be >= 1: else a
    :class:`~flopscope.errors.ConfigurationError` naming it, before anything is
    profiled.

    ``method`` (:data:`METHODS`): ``"sampled"`` profiles every length (at least 4) and
    interpolates; ``"symbolic"`` counts once with n a symbol (fake tensors), so every
    role's MACs come out as a polynomial, valid at every length where the model's
    decisions on n (guards) hold, which must include each of ``lengths`` (at least 2);
    it is checked against profiles at the shortest and longest length before it is
    returned, and a model that specialises on n raises
    :class:`~flopscope.errors.SymbolicError` naming the guard and where it was added.
    ``"auto"``: symbolic, else sampled, with the reason in :attr:`Scaling.fallback`.
    """
    for n in lengths:
        check_positive(length=n)
    lengths = tuple(sorted(set(int(n) for n in lengths)))
    check_mode(method, METHODS, "method")
    fewest = 2 if method == "symbolic" else MIN_LENGTHS
    if len(lengths) < fewest:
        raise ConfigurationError(f"scaling needs at least {fewest} distinct lengths: a quadratic "
                                 "(attention) takes 3 and is checked at one more; got "
                                 f"{', '.join(map(str, lengths))}"
                                 if fewest == MIN_LENGTHS else
                                 "a symbolic scaling is checked at two lengths; got "
                                 f"{', '.join(map(str, lengths))}")
    check_mode(mode, MODES)
    plan = CapturePlan.of(mode, registry, backward, loss)
    sweep = _Sweep(model, make_inputs, mode, spec, progress, plan, roles,
                   {**kwargs, **(forward_kwargs or {})})
    with paused_gc(promote=mode == "fake"):
        if method == "sampled":
            return sweep.sampled(lengths)
        if method == "symbolic":
            return sweep.symbolic(lengths)
        try:
            return sweep.symbolic(lengths)
        except SymbolicError as failed:
            return replace(sweep.sampled(lengths), fallback=str(failed))


@dataclass
class _Point:
    """What one profile at one length says: MACs per role, recomputed MACs per role,
    predictions per role."""

    roles: dict[str, int]
    recomputed: dict[str, int]
    predicted: dict[str, int | None]
    profile: Profile


class _Sweep:
    """The profiles of one :func:`scaling` call (the model's state converted to fake
    tensors once, the roles found once and reused where the same ops run at another
    length)."""

    def __init__(self, model: nn.Module, make_inputs: Callable[[int], Any], mode: str,
                 spec: Callable[[int], TransformerSpec] | None,
                 progress: Callable[[int, int], None] | None,
                 plan: CapturePlan, roles: Sequence[RoleRule],
                 forward_kwargs: dict[str, Any]) -> None:
        self.model, self.make_inputs, self.mode, self.spec = model, make_inputs, mode, spec
        self.progress, self.roles, self.forward_kwargs = progress, roles, forward_kwargs
        # the model's state converted once for the sweep
        self.plan = replace(plan, converter=new_converter(model, plan) if mode != "real" else None)
        self.template: Profile | None = None
        self.done = 0

    def _step(self, total: int) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, total)

    def measure(self, n: int, inputs: Any = None) -> _Point:
        """Profile at length ``n`` (``inputs``: ``make_inputs(n)`` if already made)."""
        args, kwargs = split_inputs(self.make_inputs(n) if inputs is None else inputs)
        prof = profile_with_plan(self.model, args, {**kwargs, **self.forward_kwargs}, self.plan,
                                 self.roles,
                                 stacklevel=5)
        if self.template is None or not reuse_roles(prof, self.template):
            self.template = prof
        again = prof.by_role(phase=RECOMPUTE) if self.plan.backward else {}
        roles = {role: macs - again.get(role, 0) for role, macs in prof.by_role().items()}
        return _Point(roles, {role: macs for role, macs in again.items() if macs},
                      _predictions(prof.reconcile(self.spec(n) if self.spec else None)), prof)

    def sampled(self, lengths: tuple[int, ...]) -> Scaling:
        """A profile at each length; per role, the exact polynomial through the counts,
        checked at the rest."""
        points = []
        for n in lengths:
            points.append(self.measure(n))
            self._step(len(lengths))
        return _scaling(lengths, [{r: p.roles.get(r, 0) for r in _union(p.roles for p in points)} for p in points],
                        [{r: p.recomputed.get(r, 0) for r in _union(p.recomputed for p in points)} for p in points],
                        [p.predicted for p in points])

    def symbolic(self, lengths: tuple[int, ...]) -> Scaling:
        """One symbolic trace, checked against profiles at the shortest and the longest
        length."""
        if self.mode == "real":
            raise SymbolicError("a symbolic trace runs on fake tensors, and mode='real' was asked "
                                "for")
        ends = (lengths[0], lengths[-1])
        inputs = [self.make_inputs(n) for n in ends]
        traced = trace(self.model, (split_inputs(inputs[0]), split_inputs(inputs[1])), ends,
                       self.plan, self.roles, self.forward_kwargs)
        self._step(3)
        self._check_guards(traced, lengths)
        checks = []
        for n, made in zip(ends, inputs, strict=True):
            checks.append(self.measure(n, made))
            self._step(3)
        roles, recomputed = traced.role_counts(checks[-1].profile)
        # again: a guard added by flopscope's own code counts too
        self._check_guards(traced, lengths)
        predicted = [_predictions(traced.reconcile_at(n, self.spec(n) if self.spec else None)) for n in lengths]
        for (n, point), guesses in zip(zip(ends, checks, strict=True),
                                       (predicted[0], predicted[-1]), strict=True):
            for label, counts, measured in (("MACs", roles, point.roles), ("recomputed MACs", recomputed,
                                                                          point.recomputed)):
                for role in _union((counts, measured)):
                    expected = traced.at(counts.get(role, 0), n)
                    if expected != measured.get(role, 0):
                        raise SymbolicError(f"the symbolic {label} of {role}, "
                                            f"{traced.text(counts.get(role, 0))}, are {expected:,} "
                                            f"at n = {n}; a profile there counts "
                                            f"{measured.get(role, 0):,}")
            if guesses != point.predicted:
                raise SymbolicError(f"the predictions of the symbolic trace at n = {n} ({guesses}) "
                                    f"differ from those of a profile there ({point.predicted})")
        for label, counts in (("MACs", roles), ("recomputed MACs", recomputed)):
            for role, macs in counts.items():
                if traced.coefficients(macs) is None:
                    raise SymbolicError(f"the {label} of {role}, {traced.text(macs)}, are not a "
                                        "polynomial in n")
        result = _scaling(lengths, [{r: traced.at(m, n) for r, m in roles.items()} for n in lengths],
                          [{r: traced.at(m, n) for r, m in recomputed.items()} for n in lengths],
                          predicted)
        exact = {role: Polynomial(traced.coefficients(macs) or ()) for role, macs in roles.items()}
        # interpolation agrees
        if any(result.polynomials[role] not in (None, exact[role]) for role in exact):
            raise SymbolicError("the symbolic polynomials differ from the interpolation of their "
                                "own values")
        return replace(result, polynomials={role: exact[role] for role in result.polynomials},
                       recomputed={role: Polynomial(traced.coefficients(recomputed[role]) or ())
                                   for role in result.recomputed},
                       method="symbolic", conditions=traced.conditions())


    def _check_guards(self, traced: SymbolicTrace, lengths: tuple[int, ...]) -> None:
        why = traced.specialisation(lengths)
        if why is not None:
            limits = symbolic_limit_reason()
            torch_note = f" (on {limits}: a newer PyTorch keeps n a symbol)" if limits else ""
            raise SymbolicError(f"{type(self.model).__name__} specialises on n: {why}{torch_note}")


def _predictions(reconciliation: Reconciliation) -> dict[str, int | None]:
    """``{role: predicted MACs}`` summed over blocks (``None`` where a row has no
    prediction)."""
    guesses: dict[str, int | None] = {}
    for row in reconciliation.rows:
        known = guesses.get(row.role, 0)
        guesses[row.role] = None if row.predicted is None or known is None else known + row.predicted
    return guesses


def _union(dicts: Iterable[Mapping[str, Any]]) -> list[str]:
    return list(dict.fromkeys(key for d in dicts for key in d))


def _scaling(lengths: tuple[int, ...], measured: Sequence[Mapping[str, int]],
             recomputed: Sequence[Mapping[str, int]],
             predicted: Sequence[Mapping[str, int | None]]) -> Scaling:
    """The :class:`Scaling` of per-length counts (each a ``{role: MACs}``, one per
    length)."""
    def column(rows: Sequence[Mapping[str, Any]], role: str) -> list[Any]:
        return [row.get(role, 0) for row in rows]

    polynomials = {role: interpolate(lengths, column(measured, role)) for role in _union(measured)}
    predictions = {}
    for role in _union(predicted):
        values = column(predicted, role)
        predictions[role] = None if any(v is None for v in values) else interpolate(lengths, values)
    order = [r for r in ROLE_ORDER if r in polynomials]
    return Scaling(lengths, {r: tuple(column(measured, r)) for r in order},
                   {r: polynomials[r] for r in order},
                   {r: predictions[r] for r in order if r in predictions},
                   {r: interpolate(lengths, column(recomputed, r)) for r in ROLE_ORDER if r in _union(recomputed)})

