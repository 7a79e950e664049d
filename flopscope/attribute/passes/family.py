"""Pass 1, by op family, and the weight work after it (docs/roles.md 3.1 and 3.5).

- :func:`by_family` claims every fused kernel with its formula's parts, every
  convolution as ``conv`` and every Fourier transform as ``token_mixing``
  (:data:`FAMILY_ROLES`).
- :func:`weight_work` claims as ``other`` the products that compute a weight from an
  identity matrix, on no input (DoRA's weight norm), before any pass takes them for
  projections.
"""

from __future__ import annotations

import torch

from ...capture.records import CapturedOp
from ...formulas.registry import OpFamily
from ...role import Role
from ..graph_view import GraphView
from ..state import RoleState

aten = torch.ops.aten

FAMILY_ROLES = {OpFamily.CONV: Role.CONV, OpFamily.TRANSFORM: Role.TOKEN_MIXING}
"""Families whose every op has one role of its own, whatever the dataflow around it."""


def by_family(view: GraphView, state: RoleState) -> None:
    """Fused kernels keep their formula's parts; convolutions are ``conv``, Fourier
    transforms ``token_mixing`` (:data:`FAMILY_ROLES`)."""
    for n in view.nodes:
        if not n.macs:
            continue
        parts = view.parts(n)
        spec = view.spec(n)
        if parts:
            state.claim(n, dict(parts))
        elif spec is not None and spec.family in FAMILY_ROLES:
            state.claim(n, FAMILY_ROLES[spec.family])


def weight_work(view: GraphView, state: RoleState) -> None:
    """Products that compute a weight, not a projection of tokens: a multiply that
    depends on none of the forward's inputs and is computed from an identity matrix
    made in the forward (DoRA's ``lora_B(lora_A(eye))``, the adapter's ``B·A`` for
    its weight norm, once per call whatever the tokens) is ``other``, so that no
    projection search takes it for a projection of the values it scales."""
    from_eye: dict[CapturedOp, bool] = {}
    for n in view.nodes:  # in graph order: a node's inputs come first
        from_eye[n] = not view.dynamic[n] and (view.packet(n) is aten.eye or any(from_eye.get(x, False)
                                                                                 for x in n.inputs))
        if from_eye[n] and n.macs and not state.claimed(n):
            state.claim(n, Role.OTHER)
