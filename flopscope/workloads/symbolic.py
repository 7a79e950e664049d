"""One counted run with a symbolic size: every op's MACs as an exact expression in one
variable.

The model runs once on fake tensors whose mode has a ``ShapeEnv`` (PyTorch's symbolic
shapes, as ``torch.export`` uses them): the dims of the inputs that are the variable (a
sequence length n, or a batch size) are one symbol, so shapes are ``torch.SymInt`` s and
each formula, a pure function of shapes, returns a polynomial in that symbol instead of
a number. :func:`trace` makes the run; :class:`SymbolicTrace` reads it: exact
coefficients (:class:`~fractions.Fraction`), the value at a length, and whether the
model *specialised*: every Python decision on a symbolic size (``if x.shape[1] > 64``,
``int(size)``, a data-dependent op) is a *guard* recorded by the ``ShapeEnv``, true at
the traced length; the trace stands for another length only if every guard holds there
too (:meth:`SymbolicTrace.specialisation` names the first that does not, and where it
was added). Units: MACs, as everywhere (``docs/conventions.md``).

Which dims are the variable is read from the inputs at two lengths: a dim whose size is
the length at both is the symbol; every other size must be the same at both (else
:class:`~flopscope.errors.SymbolicError`).
"""

from __future__ import annotations

import functools
import logging
import math
import traceback
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from ..api import profile_with_plan
from ..attribute.roles import Assignment, RoleRule
from ..capture import CapturePlan
from ..capture.fake import CountingFakeTensorMode, FakeConverter
from ..capture.records import RECOMPUTE, CapturedOp
from ..errors import RunError, SymbolicError
from ..predict.exact_sum import Count
from ..predict.polynomial import Polynomial
from ..predict.reconcile import Reconciliation, TransformerSpec, reconcile
from ..profile import Profile, reuse_roles

if TYPE_CHECKING:
    import sympy
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

# sympy and torch's symbolic shapes (with dynamo) take most of a second to import: the functions below import them
# when a symbolic trace is asked for, so that `import flopscope` (which imports this module) does not pay for them.


class _SymbolicConverter(FakeConverter):
    """The fake converter of a symbolic run: the model's state static, as always; the
    inputs (meta stand-ins, so no index values are known: sizes are symbols) as fake
    tensors whose variable dims are the symbol."""

    def __init__(self, mode: CountingFakeTensorMode, inputs: Mapping[int, torch.Tensor]) -> None:
        super().__init__(mode)
        self._inputs = inputs

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        fake = self._inputs.get(id(t))
        return fake if fake is not None else super().__call__(t)


@dataclass(frozen=True)
class SymbolicTrace:
    """A profile counted with one symbolic size, the variable (``symbol``, traced at
    ``hint``)."""

    profile: Profile
    shape_env: ShapeEnv
    symbol: sympy.Symbol
    hint: int

    def expression(self, count: Count) -> sympy.Expr:
        """``count`` as a sympy expression in :attr:`symbol`."""
        import sympy  # (lazy: see the imports above)

        # a constant SymInt's is an int
        return sympy.sympify(count if isinstance(count, int) else count.node.expr)

    def coefficients(self, count: Count) -> tuple[Fraction, ...] | None:
        """The exact coefficients of ``count`` as a polynomial in the variable, constant
        first; ``None`` if it is not one (a floor division, say, as a strided
        convolution's output length)."""
        import sympy  # (lazy: see the imports above)
        from torch.utils._sympy.functions import FloorDiv

        expr = sympy.expand(self.expression(count).replace(FloorDiv, self._exact_quotient))
        if not expr.free_symbols <= {self.symbol} or not expr.is_polynomial(self.symbol):
            return None
        coefficients = sympy.Poly(expr, self.symbol).all_coeffs()[::-1] if expr.free_symbols else [expr]
        return tuple(Fraction(int(c.p), int(c.q)) for c in coefficients)

    def _exact_quotient(self, a: sympy.Expr, b: sympy.Expr) -> sympy.Expr:
        """``a // b`` as the polynomial ``a / b`` where that has integer coefficients
        (then the division is exact at every n: ``n²·k // n`` of a role's share is
        ``n·k``); else left a floor division."""
        import sympy  # (lazy: see the imports above)
        from torch.utils._sympy.functions import FloorDiv

        quotient = sympy.cancel(a / b)
        if quotient.is_polynomial(self.symbol) and all(
                c.is_Integer for c in sympy.Poly(quotient, self.symbol).all_coeffs()):
            return quotient
        return FloorDiv(a, b)

    def at(self, count: Count, n: int) -> int:
        """The value of ``count`` (or of any size the trace made) at length ``n``."""
        import sympy  # (lazy: see the imports above)

        value = self.expression(count).xreplace({self.symbol: sympy.Integer(n)})
        if not value.is_Integer:
            raise SymbolicError(f"{self.text(count)} is not an integer at n = {n}")
        return int(value)

    def text(self, count: Count | sympy.Basic) -> str:
        """``count`` (or a guard) written in ``n``."""
        import sympy  # (lazy: see the imports above)

        expr = count if isinstance(count, sympy.Basic) else self.expression(count)
        return str(expr.xreplace({self.symbol: sympy.Symbol("n", integer=True, positive=True)}))

    def specialisation(self, lengths: Sequence[int]) -> str | None:
        """The first guard (or bound on the symbol) that is false at one of ``lengths``,
        with the length and where the guard was added; ``None`` if the trace stands
        for every one of them."""
        import sympy  # (lazy: see the imports above)

        for guard in self.shape_env.guards:
            for n in lengths:
                if guard.expr.xreplace({self.symbol: sympy.Integer(n)}) is not sympy.true:
                    return f"guard {self.text(guard.expr)} (added at {_where(guard.sloc)}) is false at n = {n}"
        # sizes 0 and 1 are never symbols: n >= 2
        bounds = self.shape_env.var_to_range.get(self.symbol)
        for n in lengths:
            if bounds is not None and not bounds.lower <= n <= bounds.upper:
                why = " (PyTorch's symbolic shapes treat sizes 0 and 1 as constants)" if n < 2 else ""
                return f"the trace holds for {bounds.lower} <= n <= {bounds.upper}, not at n = {n}{why}"
        return None

    def holds(self, lengths: Sequence[int]) -> list[bool]:
        """For each length, whether the trace stands for it: every guard (and the bounds of
        the symbol) true there. Guards are compiled once and evaluated on all lengths
        together; a guard on another symbol (a data-dependent size) holds only at the
        traced length."""
        import numpy as np

        values = np.asarray(lengths, dtype=np.int64)
        ok = np.ones(len(values), dtype=bool)
        bounds = self.shape_env.var_to_range.get(self.symbol)
        if bounds is not None:
            ok &= np.array([bounds.lower <= int(n) <= bounds.upper for n in values], dtype=bool)
        for guard in dict.fromkeys(g.expr for g in self.shape_env.guards):
            if not guard.free_symbols <= {self.symbol}:
                ok &= values == self.hint
                continue
            test = _compiled(guard, self.symbol)
            try:
                result = np.broadcast_to(np.asarray(test(values), dtype=bool), values.shape)
            except (TypeError, ValueError):  # ``and``, ``max`` of arrays: one length at a time
                result = np.array([bool(test(int(n))) for n in values], dtype=bool)
            ok &= result
        return ok.tolist()

    def function(self, count: Count) -> SizeFunction:
        """``count`` as an exact function of the symbol: its polynomial where it is one,
        else its expression, evaluated length by length."""
        coefficients = self.coefficients(count)
        text = self.text(count)
        if coefficients is not None:
            return SizeFunction(text, Polynomial(coefficients), None)
        return SizeFunction(text, None, _compiled(self.expression(count), self.symbol))

    def conditions(self) -> tuple[str, ...]:
        """The guards in n that the model's polynomials depend on (each true at every
        checked length)."""
        return tuple(dict.fromkeys(self.text(g.expr) for g in self.shape_env.guards))

    def role_counts(self, template: Profile) -> tuple[dict[str, Count], dict[str, Count]]:
        """``({role: MACs}, {role: recomputed MACs})``. The roles are ``template``'s, a
        profile of the same model at a length, where both ran the same ops in the
        same order (:func:`flopscope.profile.reuse_roles`: cheap); else they are
        found on the symbolic graph itself (role passes compare sizes only where both
        are known)."""
        with quiet_symbolic_graph():
            try:
                reuse_roles(self.profile, template)
                # SymInts where they vary
                again: dict[str, Count] = dict(self.profile.by_role(phase=RECOMPUTE))
                roles: dict[str, Count] = {role: macs - again.get(role, 0)
                                           for role, macs in self.profile.by_role().items()}
            except TypeError as error:  # a role pass that needs a plain size (hashing one, say)
                raise SymbolicError(f"roles could not be found on symbolic shapes: {error}") from error
        return roles, {role: macs for role, macs in again.items() if not _is_zero(macs)}

    def reconcile_at(self, n: int, spec: TransformerSpec | None) -> Reconciliation:
        """The closed-form predictions (:func:`flopscope.predict.reconcile.reconcile`)
        at length ``n``: every symbolic count and module input shape of the trace
        evaluated there (roles set by :meth:`role_counts`)."""
        with quiet_symbolic_graph():
            assignments: dict[CapturedOp, Assignment] = {
                op: Assignment({role: self.at(macs, n) for role, macs in a.parts.items()}, a.block, a.factor)
                for op, a in self.profile.role_assignments_by_op().items()}
        inputs = {call: tuple((key, tuple(self.at(d, n) for d in shape)) for key, shape in shapes)
                  for call, shapes in self.profile.module_inputs().items()}
        return reconcile(assignments, self.profile.facts, inputs, spec)


def trace(model: nn.Module, inputs: tuple[Any, Any], lengths: tuple[int, int], plan: CapturePlan,
          roles: Sequence[RoleRule], forward_kwargs: dict[str, Any]) -> SymbolicTrace:
    """Count ``model`` once with the variable symbolic. ``inputs``: the ``(args,
    kwargs)`` of the model at the two ``lengths`` (a dim whose size is the length at
    both becomes the symbol); traced at the second length. Raises
    :class:`SymbolicError` where the inputs do not vary with the length as dims equal
    to it. ``plan``: the sweep's, run on fake tensors with the symbolic converter;
    ``roles``: the role rules of the profile."""
    from torch._dynamo.source import ConstantSource  # (lazy: see the imports above)
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

    (first, second), (low, high) = inputs, lengths
    shape_env = ShapeEnv()
    mode = CountingFakeTensorMode(allow_non_fake_inputs=True, shape_env=shape_env, static_shapes=True)
    symbol = shape_env.create_symbol(high, source=ConstantSource("n"), dynamic_dim=DimDynamic.DYNAMIC)
    n = shape_env.create_symintnode(symbol, hint=high)
    stand_ins: dict[int, torch.Tensor] = {}

    def stand_in(t: torch.Tensor, other: torch.Tensor, where: str) -> torch.Tensor:
        shape: list[Count] = list(t.shape)
        if t.dim() != other.dim():
            raise SymbolicError(f"{where} has {other.dim()} dims at n = {low} and {t.dim()} at n = {high}")
        for i, (a, b) in enumerate(zip(other.shape, t.shape, strict=True)):
            if (a, b) == (low, high):
                shape[i] = n
            elif a != b:
                raise SymbolicError(f"dim {i} of {where} is {a} at n = {low} and {b} at n = {high}: it varies "
                                    "with n but is not n")
        meta = torch.empty_like(t, device="meta").requires_grad_(t.requires_grad)
        with mode:
            stand_ins[id(meta)] = torch.empty(shape, dtype=t.dtype, device="cpu" if t.is_meta else t.device
                                              ).requires_grad_(t.requires_grad)
        return meta

    leaves, spec = pytree.tree_flatten_with_path(second)
    others, other_spec = pytree.tree_flatten(first)
    if spec != other_spec:
        raise SymbolicError(f"the inputs at n = {low} and n = {high} are not of one structure")
    converted = []
    for (path, leaf), other in zip(leaves, others, strict=True):
        # [0]: the first positional input; [1]['mask']: a keyword
        where = f"input {pytree.keystr(path)}"
        if isinstance(leaf, torch.Tensor) and isinstance(other, torch.Tensor):
            converted.append(stand_in(leaf, other, where))
        elif _same(leaf, other):
            converted.append(leaf)
        else:
            raise SymbolicError(f"{where} is {other!r} at n = {low} and {leaf!r} at n = {high}: only tensor sizes "
                                "equal to n can be symbolic")
    args, kwargs = pytree.tree_unflatten(converted, spec)
    try:
        plan = replace(plan, mode="fake", converter=_SymbolicConverter(mode, stand_ins))
        profile = profile_with_plan(model, args, {**kwargs, **forward_kwargs}, plan, roles, stacklevel=5)
    except RunError as error:
        raise SymbolicError(f"{type(model).__name__} did not run with a symbolic n: {error}") from error
    return SymbolicTrace(profile, shape_env, symbol, high)


@dataclass(frozen=True)
class SizeFunction:
    """An exact count (MACs, bytes, a size) as a function of one symbolic size: a
    :class:`~flopscope.predict.polynomial.Polynomial` where it is one (summed over a range
    in closed form), else its expression compiled to Python (a floor division, a
    ``max``), evaluated size by size."""

    text: str  # in n
    polynomial: Polynomial | None
    evaluate: Callable[[int], Any] | None

    @classmethod
    def constant(cls, value: int) -> SizeFunction:
        return cls(f"{value}", Polynomial((Fraction(value),)), None)

    def at(self, n: int) -> int:
        if self.polynomial is None:
            value = self.evaluate(n)  # type: ignore[misc]
            if int(value) != value:
                raise SymbolicError(f"{self.text} is not an integer at n = {n}")
            return int(value)
        numerators, denominator = self._integers
        total = 0
        for a in reversed(numerators):  # Horner's rule on integers: fast enough for every step of a long run
            total = total * n + a
        if total % denominator:
            raise SymbolicError(f"{self.text} is not an integer at n = {n}")
        return total // denominator

    @functools.cached_property
    def _integers(self) -> tuple[tuple[int, ...], int]:
        """The polynomial's coefficients times their common denominator, and that
        denominator."""
        if self.polynomial is None:
            raise SymbolicError(f"{self.text} is not a polynomial")
        denominator = math.lcm(*(c.denominator for c in self.polynomial.coefficients))
        return tuple(int(c * denominator) for c in self.polynomial.coefficients), denominator

    def sum_over(self, first: int, last: int) -> int:
        """``at(first) + ... + at(last)``."""
        if self.polynomial is not None:
            total = self.polynomial.sum_over(first, last)
            if total.denominator != 1:
                raise SymbolicError(f"the sum of {self.text} over {first}..{last} is not an integer")
            return int(total)
        return sum(self.at(n) for n in range(first, last + 1))


def _compiled(expr: sympy.Basic, symbol: sympy.Symbol) -> Callable[[Any], Any]:
    """``expr`` as a Python function of ``symbol`` (torch's printer: floor divisions as
    ``//``, ``Max`` as ``max``), for integers or numpy arrays of them."""
    function: Callable[[Any], Any] = eval(f"lambda {symbol}: {python_code(expr)}",
                                          {"math": math, "max": max, "min": min})
    return function


def python_code(expr: sympy.Basic, names: Mapping[sympy.Symbol, str] | None = None) -> str:
    """``expr`` as a Python expression (floor divisions ``//``, ``Max`` as ``max``,
    ``Mod`` as ``%``: torch's printer), its symbols renamed by ``names``."""
    import sympy
    from torch.utils._sympy.printers import PythonPrinter

    if names:
        expr = expr.xreplace({symbol: sympy.Symbol(name, integer=True) for symbol, name in names.items()})
    return str(PythonPrinter().doprint(expr))


@functools.cache
def symbolic_limits() -> dict[str, str | None]:
    """What keeps this PyTorch from running a transformer's ops with a symbolic size
    under a dispatch mode, by op (``None``: the op keeps the size a symbol), probed once
    on fake tensors: ``"linear"``, ``nn.Linear`` on ``[2, n, 16]`` (torch 2.8's meta
    kernel of its view refuses a symbolic size); ``"matmul"``, ``[2, 4, 1] @ [2, 1, n]``
    (the C++ ``matmul`` of torch before 2.13 reads a batched operand's sizes as
    integers, which makes ``n`` a constant: every attention specialises). Measured:
    2.6.0, 2.7.1, 2.8.0, 2.10.0, 2.11.0 and 2.12.0 make ``n`` a constant; 2.13.0 and
    2.14.1 keep both."""
    from torch._dynamo.source import ConstantSource  # (lazy: see the imports above)
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

    linear = nn.Linear(16, 16)
    probes: dict[str, tuple[str, Callable[[Any], Any]]] = {
        "linear": ("nn.Linear on [B, n, d] fails", lambda n: linear(torch.empty(2, n, 16))),
        "matmul": ("batched matmul makes n a constant", lambda n: torch.empty(2, 4, 1) @ torch.empty(2, 1, n)),
    }
    limits: dict[str, str | None] = {}
    for key, (what, run) in probes.items():
        shape_env = ShapeEnv()
        symbol = shape_env.create_symbol(8, source=ConstantSource("n"), dynamic_dim=DimDynamic.DYNAMIC)
        n = shape_env.create_symintnode(symbol, hint=8)
        fake_log = logging.getLogger("torch._subclasses.fake_tensor")  # logs a kernel's refusal
        level = fake_log.level
        fake_log.setLevel(logging.CRITICAL)
        try:
            with CountingFakeTensorMode(shape_env=shape_env, allow_non_fake_inputs=True):
                run(n)
            kept = symbol not in shape_env.replacements
        except RuntimeError:
            kept = False
        finally:
            fake_log.setLevel(level)
        limits[key] = None if kept else f"torch {torch.__version__}'s {what}"
    return limits


def symbolic_limit_reason() -> str:
    """What :func:`symbolic_limits` found, ``"; "``-joined (``""`` where nothing)."""
    return "; ".join(why for why in symbolic_limits().values() if why)


def symbolic_sizes_kept() -> bool:
    """Whether this PyTorch runs a transformer with symbolic sizes (:func:`symbolic_limits`
    finds nothing)."""
    return not symbolic_limit_reason()


def require_symbolic_sizes(what: str) -> None:
    """Raise :class:`SymbolicError` where this PyTorch cannot trace a transformer with
    symbolic sizes (:func:`symbolic_limits`), naming ``what`` needed them, why, and what
    counts instead."""
    limits = symbolic_limit_reason()
    if limits:
        raise SymbolicError(
            f"{what} traces the model once with symbolic sizes, and on {limits}: the trace would stand for "
            "one length only. PyTorch 2.13 and later keep them symbols; on this one, count step by step "
            "with flopscope.workloads.profile_generation or `flopscope generate` (the same numbers, one traced "
            "forward per step)")


_CONCRETE_ONLY = "expected to contain only concrete integers"
"""What a C++ kernel of PyTorch says when it is given a symbolic size."""


def trace_dispatched(model: nn.Module, inputs: tuple[Any, Any], lengths: tuple[int, int], plan: CapturePlan,
                     roles: Sequence[RoleRule]) -> SymbolicTrace:
    """:func:`trace`, again under PyTorch's Python dispatcher where a C++ kernel refused a
    symbolic size (a pad by a symbolic amount: a gated-DeltaNet layer padding its
    chunks): its kernels take symbolic sizes, as ``torch.export`` runs them. Only then,
    since it decomposes some ops otherwise (GPT-2's records differ under it)."""
    try:
        return trace(model, inputs, lengths, plan, roles, {})
    except SymbolicError as error:
        if _CONCRETE_ONLY not in str(error):
            raise
    return trace(model, inputs, lengths, replace(plan, driver=functools.partial(_dispatched, plan.driver)), roles,
                 {})


def _dispatched(driver: Callable[..., Any] | None, model: nn.Module, args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> Any:
    from torch._dispatch.python import enable_python_dispatcher

    with enable_python_dispatcher():
        return model(*args, **kwargs) if driver is None else driver(model, args, kwargs)


def _where(sloc: Any) -> str:
    """``"model.py:12 in forward"``: the frame that added a guard (a ``ShapeEnv``
    ``SLoc``)."""
    frame = sloc.framework_loc
    if isinstance(frame, traceback.FrameSummary):
        return f"{frame.filename}:{frame.lineno} in {frame.name}"
    return str(sloc.maybe_user_loc or frame or "an unknown place")


def _same(a: Any, b: Any) -> bool:
    try:
        return a is b or bool(a == b)
    except Exception:  # an object whose == does not answer a bool
        return False


def _is_zero(count: Count) -> bool:
    return isinstance(count, int) and count == 0


class quiet_symbolic_graph(warnings.catch_warnings):  # noqa: N801  (a context manager, named as one)
    """The fx graph of a symbolic trace holds raw ``SymInt`` arguments (sizes), which fx
    warns about: expected."""

    def __enter__(self) -> None:
        super().__enter__()
        warnings.filterwarnings("ignore", message="Raw SymInt value", category=UserWarning)
