"""Megatron-LM's ``num_floating_point_operations`` (throughput and MFU), reimplemented
as facts.

Read in NVIDIA/Megatron-LM ``megatron/training/training.py``
(``num_floating_point_operations``, its ``transformer_flops``) at commit
``d98e8a64ddf34856e74b24714e3bedb2f5a39553`` (the file last changed at
``da5a81d491d6af1c18e52995a556e30ef84d4052``), and the vocabulary padding of
``megatron/core/tokenizers/utils/build_tokenizer.py`` (``vocab_size_with_padding``) at
the same commit. It counts one training iteration: every GEMM three times (forward,
weight gradient, data gradient), 2 FLOPs per multiply-add. Per token of a sequence of s
tokens (batch 1, no multi-token prediction, tensor parallel size 1), before the factor
3, in FLOPs:

- GQA attention per layer: ``2·h·(q + k + v) + 2·q·h`` with ``q = kv_channels·heads``,
  ``k = v = kv_channels·query_groups``; core attention ``2·(q/2)·2·s`` ("causal mask
  (only half of the mask is non-zero)", "QK^T and (QK^T)V");
- MLA attention per layer: ``2·q_lora·(h + heads·(qk + rope) + 1)`` (q LoRA, RoPE, q
  norm), ``2·kv_lora·(h + heads·(qk + v) + 1) + 2·h·rope`` (kv LoRA, kv norm),
  ``2·heads·v·h`` (output); core attention ``2·(heads·(qk + rope)/2 + heads·v/2)·s``;
- MLP ``2·h·ffn·3`` per dense layer (SwiGLU: 3 matrices), ``2·h·moe_ffn·top_k·3`` per
  MoE layer for the routed experts and ``2·h·shared_ffn·3`` for the shared ones; no
  router term;
- logits ``2·h·padded_vocab`` at every position, the vocabulary padded up to a multiple
  of 128 (``make_vocab_size_divisible_by``).

The arguments are the config's: ``kv_channels = head_dim``, ``query_groups =
num_key_value_heads``, ``--swiglu``, ``moe_ffn_hidden_size = moe_intermediate_size``,
``moe_shared_expert_intermediate_size = n_shared_experts·moe_intermediate_size``,
``--moe-layer-freq`` the list of the Hugging Face model's MoE layers
(``first_k_dense_replace`` dense layers first), no ``--mtp-num-layers`` (the Hugging Face
model has no multi-token-prediction layer). Here: the forward of one sequence of
``prompt`` tokens, one third of that. Training only: no decode step, :meth:`Tool.count`
gives ``decode = None``.
"""

from __future__ import annotations

from fractions import Fraction

from ._dims import Dims, exact
from ._tool import CAUSAL_HALVING, LOGITS_EVERY_POSITION, NORM_WEIGHTS, ROUTER, VOCAB_PADDED, Rows, Tool

__all__ = ["MEGATRON"]

SOURCE = ("NVIDIA/Megatron-LM megatron/training/training.py (num_floating_point_operations), "
          "megatron/core/tokenizers/utils/build_tokenizer.py @ d98e8a64ddf34856e74b24714e3bedb2f5a39553")

VOCAB_MULTIPLE = 128  # --make-vocab-size-divisible-by's default, times a tensor-parallel size of 1


def padded_vocab(vocab: int) -> int:
    """Megatron's ``vocab_size_with_padding`` at a tensor-parallel size of 1."""
    return -(-vocab // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def terms(dims: Dims, phase: str, prompt: int, context: int, fixed: frozenset[str]) -> dict[str, int]:
    T, h, H, L = prompt, dims.hidden, dims.heads, dims.layers
    norm = 0 if NORM_WEIGHTS in fixed else 1  # MLA's q and kv norm weights, charged as a GEMM
    causal = Fraction(1) if CAUSAL_HALVING in fixed else Fraction(1, 2)
    out: dict[str, int] = {}
    if dims.mla:
        lora, rope = dims.kv_lora_rank or 0, dims.qk_rope_head_dim
        nope, v = dims.qk_nope_head_dim, dims.v_head_dim
        q_term = (dims.q_lora_rank * (h + H * (nope + rope) + norm) if dims.q_lora_rank
                  else h * H * (nope + rope))
        out["q_proj"] = 2 * T * q_term * L
        out["kv_proj"] = 2 * T * (lora * (h + H * (nope + v) + norm) + h * rope) * L
        out["out_proj"] = 2 * T * H * v * h * L
        out["core_attention"] = exact(2 * T * T * (H * (nope + rope) * causal + H * v * causal) * L,
                                      "core_attention")
    else:
        q, kv = dims.head_dim * H, dims.head_dim * dims.kv_heads
        out["qkv_proj"] = 2 * T * h * (q + 2 * kv) * L
        out["out_proj"] = 2 * T * q * h * L
        out["core_attention"] = exact(2 * T * T * q * causal * 2 * L, "core_attention")
    if dims.dense_layers:
        out["dense_mlp"] = 2 * T * h * dims.intermediate * 3 * dims.dense_layers
    if dims.moe_layers:
        out["routed_experts"] = 2 * T * h * dims.moe_intermediate * dims.top_k * 3 * dims.moe_layers
        if dims.shared_experts:
            shared = dims.shared_experts * dims.moe_intermediate
            out["shared_experts"] = 2 * T * h * shared * 3 * dims.moe_layers
    if ROUTER in fixed and dims.experts:
        out["router"] = 2 * T * h * dims.experts * dims.moe_layers
    positions = 1 if LOGITS_EVERY_POSITION in fixed else T
    vocab = dims.vocab if VOCAB_PADDED in fixed else padded_vocab(dims.vocab)
    out["logits"] = 2 * positions * h * vocab
    return out


def rows(dims: Dims) -> Rows:
    """Megatron's terms against flopscope's roles."""
    projections: Rows = (
        (("q_proj", ("q_proj",), ("q_proj",)),
         ("kv_proj", ("kv_proj",), ("k_proj", "v_proj"))) if dims.mla
        else (("qkv_proj", ("qkv_proj",), ("q_proj", "k_proj", "v_proj")),))
    return (*projections,
            ("out_proj", ("out_proj",), ("out_proj",)),
            ("core_attention", ("core_attention",), ("attn_scores", "attn_weighted_sum")),
            ("mlp", ("dense_mlp", "routed_experts", "shared_experts"),
             ("ffn_up", "ffn_gate", "ffn_down")),
            ("router", ("router",), ("other",)),
            ("logits", ("logits",), ("logits",)))


MEGATRON = Tool(name="megatron", source=SOURCE, terms=terms,
                chain=(CAUSAL_HALVING, ROUTER, LOGITS_EVERY_POSITION, VOCAB_PADDED, NORM_WEIGHTS), rows=rows,
                phases=("prefill",))
