"""Closed-form MAC counts (reference/formulas.md sections 6 and 7), written as arithmetic.

Tests compare flopscope against these, never against flopscope's own output. Notation: B batch,
n / n_q / n_k lengths, d width, h query heads, n_kv key/value heads, d_k = d/h, d_ff FFN width.
"""

from __future__ import annotations


def attention(B: int, n_q: int, n_k: int, d: int, h: int, n_kv: int | None = None) -> dict[str, int]:
    """One attention layer: Q/K/V/O projections and the two core matmuls (formulas.md section 7)."""
    n_kv = h if n_kv is None else n_kv
    d_k = d_v = d // h
    return {
        "q_proj": B * n_q * d * h * d_k,
        "k_proj": B * n_k * d * n_kv * d_k,
        "v_proj": B * n_k * d * n_kv * d_v,
        "attn_scores": B * h * n_q * n_k * d_k,
        "attn_weighted_sum": B * h * n_q * n_k * d_v,
        "out_proj": B * n_q * h * d_v * d,
    }


def ffn(B: int, n: int, d: int, d_ff: int, gated: bool = False) -> dict[str, int]:
    """Position-wise FFN: up d -> d_ff, down d_ff -> d, and a gate d -> d_ff when gated (SwiGLU)."""
    out = {"ffn_up": B * n * d * d_ff, "ffn_down": B * n * d_ff * d}
    if gated:
        out["ffn_gate"] = B * n * d * d_ff
    return out


def conv_out(size: int, k: int, stride: int = 1, pad: int = 0, dil: int = 1) -> int:
    """floor((L + 2p - dil*(k-1) - 1) / s + 1), PyTorch's output length."""
    return (size + 2 * pad - dil * (k - 1) - 1) // stride + 1


def rnn(B: int, n: int, gates: int, d_in: int, d_h: int) -> int:
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
