"""The formula registry: what a multiply formula is, how it is called and declared
(family, operands, layout). The default registry's formulas are
:mod:`flopscope.formulas.linear_algebra`.

Unit: multiply-accumulates (MACs). A GEMM ``[m, k] @ [k, n]`` is ``m * n * k`` MACs (=
``2 * m * n * k`` FLOPs). Bias adds, scaling and every elementwise step are *not* MACs;
they are counted separately by :mod:`flopscope.formulas.elementwise`. Conventions (dense
attention, backward kernels): ``docs/conventions.md`` sections 2, 5 and 7; closed forms
with sources: ``docs/formulas.md``.

One MAC is one multiply-accumulate *in the operands' dtype*, whatever that dtype is:
formulas see shapes, never dtypes. A complex64 / complex128 GEMM ``[m, k] @ [k, n]`` is
``m * n * k`` MACs, each a complex multiply-add (four real multiplies and four real adds
on the hardware), as ``torch.utils.flop_counter`` counts it (``2 * m * n * k`` "FLOPs"
for a complex ``mm``); int8, fp8 and quantized products count like float ones. To
convert a complex count to real multiplies, multiply by 4 (``docs/conventions.md``
section 1).

In-place and ``out=`` variants of an op (``aten.addmm_``, ``aten.mm.out``) are counted
by the formula of the op itself: ``out=`` overloads share its packet, and
:meth:`FormulaRegistry.spec` resolves an in-place op to its functional twin
(:func:`functional_packet`).

A new op is one registration: its formula, its :class:`OpFamily` and its operand
positions (``docs/extending.md``; the default registry's are ``@formula`` decorators in
``linear_algebra.py``).

Calling convention: a formula receives the op's arguments with every tensor replaced by
its shape (a tuple of ints; a list of tensors becomes a list of shapes; ``None`` stays
``None``), non-tensor arguments unchanged, plus the keyword ``out_shape`` (the shape of
the first tensor output). It returns an ``int``, or, for a fused op that does several
kinds of work, a mapping ``{part: MACs}`` whose values sum to the op's total; part names
are the role names of :mod:`flopscope` (``"q_proj"``, ``"attn_scores"``, ...), so later
stages can split the op without re-deriving its formula.

A formula marked :func:`by_name` receives instead one mapping of the op's arguments by
their schema names (each shape- or value-converted as above; an argument left out takes
its schema default), plus ``out_shape``: for kernels whose libraries publish one op name
with more than one schema (a Hub kernel ``flash_attn::fwd`` with FlashAttention 2's
arguments or 3's).

Layouts follow PyTorch: ``scaled_dot_product_attention`` takes ``[..., heads, n, d]``;
the CUDA ``_flash_attention_forward`` / ``_efficient_attention_forward`` take ``[B, n,
heads, d]``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

import torch
from torch.nested._internal.nested_tensor import NestedTensor as JaggedTensor
from torch.utils._python_dispatch import _disable_current_modes

from ..enums import StrEnum
from ..errors import RegistryError

__all__ = [  # with linear_algebra.__all__, the public face of flopscope.formulas
    'BHND', 'BNHD', 'CHUNKED',
    'REGISTRY',
    'FormulaRegistry',
    'KnownShape',
    'MacCount',
    'MacFormula',
    'NestedShape',
    'OpFamily',
    'OpSpec',
    'Shape',
    'UpperBound',
    'Values',
    'argument',
    'aten_ops',
    'by_name',
    'count',
    'formula',
    'functional_overload',
    'functional_packet',
    'hub_name',
    'inplace_packet',
    'packet_named',
    'prod',
    'rows_of',
    'shape_of',
    'total_of',
    'with_inplace',
]

Shape: TypeAlias = tuple[int, ...]
MacCount: TypeAlias = int | Mapping[str, int]
MacFormula: TypeAlias = Callable[..., MacCount]
F = TypeVar("F", bound=MacFormula)

aten = torch.ops.aten


def aten_ops(*names: str) -> list[Any]:
    """The ATen op packets of ``names`` that this torch has. An op newer than the oldest
    torch supported (``_grouped_mm``, ``_fused_rms_norm``: 2.8;
    ``_fused_rms_norm_backward``: 2.9) gets its formula, rule or table entry only
    where it exists."""
    return [getattr(aten, name) for name in names if hasattr(aten, name)]


def prod(xs: Iterable[int]) -> int:
    """Product of integers (1 for an empty sequence); a ``torch.SymInt`` (a symbolic
    size) stays symbolic."""
    return math.prod(x if isinstance(x, torch.SymInt) else int(x) for x in xs)


def argument(target: Any, args: Any, kwargs: Mapping[str, Any], *names: str) -> Any:
    """The value of an op's first schema argument called one of ``names`` (by keyword or
    position), else None."""
    for name in names:
        if name in kwargs:
            return kwargs[name]
    schema = getattr(target, "_schema", None)
    for i, a in enumerate(schema.arguments if schema is not None else ()):
        if a.name in names and not a.kwarg_only:
            return args[i] if i < len(args) else None
    return None


class OpFamily(StrEnum):
    """What kind of linear algebra an op does: the one fact, besides its formula, that
    later stages (roles, the peer plug-ins) need about it. Declared once, where the
    formula is registered.

    - ``MATMUL``: a product of two matrices at argument positions ``operands = (a, b)``;
    - ``GROUPED_MATMUL``: one product per group of rows (mixture-of-experts experts),
      operands as above;
    - ``CONV``: a convolution (forward or backward);
    - ``ATTENTION``: an attention kernel, ``operands = (q, k, v)``; its formula returns
      the parts ``attn_scores`` / ``attn_weighted_sum``;
    - ``FUSED_LAYER``: a whole fused layer (the ``nn.MultiheadAttention`` /
      ``nn.TransformerEncoderLayer`` fast paths) whose formula returns its parts per
      role;
    - ``RECURRENT``: a recurrent kernel (parts ``recurrent``);
    - ``TRANSFORM``: a fast linear transform along whole dimensions (the FFT kernels
      ``_fft_c2c``, ``_fft_r2c``, ``_fft_c2r``): every output position mixes every input
      position along the transformed dims, so its role is ``token_mixing``; no operands
      (the transform's matrix is implicit);
    - ``OTHER``: linear algebra no role pattern looks for (triangular solve, distances,
      bilinear forms).
    """

    MATMUL = "matmul"
    GROUPED_MATMUL = "grouped matmul"
    CONV = "conv"
    ATTENTION = "attention"
    FUSED_LAYER = "fused layer"
    RECURRENT = "recurrent"
    TRANSFORM = "transform"
    OTHER = "other"


_OPERAND_FAMILIES = {OpFamily.MATMUL: 2, OpFamily.GROUPED_MATMUL: 2, OpFamily.ATTENTION: 3}


BHND, BNHD, CHUNKED = "[*B, heads, n, d]", "[B, n, heads, d]", "[B, n, heads, d] in chunks"
"""The operand layouts of attention kernels: SDPA's and FlexAttention's ``[*batch,
heads, positions, width]``, FlashAttention's / the memory-efficient kernel's own
``[batch, positions, heads, width]``, and that of a chunked linear-attention kernel (the
gated delta rule), whose scores are within chunks: no ``n_q × n_k`` geometry for the
attention conventions to price (they charge its work as executed)."""


@dataclass(frozen=True, slots=True)
class OpSpec:
    """An op's formula and family; ``operands``: argument positions of its matrix
    operands (matmuls: ``(a, b)``; attention kernels: ``(q, k, v)``; empty for other
    families)."""

    formula: MacFormula
    family: OpFamily
    operands: tuple[int, ...] = ()
    # attention kernels: where heads and positions sit in q, k and v (BHND or BNHD)
    layout: str = BHND

    @property
    def is_matmul(self) -> bool:
        """A product of two operands (plain or grouped): what the attention and FFN
        passes look for."""
        return self.family in (OpFamily.MATMUL, OpFamily.GROUPED_MATMUL)

    def attention_geometry(self, q: Shape, k: Shape) -> tuple[int, int, Shape] | None:
        """An attention kernel's (query positions, key positions, scores shape
        ``[*batch, heads, n_q, n_k]``) from its q and k shapes, read in the kernel's
        declared :attr:`layout`; ``None`` for another family or shapes the layout
        does not fit (a packed variable-length ``[total, heads, d]`` call)."""
        if self.family is not OpFamily.ATTENTION or self.layout == CHUNKED:
            return None
        if self.layout == BNHD:  # [B, n, heads, d]
            return (q[1], k[1], (q[0], q[2], q[1], k[1])) if len(q) == 4 and len(k) == 4 else None
        if len(q) >= 3 and len(k) >= 3:  # [*B, heads, n, d]
            return q[-2], k[-2], (*q[:-1], k[-2])
        return None


class FormulaRegistry:
    """Formulas and families keyed by ATen op packets (``torch.ops.aten.mm``), or by
    qualified name for ops that live in a library loaded later
    (``"transformers::grouped_mm_fallback"``).

    Registering an op twice is an error; to change a formula, :meth:`copy` the registry
    and :meth:`override` on the copy, then pass it as ``registry=`` to
    :func:`flopscope.profile`. A new op is one registration: its formula, its
    :class:`OpFamily` and, for a matmul or an attention kernel, the positions of its
    operands; roles and the peer plug-ins take everything else from here::

        registry = flopscope.REGISTRY.copy()
        registry.override(torch.ops.mylib.my_mm, my_mm_formula, family=OpFamily.MATMUL, operands=(0, 1))
    """

    def __init__(self) -> None:
        self._by_packet: dict[Any, OpSpec] = {}
        self._by_name: dict[str, OpSpec] = {}

    def register(self, *ops: Any, family: OpFamily = OpFamily.OTHER,
                 operands: tuple[int, ...] = (), layout: str = BHND) -> Callable[[F], F]:
        """Decorator: register ``fn`` for each op (an ATen packet/overload or a
        ``"ns::name"`` string); an attention kernel declares its operands' ``layout``
        (:data:`BHND`, the default, or :data:`BNHD`)."""

        def decorate(fn: F) -> F:
            spec = _spec(fn, family, operands, layout)
            for op in ops:
                self._put(op, spec, replace=False)
            return fn

        return decorate

    def override(self, op: Any, fn: MacFormula, family: OpFamily | None = None,
                 operands: tuple[int, ...] | None = None, layout: str | None = None) -> None:
        """Replace (or add) the formula of ``op``; its family, operands and layout stay
        as registered unless given. Use on a :meth:`copy`, not on the default
        registry."""
        known = self.spec(op)
        if family is None:  # keep what the op was registered as
            family, operands = (known.family, known.operands if operands is None else operands) if known else (
                OpFamily.OTHER, operands or ())
        layout = layout or (known.layout if known is not None else BHND)
        spec = _spec(fn, family, operands if operands is not None else (), layout)
        self._put(op, spec, replace=True)

    def copy(self) -> FormulaRegistry:
        new = FormulaRegistry()
        new._by_packet = dict(self._by_packet)
        new._by_name = dict(self._by_name)
        return new

    def spec(self, func: Any) -> OpSpec | None:
        """The :class:`OpSpec` of an op overload, packet or name (``"aten::mm"`` or
        ``"aten.mm"``). An ``out=`` overload (``aten.mm.out``) shares its op's
        packet; an in-place op (``aten.addmm_``) has the spec of its functional twin
        (``aten.addmm``) unless it is registered itself; an op of a Hub kernel's
        namespace (``_flash_attn_2b4ec51_dirty::fwd``) has the spec registered for
        its kernel's name without the build hash (``flash_attn::fwd``:
        :func:`hub_name`)."""
        table, key = self._key(func)
        spec = table.get(key)
        # registered by name before it loaded
        if spec is None and table is self._by_packet and self._by_name:
            name = _qualified_name(key)
            spec = self._by_name.get(name)
            if spec is None and name.startswith("_"):
                spec = self._by_name.get(hub_name(name) or "")
        if spec is None and table is self._by_packet:
            twin = functional_packet(key)
            spec = self.spec(twin) if twin is not None else None
        return spec

    def get(self, func: Any) -> MacFormula | None:
        """The formula for an op overload (looked up by its packet, then by its
        qualified name)."""
        spec = self.spec(func)
        return spec.formula if spec is not None else None

    def __contains__(self, func: Any) -> bool:
        return self.spec(func) is not None

    def ops(self, family: OpFamily | None = None) -> list[str]:
        """Qualified names (``"aten::mm"``) of the ops with a formula (of one
        ``family``), sorted."""
        specs = [(_qualified_name(p), s) for p, s in self._by_packet.items()] + list(self._by_name.items())
        return sorted(name for name, spec in specs if family is None or spec.family is family)

    def _key(self, op: Any) -> tuple[dict[Any, OpSpec], Any]:
        """One key per op, whichever way it is named: its packet when that is loaded,
        else its qualified name (an op of a library loaded later)."""
        if isinstance(op, str):
            name = op if "::" in op else op.replace(".", "::", 1)
            packet = packet_named(name)
            return (self._by_packet, packet) if packet is not None else (self._by_name, name)
        return self._by_packet, getattr(op, "overloadpacket", op)

    def _put(self, op: Any, spec: OpSpec, *, replace: bool) -> None:
        table, key = self._key(op)
        if key in table and not replace:
            raise RegistryError(f"a formula for {key} is already registered; copy() the registry "
                                "and override()")
        table[key] = spec


def _spec(fn: MacFormula, family: OpFamily, operands: tuple[int, ...],
          layout: str = BHND) -> OpSpec:
    wanted = _OPERAND_FAMILIES.get(family, 0)
    if len(operands) != wanted:
        raise RegistryError(f"an op of family {family} takes {wanted} operand positions; got "
                            f"{operands!r}"
                            + (" (matmul: (a, b); attention: (q, k, v))" if wanted else ""))
    if layout not in (BHND, BNHD, CHUNKED):
        raise RegistryError(f"an attention layout is {BHND!r}, {BNHD!r} or {CHUNKED!r}; got "
                            f"{layout!r}")
    return OpSpec(fn, family, tuple(operands), layout)


_HUB_NAMESPACE = re.compile(r"_(?P<kernel>[A-Za-z0-9_]+?)_(?:[0-9a-f]{7,40}|[0-9]{8,14})(?:_dirty)?")
"""A Hub kernel's op namespace (``kernels`` / kernel-builder): ``_<kernel name>_<git
hash or build time>``, ``_dirty`` after a build from a changed tree
(``_flash_attn_2b4ec51_dirty``, ``_gsplat_20250920003636``)."""


def hub_name(qualified: str) -> str | None:
    """``"_flash_attn_2b4ec51_dirty::fwd"`` -> ``"flash_attn::fwd"``: a Hub kernel's op
    by its kernel's name, without the build hash that changes with every build;
    ``None`` for another namespace."""
    namespace, _, op = qualified.partition("::")
    found = _HUB_NAMESPACE.fullmatch(namespace)
    return f"{found['kernel']}::{op}" if found is not None and op else None


def by_name(fn: F) -> F:
    """Mark ``fn`` as a formula called with the op's arguments by schema name (the
    module docstring)."""
    fn.__flopscope_by_name__ = True  # type: ignore[attr-defined]
    return fn


def _qualified_name(packet: Any) -> str:
    name = getattr(packet, "_qualified_op_name", None)
    return str(name) if name is not None else str(packet)


def packet_named(name: str) -> Any:
    """``"aten::mm"`` -> ``torch.ops.aten.mm`` (``None`` if that library or op is not
    loaded)."""
    namespace, _, op = name.partition("::")
    try:
        return getattr(getattr(torch.ops, namespace), op)
    except (AttributeError, RuntimeError):
        return None


# In-place and out= variants. ATen names the in-place variant of ``foo`` ``foo_``
# (``relu_``, ``addmm_``, ``rrelu_with_noise_``; dunder ops such as ``__iand__`` are not
# of this form), and gives ``foo`` an ``out=`` overload (``foo.out``,
# ``foo.Tensor_out``: the schema has an ``out`` argument). Both do the work of ``foo``,
# so every table keyed by op (formulas, elementwise rules and tags, the zero-cost set)
# resolves them to it.
def functional_packet(packet: Any) -> Any:
    """The functional twin of an in-place op packet: ``aten.relu_`` -> ``aten.relu``
    (``None`` if ``packet`` is not an in-place op or its twin does not exist)."""
    namespace, _, name = _qualified_name(packet).partition("::")
    if not name.endswith("_") or name.endswith("__") or not name.rstrip("_"):
        return None
    return packet_named(f"{namespace}::{name[:-1]}")


def inplace_packet(packet: Any) -> Any:
    """The in-place twin of a functional op packet: ``aten.relu`` -> ``aten.relu_``
    (``None`` if none)."""
    name = _qualified_name(packet)
    return packet_named(name + "_") if "::" in name and not name.endswith("_") else None


def with_inplace(packets: Iterable[Any]) -> frozenset[Any]:
    """``packets`` and the in-place twin of each (a set of ops written once, by their
    functional names)."""
    ops = set(packets)
    return frozenset(ops | {twin for twin in map(inplace_packet, ops) if twin is not None})


def functional_overload(func: Any) -> Any:
    """The functional overload whose class an in-place or ``out=`` overload inherits
    (``func`` itself for any other op): the overload of the functional op taking the
    same inputs, else the one of the same name, else its first.
    ``aten.relu_.default`` -> ``aten.relu.default``, ``aten.threshold.out`` ->
    ``aten.threshold.default``, ``aten.add.out`` -> ``aten.add.Tensor``."""
    twin = functional_packet(func.overloadpacket)
    if twin is None and not _writes_out(func):
        return func
    packet = twin if twin is not None else func.overloadpacket
    overloads = {name: getattr(packet, name) for name in packet.overloads()}
    functional = {name: op for name, op in overloads.items() if not _writes_out(op)}
    inputs = _inputs(func)
    for op in functional.values():
        if _inputs(op) == inputs:
            return op
    # "Tensor_out" -> "Tensor"
    name = func._overloadname.removesuffix("out").removesuffix("_") or "default"
    return functional.get(name) or next(iter(functional.values()), func)


def _inputs(func: Any) -> tuple[tuple[str, str], ...]:
    """(name, type) of the arguments an overload reads (its ``out`` arguments left out)."""
    return tuple((argument.name, str(argument.type)) for argument in func._schema.arguments if not argument.is_out)


def _writes_out(func: Any) -> bool:
    """An ``out=`` overload: its schema has an ``out`` argument."""
    return any(argument.is_out for argument in func._schema.arguments)



class NestedShape(tuple[int, ...]):
    """The shape of a nested tensor (one variable-length sequence per batch entry): the
    padded shape (each dim its largest size), with ``sizes``, each entry's own shape
    (the dims after the batch). Nested kernels skip the padding: their work is a sum
    over ``sizes``.

    Strided nested tensors (``torch.nested.nested_tensor(...)``, the C++ layout) give
    their sizes directly; a jagged one (``layout=torch.jagged``) gives them from its
    offsets. Formulas see strided ones only: the recorder lets a jagged tensor run its
    ops on its packed values (see ``docs/conventions.md``, nested tensors), so a jagged
    shape is read only to describe a module's inputs, and where its offsets are not real
    (a fake tensor) every entry is shown as long as the longest."""

    sizes: tuple[tuple[int, ...], ...]

    def __new__(cls, padded: Sequence[int], sizes: Sequence[Sequence[int]]) -> NestedShape:
        new = super().__new__(cls, padded)
        new.sizes = tuple(tuple(int(d) for d in size) for size in sizes)
        return new

    @property
    def lengths(self) -> tuple[int, ...]:
        """The length of each entry along dim 1 (its sequence, in the ``[B, n, ...]``
        layout)."""
        return tuple(size[0] for size in self.sizes)


def shape_of(t: torch.Tensor) -> Shape:
    """``tuple(t.shape)``; for a nested tensor, a :class:`NestedShape`."""
    if not t.is_nested:
        return tuple(t.shape)
    if isinstance(t, JaggedTensor):
        return _jagged_shape(t)
    with _disable_current_modes():  # reading sizes is no work of the model's
        sizes = t._nested_tensor_size().tolist()  # [batch, component dims]
    padded = (len(sizes), *(max(column) for column in zip(*sizes, strict=True)))
    return NestedShape(padded, sizes)


def _jagged_shape(t: Any) -> NestedShape:
    """A jagged nested tensor ``[B, ..., j, ...]`` (ragged at ``t._ragged_idx``): entry
    i is ``nᵢ`` long there, ``nᵢ`` the difference of its offsets (or its ``lengths``,
    where it has holes)."""
    ragged = t._ragged_idx
    # every dim but the ragged one is a plain int
    dims = [d for i, d in enumerate(t._size) if i != ragged]
    batch = int(dims[0])
    with _disable_current_modes():
        try:
            lengths = (t._lengths if t._lengths is not None else t._offsets.diff()).tolist()
        # fake or meta offsets: only the longest length is known
        except (RuntimeError, NotImplementedError):
            longest = t._maybe_max_seqlen
            lengths = [int(longest) if longest is not None else int(t._values.shape[ragged - 1])] * batch
    inner = [int(d) for d in dims[1:]]
    sizes = [[*inner[:ragged - 1], n, *inner[ragged - 1:]] for n in lengths]
    padded = (batch, *(max(column) for column in zip(*sizes, strict=True)))
    return NestedShape(padded, sizes)


def rows_of(shape: Shape) -> int:
    """Tokens of a ``[..., features]`` activation: all but the last dim (a nested one:
    its real tokens)."""
    if isinstance(shape, NestedShape):
        return sum(prod(size[:-1]) for size in shape.sizes)
    return prod(shape[:-1])


class KnownShape(tuple[int, ...]):
    """The shape of a small integer tensor whose ``values`` are known (a real tensor, or
    a fake one whose values flopscope propagated): what a formula whose work depends
    on data reads (variable-length offsets)."""

    values: tuple[int, ...]

    def __new__(cls, shape: Sequence[int], values: Sequence[int]) -> KnownShape:
        new = super().__new__(cls, shape)
        new.values = tuple(int(v) for v in values)
        return new


class UpperBound(dict[str, int]):
    """A formula's parts that bound the work from above because the data it depends on
    is not known (fake mode): counted as they are, and named in ``Profile.notes``."""


Values = Callable[[torch.Tensor], "torch.Tensor | None"]


def count(fn: MacFormula, args: Sequence[Any], kwargs: Mapping[str, Any], out_shape: Shape | None,
          values: Values | None = None, target: Any = None) -> MacCount:
    """Call ``fn`` with tensors replaced by their shapes (the calling convention above);
    an integer tensor whose values ``values(t)`` knows becomes a :class:`KnownShape`.
    A :func:`by_name` formula gets the arguments of ``target`` (the op overload) by
    their schema names."""
    if getattr(fn, "__flopscope_by_name__", False):
        schema = getattr(target, "_schema", None)
        if schema is None:
            raise RegistryError(f"the formula {getattr(fn, '__name__', fn)} reads arguments by "
                                "name: it needs the op (count(..., target=op))")
        named: dict[str, Any] = {}
        for i, argument in enumerate(schema.arguments):
            if i < len(args) and not argument.kwarg_only:
                named[argument.name] = _shape_of(args[i], values)
            elif argument.name in kwargs:
                named[argument.name] = _shape_of(kwargs[argument.name], values)
            else:
                named[argument.name] = argument.default_value if argument.has_default_value() else None
        return fn(named, out_shape=out_shape)
    return fn(*[_shape_of(a, values) for a in args], out_shape=out_shape,
              **{k: _shape_of(v, values) for k, v in kwargs.items()})


def _shape_of(x: Any, values: Values | None = None) -> Any:
    if isinstance(x, torch.Tensor):
        known = values(x) if values is not None and not x.is_floating_point() and not x.is_nested else None
        if known is None:
            return shape_of(x)
        # real values: a fake mode below the recorder must not take them
        with _disable_current_modes():
            return KnownShape(shape_of(x), known.flatten().tolist())
    if isinstance(x, (list, tuple)) and x and any(isinstance(t, torch.Tensor) for t in x):
        return [_shape_of(t, values) for t in x]
    return x


def total_of(macs: MacCount) -> int:
    """The total MACs of a formula's result (an int, or the sum of its parts)."""
    return sum(macs.values()) if isinstance(macs, Mapping) else macs


REGISTRY = FormulaRegistry()
"""The default registry used by :func:`flopscope.profile`."""
formula = REGISTRY.register
