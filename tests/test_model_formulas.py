"""Model-level formulas: predicted per-token MACs from the papers, the measured forward, and the terms between."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

import flopscope

from closed_forms import rotary

transformers = pytest.importorskip("transformers")
n, B = 16, 2


def formulas(model) -> dict[str, flopscope.predict.model_formulas.FormulaRow]:
    prof = flopscope.profile(model.eval(), torch.zeros(B, n, dtype=torch.long))
    rows = prof.model_formulas().rows
    assert all(row.residual == 0 for row in rows)  # every difference is explained part by part
    return {row.name.split(" ")[0]: row for row in rows}


def test_gpt2_matches_megatron_and_differs_from_kaplan_by_named_terms():
    d, L, h, V = 64, 2, 4, 100
    rows = formulas(transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=d, n_layer=L, n_head=h, vocab_size=V)))
    measured = L * (12 * d * d + 2 * n * d) + d * V  # per token: 4d² + 8d² per layer, dense core, logits
    assert rows["Narayanan"].predicted == rows["Narayanan"].measured == measured
    kaplan = rows["Kaplan"]
    assert kaplan.predicted == 2 * d * L * (2 * d + 4 * d) + L * n * d  # FLOPs 2N + 2·L·n·d_attn, halved
    assert dict(kaplan.terms) == {"attention core": L * n * d,  # Kaplan's mask term is the causal half
                                  "logits": d * V}  # C_forward leaves out the de-embedding
    chinchilla = rows["Hoffmann"]
    assert dict(chinchilla.terms) == {"embeddings": -d * V}  # counted as a GEMM there, a gather here


def test_llama_gated_ffn_and_grouped_query_terms():
    d, L, h, n_kv, d_ff, V = 64, 2, 4, 2, 96, 100
    config = transformers.LlamaConfig(hidden_size=d, intermediate_size=d_ff, num_hidden_layers=L,
                                      num_attention_heads=h, num_key_value_heads=n_kv, vocab_size=V)
    rows = formulas(transformers.LlamaForCausalLM(config))
    d_k = d // h
    terms = dict(rows["Narayanan"].terms)
    assert terms["qkv"] == L * (d * h * d_k + 2 * d * n_kv * d_k) - L * 3 * d * d  # grouped-query K/V
    assert terms["ffn"] == L * 3 * d * d_ff - L * 8 * d * d  # SwiGLU with d_ff != 4d
    assert rows["Chowdhery"].measured == Fraction(rows["Narayanan"].measured)
    table = flopscope.profile(transformers.LlamaForCausalLM(config).eval(),
                              torch.zeros(1, n, dtype=torch.long)).model_formulas().to_table()
    d_attn = h * d_k
    kaplan = 2 * d * L * (2 * d_attn + d_ff) + L * n * d_attn  # N + L·n·d_attn, N = 2·d·L·(2·d_attn + d_ff)
    measured = L * (d * d_attn + 2 * d * n_kv * d_k + 2 * n * d_attn + d_attn * d + 3 * d * d_ff) + d * V
    measured += sum(rotary(n, d_k).values()) // n  # (transformers before 5.19: d_k/2 per token)
    row = next(line for line in table.splitlines() if line.startswith("Kaplan")).split()
    assert f"{kaplan:,}" in row and f"{measured:,}" in row
    assert f"{100 * (measured - kaplan) / kaplan:+.2f}%" in row


def test_a_model_without_a_language_model_config_is_refused():
    with pytest.raises(flopscope.FlopscopeError, match="language-model config"):
        flopscope.profile(torch.nn.Linear(4, 4), torch.zeros(2, 4)).model_formulas()
