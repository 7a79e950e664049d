"""llm-analysis's forward FLOPs for inference, reimplemented as facts.

Read in cli99/llm-analysis ``llm_analysis/analysis.py`` (``get_num_flops_fwd_*``,
``inference``) and ``llm_analysis/config.py`` (``get_model_config_from_hf``) at commit
``d841e40aec8c84b9e76ba9cfbce67418adb172bd``. ``inference()`` prices the prefill with
``get_num_flops_fwd_total(batch, seq_len)`` and every decode step with
``get_num_flops_fwd_total(batch, 1)`` (``use_kv_cache``): the cache never enters decode
FLOPs. In FLOPs, batch b = 1, s = prompt (prefill) or 1 (decode), h = hidden_dim:

- attention per layer ``4·b·s·h² + 4·b·s·h²/groups + 4·b·s²·h`` (its comment: "q proj +
  attn_out + k proj + v proj + compute_attn"), groups = heads / kv_heads: head_dim is
  taken as h / heads;
- MLP per layer ``(6 if GLU else 4)·b·s·h²·expansion_ratio``, no top-k factor (the
  loader reads ``num_local_experts`` and leaves ``moe_top_k = 1``);
- ``logit = 2·b·s·h·V`` at every position.

The Hugging Face loader sets ``mlp_gated_linear_units`` only when ``intermediate_size /
hidden_size == 3.5``; any other ratio leaves it unbound and the loader fails
(UnboundLocalError). This module raises a ConfigurationError there (DeepSeek-V3: 18432 /
7168). There is no MLA, router or shared-expert model.
"""

from __future__ import annotations

from fractions import Fraction

from ...errors import ConfigurationError
from ._dims import Dims, exact
from ._tool import CACHE_OMITTED, HEAD_DIM, LOGITS_EVERY_POSITION, ROUTER, TOP_K, Rows, Tool

__all__ = ["LLM_ANALYSIS"]

SOURCE = ("cli99/llm-analysis llm_analysis/analysis.py, llm_analysis/config.py "
          "@ d841e40aec8c84b9e76ba9cfbce67418adb172bd")


def terms(dims: Dims, phase: str, prompt: int, context: int, fixed: frozenset[str]) -> dict[str, int]:
    h, L, V = dims.hidden, dims.layers, dims.vocab
    if Fraction(dims.intermediate, h) != Fraction(7, 2):
        raise ConfigurationError(
            f"llm-analysis's Hugging Face loader fails for this config: intermediate_size / hidden_size = "
            f"{dims.intermediate}/{h} is not 3.5, so mlp_gated_linear_units is left unbound")
    s = prompt if phase == "prefill" else 1
    keys = s if phase == "prefill" or CACHE_OMITTED not in fixed else context + 1
    inner = dims.heads * dims.head_dim if HEAD_DIM in fixed else h  # the width of q and of attn_out
    kv = Fraction(dims.kv_heads * dims.head_dim) if HEAD_DIM in fixed else Fraction(h * dims.kv_heads, dims.heads)
    experts = dims.top_k if TOP_K in fixed and dims.experts else 1
    out = {
        "q_proj+attn_out": 4 * s * h * inner * L,
        "k_proj+v_proj": exact(4 * s * h * kv * L, "k_proj+v_proj"),
        "compute_attn": 4 * s * keys * inner * L,
        "mlp": 6 * s * h * dims.intermediate * experts * L,
    }
    if ROUTER in fixed and dims.experts:
        out["router"] = 2 * s * h * dims.experts * dims.moe_layers
    positions = 1 if phase == "prefill" and LOGITS_EVERY_POSITION in fixed else s
    out["logit"] = 2 * positions * h * V
    return out


def rows(dims: Dims) -> Rows:
    """llm-analysis's terms against flopscope's roles."""
    return (("q_proj+attn_out", ("q_proj+attn_out",), ("q_proj", "out_proj")),
            ("k_proj+v_proj", ("k_proj+v_proj",), ("k_proj", "v_proj")),
            ("compute_attn", ("compute_attn",), ("attn_scores", "attn_weighted_sum")),
            ("mlp", ("mlp",), ("ffn_up", "ffn_gate", "ffn_down")),
            ("router", ("router",), ("other",)),
            ("logit", ("logit",), ("logits",)))


LLM_ANALYSIS = Tool(name="llm-analysis", source=SOURCE, terms=terms,
                    chain=(LOGITS_EVERY_POSITION, CACHE_OMITTED, TOP_K, ROUTER, HEAD_DIM), rows=rows)
