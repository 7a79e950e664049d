"""Passes 6 to 8: what is left is ``other``, then the rules (docs/roles.md 3.6, 3.7).

- :func:`unclaimed_are_other` claims every multiply no pass claimed as ``other``;
- :func:`builtin_rules` forces :data:`~flopscope.attribute.rules.BUILTIN_RULES` on the
  unfused multiplies inside recurrent modules (it runs right after the first pass too);
- :func:`user_rules` forces the user's rules (``roles=`` of :func:`flopscope.profile`)
  on every multiply: they win.
"""

from __future__ import annotations

from ...role import Role, parse_role
from ..graph_view import GraphView
from ..rules import BUILTIN_RULES, RoleRule
from ..state import RoleState
from .family import FAMILY_ROLES


def unclaimed_are_other(view: GraphView, state: RoleState) -> None:
    """Every multiply no pass claimed is ``other``."""
    for n in view.nodes:
        if n.macs and n not in state.parts:
            state.claim(n, Role.OTHER)


def builtin_rules(view: GraphView, state: RoleState) -> None:
    """:data:`~flopscope.attribute.rules.BUILTIN_RULES` on the unfused multiplies (not
    on fused kernels, convolutions or Fourier transforms, whose roles are their own)."""
    _force_rules(view, state, BUILTIN_RULES, only_unfused=True)


def user_rules(view: GraphView, state: RoleState) -> None:
    """The user's rules (``state.rules``) on every multiply: they win."""
    _force_rules(view, state, state.rules, only_unfused=False)


def _force_rules(view: GraphView, state: RoleState, rules: tuple[RoleRule, ...],
                 only_unfused: bool) -> None:
    """Force ``rules`` on the multiplies inside matching modules (the first rule that
    matches wins; ``only_unfused``: not on fused kernels, convolutions or Fourier
    transforms)."""
    if not rules:
        return
    for n in [*state.parts, *(n for n in view.nodes if n.macs and n not in state.parts)]:
        spec = view.spec(n)
        if not n.macs or (only_unfused and (view.parts(n) or (spec and spec.family in FAMILY_ROLES))):
            continue
        op, stack = n.op_name, n.module_stack
        for rule in rules:
            if any(rule.matches(frame.path, state.module_types.get(frame.path), op) for frame in stack):
                state.force(n, {parse_role(rule.role).value: n.macs})
                break
