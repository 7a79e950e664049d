"""Model conventions: the names model families give their hyper-parameters, in one place.

Facts, reconciliation, the model-level formulas and ``benchmarks/zoo.py`` read widths, heads, experts
and vocabularies only through these tables. A new model family whose config or modules use another name
is one edit here: append the name to the hyper-parameter's :class:`Names` (config keys are read from the
Hugging Face config and its ``text_config``; module names from the plain attributes of the modules
inside a block). Earlier names win.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Names:
    """The names one hyper-parameter goes by: as a config key, and as a module attribute."""

    config: tuple[str, ...] = ()
    module: tuple[str, ...] = ()


WIDTH = Names(config=("hidden_size", "d_model", "n_embd"),
              module=("embed_dim", "hidden_size", "d_model", "embed_size", "all_head_size", "inner_dim"))
"""Model width d (the projections' input width)."""
HEADS = Names(config=("num_attention_heads", "num_heads", "n_head"),
              module=("num_heads", "num_attention_heads", "n_heads", "n_head", "num_attention_heads_per_partition",
                      "h"))
"""Query heads h."""
KV_HEADS = Names(config=("num_key_value_heads", "num_kv_heads"),
                 module=("num_key_value_heads", "num_kv_heads", "n_kv_heads", "num_key_value_heads_per_partition"))
"""Key / value heads n_kv (grouped-query attention; default h)."""
KV_GROUPS = Names(module=("num_key_value_groups",))
"""Query heads per key / value head (h / n_kv)."""
MULTI_QUERY = Names(config=("multi_query",))
"""A flag: one key / value head (n_kv = 1)."""
HEAD_WIDTH = Names(config=("head_dim", "d_kv"),
                   module=("head_dim", "attention_head_size", "key_value_proj_dim", "head_size", "d_kv", "d_k", "dk"))
"""Head width d_k (default d / h)."""
FFN_WIDTH = Names(config=("intermediate_size", "n_inner", "ffn_dim", "d_ff"))
"""FFN inner width d_ff of a dense block."""
EXPERT_FFN_WIDTH = Names(config=("moe_intermediate_size", "intermediate_size"))
"""FFN inner width of one expert of a mixture-of-experts block."""
TOP_K = Names(config=("num_experts_per_tok", "num_experts_per_token", "moe_topk", "top_k"))
"""Routed experts each token meets."""
EXPERTS = Names(module=("num_experts", "num_local_experts", "n_routed_experts"))
"""A module with routed experts declares how many it has."""
LAYERS = Names(config=("num_hidden_layers", "n_layer", "num_layers"))
"""Transformer layers L."""
VOCAB = Names(config=("vocab_size",))
"""Vocabulary V."""
POSITIONS = Names(config=("max_position_embeddings", "n_positions"))
"""Rows of a learned position-embedding table."""
SLIDING_WINDOW = Names(config=("sliding_window",), module=("sliding_window",))
"""Keys each query sees under a sliding-window mask (with ``use_sliding_window`` and ``layer_types``)."""
LINEAR_IN = Names(module=("in_features", "nx"))
"""Input width of a linear layer (``nn.Linear``; transformers' ``Conv1D`` calls it nx)."""
LINEAR_OUT = Names(module=("out_features", "nf"))
"""Output width of a linear layer."""

CONFIG_ALIASED = (*WIDTH.config[:1], *HEADS.config[:1], *LAYERS.config[:1], *FFN_WIDTH.config[:1], *VOCAB.config)
"""Config keys read through the config's ``attribute_map`` when its dict lacks them (GPT-2's n_embd is
``hidden_size``)."""

QUERY_INPUTS: tuple[int | str, ...] = ("hidden_states", "query", "x", "src", "tgt", "input", "inputs_embeds", 0)
"""Names (or positions) of a block's query / token input, in order of preference."""
KEY_INPUTS: tuple[int | str, ...] = ("key_value_states", "encoder_hidden_states", "key", "memory", "context", "kv")
"""Names of a cross-attention block's key / value input."""
TOKEN_INPUTS: tuple[int | str, ...] = (0, "input_ids", "inputs_embeds", "decoder_input_ids")
"""A language model's token input: ids ``[*batch, n]`` or embeddings ``[*batch, n, d]`` (inputs_embeds)."""
