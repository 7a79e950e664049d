"""Roles decided by what a value is, off the language-model zoo's shapes (docs/roles.md 3.4 and 3.5), each against
closed forms written from the modules' widths:

- a timestep MLP run once per *frame* (B·F rows) and repeated over each frame's tokens by ``expand`` is conditioning,
  as is one whose adaLN output is reshaped and chunked before it modulates the tokens;
- a blend of two streams by a learned scalar squashed by a sigmoid (SVD's ``AlphaBlender``) is no activation: the
  projections around it are no FFN;
- ``cat([sin(t·B), cos(t·B)])`` is a Fourier embedding, no hidden layer: the MLP after it keeps its FFN roles, with a
  down projection narrower than its input (reconcile predicts it from its own width);
- a text projection read by the key / value projections of several attention layers is no factor of one of them;
- joint attention whose streams each have one fused q/k/v projection reconciles exactly.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

import flopscope


def profile(model: nn.Module, *inputs: torch.Tensor) -> flopscope.Profile:
    torch.manual_seed(0)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prof = flopscope.profile(model.eval(), *inputs, mode="fake")
    assert sum(prof.by_role().values()) == prof.total()
    return prof


def nonzero(roles: dict[str, int]) -> dict[str, int]:
    return {role: macs for role, macs in roles.items() if macs}


class PerFrame(nn.Module):
    """Video tokens (B, F, P, d) conditioned per frame: a timestep MLP (f -> d -> d) on each frame's timestep, its
    result repeated over the frame's P tokens by ``expand``, then a position-wise FFN (d -> 4d -> d)."""

    def __init__(self, d: int, f: int) -> None:
        super().__init__()
        self.f = f
        self.time_1, self.time_2 = nn.Linear(f, d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        b, frames, p, d = x.shape
        freqs = t.reshape(b * frames, 1) * torch.ones(1, self.f)
        emb = self.time_2(F.silu(self.time_1(freqs)))  # (B·F, d): one row per frame
        h = x + emb.view(b, frames, 1, d).expand(b, frames, p, d)
        return h + self.down(F.gelu(self.up(h)))


def test_per_frame_timestep_mlp_is_conditioning():
    b, frames, p, d, f = 2, 3, 5, 8, 16
    prof = profile(PerFrame(d, f), torch.randn(b, frames, p, d), torch.rand(b, frames))
    n = b * frames * p
    assert nonzero(prof.by_role()) == {"ffn_up": n * d * 4 * d, "ffn_down": n * 4 * d * d,
                                       "other": b * frames * (f * d + d * d)}


class ChunkedAdaLN(nn.Module):
    """A timestep MLP (f -> d -> d), then adaLN (d -> 6d) reshaped to (B, 6, d) and chunked along the middle axis
    (Sana's and PixArt's ``scale_shift_table + t.reshape(B, 6, -1)``), modulating n tokens; a position-wise FFN."""

    def __init__(self, d: int, f: int) -> None:
        super().__init__()
        self.time_1, self.time_2, self.ada = nn.Linear(f, d), nn.Linear(d, d), nn.Linear(d, 6 * d)
        self.table = nn.Parameter(torch.zeros(1, 6, d))
        self.up, self.down = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        emb = self.time_2(F.silu(self.time_1(freqs)))
        mod = self.table + self.ada(F.silu(emb)).reshape(x.shape[0], 6, -1)
        shift, scale, gate, *_ = mod.chunk(6, dim=1)  # (B, 1, d) each
        h = F.layer_norm(x, x.shape[-1:]) * (1 + scale) + shift
        return x + gate * self.down(F.gelu(self.up(h)))


def test_chunked_adaln_timestep_mlp_is_conditioning():
    b, n, d, f = 2, 7, 8, 16
    prof = profile(ChunkedAdaLN(d, f), torch.randn(b, n, d), torch.randn(b, f))
    assert nonzero(prof.by_role()) == {"ffn_up": b * n * d * 2 * d, "ffn_down": b * n * 2 * d * d,
                                       "other": b * (f * d + d * d + d * 6 * d)}


class AlphaBlend(nn.Module):
    """proj_in, a spatial and a temporal stream, blended by sigmoid(a learned scalar), proj_out (SVD's
    ``TransformerSpatioTemporalModel`` with its ``AlphaBlender``): no hidden layer anywhere."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.proj_in, self.mix, self.proj_out = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.mix_factor = nn.Parameter(torch.tensor([0.5]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj_in(x)
        temporal = h + self.mix(h)
        alpha = torch.sigmoid(self.mix_factor)
        return self.proj_out(alpha * h + (1.0 - alpha) * temporal)


def test_a_sigmoid_of_a_learned_scalar_is_no_activation():
    b, n, d = 2, 6, 8
    prof = profile(AlphaBlend(d), torch.randn(b, n, d))
    assert nonzero(prof.by_role()) == {"other": 3 * b * n * d * d}


class FourierTimestep(nn.Module):
    """A Gaussian Fourier projection of the timestep (t·B, B a fixed (1, k) matrix), cat([sin, cos]), then an MLP
    (2k -> d -> d) whose output joins the sequence as one more token (so it is not spread over the positions)."""

    def __init__(self, d: int, k: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(1, k), requires_grad=False)
        self.linear_1, self.linear_2 = nn.Linear(2 * k, d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        proj = 2 * torch.pi * t[:, None] @ self.weight
        features = torch.cat([torch.sin(proj), torch.cos(proj)], dim=-1)
        token = self.linear_2(F.silu(self.linear_1(features)))
        return torch.cat([token[:, None], x], dim=1)


def test_fourier_features_are_no_hidden_layer():
    """The Fourier features are no hidden layer of t·B; the MLP after them maps 2k -> d -> d and writes back to no
    residual stream (its output joins the sequence as a token): an MLP between widths, other too (issue 47)."""
    b, n, d, k = 2, 4, 8, 6
    prof = profile(FourierTimestep(d, k), torch.randn(b, n, d), torch.rand(b))
    assert nonzero(prof.by_role()) == {"other": b * k + b * 2 * k * d + b * d * d}
    assert not prof.reconcile().rows


class JointAttention(nn.Module):
    """Joint attention over image and text tokens, one fused q/k/v projection per stream (``img_qkv``, ``txt_qkv``:
    d -> 3d), h heads; the text stream enters through ``txt_in`` once per model when ``shared`` says so."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.img_qkv, self.txt_qkv, self.to_out = nn.Linear(d, 3 * d), nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        qkv = torch.cat([self.txt_qkv(text), self.img_qkv(x)], dim=1)
        q, k, v = (t.unflatten(-1, (self.heads, -1)).transpose(1, 2) for t in qkv.chunk(3, dim=-1))
        out = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2)
        return x + self.to_out(out[:, text.shape[1]:])


class TwoJointLayers(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.txt_in = nn.Linear(d, d)
        self.layers = nn.ModuleList(JointAttention(d, heads) for _ in range(2))

    def forward(self, x: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        text = self.txt_in(text)
        for layer in self.layers:
            x = layer(x, text)
        return x


def joint_attention(b: int, n: int, m: int, d: int) -> dict[str, int]:
    """Per layer: q, k, v over the n image and m text tokens (d -> d each), the core over n + m tokens, the output
    projection on the image tokens."""
    tokens = b * (n + m)
    return {"q_proj": tokens * d * d, "k_proj": tokens * d * d, "v_proj": tokens * d * d,
            "attn_scores": b * (n + m) ** 2 * d, "attn_weighted_sum": b * (n + m) ** 2 * d, "out_proj": b * n * d * d}


def test_joint_attention_with_fused_per_stream_projections_reconciles():
    b, n, m, d, heads = 2, 6, 3, 8, 2
    prof = profile(JointAttention(d, heads), torch.randn(b, n, d), torch.randn(b, m, d))
    assert nonzero(prof.by_role()) == joint_attention(b, n, m, d)
    rows = prof.reconcile().rows
    assert rows and [(r.role, r.measured, r.predicted) for r in rows if not r.exact] == []


def test_a_projection_read_by_several_attentions_is_no_factor():
    """``txt_in`` feeds the text keys and values of both layers: an input embedding they share, ``other``."""
    b, n, m, d, heads = 2, 6, 3, 8, 2
    prof = profile(TwoJointLayers(d, heads), torch.randn(b, n, d), torch.randn(b, m, d))
    layer = joint_attention(b, n, m, d)
    assert nonzero(prof.by_role()) == {**{role: 2 * macs for role, macs in layer.items()}, "other": b * m * d * d}
    assert [(r.block, r.role) for r in prof.reconcile().rows if not r.exact] == []


class TanhGatedLayers(nn.Module):
    """Lumina-2 / Z-Image style layers: ``x + tanh(gate) * norm(ffn(norm(x) * (1 + scale)))`` with ``gate`` and
    ``scale`` from an adaLN Linear (d -> 2d) on one vector per sample, a SwiGLU FFN (d -> d_ff -> d). The tanh gate
    spreads a vector per sample over the tokens: it gates no hidden layer, and the next layer's projections are no
    down projection of it."""

    def __init__(self, d: int, d_ff: int, layers: int) -> None:
        super().__init__()
        self.ada = nn.ModuleList(nn.Linear(d, 2 * d) for _ in range(layers))
        self.w1 = nn.ModuleList(nn.Linear(d, d_ff, bias=False) for _ in range(layers))
        self.w3 = nn.ModuleList(nn.Linear(d, d_ff, bias=False) for _ in range(layers))
        self.w2 = nn.ModuleList(nn.Linear(d_ff, d, bias=False) for _ in range(layers))

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        for ada, w1, w3, w2 in zip(self.ada, self.w1, self.w3, self.w2, strict=True):
            gate, scale = ada(F.silu(emb)).unsqueeze(1).chunk(2, dim=-1)
            h = F.layer_norm(x, x.shape[-1:]) * (1 + scale)
            x = x + torch.tanh(gate) * F.layer_norm(w2(F.silu(w1(h)) * w3(h)), x.shape[-1:])
        return x


def test_a_tanh_gate_per_sample_gates_no_hidden_layer():
    b, n, d, d_ff, layers = 2, 5, 8, 24, 3
    prof = profile(TanhGatedLayers(d, d_ff, layers), torch.randn(b, n, d), torch.randn(b, d))
    tokens = b * n
    assert nonzero(prof.by_role()) == {"ffn_up": layers * tokens * d * d_ff, "ffn_gate": layers * tokens * d * d_ff,
                                       "ffn_down": layers * tokens * d_ff * d, "other": layers * b * d * 2 * d}


class ExpandedTimestep(nn.Module):
    """A timestep MLP (f -> d -> d) whose result is repeated over the tokens by ``expand`` before a per-token
    modulation Linear (d -> 2d) reads silu of it (Flux-3's modulations on packed sequences), then a position-wise FFN.
    The modulation runs on every token, but its hidden layer is a vector per sample spread over them: conditioning."""

    def __init__(self, d: int, f: int) -> None:
        super().__init__()
        self.time_1, self.time_2, self.mod = nn.Linear(f, d), nn.Linear(d, d), nn.Linear(d, 2 * d)
        self.up, self.down = nn.Linear(d, 3 * d), nn.Linear(3 * d, d)

    def forward(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        temb = self.time_2(F.silu(self.time_1(freqs)))[:, None].expand(-1, x.shape[1], -1)
        scale, shift = self.mod(F.silu(temb)).chunk(2, dim=-1)
        h = x * (1 + scale) + shift
        return x + self.down(F.gelu(self.up(h)))


def test_a_timestep_expanded_to_the_tokens_before_its_modulation_is_conditioning():
    b, n, d, f = 2, 6, 8, 16
    prof = profile(ExpandedTimestep(d, f), torch.randn(b, n, d), torch.randn(b, f))
    assert nonzero(prof.by_role()) == {"ffn_up": b * n * d * 3 * d, "ffn_down": b * n * 3 * d * d,
                                       "other": b * (f * d + d * d) + b * n * d * 2 * d}


class FactoredTextKeys(nn.Module):
    """Image queries attend to image and text keys (NucleusMoE's blocks): the text goes through ``encoder_proj``
    (d -> d) and then its own key / value projections, so ``encoder_proj`` is a factor of both; h heads declared."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.to_q, self.to_k, self.to_v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.encoder_proj, self.add_k_proj, self.add_v_proj = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.to_out = nn.Linear(d, d)

    def forward(self, x: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        c = self.encoder_proj(text)
        k = torch.cat([self.to_k(x), self.add_k_proj(c)], dim=1)
        v = torch.cat([self.to_v(x), self.add_v_proj(c)], dim=1)
        q, k, v = (t.unflatten(-1, (self.heads, -1)).transpose(1, 2) for t in (self.to_q(x), k, v))
        return self.to_out(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2))


def test_a_factor_before_a_streams_projections_adds_no_keys():
    b, n, m, d, heads = 2, 6, 3, 8, 2
    prof = profile(FactoredTextKeys(d, heads), torch.randn(b, n, d), torch.randn(b, m, d))
    # encoder_proj's columns reach both the text keys and values: k_proj, the first in role order (docs/roles.md 3.5)
    assert nonzero(prof.by_role()) == {"q_proj": b * n * d * d, "k_proj": b * (n + m) * d * d + b * m * d * d,
                                       "v_proj": b * (n + m) * d * d, "attn_scores": b * n * (n + m) * d,
                                       "attn_weighted_sum": b * n * (n + m) * d, "out_proj": b * n * d * d}
    assert [(r.role, r.measured, r.predicted) for r in prof.reconcile().rows if not r.exact] == []


class OneHeadKeys(nn.Module):
    """Cross-attention whose keys and values are one head wide (d_ctx -> d_k), shared by the h query heads
    (DreamLite's UNet): the module declares ``heads`` and no key / value head count."""

    def __init__(self, d: int, d_ctx: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.to_q, self.to_out = nn.Linear(d, d), nn.Linear(d, d)
        self.to_k, self.to_v = nn.Linear(d_ctx, d // heads), nn.Linear(d_ctx, d // heads)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        q = self.to_q(x).unflatten(-1, (self.heads, -1)).transpose(1, 2)
        k, v = (p(context)[:, None].expand(-1, self.heads, -1, -1) for p in (self.to_k, self.to_v))
        return self.to_out(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2))


def test_keys_one_head_wide_reconcile_from_the_key_projection_width():
    b, n, m, d, d_ctx, heads = 2, 6, 3, 8, 12, 4
    prof = profile(OneHeadKeys(d, d_ctx, heads), torch.randn(b, n, d), torch.randn(b, m, d_ctx))
    d_k = d // heads
    assert nonzero(prof.by_role()) == {"q_proj": b * n * d * d, "k_proj": b * m * d_ctx * d_k,
                                       "v_proj": b * m * d_ctx * d_k, "attn_scores": b * n * m * d,
                                       "attn_weighted_sum": b * n * m * d, "out_proj": b * n * d * d}
    assert [(r.role, r.measured, r.predicted) for r in prof.reconcile().rows if not r.exact] == []


class HyperConnections(nn.Module):
    """Token embeddings kept as ``hc`` parallel streams (B, n, hc, d) (DeepSeek-V4's and Hunyuan's hyper-connections):
    the FFN reads a mix of the streams and its output is written back to every stream, ``out[:, :, None, :]``
    broadcast over the ``hc`` axis. That value has a row per token: no condition, the FFN stays an FFN."""

    def __init__(self, vocab: int, d: int, d_ff: int, hc: int) -> None:
        super().__init__()
        self.hc = hc
        self.embed = nn.Embedding(vocab, d)
        self.mix = nn.Parameter(torch.full((hc,), 1.0 / hc))
        self.up, self.down = nn.Linear(d, d_ff), nn.Linear(d_ff, d)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)[:, :, None, :].expand(-1, -1, self.hc, -1)
        x = (h * self.mix[:, None]).sum(2)
        return h + self.down(F.gelu(self.up(x)))[:, :, None, :]


def test_a_token_stream_written_back_to_parallel_streams_is_no_condition():
    b, n, d, d_ff, hc, vocab = 2, 5, 8, 16, 4, 11
    prof = profile(HyperConnections(vocab, d, d_ff, hc), torch.randint(0, vocab, (b, n)))
    assert nonzero(prof.by_role()) == {"ffn_up": b * n * d * d_ff, "ffn_down": b * n * d_ff * d}


class XIELU(nn.Module):
    """An FFN whose activation is written out with ``expm1`` (transformers' xIELU of Apertus:
    ``where(x > 0, a·x² + b·x, (expm1(min(x, eps)) - x)·a_n + b·x)`` with a = softplus of a learned scalar)."""

    def __init__(self, d: int, d_ff: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(d, d_ff), nn.Linear(d_ff, d)
        self.alpha_p, self.alpha_n = nn.Parameter(torch.tensor([0.8])), nn.Parameter(torch.tensor([0.8]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x)
        a_p, a_n = F.softplus(self.alpha_p), 0.5 + F.softplus(self.alpha_n)
        act = torch.where(h > 0, a_p * h * h + 0.5 * h, (torch.expm1(torch.clamp(h, max=-1e-6)) - h) * a_n + 0.5 * h)
        return self.down(act)


def test_an_activation_written_with_expm1_makes_a_hidden_layer():
    b, n, d, d_ff = 2, 5, 8, 16
    prof = profile(XIELU(d, d_ff), torch.randn(b, n, d))
    assert nonzero(prof.by_role()) == {"ffn_up": b * n * d * d_ff, "ffn_down": b * n * d_ff * d}
