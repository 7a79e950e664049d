"""Attention without a softmax op, found from the dataflow (docs/roles.md §3.2): a product of two activations
whose result reaches an operand of another activation product. Quadratic form (the n_q x n_k matrix: LSH,
sigmoid, ReLU, Bernoulli-sampled attention): attn_scores / attn_weighted_sum. Linear form (φ(Q)(φ(K)ᵀV)):
attn_kv_state / attn_readout / attn_normaliser. Expected MACs are closed forms derived from each model's code."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import flopscope

transformers = pytest.importorskip("transformers")

B, d, h = 2, 32, 4  # batch, width, heads of the hand-written blocks
d_k = d // h


def by_role(model: nn.Module, *args, mode: str = "fake") -> dict[str, int]:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prof = flopscope.profile(model.eval(), *args, mode=mode)
    roles = prof.by_role()
    assert sum(roles.values()) == prof.total()
    return {role: macs for role, macs in roles.items() if macs}


class _Heads(nn.Module):
    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.embed_dim, self.num_heads, self.head_dim = d, h, d // h
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def split(self, t: torch.Tensor) -> torch.Tensor:  # [B, n, d] -> [B, h, n, d_k]
        return t.view(t.shape[0], t.shape[1], self.num_heads, self.head_dim).transpose(1, 2)

    def merge(self, t: torch.Tensor) -> torch.Tensor:  # [B, h, n, d_k] -> [B, n, d]
        return self.o(t.transpose(1, 2).reshape(t.shape[0], t.shape[2], self.embed_dim))


class LinearAttention(_Heads):
    """Katharopoulos et al. 2020, φ = elu + 1: φ(Q)(φ(K)ᵀV) / φ(Q)·Σφ(K); no n x n matrix."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = F.elu(self.split(self.q(x))) + 1, F.elu(self.split(self.k(x))) + 1, self.split(self.v(x))
        state = k.transpose(-2, -1) @ v  # [B, h, d_k, d_v]
        z = 1 / (q @ k.sum(dim=-2, keepdim=True).transpose(-2, -1) + 1e-6)  # [B, h, n, 1]
        return self.merge((q @ state) * z)


class SigmoidAttention(_Heads):
    """Ramapuram et al. 2024: sigmoid(QKᵀ/√d_k − log n) V."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
        weights = torch.sigmoid(q @ k.transpose(-2, -1) / self.head_dim ** 0.5 - torch.log(torch.tensor(x.shape[1])))
        return self.merge(weights @ v)


class ReluAttention(_Heads):
    """ReLU attention (Wortsman et al. 2023): relu(QKᵀ)/n V."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
        return self.merge(F.relu(q @ k.transpose(-2, -1)) / x.shape[1] @ v)


class SoftmaxAttention(_Heads):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
        return self.merge(torch.softmax(q @ k.transpose(-2, -1) / self.head_dim ** 0.5, dim=-1) @ v)


def projections(n: int) -> dict[str, int]:
    """q, k, v and output projections of one block: B·n·d·d each."""
    return {role: B * n * d * d for role in ("q_proj", "k_proj", "v_proj", "out_proj")}


# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("block", [SigmoidAttention, ReluAttention, SoftmaxAttention])
def test_quadratic_attention_without_softmax_has_scores_and_weighted_sum(block):
    n = 24
    core = B * h * n * n * d_k  # QKᵀ and weights·V: every (query, key) pair, d_k MACs per head
    assert by_role(block(d, h), torch.randn(B, n, d)) == {
        **projections(n), "attn_scores": core, "attn_weighted_sum": core}


def test_linear_attention_has_a_kv_state_a_readout_and_a_normaliser():
    n = 24
    assert by_role(LinearAttention(d, h), torch.randn(B, n, d)) == {
        **projections(n),
        "attn_kv_state": B * h * n * d_k * d_k,  # φ(K)ᵀV: contraction over the n positions, per head
        "attn_readout": B * h * n * d_k * d_k,  # φ(Q)·state: each query reads the d_k x d_v summary
        "attn_normaliser": B * h * n * d_k,  # φ(Q)·Σφ(K): one dot product per query and head
    }


def test_linear_attention_reconciles_exactly():
    n = 24
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows = flopscope.profile(LinearAttention(d, h).eval(), torch.randn(B, n, d)).reconcile().rows
    assert {r.role: (r.measured, r.predicted, r.term) for r in rows} == {
        **{role: (macs, macs, "n·d²") for role, macs in projections(n).items()},
        "attn_kv_state": (B * n * d * d_k, B * n * d * d_k, "n·d²"),
        "attn_readout": (B * n * d * d_k, B * n * d * d_k, "n·d²"),
        "attn_normaliser": (B * n * d, B * n * d, "n·d"),
    }


def test_linear_attention_is_linear_in_n_where_softmax_attention_is_quadratic():
    lengths = (8, 16, 24, 40)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        linear = flopscope.scaling(LinearAttention(d, h).eval(), lambda n: torch.randn(B, n, d), lengths=lengths)
        softmax = flopscope.scaling(SoftmaxAttention(d, h).eval(), lambda n: torch.randn(B, n, d), lengths=lengths)
    # O(n·d²): B·d·d_k per token for the state and for the readout, B·d for the normaliser
    assert linear.attention().degree == 1
    assert linear.attention().coefficients[:2] == (0, 2 * B * d * d_k + B * d)
    for role, per_token in (("attn_kv_state", B * d * d_k), ("attn_readout", B * d * d_k), ("attn_normaliser", B * d)):
        assert linear.polynomials[role].coefficients[:2] == (0, per_token)
        assert linear.matches(role)
    # O(n²·d): 2·B·d MACs per (query, key) pair
    assert softmax.attention().degree == 2
    assert softmax.attention().coefficients[:3] == (0, 0, 2 * B * d)
    assert linear.per_token().coefficients[:2] == softmax.per_token().coefficients[:2] == (0, 4 * B * d * d)


# --------------------------------------------------------------------------------------------------
# Reformer: LSH attention (layer 0) and local attention (layer 1), normalised by exp(x − logsumexp(x))
n, d_r, h_r, d_kr, d_ff = 32, 32, 2, 8, 48  # tokens, width, heads, head width, FFN width
hashes, buckets, chunk, before, after = 2, 4, 8, 1, 0  # both layers: chunks of 8 see 1 chunk before


def reformer() -> nn.Module:
    config = transformers.ReformerConfig(
        vocab_size=64, hidden_size=d_r, num_attention_heads=h_r, attention_head_size=d_kr, feed_forward_size=d_ff,
        attn_layers=["lsh", "local"], axial_pos_embds=False, max_position_embeddings=64, is_decoder=False,
        num_hashes=hashes, num_buckets=buckets, hash_seed=0, lsh_attn_chunk_length=chunk,
        lsh_num_chunks_before=before, lsh_num_chunks_after=after, local_attn_chunk_length=chunk,
        local_num_chunks_before=before, local_num_chunks_after=after)
    torch.manual_seed(0)
    return transformers.ReformerModel(config)


def test_reformer_lsh_and_local_attention_by_role():
    ids = torch.randint(0, 64, (B, n), generator=torch.Generator().manual_seed(0))
    projection = B * n * d_r * (h_r * d_kr)  # one [B·n, d] x [d, h·d_k] projection
    keys_per_query = chunk * (1 + before + after)  # a chunk attends to itself and its neighbours
    lsh_core = B * h_r * hashes * n * keys_per_query * d_kr  # every hash round sorts and chunks all n tokens
    local_core = B * h_r * n * keys_per_query * d_kr
    hashing = B * h_r * n * d_kr * hashes * (buckets // 2)  # random rotations: not a projection, "other"
    assert by_role(reformer(), ids, mode="real") == {
        # LSH: one shared query_key projection (its columns reach queries and keys: q_proj, the first in
        # role order) and value; local: query, key, value
        "q_proj": 2 * projection, "k_proj": projection, "v_proj": 2 * projection, "out_proj": 2 * projection,
        "attn_scores": lsh_core + local_core, "attn_weighted_sum": lsh_core + local_core,
        "ffn_up": 2 * B * n * d_r * d_ff, "ffn_down": 2 * B * n * d_ff * d_r, "other": hashing,
    }


def test_yoso_bernoulli_sampled_attention_by_role():
    """YOSO's expectation path: (1 − acos(QKᵀ)/π)^τ · V."""
    n, layers, d_ff = 16, 2, 48
    config = transformers.YosoConfig(vocab_size=64, hidden_size=d, num_hidden_layers=layers, num_attention_heads=h,
                                     intermediate_size=d_ff, max_position_embeddings=64)
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (B, n), generator=torch.Generator().manual_seed(0))
    core = layers * B * h * n * n * d_k
    assert by_role(transformers.YosoModel(config), ids) == {
        **{role: layers * macs for role, macs in projections(n).items()},
        "attn_scores": core, "attn_weighted_sum": core,
        "ffn_up": layers * B * n * d * d_ff, "ffn_down": layers * B * n * d_ff * d,
    }
