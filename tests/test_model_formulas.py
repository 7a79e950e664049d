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


def palm_terms(model, batch: int = B) -> tuple[dict[str, Fraction], str]:
    prof = flopscope.profile(model.eval(), torch.zeros(batch, n, dtype=torch.long))
    formulas = prof.model_formulas()
    assert all(row.residual == 0 for row in formulas.rows)
    line = next(line for line in formulas.to_table().splitlines() if line.startswith("Chowdhery"))
    return dict(formulas.rows[3].terms), line


def test_palm_names_the_routed_experts_a_token_does_not_meet():
    """PaLM's N counts every weight once per token; a token meets top_k of the E routed experts, so the weights of
    the other E - top_k are a term of their own, named so (it was "other multiplies (pooler, router, rotary, ...)")."""
    d, L, h, n_kv, d_ff, V, E, k = 64, 2, 4, 2, 96, 100, 4, 2
    config = transformers.MixtralConfig(hidden_size=d, intermediate_size=d_ff, num_hidden_layers=L,
                                        num_attention_heads=h, num_key_value_heads=n_kv, vocab_size=V,
                                        num_local_experts=E, num_experts_per_tok=k)
    terms, line = palm_terms(transformers.MixtralForCausalLM(config))
    norms = L * 2 * d + d  # two RMSNorms per layer and the final one: in N, no GEMM
    expected = {"embeddings": -d * V, "parameters not in GEMMs": -norms,
                "inactive experts": -L * (E - k) * 3 * d * d_ff}  # gate, up, down of each expert not met
    angles = sum(rotary(n, d // h).values())  # (transformers before 5.19: the rotary angles' matmul, once per
    if angles:  # forward for the whole batch, measured work no weight of N runs)
        expected["weights not used once per token"] = Fraction(angles, B * n)
    assert terms == expected
    assert f"each token meets top_k of them) -{L * (E - k) * 3 * d * d_ff:,}" in line
    assert f"each token meets {k} of {E} routed experts" in line and "pooler, router, rotary" not in line


def test_palm_names_the_weights_a_pooler_uses_once_per_sequence():
    """BERT's pooler (d x d) runs once per sequence: PaLM's N counts it once per token; the difference is named
    "weights not used once per token", the pooler's own MACs (d² per sequence) stay measured work."""
    d, L, h, V = 32, 2, 4, 100
    config = transformers.BertConfig(hidden_size=d, num_hidden_layers=L, num_attention_heads=h, intermediate_size=64,
                                     vocab_size=V, max_position_embeddings=n)
    terms, line = palm_terms(transformers.BertModel(config))
    assert terms["weights not used once per token"] == Fraction(B * d * d, B * n) - d * d
    assert "weights not used once per token (a pooler runs once per sequence" in line
