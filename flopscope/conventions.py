"""Model conventions: the names model families give their hyper-parameters, in one
place.

Facts, reconciliation, the model-level formulas and ``benchmarks/zoo.py`` read widths,
heads, experts and vocabularies only through these tables. A new model family whose
config or modules use another name is one edit here: append the name to the
hyper-parameter's :class:`Names` (config keys are read from the Hugging Face config and
its ``text_config``; module names from the plain attributes of the modules inside a
block). Earlier names win.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigurationError


@dataclass(frozen=True)
class Names:
    """The names one hyper-parameter goes by: as a config key (``config``), as a module
    attribute (``module``), and in the sub-configs of composite models (``towers``:
    encoder / decoder / vision towers, stages). Reconciliation reads ``config`` and
    ``module``; tools that rewrite whole configs (``benchmarks/zoo.py`` shrinking
    every architecture) read :attr:`every_config_key`."""

    config: tuple[str, ...] = ()
    module: tuple[str, ...] = ()
    towers: tuple[str, ...] = ()

    @property
    def every_config_key(self) -> tuple[str, ...]:
        """``config`` then ``towers``, each name once."""
        return tuple(dict.fromkeys((*self.config, *self.towers)))


WIDTH = Names(config=("hidden_size", "d_model", "n_embd"),
              module=("embed_dim", "hidden_size", "d_model", "embed_size", "all_head_size",
                      "inner_dim"),
              towers=("hidden_dim", "dim", "width", "embed_dim", "encoder_hidden_size",
                      "embedding_size",
                      "projection_dim", "text_hidden_size", "out_hidden_size", "fpn_hidden_size",
                      "decoder_hidden_size",
                      "projector_hidden_size", "hidden_size_per_layer_input", "output_hidden_size",
                      "encoder_hidden_dim", "d_latents", "cross_attention_hidden_size",
                      "attention_hidden_size",
                      "embedding_dim"))
"""Model width d (the projections' input width)."""
HEADS = Names(config=("num_attention_heads", "num_heads", "n_head"),
              module=("num_heads", "num_attention_heads", "n_heads", "n_head",
                      "num_attention_heads_per_partition",
                      "h", "heads"),
              towers=("n_heads", "encoder_attention_heads", "decoder_attention_heads",
                      "decoder_num_attention_heads",
                      "swa_num_attention_heads"))
"""Query heads h."""
KV_HEADS = Names(config=("num_key_value_heads", "num_kv_heads"),
                 module=("num_key_value_heads", "num_kv_heads", "n_kv_heads",
                         "num_key_value_heads_per_partition"),
                 towers=("n_kv_heads", "multi_query_group_num", "swa_num_key_value_heads"))
"""Key / value heads n_kv (grouped-query attention; default h)."""
KV_GROUPS = Names(module=("num_key_value_groups",))
"""Query heads per key / value head (h / n_kv)."""
MULTI_QUERY = Names(config=("multi_query",))
"""A flag: one key / value head (n_kv = 1)."""
HEAD_WIDTH = Names(config=("head_dim", "d_kv"),
                   module=("head_dim", "attention_head_size", "key_value_proj_dim", "head_size",
                           "d_kv", "d_k", "dk"),
                   towers=("attention_head_dim", "swa_head_dim", "kv_channels", "v_head_dim",
                           "qk_head_dim",
                           "index_head_dim", "linear_key_head_dim", "linear_value_head_dim",
                           "linear_head_dim"))
"""Head width d_k (default d / h)."""
FFN_WIDTH = Names(config=("intermediate_size", "n_inner", "ffn_dim", "d_ff"),
                  towers=("encoder_ffn_dim", "decoder_ffn_dim", "mlp_dim",
                          "decoder_intermediate_size",
                          "ffn_hidden_size", "dim_feedforward", "intermediate_size_mlp",
                          "iou_head_hidden_dim"))
"""FFN inner width d_ff of a dense block."""
EXPERT_FFN_WIDTH = Names(config=("moe_intermediate_size",),
                         towers=("shared_expert_intermediate_size", "expert_intermediate_size",
                                 "shared_intermediate_size"))
"""FFN inner width of one expert of a mixture-of-experts block (else the dense
:data:`FFN_WIDTH`)."""
TOP_K = Names(config=("num_experts_per_tok", "num_experts_per_token", "moe_topk", "top_k", "moe_k"))
"""Routed experts each token meets."""
EXPERTS = Names(config=("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts"),
                module=("num_experts", "num_local_experts", "n_routed_experts"))
"""How many routed experts a block has (a module declaring it has routed experts)."""
LAYERS = Names(config=("num_hidden_layers", "n_layer", "num_layers"),
               towers=("n_layers", "encoder_layers", "decoder_layers", "num_decoder_layers",
                       "num_encoder_layers",
                       "depth", "num_hidden_groups_layers", "max_window_layers", "num_blocks"))
"""Transformer layers L."""
VOCAB = Names(config=("vocab_size",))
"""Vocabulary V."""
POSITIONS = Names(config=("max_position_embeddings", "n_positions"))
"""Rows of a learned position-embedding table."""
SLIDING_WINDOW = Names(config=("sliding_window",), module=("sliding_window",))
"""Keys each query sees under a sliding-window mask (with ``use_sliding_window`` and
``layer_types``)."""
LINEAR_IN = Names(module=("in_features", "nx"))
"""Input width of a linear layer (``nn.Linear``; transformers' ``Conv1D`` calls it nx)."""
LINEAR_OUT = Names(module=("out_features", "nf"))
"""Output width of a linear layer."""

CONFIG_ALIASED = ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size",
                  "vocab_size")
"""Hugging Face's canonical config keys, read through the config's ``attribute_map``
when its dict lacks them (GPT-2's ``n_embd`` is ``hidden_size``)."""

QUERY_INPUTS: tuple[int | str, ...] = ("hidden_states", "query", "x", "src", "tgt", "input",
                                       "inputs_embeds", 0)
"""Names (or positions) of a block's query / token input, in order of preference."""
KEY_INPUTS: tuple[int | str, ...] = ("key_value_states", "encoder_hidden_states", "key", "memory",
                                     "context", "kv")
"""Names of a cross-attention block's key / value input."""
TOKEN_INPUTS: tuple[int | str, ...] = ("decoder_input_ids", "input_ids", 0, "inputs_embeds")
"""A language model's token input: ids ``[*batch, n]`` or embeddings ``[*batch, n, d]``
(inputs_embeds), in order of preference (a generation step's new tokens are the
decoder's where there is one)."""


# --------------------------------------------------------------------------------------------------
# attention conventions: how the attention core's (query, key) pairs are charged (docs/conventions.md)
EXECUTED, CAUSAL, MASK = "executed", "causal", "mask"
ATTENTION_CONVENTIONS = (EXECUTED, CAUSAL, MASK)
"""The values of every ``attention=`` keyword: ``"executed"`` (what the kernels ran, the
default), ``"causal"`` (the pairs a causal or sliding-window mask allows), ``"mask"``
(the pairs the mask tensor allows)."""


def check_attention(attention: str) -> str:
    """``attention`` if it is one of :data:`ATTENTION_CONVENTIONS`, else a
    :class:`ConfigurationError`."""
    if attention not in ATTENTION_CONVENTIONS:
        raise ConfigurationError("attention must be one of "
                                 f"{', '.join(map(repr, ATTENTION_CONVENTIONS))}; got {attention!r}")
    return attention
