"""Attention conventions: what the attention core (roles ``attn_scores`` and
``attn_weighted_sum``) is charged, and the one place that knows how each attention op
is masked (causal flag, sliding window, mask tensor).

``total()`` and ``by_role()`` count **executed** work: a dense kernel computes every
(query, key) pair, masked or not. Everything that consumes per-role or per-token numbers
takes ``attention=`` with one of:

=============  ======================================================================================
``executed``   (default) every pair the kernel computes: ``n_q·n_k`` per batch and head
``causal``     the causal half, the convention of FlashAttention's benchmark (``// (2 if causal else 1)``,
               flash-attention #594), Megatron-LM (``seq_length / 2``) and MaxText
               (PR #1988, "Divide FLOPs by two due to causal masks"), asked for in
               torchtitan #341: ``n²/2`` pairs for a square causal mask, generalised
               to ``n_q·n_k − n_q²/2`` when queries are the last ``n_q`` of ``n_k``
               keys (the area below the diagonal). Windows and padding are ignored;
               attention that is not causal stays dense
``mask``       exactly the pairs the mask allows: the mask tensor's values where they are known, else the
               declared facts: causal ``n_q·n_k − n_q(n_q−1)/2`` (square: ``n(n+1)/2``), a causal
               sliding window W ``Σ_i min(n_k − n_q + i + 1, W)``; padding only from values
=============  ======================================================================================

Each core op's MACs under a convention are its executed MACs times ``pairs /
(n_q·n_k)``, rounded down to a whole MAC (exact whenever ``batch·heads·head width`` is
even). Backward ops scale with their forward op: every backward GEMM of the core runs
over the same ``n_q × n_k`` pairs. Where the facts come from, per op
(:attr:`CoreOp.source`): a fused kernel's own ``is_causal`` / window / ``attn_mask``
argument; the values of its mask tensor, followed through ``where(mask, 0, -inf)`` (0
and -inf as numbers, or as one-element constants made from data), ``masked_fill`` and
additive masks; else the model's declaration (a module's ``is_causal``, its or the
config's ``sliding_window``), named in :func:`notes`. A mask's values are known when the
run kept them (real mode: index tensors of at most 4,096 elements, see
:mod:`flopscope.capture.recorder`; the model's integer inputs in fake mode) or when they
follow from the capture alone (:mod:`flopscope.capture.constant_values`: a mask made
from sizes, as SDPA's math path makes its causal mask on ``meta``, ``ones(n,
n).tril()``, transformers' masks), so the same mask gives the same facts in real, fake
and meta runs. The window of a mask is read from its values (an exact causal band of W
keys). FlexAttention's block mask: its ``mask_mod`` evaluated at every pair (a function
of indices, so in any mode). Units: MACs. See ``docs/conventions.md`` section 5.4.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import torch

from ..attribute.paths import inside
from ..attribute.roles import Assignment
from ..capture.constant_values import MAX_BYTES, ConstantValues
from ..capture.facts import ModelFacts
from ..capture.records import FORWARD, CapturedOp, argument_shape, link
from ..conventions import CAUSAL, EXECUTED, MASK, SLIDING_WINDOW, check_attention
from ..formulas.attention import FLEX_ATTENTION
from ..formulas.elementwise import SOFTMAX_OPS, VALUE_COPIES
from ..formulas.registry import OpFamily, argument
from ..role import PAIR_ROLES

DECLARED, KERNEL, VALUES, UNMASKED, UNKNOWN = "declared", "kernel", "mask values", "no mask", "layout unknown"
"""Where a :class:`CoreOp`'s mask facts come from (:attr:`CoreOp.source`)."""


# --------------------------------------------------------------------------------------------------
# pairs
def useful_pairs(n_q: int, n_k: int, causal: bool, window: int | None) -> int:
    """(query, key) pairs a causal / sliding-window mask leaves; queries are the last
    n_q of n_k positions."""
    if window:
        offset = n_k - n_q
        return sum(min(offset + i + 1, window) for i in range(n_q))
    if causal:
        return n_q * n_k - n_q * (n_q - 1) // 2
    return n_q * n_k


def causal_half_pairs(n_q: int, n_k: int) -> Fraction:
    """The ``causal`` convention: ``n_q·n_k − n_q²/2`` pairs (``n²/2`` for square
    attention, as FlashAttention's benchmark, Megatron-LM and MaxText count it);
    queries are the last n_q of n_k positions (``n_k ≥ n_q``)."""
    return Fraction(2 * n_q * n_k - n_q * n_q, 2)


def pairs(attention: str, n_q: int, n_k: int, causal: bool, window: int | None) -> Fraction:
    """Pairs charged under ``attention`` for one (batch, head) of ``n_q`` queries over
    ``n_k`` keys, from the mask's facts (no mask values)."""
    check_attention(attention)
    if attention == CAUSAL and causal and n_k >= n_q:
        return causal_half_pairs(n_q, n_k)
    if attention == MASK:
        return Fraction(useful_pairs(n_q, n_k, causal and n_k >= n_q, window))
    return Fraction(n_q * n_k)


# --------------------------------------------------------------------------------------------------
# declared facts and kernel flags
def config_window(block: str, facts: ModelFacts) -> int | None:
    """The sliding window the config declares for this block's layer (``layer_types``
    when it has them)."""
    window = facts.declared(SLIDING_WINDOW)
    if window is None or facts.config_value("use_sliding_window") is False:
        return None
    layer_types = facts.config_value("layer_types")
    if isinstance(layer_types, (list, tuple)):
        index = next((int(part) for part in block.split(".") if part.isdigit()), None)
        if index is None or index >= len(layer_types) or "sliding" not in str(layer_types[index]):
            return None
    return window


def declared_mask(block: str, facts: ModelFacts) -> tuple[bool, int | None]:
    """(causal, window) a block declares: a module inside it with ``is_causal = True``;
    a module attribute ``sliding_window``, else the config's (:func:`config_window`)."""
    paths = inside(facts.types, block)
    causal = any(facts.attr(p, "is_causal") is True for p in paths)
    window = facts.declared(SLIDING_WINDOW, paths, config=False)
    return causal, window if window is not None else config_window(block, facts)


def kernel_flags(target: Any, args: Any, kwargs: Mapping[str, Any]) -> tuple[bool, int | None]:
    """(causal, window) an attention kernel was called with: ``is_causal`` / ``causal``,
    the efficient kernel's ``custom_mask_type`` (1 and 2 are causal),
    FlashAttention's ``window_size_left`` (xFormers' ``window_left``: W − 1 keys
    before)."""
    causal = bool(argument(target, args, kwargs, "is_causal", "causal"))
    mask_type = argument(target, args, kwargs, "custom_mask_type")
    causal = causal or (isinstance(mask_type, int) and mask_type > 0)
    left = argument(target, args, kwargs, "window_size_left", "window_left")
    return causal, left + 1 if isinstance(left, int) and left >= 0 else None


def kernel_is_causal(op: CapturedOp) -> bool:
    """An attention kernel called with ``is_causal`` (read by its schema's argument
    name)."""
    if op.kwargs.get("is_causal"):
        return True
    return op.spec is not None and op.spec.family is OpFamily.ATTENTION and kernel_flags(op.target, op.args,
                                                                                          op.kwargs)[0]


# --------------------------------------------------------------------------------------------------
# one core op
@dataclass(frozen=True)
class CoreOp:
    """One op of the attention core (any phase), with its pairs and the mask facts that
    price them.

    ``parts``: executed MACs per core role; ``n_q`` / ``n_k``: queries and keys per
    (batch, head) (``None``: not read from this layout, so every convention charges it
    executed); ``allowed``: the share of the ``batch·heads·n_q·n_k`` pairs the mask
    tensor allows, from its values (``None``: values unknown)."""

    node: str
    phase: str
    module_stack: tuple[str, ...]
    block: str
    parts: Mapping[str, int]
    n_q: int | None
    n_k: int | None
    causal: bool
    window: int | None
    allowed: Fraction | None
    source: str  # KERNEL, VALUES, DECLARED, UNMASKED or UNKNOWN
    # the op (``node`` is its name in the fx graph)
    record: CapturedOp = field(repr=False, compare=False)

    def share(self, attention: str) -> Fraction:
        """Pairs charged under ``attention`` over pairs executed."""
        if self.n_q is None or self.n_k is None or check_attention(attention) == EXECUTED:
            return Fraction(1)
        if attention == MASK and self.allowed is not None:
            return self.allowed
        return pairs(attention, self.n_q, self.n_k, self.causal, self.window) / (self.n_q * self.n_k)

    def macs(self, attention: str) -> dict[str, int]:
        """MACs per core role under ``attention`` (rounded down to whole MACs)."""
        share = self.share(attention)
        return {role: macs * share.numerator // share.denominator for role, macs in self.parts.items()}


def core_ops(ops: Sequence[CapturedOp], assignments: Mapping[CapturedOp, Assignment],
             facts: ModelFacts) -> tuple[CoreOp, ...]:
    """Every record of a capture (``ops``, in order) with attention-core MACs
    (``assignments``: ``{record: Assignment}``), with its pairs and mask facts
    (``facts``: what the model declares), found on the records' own dataflow.
    :meth:`Profile.attention_core` keeps it."""
    link(ops)
    parts_of = {op: assignment.parts for op, assignment in assignments.items()}
    masks = _Masks(ConstantValues())
    out = []
    for op, assignment in assignments.items():
        parts = {role: macs for role, macs in assignment.parts.items() if role in PAIR_ROLES and macs}
        if not parts:
            continue
        found = _facts_of(op, assignment.block, facts, parts_of, parts, masks)
        out.append(CoreOp(op.name, op.phase, tuple(frame.path for frame in op.module_stack),
                          assignment.block,
                          parts, *found, record=op))
    return tuple(out)


def parts_under(assignments: Mapping[CapturedOp, Assignment], core: Sequence[CoreOp] | None,
                attention: str) -> dict[CapturedOp, Mapping[str, int]]:
    """``{record: {role: MACs}}`` of every op that multiplies (``assignments``:
    ``{record: Assignment}``), its core roles priced under ``attention`` (``core``:
    :func:`core_ops`; not read for ``"executed"``)."""
    out: dict[CapturedOp, Mapping[str, int]] = {op: a.parts for op, a in assignments.items()}
    if check_attention(attention) == EXECUTED:
        return out
    for op in core or ():
        out[op.record] = {**out[op.record], **op.macs(attention)}
    return out


def saved(core: Sequence[CoreOp], attention: str, module: str = "",
          phase: str | None = None) -> int:
    """Executed MACs minus MACs under ``attention``, of the core ops inside ``module``
    (``""``: all) and ``phase``: what :meth:`Profile.total` subtracts."""
    if check_attention(attention) == EXECUTED:
        return 0
    return sum(sum(op.parts.values()) - sum(op.macs(attention).values()) for op in core
               if (module == "" or module in op.module_stack) and (phase is None or op.phase == phase))


def notes(core: Sequence[CoreOp], attention: str) -> list[str]:
    """What a convention could not establish from the run itself, one line per kind."""
    if check_attention(attention) == EXECUTED:
        return []
    out = []
    declared = sum(op.source == DECLARED for op in core)
    unknown = [op.node for op in core if op.source == UNKNOWN]
    if declared:
        out.append(f"attention={attention!r}: {declared} attention core op(s) priced from the "
                   "model's declared mask (a module's is_causal, the sliding window of the module "
                   "or config), not from mask values (a mask computed from data whose values the "
                   f"run did not keep, or one of more than {MAX_BYTES >> 20} MiB): padding is not "
                   "taken into account")
    if unknown:
        out.append(f"attention={attention!r}: {len(unknown)} attention core op(s) counted as "
                   "executed: their queries and keys were not read from the layout "
                   f"(variable-length or fused kernel): {', '.join(unknown[:3])}")
    return out


# --------------------------------------------------------------------------------------------------
Facts = tuple[int | None, int | None, bool, int | None, Fraction | None, str]


def _facts_of(op: CapturedOp, block: str, facts: ModelFacts,
              parts_of: Mapping[CapturedOp, Mapping[str, int]],
              parts: Mapping[str, int], masks: _Masks) -> Facts:
    """(n_q, n_k, causal, window, allowed share, source) of one core op."""
    declared_causal, declared_window = declared_mask(block, facts)
    spec = op.spec
    # a fused kernel: its own arguments say it all
    if spec is not None and spec.family is OpFamily.ATTENTION:
        geometry = _kernel_geometry(op)
        if geometry is None:
            return None, None, False, None, None, UNKNOWN
        n_q, n_k, scores_shape = geometry
        mask_mod = _flex_mask_mod(op)
        # FlexAttention: its block mask's mask_mod, evaluated at every pair
        if mask_mod is not None:
            return masks.facts(_flex_allowed(mask_mod, scores_shape), scores_shape, n_q, n_k,
                               declared_causal,
                               declared_window)
        causal, window = kernel_flags(op.target, op.args, op.kwargs)
        mask = argument(op.target, op.args, op.kwargs, "attn_mask", "attn_bias", "bias")
        if isinstance(mask, CapturedOp):
            return masks.facts(masks.allowed(mask), scores_shape, n_q, n_k, declared_causal,
                               declared_window)
        return n_q, n_k, causal, window, None, KERNEL if causal or window else UNMASKED
    # a backward GEMM runs over its forward op's pairs
    forward = op if op.phase == FORWARD else op.forward
    if forward is None or forward.spec is None or len(forward.spec.operands) != 2:
        return None, None, False, None, None, UNKNOWN
    a, b = (argument_shape(forward, i) for i in forward.spec.operands)
    scores = "attn_scores" in (parts_of.get(forward) or parts)
    if a is None or b is None or len(a) < 2 or len(b) < 2:
        return None, None, False, None, None, UNKNOWN
    n_q, n_k = (a[-2], b[-1]) if scores else (a[-2], a[-1])
    found = masks.eager(forward, scores, parts_of)
    if found is None:
        return n_q, n_k, declared_causal, declared_window, None, DECLARED
    allowed, shape = found
    return masks.facts(allowed, shape, n_q, n_k, declared_causal, declared_window)


_FLEX_BLOCK_MASK = 4
"""The position of FlexAttention's block mask (``BlockMask.as_tuple()``, its
``mask_mod`` last) among its op's arguments (query, key, value, score_mod, block mask,
scale, kernel options)."""
MAX_FLEX_PAIRS = 1 << 26
"""FlexAttention masks are evaluated at every (batch, head, query, key) up to this many
pairs (bytes of memory)."""


def _flex_mask_mod(op: CapturedOp) -> Any:
    """The ``mask_mod`` of a FlexAttention op (``None`` for any other op)."""
    if op.target is not FLEX_ATTENTION or len(op.args) <= _FLEX_BLOCK_MASK:
        return None
    block_mask = op.args[_FLEX_BLOCK_MASK]
    return block_mask[-1] if isinstance(block_mask, (tuple, list)) and block_mask and callable(block_mask[-1]) \
        else None


def _flex_allowed(mask_mod: Any, shape: tuple[int, ...]) -> torch.Tensor | None:
    """Which pairs a FlexAttention ``mask_mod`` allows, as a ``[B, h, n_q, n_k]``
    boolean tensor (``None`` for a grid above :data:`MAX_FLEX_PAIRS` or a mask_mod
    that cannot run outside the kernel)."""
    if len(shape) != 4 or shape[0] * shape[1] * shape[2] * shape[3] > MAX_FLEX_PAIRS:
        return None
    from torch.nn.attention.flex_attention import create_mask

    try:
        return create_mask(mask_mod, shape[0], shape[1], shape[2], shape[3], device="cpu")
    # a mask_mod reading tensors that only the run had (fake ones): the declaration
    # stands
    except Exception:
        return None


def _kernel_geometry(op: CapturedOp) -> tuple[int, int, tuple[int, ...]] | None:
    """(n_q, n_k, scores shape ``[*batch, heads, n_q, n_k]``) of a fused attention
    kernel, from q and k in the layout its registration declares
    (:meth:`~flopscope.formulas.registry.OpSpec.attention_geometry`)."""
    operands = op.spec.operands[:2] if op.spec is not None else ()
    if op.spec is None or len(operands) != 2:
        return None
    q, k = (argument_shape(op, i) for i in operands)
    if q is None or k is None:
        return None
    return op.spec.attention_geometry(q, k)


# --------------------------------------------------------------------------------------------------
# masks of eager attention: scores -> (scale) -> + mask / masked_fill / where -> softmax -> @ V
_SOFTMAX = frozenset(str(op) for op in SOFTMAX_OPS)  # by name, as the walks below read ops
_THROUGH = frozenset({"aten.view", "aten._unsafe_view", "aten.reshape", "aten.expand", "aten.clone",
                      "aten.mul",
                      "aten.div", "aten._to_copy", "aten.contiguous", "aten.detach", "aten.alias",
                      "aten.add",
                      "aten.sub", "aten.masked_fill", "aten.where", "aten.native_dropout",
                      "aten.dropout",
                      "aten.getitem", "aten.tanh", "aten.transpose", "aten.permute", "aten.squeeze",
                      "aten.unsqueeze"})
_STEPS = 12




def _name(node: Any) -> str:
    return node.op_name if isinstance(node, CapturedOp) else ""


_COPIES = frozenset(str(op) for op in VALUE_COPIES)  # their value is their first argument's
# op -> position of its fill value
_FILLS = {"aten.scalar_tensor": 0, "aten.full": 1, "aten.full_like": 1}
# a mask's values, unchanged
_PASS = ("aten.expand", "aten.clone", "aten.detach", "aten.alias", "aten.contiguous")
BLOCKING = -1e4
"""An additive mask's value at or below this removes a pair from the softmax (``-inf``,
a dtype's minimum)."""


class _Masks:
    """Mask facts read from the records' values: those the run kept, and those that
    follow from the capture alone
    (:class:`~flopscope.capture.constant_values.ConstantValues`: a mask made from
    sizes has the same values in real, fake and meta runs). One per :func:`core_ops`
    call: a model's layers share their masks' facts."""

    def __init__(self, values: ConstantValues) -> None:
        self.values = values
        self._facts: dict[tuple[int, tuple[int, ...], int, int], tuple[bool, int | None, Fraction]] = {}
        # the masks keyed by id() in _facts, alive while this object is
        self._held: list[torch.Tensor] = []

    # ---------------------------------------------------------------------------------------------
    def facts(self, allowed: torch.Tensor | None, shape: tuple[int, ...] | None, n_q: int, n_k: int,
              declared_causal: bool, declared_window: int | None) -> Facts:
        """Facts from a mask tensor (``allowed``: True where a pair is allowed): its
        values when known and broadcastable to the masked scores' ``shape``, else the
        declaration. Broadcasting repeats every value the same number of times, so
        the allowed share is the mask's own. A mask that allows no pair above the
        diagonal is causal; one that is exactly a causal band of W keys per query has
        window W (a declared window stands where the mask shows none because it is at
        least as wide as the keys)."""
        if allowed is None or shape is None or not math.prod(shape):
            return n_q, n_k, declared_causal, declared_window, None, DECLARED
        try:
            torch.broadcast_shapes(allowed.shape, tuple(shape))
        except RuntimeError:
            return n_q, n_k, declared_causal, declared_window, None, DECLARED
        key = (id(allowed), tuple(shape), n_q, n_k)
        found = self._facts.get(key)
        if found is None:
            count = int(allowed.count_nonzero())
            # (the pairs' grid)
            causal, window = (_band(allowed, count, n_q, n_k) if tuple(shape[-2:]) == (n_q, n_k)
                              else (False, None))
            found = self._facts[key] = (causal, window, Fraction(count, allowed.numel()))
            self._held.append(allowed)
        causal, window, share = found
        if causal and window is None and declared_window is not None and declared_window >= n_k:
            window = declared_window
        return n_q, n_k, causal, window, share, VALUES

    def value(self, node: Any) -> torch.Tensor | None:
        """The values of a record's output when known: kept by the run or evaluated from
        the capture."""
        return self.values(node) if isinstance(node, CapturedOp) else None

    # ---------------------------------------------------------------------------------------------
    def allowed(self, mask: CapturedOp) -> torch.Tensor | None:
        """Which pairs a mask operand allows (True), from known values: a boolean mask
        as is (``attn_mask``), an additive one built as ``where(mask, 0, -inf)`` /
        ``where(mask, -inf, 0)`` or made from constants (``full((n, n),
        -inf).triu(1)``: allowed where above :data:`BLOCKING`); None when the values
        are unknown."""
        node: Any = mask
        for _ in range(_STEPS):
            if not isinstance(node, CapturedOp):
                return None
            if node.value is not None and node.value.dtype == torch.bool:
                return node.value
            name = _name(node)
            if name == "aten.where" and len(node.args) == 3 and isinstance(node.args[0], CapturedOp):
                cond = self.allowed_values(node.args[0])
                if cond is not None:
                    if self.zero(node.args[1]) and self.blocking(node.args[2]):
                        return cond
                    if self.blocking(node.args[1]) and self.zero(node.args[2]):
                        return ~cond
            value = self.value(node)
            if value is not None:
                return value if value.dtype == torch.bool else value > BLOCKING
            if name not in _PASS:
                return None
            node = node.args[0] if node.args else None
        return None

    def allowed_values(self, node: CapturedOp) -> torch.Tensor | None:
        """The known boolean values of a condition tensor (through expand / clone /
        detach)."""
        current: Any = node
        for _ in range(_STEPS):
            if not isinstance(current, CapturedOp):
                return None
            value = self.value(current)
            if value is not None:
                return value.bool()
            if _name(current) not in _PASS:
                return None
            current = current.args[0] if current.args else None
        return None

    def number(self, value: Any) -> float | None:
        """``value`` as a number: a Python number; a tensor filled with one
        (``scalar_tensor``, ``full``, ``full_like``); a one-element constant
        (``torch.tensor(0.0)``, transformers' additive masks in 5.17) whose value is
        known; each through copies. Else ``None``."""
        for _ in range(_STEPS):
            if isinstance(value, (int, float)):
                return float(value)
            if not isinstance(value, CapturedOp):
                return None
            known = value.value if value.value is not None else (
                self.value(value) if value.output_shapes and not math.prod(value.output_shapes[0]) > 1 else None)
            if known is not None and known.numel() == 1 and known.is_floating_point():
                return float(known.item())
            name = _name(value)
            position = _FILLS.get(name, 0 if name in _COPIES else None)
            if position is None or len(value.args) <= position:
                return None
            value = value.args[position]
        return None

    def blocking(self, value: Any) -> bool:
        """A value that removes a pair from a softmax: a number at or below
        :data:`BLOCKING`, or a tensor made from one (see :meth:`number`)."""
        number = self.number(value)
        return number is not None and number <= BLOCKING

    def zero(self, value: Any) -> bool:
        return self.number(value) == 0 or (isinstance(value, CapturedOp)
                                           and _name(value) in ("aten.zeros", "aten.zeros_like"))

    # ---------------------------------------------------------------------------------------------
    def eager(self, core: CapturedOp, scores: bool, parts_of: Mapping[CapturedOp, Mapping[str, int]]
              ) -> tuple[torch.Tensor | None, tuple[int, ...] | None] | None:
        """The mask between a scores product and its softmax (found from the scores op,
        or back from the weighted sum through its probabilities): ``(allowed values
        or None, the masked scores' shape)``; None: no mask op."""
        softmax = _softmax_after(core) if scores else _softmax_before(core)
        if softmax is None:
            return None
        node, steps = softmax.args[0], 0
        while isinstance(node, CapturedOp) and steps < _STEPS and "attn_scores" not in parts_of.get(node, {}):
            name, steps = _name(node), steps + 1
            shape = tuple(node.output_shapes[0]) if node.output_shapes else None
            chain, others = _split(node, parts_of)
            if name in ("aten.add", "aten.sub") and others:
                return self.allowed(others[0]), shape
            if name == "aten.masked_fill" and len(node.args) > 1 and isinstance(node.args[1], CapturedOp):
                masked = self.allowed_values(node.args[1])
                return (~masked if masked is not None and self.blocking(node.args[2]) else None), shape
            if name == "aten.where" and len(node.args) == 3 and isinstance(node.args[0], CapturedOp):
                cond = self.allowed_values(node.args[0])
                keep_first = node.args[1] is chain
                blocked = node.args[2] if keep_first else node.args[1]
                if cond is None or not self.blocking(blocked):
                    return None, shape
                return (cond if keep_first else ~cond), shape
            if chain is None:
                return None
            node = chain
        return None


def _band(allowed: torch.Tensor, allowed_pairs: int, n_q: int, n_k: int) -> tuple[bool, int | None]:
    """(causal, window) of a boolean mask over ``n_q`` queries (the last of ``n_k``
    positions) and ``n_k`` keys that allows ``allowed_pairs`` pairs: causal when it
    allows some pair and none above the diagonal; window W when it is exactly the
    causal band of the W latest keys for every query and W < n_k (else ``None``)."""
    grid = torch.broadcast_to(allowed, torch.broadcast_shapes(allowed.shape, (n_q, n_k)))
    offset = n_k - n_q
    if not allowed_pairs or bool(torch.triu(grid, offset + 1).any()):
        return False, None
    # (in a band, the last query sees the most keys)
    widest = int(grid[..., -1, :].count_nonzero(-1).max())
    if widest >= n_k:
        return True, None
    # nothing before the window and as many pairs as the band has: exactly the band
    grids = grid.numel() // (n_q * n_k)
    pairs = allowed_pairs * (grid.numel() // allowed.numel())
    exact = not bool(torch.tril(grid, offset - widest).any()) and pairs == grids * useful_pairs(n_q, n_k, True, widest)
    return True, widest if exact else None


def _split(node: CapturedOp, parts_of: Mapping[CapturedOp, Mapping[str, int]]
           ) -> tuple[CapturedOp | None, list[CapturedOp]]:
    """(the tensor argument the scores flow through, the other tensor arguments) of an
    op on the chain."""
    tensors = [a for a in node.args if isinstance(a, CapturedOp)]
    if not tensors:
        return None, []
    chain = max(tensors, key=lambda a: (_reaches_scores(a, parts_of), _numel(a)))
    return chain, [a for a in tensors if a is not chain]


def _numel(node: CapturedOp) -> int:
    shapes = node.output_shapes
    size = 1
    for s in shapes[0] if shapes else ():
        size *= s
    return size


def _reaches_scores(node: CapturedOp, parts_of: Mapping[CapturedOp, Mapping[str, int]]) -> bool:
    for _ in range(_STEPS):
        if "attn_scores" in parts_of.get(node, {}):
            return True
        nxt = next((a for a in node.args if isinstance(a, CapturedOp)), None)
        if nxt is None:
            return False
        node = nxt
    return False


def _softmax_after(node: CapturedOp) -> CapturedOp | None:
    frontier = [node]
    for _ in range(_STEPS):
        following = [user for n in frontier for user in n.users if _name(user) in (*_THROUGH, *_SOFTMAX)]
        hit = next((n for n in following if _name(n) in _SOFTMAX), None)
        if hit is not None or not following:
            return hit
        frontier = following[:8]
    return None


def _softmax_before(node: CapturedOp) -> CapturedOp | None:
    current: Any = node.args[0] if node.args else None
    for _ in range(_STEPS):
        if not isinstance(current, CapturedOp) or _name(current) not in (*_THROUGH, *_SOFTMAX):
            return None
        if _name(current) in _SOFTMAX:
            return current
        current = current.args[0] if current.args else None
    return None
