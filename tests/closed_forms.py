"""Closed-form MAC counts (reference/formulas.md sections 6 and 7), written as arithmetic.

Tests compare flopscope against these, never against flopscope's own output. Notation: batch (B),
n / n_q / n_k lengths, d width, h query heads, n_kv key/value heads, d_k = d/h, d_ff FFN width.
"""

from __future__ import annotations


def attention(batch: int, n_q: int, n_k: int, d: int, h: int, n_kv: int | None = None) -> dict[str, int]:
    """One attention layer: Q/K/V/O projections and the two core matmuls (formulas.md section 7)."""
    n_kv = h if n_kv is None else n_kv
    d_k = d_v = d // h
    return {
        "q_proj": batch * n_q * d * h * d_k,
        "k_proj": batch * n_k * d * n_kv * d_k,
        "v_proj": batch * n_k * d * n_kv * d_v,
        "attn_scores": batch * h * n_q * n_k * d_k,
        "attn_weighted_sum": batch * h * n_q * n_k * d_v,
        "out_proj": batch * n_q * h * d_v * d,
    }


def ffn(batch: int, n: int, d: int, d_ff: int, gated: bool = False) -> dict[str, int]:
    """Position-wise FFN: up d -> d_ff, down d_ff -> d, and a gate d -> d_ff when gated (SwiGLU)."""
    out = {"ffn_up": batch * n * d * d_ff, "ffn_down": batch * n * d_ff * d}
    if gated:
        out["ffn_gate"] = batch * n * d * d_ff
    return out


def conv_out(size: int, k: int, stride: int = 1, pad: int = 0, dil: int = 1) -> int:
    """floor((L + 2p - dil*(k-1) - 1) / s + 1), PyTorch's output length."""
    return (size + 2 * pad - dil * (k - 1) - 1) // stride + 1


def rnn(B: int, n: int, gates: int, d_in: int, d_h: int) -> int:  # noqa: N803 B as in formulas.md; test_peers.py passes B=
    """One layer, one direction: gates * d_h * (d_in + d_h) per step (LSTM 4, GRU 3, RNN 1)."""
    return B * n * gates * d_h * (d_in + d_h)


def add(*parts: dict[str, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for part in parts:
        for k, v in part.items():
            out[k] = out.get(k, 0) + v
    return out


def times(k: int, part: dict[str, int]) -> dict[str, int]:
    return {r: k * v for r, v in part.items()}


def total(part: dict[str, int]) -> int:
    return sum(part.values())
