"""What reconciliation knows of one block (:class:`Block`) and what it writes
(:class:`ReconcileRow`), with the user's :class:`TransformerSpec`: the types the row
builders share. Units: MACs."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from ..capture.facts import ModelFacts
from ..capture.records import CapturedOp
from ..conventions import (
    LINEAR_IN,
    LINEAR_OUT,
    QUERY_INPUTS,
)
from ..formulas.registry import prod
from ..role import Role, RoleGroup, roles_in

ATTENTION_ROLES = tuple(sorted(roles_in(RoleGroup.ATTENTION), key=lambda r: r == Role.OUT_PROJ))
"""Attention rows in the order data flows through a block: projections, scores, weighted
sum, output."""
FFN_ROLES = roles_in(RoleGroup.FFN)
TERMS = {r.value: r.term for r in Role if r.term}


@dataclass(frozen=True)
class TransformerSpec:
    """Hyper-parameters stated by the user (they win over what the model declares).

    n: tokens per sequence (queries; keys too unless ``n_k``); d: model width; h: query
    heads; d_ff: FFN width; n_kv: key/value heads (default h); d_k: head width (default
    d / h); batch: sequences; causal / window: the attention mask, for the useful-work
    column.
    """

    n: int | None = None
    d: int | None = None
    h: int | None = None
    d_ff: int | None = None
    n_kv: int | None = None
    d_k: int | None = None
    n_k: int | None = None
    batch: int | None = None
    gated: bool | None = None
    causal: bool | None = None
    window: int | None = None


@dataclass(frozen=True)
class ReconcileRow:
    block: str  # module path of the block instance ("" is the root)
    role: str
    measured: int  # MACs executed
    predicted: int | None  # MACs of the closed form (None: no prediction for this role)
    term: str  # the complexity term it realises: "n·d²", "n²·d", "k·n·d²", "r·n·d"
    # MACs the mask leaves useful (attention core; None: same as executed)
    useful: int | None = None
    reason: str = ""  # why measured != predicted, when it is not
    basis: str = ""  # the hyper-parameters behind the prediction and where they came from

    @property
    def ratio(self) -> Fraction | None:
        """measured / predicted, exactly (``None`` without a prediction)."""
        if self.predicted is None:
            return None
        if self.predicted == 0:
            return Fraction(1) if self.measured == 0 else None
        return Fraction(self.measured, self.predicted)

    @property
    def exact(self) -> bool:
        return self.ratio == 1


InputShapes = tuple[tuple[int | str, tuple[int, ...]], ...]


def calls_by_path(inputs: Mapping[Any, InputShapes]) -> dict[str, list[InputShapes]]:
    out: dict[str, list[InputShapes]] = defaultdict(list)
    for call, shapes in inputs.items():
        out[call.path].append(shapes)
    return out


@dataclass(frozen=True)
class Block:
    """What a row builder knows of one block: its path, measured MACs per role, the
    model's facts, the input shapes of each call of the block, the user's spec, and
    which modules ran each role."""

    path: str
    measured: Mapping[str, int]
    facts: ModelFacts
    calls: list[InputShapes]
    spec: TransformerSpec | None
    causal_kernel: bool
    role_modules: Mapping[str, set[str]]
    # every module's calls (a projection's own inputs)
    module_calls: Mapping[str, list[InputShapes]]
    # the block's forward ops with multiplies (what ran: for the reasons only)
    ops: Sequence[CapturedOp] = ()
    # modules that are factors of the projections they feed (roles 3.5)
    factors: frozenset[str] = frozenset()

    def linear_calls(self, role: str) -> list[LinearCalls] | None:
        """Each module that ran ``role`` in this block, as a linear layer with its
        declared widths and the (batch, tokens) of each of its calls; ``None`` unless
        every one declares its widths and was called on inputs of its declared width."""
        found = []
        for path in sorted(self.role_modules.get(role, set())):
            width_in = self.facts.declared(LINEAR_IN, [path], config=False)
            width_out = self.facts.declared(LINEAR_OUT, [path], config=False)
            calls = [batch_and_length(shapes, width_in, (0, *QUERY_INPUTS)) if width_in else None
                     for shapes in self.module_calls.get(path, [])]
            if width_in is None or width_out is None or not calls or any(c is None for c in calls):
                return None
            found.append(LinearCalls(path, width_in, width_out,
                                     [c for c in calls if c is not None]))
        return found or None

    def unrecognised(self, roles: Sequence[str], why: str = "") -> list[ReconcileRow]:
        """Rows without a prediction, saying why."""
        reason = "unrecognised block" + (f": {why}" if why else "")
        return [ReconcileRow(self.path, r, self.measured.get(r, 0), None, TERMS[r], reason=reason) for r in roles]


@dataclass(frozen=True)
class LinearCalls:
    """A linear layer that ran one role: its declared widths and the (batch, tokens) of
    each call's input."""

    path: str
    width_in: int
    width_out: int
    calls: list[tuple[int, int]]

    def macs(self, width_in: int | None = None) -> int:
        """B·n·in·out summed over its calls (``width_in``: the rows that belong to the
        role, where its input is a concatenation)."""
        return sum(batch * n for batch, n in self.calls) * (width_in or self.width_in) * self.width_out


def own_linear_width(b: Block, role: str) -> int | None:
    """The declared output width of the one linear layer that ran ``role`` in this
    block, where it runs that role alone (not a fused q/k/v projection)."""
    modules = b.role_modules.get(role, set())
    if len(modules) != 1 or any(modules == b.role_modules.get(other) for other in ("q_proj", "k_proj", "v_proj")
                                if other != role):
        return None
    return b.facts.declared(LINEAR_OUT, list(modules), config=False)


def batch_and_length(shapes: InputShapes, width: int, names: Sequence[int | str],
                     seq_first: bool = False
                      ) -> tuple[int, int] | None:
    """(batch, length) of the first named input whose last dim is ``width``."""
    by_key = dict(shapes)
    for name in names:
        shape = by_key.get(name)
        if shape is not None and len(shape) >= 2 and shape[-1] == width:
            if seq_first and len(shape) == 3:
                return shape[1], shape[0]
            return prod(shape[:-2]), shape[-2]
        if shape is not None and len(shape) == 1 and shape[-1] == width:
            return 1, 1
    return None
