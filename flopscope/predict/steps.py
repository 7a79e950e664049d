"""Generation, step by step, from the captured data (:mod:`flopscope.generation` is the
public module): each forward of the model in a profiler block is a step (prefill or
decode).

Wrap ``model.generate(...)`` (or any loop of forwards) in :class:`flopscope.profiler`
and ask :meth:`Profile.steps` for one :class:`Step` per call of the root module, and
:meth:`Profile.decode_scaling` for the decode steps' exact MACs per sequence as a
polynomial in the context length.

What a step's fields are read from (no cache object is read, so any cache class works):

- ``tokens``: new positions per sequence: the last dimension of the call's token ids
  (``decoder_input_ids``, ``input_ids`` or a 2-D first argument), else the queries of
  the attention core;
- ``context``: the keys of the attention core's own operands (of the scores product or
  of a fused attention kernel): the positions the kernels attend over, cached and new.
  That is executed work: a static cache's kernels attend over the whole buffer (masked),
  so its context is the buffer's length at every step. A step whose model has no
  attention core found has ``context = None``: the KV-cache split is unknown;
- ``batch``: the leading dimension of the first tensor input of the call;
- ``phase``: ``"decode"`` when a step brings one new position per sequence and attends
  to more, else ``"prefill"``;
- ``kv_macs`` / ``kv_bytes``: the attention core's MACs and bytes (scores and weighted
  sum), the part of the step that grows with the context because it reads the KV cache;
  the rest is per new token.

``attention`` (:meth:`Profile.steps`, :meth:`Profile.decode_scaling`): the convention of
the attention core's MACs (``macs``, ``by_role``, ``kv_macs``): ``"executed"``
(default), ``"causal"`` or ``"mask"`` (:mod:`flopscope.predict.attention`); bytes stay
what the kernels move.

Units: MACs and bytes (FLOPs = 2 x MACs, ``Step.flops``); ``seconds`` is the wall time
of the call (real mode).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..attribute.columns import scale_parts
from ..attribute.roles import Assignment
from ..capture.module_tracker import ModuleCall
from ..capture.records import CapturedOp, LeafKind, argument_shape, link
from ..conventions import TOKEN_INPUTS
from ..errors import FlopscopeError
from ..formulas.registry import OpFamily
from ..formulas.traffic import GATHER, VIEW, access_of
from ..role import PAIR_ROLES, ROLE_ORDER, Role
from .exact_sum import SumsBy, exact_sum
from .polynomial import Scaling, interpolate

PREFILL, DECODE = "prefill", "decode"


@dataclass(frozen=True)
class Step:
    """One forward of the profiled model (one call of its root module)."""

    step: int  # 1 for the first forward in the block
    phase: str  # "prefill" or "decode"
    batch: int | None  # sequences in the call
    tokens: int | None  # new positions per sequence
    # positions each new one attends to (cached + new); None: no attention core found
    context: int | None
    macs: int
    by_role: Mapping[str, int] = field(default_factory=dict)
    bytes: int = 0
    kv_macs: int = 0  # attention core (scores + weighted sum): grows with the context
    kv_bytes: int = 0
    seconds: float | None = None  # real mode: wall time of the call

    @property
    def flops(self) -> int:
        return 2 * self.macs

    def row(self) -> dict[str, Any]:
        """The step as a plain dict (JSON, tables)."""
        return {"step": self.step, "phase": self.phase, "batch": self.batch, "tokens": self.tokens,
                "context": self.context, "macs": self.macs, "flops": self.flops,
                "bytes": self.bytes,
                "kv_macs": self.kv_macs, "kv_bytes": self.kv_bytes, "seconds": self.seconds,
                "by_role": dict(self.by_role)}


def steps(ops: Sequence[CapturedOp], assignments: Mapping[CapturedOp, Assignment],
          priced: Mapping[CapturedOp, Mapping[str, int]],
          inputs: Mapping[ModuleCall, tuple[tuple[int | str, tuple[int, ...]], ...]],
          seconds: Mapping[int, float]) -> list[Step]:
    """One :class:`Step` per call of the root module, in order (see the module
    docstring), from the captured records ``ops`` (in order), their ``{record:
    Assignment}``, each record's ``{role: MACs}`` under the chosen attention
    convention (``priced``: :func:`flopscope.predict.attention.parts_under`), the
    module calls' input shapes and the root calls' wall times."""
    macs: SumsBy[tuple[int, str]] = SumsBy()
    moved: SumsBy[int] = SumsBy()
    kv_bytes: SumsBy[int] = SumsBy()
    # call -> (new positions, context) of its widest attention core
    shapes: dict[int, tuple[int, int]] = {}
    for op in ops:
        call = root_call(op)
        if call is None:
            continue
        moved.add(call, op.bytes)
        assignment = assignments.get(op)
        if assignment is None:
            continue
        for role, value in priced[op].items():
            macs.add((call, role), value)
        core = {role: v for role, v in assignment.parts.items() if role in PAIR_ROLES and v}
        if core and op.bytes:
            kv_bytes.add(call, exact_sum(scale_parts(assignment.parts, op.bytes)[role] for role in core))
        seen = _queries_and_keys(op) if Role.ATTN_SCORES.value in core else None
        if seen is not None and (call not in shapes or seen[1] > shapes[call][1]):
            shapes[call] = seen
    out = []
    by_call = macs.totals()
    for call in sorted({c for c, _ in by_call} | set(moved.keys()) | {c.call for c in inputs if c.path == ""}):
        given = dict(inputs.get(_root(call), ()))
        first = next(iter(given.values()), None)
        batch = first[0] if first else None
        queries, context = shapes.get(call, (None, None))
        ids = next((given[key] for key in TOKEN_INPUTS if key in given and len(given[key]) == 2),
                   None)
        tokens = ids[1] if ids is not None else queries
        by_role = {role: by_call[call, role] for role in ROLE_ORDER if by_call.get((call, role))}
        phase = DECODE if tokens == 1 and context is not None and context > 1 else PREFILL
        out.append(Step(call, phase, batch, tokens, context, exact_sum(by_role.values()), by_role,
                        moved.total(call),
                        exact_sum(by_role.get(role, 0) for role in PAIR_ROLES), kv_bytes.total(call),
                        seconds.get(call)))
    return out


def decode_scaling(found: Sequence[Step]) -> Scaling:
    """The decode steps' MACs **per sequence** by role as exact polynomials in the
    context length (checked at every decode step beyond the degree; ``None`` for a
    role that is not a polynomial of degree <= count - 2). Needs at least three
    decode steps of distinct contexts (a linear term checked once)."""
    by_context: dict[int, Mapping[str, int]] = {}
    for step in found:
        if step.phase != DECODE or step.context is None or not step.batch:
            continue
        per_sequence = {role: v // step.batch for role, v in step.by_role.items()}
        if any(v % step.batch for v in step.by_role.values()):
            raise FlopscopeError(f"decode step {step.step}: MACs do not divide by its batch of "
                                 f"{step.batch}")
        by_context.setdefault(step.context, per_sequence)
    contexts = sorted(by_context)
    if len(contexts) == 1 and len([s for s in found if s.phase == DECODE]) > 1:
        raise FlopscopeError(f"every decode step attends over the same {contexts[0]} positions (a "
                             "static cache: its kernels run over the whole buffer), so a decode "
                             "step's cost does not depend on the context; see steps()")
    if len(contexts) < 3:
        raise FlopscopeError("decode_scaling needs decode steps at 3 or more distinct contexts; "
                             f"got {contexts or 'none'} (generate more new tokens, with a KV cache)")
    roles = [role for role in ROLE_ORDER if any(by_context[c].get(role) for c in contexts)]
    measured = {role: tuple(by_context[c].get(role, 0) for c in contexts) for role in roles}
    return Scaling(tuple(contexts), measured,
                   {role: interpolate(contexts, list(v)) for role, v in measured.items()},
                   {})


_STATE = (LeafKind.PARAMETER, LeafKind.BUFFER)


def weight_bytes(ops: Sequence[CapturedOp], call: int) -> int:
    """Bytes of the model's state (parameters and buffers) the records of one call of the
    root module read: an op reading a parameter or buffer, or a view of one (a transposed
    or sliced weight), reads that tensor once, as its bytes count it
    (:mod:`flopscope.formulas.traffic`); a gather (an embedding lookup) reads rows, not
    its table, and is left out. The part of a step's bytes that a batch of requests reads
    once, not once per request. Units: bytes."""
    link(ops)
    total = 0
    for op in ops:
        if op.leaf is not None or op.node_op != "call_function" or root_call(op) != call or \
                access_of(op.target) in (VIEW, GATHER):
            continue
        for given in op.inputs:
            source = given
            while source.leaf is None and source.inputs and access_of(source.target) == VIEW:
                source = source.inputs[0]
            if source.leaf in _STATE and given.output_shapes and given.dtype is not None:
                total += math.prod(given.output_shapes[0]) * given.dtype.itemsize
    return total


def _root(call: int) -> ModuleCall:
    return ModuleCall("", call)


def root_call(op: CapturedOp) -> int | None:
    """Which call of the root module ran ``op`` (a :class:`Step`'s ``step``; ``None``
    for a leaf or an op outside it)."""
    stack = op.module_stack
    return stack[0].call if stack and stack[0].path == "" else None


def _queries_and_keys(op: CapturedOp) -> tuple[int, int] | None:
    """(query positions, key positions) of an attention-scores op, from its operands'
    shapes."""
    spec = op.spec
    if spec is None or not spec.operands:
        return None
    shapes = [argument_shape(op, i) for i in spec.operands[:2]]
    a, b = shapes
    if a is None or b is None or len(a) < 2 or len(b) < 2:
        return None
    # in the kernel's declared layout (FlashAttention's [B, n, heads, d])
    if spec.family is OpFamily.ATTENTION:
        geometry = spec.attention_geometry(a, b)
        return None if geometry is None else geometry[:2]
    return a[-2], b[-1]  # q [..., n_q, d] @ kᵀ [..., d, n_k]

