"""Roles of diffusion models (diffusers, built from configs), per role against closed forms written from each config:
DiT (adaLN-Zero, a timestep MLP recomputed in every block), a UNet with cross-attention, SD3 (joint attention over image
and text tokens, per-stream projections) and Flux (double-stream joint blocks and single-stream parallel blocks whose
``proj_out`` reads ``cat([attention, mlp])``). Conditioning (timestep, class and pooled-text embeddings, adaLN and
time-embedding projections: one vector per sample) is ``other``, never FFN or attention (docs/roles.md 3.4)."""

from __future__ import annotations

import warnings

import pytest
import torch

import flopscope

from closed_forms import add, times, total

diffusers = pytest.importorskip("diffusers")
MODES = ["fake", "real", "meta"]
FREQUENCIES = 256  # diffusers' sinusoidal timestep embedding width (Timesteps(256) in the DiT / SD3 / Flux embedders)


def roles_of(build, inputs, mode: str) -> dict[str, int]:
    device = "meta" if mode == "meta" else "cpu"
    torch.manual_seed(0)
    with torch.device(device):
        model = build().eval()
    kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prof = flopscope.profile(model, **kwargs, mode="fake" if mode == "meta" else mode)
    by_role = prof.by_role()
    assert sum(by_role.values()) == prof.total()
    return {role: macs for role, macs in by_role.items() if macs}


INPUTS = {
    "dit": lambda c: dict(hidden_states=torch.randn(1, c["C"], c["s"], c["s"]), timestep=torch.tensor([3]),
                          class_labels=torch.tensor([1])),
    "unet": lambda c: dict(sample=torch.randn(1, c["C"], c["s"], c["s"]), timestep=torch.tensor([3]),
                           encoder_hidden_states=torch.randn(1, c["m"], c["d_ctx"])),
    "sd3": lambda c: dict(hidden_states=torch.randn(1, c["C"], c["s"], c["s"]), timestep=torch.tensor([3]),
                          encoder_hidden_states=torch.randn(1, c["m"], c["d_text"]),
                          pooled_projections=torch.randn(1, c["pooled"])),
    "flux": lambda c: dict(hidden_states=torch.randn(1, c["n"], c["C"]),
                           encoder_hidden_states=torch.randn(1, c["m"], c["d_text"]),
                           pooled_projections=torch.randn(1, c["pooled"]), timestep=torch.tensor([0.5]),
                           img_ids=torch.zeros(c["n"], 3), txt_ids=torch.zeros(c["m"], 3)),
}


def self_attention(n: int, d: int) -> dict[str, int]:
    """q, k, v, out (d -> d each) and the core (h·d_k = d) over n tokens."""
    return {"q_proj": n * d * d, "k_proj": n * d * d, "v_proj": n * d * d, "out_proj": n * d * d,
            "attn_scores": n * n * d, "attn_weighted_sum": n * n * d}


def mlp(n: int, d: int, d_ff: int, gated: bool = False) -> dict[str, int]:
    return {"ffn_up": n * d * d_ff, "ffn_down": n * d_ff * d, **({"ffn_gate": n * d * d_ff} if gated else {})}


def timestep_mlp(d: int, width_in: int = FREQUENCIES) -> int:
    """Linear(width_in -> d), SiLU, Linear(d -> d) on one vector per sample."""
    return width_in * d + d * d


# ------------------------------------------------------------------------------------------------------------------
# DiT: h heads of d_k, L blocks, patch p, image side s (latent), C channels; n = (s/p)² tokens
DIT = dict(h=2, d_k=8, L=2, p=2, s=8, C=4, classes=10)


def build_dit():
    c = DIT
    return diffusers.DiTTransformer2DModel(num_attention_heads=c["h"], attention_head_dim=c["d_k"],
                                           in_channels=c["C"], num_layers=c["L"], sample_size=c["s"],
                                           patch_size=c["p"], num_embeds_ada_norm=c["classes"], norm_num_groups=2)


def dit_roles() -> dict[str, int]:
    c = DIT
    d, n, p, C, L = c["h"] * c["d_k"], (c["s"] // c["p"]) ** 2, c["p"], c["C"], c["L"]
    blocks = times(L, add(self_attention(n, d), mlp(n, d, 4 * d)))
    # the timestep MLP runs in every block and once more for the final layer; adaLN-Zero d -> 6d per block; the final
    # layer's modulation d -> 2d (proj_out_1) and its projection d -> p²·C per token (proj_out_2)
    conditioning = (L + 1) * timestep_mlp(d) + L * d * 6 * d + d * 2 * d
    return add(blocks, {"conv": n * d * C * p * p, "other": conditioning + n * d * p * p * C})


@pytest.mark.parametrize("mode", MODES)
def test_dit_roles(mode):
    c = DIT
    inputs = dict(hidden_states=torch.randn(1, c["C"], c["s"], c["s"]), timestep=torch.tensor([3]),
                  class_labels=torch.tensor([1]))
    assert roles_of(build_dit, inputs, mode) == dit_roles()


# ------------------------------------------------------------------------------------------------------------------
# A UNet with cross-attention: channels (32, 64), one layer per block, 8 heads, side 16, text m tokens of width d_ctx
UNET = dict(c0=32, c1=64, s=16, m=7, d_ctx=24, C=4)


def build_unet():
    c = UNET
    return diffusers.UNet2DConditionModel(
        sample_size=c["s"], in_channels=c["C"], out_channels=c["C"], block_out_channels=(c["c0"], c["c1"]),
        layers_per_block=1, down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=c["d_ctx"], attention_head_dim=8,
        norm_num_groups=8)


def conv(side: int, c_out: int, c_in: int, k: int = 3) -> int:
    """A k×k convolution with a side×side output."""
    return side * side * c_out * c_in * k * k


def resnet(side: int, c_in: int, c_out: int) -> int:
    """conv1 (3×3, c_in -> c_out), conv2 (3×3), and a 1×1 shortcut when the channels change."""
    return conv(side, c_out, c_in) + conv(side, c_out, c_out) + (conv(side, c_out, c_in, 1) if c_in != c_out else 0)


def unet_roles() -> dict[str, int]:
    c = UNET
    c0, c1, s, m, d_ctx = c["c0"], c["c1"], c["s"], c["m"], c["d_ctx"]
    half = s // 2

    def transformer(side: int, width: int) -> dict[str, int]:
        """proj_in / proj_out (1×1 convolutions), self-attention, cross-attention (queries on the n image tokens, keys
        and values on the m text tokens of width d_ctx), a GEGLU FFN (d -> 2·4d, split into gate and up; 4d -> d)."""
        n = side * side
        cross = {"q_proj": n * width * width, "k_proj": m * d_ctx * width, "v_proj": m * d_ctx * width,
                 "out_proj": n * width * width, "attn_scores": n * m * width, "attn_weighted_sum": n * m * width}
        return add(self_attention(n, width), cross, mlp(n, width, 4 * width, gated=True),
                   {"conv": 2 * conv(side, width, width, 1)})

    convs = (conv(s, c0, c["C"])  # conv_in
             + resnet(s, c0, c0) + conv(half, c0, c0)  # down 0: a resnet, the stride-2 downsampler
             + resnet(half, c0, c1)  # down 1
             + 2 * resnet(half, c1, c1)  # mid
             + resnet(half, 2 * c1, c1) + resnet(half, c1 + c0, c1) + conv(s, c1, c1)  # up 0 (skips 64, 32), upsampler
             + resnet(s, c1 + c0, c0) + resnet(s, c0 + c0, c0)  # up 1 (skips 32, 32)
             + conv(s, c["C"], c0))  # conv_out
    # the time embedding: sinusoid (c0) -> Linear(c0 -> 4·c0), SiLU, Linear(4·c0 -> 4·c0), then each resnet's
    # time_emb_proj (4·c0 -> its channels): down 0, down 1, mid ×2, up 0 ×2, up 1 ×2
    t = 4 * c0
    conditioning = c0 * t + t * t + t * (c0 + c1 + 2 * c1 + 2 * c1 + 2 * c0)
    return add(times(3, transformer(s, c0)), transformer(half, c1), {"conv": convs, "other": conditioning})


@pytest.mark.parametrize("mode", MODES)
def test_unet_with_cross_attention_roles(mode):
    c = UNET
    inputs = dict(sample=torch.randn(1, c["C"], c["s"], c["s"]), timestep=torch.tensor([3]),
                  encoder_hidden_states=torch.randn(1, c["m"], c["d_ctx"]))
    assert roles_of(build_unet, inputs, mode) == unet_roles()


# ------------------------------------------------------------------------------------------------------------------
# SD3 (MMDiT): L joint blocks over n image and m text tokens (the last block's text stream stops at attention)
SD3 = dict(h=2, d_k=8, L=2, p=2, s=8, C=4, m=7, d_text=24, pooled=12)


def build_sd3():
    c = SD3
    d = c["h"] * c["d_k"]
    return diffusers.SD3Transformer2DModel(
        sample_size=c["s"], patch_size=c["p"], in_channels=c["C"], num_layers=c["L"], attention_head_dim=c["d_k"],
        num_attention_heads=c["h"], joint_attention_dim=c["d_text"], caption_projection_dim=d,
        pooled_projection_dim=c["pooled"], out_channels=c["C"], pos_embed_max_size=16)


def joint_attention(n: int, m: int, d: int, text_out: bool) -> dict[str, int]:
    """Per-stream q, k, v (n·d², m·d²), one core over n + m tokens, per-stream outputs (the text's when it goes on)."""
    roles = {"q_proj": (n + m) * d * d, "k_proj": (n + m) * d * d, "v_proj": (n + m) * d * d,
             "out_proj": (n + m if text_out else n) * d * d,
             "attn_scores": (n + m) ** 2 * d, "attn_weighted_sum": (n + m) ** 2 * d}
    return roles


def sd3_roles() -> dict[str, int]:
    c = SD3
    d, n, m, p, C, L = c["h"] * c["d_k"], (c["s"] // c["p"]) ** 2, c["m"], c["p"], c["C"], c["L"]
    blocks = add(*[add(joint_attention(n, m, d, text_out=i < L - 1), mlp(n, d, 4 * d),
                       mlp(m, d, 4 * d) if i < L - 1 else {}) for i in range(L)])
    # timestep MLP, pooled-text MLP (pooled -> d -> d), adaLN: image d -> 6d per block, text d -> 6d (the last block's
    # text norm d -> 2d), the output norm d -> 2d
    conditioning = (timestep_mlp(d) + timestep_mlp(d, c["pooled"]) + L * d * 6 * d + (L - 1) * d * 6 * d
                    + d * 2 * d + d * 2 * d)
    per_token = m * c["d_text"] * d + n * d * p * p * C  # context_embedder, proj_out
    return add(blocks, {"conv": n * d * C * p * p, "other": conditioning + per_token})


@pytest.mark.parametrize("mode", MODES)
def test_sd3_joint_attention_roles(mode):
    c = SD3
    inputs = dict(hidden_states=torch.randn(1, c["C"], c["s"], c["s"]), timestep=torch.tensor([3]),
                  encoder_hidden_states=torch.randn(1, c["m"], c["d_text"]),
                  pooled_projections=torch.randn(1, c["pooled"]))
    assert roles_of(build_sd3, inputs, mode) == sd3_roles()


# ------------------------------------------------------------------------------------------------------------------
# Flux: one double-stream block, one single-stream block; n image tokens of C channels (patch 1), m text tokens
FLUX = dict(h=2, d_k=8, n=16, m=7, C=16, d_text=24, pooled=12)


def build_flux():
    c = FLUX
    return diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=c["C"], num_layers=1, num_single_layers=1, attention_head_dim=c["d_k"],
        num_attention_heads=c["h"], joint_attention_dim=c["d_text"], pooled_projection_dim=c["pooled"],
        guidance_embeds=False, axes_dims_rope=(2, 2, 4))


def flux_roles() -> dict[str, int]:
    c = FLUX
    d, n, m, C = c["h"] * c["d_k"], c["n"], c["m"], c["C"]
    double = add(joint_attention(n, m, d, text_out=True), mlp(n, d, 4 * d), mlp(m, d, 4 * d))
    # single stream over n + m tokens: q, k, v and proj_mlp (d -> 4d) read the same input; proj_out reads
    # cat([attention, gelu(proj_mlp)]) (5d -> d): its d attention rows are out_proj, its 4d MLP rows ffn_down
    single = add(self_attention(n + m, d), mlp(n + m, d, 4 * d))
    conditioning = (timestep_mlp(d) + timestep_mlp(d, c["pooled"]) + d * 6 * d * 2  # double block: both streams
                    + d * 3 * d + d * 2 * d)  # single block d -> 3d, output norm d -> 2d
    per_token = n * C * d + m * c["d_text"] * d + n * d * C  # x_embedder, context_embedder, proj_out
    return add(double, single, {"other": conditioning + per_token})


@pytest.mark.parametrize("mode", MODES)
def test_flux_double_and_single_stream_roles(mode):
    c = FLUX
    inputs = dict(hidden_states=torch.randn(1, c["n"], c["C"]),
                  encoder_hidden_states=torch.randn(1, c["m"], c["d_text"]),
                  pooled_projections=torch.randn(1, c["pooled"]), timestep=torch.tensor([0.5]),
                  img_ids=torch.zeros(c["n"], 3), txt_ids=torch.zeros(c["m"], 3))
    assert roles_of(build_flux, inputs, mode) == flux_roles()


def test_flux_single_block_splits_proj_out_by_rows():
    """One record, two roles: the single-stream proj_out's rows that hold the attention output are out_proj, those
    that hold the MLP's hidden layer ffn_down."""
    c = FLUX
    d, tokens = c["h"] * c["d_k"], c["n"] + c["m"]
    with torch.no_grad():
        prof = flopscope.profile(build_flux().eval(), hidden_states=torch.randn(1, c["n"], c["C"]),
                                 encoder_hidden_states=torch.randn(1, c["m"], c["d_text"]),
                                 pooled_projections=torch.randn(1, c["pooled"]), timestep=torch.tensor([0.5]),
                                 img_ids=torch.zeros(c["n"], 3), txt_ids=torch.zeros(c["m"], 3), mode="fake")
    (record,) = [r for r in prof.records if r.module == "single_transformer_blocks.0.proj_out"]
    assert dict(record.roles) == {"out_proj": tokens * d * d, "ffn_down": tokens * 4 * d * d}
    assert record.block == "single_transformer_blocks.0"
    assert total(flux_roles()) == prof.total()


@pytest.mark.parametrize("batch", [1, 2])
def test_one_token_per_sample_is_still_position_wise(batch):
    """The conditioning rule reads shapes where a value meets the positions; a language model run on one token per
    sample (a decode step's shape) has FFNs whose rows equal the batch, and they stay FFNs: nothing spreads them."""
    transformers = pytest.importorskip("transformers")
    d, d_ff, L, h, kv, V = 32, 64, 2, 4, 2, 64
    config = transformers.LlamaConfig(hidden_size=d, intermediate_size=d_ff, num_hidden_layers=L,
                                      num_attention_heads=h, num_key_value_heads=kv, vocab_size=V)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        roles = flopscope.profile(model, torch.randint(0, V, (batch, 1)), mode="fake").by_role()
    assert {role: roles[role] for role in ("ffn_up", "ffn_gate", "ffn_down")} == times(L, mlp(batch, d, d_ff, True))


@pytest.mark.parametrize("name", ["dit", "unet", "sd3", "flux"])
def test_reconcile_is_exact_off_the_language_model_zoo(name):
    """Every reconcile row equals its closed form: cross-attention's keys on the context's m tokens of width d_ctx,
    joint attention over n + m tokens with per-stream projections, Flux's single stream over cat([text, image]) made
    inside the block (out_proj and ffn_down for their rows of proj_out), an FFN whose block is a container never
    called (diffusers' ``ff.net``), convolutions."""
    build, config = globals()[f"build_{name}"], globals()[name.upper()]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prof = flopscope.profile(build().eval(), **INPUTS[name](config), mode="fake")
    rows = prof.reconcile().rows
    assert rows and [(r.block, r.role, r.measured, r.predicted) for r in rows if not r.exact] == []
    assert {r.role for r in rows} >= {"q_proj", "attn_scores", "out_proj", "ffn_up", "ffn_down"}


# ------------------------------------------------------------------------------------------------------------------
# Sana: ReLU linear self-attention written (V·φ(K)ᵀ)·φ(Q), values padded with a row of ones (the normaliser inside the
# state), and softmax cross-attention to m text tokens; h heads of d_k, side s, patch 1: n = s² tokens
SANA = dict(h=2, d_k=8, L=2, s=8, C=4, m=5)


def test_sana_linear_attention_is_a_state_and_its_readout():
    c = SANA
    h, d_k, L, n, m = c["h"], c["d_k"], c["L"], c["s"] ** 2, c["m"]
    d = h * d_k
    model = diffusers.SanaTransformer2DModel(
        in_channels=c["C"], out_channels=c["C"], num_attention_heads=h, attention_head_dim=d_k, num_layers=L,
        num_cross_attention_heads=h, cross_attention_head_dim=d_k, cross_attention_dim=d, caption_channels=d,
        mlp_ratio=2.0, sample_size=c["s"], patch_size=1).eval()
    inputs = dict(hidden_states=torch.randn(1, c["C"], c["s"], c["s"]), encoder_hidden_states=torch.randn(1, m, d),
                  timestep=torch.tensor([3]))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prof = flopscope.profile(model, **inputs, mode="fake")
    roles = prof.by_role()
    state = L * h * (d_k + 1) * n * d_k  # each head's state: its d_v + 1 value rows by its d_k key columns, over n
    assert (roles["attn_kv_state"], roles["attn_readout"]) == (state, state)
    assert (roles["attn_scores"], roles["attn_weighted_sum"]) == (L * n * m * d, L * n * m * d)  # cross-attention only
    assert prof.reconcile().unexplained() == []


@pytest.mark.parametrize("processor", ["AttnProcessor", "AttnProcessor2_0"])
@pytest.mark.parametrize("name", ["dit", "unet"])
def test_each_attention_processor_lists_the_same_unsupported_work_in_real_and_fake_runs(name, processor):
    """diffusers' classic ``AttnProcessor`` (what ``set_default_attn_processor()`` installs) computes its scores as
    ``baddbmm(torch.empty(...), q, kᵀ, beta=0, alpha=scale)``: with ``beta=0`` the empty input is not read, so the
    real run flags nothing outside the dispatcher, as the fake run; the roles are the closed forms either way."""
    from diffusers.models import attention_processor

    build, config = globals()[f"build_{name}"], globals()[name.upper()]
    found = {}
    for mode in ("real", "fake"):
        torch.manual_seed(0)
        model = build().eval()
        for module in model.modules():
            if isinstance(module, attention_processor.Attention):
                module.set_processor(getattr(attention_processor, processor)())
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prof = flopscope.profile(model, **INPUTS[name](config), mode=mode)
        found[mode] = prof.unsupported()
        assert {role: macs for role, macs in prof.by_role().items() if macs} == globals()[f"{name}_roles"]()
    assert found["real"] == found["fake"] == {}
