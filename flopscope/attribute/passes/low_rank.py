"""Pass 5, low-rank updates and factored projections (docs/roles.md section 3.5).

- :func:`low_rank_updates`: a weight-matmul chain from a projection's input added to its
  output (LoRA's ``B·A``) takes the projection's roles;
- :func:`factored_projections`: a weight matmul only attention projections read (MLA's
  latents) takes their roles, split by the columns reaching each;
- :func:`output_factors`: the only reader of an output projection's result is
  ``out_proj`` too.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ...capture.records import CapturedOp
from ...role import ROLE_ORDER, Role
from ..columns import scale_parts
from ..graph_view import SUM_OPS, GraphView, reach
from ..state import PROJECTION_ROLES, RoleState
from ._walks import SELECTIONS, is_random, nearest_before, pass_through_root, passes_activation

aten = torch.ops.aten


def low_rank_updates(view: GraphView, state: RoleState) -> None:
    """A chain of weight matmuls that starts from a projection's input and whose result
    is added to the projection's output is part of that projection:
    ``W·x + B·(A·x) = (W + B·A)·x``. It takes the projection's roles, in the
    projection's proportions: LoRA's ``lora_B`` and ``lora_A`` (DoRA's and rsLoRA's
    too, which scale the two results before the sum) on every projection, whichever
    factor an earlier pass found (``lora_A`` of an output projection or FFN down
    projection reads the same input as the projection; ``lora_B`` of an up projection
    is behind the same activation), and a weight split in two (``W₁·x + W₂·x``)."""
    if all(state.claimed(n) for n in view.nodes if n.macs and view.is_weight_matmul(n)):
        return  # nothing left to take a role (a model without adapters)
    for p in view.nodes:
        roles = state.parts.get(p)
        if not roles or not view.is_weight_matmul(p) or set(roles) <= {Role.OTHER.value}:
            continue
        source = pass_through_root(view, view.activation_operand(p))
        width = p.output_shapes[0][-1:]
        for total in _first_sums(view, p):
            for operand in view.inputs(total):
                copies = _scaled_from(view, operand)
                last = copies[-1]  # the update is a scaled copy of the last link's result
                if p in copies or not last.macs or last.output_shapes[0][-1:] != width:
                    continue  # (an update has the projection's output columns)
                for m in _chain_from(view, state, last, source, roles):
                    if m not in state.parts and m not in state.demands:
                        state.claim(m, scale_parts(roles, m.macs))
                        _join_group(state, p, m)


def _scaled_from(view: GraphView, n: CapturedOp) -> list[CapturedOp]:
    """The records ``n`` is ``x`` of, walking back through ops without multiplies that
    take one input depending on the forward inputs (views, casts, dropout, a scale by
    a constant or by weights: ``x * scaling``, ``mag_norm_scale * x``): ``n`` is a
    scaled copy of each of them."""
    found = [n]
    while not n.macs:
        dynamic = [x for x in view.inputs(n) if view.dynamic[x] and not is_random(view, x)]
        if len(dynamic) != 1 or view.packet(n) in SUM_OPS or (n.elementwise and n.elementwise[0] != "pointwise"):
            break
        n = dynamic[0]
        found.append(n)
    return found


def _first_sums(view: GraphView, p: CapturedOp) -> list[CapturedOp]:
    """The sums that take a scaled copy of ``p``'s output (:func:`_scaled_from`) and
    another dynamic value."""
    return [s for s in reach(view.users(p), view.users,
                             lambda x: not x.macs and view.packet(x) not in SUM_OPS)
            if view.packet(s) in SUM_OPS and any(p in _scaled_from(view, x) for x in view.inputs(s))
            and sum(view.dynamic[x] for x in view.inputs(s)) >= 2]


def _chain_from(view: GraphView, state: RoleState, last: CapturedOp, source: CapturedOp,
                roles: Mapping[str, int],
                depth: int = 3) -> list[CapturedOp]:
    """``last`` and the weight matmuls behind it, when they form a chain that starts
    from ``source`` (every multiply nearest behind each link is a weight matmul
    unclaimed or claimed with the projection's roles, no activation function between
    links, the first link reads ``source``); else nothing."""
    claimed = state.parts.get(last)
    if (not view.is_weight_matmul(last) or depth == 0 or last in state.demands
            or (claimed is not None and set(claimed) != set(roles))):
        return []
    start = view.activation_operand(last)
    if pass_through_root(view, start) is source:
        return [last]
    if passes_activation(view, start):
        return []
    behind = nearest_before(view, start)
    chains = []
    for m in behind:
        chain = _chain_from(view, state, m, source, roles, depth - 1)
        if not chain:
            return []
        chains.append(chain)
    return [last, *(m for chain in chains for m in chain)] if chains else []


def _join_group(state: RoleState, member: CapturedOp, new: CapturedOp) -> None:
    """Put ``new`` in the first block instance that has ``member``."""
    for group in state.groups:
        if member in group:
            group.add(new)
            return




def factored_projections(view: GraphView, state: RoleState) -> None:
    """A weight matmul whose output only attention projections read (through ops without
    multiplies, normalisations included) is a factor of those projections and takes
    their roles: the low-rank query and key / value factors of multi-head latent
    attention (DeepSeek's ``q_a_proj`` before ``q_b_proj``), a LoRA adapter's first
    matrix. A reader whose result only selects (:func:`_only_selects`: a
    sparse-attention indexer's query projection beside ``q_b_proj``) does not keep a
    matmul from being a factor. A factor feeding projections of several roles (MLA's
    key / value latent, which ``kv_b_proj`` expands into keys and values) is split by
    the columns reaching each; a column shared by keys and values counts as
    ``k_proj``, the first in role order (docs/roles.md, section 3.5). A matmul read
    by the projections of several attention instances is not one attention's factor:
    it stays for the later passes."""
    for n in view.nodes:
        if not n.macs or state.claimed(n) or not view.is_weight_matmul(n):
            continue
        readers = view.frontier(view.users(n), view.users)
        selectors = [r for r in readers if not _projection_roles(state, r)]
        readers = [r for r in readers if _projection_roles(state, r)]
        if not readers or not all(_only_selects(view, r) for r in selectors) or not _only_itself(view, n):
            continue
        owners = {next((i for i, group in enumerate(state.groups) if r in group), None) for r in readers}
        if len(owners - {None}) > 1:
            # read by the projections of several attentions: an input embedding they
            # share (every block's text keys and values from one text projection), no
            # factor of one attention's projections
            continue
        state.factors.add(n)
        for r in readers:
            target = view.activation_operand(r)
            for role in sorted(_projection_roles(state, r), key=ROLE_ORDER.index):
                state.demand(n, target, role)
        for group in state.groups:  # one attention instance with the projections it factors
            if any(r in group for r in readers):
                group.add(n)
                break


def _only_selects(view: GraphView, r: CapturedOp) -> bool:
    """``r``'s result only selects: every path from it (through any ops, multiplies
    included) ends in a selection (:data:`SELECTIONS`), never reaching a weight
    matmul or the output. DeepSeek-V3.2's sparse-attention indexer, whose scores pick
    each query's keys with a top-k, reads the query latent beside ``q_b_proj``."""
    found = False
    for n in reach(view.users(r), view.users, lambda n: view.packet(n) not in SELECTIONS):
        if view.packet(n) in SELECTIONS:
            found = True
        elif view.is_weight_matmul(n) or not view.users(n):
            return False
    return found


def output_factors(view: GraphView, state: RoleState) -> None:
    """A weight matmul that is the only reader of an output projection's result, and
    reads nothing else (through ops without multiplies that combine it with no other
    activation), is that projection's second factor: ``out_proj`` too (DeepSeek-V4's
    grouped low-rank output projection, ``o_b_proj(o_a_proj(attention))``)."""
    for n in view.nodes:
        if not n.macs or state.claimed(n) or not view.is_weight_matmul(n):
            continue
        before = nearest_before(view, view.activation_operand(n))
        if not before or not all(state.roles_of(m) == {Role.OUT_PROJ.value} and _only_itself(view, m)
                                 and view.frontier(view.users(m), view.users) == [n] for m in before):
            continue
        state.claim(n, Role.OUT_PROJ)
        for group in state.groups:
            if any(m in group for m in before):
                group.add(n)
                break


def _only_itself(view: GraphView, n: CapturedOp) -> bool:
    """The ops without multiplies between ``n`` and the multiplies that read it combine
    its value with nothing else that depends on the inputs (a norm of it, weights and
    constants only): the value is ``n``'s, transformed. A modulation (adaLN's
    ``norm(x) * (1 + scale) + shift`` with ``scale`` and ``shift`` from ``n``) is
    not: there ``n`` conditions another value, and is no factor of the projections
    that read the result."""
    between = {x for x in reach(view.users(n), view.users, lambda x: not x.macs) if not x.macs}
    return all(not view.dynamic[i] or i is n or i in between for x in between for i in view.inputs(x))


def _projection_roles(state: RoleState, n: CapturedOp) -> set[str]:
    """The attention projection roles of ``n`` (empty unless all its roles are
    projection roles)."""
    roles = {role for role, macs in state.parts.get(n, {}).items() if macs}
    return roles if roles and roles <= PROJECTION_ROLES else set()
