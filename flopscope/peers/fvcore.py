"""fvcore's ``FlopCountAnalysis``: its runner for :func:`~.common.crosscheck`, and the
plug-ins :func:`fvcore_handles` / :func:`fvcore_analysis` that give it flopscope's
formulas.

fvcore's "flop" is one fused multiply-add, i.e. a MAC. It counts ops of a TorchScript
trace, keyed by TorchScript name (``"aten::addmm"``); its ``by_operator()`` drops the
``aten::`` prefix. fvcore itself is imported inside the functions only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from ..errors import FormulaError
from ..formulas.registry import REGISTRY, FormulaRegistry, MacFormula, OpFamily, total_of
from ..profile import Profile
from .common import Difference, PeerCount, copy_for, ordered, quiet, required_formula, sum_roles

TOOL = "fvcore"
aten = torch.ops.aten

FvcoreHandle = Callable[[list[Any], list[Any]], Any]
"""An fvcore op handle: ``(inputs, outputs)`` TorchScript values in, a count (or a
``Counter``) out."""


def _fvcore_defaults() -> Mapping[str, FvcoreHandle]:
    """fvcore's own op handles, ``{TorchScript name: handle}``.

    The one place that reads a private detail of fvcore:
    ``fvcore.nn.flop_count._DEFAULT_SUPPORTED_OPS``. fvcore has no public way to list
    the handles ``FlopCountAnalysis`` starts with, and the plug-ins need them to leave
    fvcore's own GEMM / convolution handles in place and to switch its elementwise ones
    off.
    """
    from fvcore.nn.flop_count import _DEFAULT_SUPPORTED_OPS

    return dict(_DEFAULT_SUPPORTED_OPS)


# --------------------------------------------------------------------------------------------------
# TorchScript names and the registry's op families
# --------------------------------------------------------------------------------------------------
def _rnn_arguments(values: list[Any]) -> list[Any]:
    """``aten::lstm`` / ``gru`` / ``rnn_*`` (``.input`` and ``.data`` overloads) ->
    ``(x, weights)``: the flat weights are the last list among the arguments after
    the input."""
    weights = [v for v in values[1:4] if isinstance(v, list)]
    if not weights:
        raise FormulaError("a traced recurrent op without a list of weights among its arguments: "
                           f"{values[:4]}")
    return [values[0], weights[-1]]


def _rnn_cell_arguments(values: list[Any]) -> list[Any]:
    """``aten::lstm_cell(input, hx, w_ih, w_hh, ...)`` (and gru / rnn cells) -> ``(x,
    w_ih, w_hh)``."""
    return [values[0], values[2], values[3]]


_COMPOSITE_HANDLES: dict[str, tuple[Any, Callable[[list[Any]], list[Any]] | None]] = {
    "aten::scaled_dot_product_attention": (aten._scaled_dot_product_attention_math, None),
    **dict.fromkeys(["aten::lstm", "aten::gru", "aten::rnn_tanh", "aten::rnn_relu"],
                    (aten._cudnn_rnn, _rnn_arguments)),
    **dict.fromkeys(["aten::lstm_cell", "aten::gru_cell", "aten::rnn_tanh_cell",
                     "aten::rnn_relu_cell"],
                    (aten.mkldnn_rnn_layer, _rnn_cell_arguments)),
}
"""TorchScript ops that the trace records above the kernels flopscope counts, each with
the registered kernel whose formula counts it (its family is that kernel's) and the
selection of that formula's arguments."""

_TRACED_FAMILIES: dict[str, OpFamily] = {
    # traced as one op; runs as bmm (fvcore's own einsum handle counts it)
    "aten::einsum": OpFamily.MATMUL,
    # the key fvcore's convolution handle reports aten::_convolution under
    "aten::conv": OpFamily.CONV,
}
"""Families of the names the registry cannot tell: a composite TorchScript op with no
kernel formula of its own, and fvcore's key for a convolution. Every other name
(``aten::linear``, ``aten::matmul``, ``addmm``, ``aten.bmm``, ...) takes its family from
the registry (:meth:`FormulaRegistry.spec`), or from its kernel in
:data:`_COMPOSITE_HANDLES`."""

_FAMILY_GROUPS = {OpFamily.MATMUL: "matrix products", OpFamily.GROUPED_MATMUL: "matrix products",
                  OpFamily.CONV: "convolution"}


def torchscript_name(op: str) -> str:
    """``"addmm"`` (fvcore's key) / ``"aten.addmm"`` (flopscope's record) /
    ``"aten::addmm"`` -> ``"aten::addmm"``."""
    if "::" in op:
        return op
    namespace, dot, name = op.partition(".")
    return f"{namespace}::{name.split('.', 1)[0]}" if dot else f"aten::{op}"


def op_family(op: str, registry: FormulaRegistry = REGISTRY) -> OpFamily | None:
    """The registry's family of an op under any of its names (``None``: flopscope has no
    formula for it)."""
    name = torchscript_name(op)
    if name in _TRACED_FAMILIES:
        return _TRACED_FAMILIES[name]
    spec = registry.spec(_COMPOSITE_HANDLES[name][0] if name in _COMPOSITE_HANDLES else name)
    return spec.family if spec is not None else None


def _family(op: str) -> str:
    """``"aten.addmm"`` / ``"aten::linear"`` / ``"addmm"`` -> the group its count is
    compared in, so counts on TorchScript ops (fvcore) and on dispatched ATen ops
    (flopscope) can be matched: ``"matrix products"`` for the registry's ``MATMUL`` /
    ``GROUPED_MATMUL`` ops, ``"convolution"`` for ``CONV``, else the op's own name."""
    family = op_family(op)
    return _FAMILY_GROUPS[family] if family in _FAMILY_GROUPS else torchscript_name(op).partition("::")[2]


# --------------------------------------------------------------------------------------------------
# runner
# --------------------------------------------------------------------------------------------------
def _run_fvcore(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], prof: Profile,
                plugins: bool) -> PeerCount:
    """fvcore as asked (plain, or with the plug-ins), then once more with flopscope's
    formulas as handles (each op's MACs per role), on the same TorchScript trace:
    that second count is what flopscope counts on the path the trace took, and the
    per-op difference between the two is fvcore's shortfall."""
    from fvcore.nn import FlopCountAnalysis

    twin = copy_for(model, kwargs)
    with quiet():
        analysis = fvcore_analysis(twin, args) if plugins else FlopCountAnalysis(twin, args)
        analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False).tracer_warnings("none")
        total = int(analysis.total())
        by_op = {op: int(v) for op, v in analysis.by_operator().items()}
        unsupported = {str(op): int(n) for op, n in analysis.unsupported_ops().items()}
        ours = fvcore_analysis(twin, args, roles=True)
        ours.unsupported_ops_warnings(False).uncalled_modules_warnings(False).tracer_warnings("none")
        by_role_op = {op: int(v) for op, v in ours.by_operator().items()}
    traced = sum(by_role_op.values())
    differences = []
    if traced != prof.total():
        differences.append(Difference(TOOL, "path", traced - prof.total(),
                                      "its TorchScript trace runs other kernels: flopscope's "
                                      f"formulas give {traced:,} MACs on the traced graph, "
                                      f"{prof.total():,} on the profiled run"))
    # family -> {role: MACs} ("" where the formula has no role split)
    mine: dict[str, Counter[str]] = {}
    names: dict[str, list[str]] = {}  # family -> TorchScript op names
    for key, macs in by_role_op.items():
        op, _, role = key.partition("|")
        mine.setdefault(_family(op), Counter())[role] += macs
        names.setdefault(_family(op), []).append(f"aten::{op}")
    theirs: Counter[str] = Counter()
    for op, macs in by_op.items():
        theirs[_family(op)] += macs
        names.setdefault(_family(op), []).append(f"aten::{op}")
    for family in [*mine, *(f for f in theirs if f not in mine)]:
        counted = sum(mine.get(family, {}).values())
        delta = theirs[family] - counted
        if delta == 0:
            continue
        parts = dict(mine.get(family, {}))
        # GEMMs / convolutions: their roles are those of flopscope's records of that
        # family
        if "" in parts:
            roles = sum_roles(r for r in prof.records if _family(r.op) == family)
            parts = roles if sum(roles.values()) == counted else {}
        ops = sorted(set(names[family]))
        missed = [op for op in ops if op in unsupported]
        if counted == 0:
            differences.append(Difference(TOOL, "extra", delta,
                                          f"{', '.join(ops)}: not multiply-accumulates "
                                          "(elementwise work)"))
        elif theirs[family] == 0:
            reason = f"{', '.join(missed)} unsupported" if missed else f"it counts none of {', '.join(ops)}"
            differences.append(Difference(TOOL, "missing", delta, reason, parts))
        else:
            reason = f"its handles give {theirs[family]:,} MACs of {family}, flopscope's formulas {counted:,}"
            if missed:
                reason += f" ({', '.join(missed)} unsupported)"
            differences.append(Difference(TOOL, "under" if delta < 0 else "over", delta, reason,
                                          parts))
    return PeerCount(TOOL, total, prof.total(), by_op=by_op, differences=ordered(differences),
                     unsupported=unsupported)


# --------------------------------------------------------------------------------------------------
# plug-ins
# --------------------------------------------------------------------------------------------------
def _jit_value(value: Any) -> Any:
    """A TorchScript value as a flopscope formula wants it: a tensor's shape, a list of
    shapes, or the constant (``None`` if it is neither)."""
    kind = value.type().kind()
    if kind == "TensorType":
        if not value.isCompleteTensor():
            raise FormulaError(f"fvcore traced a tensor without a complete shape: {value}")
        return tuple(int(s) for s in value.type().sizes())
    node = value.node()
    if node.kind() == "prim::ListConstruct":
        return [_jit_value(v) for v in node.inputs()]
    try:
        return value.toIValue()
    except RuntimeError:  # a constant TorchScript cannot turn into a Python value
        return None


def _fvcore_handle(fn: MacFormula, select: Callable[[list[Any]], list[Any]] | None = None,
                   name: str | None = None) -> FvcoreHandle:
    """A flopscope formula as an fvcore op handle: ``(inputs, outputs)`` JIT values in,
    MACs out. ``select`` picks and orders the formula's arguments from the op's
    (converted) inputs. With ``name`` the handle returns ``Counter({"name|role":
    MACs})`` (role ``""`` for a formula without parts)."""

    def handle(inputs: list[Any], outputs: list[Any]) -> Any:
        values = [_jit_value(v) for v in inputs]
        out = _jit_value(outputs[0]) if outputs and outputs[0].type().kind() == "TensorType" else None
        keywords = _keyword_only(outputs[0].node(), len(values)) if outputs else {}
        positional = [v for i, v in enumerate(values) if i not in keywords]
        named = {keywords[i]: v for i, v in enumerate(values) if i in keywords}
        macs = fn(*(select(positional) if select else positional), out_shape=out, **named)
        if name is None:
            return total_of(macs)
        parts = {"": macs} if isinstance(macs, int) else macs
        return Counter({f"{name}|{role}": v for role, v in parts.items()})

    return handle


def _keyword_only(node: Any, count: int) -> dict[int, str]:
    """Positions of the keyword-only arguments of a TorchScript op (``beta``, ``alpha``
    of ``aten::addmm``): at the ATen level they are passed by keyword, which is how
    flopscope's formulas take them."""
    try:
        schema = torch._C.parse_schema(node.schema())
    except RuntimeError:  # a node without a schema ("(no schema)"): every argument is positional
        return {}
    arguments = list(schema.arguments)
    if len(arguments) != count:
        return {}
    return {i: a.name for i, a in enumerate(arguments) if a.kwarg_only}


def _named(handle: FvcoreHandle, name: str) -> FvcoreHandle:
    """One of fvcore's own handles, its count keyed ``"name|"``."""

    def named(inputs: list[Any], outputs: list[Any]) -> Any:
        count = handle(inputs, outputs)
        return Counter({f"{name}|": sum(count.values()) if isinstance(count, Mapping) else count})

    return named


def _handles(registry: FormulaRegistry | None, roles: bool) -> dict[str, FvcoreHandle]:
    """A handle per op of the registry and per composite of :data:`_COMPOSITE_HANDLES`."""
    registry = registry if registry is not None else REGISTRY
    handles: dict[str, FvcoreHandle] = {}
    for name in registry.ops():
        fn = registry.get(name)
        if fn is not None:
            handles[name] = _fvcore_handle(fn, None, name.partition("::")[2] if roles else None)
    for name, (kernel, select) in _COMPOSITE_HANDLES.items():
        fn = required_formula(registry, kernel, f"fvcore's handle for {name}")
        handles[name] = _fvcore_handle(fn, select, name.partition("::")[2] if roles else None)
    return handles


def fvcore_handles(registry: FormulaRegistry | None = None) -> dict[str, FvcoreHandle]:
    """Op handles for fvcore's ``FlopCountAnalysis.set_op_handle(**handles)``, returning
    **MACs** (fvcore's "flop" is one fused multiply-add): every op of flopscope's
    registry that fvcore does not handle (``aten::_native_multi_head_attention``,
    ``aten::_transformer_encoder_layer_fwd``, ``aten::baddbmm``,
    ``aten::_grouped_mm``, ...), plus the ops TorchScript records above the kernels
    flopscope counts: ``aten::scaled_dot_product_attention``, ``aten::lstm`` /
    ``gru`` / ``rnn_tanh`` / ``rnn_relu`` and their cells. Keys are TorchScript names
    (``"aten::lstm"``). A registry without a formula one of these handles builds on
    is a :class:`~flopscope.errors.RegistryError`.
    """
    defaults = _fvcore_defaults()
    return {name: handle for name, handle in _handles(registry, roles=False).items() if name not in defaults}


def fvcore_analysis(model: nn.Module, inputs: Any, elementwise: bool = False,
                    roles: bool = False) -> Any:
    """fvcore's ``FlopCountAnalysis(model, inputs)`` with :func:`fvcore_handles` set.
    Counts are MACs.

    ``elementwise=False`` (default): fvcore's norm / upsample / pooling counters (its
    handles for ops that flopscope's registry has no multiply formula for) are switched
    off, so it counts multiply-accumulates only, as flopscope's ``total()`` does.
    ``roles=True``: every op flopscope has a formula for is counted by that formula
    (fvcore's own GEMM and convolution handles included), and ``by_operator()`` keys are
    ``"op|role"`` (``"scaled_dot_product_attention|attn_scores"``; role ``""`` for a
    plain GEMM or convolution, whose role only flopscope's dataflow knows).
    """
    from fvcore.nn import FlopCountAnalysis

    analysis = FlopCountAnalysis(model, inputs)
    analysis.clear_op_handles()  # setting a handle to None does not remove a default one
    defaults = _fvcore_defaults()
    ours = _handles(None, roles)
    for name, handle in defaults.items():
        if not elementwise and op_family(name) is None:
            analysis.set_op_handle(name, None)
        elif not roles or name not in ours:
            analysis.set_op_handle(name, _named(handle, name.partition("::")[2]) if roles else handle)
    analysis.set_op_handle(**(ours if roles else {n: h for n, h in ours.items() if n not in defaults}))
    return analysis
