"""Closed-form MAC counts (reference/formulas.md sections 6 and 7), written as arithmetic.

Tests compare flopscope against these, never against flopscope's own output. Notation: batch (B),
n / n_q / n_k lengths, d width, h query heads, n_kv key/value heads, d_k = d/h, d_ff FFN width.
"""

from __future__ import annotations

import functools


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


def rotary(n: int, d_k: int, rows: int = 1) -> dict[str, int]:
    """Hugging Face's rotary embedding (Llama and its kin) before transformers 5.19 makes its angles as a matmul of
    the frequencies by the positions, [rows, d_k/2, 1] @ [rows, 1, n]: rows · d_k/2 · n MACs in role "other", once
    per forward of the model (its layers share the angles); ``rows``: those of the position ids (1 when the model
    makes them, the batch when ``generate`` passes them). 5.19 and later multiply them elementwise: nothing."""
    return {"other": rows * (d_k // 2) * n} if rotary_is_a_matmul() else {}


@functools.cache
def rotary_is_a_matmul() -> bool:
    """Whether this transformers' LlamaRotaryEmbedding runs a matmul (asked of it, on a tiny config)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    try:
        import transformers
    except ImportError:
        return False

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.seen.add(func.__name__.split(".")[0])
            return func(*args, **(kwargs or {}))

    rotary = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(
        transformers.LlamaConfig(hidden_size=16, num_attention_heads=2))
    with Ops() as ops:
        rotary(torch.zeros(1, 3, 16), torch.arange(3)[None])
    return bool(ops.seen & {"mm", "bmm", "matmul"})
