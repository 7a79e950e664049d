"""Roles on the architectures people train now, per role against closed forms written from each config: DeepSeek-V3
(multi-head latent attention with low-rank query and key / value factors, a sigmoid router, shared and routed
experts, dense first layers) and GPT-OSS (attention sinks, a softmax router, experts with biases)."""

from __future__ import annotations

import warnings

import pytest
import torch

import flopscope

from closed_forms import add, rotary
from zoo import hf

transformers = pytest.importorskip("transformers")
TRANSFORMERS = tuple(int(part) for part in transformers.__version__.split(".")[:2])

n = 8  # tokens


def roles_of(model: torch.nn.Module, ids: torch.Tensor, mode: str) -> dict[str, int]:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prof = flopscope.profile(model, ids, mode=mode)
    by_role = prof.by_role()
    assert sum(by_role.values()) == prof.total()
    return {role: macs for role, macs in by_role.items() if macs}


DEEPSEEK = dict(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=3,
                first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4,
                num_experts_per_tok=2, n_shared_experts=1, n_group=2, topk_group=1, q_lora_rank=12, kv_lora_rank=8,
                qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5, max_position_embeddings=64)


def deepseek_v3_roles(c: dict[str, int]) -> dict[str, int]:
    """DeepSeek-V3 per role (batch 1, n tokens). Attention (MLA), every layer: the query factors q_a (d -> r_q) and
    q_b (r_q -> h·(nope + rope)) are q_proj; kv_a (d -> r_kv + rope: the latent and the shared rotary key) is
    k_proj (its latent columns feed keys and values: the first role, docs/roles.md section 3.5); kv_b's key columns
    (h·nope) are k_proj, its value columns (h·d_v) v_proj; scores over nope + rope, weighted sum over d_v. FFN: the
    dense layers d -> d_ff -> d gated; the MoE layers k routed experts per token and the shared expert, of
    moe_intermediate each, gated; the sigmoid router (d -> experts) other, and the rotary angles where they are a
    matmul (closed_forms.rotary)."""
    d, h, L, dense = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"], c["first_k_dense_replace"]
    r_q, r_kv, nope, rope, d_v = (c["q_lora_rank"], c["kv_lora_rank"], c["qk_nope_head_dim"], c["qk_rope_head_dim"],
                                  c["v_head_dim"])
    moe, k, experts, shared = (c["moe_intermediate_size"], c["num_experts_per_tok"], c["n_routed_experts"],
                               c["n_shared_experts"])
    ffn_per_branch = dense * n * d * c["intermediate_size"] + (L - dense) * (k + shared) * n * d * moe
    return {"q_proj": L * n * (d * r_q + r_q * h * (nope + rope)),
            "k_proj": L * n * (d * (r_kv + rope) + r_kv * h * nope),
            "v_proj": L * n * r_kv * h * d_v,
            "out_proj": L * n * h * d_v * d,
            "attn_scores": L * h * n * n * (nope + rope),
            "attn_weighted_sum": L * h * n * n * d_v,
            "ffn_up": ffn_per_branch, "ffn_gate": ffn_per_branch, "ffn_down": ffn_per_branch,
            "logits": n * d * c["vocab_size"],
            "other": (L - dense) * n * d * experts + rotary(n, rope).get("other", 0)}


MODES = ["real", "fake", "meta"]  # meta: the model built on device="meta", counted in fake mode


def build(cls: str, config: str, attn: str, mode: str, settings: dict[str, int]) -> torch.nn.Module:
    return hf(cls, config, attn=attn, device="meta" if mode == "meta" else None, **settings)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("mode", MODES)
def test_deepseek_v3_roles_equal_their_closed_forms(attn: str, mode: str) -> None:
    """At 3bbe37a k_proj was 0 (the key is assembled in place: key[..., :nope].copy_(k_nope)), q_a_proj other, the
    router ffn_up, and the second MoE layer's factors ffn_down."""
    model = build("DeepseekV3ForCausalLM", "DeepseekV3Config", attn, mode, DEEPSEEK)
    ids = torch.randint(0, DEEPSEEK["vocab_size"], (1, n))
    assert roles_of(model, ids, "fake" if mode == "meta" else mode) == deepseek_v3_roles(DEEPSEEK)


GPT_OSS = dict(vocab_size=64, hidden_size=32, intermediate_size=16, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
               layer_types=["sliding_attention", "full_attention"])


def gpt_oss_roles(c: dict[str, int]) -> dict[str, int]:
    """GPT-OSS per role (batch 1, n tokens): grouped-query attention with biases and sinks (the sink is one more
    logit per row of the softmax: no multiply); the sliding layer's scores are computed for every pair and masked
    (eager attention); k experts per token, each gate / up (interleaved columns of one product) and down of
    intermediate_size; the softmax router (d -> experts) other, and the rotary angles where they are a matmul."""
    d, h, kv, hd, L = (c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"],
                       c["num_hidden_layers"])
    routed = n * c["num_experts_per_tok"] * d * c["intermediate_size"]
    return {"q_proj": L * n * d * h * hd, "k_proj": L * n * d * kv * hd, "v_proj": L * n * d * kv * hd,
            "out_proj": L * n * h * hd * d, "attn_scores": L * h * n * n * hd, "attn_weighted_sum": L * h * n * n * hd,
            "ffn_up": L * routed, "ffn_gate": L * routed, "ffn_down": L * routed,
            "logits": n * d * c["vocab_size"],
            "other": L * n * d * c["num_local_experts"] + rotary(n, hd).get("other", 0)}


@pytest.mark.parametrize("mode", MODES)
def test_gpt_oss_roles_equal_their_closed_forms(mode: str) -> None:
    """At 3bbe37a the router was ffn_up (the per-expert bias lookup gate_up_proj_bias[expert_ids] has a
    router-derived index) and ffn_gate changed between runs."""
    model = build("GptOssForCausalLM", "GptOssConfig", "eager", mode, GPT_OSS)
    ids = torch.randint(0, GPT_OSS["vocab_size"], (1, n))
    for _ in range(2):
        assert roles_of(model, ids, "fake" if mode == "meta" else mode) == gpt_oss_roles(GPT_OSS)


def hybrid(cls: str, config: str, settings: dict, mode: str) -> dict[str, int]:
    model = build(cls, config, "eager", mode, settings)
    ids = torch.randint(0, settings["vocab_size"], (1, n))
    return roles_of(model, ids, "fake" if mode == "meta" else mode)


def attention_layer(d: int, h: int, kv: int, hd: int, q_width: int | None = None) -> dict[str, int]:
    """One softmax attention layer over n tokens (``q_width``: the query projection's columns, if not h·hd)."""
    return {"q_proj": n * d * (q_width or h * hd), "k_proj": n * d * kv * hd, "v_proj": n * d * kv * hd,
            "out_proj": n * h * hd * d, "attn_scores": h * n * n * hd, "attn_weighted_sum": h * n * n * hd}


QWEN3_NEXT = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8, linear_num_value_heads=4, linear_num_key_heads=2,
                  linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4, num_experts=4,
                  num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=16,
                  layer_types=["linear_attention", "full_attention"])


@pytest.mark.skipif(TRANSFORMERS < (5, 23), reason="the closed forms are those of transformers 5.23's rewritten "
                    "reference kernel (older kernels multiply in another order; docs/guarantees.md section 7)")
@pytest.mark.parametrize("mode", MODES)
def test_qwen3_next_gated_deltanet_is_attention_not_ffn(mode: str) -> None:
    """Gated DeltaNet (the reference chunked kernel: n padded to one chunk of 64). Its query and key columns of
    in_proj_qkvz reach the in-chunk quadratic form through the short depthwise convolution: q_proj, k_proj; the
    in-chunk scores q·kᵀ and weighted sum are attention; its value columns reach the weighted sum through the delta
    rule's triangular solve (its right-hand side β·V: looked through, the one-column β left aside): v_proj;
    out_proj is out_proj. The recurrent state's products: kᵀ·v_new (the same values the chunk's weights multiply)
    writes the state, attn_kv_state (h_v·chunk·d_k·d_v per chunk); q·S and the delta rule's k_cumdecay·S read it,
    attn_readout (twice that), the first chunk's reading the initial zero state. The gate columns, in_proj_ba (β and
    the decay), the key Gram matrix and the solve stay other (docs/roles.md 3.2.2).
    At 3bbe37a the core was other, in_proj_qkvz ffn_up and out_proj ffn_down. The full-attention layer has an
    output gate in its query projection: its query columns are q_proj, its gate's other, as a gate projection of its
    own is (issue 47's convention; before, one role demanded took all the columns)."""
    c = QWEN3_NEXT
    d, hk, hv, dk, dv, chunk = 32, 2, 4, 8, 8, 64
    conv_channels = 2 * hk * dk + hv * dv
    linear = {"q_proj": n * d * hk * dk, "k_proj": n * d * hk * dk, "v_proj": n * d * hv * dv,
              "out_proj": n * hv * dv * d,
              "attn_scores": hv * chunk * chunk * dk, "attn_weighted_sum": hv * chunk * chunk * dv,
              "attn_kv_state": hv * dk * chunk * dv, "attn_readout": 2 * hv * chunk * dk * dv,
              "conv": conv_channels * (n + c["linear_conv_kernel_dim"] - 1) * c["linear_conv_kernel_dim"]}
    full = attention_layer(d, 4, 2, 8)  # (the query projection's gate half: other)
    per_moe_branch = (2 * n * d * 16 + n * d * 16)  # two routed experts per token, and the shared expert
    moe = {"ffn_up": per_moe_branch, "ffn_gate": per_moe_branch, "ffn_down": per_moe_branch}
    expected = add(linear, full, moe, moe, {"logits": n * d * c["vocab_size"]})
    roles = hybrid("Qwen3NextForCausalLM", "Qwen3NextConfig", c, mode)
    assert {role: macs for role, macs in roles.items() if role != "other"} == expected


@pytest.mark.skipif(TRANSFORMERS < (5, 23), reason="transformers 5.23's reference kernel (as above)")
def test_qwen3_next_state_products_scale_with_the_chunks() -> None:
    """Over 130 tokens (three chunks of 64): one state write and two reads per chunk."""
    hv, dk, dv, chunk, chunks = 4, 8, 8, 64, 3
    model = build("Qwen3NextForCausalLM", "Qwen3NextConfig", "eager", "fake", QWEN3_NEXT)
    with torch.no_grad():
        roles = flopscope.profile(model, torch.randint(0, 64, (1, 130)), mode="fake").by_role()
    assert roles["attn_kv_state"] == chunks * hv * dk * chunk * dv
    assert roles["attn_readout"] == chunks * 2 * hv * chunk * dk * dv


KIMI_LINEAR = dict(vocab_size=64, pad_token_id=0, bos_token_id=1, eos_token_id=2, hidden_size=32, intermediate_size=64,
                   moe_intermediate_size=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                   kv_lora_rank=8, qk_rope_head_dim=4, v_head_dim=8, qk_nope_head_dim=8, num_local_experts=4,
                   num_experts_per_tok=2, linear_head_dim=8, linear_num_heads=4,
                   layer_types=["linear_attention", "full_attention"], mlp_layer_types=["dense", "dense"])


@pytest.mark.skipif(TRANSFORMERS < (5, 24) or not hasattr(transformers, "KimiLinearForCausalLM"),
                    reason="the closed forms are those of transformers 5.24's reference KDA kernel")
@pytest.mark.parametrize(("tokens", "chunks"), [(8, 1), (130, 3)])
def test_kimi_delta_attention_state_products(tokens: int, chunks: int) -> None:
    """Kimi-Linear's KDA (the reference chunked kernel, chunks of 64): its in-chunk scores are elementwise (a decay per
    channel), so no weighted sum is found; the state products are by the delta rule, the values corrected by a read of
    the state they update: kᵀ·v_new writes it (attn_kv_state, h·chunk·d_k·d_v per chunk), q·S and k_cumdecay·S read it
    (attn_readout, twice that); before, all three were other."""
    h, dk, dv, chunk = 4, 8, 8, 64
    model = build("KimiLinearForCausalLM", "KimiLinearConfig", "eager", "fake", KIMI_LINEAR)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        roles = flopscope.profile(model, torch.randint(0, 64, (1, tokens)), mode="fake").by_role()
    assert roles["attn_kv_state"] == chunks * h * dk * chunk * dv
    assert roles["attn_readout"] == chunks * 2 * h * chunk * dk * dv


BAMBA = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=4,
             mamba_d_conv=4, mamba_expand=2, attn_layer_indices=[1], mamba_chunk_size=8)


@pytest.mark.skipif(TRANSFORMERS < (5, 18), reason="before transformers 5.18 Mamba-2's C·Bᵀ and state products are "
                    "broadcast multiplies summed (elementwise, no matmul: no dual to find; docs/guarantees.md 7)")
@pytest.mark.parametrize("mode", MODES)
def test_mamba2_reads_as_its_attention_dual(mode: str) -> None:
    """Mamba-2 (Bamba) by state-space duality: the in-chunk C·Bᵀ is attn_scores, its product with x
    attn_weighted_sum; in_proj's C columns are q_proj, B columns k_proj, x columns v_proj (through the depthwise
    convolution), its z and dt columns other; out_proj out_proj. The inter-chunk state products stay other."""
    d, heads, d_head, state, k = 32, 4, 16, 4, 4
    inner = heads * d_head
    mamba = {"q_proj": n * d * state, "k_proj": n * d * state, "v_proj": n * d * inner, "out_proj": n * inner * d,
             "attn_scores": heads * n * n * state, "attn_weighted_sum": heads * n * n * d_head,
             "conv": (inner + 2 * state) * (n + k - 1) * k}
    mlp = {"ffn_up": n * d * 64, "ffn_gate": n * d * 64, "ffn_down": n * 64 * d}
    expected = add(mamba, attention_layer(d, 4, 2, 8), mlp, mlp, {"logits": n * d * BAMBA["vocab_size"]})
    roles = hybrid("BambaForCausalLM", "BambaConfig", BAMBA, mode)
    assert {role: macs for role, macs in roles.items() if role != "other"} == expected
    assert roles["other"] == n * d * (inner + heads) + _state_products(BAMBA)


@pytest.mark.skipif(TRANSFORMERS < (5, 18), reason="the matmul form of Mamba-2's reference kernel (as above)")
def test_mamba2_padding_to_whole_chunks_adds_no_projection_column() -> None:
    """12 tokens in chunks of 8: the reference kernel pads x, B and C to 16 positions with zeros. The padding holds no
    column of in_proj: its C columns (state of them) are q_proj, its B columns k_proj, its x columns v_proj, and
    nothing else; before, the pad's fill value 0 was read as in_proj's column 0 (a gate column), charged to all
    three."""
    d, heads, d_head, state, tokens = 32, 4, 16, 4, 12
    model = build("BambaForCausalLM", "BambaConfig", "eager", "fake", BAMBA)
    roles = roles_of(model, torch.randint(0, BAMBA["vocab_size"], (1, tokens)), "fake")
    # (the attention layer's q, k and v projections: 4·8, 2·8 and 2·8 columns)
    assert roles["q_proj"] == tokens * d * state + tokens * d * 4 * 8
    assert roles["k_proj"] == tokens * d * state + tokens * d * 2 * 8
    assert roles["v_proj"] == tokens * d * heads * d_head + tokens * d * 2 * 8


def _state_products(c: dict) -> int:
    """The inter-chunk state products of Mamba-2's reference kernel over one chunk (n = chunk): the chunk state
    Bᵀ·x (heads·d_head·state·n), its decay across chunks (heads·2·2·d_head·state) and the readout C·state
    (heads·n·state·d_head)."""
    heads, d_head, state = c["mamba_n_heads"], c["mamba_d_head"], c["mamba_d_state"]
    return heads * d_head * state * n + heads * 2 * 2 * d_head * state + heads * n * state * d_head


JAMBA = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, mamba_d_state=4, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=4,
             attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1, num_experts=2)


@pytest.mark.parametrize("mode", MODES)
def test_a_mamba_mixer_is_not_an_ffn(mode: str) -> None:
    """Mamba-1 (Jamba): the selective scan is elementwise but for its readout, so no attention form is found; its
    projections are other, never ffn_up / ffn_down (at 3bbe37a in_proj was ffn_up and out_proj ffn_down: the FFN
    pass read the gate silu(z) · y as a gated FFN; a product of activations behind the hidden layer now says
    token mixer). Its attention and FFN / MoE layers keep their roles."""
    d, inner, state, dt_rank, k = 32, 64, 4, 4, 4
    mlp = n * d * 64
    routed = 2 * n * d * 64  # two experts, both chosen
    expected = add(attention_layer(d, 4, 2, 8), {"ffn_up": mlp + routed, "ffn_gate": mlp + routed,
                                                  "ffn_down": mlp + routed},
                    {"conv": inner * (n + k - 1) * k, "logits": n * d * JAMBA["vocab_size"],
                     "other": (n * d * 2 * inner  # in_proj
                               + n * inner * (dt_rank + 2 * state)  # x_proj
                               + n * dt_rank * inner  # dt_proj
                               + n * inner * state  # the scan's readout C · state
                               + n * inner * d  # out_proj
                               + n * d * 2)})  # the router
    assert hybrid("JambaForCausalLM", "JambaConfig", JAMBA, mode) == expected


def test_deepseek_v3_reconciles_with_the_latent_attention_closed_form() -> None:
    """reconcile() predicts MLA from the attention module's own ranks (formulas.md section 7e'): every row exact,
    the factors inside their attention block (at 47d4c63 q_a_proj was a block of its own, predicted as a whole
    attention layer)."""
    model = build("DeepseekV3ForCausalLM", "DeepseekV3Config", "sdpa", "real", DEEPSEEK)
    with torch.no_grad():
        prof = flopscope.profile(model, torch.randint(0, DEEPSEEK["vocab_size"], (1, n)))
    rows = prof.reconcile().rows
    attention = [row for row in rows if row.block.endswith("self_attn")]
    assert {row.block for row in rows} >= {f"model.layers.{i}.self_attn" for i in range(DEEPSEEK["num_hidden_layers"])}
    assert not any(row.block.endswith(("q_a_proj", "kv_a_proj_with_mqa")) for row in rows)
    per_layer = {role: macs // DEEPSEEK["num_hidden_layers"] for role, macs in deepseek_v3_roles(DEEPSEEK).items()}
    for row in attention:
        assert row.predicted == per_layer[row.role] and row.exact, row


RWKV = dict(vocab_size=64, hidden_size=32, attention_hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            context_length=64)


@pytest.mark.parametrize("mode", MODES)
def test_rwkv_time_mixing_is_not_an_ffn(mode: str) -> None:
    """RWKV: time mixing is a token mixer (its WKV recurrence writes its output a position at a time,
    ``output[:, t] = ...``, elementwise work), so key / value / receptance / output are other; channel mixing is a
    squared-ReLU FFN (key ffn_up, value ffn_down) whose sigmoid(receptance) gate, applied after the down
    projection, stays other. Before, the FFN pass read sigmoid(receptance) · wkv as a gated FFN: key and value
    ffn_up, receptance ffn_gate, output ffn_down."""
    c = RWKV
    d, att, ff, L = c["hidden_size"], c["attention_hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    expected = {"ffn_up": L * n * d * ff, "ffn_down": L * n * ff * d, "logits": n * d * c["vocab_size"],
                "other": L * n * (3 * d * att + att * d)  # time mixing: key, value, receptance; output
                + L * n * d * d}  # channel mixing's receptance
    model = build("RwkvForCausalLM", "RwkvConfig", "eager", mode, RWKV)
    ids = torch.randint(0, RWKV["vocab_size"], (1, n))
    assert roles_of(model, ids, "fake" if mode == "meta" else mode) == expected
