"""Exact polynomials in the sequence length n, and :class:`Scaling`, a model's counts
per role as polynomials.

Pure arithmetic on integers (exact rationals, never floats): :func:`interpolate` finds
the lowest-degree polynomial through measured counts and checks it at every remaining
point. :func:`flopscope.scaling` (the sweep that profiles a model at several lengths)
and :meth:`Profile.decode_scaling` (a generation's decode steps) build a
:class:`Scaling` from it. Units: MACs.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from tabulate import tabulate

from ..errors import ConfigurationError
from ..role import ATTENTION_CORE, PER_TOKEN


@dataclass(frozen=True)
class Polynomial:
    """``c[0] + c[1]·n + c[2]·n² + ...`` with exact rational coefficients (MACs)."""

    coefficients: tuple[Fraction, ...]

    @property
    def degree(self) -> int:
        nonzero = [i for i, c in enumerate(self.coefficients) if c != 0]
        return nonzero[-1] if nonzero else 0

    def __call__(self, n: int | Fraction) -> Fraction:
        return sum((c * Fraction(n) ** i for i, c in enumerate(self.coefficients)), Fraction(0))

    def coefficient(self, power: int) -> Fraction:
        return self.coefficients[power] if power < len(self.coefficients) else Fraction(0)

    def __add__(self, other: Polynomial) -> Polynomial:
        size = max(len(self.coefficients), len(other.coefficients))
        return Polynomial(tuple(self.coefficient(i) + other.coefficient(i) for i in range(size)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Polynomial):
            return NotImplemented
        size = max(len(self.coefficients), len(other.coefficients))
        return all(self.coefficient(i) == other.coefficient(i) for i in range(size))

    def __hash__(self) -> int:
        return hash(tuple(self.coefficient(i) for i in range(self.degree + 1)))

    def __str__(self) -> str:
        return self.text()

    def sum_over(self, first: int, last: int) -> Fraction:
        """``p(first) + p(first + 1) + ... + p(last)`` in closed form (Faulhaber's sums of
        powers), 0 for an empty range; sizes, so ``first >= 0``: the cost of any number of
        steps in one step's arithmetic."""
        if last < first:
            return Fraction(0)
        if first < 0:
            raise ConfigurationError(f"a sum over sizes starts at 0 or above, not {first}")
        return sum((c * (_power_sum(i, last) - _power_sum(i, first - 1))
                    for i, c in enumerate(self.coefficients) if c), Fraction(0))

    def text(self, variable: str = "n") -> str:
        """``"2,048·n² + 1,048,576·n"``, in ``variable`` (``"c"`` for a context length)."""
        terms = []
        for power in range(len(self.coefficients) - 1, -1, -1):
            c = self.coefficients[power]
            if c == 0:
                continue
            number = f"{c.numerator:,}" if c.denominator == 1 else f"({c})"
            terms.append(number + ("" if power == 0 else f"·{variable}" if power == 1 else
                                   f"·{variable}{_superscript(power)}"))
        return " + ".join(terms).replace("+ -", "- ") if terms else "0"


@dataclass(frozen=True)
class Polynomial2:
    """``sum(c[i, j] · t^i · u^j)`` in two variables with exact rational coefficients
    (MACs of a step in its new tokens ``t`` and its cached context ``u``)."""

    coefficients: Mapping[tuple[int, int], Fraction]  # (power of t, power of u) -> coefficient

    def __call__(self, t: int, u: int) -> Fraction:
        return sum((c * Fraction(t) ** i * Fraction(u) ** j for (i, j), c in self.coefficients.items()), Fraction(0))

    def terms(self) -> list[tuple[int, int, Fraction]]:
        """``(power of t, power of u, coefficient)``, highest total degree first, zeros left out."""
        return sorted(((i, j, c) for (i, j), c in self.coefficients.items() if c),
                      key=lambda term: (-(term[0] + term[1]), -term[0]))

    def text(self, variables: tuple[str, str] = ("t", "c")) -> str:
        """``"2,048·t·c + 1,024·t² + ..."``."""
        out = []
        for i, j, c in self.terms():
            number = f"{c.numerator:,}" if c.denominator == 1 else f"({c})"
            factors = [f"{name}{_superscript(power) if power > 1 else ''}"
                       for name, power in zip(variables, (i, j), strict=True) if power]
            out.append("·".join([number, *factors]) if factors else number)
        return " + ".join(out).replace("+ -", "- ") if out else "0"


def _power_sum(power: int, n: int) -> Fraction:
    """``sum(x**power for x in range(n + 1))`` for ``n >= -1`` (0 for ``n = -1``), from
    Faulhaber's formula in exact arithmetic."""
    if n < 0:
        return Fraction(0)
    total = Fraction(0)
    for j, b in enumerate(_bernoulli(power)):  # B_j with B_1 = +1/2
        total += Fraction(math.comb(power + 1, j)) * b * Fraction(n) ** (power + 1 - j)
    return total / (power + 1) + (1 if power == 0 else 0)  # (x = 0 counts once for power 0)


@functools.cache
def _bernoulli(power: int) -> tuple[Fraction, ...]:
    """Bernoulli numbers B_0 .. B_power, with B_1 = +1/2 (the convention of the sum from 1 to n)."""
    numbers: list[Fraction] = []
    for m in range(power + 1):
        b = Fraction(1) - sum((Fraction(math.comb(m, k)) * numbers[k] / (m - k + 1) for k in range(m)), Fraction(0))
        numbers.append(b)
    return tuple(numbers)


def _superscript(power: int) -> str:
    return str(power).translate(str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹"))


def interpolate(xs: Sequence[int], ys: Sequence[int | Fraction]) -> Polynomial | None:
    """The lowest-degree polynomial through every point, checked at each point beyond
    the degree it needs; ``None`` if no polynomial of degree <= len(xs) - 2 passes
    through all of them."""
    if len(xs) != len(ys) or len(set(xs)) != len(xs) or len(xs) < 2:
        raise ConfigurationError("interpolation needs at least two distinct lengths, one count each")
    for degree in range(len(xs) - 1):
        poly = _through(xs[: degree + 1], ys[: degree + 1])
        if all(poly(x) == y for x, y in zip(xs, ys, strict=True)):
            return poly
    return None


def _through(xs: Sequence[int], ys: Sequence[int | Fraction]) -> Polynomial:
    """Newton's divided differences in exact arithmetic, expanded to monomial coefficients."""
    size = len(xs)
    table = [Fraction(y) for y in ys]
    newton = [table[0]]
    for level in range(1, size):
        table = [(table[i + 1] - table[i]) / (xs[i + level] - xs[i]) for i in range(size - level)]
        newton.append(table[0])
    coefficients = [Fraction(0)] * size
    basis = [Fraction(1)]  # prod (n - x_j) so far, as monomial coefficients
    for level, a in enumerate(newton):
        for i, b in enumerate(basis):
            coefficients[i] += a * b
        shifted = [Fraction(0), *basis]
        basis = [shifted[i] - xs[level] * (basis[i] if i < len(basis) else 0) for i in range(len(shifted))]
    return Polynomial(tuple(coefficients))


@dataclass(frozen=True)
class Scaling:
    """Per-role counts at each length, their exact polynomials, and the predicted ones."""

    lengths: tuple[int, ...]
    measured: Mapping[str, tuple[int, ...]]  # role -> MACs at each length
    # role -> exact polynomial (None: not a polynomial here)
    polynomials: Mapping[str, Polynomial | None]
    predicted: Mapping[str, Polynomial | None]  # role -> polynomial of the closed-form predictions
    recomputed: Mapping[str, Polynomial | None] = field(default_factory=dict)
    """role -> MACs that activation checkpointing recomputes in the backward pass (hardware work; kept out of
    ``measured`` and ``polynomials``, which are the model's work: forward, and backward when asked)"""
    method: str = "sampled"
    """``"sampled"`` (a profile at each length, interpolated) or ``"symbolic"`` (one symbolic trace; then
    ``measured`` holds its values at each length, of which the shortest and longest were profiled and agree)"""
    fallback: str | None = None
    """``scaling(method="auto")`` that sampled: why the symbolic trace was not used (the guard that specialised
    on n and where it was added, or what else stopped it)"""
    conditions: tuple[str, ...] = ()
    """symbolic: the guards in n the polynomials rest on (each true at every length), e.g. ``"n <= 4096"``"""
    variable: str = "n"
    """The name of the variable in tables (``"P"``: pixels of a frame, :mod:`flopscope.resolution`)"""

    def matches(self, role: str) -> bool:
        """The measured polynomial equals the predicted one, coefficient by coefficient."""
        measured, predicted = self.polynomials.get(role), self.predicted.get(role)
        return measured is not None and predicted is not None and measured == predicted

    def attention(self) -> Polynomial:
        """Scores + weighted sum."""
        return _sum(self.polynomials, ATTENTION_CORE)

    def per_token(self) -> Polynomial:
        """Projections + FFN."""
        return _sum(self.polynomials, PER_TOKEN)

    def total(self) -> Polynomial | None:
        """Every role together (``None`` if a role is not a polynomial at these lengths)."""
        if any(poly is None for poly in self.polynomials.values()):
            return None
        return _sum(self.polynomials, tuple(self.polynomials))

    def crossover(self) -> int | None:
        """The smallest length at which attention (scores + weighted sum) costs more
        than projections + FFN, found exactly (``None`` if it never does)."""
        difference = self.attention() + Polynomial(tuple(-c for c in self.per_token().coefficients))
        if difference.degree == 0:
            return None
        n, step = 1, 1
        while difference(n) <= 0:  # exponential search, then bisection: exact on integers
            n, step = n + step, step * 2
            if n > 10**12:
                return None
        low = max(1, n - step // 2)
        while low < n:
            mid = (low + n) // 2
            if difference(mid) > 0:
                n = mid
            else:
                low = mid + 1
        return n

    def attention_share(self, n: int) -> Fraction:
        """Attention's share of the total at length n (exact)."""
        total = sum((p for p in self.polynomials.values() if p is not None), Polynomial((Fraction(0),)))
        value = total(n)
        return self.attention()(n) / value if value else Fraction(0)

    def to_table(self, tablefmt: str = "simple") -> str:
        rows, x = [], self.variable
        for role, poly in self.polynomials.items():
            predicted = self.predicted.get(role)
            rows.append([role, poly.text(x) if poly is not None else
                         f"not a polynomial of degree <= {len(self.lengths) - 2} at these lengths",
                         predicted.text(x) if predicted is not None else "-",
                         "yes" if self.matches(role) else ("-" if predicted is None else "NO")])
        text = tabulate(rows, headers=["role", f"measured MACs({x})", f"predicted MACs({x})", "match"],
                        tablefmt=tablefmt)
        crossover = self.crossover()
        shares = ", ".join(f"{x}={n}: {float(self.attention_share(n)):.1%}" for n in self.lengths)
        lines = [text, "", f"attention share (scores + weighted sum): {shares}"]
        lines.append("attention never overtakes projections + FFN" if crossover is None else
                     f"attention (scores + weighted sum) overtakes projections + FFN from {x} = {crossover:,}")
        return "\n".join(lines)


def _sum(polys: Mapping[str, Polynomial | None], roles: Sequence[str]) -> Polynomial:
    out = Polynomial((Fraction(0),))
    for role in roles:
        poly = polys.get(role)
        if poly is not None:
            out = out + poly
    return out
