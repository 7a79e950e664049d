"""A Hugging Face ``config.json`` read into the sizes the analytic tools' formulas use.

Plain arithmetic over a dict: no ``transformers``, no torch. The keys are those of the
published ``config.json`` files of Llama, Mixtral and DeepSeek-V3 (``hidden_size``,
``intermediate_size``, ``num_hidden_layers``, ``num_attention_heads``,
``num_key_value_heads``, ``head_dim``, ``vocab_size``; ``num_local_experts`` or
``n_routed_experts``, ``num_experts_per_tok``, ``moe_intermediate_size``,
``n_shared_experts``, ``first_k_dense_replace``, ``moe_layer_freq``; ``q_lora_rank``,
``kv_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``;
``sliding_window``, ``tie_word_embeddings``).

:attr:`Dims.parameters` is the model's parameter count as ``sum(p.numel() for p in
model.parameters())`` gives it for the Hugging Face Llama, Mixtral and DeepSeek-V3
classes (RMSNorm weights, no biases, the router's weight; DeepSeek's
``e_score_correction_bias`` is a buffer).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from ...errors import ConfigurationError

__all__ = ["Dims", "exact", "read"]


@dataclass(frozen=True)
class Dims:
    """The sizes of one decoder, read from its ``config.json`` (:func:`read`)."""

    hidden: int  # d
    intermediate: int  # the dense MLP's width
    layers: int  # L
    heads: int  # query heads
    kv_heads: int
    head_dim: int  # the config's head_dim, else hidden // heads
    vocab: int
    tied: bool  # lm_head shares the embedding's weight
    experts: int  # routed experts per MoE layer (0: dense)
    top_k: int  # routed experts per token
    moe_intermediate: int  # one routed expert's width
    shared_experts: int  # DeepSeek's shared experts per MoE layer
    first_dense: int  # first_k_dense_replace: the leading dense layers of a MoE model
    q_lora_rank: int | None  # MLA (kv_lora_rank set): the query's low rank, None if none
    kv_lora_rank: int | None  # MLA's latent width; None for GQA attention
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    window: int | None  # sliding_window
    raw: Mapping[str, Any]

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def moe_layers(self) -> int:
        """Layers with routed experts in the Hugging Face model: all of Mixtral's;
        DeepSeek's from ``first_k_dense_replace`` on."""
        return 0 if not self.experts else self.layers - self.first_dense

    @property
    def dense_layers(self) -> int:
        return self.layers - self.moe_layers

    @property
    def qk_head_dim(self) -> int:
        """The width of a query and a key per head: MLA's nope + rope, else head_dim."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.mla else self.head_dim

    @property
    def value_head_dim(self) -> int:
        return self.v_head_dim if self.mla else self.head_dim

    def attention_weights(self) -> int:
        """One layer's attention weights (parameters, = MACs per token)."""
        d, h = self.hidden, self.heads
        if not self.mla:
            return d * h * self.head_dim * 2 + d * self.kv_heads * self.head_dim * 2
        lora = self.kv_lora_rank or 0
        q = (d * self.q_lora_rank + self.q_lora_rank * h * self.qk_head_dim if self.q_lora_rank
             else d * h * self.qk_head_dim)
        kv = (d * (lora + self.qk_rope_head_dim)
              + lora * h * (self.qk_nope_head_dim + self.v_head_dim))
        return q + kv + h * self.v_head_dim * d

    def norm_weights(self) -> int:
        """All RMSNorm weights: two per layer, the final one, MLA's q_a and kv_a norms."""
        per_layer = 2 * self.hidden
        if self.mla:
            per_layer += (self.kv_lora_rank or 0) + (self.q_lora_rank or 0)
        return self.layers * per_layer + self.hidden

    def ffn_weights(self, routed: int) -> int:
        """All layers' MLP weights with ``routed`` routed experts per MoE layer (the
        router excluded): ``3·d·width`` per gated MLP."""
        d = self.hidden
        dense = self.dense_layers * 3 * d * self.intermediate
        moe = self.moe_layers * 3 * d * self.moe_intermediate * (routed + self.shared_experts)
        return dense + moe

    def router_weights(self) -> int:
        return self.moe_layers * self.experts * self.hidden

    @property
    def parameters(self) -> int:
        """The model's parameter count (all experts, embedding, lm_head unless tied)."""
        head = 0 if self.tied else self.vocab * self.hidden
        return (self.vocab * self.hidden + head + self.layers * self.attention_weights()
                + self.ffn_weights(self.experts) + self.router_weights() + self.norm_weights())


def _get(config: Mapping[str, Any], *names: str, default: Any = None) -> Any:
    for name in names:
        if config.get(name) is not None:
            return config[name]
    return default


def read(config: Mapping[str, Any]) -> Dims:
    """The sizes of ``config`` (a ``config.json`` as a dict); a missing required key is
    a :class:`~flopscope.errors.ConfigurationError`."""
    missing = [key for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
               if config.get(key) is None]
    if missing:
        raise ConfigurationError(f"the config has no {', '.join(missing)}")
    d, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    experts = int(_get(config, "n_routed_experts", "num_local_experts", "num_experts", default=0))
    intermediate = int(_get(config, "intermediate_size", default=4 * d))
    return Dims(
        hidden=d, intermediate=intermediate, layers=int(config["num_hidden_layers"]), heads=heads,
        kv_heads=int(_get(config, "num_key_value_heads", default=heads)),
        head_dim=int(_get(config, "head_dim", default=d // heads)), vocab=int(config["vocab_size"]),
        tied=bool(config.get("tie_word_embeddings", False)), experts=experts,
        top_k=int(_get(config, "num_experts_per_tok", default=1 if experts else 0)),
        moe_intermediate=int(_get(config, "moe_intermediate_size", default=intermediate)),
        shared_experts=int(_get(config, "n_shared_experts", "num_shared_experts", default=0)),
        first_dense=int(_get(config, "first_k_dense_replace", default=0)) if experts else 0,
        q_lora_rank=_get(config, "q_lora_rank"), kv_lora_rank=_get(config, "kv_lora_rank"),
        qk_nope_head_dim=int(_get(config, "qk_nope_head_dim", default=0)),
        qk_rope_head_dim=int(_get(config, "qk_rope_head_dim", default=0)),
        v_head_dim=int(_get(config, "v_head_dim", default=0)),
        window=_get(config, "sliding_window"), raw=config)


def exact(value: Fraction | int, what: str) -> int:
    """``value`` as an int; a fraction is a :class:`~flopscope.errors.ConfigurationError`
    (the tool's own float arithmetic would round it)."""
    if Fraction(value).denominator != 1:
        raise ConfigurationError(f"{what} is not a whole number of FLOPs for this config: {value}")
    return int(value)
