"""Autograd links: the forward op each backward or recomputed op belongs to.

Autograd numbers the nodes it makes (sequence numbers). :class:`AutogradLinks` maps the
number of the node made for each recorded forward op to its record; in the backward
pass, the node running tells which forward op a backward op differentiates
(:meth:`AutogradLinks.forward_op`). A recomputed op (a reentrant activation checkpoint)
is matched to the forward op it repeats (:meth:`AutogradLinks.match_twin`). A DTensor
op's node is made for the DTensor op, before the local op the recorder records: that
link is deferred to the local op (:meth:`AutogradLinks.defer`).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

from ..records import BACKWARD, FORWARD, RECOMPUTE, CapturedOp


def phase_now(backward: bool) -> str:
    """The phase of an op dispatched now: the forward's, or in the backward pass
    (``backward``) a recompute's where grad mode is on, else the backward's."""
    return FORWARD if not backward else RECOMPUTE if torch.is_grad_enabled() else BACKWARD


class AutogradLinks:
    """Forward records by autograd sequence number, and recomputed ops matched to their
    forward ops.

    Args:
        ops: the recorder's records (where a recompute's twins are looked for).
    """

    def __init__(self, ops: list[CapturedOp]) -> None:
        self.by_sequence_nr: dict[int, CapturedOp] = {}
        """Autograd sequence number -> forward op."""
        self.deferred: tuple[Any, int] | None = None
        """A DTensor op left to DTensor: (op, autograd sequence number)."""
        self._twins: dict[tuple[Any, ...], list[CapturedOp]] | None = None
        """Recompute key -> forward ops (built at the first recompute op)."""
        self._replayed: Counter[tuple[Any, ...]] = Counter()
        """Recompute key -> recompute ops matched so far."""
        self._ops = ops

    def defer(self, func: Any) -> None:
        """DTensor made its autograd node for ``func``: the local op of the same
        overload that follows is the one it differentiates."""
        self.deferred = (func, torch.autograd._get_sequence_nr() - 1)

    def differentiated(self, op: CapturedOp) -> None:
        """The autograd node made last (just before ``op`` ran) differentiates
        ``op``."""
        self.by_sequence_nr[torch.autograd._get_sequence_nr() - 1] = op

    def link(self, op: CapturedOp, func: Any, forward_op: CapturedOp | None, recompute: bool,
             backward: bool,
             inputs_need_grad: bool) -> None:
        """Link ``op``, just recorded, to autograd. In the backward pass: to
        ``forward_op``, the forward op whose node runs, or if it is a ``recompute``, to
        the forward op it repeats. In a forward (or a recompute) whose inputs need grad:
        its node, made just before it was dispatched, to ``op``."""
        if recompute:
            self.match_twin(op)
        elif backward:
            op.forward = forward_op
        if self.deferred is not None and self.deferred[0] is func:
            self.by_sequence_nr[self.deferred[1]] = op
            self.deferred = None
        elif inputs_need_grad and (recompute or not backward):
            # a recomputed op's node is differentiated by a reentrant checkpoint: its
            # gradient belongs to the forward op it repeats
            self.differentiated(op.forward if recompute and op.forward else op)

    def forward_op(self) -> CapturedOp | None:
        """The forward op whose autograd node is running now (backward pass), if it was
        recorded."""
        grad_fn = torch._C._current_autograd_node()
        return None if grad_fn is None else self.by_sequence_nr.get(grad_fn._sequence_nr())

    def match_twin(self, op: CapturedOp) -> None:
        """A recompute op takes the forward op it repeats (same op, input shapes and
        innermost module; the k-th repeat of a key matches the k-th forward op of that
        key, cyclically) as ``forward``, and that op's module stack: a re-run module
        call is the same call."""
        if self._twins is None:
            self._twins = {}
            for earlier in self._ops:
                if earlier.phase == FORWARD and earlier.node_op == "call_function":
                    self._twins.setdefault(_twin_key(earlier), []).append(earlier)
        key = _twin_key(op)
        twins = self._twins.get(key)
        if twins:
            twin = twins[self._replayed[key] % len(twins)]
            self._replayed[key] += 1
            op.forward, op.module_stack = twin, twin.module_stack
            # the getters of a tuple output follow the op
            for getter in reversed(self._ops):
                if getter is op:
                    break
                getter.module_stack = twin.module_stack


def _twin_key(op: CapturedOp) -> tuple[Any, ...]:
    # shapes as text: a symbolic size (torch.SymInt) is not hashable
    return op.target, str(op.input_shapes), op.module_stack[-1].path if op.module_stack else None
