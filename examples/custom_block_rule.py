"""A custom block that dataflow alone cannot name, and a user rule that names it.

Kernelised linear attention has no softmax, so its matmuls are not recognised as attention; a
``RoleRule`` (module pattern or type -> role) says what they are.

    python examples/custom_block_rule.py
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import flopscope
from flopscope import Role, RoleRule


class LinearAttention(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(d, d) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = F.elu(self.q(x)) + 1, F.elu(self.k(x)) + 1, self.v(x)
        return q @ (k.transpose(-2, -1) @ v)  # O(n·d²) instead of O(n²·d)


class Net(nn.Module):
    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.mixer = LinearAttention(d)
        self.head = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.mixer(x))


def main(argv: list[str] | None = None) -> dict[str, int]:
    x = torch.randn(1, 128, 64)
    print("dataflow alone:", flopscope.profile(Net(), x).by_role())
    rules = [RoleRule("mixer.q", Role.Q_PROJ), RoleRule("mixer.k", Role.K_PROJ), RoleRule("mixer.v", Role.V_PROJ),
             RoleRule(LinearAttention, Role.ATTN_SCORES, op="aten.bmm")]
    roles = flopscope.profile(Net(), x, roles=rules).by_role()
    print("with rules:    ", roles)
    return roles


if __name__ == "__main__":
    main()
