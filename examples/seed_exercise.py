"""The seed study's exercise: attention written out with Q = X·W_Q, K = X·W_K, V = X·W_V
equals ``nn.MultiheadAttention`` with the same weights, numerically, and flopscope
charges the same multiplies to the same roles in both.

    python examples/seed_exercise.py
"""

from __future__ import annotations

import math

import torch
from torch import nn

import flopscope


class ExplicitAttention(nn.Module):
    """softmax(Q·Kᵀ / √d_k)·V per head, then W_O, with the weights of a given
    nn.MultiheadAttention."""

    def __init__(self, mha: nn.MultiheadAttention) -> None:
        super().__init__()
        d, self.h = mha.embed_dim, mha.num_heads
        w_q, w_k, w_v = mha.in_proj_weight.detach().chunk(3)
        b_q, b_k, b_v = mha.in_proj_bias.detach().chunk(3)
        self.W_Q, self.W_K = nn.Parameter(w_q.T), nn.Parameter(w_k.T)
        self.W_V = nn.Parameter(w_v.T)
        self.b_Q, self.b_K = nn.Parameter(b_q), nn.Parameter(b_k)
        self.b_V = nn.Parameter(b_v)
        self.W_O = nn.Parameter(mha.out_proj.weight.detach().T)
        self.b_O = nn.Parameter(mha.out_proj.bias.detach())
        self.d_k = d // self.h

    # X, the textbook's name (N803 asks for lowercase arguments)
    def forward(self, X: torch.Tensor) -> torch.Tensor:  # noqa: N803
        B, n, d = X.shape
        Q = (X @ self.W_Q + self.b_Q).view(B, n, self.h, self.d_k).transpose(1, 2)
        K = (X @ self.W_K + self.b_K).view(B, n, self.h, self.d_k).transpose(1, 2)
        V = (X @ self.W_V + self.b_V).view(B, n, self.h, self.d_k).transpose(1, 2)
        A = torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(self.d_k), dim=-1)
        return (A @ V).transpose(1, 2).reshape(B, n, d) @ self.W_O + self.b_O


class Library(nn.Module):
    def __init__(self, mha: nn.MultiheadAttention) -> None:
        super().__init__()
        self.mha = mha

    def forward(self, X: torch.Tensor) -> torch.Tensor:  # noqa: N803
        return self.mha(X, X, X, need_weights=False)[0]


def main(argv: list[str] | None = None) -> tuple[dict[str, int], dict[str, int]]:
    torch.manual_seed(0)
    n, d, h = 64, 128, 8
    mha = nn.MultiheadAttention(d, h, batch_first=True).eval()
    X = torch.randn(2, n, d)
    explicit, library = ExplicitAttention(mha).eval(), Library(mha).eval()
    with torch.no_grad():
        difference = (explicit(X) - library(X)).abs().max().item()
        print(f"max |explicit - nn.MultiheadAttention| = {difference:.2e}")
        assert difference < 1e-5
        ours = flopscope.profile(explicit, X, mode="real").by_role()
        theirs = flopscope.profile(library, X, mode="real").by_role()
    for role in ours:
        print(f"  {role:18s} explicit {ours[role]:>12,}   "
              f"nn.MultiheadAttention {theirs.get(role, 0):>12,}")
    assert ours == theirs
    return ours, theirs


if __name__ == "__main__":
    main()
