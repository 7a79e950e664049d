"""torchtitan's training FLOPs per token (``get_nparams_and_flops``), reimplemented as
facts.

Read in pytorch/torchtitan ``torchtitan/models/utils.py``
(``get_dense_model_nparams_and_flops``, ``get_moe_model_nparams_and_flops``) and the
``get_nparams_and_flops`` of ``torchtitan/models/llama3/model.py``,
``torchtitan/models/qwen3/model.py`` and ``torchtitan/models/deepseek_v3/model.py`` at
commit ``b5bcd76c66d0acb1a08b176d9639425bc55e0b2a``. Per token, in FLOPs:
``6·N_active + 6·L·H·head_dims·seq_len``, with a comment that says "we follow the
convention and do not account for sparsity in causal attention": dense attention, no
causal halving. ``head_dims`` is the sum of the qk and v head widths:
``2·(dim // n_heads)`` for Llama 3 (dense), ``2·head_dim`` for the GQA MoE models
(Qwen3, gpt-oss), ``qk_nope + qk_rope + v`` for DeepSeek-V3 (MLA).

``N_active`` is every parameter of the built model, less the embedding table (the
parameters whose name holds ``"embedding"``) unless it is tied to the output layer, with
the routed experts' parameters taken at ``top_k / num_experts``
(``nparams_experts * top_k // num_experts``); the router and the shared experts count in
full. The tool walks the built modules; here ``N_active`` is derived from the config
without a model: :attr:`Dims.parameters` (the Hugging Face class's parameter count,
which torchtitan's Llama 3 and DeepSeek-V3 modules match: same matrices, same RMSNorm
weights, the experts' score bias a buffer, no multi-token-prediction layer by default)
less ``V·d`` when untied, less the routed experts' ``(1 - top_k/E)`` share. torchtitan
has no Mixtral module; a Mixtral config is priced by the formula of its GQA MoE models.

Here: the forward of one sequence of ``prompt`` tokens (batch 1), one third of the
training FLOPs (forward, then two backward GEMMs per forward GEMM): ``params =
2·N_active·T`` and ``attention = 2·L·H·head_dims·T·T``. Training only: no decode step,
:meth:`Tool.count` gives ``decode = None``. The stored version of ``utils.py`` at commit
``01c01c88fe7a58a250e7adf6ddc3b7a3857597f4`` (``get_nparams_and_active_nparams``,
``quadratic_attention_flops_per_token``: ``6·heads·(qk_dim + v_dim)·min(seq, window)``)
gives the same numbers for these configs, none of which has a sliding window.
"""

from __future__ import annotations

from ._dims import Dims
from ._tool import HEAD_DIM, LOGITS_EVERY_POSITION, NORM_WEIGHTS, Rows, Tool

__all__ = ["TORCHTITAN"]

SOURCE = ("pytorch/torchtitan torchtitan/models/utils.py (get_dense_model_nparams_and_flops, "
          "get_moe_model_nparams_and_flops), models/{llama3,qwen3,deepseek_v3}/model.py "
          "@ b5bcd76c66d0acb1a08b176d9639425bc55e0b2a")


def active_parameters(dims: Dims) -> int:
    """torchtitan's ``nparams_for_matmul``: all parameters, less the untied embedding
    table, with the routed experts at ``top_k / num_experts`` (floor, as its ``//``)."""
    embedding = 0 if dims.tied else dims.vocab * dims.hidden
    routed = dims.ffn_weights(dims.experts) - dims.ffn_weights(0)
    active = routed * dims.top_k // max(dims.experts, 1)
    return dims.parameters - embedding - routed + active


def head_dims(dims: Dims, fixed: frozenset[str]) -> int:
    """The qk plus v head widths the tool takes: Llama 3's ``2·(dim // n_heads)``, the
    MoE models' ``2·head_dim``, DeepSeek-V3's ``qk_nope + qk_rope + v``."""
    if dims.mla:
        return dims.qk_head_dim + dims.value_head_dim
    if dims.experts or HEAD_DIM in fixed:
        return 2 * dims.head_dim
    return 2 * (dims.hidden // dims.heads)


def terms(dims: Dims, phase: str, prompt: int, context: int, fixed: frozenset[str]) -> dict[str, int]:
    T = prompt
    weights = 2 * active_parameters(dims) * T
    if NORM_WEIGHTS in fixed:
        weights -= 2 * T * dims.norm_weights()
    if LOGITS_EVERY_POSITION in fixed:
        weights -= 2 * (T - 1) * dims.hidden * dims.vocab
    attention = 2 * dims.layers * dims.heads * head_dims(dims, fixed) * T * T
    return {"params": weights, "attention": attention}


def rows(dims: Dims) -> Rows:
    """torchtitan's two terms against flopscope's roles."""
    weights = ("q_proj", "k_proj", "v_proj", "out_proj", "ffn_up", "ffn_gate", "ffn_down", "other",
               "embedding", "logits")
    return (("params", ("params",), weights),
            ("attention", ("attention",), ("attn_scores", "attn_weighted_sum")))


TORCHTITAN = Tool(name="torchtitan", source=SOURCE, terms=terms,
                  chain=(NORM_WEIGHTS, LOGITS_EVERY_POSITION, HEAD_DIM), rows=rows, phases=("prefill",))
