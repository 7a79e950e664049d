"""vLLM's analytic MFU metrics (``--enable-mfu-metrics``), reimplemented as facts.

Read in vllm-project/vllm ``vllm/v1/metrics/perf.py`` at commit
``00cee63e04bf5b7dbaa5f08d6e4360f28777fdc3`` (PR #30738). Per scheduler step, vLLM sums
over requests ``T = Σ t`` (tokens scheduled) and ``TC = Σ t·context_len``, where
``context_len = num_computed_tokens + t``: a fresh prompt of P tokens has ``TC = P·P``
(dense, no causal halving), a decode step on a cache of c has ``TC = c + 1``. In FLOPs,
batch 1, no parallelism (``per_gpu`` with tp = pp = 1):

- ``attn`` (GQA): ``qkv_proj = 2·T·D·(q + 2·kv)·d·L``, ``out_proj = 2·T·D·q·d·L``,
  ``attn_qk = attn_av = 2·q·TC·d·L``; sliding-window layers use ``Σ t·min(context_len,
  W)`` (all layers for a uniform ``sliding_window``, those of ``layer_types`` marked
  sliding);
- ``mla_attn`` (DeepSeek): ``q_a_proj = 2·T·D·q_lora``, ``q_b_proj = 2·T·q_lora·q·(nope +
  rope)`` (or ``q_proj`` without a q rank), ``kv_a_proj = 2·T·D·(kv_lora + rope)``,
  ``kv_b_proj = 2·T·kv_lora·q·(nope + v)``, ``attn_qk = 2·q·TC·(nope + rope)``,
  ``attn_av = 2·q·TC·v``, ``out_proj = 2·T·q·v·D``, each times L;
- ``ffn``: ``dense_ffn = 2·D·3·DI·T·L_dense``, ``routed_ffn = 2·D·3·MI·T·top_k·L_moe``,
  ``shared_ffn = 2·D·3·MI·S·T·L_moe``; ``L_moe`` counts the layers ``>=
  first_k_dense_replace`` with ``layer % moe_layer_freq == 0`` when the config has both
  keys, else all layers of a MoE model; no router term;
- ``unembed = 2·R·D·V`` with R the requests needing logits: 1 per prefill, 1 per decode.

Its departures from the Hugging Face code that flopscope traces: the router, the MLA
cache the Hugging Face code re-expands each decode step, and the window clamp of a
prefill's keys.
"""

from __future__ import annotations

from ._dims import Dims
from ._tool import MLA_CACHE_EXPANDED, ROUTER, WINDOW_CLAMP, Rows, Tool

__all__ = ["VLLM_PERF"]

SOURCE = "vllm-project/vllm vllm/v1/metrics/perf.py @ 00cee63e04bf5b7dbaa5f08d6e4360f28777fdc3"


def _moe_layers(dims: Dims) -> int:
    """vLLM's ``num_moe_layers`` (BaseFfnConfigParser, InterleaveMoeLayerStepParser,
    MoeLayerFreqParser)."""
    if not dims.experts:
        return 0
    raw, layers = dims.raw, dims.layers
    count = layers
    step = raw.get("interleave_moe_layer_step")
    if step:
        count = sum(1 for layer in range(layers) if (layer + 1) % step == 0)
    if "moe_layer_freq" in raw and "first_k_dense_replace" in raw:
        count = sum(1 for layer in range(layers)
                    if layer >= raw["first_k_dense_replace"] and layer % raw["moe_layer_freq"] == 0)
    return count


def _swa_layers(dims: Dims) -> int:
    if not dims.window:
        return 0
    types = dims.raw.get("layer_types")
    if isinstance(types, list):
        return sum(1 for kind in types[:dims.layers] if "sliding" in str(kind).lower())
    if dims.raw.get("model_type") == "gemma2":
        return (dims.layers + 1) // 2
    return dims.layers


def terms(dims: Dims, phase: str, prompt: int, context: int, fixed: frozenset[str]) -> dict[str, int]:
    T, ctx = (prompt, prompt) if phase == "prefill" else (1, context + 1)
    D, q, L = dims.hidden, dims.heads, dims.layers
    TC = T * ctx
    out: dict[str, int] = {}
    if dims.mla:
        lora, rope, nope, v = dims.kv_lora_rank or 0, dims.qk_rope_head_dim, dims.qk_nope_head_dim, dims.v_head_dim
        if dims.q_lora_rank:
            out["q_a_proj"] = 2 * T * D * dims.q_lora_rank * L
            out["q_b_proj"] = 2 * T * dims.q_lora_rank * q * (nope + rope) * L
        else:
            out["q_proj"] = 2 * T * D * q * (nope + rope) * L
        out["kv_a_proj"] = 2 * T * D * (lora + rope) * L
        expanded = ctx if phase == "decode" and MLA_CACHE_EXPANDED in fixed else T
        out["kv_b_proj"] = 2 * expanded * lora * q * (nope + v) * L
        out["attn_qk"] = 2 * q * TC * (nope + rope) * L
        out["attn_av"] = 2 * q * TC * v * L
        out["out_proj"] = 2 * T * q * v * D * L
    else:
        kv, d = dims.kv_heads, dims.head_dim
        swa = _swa_layers(dims)
        clamp = dims.window is not None and swa and not (phase == "prefill" and WINDOW_CLAMP in fixed)
        tc_swa = T * min(ctx, dims.window) if clamp and dims.window else TC
        core = 2 * q * TC * d * (L - swa) + 2 * q * tc_swa * d * swa
        out["qkv_proj"] = 2 * T * D * (q + 2 * kv) * d * L
        out["out_proj"] = 2 * T * D * q * d * L
        out["attn_qk"] = core
        out["attn_av"] = core
    moe = _moe_layers(dims)
    if dims.layers - moe:
        out["dense_ffn"] = 2 * D * 3 * dims.intermediate * T * (dims.layers - moe)
    if moe:
        out["routed_ffn"] = 2 * D * 3 * dims.moe_intermediate * T * dims.top_k * moe
        if dims.shared_experts:
            out["shared_ffn"] = 2 * D * 3 * dims.moe_intermediate * dims.shared_experts * T * moe
    if ROUTER in fixed and dims.experts:
        out["router"] = 2 * T * D * dims.experts * dims.moe_layers
    out["unembed"] = 2 * 1 * D * dims.vocab
    return out


def rows(dims: Dims) -> Rows:
    """vLLM's terms against flopscope's roles."""
    projections: Rows = (
        (("q_proj", ("q_a_proj", "q_b_proj", "q_proj"), ("q_proj",)),
         ("kv_proj", ("kv_a_proj", "kv_b_proj"), ("k_proj", "v_proj"))) if dims.mla
        else (("qkv_proj", ("qkv_proj",), ("q_proj", "k_proj", "v_proj")),))
    return (
        *projections,
        ("out_proj", ("out_proj",), ("out_proj",)),
        ("attn_qk", ("attn_qk",), ("attn_scores",)),
        ("attn_av", ("attn_av",), ("attn_weighted_sum",)),
        ("ffn", ("dense_ffn", "routed_ffn", "shared_ffn"), ("ffn_up", "ffn_gate", "ffn_down")),
        ("router", ("router",), ("other",)),
        ("unembed", ("unembed",), ("logits",)))


VLLM_PERF = Tool(name="vllm", source=SOURCE, terms=terms, chain=(ROUTER, MLA_CACHE_EXPANDED, WINDOW_CLAMP),
                 rows=rows)
