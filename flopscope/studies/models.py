"""Models the package ships, so that the demo and the tests have something to count
without downloads."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..capture.checks import check_heads


class SelfAttention(nn.Module):
    """Multi-head self-attention written out as in the seed study: Q = X W_Q, K = X W_K,
    V = X W_V, softmax(Q Kᵀ / √d_k) V per head, then the output projection W_O."""

    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        check_heads(d, h)
        self.h, self.d_k = h, d // h
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, n, d = x.shape
        q, k, v = (p(x).view(B, n, self.h, self.d_k).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        weights = F.softmax(q @ k.transpose(-2, -1) / math.sqrt(self.d_k), dim=-1)
        return self.out_proj((weights @ v).transpose(1, 2).reshape(B, n, d))


class FeedForward(nn.Module):
    """Position-wise FFN: max(0, x W_1 + b_1) W_2 + b_2."""

    def __init__(self, d: int, d_ff: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(d, d_ff), nn.Linear(d_ff, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.relu(self.up(x)))


class TransformerBlock(nn.Module):
    """The Transformer encoder block of the seed study (post-norm, as in Vaswani et al.
    2017).

    Defaults: d = 512, h = 8, d_ff = 2048: 12·d² + 13·d = 3,152,384 parameters with d_ff
    = 4d. Forward MACs for one sequence of n tokens: n·(4·d² + 2·d·d_ff) + 2·n²·d.
    """

    def __init__(self, d: int = 512, h: int = 8, d_ff: int = 2048) -> None:
        super().__init__()
        self.attention = SelfAttention(d, h)
        self.norm1 = nn.LayerNorm(d)
        self.ffn = FeedForward(d, d_ff)
        self.norm2 = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.attention(x))
        return self.norm2(x + self.ffn(x))
