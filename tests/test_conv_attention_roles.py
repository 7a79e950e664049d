"""Attention whose projections are 1×1 convolutions (docs/roles.md 3.2.3): YOLO11's C2PSA position-sensitive
attention (one ``qkv`` convolution split per head into q, k, v by channels, a ``proj`` convolution) and a non-local
block (separate 1×1 convolutions), per role against closed forms. A depthwise convolution beside them stays ``conv``."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import flopscope


class ConvBN(nn.Module):
    """A convolution without bias and a batch norm (Ultralytics' ``Conv`` with ``act=False``)."""

    def __init__(self, c_in: int, c_out: int, k: int = 1, groups: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, k, padding=k // 2, groups=groups, bias=False)
        self.bn = nn.BatchNorm2d(c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x))


class PositionSensitiveAttention(nn.Module):
    """The attention of YOLO11's C2PSA, as Ultralytics writes it: keys and queries of half the head width."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.key_dim = self.head_dim // 2
        self.qkv = ConvBN(dim, dim + 2 * self.key_dim * heads)
        self.proj = ConvBN(dim, dim)
        self.pe = ConvBN(dim, dim, 3, groups=dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x.shape
        q, k, v = self.qkv(x).view(B, self.heads, 2 * self.key_dim + self.head_dim, H * W).split(
            [self.key_dim, self.key_dim, self.head_dim], dim=2)
        weights = ((q.transpose(-2, -1) @ k) * self.key_dim ** -0.5).softmax(dim=-1)
        return self.proj((v @ weights.transpose(-2, -1)).view(B, C, H, W) + self.pe(v.reshape(B, C, H, W)))


class NonLocal(nn.Module):
    """A non-local block (Wang et al. 2018, embedded Gaussian): θ, φ, g and the output as 1×1 convolutions."""

    def __init__(self, channels: int, inner: int) -> None:
        super().__init__()
        self.theta, self.phi, self.g = (nn.Conv2d(channels, inner, 1) for _ in range(3))
        self.out = nn.Conv2d(inner, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, _, H, W = x.shape
        q = self.theta(x).flatten(2).transpose(1, 2)  # [B, N, inner]
        k = self.phi(x).flatten(2)  # [B, inner, N]
        v = self.g(x).flatten(2).transpose(1, 2)
        y = torch.softmax(q @ k, dim=-1) @ v
        return x + self.out(y.transpose(1, 2).reshape(B, -1, H, W))


@pytest.mark.parametrize("mode", ["fake", "real"])
def test_yolo_position_sensitive_attention(mode):
    dim, heads, H, W = 64, 2, 4, 5
    n, head_dim = H * W, dim // heads
    key_dim = head_dim // 2
    prof = flopscope.profile(PositionSensitiveAttention(dim, heads).eval(), torch.randn(1, dim, H, W), mode=mode)
    assert {role: macs for role, macs in prof.by_role().items() if macs} == {
        "q_proj": n * dim * heads * key_dim, "k_proj": n * dim * heads * key_dim, "v_proj": n * dim * dim,
        "attn_scores": heads * n * n * key_dim, "attn_weighted_sum": heads * n * n * head_dim,
        "out_proj": n * dim * dim, "conv": n * dim * 3 * 3}  # the positional depthwise convolution


@pytest.mark.parametrize("mode", ["fake", "real"])
def test_non_local_block(mode):
    channels, inner, H, W = 16, 8, 6, 6
    n = H * W
    prof = flopscope.profile(NonLocal(channels, inner), torch.randn(2, channels, H, W), mode=mode)
    assert {role: macs for role, macs in prof.by_role().items() if macs} == {
        "q_proj": 2 * n * channels * inner, "k_proj": 2 * n * channels * inner, "v_proj": 2 * n * channels * inner,
        "attn_scores": 2 * n * n * inner, "attn_weighted_sum": 2 * n * n * inner, "out_proj": 2 * n * inner * channels}
