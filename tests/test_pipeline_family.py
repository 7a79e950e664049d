"""The rest of the family, tiny: PixArt-α, Sana, CogVideoX, LTX-Video and HunyuanVideo pipelines, text given as
embeddings. For each: the denoiser runs in every step (guidance by batch, or embedded guidance: one pass), a fake
count equals a real run's by component and by step, and replaying repeated calls gives the same counts as capturing
every call."""

from __future__ import annotations

import warnings

import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from test_pipeline import count, sd_components  # noqa: E402

STEPS = 2


def pixart():
    vae = sd_components()["vae"]
    transformer = diffusers.PixArtTransformer2DModel(
        num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=8, num_layers=2,
        cross_attention_dim=16, sample_size=16, patch_size=2, caption_channels=24)
    text = torch.randn(1, 7, 24)
    return (diffusers.PixArtAlphaPipeline(tokenizer=None, text_encoder=None, vae=vae, transformer=transformer,
                                          scheduler=diffusers.DPMSolverMultistepScheduler()),
            dict(prompt_embeds=text, prompt_attention_mask=torch.ones(1, 7), negative_prompt_embeds=text,
                 negative_prompt_attention_mask=torch.ones(1, 7), negative_prompt=None, height=32, width=32,
                 guidance_scale=4.5, use_resolution_binning=False), "batch")


def sana():
    vae = diffusers.AutoencoderDC(
        in_channels=3, latent_channels=4, attention_head_dim=2, encoder_block_types=("ResBlock", "EfficientViTBlock"),
        decoder_block_types=("ResBlock", "EfficientViTBlock"), encoder_block_out_channels=(8, 8),
        decoder_block_out_channels=(8, 8), encoder_qkv_multiscales=((), (5,)), decoder_qkv_multiscales=((), (5,)),
        encoder_layers_per_block=(1, 1), decoder_layers_per_block=[1, 1], downsample_block_type="conv",
        upsample_block_type="interpolate", decoder_norm_types="rms_norm", decoder_act_fns="silu",
        scaling_factor=0.41407)
    transformer = diffusers.SanaTransformer2DModel(
        patch_size=1, in_channels=4, out_channels=4, num_layers=2, num_attention_heads=2, attention_head_dim=4,
        num_cross_attention_heads=2, cross_attention_head_dim=4, cross_attention_dim=8, caption_channels=8,
        sample_size=32)
    text = torch.randn(1, 7, 8)
    return (diffusers.SanaPipeline(tokenizer=None, text_encoder=None, vae=vae, transformer=transformer,
                                   scheduler=diffusers.FlowMatchEulerDiscreteScheduler(shift=7.0)),
            dict(prompt_embeds=text, prompt_attention_mask=torch.ones(1, 7), negative_prompt_embeds=text,
                 negative_prompt_attention_mask=torch.ones(1, 7), negative_prompt=None, height=32, width=32,
                 guidance_scale=4.5, use_resolution_binning=False), "batch")


def cogvideox():
    transformer = diffusers.CogVideoXTransformer3DModel(
        num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4, time_embed_dim=2, text_embed_dim=16,
        num_layers=1, sample_width=2, sample_height=2, sample_frames=9, patch_size=2, temporal_compression_ratio=4,
        max_text_seq_length=16)
    vae = diffusers.AutoencoderKLCogVideoX(
        in_channels=3, out_channels=3, down_block_types=("CogVideoXDownBlock3D",) * 4,
        up_block_types=("CogVideoXUpBlock3D",) * 4, block_out_channels=(8, 8, 8, 8), latent_channels=4,
        layers_per_block=1, norm_num_groups=2, temporal_compression_ratio=4)
    text = torch.randn(1, 16, 16)
    return (diffusers.CogVideoXPipeline(tokenizer=None, text_encoder=None, vae=vae, transformer=transformer,
                                        scheduler=diffusers.CogVideoXDDIMScheduler()),
            dict(prompt_embeds=text, negative_prompt_embeds=text, height=16, width=16, num_frames=9,
                 guidance_scale=6.0, max_sequence_length=16), "batch")


def ltx():
    transformer = diffusers.LTXVideoTransformer3DModel(
        in_channels=8, out_channels=8, patch_size=1, patch_size_t=1, num_attention_heads=4, attention_head_dim=8,
        cross_attention_dim=32, num_layers=1, caption_channels=32)
    vae = diffusers.AutoencoderKLLTXVideo(
        in_channels=3, out_channels=3, latent_channels=8, block_out_channels=(8, 8, 8, 8),
        decoder_block_out_channels=(8, 8, 8, 8), layers_per_block=(1, 1, 1, 1, 1),
        decoder_layers_per_block=(1, 1, 1, 1, 1), spatio_temporal_scaling=(True, True, False, False),
        decoder_spatio_temporal_scaling=(True, True, False, False), decoder_inject_noise=(False,) * 5,
        upsample_residual=(False,) * 4, upsample_factor=(1,) * 4, timestep_conditioning=False, patch_size=1,
        patch_size_t=1, encoder_causal=True, decoder_causal=False)
    text = torch.randn(1, 7, 32)
    return (diffusers.LTXPipeline(scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=None,
                                  tokenizer=None, transformer=transformer),
            dict(prompt_embeds=text, prompt_attention_mask=torch.ones(1, 7), negative_prompt_embeds=text,
                 negative_prompt_attention_mask=torch.ones(1, 7), height=32, width=32, num_frames=9,
                 guidance_scale=3.0), "batch")


def hunyuan_video():
    transformer = diffusers.HunyuanVideoTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=10, num_layers=1,
        num_single_layers=1, num_refiner_layers=1, patch_size=1, patch_size_t=1, guidance_embeds=True,
        text_embed_dim=16, pooled_projection_dim=8, rope_axes_dim=(2, 4, 4))
    vae = diffusers.AutoencoderKLHunyuanVideo(
        in_channels=3, out_channels=3, latent_channels=4, down_block_types=("HunyuanVideoDownBlock3D",) * 4,
        up_block_types=("HunyuanVideoUpBlock3D",) * 4, block_out_channels=(8, 8, 8, 8), layers_per_block=1,
        act_fn="silu", norm_num_groups=4, scaling_factor=0.476986, spatial_compression_ratio=8,
        temporal_compression_ratio=4, mid_block_add_attention=True)
    return (diffusers.HunyuanVideoPipeline(text_encoder=None, tokenizer=None, transformer=transformer, vae=vae,
                                           scheduler=diffusers.FlowMatchEulerDiscreteScheduler(shift=7.0),
                                           text_encoder_2=None, tokenizer_2=None),
            dict(prompt_embeds=torch.randn(1, 7, 16), pooled_prompt_embeds=torch.randn(1, 8),
                 prompt_attention_mask=torch.ones(1, 7), height=16, width=16, num_frames=9, guidance_scale=6.0),
            "none")


FAMILY = {"pixart": pixart, "sana": sana, "cogvideox": cogvideox, "ltx": ltx, "hunyuan_video": hunyuan_video}


@pytest.mark.parametrize("name", sorted(FAMILY))
def test_the_family_counts_alike_fake_real_and_replayed(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        pipe, call, guidance = FAMILY[name]()
        for module in pipe.components.values():
            if isinstance(module, torch.nn.Module):
                module.eval()
    runs = {}
    for mode, reuse in (("fake", True), ("fake", False), ("real", True)):
        torch.manual_seed(0)
        runs[(mode, reuse)] = count(pipe, mode, reuse=reuse, num_inference_steps=STEPS, **call)
    fake = runs[("fake", True)]
    assert fake.denoisers == ("transformer",)
    assert [(dict(s.calls), s.guidance) for s in fake.steps()] == [({"transformer": 1}, guidance)] * STEPS
    per_step = {s.macs["transformer"] for s in fake.steps()}
    assert len(per_step) == 1 and per_step.pop() > 0
    assert fake.by_component()["vae"] > 0
    for other in (runs[("fake", False)], runs[("real", True)]):
        assert other.by_component() == fake.by_component()
        assert [s.macs for s in other.steps()] == [s.macs for s in fake.steps()]
        assert other.by_role() == fake.by_role()
    assert fake.workload().total == fake.total()
    assert any("replayed" in line for line in fake.reuse)
