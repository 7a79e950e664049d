"""The EleutherAI cookbook's transformer FLOPs calculator, ``--infer`` mode,
reimplemented as facts.

Read in EleutherAI/cookbook ``calc/calc_transformer_flops.py`` (``config_parser``,
``calc_flops``) at commit ``827ee3b293a63f14403f1467d08c91fda213f4e6`` (the file last
changed at ``fce1d1c3f80b7740a37fea6c7b522ca0b7ef3885``, "flop calculation fixes").
``--infer`` sets ``iter_factor = 1``: "a single forward pass ('prefill' stage of
decoding) and no subsequent autoregressively generated tokens". With ``tokens`` T,
``sequence_length`` s, ``hidden_size`` h, ``num_layers`` L, in FLOPs:

- ``qkv = 2·(1 + 2·kv_size_ratio)·L·T·h·h``;
- ``attention_matrix = attention_over_values = 2·L·T·s·h``: dense, and as wide as
  ``hidden_size``, not heads x head_dim;
- ``linear_projection = 2·L·T·h·h``;
- ``ffn = 2·num_mlp_linears·ffn_expansion_factor·L·T·h·h``, and with ``--moe`` and
  ``topk > 1``, ``ffn *= topk / expert_interval``;
- ``embedding = T·(4·h + 2·h·vocab)``: "embedding (4*d_model) plus unembedding
  (2*d_model*vocab_size)", the unembedding at every position;
- with ``--moe``, ``gating = 2·T·num_experts·h·L / expert_interval``.

The arguments are the config's, for one sequence of ``prompt`` tokens (``--tokens =
--sequence-length = prompt``, batch 1): ``kv_size_ratio = kv_heads / heads``,
``--num-mlp-linears 3`` (a gated MLP), ``--moe -e experts -t top_k -ei 1`` (every layer
has experts). ``--ffn-expansion-factor`` is an integer: the MLP width (the experts' for
a MoE config) is passed as it when it is a multiple of ``hidden_size``; otherwise only
``--ffn-hidden-size`` can carry it, and ``calc_flops`` never reads that option, so the
default factor 4 prices the MLP (Llama-3-8B: 4 x 4096 instead of 14336). No argument
describes multi-head latent attention, shared experts or leading dense layers
(``num_layers % expert_interval == 0`` is asserted): this module raises a
ConfigurationError for such a config (DeepSeek-V3). There is no decode step.
"""

from __future__ import annotations

from fractions import Fraction

from ...errors import ConfigurationError
from ._dims import Dims, exact
from ._tool import EMBEDDING_FLOPS, FFN_WIDTH, HEAD_DIM, LOGITS_EVERY_POSITION, Rows, Tool

__all__ = ["ELEUTHER"]

SOURCE = ("EleutherAI/cookbook calc/calc_transformer_flops.py (calc_flops) "
          "@ 827ee3b293a63f14403f1467d08c91fda213f4e6")

DEFAULT_EXPANSION = 4  # --ffn-expansion-factor's default
EXPERT_INTERVAL = 1  # -ei: every layer has experts


def expansion(dims: Dims) -> int:
    """The ``--ffn-expansion-factor`` the calculator prices: the width over hidden when
    it is a whole number, else its default (``--ffn-hidden-size`` is parsed, not read)."""
    width = dims.moe_intermediate if dims.experts else dims.intermediate
    return width // dims.hidden if width % dims.hidden == 0 else DEFAULT_EXPANSION


def terms(dims: Dims, phase: str, prompt: int, context: int, fixed: frozenset[str]) -> dict[str, int]:
    if dims.mla or dims.shared_experts or dims.first_dense:
        raise ConfigurationError(
            "the EleutherAI calculator does not model multi-head latent attention, shared experts "
            "or leading dense layers (DeepSeek-V2/V3): its attention is hidden_size wide and its "
            "MoE layers are every expert_interval-th layer of one MLP width")
    T = s = prompt
    h, L, V = dims.hidden, dims.layers, dims.vocab
    if HEAD_DIM in fixed:
        q, kv = dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim
        qkv = 2 * L * T * h * (q + 2 * kv)
    else:
        q = h
        kv_size_ratio = Fraction(dims.kv_heads, dims.heads)
        qkv = exact(2 * (1 + 2 * kv_size_ratio) * L * T * h * h, "qkv")
    width = dims.moe_intermediate if dims.experts else dims.intermediate
    if FFN_WIDTH in fixed:
        ffn = Fraction(2 * 3 * L * T * h * width)
    else:
        ffn = Fraction(2 * 3 * expansion(dims) * L * T * h * h)
    if dims.experts and dims.top_k > 1:
        ffn *= Fraction(dims.top_k, EXPERT_INTERVAL)
    out = {
        "qkv": qkv,
        "attention_matrix": 2 * L * T * s * q,
        "attention_over_values": 2 * L * T * s * q,
        "linear_projection": 2 * L * T * q * h,
        "ffn": exact(ffn, "ffn"),
        "embedding": ((0 if EMBEDDING_FLOPS in fixed else T * 4 * h)
                      + (1 if LOGITS_EVERY_POSITION in fixed else T) * 2 * h * V),
    }
    if dims.experts:
        out["gating"] = exact(Fraction(2 * T * dims.experts * h * L, EXPERT_INTERVAL), "gating")
    return out


def rows(dims: Dims) -> Rows:
    """The calculator's terms against flopscope's roles."""
    return (("qkv", ("qkv",), ("q_proj", "k_proj", "v_proj")),
            ("attention_matrix", ("attention_matrix",), ("attn_scores",)),
            ("attention_over_values", ("attention_over_values",), ("attn_weighted_sum",)),
            ("linear_projection", ("linear_projection",), ("out_proj",)),
            ("ffn", ("ffn",), ("ffn_up", "ffn_gate", "ffn_down")),
            ("gating", ("gating",), ("other",)),
            ("embedding", ("embedding",), ("embedding", "logits")))


ELEUTHER = Tool(name="eleuther", source=SOURCE, terms=terms,
                chain=(LOGITS_EVERY_POSITION, EMBEDDING_FLOPS, FFN_WIDTH, HEAD_DIM), rows=rows,
                phases=("prefill",))
