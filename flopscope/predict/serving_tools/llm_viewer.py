"""LLM-Viewer's per-layer OPs, reimplemented as facts.

Read in hahnyuan/LLM-Viewer ``model_analyzer.py`` (``ModelAnalyzer.analyze``) and
``configs/Llama.py`` at commit ``472f71f1a1807e80b573252e9185fd5e8d795e95``; the MoE
case from ``configs/Mixtral.py`` at commit ``01b269d600a36f674fd0e7952763f1560f39d368``.
``analyze(seqlen, batchsize=1)`` gives OPs per layer, times ``num_hidden_layers``, for
two stages; a decode step is analysed at a cache of ``seqlen`` (``analyze_generate_task``
calls ``analyze(i)`` for the step on a cache of i). With T = seqlen (prefill) or 1
(decode), s = seqlen, d = hidden_size, h = heads, I = intermediate_size, in its OPs:

- linear layers ``ic·oc·T·2``: ``q_proj`` and ``out_proj`` d x d, ``k_proj`` and
  ``v_proj`` d x (d·kv/h), ``gate_proj`` and ``up_proj`` d x I, ``down_proj`` I x d;
- ``head_size = hidden // heads``; ``qk_matmul = sv_matmul = 2·T·s·head_size·h`` (the
  prefill dense, ``s²``); ``softmax = 5·h·T·s``;
- ``attn_norm``, ``mlp_norm`` ``7·d·T`` each, ``attn_add``, ``mlp_add`` ``d·T`` each,
  ``mlp_act = 2·d·T`` (hidden, not intermediate: LLM-Viewer#16);
- ``lm_head = d·V`` once per stage, not times the layers: MACs, the last position only.

A MoE config (Mixtral) is the Llama layer list with ``intermediate_size``: one expert's
MLP, no router (``configs/Mixtral.py``). No config covers MLA: LLM-Viewer's lookup by
model-id substring finds none for DeepSeek-V3 and asserts "config file is not found";
this module raises a ConfigurationError there.
"""

from __future__ import annotations

from fractions import Fraction

from ...errors import ConfigurationError
from ._dims import Dims, exact
from ._tool import ELEMENTWISE, HEAD_DIM, LM_HEAD_MACS, NEW_KEY_OMITTED, ROUTER, TOP_K, Rows, Tool

__all__ = ["LLM_VIEWER"]

SOURCE = ("hahnyuan/LLM-Viewer model_analyzer.py, configs/Llama.py @ 472f71f1a1807e80b573252e9185fd5e8d795e95; "
          "configs/Mixtral.py @ 01b269d600a36f674fd0e7952763f1560f39d368")


def terms(dims: Dims, phase: str, prompt: int, context: int, fixed: frozenset[str]) -> dict[str, int]:
    if dims.mla:
        raise ConfigurationError("LLM-Viewer does not model multi-head latent attention (DeepSeek-V2/V3): "
                                 "no config of its configs/ matches the model")
    d, h, L, V = dims.hidden, dims.heads, dims.layers, dims.vocab
    T = prompt if phase == "prefill" else 1
    s = prompt if phase == "prefill" else context + (1 if NEW_KEY_OMITTED in fixed else 0)
    real = HEAD_DIM in fixed
    head = dims.head_dim if real else d // h
    q_out = h * head if real else d
    kv_out = Fraction(dims.kv_heads * head) if real else Fraction(d * dims.kv_heads, h)
    width = dims.intermediate
    experts = dims.top_k if TOP_K in fixed and dims.experts else 1
    if dims.experts:
        width = dims.moe_intermediate if TOP_K in fixed else dims.intermediate
    elementwise = 0 if ELEMENTWISE in fixed else 1
    per_layer = {
        "q_proj": 2 * T * d * q_out, "k_proj": exact(2 * T * d * kv_out, "k_proj"),
        "v_proj": exact(2 * T * d * kv_out, "v_proj"), "out_proj": 2 * T * q_out * d,
        "gate_proj": 2 * T * d * width * experts, "up_proj": 2 * T * d * width * experts,
        "down_proj": 2 * T * width * d * experts,
        "qk_matmul": 2 * T * s * head * h, "sv_matmul": 2 * T * s * head * h,
        "softmax": elementwise * 5 * h * T * s,
        "attn_norm": elementwise * 7 * d * T, "mlp_norm": elementwise * 7 * d * T,
        "attn_add": elementwise * d * T, "mlp_add": elementwise * d * T, "mlp_act": elementwise * 2 * d * T,
    }
    out = {name: value * L for name, value in per_layer.items()}
    if ROUTER in fixed and dims.experts:
        out["router"] = 2 * T * d * dims.experts * dims.moe_layers
    out["lm_head"] = (2 if LM_HEAD_MACS in fixed else 1) * d * V
    return out


def rows(dims: Dims) -> Rows:
    """LLM-Viewer's layers against flopscope's roles."""
    return (("q_proj", ("q_proj",), ("q_proj",)), ("k_proj", ("k_proj",), ("k_proj",)),
            ("v_proj", ("v_proj",), ("v_proj",)), ("out_proj", ("out_proj",), ("out_proj",)),
            ("qk_matmul", ("qk_matmul",), ("attn_scores",)), ("sv_matmul", ("sv_matmul",), ("attn_weighted_sum",)),
            ("gate_proj", ("gate_proj",), ("ffn_gate",)), ("up_proj", ("up_proj",), ("ffn_up",)),
            ("down_proj", ("down_proj",), ("ffn_down",)), ("router", ("router",), ("other",)),
            ("elementwise", ("softmax", "attn_norm", "mlp_norm", "attn_add", "mlp_add", "mlp_act"), ()),
            ("lm_head", ("lm_head",), ("logits",)))


LLM_VIEWER = Tool(name="llm-viewer", source=SOURCE, terms=terms,
                  chain=(ELEMENTWISE, LM_HEAD_MACS, NEW_KEY_OMITTED, TOP_K, ROUTER, HEAD_DIM), rows=rows)
