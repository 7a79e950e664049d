"""Roles of the families issue 47's zoo-wide invariants found misread, each against its closed form, built from tiny
configs whose widths do not coincide (head width · heads != hidden, d_ff != hidden), so that a role taken for
another shows. Notation: L layers, B sequences, n tokens, d hidden width, h heads, f FFN width."""

from __future__ import annotations

import pytest
import torch

import flopscope
from flopscope.testing.invariants import head_paths, role_balance

from closed_forms import add, attention, ffn, times

transformers = pytest.importorskip("transformers")
TRANSFORMERS = tuple(int(part) for part in transformers.__version__.split(".")[:2])
RECENT = pytest.mark.skipif(TRANSFORMERS < (5, 24), reason="closed forms verified on transformers 5.24 and 5.25: "
                            "older releases build some of these families otherwise, or lack them")

L, B, N, D, H, F = 2, 2, 16, 64, 4, 96


def roles(model: torch.nn.Module, *args: torch.Tensor, **inputs: torch.Tensor) -> tuple[dict[str, int],
                                                                                        flopscope.Profile]:
    prof = flopscope.profile(model.eval(), *args, **inputs)
    return {role: macs for role, macs in prof.by_role().items() if macs}, prof


def ids(vocab: int = 1000) -> torch.Tensor:
    return torch.randint(0, vocab, (B, N), generator=torch.Generator().manual_seed(0))


# --------------------------------------------------------------------------------------------------
# 1. sequence classifiers: a pooler and a classifier on one vector per sample are a head (other), never an FFN,
# and never logits, even with as many labels as the token-type table has rows
@pytest.mark.parametrize("labels", [3, 2])  # 2: as many as BERT's token types
@pytest.mark.parametrize("family", ["bert", "roberta", "distilbert"])
@RECENT
def test_a_sequence_classifier_head_is_other(family: str, labels: int) -> None:
    torch.manual_seed(0)
    if family == "distilbert":
        config = transformers.DistilBertConfig(dim=D, hidden_dim=F, n_layers=L, n_heads=H, vocab_size=1000,
                                               num_labels=labels)
    else:
        config = getattr(transformers, f"{'Bert' if family == 'bert' else 'Roberta'}Config")(
            hidden_size=D, intermediate_size=F, num_hidden_layers=L, num_attention_heads=H, vocab_size=1000,
            type_vocab_size=2, num_labels=labels)
    model = transformers.AutoModelForSequenceClassification.from_config(config)
    found, prof = roles(model, input_ids=ids())
    head = B * D * D + B * D * labels  # pooler (or pre-classifier) d -> d, then the classifier d -> labels
    assert found == add(times(L, add(attention(B, N, N, D, H), ffn(B, N, D, F))), {"other": head})
    assert role_balance(prof, head_paths(prof)) == []


# --------------------------------------------------------------------------------------------------
# 2. DeBERTa's disentangled attention: content-to-content Q·Kᵀ, content-to-position Q·P_kᵀ and position-to-content
# K·P_qᵀ (transposed before it joins the scores): each product's queries are the side whose positions are the
# scores' rows, whatever the operand order, so key_proj is k_proj and the positions' projections q / k by use
@pytest.mark.parametrize("share_att_key", [True, False])
@RECENT
def test_deberta_disentangled_attention_tells_queries_from_keys_by_axis(share_att_key: bool) -> None:
    torch.manual_seed(0)
    span = 4  # position buckets: 2·span relative embeddings projected once per layer
    config = transformers.DebertaV2Config(hidden_size=D, intermediate_size=F, num_hidden_layers=L,
                                          num_attention_heads=H, vocab_size=1000, relative_attention=True,
                                          pos_att_type=["p2c", "c2p"], position_buckets=span,
                                          max_relative_positions=64, share_att_key=share_att_key)
    found, prof = roles(transformers.DebertaV2Model(config), input_ids=ids())
    d_k, rel = D // H, 2 * span
    per_layer = {"q_proj": B * N * D * D + rel * D * D, "k_proj": B * N * D * D + rel * D * D,
                 "v_proj": B * N * D * D, "out_proj": B * N * D * D,
                 "attn_scores": B * H * N * N * d_k + 2 * B * H * N * rel * d_k,  # c2c, c2p, p2c
                 "attn_weighted_sum": B * H * N * N * d_k, **ffn(B, N, D, F)}
    assert found == times(L, per_layer)
    self_attention = "encoder.layer.0.attention.self."
    by_module = {r.module: r.role for r in prof.records if r.module.startswith(self_attention)}
    assert by_module[self_attention + "query_proj"] == "q_proj"
    assert by_module[self_attention + "key_proj"] == "k_proj"


# --------------------------------------------------------------------------------------------------
# 3. Gemma 3n: AltUp predicts each of its streams as a per-position mix of all of them (``streams @ coefs``, the
# coefficients from a small router MLP): no attention (its product's rows are features, not positions) and no FFN
# (the router MLP's output only weighs the streams)
@RECENT
def test_gemma3n_altup_is_neither_attention_nor_an_ffn() -> None:
    torch.manual_seed(0)
    head_dim, kv, per_layer, vocab = 24, 2, 16, 1000
    config = transformers.Gemma3nTextConfig(
        hidden_size=D, intermediate_size=[F] * L, num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=kv,
        head_dim=head_dim, vocab_size=vocab, vocab_size_per_layer_input=vocab, hidden_size_per_layer_input=per_layer,
        laurel_rank=8, altup_num_inputs=4, num_kv_shared_layers=0, activation_sparsity_pattern=[0.0] * L,
        layer_types=["sliding_attention", "full_attention"])
    found, prof = roles(transformers.Gemma3nForCausalLM(config), input_ids=ids(vocab))
    attention_roles = {"q_proj": B * N * D * H * head_dim, "k_proj": B * N * D * kv * head_dim,
                       "v_proj": B * N * D * kv * head_dim, "out_proj": B * N * H * head_dim * D,
                       "attn_scores": B * H * N * N * head_dim, "attn_weighted_sum": B * H * N * N * head_dim}
    assert {role: found[role] for role in attention_roles} == times(L, attention_roles)
    assert found["logits"] == B * N * D * vocab
    # the gated MLP of each layer, and each layer's gated per-layer-input branch, whose up projection is one
    # projection of the input embeddings for every layer (computed before the first)
    assert found["ffn_gate"] == found["ffn_up"] == found["ffn_down"] == L * B * N * D * (F + per_layer)
    by_module = {r.module: r.role for r in prof.records}
    altup = [m for m in by_module if ".altup." in m or "altup_" in m]
    assert altup and {by_module[m] for m in altup} == {"other"}


# --------------------------------------------------------------------------------------------------
# 4. Mix-FFN (SegFormer, PVTv2, GLPN): fc1 → depthwise 3×3 conv → GELU → fc2, written back to the residual stream, is
# an FFN; the convolution keeps conv
@RECENT
def test_segformer_mix_ffn_is_an_ffn_through_its_depthwise_conv() -> None:
    torch.manual_seed(0)
    config = transformers.SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
                                          num_attention_heads=[1, 2], mlp_ratios=[4, 4], patch_sizes=[7, 3],
                                          strides=[4, 2])
    found, _ = roles(transformers.SegformerModel(config), pixel_values=torch.randn(1, 3, 64, 64))
    # stage 0: 16×16 tokens of width 16, keys reduced 2×2 to 8×8; stage 1: 8×8 tokens of width 32, no reduction
    stages = [(16 * 16, 8 * 8, 16), (8 * 8, 8 * 8, 32)]
    assert found["ffn_up"] == found["ffn_down"] == sum(n * d * 4 * d for n, _, d in stages)
    assert found["q_proj"] == found["out_proj"] == sum(n * d * d for n, _, d in stages)
    assert found["k_proj"] == found["v_proj"] == sum(k * d * d for _, k, d in stages)
    assert found["attn_scores"] == sum(n * k * d for n, k, d in stages)
    depthwise = sum(n * 4 * d * 9 for n, _, d in stages)  # 3×3 per channel of the hidden layer
    assert found["conv"] > depthwise
    assert "other" not in found


# --------------------------------------------------------------------------------------------------
# 5. an untied LM head over the leading rows of a token table with a few more (Llama 3.2 Vision's text model: 8
# image tokens beyond the vocabulary the head predicts) is logits
@RECENT
def test_an_lm_head_over_a_tables_leading_rows_is_logits() -> None:
    torch.manual_seed(0)
    vocab = 1000
    config = transformers.MllamaTextConfig(hidden_size=D, intermediate_size=F, num_hidden_layers=1,
                                           num_attention_heads=H, num_key_value_heads=2, vocab_size=vocab,
                                           pad_token_id=0, cross_attention_layers=[])
    model = transformers.MllamaForCausalLM(config)
    assert tuple(model.model.embed_tokens.weight.shape) == (vocab + 8, D)
    found, prof = roles(model, input_ids=ids(vocab))
    assert found["logits"] == B * N * D * vocab
    assert "other" not in found
    assert role_balance(prof, head_paths(prof)) == []


# --------------------------------------------------------------------------------------------------
# 6. DeepSeek-V4: hyper-connections weigh their streams per row (sigmoid(hc)[..., None] * streams), which is no GLU
# gate and no activation of a hidden layer; the grouped low-rank output projection's second factor is out_proj
@RECENT
def test_deepseek_v4_hyper_connections_and_factored_output_projection() -> None:
    torch.manual_seed(0)
    q_rank, head_dim, groups, o_rank, expert, experts, top_k, vocab = 48, 32, 2, 40, 80, 4, 2, 1000
    config = transformers.DeepseekV4Config(
        vocab_size=vocab, hidden_size=D, moe_intermediate_size=expert, num_hidden_layers=L, num_attention_heads=H,
        num_key_value_heads=1, head_dim=head_dim, q_lora_rank=q_rank, num_experts_per_tok=top_k,
        n_routed_experts=experts, n_shared_experts=1, hc_mult=4, o_groups=groups, o_lora_rank=o_rank,
        index_n_heads=4, index_head_dim=16, index_topk=8, num_nextn_predict_layers=0, sliding_window=8,
        qk_rope_head_dim=8)
    found, prof = roles(transformers.DeepseekV4ForCausalLM(config), input_ids=ids(vocab))
    tokens, width = B * N, H * head_dim
    per_layer = {
        "q_proj": tokens * (D * q_rank + q_rank * width),  # q_a then q_b
        "k_proj": tokens * D * head_dim,  # one latent key / value head
        "out_proj": tokens * (width * o_rank + groups * o_rank * D),  # o_a per group, then o_b
        "attn_scores": B * H * N * N * head_dim, "attn_weighted_sum": B * H * N * N * head_dim,
        "ffn_up": tokens * D * expert * (top_k + 1), "ffn_gate": tokens * D * expert * (top_k + 1),
        "ffn_down": tokens * expert * D * (top_k + 1)}  # the routed experts a token meets, and the shared one
    assert {role: found.get(role, 0) for role in per_layer} == times(L, per_layer)
    assert found["logits"] == tokens * D * vocab
    hyper = {r.role for r in prof.records if r.module.endswith("_hc") or r.module == "model.hc_head"}
    assert hyper == {"other"}


# --------------------------------------------------------------------------------------------------
# 7. DeepSeek-V3.2's sparse-attention indexer reads the query latent beside q_b_proj; its scores only pick keys (a
# top-k), so q_a_proj is the query's factor (q_proj) as in DeepSeek-V3, and the indexer's own work is other
@pytest.mark.parametrize("family", ["deepseek_v3", "deepseek_v32"])
@RECENT
def test_a_sparse_attention_indexer_leaves_the_query_factor_q_proj(family: str) -> None:
    torch.manual_seed(0)
    q_rank, kv_rank, nope, rope, v_dim, vocab = 48, 32, 24, 8, 16, 1000
    common = dict(vocab_size=vocab, hidden_size=D, intermediate_size=F, moe_intermediate_size=80, num_hidden_layers=L,
                  num_attention_heads=H, num_key_value_heads=H, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
                  topk_group=1, kv_lora_rank=kv_rank, q_lora_rank=q_rank, qk_rope_head_dim=rope, v_head_dim=v_dim,
                  qk_nope_head_dim=nope, first_k_dense_replace=L)
    if family == "deepseek_v32":
        common.pop("first_k_dense_replace")
        config = transformers.DeepseekV32Config(**common, index_topk=8, index_head_dim=16, index_n_heads=2,
                                                mlp_layer_types=["dense"] * L, layer_types=["indexed_attention"] * L)
        model = transformers.DeepseekV32ForCausalLM(config)
    else:
        model = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**common))
    found, prof = roles(model, input_ids=ids(vocab))
    tokens, qk = B * N, nope + rope
    per_layer = {"q_proj": tokens * (D * q_rank + q_rank * H * qk),  # q_a, then q_b
                 "k_proj": tokens * (D * (kv_rank + rope) + kv_rank * H * nope),  # the latent and rope key, kv_b's keys
                 "v_proj": tokens * kv_rank * H * v_dim, "out_proj": tokens * H * v_dim * D,
                 "attn_scores": B * H * N * N * qk, "attn_weighted_sum": B * H * N * N * v_dim, **ffn(B, N, D, F, True)}
    assert {role: found.get(role, 0) for role in per_layer} == times(L, per_layer)
    indexer = {r.role for r in prof.records if ".indexer" in r.module}
    assert indexer == ({"other"} if family == "deepseek_v32" else set())


# --------------------------------------------------------------------------------------------------
# 11. Swin V2's continuous position bias: an MLP on a coordinate table the model holds (no input reaches it) computes
# a table, not an FFN of the tokens
@RECENT
def test_swinv2_position_bias_mlp_on_a_coordinate_table_is_other() -> None:
    torch.manual_seed(0)
    config = transformers.Swinv2Config(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 4],
                                       window_size=4)
    found, _ = roles(transformers.Swinv2Model(config), pixel_values=torch.randn(1, 3, 32, 32))
    # stage 0: 8×8 tokens of width 16 in 4 windows of 4×4, 2 heads; stage 1: 4×4 tokens of width 32, one window,
    # 4 heads; patch merging 4·16 -> 2·16 between them
    stages = [(64, 16, 2, 4), (16, 32, 4, 1)]  # tokens, width, heads, windows
    assert found["q_proj"] == found["out_proj"] == sum(n * d * d for n, d, _, _ in stages)
    assert found["attn_scores"] == sum(w * h * (n // w) ** 2 * (d // h) for n, d, h, w in stages)
    assert found["ffn_up"] == found["ffn_down"] == sum(n * d * 4 * d for n, d, _, _ in stages)
    coordinates = (2 * 4 - 1) ** 2  # relative offsets in a 4×4 window: the MLP's rows, 2 -> 512 -> heads
    table = sum(coordinates * (2 * 512 + 512 * h) for _, _, h, _ in stages)
    assert found["other"] == table + 16 * (4 * 16) * (2 * 16)


# --------------------------------------------------------------------------------------------------
# 10. GLM-4.1V's patch merger, proj → LayerNorm → GELU → SwiGLU: the GLU is read first, so its gate and up are ffn_gate
# and ffn_up (not down projections of proj, whose output the GELU activates), down is ffn_down, proj is other
@RECENT
def test_glm4v_patch_merger_reads_its_swiglu_first() -> None:
    torch.manual_seed(0)
    out, merge = 48, 2
    config = transformers.Glm4vVisionConfig(depth=L, hidden_size=D, intermediate_size=F, num_heads=H, patch_size=4,
                                            spatial_merge_size=merge, temporal_patch_size=2, out_hidden_size=out,
                                            image_size=16)
    model = transformers.Glm4vVisionModel(config)
    patches = 4 * 4  # one frame pair of 16×16 pixels in 4×4 patches
    found, prof = roles(model, torch.randn(patches, 3 * 2 * 4 * 4), grid_thw=torch.tensor([[1, 4, 4]]))
    block_hidden = model.blocks[0].mlp.gate_proj.out_features  # (this vision tower's blocks: a SwiGLU of this width)
    merger_hidden = model.merger.gate_proj.out_features
    tokens = patches // merge**2
    glu = L * patches * D * block_hidden + tokens * out * merger_hidden
    assert found["ffn_gate"] == found["ffn_up"] == found["ffn_down"] == glu
    assert found["q_proj"] == L * patches * D * D
    by_module = {r.module: r.role for r in prof.records}
    assert by_module["merger.proj"] == "other"
    assert (by_module["merger.gate_proj"], by_module["merger.up_proj"], by_module["merger.down_proj"]) == (
        "ffn_gate", "ffn_up", "ffn_down")


# --------------------------------------------------------------------------------------------------
# 8 / 11. one score matrix normalised by two softmaxes is two attention instances (LiLT adds its text and layout
# scores for each of its two streams; Grounding DINO's fusion attends both ways over one matrix): the second
# softmax's weighted sum, values and output projection are attention's too, the shared scores charged once
@RECENT
def test_lilt_scores_shared_by_two_softmaxes_make_two_attentions() -> None:
    torch.manual_seed(0)
    d, f = 96, 128  # LiLT's layout stream is d / 4 wide (a head d / 4 / h), its FFN f / 4
    config = transformers.LiltConfig(hidden_size=d, intermediate_size=f, num_hidden_layers=L, num_attention_heads=H,
                                     vocab_size=1000, channel_shrink_ratio=4, max_2d_position_embeddings=64)
    found, prof = roles(transformers.LiltModel(config), input_ids=ids(), bbox=torch.zeros(B, N, 4, dtype=torch.long))
    text, layout = attention(B, N, N, d, H), attention(B, N, N, d // 4, H)
    assert {role: found[role] for role in text} == times(L, add(text, layout))
    assert {role: found[role] for role in ("ffn_up", "ffn_down")} == times(L, add(ffn(B, N, d, f),
                                                                                  ffn(B, N, d // 4, f // 4)))
    assert role_balance(prof) == []


@RECENT
def test_grounding_dino_fusion_attends_both_ways_over_one_score_matrix() -> None:
    from transformers.models.grounding_dino.modeling_grounding_dino import GroundingDinoBiMultiHeadAttention

    torch.manual_seed(0)
    config = transformers.GroundingDinoConfig(d_model=D, encoder_ffn_dim=2 * 80, encoder_attention_heads=2 * H)
    width, vision, text = 80, 20, 12  # the fusion's width (ffn dim / 2) and heads (encoder heads / 2)
    found, _ = roles(GroundingDinoBiMultiHeadAttention(config), torch.randn(B, vision, D), torch.randn(B, text, D))
    head = width // H
    assert found["q_proj"] + found["k_proj"] == B * (vision + text) * D * width  # vision_proj, text_proj
    assert found["v_proj"] == B * (vision + text) * D * width  # both values
    assert found["out_proj"] == B * (vision + text) * width * D  # both outputs
    assert found["attn_scores"] == B * H * vision * text * head  # one matrix
    assert found["attn_weighted_sum"] == 2 * B * H * vision * text * head  # read both ways
    assert "other" not in found


# --------------------------------------------------------------------------------------------------
# 11. RemBERT decouples its output embeddings' width from its input embeddings': the LM head's decoder projects onto
# the whole vocabulary from a width no token table has, and is logits; the dense layer before it is other
@RECENT
def test_rembert_decoupled_lm_head_is_logits() -> None:
    torch.manual_seed(0)
    e_in, e_out, vocab = 32, 48, 1000
    config = transformers.RemBertConfig(hidden_size=D, intermediate_size=F, num_hidden_layers=L,
                                        num_attention_heads=H, vocab_size=vocab, input_embedding_size=e_in,
                                        output_embedding_size=e_out)
    found, prof = roles(transformers.RemBertForMaskedLM(config), input_ids=ids(vocab))
    assert found == add(times(L, add(attention(B, N, N, D, H), ffn(B, N, D, F))),
                        {"logits": B * N * e_out * vocab, "other": B * N * (e_in * D + D * e_out)})
    assert role_balance(prof, head_paths(prof)) == []


# --------------------------------------------------------------------------------------------------
# 11. ZAYA's router is an MLP (fc1 → GELU → fc2 → GELU → out_proj) whose logits only weigh and pick the experts: it
# is other, and the FFN roles are the experts' alone
@RECENT
def test_zaya_router_mlp_is_no_ffn() -> None:
    torch.manual_seed(0)
    expert, vocab = 80, 1000
    config = transformers.ZayaConfig(vocab_size=vocab, hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                                     num_key_value_heads=2, moe_intermediate_size=expert, num_experts=4,
                                     num_experts_per_tok=1, head_dim=16, router_hidden_size=32,
                                     layer_types=["hybrid"] * L)
    found, prof = roles(transformers.ZayaForCausalLM(config), input_ids=ids(vocab))
    assert found["ffn_gate"] == found["ffn_up"] == found["ffn_down"] == L * B * N * D * expert  # one expert a token
    assert {r.role for r in prof.records if ".router_mlp." in r.module} == {"other"}


# --------------------------------------------------------------------------------------------------
# 12. the convention for an output gate: Qwen3-Next's (and Qwen3.5's) q_proj carries the gate of the attention's
# output beside the queries; its gate columns are other, as a gate of its own is, its query columns q_proj
@RECENT
def test_qwen3_next_fused_output_gate_columns_are_other() -> None:
    torch.manual_seed(0)
    head_dim, kv, vocab = 24, 2, 1000
    config = transformers.Qwen3NextConfig(
        vocab_size=vocab, hidden_size=D, intermediate_size=F, moe_intermediate_size=80,
        shared_expert_intermediate_size=80, num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=kv,
        head_dim=head_dim, num_experts=4, num_experts_per_tok=2, layer_types=["full_attention"] * L)
    found, prof = roles(transformers.Qwen3NextForCausalLM(config), input_ids=ids(vocab))
    per_layer = {"q_proj": B * N * D * H * head_dim, "k_proj": B * N * D * kv * head_dim,
                 "v_proj": B * N * D * kv * head_dim, "out_proj": B * N * H * head_dim * D,
                 "attn_scores": B * H * N * N * head_dim, "attn_weighted_sum": B * H * N * N * head_dim}
    assert {role: found[role] for role in per_layer} == times(L, per_layer)
    q = next(r for r in prof.records if r.module == "model.layers.0.self_attn.q_proj")
    assert q.roles == {"q_proj": B * N * D * H * head_dim, "other": B * N * D * H * head_dim}  # queries, gate


# --------------------------------------------------------------------------------------------------
# 12. Kimi-Linear's KDA gets the projection roles gated DeltaNet gets: its in-chunk scores are elementwise (no
# quadratic form asks for them), so the state's products do: the keys and values that write it, the queries that
# read it, the output; the forget gate's decay (q · exp(cumsum(g))) and the output gate are other
@RECENT
def test_kimi_linear_kda_projections_are_attention_projections() -> None:
    torch.manual_seed(0)
    heads, head_dim, vocab = 4, 16, 1000
    config = transformers.KimiLinearConfig(
        vocab_size=vocab, hidden_size=D, intermediate_size=F, moe_intermediate_size=80, num_hidden_layers=2,
        num_attention_heads=H, num_key_value_heads=H, num_experts=4, num_experts_per_token=2, kv_lora_rank=32,
        qk_rope_head_dim=8, v_head_dim=16, qk_nope_head_dim=16, linear_head_dim=head_dim, linear_num_heads=heads,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, layer_types=["linear_attention", "full_attention"],
        mlp_layer_types=["dense", "dense"])
    _, prof = roles(transformers.KimiLinearForCausalLM(config), input_ids=ids(vocab))
    kda = "model.layers.0.self_attn."
    by_module = {r.module[len(kda):]: r.roles for r in prof.records if r.module.startswith(kda) and "." not in
                 r.module[len(kda):]}
    width = heads * head_dim
    for name, role in (("q_proj", "q_proj"), ("k_proj", "k_proj"), ("v_proj", "v_proj"), ("o_proj", "out_proj")):
        assert by_module[name] == {role: B * N * D * width}
    gates = {r.role for r in prof.records if r.module.startswith(kda + "forget_gate") or r.module.startswith(
        kda + "g_") or r.module == kda + "b_proj"}
    assert gates == {"other"}
    layer = {role for r in prof.records if r.module.startswith(kda.rstrip(".")) for role in r.roles}
    assert {"attn_kv_state", "attn_readout"} <= layer


# --------------------------------------------------------------------------------------------------
# 11. ConvBERT's output projection reads cat([attention, span-based conv], along the heads) flattened: its rows that
# hold the attention are out_proj, the conv's other
@RECENT
def test_convbert_output_projection_is_split_by_rows() -> None:
    torch.manual_seed(0)
    config = transformers.ConvBertConfig(hidden_size=D, intermediate_size=F, num_hidden_layers=L,
                                         num_attention_heads=H, vocab_size=1000, embedding_size=D, head_ratio=2,
                                         conv_kernel_size=5)
    found, prof = roles(transformers.ConvBertModel(config), input_ids=ids())
    heads, width = H // 2, D // 2  # half the heads attend; the span-based convolution makes the other half
    per_layer = {**{role: B * N * D * width for role in ("q_proj", "k_proj", "v_proj")},
                 "attn_scores": B * heads * N * N * (width // heads), "attn_weighted_sum": B * heads * N * N * (
                     width // heads), "out_proj": B * N * width * D, **ffn(B, N, D, F)}
    assert {role: found[role] for role in per_layer} == times(L, per_layer)
    dense = next(r for r in prof.records if r.module == "encoder.layer.0.attention.output.dense")
    assert dense.roles == {"out_proj": B * N * width * D, "other": B * N * width * D}
    assert role_balance(prof) == []


# --------------------------------------------------------------------------------------------------
# 11. a softcapped SwiGLU (Inkling2's: softcap(g) · sigmoid(g) · softcap(u), softcap(x) = tanh(x / c) · c): the
# softcaps bound their branches, the sigmoid gates; gate, up and down keep their roles
class _SoftcappedSwiGLU(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate, self.up, self.down = torch.nn.Linear(D, F), torch.nn.Linear(D, F), torch.nn.Linear(F, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, u = self.gate(x), self.up(x)
        return x + self.down(torch.tanh(g / 4.0) * 4.0 * torch.sigmoid(g) * torch.tanh(u / 25.0) * 25.0)


def test_a_softcapped_swiglu_keeps_its_gate() -> None:
    torch.manual_seed(0)
    found, _ = roles(_SoftcappedSwiGLU(), torch.randn(B, N, D))
    assert found == ffn(B, N, D, F, gated=True)


# --------------------------------------------------------------------------------------------------
# 11. a learned Fourier positional encoding (LightGlue's cos / sin of projector(keypoints)) rotates the queries and
# keys: its projector is other, never q_proj or k_proj
class _FourierRotaryAttention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.projector = torch.nn.Linear(2, D // H // 2, bias=False)
        self.q, self.k, self.v, self.o = (torch.nn.Linear(D, D) for _ in range(4))

    def forward(self, x: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        angles = self.projector(points).repeat_interleave(2, dim=-1)[:, None]  # [B, 1, n, d_k]
        cos, sin = angles.cos(), angles.sin()

        def heads(t: torch.Tensor) -> torch.Tensor:
            t = t.view(b, n, H, D // H).transpose(1, 2)
            pairs = t.unflatten(-1, (-1, 2))
            rotated = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
            return t * cos + rotated * sin

        q, k, v = heads(self.q(x)), heads(self.k(x)), self.v(x).view(b, n, H, D // H).transpose(1, 2)
        weights = (q @ k.transpose(-1, -2) / (D // H) ** 0.5).softmax(-1)
        return self.o((weights @ v).transpose(1, 2).reshape(b, n, D))


def test_a_fourier_positional_projector_is_no_query_projection() -> None:
    torch.manual_seed(0)
    found, _ = roles(_FourierRotaryAttention(), torch.randn(B, N, D), torch.randn(B, N, 2))
    assert found == {**attention(B, N, N, D, H), "other": B * N * 2 * (D // H // 2)}


# --------------------------------------------------------------------------------------------------
# an FFN maps d → f → d, or writes back to a residual stream: an MLP between widths that does neither (a multimodal
# projector, D-FINE's quality head 20 → 64 → 1) is other; the same MLP added back to its input is an FFN
class _Projector(torch.nn.Module):
    def __init__(self, d_in: int, d_out: int, residual: bool) -> None:
        super().__init__()
        self.fc1, self.fc2, self.residual = torch.nn.Linear(d_in, d_out), torch.nn.Linear(d_out, d_out), residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc2(torch.nn.functional.gelu(self.fc1(x)))
        return y + x[..., : y.shape[-1]] if self.residual else y


@pytest.mark.parametrize("residual", [False, True])
def test_an_mlp_between_widths_is_an_ffn_only_when_it_writes_back(residual: bool) -> None:
    d_in, d_out = 48, 32
    found, _ = roles(_Projector(d_in, d_out, residual), torch.randn(B, N, d_in))
    up, down = B * N * d_in * d_out, B * N * d_out * d_out
    assert found == ({"ffn_up": up, "ffn_down": down} if residual else {"other": up + down})


# --------------------------------------------------------------------------------------------------
# 9. deformable cross-attention (RT-DETR): grid_sample(value_proj(v), locations(q)) · softmax(attention_weights(q)),
# summed over the sampling points, mixes elementwise (no product of two activations): no gated FFN, its projections
# other as for every attention whose mixing is elementwise (docs/roles.md 3.2.1); the decoder's FFN stays an FFN
@pytest.mark.parametrize("training", [False, True])
@RECENT
def test_deformable_attention_is_no_gated_ffn(training: bool) -> None:
    """(After a first forward, whose anchors the model keeps, the sampling locations pass a sigmoid behind the
    sampled values: they were read as a GLU's gate.)"""
    torch.manual_seed(0)
    backbone = transformers.RTDetrResNetConfig(depths=[1, 1, 1, 1], out_features=["stage2", "stage3", "stage4"])
    config = transformers.RTDetrConfig(backbone_config=backbone, encoder_layers=1, decoder_layers=L, num_queries=16)
    model, pixels = transformers.RTDetrModel(config).train(training), torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        model(pixel_values=pixels)  # (a forward first, as a user's: the model keeps what it computed once)
        prof = flopscope.profile(model, pixel_values=pixels)
    deformable = {r.role for r in prof.records if ".encoder_attn." in r.module}
    assert deformable == {"other"}
    decoder_ffn = {r.module.rsplit(".", 1)[-1]: r.role for r in prof.records
                   if r.module.startswith("decoder.layers.0.mlp")}
    assert decoder_ffn == {"fc1": "ffn_up", "fc2": "ffn_down"}


# --------------------------------------------------------------------------------------------------
# a convolution module (Conformer's, Gemma 4 audio's lconv1d: Linear d -> 2d, GLU, depthwise conv, norm, SiLU,
# Linear d -> d, added back) is no FFN, though it writes back to the residual stream: the GLU before its depthwise
# convolution tells it from a Mix-FFN (fc1 -> dwconv -> GELU -> fc2)
class _ConvModule(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.start, self.end = torch.nn.Linear(D, 2 * D), torch.nn.Linear(D, D)
        self.depthwise = torch.nn.Conv1d(D, D, 5, padding=2, groups=D)
        self.norm = torch.nn.LayerNorm(D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.glu(self.start(x), dim=-1)
        h = self.depthwise(h.transpose(1, 2)).transpose(1, 2)
        return x + self.end(torch.nn.functional.silu(self.norm(h)))


def test_a_convolution_module_is_no_mix_ffn() -> None:
    torch.manual_seed(0)
    found, _ = roles(_ConvModule(), torch.randn(B, N, D))
    assert found == {"other": B * N * D * 2 * D + B * N * D * D, "conv": B * N * D * 5}


# --------------------------------------------------------------------------------------------------
# 9. D-FINE's gateway mixes two streams with sigmoid gates, norm(g1 · x1 + g2 · x2): a gated product behind a sum
# with another activation is no GLU of the next projection
class _Gateway(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(D, D), torch.nn.Linear(D, D)
        self.gate, self.norm, self.next = torch.nn.Linear(2 * D, 2 * D), torch.nn.LayerNorm(D), torch.nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1, x2 = self.a(x), self.b(x)
        g1, g2 = torch.sigmoid(self.gate(torch.cat([x1, x2], dim=-1))).chunk(2, dim=-1)
        h = self.norm(g1 * x1 + g2 * x2)
        return h + self.next(h)  # (the next projection writes back to the stream the gateway made)


def test_a_gateway_of_two_streams_is_no_glu() -> None:
    torch.manual_seed(0)
    found, _ = roles(_Gateway(), torch.randn(B, N, D))
    assert found == {"other": B * N * (2 * D * D + 2 * D * 2 * D + D * D)}


# --------------------------------------------------------------------------------------------------
# what writes back to a residual stream is added to the stream its hidden layer was computed from: an MLP of the
# boxes added to the queries as their positional embedding (RT-DETR's query_pos_head) is none, a block's FFN is one
# even as wide as a small vocabulary (ESM-C: 64 tokens, width 64; its last down projection is no LM head)
class _PositionalQueries(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(4, 2 * D), torch.nn.Linear(2 * D, D)

    def forward(self, queries: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        return queries + self.fc2(torch.relu(self.fc1(boxes)))


def test_an_mlp_of_the_boxes_added_to_the_queries_is_no_ffn() -> None:
    torch.manual_seed(0)
    found, _ = roles(_PositionalQueries(), torch.randn(B, N, D), torch.rand(B, N, 4))
    assert found == {"other": B * N * (4 * 2 * D + 2 * D * D)}


class _TinyVocabularyBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(D, D)  # as many tokens as the width
        self.gate, self.up, self.down = torch.nn.Linear(D, F), torch.nn.Linear(D, F), torch.nn.Linear(F, D)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        return h + self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h))


def test_an_ffn_as_wide_as_a_small_vocabulary_is_no_lm_head() -> None:
    found, _ = roles(_TinyVocabularyBlock(), ids(D))
    assert found == ffn(B, N, D, F, gated=True)


# --------------------------------------------------------------------------------------------------
# Fourier features written as stack([sin, cos], -1).flatten(-2) (SAM 3's box embeddings) are no hidden layer, as
# cat([sin, cos]) is not
class _StackedFourier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj, self.fc = torch.nn.Linear(D, D // 2), torch.nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        angles = self.proj(x)
        return x + self.fc(torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2))


def test_stacked_fourier_features_are_no_hidden_layer() -> None:
    found, _ = roles(_StackedFourier(), torch.randn(B, N, D))
    assert found == {"other": B * N * (D * D // 2 + D * D)}


# --------------------------------------------------------------------------------------------------
# a GLU with a norm written out between its gated product and its down projection (BitNet's ffn_sub_norm:
# x · rsqrt(mean(x²) + eps)): the norm joins the product with itself, no other stream, so the GLU is still found
class _SubNormGLU(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate, self.up, self.down = torch.nn.Linear(D, F), torch.nn.Linear(D, F), torch.nn.Linear(F, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.silu(self.gate(x)) * self.up(x)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return x + self.down(h)


def test_a_glu_with_a_written_out_norm_before_its_down_projection() -> None:
    found, _ = roles(_SubNormGLU(), torch.randn(B, N, D))
    assert found == ffn(B, N, D, F, gated=True)


# --------------------------------------------------------------------------------------------------
# Sam2's Hiera attention computes softmax((q · scale) @ kᵀ) over the heads at each position and never reads it (dead
# code before its real attention): a product whose softmax nothing reads is no attention (other), so the scores
# balance the weighted sum
class _DeadScoresAttention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.proj = torch.nn.Linear(D, 3 * D), torch.nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).reshape(B, N, 3, H, D // H).unbind(2)  # (B, n, h, d/h) each
        dropped = torch.softmax(q @ k.transpose(-2, -1), dim=-1).to(torch.float64)  # (B, n, h, h), never read
        del dropped
        out = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return x + self.proj(out.transpose(1, 2).reshape(B, N, D))


def test_scores_nothing_reads_are_no_attention() -> None:
    found, _ = roles(_DeadScoresAttention(), torch.randn(B, N, D))
    assert found == add(attention(B, N, N, D, H), {"other": B * N * H * H * (D // H)})


# --------------------------------------------------------------------------------------------------
# an MLP d → f → d whose result a weight matmul projects again before any sum writes back to nothing: it is no FFN,
# whatever its widths. AXK2's gated norm, y · sigmoid(fc2(silu(fc1(y)))) with y = RMSNorm(x), before a gated FFN; a
# head of three Linears on one token (SAM's IoU head, d → d → d → masks); a caption projection read by a
# cross-attention's keys and values, as wide as the model (PixArt's, Sana's): other in each, the FFN beside kept
class _GatedNormBeforeAnFfn(torch.nn.Module):
    def __init__(self, rank: int = 16) -> None:
        super().__init__()
        self.norm = torch.nn.RMSNorm(D)
        self.fc1, self.fc2 = torch.nn.Linear(D, rank, bias=False), torch.nn.Linear(rank, D, bias=False)
        self.gate, self.up = torch.nn.Linear(D, F, bias=False), torch.nn.Linear(D, F, bias=False)
        self.down = torch.nn.Linear(F, D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(x)
        y = y * torch.sigmoid(self.fc2(torch.nn.functional.silu(self.fc1(y))))
        return x + self.down(torch.nn.functional.silu(self.gate(y)) * self.up(y))


def test_a_gated_norms_low_rank_gate_is_no_ffn() -> None:
    found, _ = roles(_GatedNormBeforeAnFfn(), torch.randn(B, N, D))
    assert found == {**ffn(B, N, D, F, gated=True), "other": 2 * B * N * D * 16}


class _TokenHead(torch.nn.Module):
    def __init__(self, outputs: int = 4) -> None:
        super().__init__()
        self.proj_in, self.hidden, self.proj_out = (torch.nn.Linear(D, D), torch.nn.Linear(D, D),
                                                    torch.nn.Linear(D, outputs))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # [B, prompts, tokens, d]: the first token's MLP
        x = torch.relu(self.proj_in(tokens[:, :, 0, :]))
        return torch.sigmoid(self.proj_out(torch.relu(self.hidden(x))))


@pytest.mark.parametrize("prompts", [1, 3])
def test_an_mlp_head_on_one_token_is_other(prompts: int) -> None:
    found, _ = roles(_TokenHead(), torch.randn(B, prompts, 5, D))
    assert found == {"other": B * prompts * (2 * D * D + D * 4)}


class _CaptionProjectedCrossAttention(torch.nn.Module):
    def __init__(self, caption: int) -> None:
        super().__init__()
        self.linear_1, self.linear_2 = torch.nn.Linear(caption, D), torch.nn.Linear(D, D)
        self.blocks = torch.nn.ModuleList(torch.nn.MultiheadAttention(D, H, batch_first=True) for _ in range(L))

    def forward(self, x: torch.Tensor, text: torch.Tensor) -> torch.Tensor:  # every block reads the one projection
        context = self.linear_2(torch.nn.functional.gelu(self.linear_1(text), approximate="tanh"))
        for block in self.blocks:
            x = x + block(x, context, context, need_weights=False)[0]
        return x


@pytest.mark.parametrize("caption", [D, 48])  # as wide as the model, and not
def test_a_caption_projection_is_other_whatever_its_width(caption: int) -> None:
    text = 7
    found, _ = roles(_CaptionProjectedCrossAttention(caption), torch.randn(B, N, D), torch.randn(B, text, caption))
    assert found == {**times(L, attention(B, N, text, D, H)), "other": B * text * (caption * D + D * D)}


class _MlpStack(torch.nn.Module):
    """Blocks d → f → d with no residual, each read by the next one's up projection as it is, then a head."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(D, F), torch.nn.GELU(),
                                                              torch.nn.Linear(F, D)) for _ in range(L))
        self.head = torch.nn.Linear(D, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_a_stack_of_mlp_blocks_keeps_its_ffns() -> None:
    found, _ = roles(_MlpStack(), torch.randn(B, N, D))
    assert found == {**times(L, ffn(B, N, D, F)), "other": B * N * D * 3}
