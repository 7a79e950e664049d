"""nanoGPT's ``estimate_mfu`` (PaLM, Appendix B), reimplemented as facts.

Read in karpathy/nanoGPT ``model.py`` (``GPT.estimate_mfu``, ``GPT.get_num_params``) at
commit ``3adf61e154c3fe3fca428ad6bc3818b27a3b8291``: ``flops_per_token = 6·N +
12·L·H·Q·T`` with N = ``get_num_params()`` (every parameter but the position embeddings),
Q = ``n_embd // n_head`` and T the sequence length; a sequence costs
``flops_per_token·T``. Training only: forward + backward, no inference mode.

Here: the forward of one sequence of ``prompt`` tokens, one third of that, in FLOPs:
``params = 2·N·T`` and ``attention = 4·L·H·Q·T·T`` (QKᵀ and AV over all T x T pairs:
dense, no causal halving). N is the Hugging Face model's parameter count
(:attr:`Dims.parameters`: Llama-family models have no position embeddings, so nanoGPT
would subtract nothing); it charges 2 FLOPs per token to every weight, the embedding
table, RMSNorm weights, every expert and the lm_head at every position included. There
is no decode step: :meth:`Tool.count` gives ``decode = None``.
"""

from __future__ import annotations

from ._dims import Dims
from ._tool import EMBEDDING_MATMUL, HEAD_DIM, LOGITS_EVERY_POSITION, NORM_WEIGHTS, TOP_K, Rows, Tool

__all__ = ["NANOGPT"]

SOURCE = "karpathy/nanoGPT model.py (estimate_mfu, get_num_params) @ 3adf61e154c3fe3fca428ad6bc3818b27a3b8291"


def terms(dims: Dims, phase: str, prompt: int, context: int, fixed: frozenset[str]) -> dict[str, int]:
    T, d = prompt, dims.hidden
    N = dims.parameters
    weights = 2 * N * T
    if EMBEDDING_MATMUL in fixed and not dims.tied:
        weights -= 2 * T * dims.vocab * d
    if NORM_WEIGHTS in fixed:
        weights -= 2 * T * dims.norm_weights()
    if LOGITS_EVERY_POSITION in fixed:
        weights -= 2 * (T - 1) * d * dims.vocab
    if TOP_K in fixed and dims.experts:
        weights -= 2 * T * (dims.ffn_weights(dims.experts) - dims.ffn_weights(dims.top_k))
    if HEAD_DIM in fixed:
        attention = 2 * dims.layers * dims.heads * T * T * (dims.qk_head_dim + dims.value_head_dim)
    else:
        attention = 4 * dims.layers * dims.heads * (d // dims.heads) * T * T
    return {"params": weights, "attention": attention}


def rows(dims: Dims) -> Rows:
    """nanoGPT's two terms against flopscope's roles."""
    return (("params", ("params",), ("q_proj", "k_proj", "v_proj", "out_proj", "ffn_up", "ffn_gate", "ffn_down",
                                     "other", "embedding", "logits")),
            ("attention", ("attention",), ("attn_scores", "attn_weighted_sum")))


NANOGPT = Tool(name="nanogpt", source=SOURCE, terms=terms,
               chain=(EMBEDDING_MATMUL, NORM_WEIGHTS, LOGITS_EVERY_POSITION, TOP_K, HEAD_DIM), rows=rows,
               phases=("prefill",))
