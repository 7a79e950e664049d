"""Semantic roles: which multiplies are Q/K/V projections, attention scores, FFN,
convolution, ...

- :func:`find_roles`: the role split of every record with multiplies, forward and
  backward;
- :class:`Assignment`: one record's roles (``{role: MACs}``) and its block;
- :class:`~flopscope.attribute.rules.RoleRule` (from :mod:`.rules`): a role forced by
  module.

The passes run in the order of :data:`~flopscope.attribute.pipeline.PIPELINE` (its
docstring says what each finds; definitions in docs/roles.md). A backward op takes the
roles of the forward op whose autograd node ran it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from ..capture.records import CapturedOp
from ..role import Role
from .columns import scale_parts
from .graph_view import GraphView
from .paths import common_path
from .pipeline import PIPELINE
from .rules import RoleRule
from .state import RoleState

__all__ = ["Assignment", "RoleRule", "find_roles"]


@dataclass(frozen=True)
class Assignment:
    """Roles of one multiply node: ``{role: MACs}``, summing to its multiplies."""

    parts: Mapping[str, int]  # read-only
    block: str  # module path of the attention / FFN / conv block instance it belongs to
    # a factor of projections it feeds (section 3.5): its tokens are theirs, not more
    # tokens
    factor: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "parts", MappingProxyType(dict(self.parts)))

    @property
    def role(self) -> str:
        """The role with most MACs."""
        return max(self.parts, key=self.parts.__getitem__)


def find_roles(ops: Sequence[CapturedOp], module_types: Mapping[str, type],
               rules: Sequence[RoleRule] = ()
               ) -> dict[CapturedOp, Assignment]:
    """The role split of every record with multiplies (forward and backward) of a
    capture (its ops in order)."""
    view = GraphView(ops)
    state = RoleState(module_types, tuple(rules))
    for step in PIPELINE:
        step(view, state)
        state.settle(view)
    forward = _with_blocks(view, state)
    return {**forward, **_backward(view, forward)}


def _with_blocks(view: GraphView, state: RoleState) -> dict[CapturedOp, Assignment]:
    """Each claim with its block: the deepest module enclosing its group (the first
    group that has it), else its own module."""
    blocks: dict[CapturedOp, str] = {}
    for members in state.groups:
        block = common_path([m for m in (n.module for n in members) if m is not None])
        for n in members:
            blocks.setdefault(n, block)
    return {n: Assignment(dict(parts), blocks.get(n, n.module or ""), n in state.factors)
            for n, parts in state.parts.items()}


def _backward(view: GraphView,
              forward: Mapping[CapturedOp, Assignment]) -> dict[CapturedOp, Assignment]:
    """A backward op takes the roles of the forward op whose autograd node ran it, in
    the same proportions (a fused QKV projection's gradient GEMMs split like the
    projection); a fused backward kernel with its own parts (SDPA backward) keeps
    them."""
    out = {}
    for n in view.backward_nodes:
        macs = n.macs
        if not macs:
            continue
        source = forward.get(n.forward) if n.forward is not None else None
        if n.parts:
            parts = dict(n.parts)
        elif source is not None and any(source.parts.values()):
            parts = scale_parts(source.parts, macs)
        else:
            parts = {Role.OTHER.value: macs}
        if source is not None:
            out[n] = Assignment(parts, source.block)
        else:
            out[n] = Assignment(parts, (n.forward.module if n.forward is not None else None) or "")
    return out
