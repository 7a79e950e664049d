"""Exact scaling of a diffusion pipeline in resolution: each component's MACs per role
as a polynomial in the pixels of one frame, P = height x width, with exact rational
coefficients.

A denoiser's image tokens grow as P (``(H / 8 / p) x (W / 8 / p)`` after the VAE's 8x
compression and a patch of p), so its projections and FFN are linear in P and its
self-attention core quadratic (joint attention with m text tokens: ``(P / 64p² + m)²``,
every power of P); a VAE decoder's convolutions are linear in P and its mid-block
attention quadratic; text encoders do not depend on P. :func:`resolution_scaling`
profiles the pipeline call at each size (:func:`flopscope.profile_pipeline`, on fake
tensors by default), finds each role's lowest-degree polynomial through the measured
counts by exact interpolation and checks it at every remaining size (so at least one
more size than the degree needs: four sizes for a quadratic), as
:func:`flopscope.scaling` does in n. Each polynomial is set beside the one the blocks'
closed forms give at the same sizes (:meth:`Profile.reconcile`), where they cover the
whole role.

Keep the aspect ratio or not: the polynomials are in P alone only where every term
depends on H and W through H x W, which holds for patch tokens and convolutions but not,
say, for an axial or 1-D positional term in H or W alone; a role that is not a
polynomial in P at the sizes given is reported as such (``None``), never fitted. Units:
MACs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from ..attribute.roles import RoleRule
from ..capture.checks import check_positive
from ..errors import ConfigurationError
from ..formulas.registry import FormulaRegistry
from ..predict.polynomial import Polynomial, Scaling, interpolate
from .pipeline import component_of, profile_pipeline
from .scaling import MIN_LENGTHS

VARIABLE = "P"
"""The variable of the polynomials: pixels of one frame (height x width)."""


@dataclass(frozen=True)
class ResolutionScaling:
    """Per component, a :class:`~flopscope.predict.polynomial.Scaling` whose lengths are
    pixel counts (P = height x width, in :attr:`sizes` order) and whose polynomials
    are in P."""

    sizes: tuple[tuple[int, int], ...]  # (height, width) of each call, by increasing pixels
    components: dict[str, Scaling]

    def total(self) -> Polynomial | None:
        """The whole call's MACs in P (``None`` if a role of a component is not a
        polynomial at these sizes)."""
        out = Polynomial((Fraction(0),))
        for scaling in self.components.values():
            total = scaling.total()
            if total is None:
                return None
            out = out + total
        return out

    def to_table(self, tablefmt: str = "simple") -> str:
        sizes = ", ".join(f"{h}x{w}" for h, w in self.sizes)
        parts = ["MACs per role as exact polynomials in P = height x width (pixels), from calls "
                 f"at {sizes}"]
        for name, scaling in self.components.items():
            parts += ["", f"{name}:", scaling.to_table(tablefmt)]
        total = self.total()
        parts += ["", "whole call: "
                      f"{total.text(VARIABLE) if total is not None else 'not a polynomial at these sizes'}"]
        return "\n".join(parts)


def resolution_scaling(pipe: Any, sizes: Sequence[int | tuple[int, int]], *, mode: str = "fake",
                       reuse: bool = True,
                       registry: FormulaRegistry | None = None, roles: Sequence[RoleRule] = (),
                       **call_kwargs: Any) -> ResolutionScaling:
    """Profile ``pipe(height=h, width=w, **call_kwargs)`` at each size and recover each
    component's roles as exact polynomials in P = h x w (see the module docstring).

    Args:
        pipe: a diffusers pipeline (as :func:`flopscope.profile_pipeline`).
        sizes: square sides (``[256, 512, 768, 1024]``) or ``(height, width)`` pairs, at
            least four distinct pixel counts (a quadratic is found from three and
            checked at the fourth).
        mode, reuse, registry, roles: as :func:`flopscope.profile_pipeline`.
        call_kwargs: the call's other arguments (steps, guidance, prompt or embeddings,
            frames), the same at every size; not ``height`` or ``width``.
    """
    if "height" in call_kwargs or "width" in call_kwargs:
        raise ConfigurationError("resolution_scaling sets height and width from sizes: do not pass "
                                 "them")
    pairs = sorted({(s, s) if isinstance(s, int) else (int(s[0]), int(s[1])) for s in sizes},
                   key=lambda hw: (hw[0] * hw[1], hw))
    for height, width in pairs:
        check_positive(height=height, width=width)
    pixels = [h * w for h, w in pairs]
    if len(set(pixels)) != len(pixels) or len(pixels) < MIN_LENGTHS:
        raise ConfigurationError(f"resolution_scaling needs at least {MIN_LENGTHS} sizes of "
                                 "distinct pixel counts (a quadratic takes 3 and is checked at "
                                 f"one more); got {', '.join(map(str, pixels))}")
    measured: dict[str, list[Counter[str]]] = {}
    predicted: dict[str, list[dict[str, int | None]]] = {}
    for height, width in pairs:
        prof = profile_pipeline(pipe, mode=mode, reuse=reuse, registry=registry, roles=roles,
                                height=height,
                                width=width, **call_kwargs)
        by_role = prof.by_component_role()
        rows = prof.reconcile().rows
        for name in prof.components:
            measured.setdefault(name, []).append(Counter(by_role.get(name, {})))
            predicted.setdefault(name, []).append(_predicted(name, by_role.get(name, {}), rows))
    components = {}
    for name, counts in measured.items():
        role_names = [r for r in dict.fromkeys(role for c in counts for role in c)]
        if not role_names:
            continue
        columns = {role: tuple(c[role] for c in counts) for role in role_names}
        forms = {role: [p.get(role) for p in predicted[name]] for role in role_names}
        components[name] = Scaling(
            tuple(pixels), columns,
            {role: interpolate(pixels, list(v)) for role, v in columns.items()},
            {role: _through(pixels, values) for role, values in forms.items()}, variable=VARIABLE)
    return ResolutionScaling(tuple(pairs), components)


def _through(pixels: list[int], values: Sequence[int | None]) -> Polynomial | None:
    """The polynomial through the closed forms' values (``None`` where a size had none)."""
    known = [v for v in values if v is not None]
    return interpolate(pixels, known) if len(known) == len(values) else None


def _predicted(component: str, roles: dict[str, int], rows: Sequence[Any]) -> dict[str, int | None]:
    """Per role of ``component``: the sum of its closed-form rows' predictions, where
    those rows cover the role's measured MACs and each has a prediction; else
    ``None``."""
    mine = [r for r in rows if component_of(r.block) == component]
    out: dict[str, int | None] = {}
    for role, macs in roles.items():
        of_role = [r for r in mine if r.role == role]
        covered = sum(r.measured for r in of_role)
        out[role] = (sum(r.predicted for r in of_role)
                     if of_role and covered == macs and all(r.predicted is not None for r in of_role) else None)
    return out
