"""Every multiply gets one semantic role, found from the dataflow; per role, totals equal closed forms."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import flopscope
from flopscope import Role, RoleRule
from flopscope.studies.models import TransformerBlock

from closed_forms import add, attention, ffn, rotary, times
from zoo import CASES, built, fastpath

transformers = pytest.importorskip("transformers")

d, h, n, m, d_ff, B = 64, 4, 10, 7, 128, 2  # small shapes: width, heads, source / target lengths, FFN, batch


def roles(model: nn.Module, *args, mode: str = "fake", **kwargs) -> dict[str, int]:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prof = flopscope.profile(model.eval(), *args, mode=mode, **kwargs)
    by_role = prof.by_role()
    assert sum(by_role.values()) == prof.total()
    return {role: macs for role, macs in by_role.items() if macs}


def nonzero(expected: dict[str, int]) -> dict[str, int]:
    return {role: macs for role, macs in expected.items() if macs}


# base-size BERT and ViT take seconds each here; their families are reconciled at small sizes below
@pytest.mark.parametrize("name", [name for name, case in CASES.items() if case.family not in ("bert", "vit")])
def test_zoo_roles_equal_closed_forms(name):
    model, args, kwargs = built(name)
    with fastpath(CASES[name].fastpath):
        assert roles(model, *args, **kwargs) == nonzero(CASES[name].roles)


def ids(length: int, vocab: int = 100) -> torch.Tensor:
    return torch.randint(0, vocab, (B, length), generator=torch.Generator().manual_seed(length))


def encoder_decoder(layers: int, gated: bool = False) -> dict[str, int]:
    encoder = times(layers, add(attention(B, n, n, d, h), ffn(B, n, d, d_ff, gated)))
    decoder = times(layers, add(attention(B, m, m, d, h), attention(B, m, n, d, h), ffn(B, m, d, d_ff, gated)))
    return add(encoder, decoder)


def test_cross_attention_in_torch_decoder_layer_and_transformer():
    layer = nn.TransformerDecoderLayer(d, h, d_ff, batch_first=True)
    tgt, memory = torch.randn(B, m, d), torch.randn(B, n, d)
    assert roles(layer, tgt, memory) == add(attention(B, m, m, d, h), attention(B, m, n, d, h), ffn(B, m, d, d_ff))
    transformer = nn.Transformer(d, h, 2, 2, d_ff, batch_first=True)
    assert roles(transformer, torch.randn(B, n, d), tgt) == encoder_decoder(2)


class LearnedQuery(nn.Module):
    """Attention pooling with a learned query (SigLIP's head, Perceiver latents, Q-Former)."""

    def __init__(self, fast: bool, d: int, h: int):
        super().__init__()
        self.probe = nn.Parameter(torch.randn(1, 1, d))
        self.mha = nn.MultiheadAttention(d, h, batch_first=True)
        self.fast = fast

    def forward(self, x):
        query = self.probe.repeat(x.shape[0], 1, 1)
        return self.mha(query, x, x, need_weights=not self.fast)[0]


@pytest.mark.parametrize("fast", [False, True])
def test_a_learned_query_is_still_attention(fast):
    n = 16  # keys; the query is one learned vector
    with torch.no_grad():
        prof = flopscope.profile(LearnedQuery(fast, d, h).eval(), torch.randn(B, n, d))
    assert {r: m for r, m in prof.by_role().items() if m} == attention(B, 1, n, d, h)


@pytest.mark.parametrize("gated", [False, True])
def test_t5_encoder_decoder(gated):
    config = transformers.T5Config(d_model=d, d_kv=d // h, d_ff=d_ff, num_layers=2, num_decoder_layers=2,
                                   num_heads=h, vocab_size=100,
                                   feed_forward_proj="gated-gelu" if gated else "relu")
    assert roles(transformers.T5Model(config), input_ids=ids(n), decoder_input_ids=ids(m)) == encoder_decoder(2, gated)


def test_bart_encoder_decoder():
    config = transformers.BartConfig(d_model=d, encoder_layers=2, decoder_layers=2, encoder_attention_heads=h,
                                     decoder_attention_heads=h, encoder_ffn_dim=d_ff, decoder_ffn_dim=d_ff,
                                     vocab_size=100)
    assert roles(transformers.BartModel(config), input_ids=ids(n), decoder_input_ids=ids(m)) == encoder_decoder(2)


def test_fused_qkv_layouts():
    """GPT-NeoX interleaves q, k, v per head in one projection; Falcon's multi-query projection
    holds h query heads and one key / value head; Phi-3 fuses qkv and gate/up."""
    neox = transformers.GPTNeoXConfig(hidden_size=d, num_hidden_layers=2, num_attention_heads=h,
                                      intermediate_size=d_ff, vocab_size=100)
    assert roles(transformers.GPTNeoXModel(neox), ids(n)) == add(times(2, add(attention(B, n, n, d, h),
                                                                              ffn(B, n, d, d_ff))),
                                                                 rotary(n, d // h // 4))  # (a quarter rotates)
    falcon = transformers.FalconConfig(hidden_size=d, num_hidden_layers=2, num_attention_heads=h, vocab_size=100,
                                       new_decoder_architecture=False, multi_query=True)
    assert roles(transformers.FalconModel(falcon), ids(n)) == add(times(2, add(attention(B, n, n, d, h, n_kv=1),
                                                                               ffn(B, n, d, 4 * d))),
                                                                  rotary(n, d // h))
    phi3 = transformers.Phi3Config(hidden_size=d, num_hidden_layers=2, num_attention_heads=h, num_key_value_heads=2,
                                   intermediate_size=d_ff, vocab_size=100, pad_token_id=0, eos_token_id=1,
                                   bos_token_id=1)
    assert roles(transformers.Phi3Model(phi3), ids(n)) == add(times(2, add(attention(B, n, n, d, h, n_kv=2),
                                                                           ffn(B, n, d, d_ff, gated=True))),
                                                              rotary(n, d // h))


def llama(vocab: int = 100) -> nn.Module:
    config = transformers.LlamaConfig(hidden_size=d, intermediate_size=d_ff, num_hidden_layers=2,
                                      num_attention_heads=h, num_key_value_heads=2, vocab_size=vocab)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def test_llama_logits_and_decoding_with_a_kv_cache():
    model = llama()
    layers = times(2, add(attention(B, n, n, d, h, n_kv=2), ffn(B, n, d, d_ff, gated=True)))
    assert roles(model, ids(n)) == add(layers, {"logits": B * n * d * 100}, rotary(n, d // h))
    with torch.no_grad():
        cache = model(ids(n), use_cache=True).past_key_values
    # one new token: Q, K, V, O projected for it alone; its query meets all n + 1 cached keys
    d_k, n_kv, t = d // h, 2, n + 1
    per_layer = {"q_proj": B * 1 * d * h * d_k, "k_proj": B * 1 * d * n_kv * d_k, "v_proj": B * 1 * d * n_kv * d_k,
                 "attn_scores": B * h * 1 * t * d_k, "attn_weighted_sum": B * h * 1 * t * d_k,
                 "out_proj": B * 1 * h * d_k * d}
    step = times(2, add(per_layer, ffn(B, 1, d, d_ff, gated=True)))
    got = roles(model, ids(1), past_key_values=cache, mode="real")
    assert got == add(step, {"logits": B * 1 * d * 100}, rotary(1, d_k))


def test_mixture_of_experts_counts_the_experts_that_ran_and_the_router_as_other():
    experts, top_k = 4, 2
    config = transformers.MixtralConfig(hidden_size=d, intermediate_size=d_ff, num_hidden_layers=2,
                                        num_attention_heads=h, num_key_value_heads=2, num_local_experts=experts,
                                        num_experts_per_tok=top_k, vocab_size=100)
    torch.manual_seed(0)
    expected = times(2, add(attention(B, n, n, d, h, n_kv=2),
                            ffn(B, n * top_k, d, d_ff, gated=True),  # every token meets top_k experts
                            {"other": B * n * d * experts}))  # the router
    expected = add(expected, rotary(n, d // h))
    assert roles(transformers.MixtralModel(config), ids(n), mode="fake") == expected  # grouped mm on fake tensors
    with torch.device("meta"):
        on_meta = transformers.MixtralModel(config)
    assert roles(on_meta, torch.zeros((B, n), dtype=torch.long, device="meta"), mode="fake") == expected


def test_shared_expert_gate_and_shared_expert_in_a_mixture_of_experts():
    n, d_ff, experts, top_k, L = 16, 64, 4, 2, 2
    config = transformers.Qwen2MoeConfig(hidden_size=d, num_hidden_layers=L, num_attention_heads=h,
                                         num_key_value_heads=h, moe_intermediate_size=d_ff,
                                         shared_expert_intermediate_size=d_ff, num_experts=experts,
                                         num_experts_per_tok=top_k, vocab_size=100, intermediate_size=d_ff,
                                         decoder_sparse_step=1)
    torch.manual_seed(0)
    prof = flopscope.profile(transformers.Qwen2MoeModel(config).eval(), torch.randint(0, 100, (1, n)))
    tokens = n
    expected = times(L, add(attention(1, n, n, d, h),
                            ffn(1, tokens * top_k, d, d_ff, gated=True),  # routed experts
                            ffn(1, tokens, d, d_ff, gated=True),  # the shared expert sees every token
                            {"other": tokens * d * experts + tokens * d * 1}))  # router, shared-expert gate
    expected = add(expected, rotary(n, d // h))
    assert {r: m for r, m in prof.by_role().items() if m} == expected
    result = prof.reconcile()
    assert result.unexplained() == [] and result.all_exact(), result.to_table()


def test_convolutional_model():
    cnn = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    assert roles(cnn, torch.randn(B, 3, 16, 16)) == {"conv": B * 8 * 16 * 16 * (3 + 8) * 9, "other": B * 8 * 10}


# --------------------------------------------------------------------------------------------------
# names do not matter; rules can add what dataflow cannot see
class Meaningless(nn.Module):
    """TransformerBlock with every submodule renamed (and a rotary-style mix on q and k)."""

    def __init__(self, d: int, h: int, d_ff: int):
        super().__init__()
        self.h = h
        self.a, self.b, self.c, self.e = (nn.Linear(d, d) for _ in range(4))
        self.f, self.g = nn.Linear(d, d_ff), nn.Linear(d_ff, d)
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)

    def forward(self, x):
        B_, n_, d_ = x.shape
        heads = [p(x).view(B_, n_, self.h, -1).transpose(1, 2) for p in (self.a, self.b, self.c)]
        q, k = (t * 0.5 + torch.flip(t, [-1]) * 0.5 for t in heads[:2])
        w = F.softmax(q @ k.transpose(-2, -1) / math.sqrt(d_ // self.h), dim=-1)
        x = self.n1(x + self.e((w @ heads[2]).transpose(1, 2).reshape(B_, n_, d_)))
        return self.n2(x + self.g(F.gelu(self.f(x))))


def test_renamed_modules_get_the_same_roles():
    expected = add(attention(B, n, n, d, h), ffn(B, n, d, d_ff))
    x = torch.randn(B, n, d)
    assert roles(TransformerBlock(d, h, d_ff), x) == expected
    assert roles(Meaningless(d, h, d_ff), x) == expected


class LinearAttention(nn.Module):
    """Kernelised attention without a softmax: dataflow alone cannot call it attention."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d, bias=False)

    def forward(self, x):
        q, k, v = F.elu(self.qkv(x)).chunk(3, dim=-1)
        return q @ (k.transpose(-2, -1) @ v)


def test_user_rules_override_dataflow_inside_matching_modules():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.mixer = LinearAttention()

        def forward(self, x):
            return self.mixer(x)

    x = torch.randn(B, n, d)
    plain = roles(Net(), x)
    assert "attn_scores" not in plain
    rules = [RoleRule("mixer", Role.ATTN_SCORES, op="aten.bmm"), RoleRule(LinearAttention, "q_proj", op="aten.mm")]
    got = roles(Net(), x, roles=rules)
    assert got == {"q_proj": B * n * d * 3 * d, "attn_scores": B * d * n * d + B * n * d * d}


# --------------------------------------------------------------------------------------------------
# blocks, nodes, reports
def test_blocks_group_each_attention_and_ffn_instance():
    config = transformers.BertConfig(hidden_size=d, num_hidden_layers=2, num_attention_heads=h,
                                     intermediate_size=d_ff, vocab_size=100)
    torch.manual_seed(0)
    prof = flopscope.profile(transformers.BertModel(config).eval(), ids(n))
    blocks = prof.by_block()
    assert blocks["encoder.layer.1.attention"] == attention(B, n, n, d, h)
    assert blocks["encoder.layer.1"] == ffn(B, n, d, d_ff)
    assert blocks["pooler.dense"] == {"other": B * d * d}
    scores = next(r for r in prof.records if r.role == "attn_scores")
    assert prof.role_of(scores.node) is Role.ATTN_SCORES
    node = next(x for x in prof.graph.nodes if x.name == scores.node)
    assert node.meta["role"] == "attn_scores" and node.meta["block"] == scores.block
    from flopscope.render.text import role_table

    table = role_table(prof)
    assert "attn_scores" in table and "encoder.layer.*.attention (x2)" in table
    expected = add(times(2, add(attention(B, n, n, d, h), ffn(B, n, d, d_ff))), {"other": B * d * d})
    line = next(line for line in table.splitlines() if line.startswith("attn_scores "))
    scores = 2 * B * h * n * n * (d // h)  # two layers of B·h·n²·d_k
    assert line.split()[1] == f"{scores:,}"
    assert f"{100 * scores / sum(expected.values()):.1f}%" in line.split()
    assert line.rstrip().endswith("encoder.layer.*.attention (x2)")
    pooler = next(line for line in table.splitlines() if line.startswith("other "))
    assert pooler.split()[1] == f"{B * d * d:,}" and pooler.rstrip().endswith("pooler.dense")


class _GradientPenalty(nn.Module):
    """Self-attention whose forward differentiates its own output (a gradient penalty, a force field): the
    softmax's backward kernel runs inside the forward and must not be taken for attention."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.requires_grad_(True)
        with torch.enable_grad():
            weights = (self.q(x) @ self.k(x).transpose(-1, -2)).softmax(-1)
            y = self.o(weights @ self.v(x))
            (grad,) = torch.autograd.grad(y.sum(), x, create_graph=True)
        return y + grad


def test_a_softmax_gradient_inside_the_forward_is_not_attention() -> None:
    B, n, d = 2, 8, 16
    prof = flopscope.profile(_GradientPenalty(d), torch.randn(B, n, d), mode="real")
    forward = {r.module: r.role.value for r in prof.records if r.module in ("q", "k", "v", "o")}
    assert forward == {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "out_proj"}
    first_products = [r for r in prof.records if r.op == "aten.bmm"][:2]  # Q·Kᵀ, then softmax(·)·V
    assert [(r.role.value, r.multiplies) for r in first_products] == [
        ("attn_scores", B * n * n * d), ("attn_weighted_sum", B * n * n * d)]


def test_an_ffn_as_wide_as_the_vocabulary_is_not_taken_for_the_lm_head() -> None:
    d, h, width, layers, batch, n = 64, 8, 128, 2, 2, 10  # vocabulary = FFN width: same weight shapes
    config = transformers.LlamaConfig(hidden_size=d, intermediate_size=width, num_hidden_layers=layers,
                                      num_attention_heads=h, num_key_value_heads=h, vocab_size=width,
                                      tie_word_embeddings=False)
    prof = flopscope.profile(transformers.LlamaForCausalLM(config), torch.randint(0, width, (batch, n)))
    expected = add(times(layers, add(attention(batch, n, n, d, h), ffn(batch, n, d, width, gated=True))),
                   {"logits": batch * n * d * width}, rotary(n, d // h))
    assert {role: macs for role, macs in prof.by_role().items() if macs} == expected


class _FusedQkvIntoABuffer(nn.Module):
    """A fused QKV projection copied into a buffer made with new_empty (uninitialised memory) before the split."""

    def __init__(self, d: int = 32, h: int = 4) -> None:
        super().__init__()
        self.h, self.qkv, self.out = h, nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused = self.qkv(x)
        buffer = fused.new_empty(fused.shape)
        buffer.copy_(fused)
        q, k, v = (t.unflatten(-1, (self.h, -1)).transpose(1, 2) for t in buffer.chunk(3, dim=-1))
        return self.out(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(-2))


def test_columns_through_uninitialised_memory_are_no_columns_and_any_label_value_is_safe() -> None:
    from flopscope.attribute.columns import _union

    assert _union([torch.tensor([0, 5, 1 << 40, -1])]) == {-1, 0, 5, 1 << 40}  # a huge value: sorted, not counted
    B, n, d = 2, 16, 32
    roles = flopscope.profile(_FusedQkvIntoABuffer(), torch.randn(B, n, d), mode="real").by_role()
    third = B * n * d * d  # each of q, k, v: a third of the fused projection's columns
    assert (roles["q_proj"], roles["k_proj"], roles["v_proj"], roles["out_proj"]) == (third, third, third, third)


def test_labels_are_collected_exactly_from_large_tensors() -> None:
    """The collection reads one entry of a dim only where every entry along it is the same (an expanded dim, a
    sequence's positions); a dim whose first two entries agree but a later one differs is read whole."""
    from flopscope.attribute.columns import SMALL_LABELS, _union

    rows, width = 2 * SMALL_LABELS // 64, 64  # over SMALL_LABELS entries
    columns = torch.arange(width)
    assert _union([columns.expand(rows, width)]) == set(range(width))  # stride 0 along the rows
    assert _union([columns.expand(rows, width).contiguous()]) == set(range(width))  # the same, materialised
    late = columns.repeat(rows, 1)
    late[-1, 3] = width + 7  # the last row differs in one entry
    assert _union([late]) == set(range(width)) | {width + 7}
    halves = torch.cat([columns.expand(rows // 2, width), (columns + width).expand(rows // 2, width)])
    assert _union([halves]) == set(range(2 * width))


class SigmoidRoutedExperts(nn.Module):
    """DeepSeek-V3's routing: a sigmoid router picks top-k experts; each expert gathers its tokens with
    ``hidden[token_idx]`` (an index that comes from the router), runs a gated FFN and adds its output back."""

    def __init__(self, d: int = 16, d_ff: int = 32, experts: int = 4, k: int = 2) -> None:
        super().__init__()
        self.k = k
        self.router = nn.Linear(d, experts, bias=False)
        self.gate = nn.ModuleList(nn.Linear(d, d_ff, bias=False) for _ in range(experts))
        self.up = nn.ModuleList(nn.Linear(d, d_ff, bias=False) for _ in range(experts))
        self.down = nn.ModuleList(nn.Linear(d_ff, d, bias=False) for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, chosen = torch.sigmoid(self.router(x)).topk(self.k, dim=-1)
        out = torch.zeros_like(x)
        for e in range(len(self.up)):
            token_idx, slot = torch.where(chosen == e)
            h = x[token_idx]
            y = self.down[e](F.silu(self.gate[e](h)) * self.up[e](h)) * weights[token_idx, slot, None]
            out = out.index_add(0, token_idx, y)
        return out


def test_a_router_is_other_and_index_operands_are_not_walked() -> None:
    """At 3bbe37a the role searches walked back through the index of hidden[token_idx] to the router and read its
    sigmoid as an FFN activation: the router became ffn_up."""
    n, d, d_ff, experts, k = 12, 16, 32, 4, 2
    torch.manual_seed(0)
    prof = flopscope.profile(SigmoidRoutedExperts(d, d_ff, experts, k), torch.randn(n, d), mode="real")
    routed = n * k  # every token goes to k experts
    assert prof.by_role() == {"other": n * d * experts, "ffn_gate": routed * d * d_ff, "ffn_up": routed * d * d_ff,
                              "ffn_down": routed * d_ff * d}



@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_relative_position_scores_are_attention_scores_with_sdpa_as_without(attn: str) -> None:
    """Parakeet's (Transformer-XL) attention adds position scores q·rᵀ to q·kᵀ: eager attention before its softmax,
    SDPA as its attn_mask. At b06dc02 the SDPA path left them and the position projection in other (ten speech
    encoders of the zoo: Parakeet, Canary, wav2vec2-Conformer, ...); both are attention scores and keys."""
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "ParakeetEncoder"):
        pytest.skip("this transformers has no Parakeet")
    d, L, h, d_ff, frames = 64, 2, 4, 128, 64
    config = transformers.ParakeetEncoderConfig(hidden_size=d, num_hidden_layers=L, num_attention_heads=h,
                                                num_key_value_heads=h, intermediate_size=d_ff,
                                                subsampling_conv_channels=16)
    config._attn_implementation = attn
    torch.manual_seed(0)
    model = transformers.ParakeetEncoder(config).eval()
    n = frames // config.subsampling_factor  # tokens after the subsampling convolutions
    positions = 2 * n - 1  # relative distances -(n-1) .. n-1
    with torch.no_grad():
        roles = flopscope.profile(model, torch.randn(1, frames, config.num_mel_bins)).by_role()
    assert roles["attn_scores"] == L * (n * n + n * positions) * d
    assert roles["k_proj"] == L * (n + positions) * d * d
    assert roles["q_proj"] == roles["v_proj"] == roles["out_proj"] == L * n * d * d
    assert roles["attn_weighted_sum"] == L * n * n * d


class LSTMThenProjector(nn.Module):
    """A recurrent decoder and the projection after it (Parakeet's RNN-T / TDT decoder)."""

    def __init__(self, d: int, d_h: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(d, d_h, batch_first=True)
        self.projector = nn.Linear(d_h, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.projector(self.lstm(x)[0])


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_the_projection_after_an_unfused_lstm_is_not_an_ffn(device: str) -> None:
    """On meta the LSTM runs unfused: its gates are products of activations (o · tanh(c)), and at fef9486 the FFN pass
    read them as a gated FFN, making the projector ffn_down (the CPU kernel is one op: other)."""
    d, d_h, n = 16, 32, 8
    model = LSTMThenProjector(d, d_h).to(device)
    with torch.no_grad():
        roles = flopscope.profile(model, torch.randn(1, n, d, device=device)).by_role()
    assert roles == {"recurrent": n * 4 * d_h * (d + d_h), "other": n * d_h * d}
