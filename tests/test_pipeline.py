"""``flopscope.profile_pipeline``: one call of a diffusers pipeline counted as a whole, by component and by denoising
step, in fake mode (meta-built components included) and real mode alike. Each component's MACs equal profiling that
component alone on the inputs it received, times its calls; guidance by batch (Stable Diffusion) and by passes
(Flux's true CFG) both stated; the pipeline and its scheduler left as they were."""

from __future__ import annotations

import json
import re
import warnings

import pytest
import torch
from torch import nn

import flopscope

diffusers = pytest.importorskip("diffusers")
transformers = pytest.importorskip("transformers")

STEPS, SIDE, TEXT = 3, 32, 77  # denoising steps, image side (pixels), CLIP's padded prompt length
D_TEXT = 32


def clip_tokenizer(folder):
    """A CLIP tokenizer from a tiny vocabulary written into ``folder`` (no download): prompts pad to 77 tokens."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1, **{f"{c}</w>": 2 + i for i, c in enumerate("abcdefgh")}}
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    return transformers.CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"),
                                      model_max_length=TEXT)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return clip_tokenizer(tmp_path_factory.mktemp("clip"))


def sd_components(device: str = "cpu") -> dict:
    with torch.device(device), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        unet = diffusers.UNet2DConditionModel(
            block_out_channels=(32, 64), layers_per_block=1, sample_size=SIDE // 2, in_channels=4, out_channels=4,
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=D_TEXT, norm_num_groups=32)
        vae = diffusers.AutoencoderKL(block_out_channels=[32, 64], in_channels=3, out_channels=3, latent_channels=4,
                                      down_block_types=["DownEncoderBlock2D"] * 2,
                                      up_block_types=["UpDecoderBlock2D"] * 2, norm_num_groups=32)
        text_encoder = transformers.CLIPTextModel(transformers.CLIPTextConfig(
            hidden_size=D_TEXT, intermediate_size=37, num_attention_heads=4, num_hidden_layers=2, vocab_size=1000,
            max_position_embeddings=TEXT))
    return dict(unet=unet.eval(), vae=vae.eval(), text_encoder=text_encoder.eval(), scheduler=diffusers.DDIMScheduler(),
                safety_checker=None, feature_extractor=None, requires_safety_checker=False)


def stable_diffusion(tokenizer, device: str = "cpu"):
    return diffusers.StableDiffusionPipeline(tokenizer=tokenizer, **sd_components(device))


def count(pipe, mode: str = "fake", **call) -> flopscope.PipelineProfile:
    """``profile_pipeline(pipe, mode=mode, **call)`` under ``no_grad``, the libraries' warnings silenced."""
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return flopscope.profile_pipeline(pipe, mode=mode, **call)


def run_sd(pipe, mode: str) -> flopscope.PipelineProfile:
    torch.manual_seed(0)
    return count(pipe, mode, prompt="abc", num_inference_steps=STEPS, guidance_scale=7.5, height=SIDE, width=SIDE)


def alone(module: nn.Module, *args, **kwargs) -> int:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return flopscope.profile(module, *args, mode="fake", **kwargs).total()


class Decode(nn.Module):
    """The VAE's decode as a forward (the pipeline calls ``vae.decode``)."""

    def __init__(self, vae: nn.Module) -> None:
        super().__init__()
        self.vae = vae

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        return self.vae.decode(latents).sample


def test_stable_diffusion_components_are_their_calls(tokenizer):
    """Text encoder twice (the prompt and the empty negative prompt, 77 tokens each), the UNet once per step on the
    doubled batch (guidance by batch), the VAE decoder once on the latents (side / 2: two stages)."""
    pipe = stable_diffusion(tokenizer)
    prof = run_sd(pipe, "fake")
    latent = SIDE // 2
    unet = alone(pipe.unet, torch.randn(2, 4, latent, latent), torch.tensor(10), torch.randn(2, TEXT, D_TEXT))
    text = alone(pipe.text_encoder, torch.zeros(1, TEXT, dtype=torch.long))
    vae = alone(Decode(pipe.vae), torch.randn(1, 4, latent, latent))
    assert prof.by_component() == {"vae": vae, "text_encoder": 2 * text, "unet": STEPS * unet}
    assert prof.total() == vae + 2 * text + STEPS * unet == sum(prof.by_role().values())
    steps = prof.steps()
    assert prof.denoisers == ("unet",)
    assert [(s.step, dict(s.macs), dict(s.calls), s.batch, s.denoiser_batch, s.guidance) for s in steps] == [
        (i, {"unet": unet}, {"unet": 1}, 1, 2, "batch") for i in range(STEPS)]
    assert prof.denoising_macs() == STEPS * unet
    roles = prof.by_component_role()
    assert sum(roles["unet"].values()) == STEPS * unet and roles["unet"]["attn_scores"] > 0
    layers = pipe.text_encoder.config.num_hidden_layers
    assert roles["text_encoder"]["q_proj"] == 2 * layers * TEXT * D_TEXT * D_TEXT  # two calls: 77 tokens, d -> d


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_fake_and_meta_count_what_a_real_call_runs(tokenizer, device):
    real = run_sd(stable_diffusion(tokenizer), "real")
    fake = run_sd(stable_diffusion(tokenizer, device), "fake")
    assert fake.by_component() == real.by_component()
    assert fake.by_role() == real.by_role()
    assert [s.macs for s in fake.steps()] == [s.macs for s in real.steps()]
    assert isinstance(real.output.images, torch.Tensor) or real.output.images is not None


def test_the_pipeline_is_left_as_it_was(tokenizer):
    pipe = stable_diffusion(tokenizer)
    pipe.scheduler.set_timesteps(7)
    scheduler_before = {k: (v.clone() if isinstance(v, torch.Tensor) else v)
                        for k, v in vars(pipe.scheduler).items()}
    attributes_before = dict(vars(pipe))
    state_before = {name: {k: v for k, v in m.state_dict(keep_vars=True).items()}
                    for name, m in pipe.components.items() if isinstance(m, nn.Module)}
    run_sd(pipe, "fake")
    assert set(vars(pipe.scheduler)) == set(scheduler_before)
    for key, value in vars(pipe.scheduler).items():
        before = scheduler_before[key]
        assert torch.equal(value, before) if isinstance(value, torch.Tensor) else value == before, key
    assert "step" not in vars(pipe.scheduler)  # the step marker is gone
    assert vars(pipe) == attributes_before
    for name, state in state_before.items():
        now = getattr(pipe, name).state_dict(keep_vars=True)
        assert now.keys() == state.keys() and all(now[k] is state[k] for k in state), name
        assert all(not isinstance(t, torch._subclasses.fake_tensor.FakeTensor) for t in now.values())


def flux(device: str = "cpu"):
    with torch.device(device):
        transformer = diffusers.FluxTransformer2DModel(
            patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=D_TEXT, pooled_projection_dim=D_TEXT, axes_dims_rope=[4, 4, 8])
        vae = diffusers.AutoencoderKL(sample_size=SIDE, in_channels=3, out_channels=3, block_out_channels=(4,),
                                      layers_per_block=1, latent_channels=1, norm_num_groups=1, use_quant_conv=False,
                                      use_post_quant_conv=False, shift_factor=0.0609, scaling_factor=1.5035)
    return diffusers.FluxPipeline(scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=None,
                                  tokenizer=None, text_encoder_2=None, tokenizer_2=None, transformer=transformer)


@pytest.mark.parametrize(("true_cfg", "passes", "guidance"), [(1.0, 1, "none"), (2.0, 2, "passes")])
def test_flux_guidance_by_passes(true_cfg, passes, guidance):
    """Flux-dev is guidance-distilled (one pass per step); true CFG with a negative prompt runs the transformer twice
    per step. Text as embeddings (m tokens), latents packed 2x2: (side/2)² tokens of 4 channels."""
    m = 8
    pipe = flux()
    torch.manual_seed(0)
    text, pooled = torch.randn(1, m, D_TEXT), torch.randn(1, D_TEXT)
    prof = count(pipe, prompt_embeds=text, pooled_prompt_embeds=pooled,
                 negative_prompt_embeds=text, negative_pooled_prompt_embeds=pooled,
                 true_cfg_scale=true_cfg, num_inference_steps=2, height=SIDE, width=SIDE)
    n = (SIDE // 2) ** 2
    one = alone(pipe.transformer, hidden_states=torch.randn(1, n, 4), encoder_hidden_states=text,
                pooled_projections=pooled, timestep=torch.tensor([1.0]), img_ids=torch.zeros(n, 3),
                txt_ids=torch.zeros(m, 3), guidance=None)
    assert [(s.calls, s.macs, s.guidance) for s in prof.steps()] == [({"transformer": passes},
                                                                       {"transformer": passes * one}, guidance)] * 2
    assert prof.by_component()["transformer"] == 2 * passes * one


def test_not_a_pipeline_is_refused():
    with pytest.raises(flopscope.NotAModuleError, match="components"):
        flopscope.profile_pipeline(object())


def configs_only(folder, tokenizer_length: int | None = None):
    """The tiny Stable Diffusion pipeline written as configs alone (model_index.json and each component's config; the
    tokenizer named but without files, as a configs-only download has it)."""
    pipe = diffusers.StableDiffusionPipeline(tokenizer=None, **sd_components())
    pipe.save_config(folder)
    index = json.loads((folder / "model_index.json").read_text())
    index["tokenizer"] = ["transformers", "CLIPTokenizer"]
    (folder / "model_index.json").write_text(json.dumps(index))
    for name, component in pipe.components.items():
        if isinstance(component, nn.Module) or hasattr(component, "save_config"):
            (component.save_config if hasattr(component, "save_config") else component.config.save_pretrained)(
                folder / name)
    if tokenizer_length is not None:
        (folder / "tokenizer").mkdir()
        (folder / "tokenizer" / "tokenizer_config.json").write_text(json.dumps({"model_max_length": tokenizer_length}))
    return pipe


def test_a_pipeline_built_from_configs_on_meta_counts_as_the_real_one(tmp_path, tokenizer):
    """Built from configs alone on meta, with a stand-in tokenizer padding to CLIP's 77 tokens: the same counts as the
    pipeline built in memory with a real tokenizer."""
    from flopscope.workloads.pipeline_configs import ShapeTokenizer, pipeline_from_configs
    configs_only(tmp_path)
    built = pipeline_from_configs(tmp_path)
    assert isinstance(built.tokenizer, ShapeTokenizer) and built.tokenizer.model_max_length == TEXT
    assert all(p.is_meta for name in ("unet", "vae", "text_encoder") for p in getattr(built, name).parameters())
    assert run_sd(built, "fake").by_component() == run_sd(stable_diffusion(tokenizer), "fake").by_component()


def test_the_stand_in_tokenizer_pads_to_its_config_length(tmp_path):
    """The text encoder reads as many tokens as the tokenizer config says (here 20 instead of 77): its MACs follow."""
    from flopscope.workloads.pipeline_configs import pipeline_from_configs
    pipe = configs_only(tmp_path, tokenizer_length=20)
    prof = run_sd(pipeline_from_configs(tmp_path), "fake")
    assert prof.by_component()["text_encoder"] == 2 * alone(pipe.text_encoder, torch.zeros(1, 20, dtype=torch.long))


def test_an_empty_tokenizer_folder_is_a_stand_in_and_a_tokenizer_without_a_length_is_named(tmp_path, capsys):
    """An empty tokenizer folder is as missing files: the stand-in of CLIP's 77 tokens (transformers reads a tokenizer
    without vocabulary from it, whose model_max_length placeholder, about 1e30, overflowed the pipeline's padding).
    A tokenizer read from its files without a model_max_length is refused, naming the fix, which works."""
    from flopscope.cli import main
    from flopscope.workloads.pipeline_configs import ShapeTokenizer, pipeline_from_configs
    pipe = configs_only(tmp_path)
    (tmp_path / "tokenizer").mkdir()
    built = pipeline_from_configs(tmp_path)
    assert isinstance(built.tokenizer, ShapeTokenizer) and built.tokenizer.model_max_length == TEXT
    assert run_sd(built, "fake").by_component()["text_encoder"] == 2 * alone(
        pipe.text_encoder, torch.zeros(1, TEXT, dtype=torch.long))
    shorter = pipeline_from_configs(tmp_path, overrides={"tokenizer.model_max_length": 20})
    assert shorter.tokenizer.model_max_length == 20
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1, **{f"{c}</w>": 2 + i for i, c in enumerate("abcdefgh")}}
    (tmp_path / "tokenizer" / "vocab.json").write_text(json.dumps(vocab))  # files, but no tokenizer_config.json
    (tmp_path / "tokenizer" / "merges.txt").write_text("#version: 0.2\n")
    assert main(["profile", f"diffusers:{tmp_path}", "--steps", "1", "--size", "32x32"]) == 3
    err = capsys.readouterr().err
    assert f"the tokenizer 'tokenizer' in {tmp_path / 'tokenizer'} has no model_max_length" in err
    assert "OverflowError" not in err and "--set tokenizer.model_max_length=N" in err
    assert main(["profile", f"diffusers:{tmp_path}", "--steps", "1", "--size", "32x32", "--set",
                 "tokenizer.model_max_length=20", "--json", str(tmp_path / "p.json")]) == 0
    report = json.loads((tmp_path / "p.json").read_text())
    assert report["components"]["text_encoder"] == 2 * alone(pipe.text_encoder, torch.zeros(1, 20, dtype=torch.long))


def test_cli_profiles_a_diffusers_folder(tmp_path, capsys):
    from flopscope.cli import main
    configs_only(tmp_path)
    out = tmp_path / "pipe.json"
    assert main(["profile", f"diffusers:{tmp_path}", "--steps", "2", "--size", "32x32", "--guidance", "7.5",
                 "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["schema"] == "flopscope.pipeline/1" and len(report["steps"]) == 2
    assert report["total"] == sum(report["components"].values())
    assert [s["guidance"] for s in report["steps"]] == ["batch", "batch"]
    (unet,) = [t for t in report["workload"] if t["entry"] == "unet"]
    assert (unet["steps"], unet["passes"], unet["batch"]) == (2, 1, 2)
    assert sum(t["calls"] * t["macs_per_call"] for t in report["workload"]) == report["total"]
    assert {  # the text encoder reads its token ids (the embedding's index check); its layers are replayed
        "text_encoder: not replayed, each call captured: it read the values of tensors 1 time(s) (what runs may "
        "depend on them)",
        "unet: 1 of 2 calls replayed from an earlier call of the same inputs' shapes (fake tensors: the same records)",
    } <= set(report["reuse"])
    printed = capsys.readouterr().out
    assert "denoising steps (2; denoiser: unet)" in printed and "equal to the measured total" in printed


@pytest.mark.parametrize("argv", [["--input", "1x3"], ["--sweep", "8,16,24,32"], ["--mode", "real"]])
def test_cli_refuses_options_a_pipeline_does_not_take(tmp_path, argv, capsys):
    from flopscope.cli import main
    assert main(["profile", f"diffusers:{tmp_path}", *argv]) == 2
    assert "diffusers: target" in capsys.readouterr().err


def test_cli_refuses_pipeline_options_for_a_model(capsys):
    from flopscope.cli import main
    assert main(["profile", "flopscope.studies.models:TransformerBlock", "--steps", "4"]) == 2
    assert "only for diffusers: targets" in capsys.readouterr().err


def wan(device: str = "cpu"):
    with torch.device(device):
        transformer = diffusers.WanTransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=16, out_channels=16,
            text_dim=D_TEXT, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True,
            qk_norm="rms_norm_across_heads", rope_max_seq_len=32)
        vae = diffusers.AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                                         temperal_downsample=[False, True, True])
    return diffusers.WanPipeline(tokenizer=None, text_encoder=None, vae=vae, transformer=transformer,
                                 scheduler=diffusers.FlowMatchEulerDiscreteScheduler(shift=7.0))


@pytest.mark.parametrize("mode", ["fake", "real", "meta"])
def test_a_video_pipeline_per_step_and_per_frame(mode):
    """Wan 2.1 (tiny): 9 frames of 32² are latents of 1 + (9 - 1) / 4 = 3 frames of 4² (the VAE compresses time by 4
    and space by 8); classifier-free guidance by two transformer passes per step, each the transformer alone on those
    latents; fake, real and meta count the same."""
    m, frames, side, steps = 8, 9, 32, 2
    pipe = wan("meta" if mode == "meta" else "cpu")
    torch.manual_seed(0)
    text = torch.randn(1, m, D_TEXT)
    prof = count(pipe, "real" if mode == "real" else "fake", prompt_embeds=text,
                 negative_prompt_embeds=text, num_inference_steps=steps, height=side,
                 width=side, num_frames=frames, guidance_scale=5.0)
    latent_frames = 1 + (frames - 1) // 4
    one = alone(wan().transformer, hidden_states=torch.randn(1, 16, latent_frames, side // 8, side // 8),
                timestep=torch.tensor([500]), encoder_hidden_states=text)
    assert [(s.calls, s.macs, s.guidance) for s in prof.steps()] == [({"transformer": 2},
                                                                       {"transformer": 2 * one}, "passes")] * steps
    assert prof.by_component()["transformer"] == steps * 2 * one
    assert prof.by_component()["vae"] > 0 and prof.total() == sum(prof.by_component().values())


def test_a_controlnet_runs_beside_the_denoiser_at_every_step():
    """A ControlNet pipeline: the ControlNet and the UNet are both called once per step on the doubled batch (its
    conditioning image doubled too); each step is the two alone, and both are denoisers."""
    components = sd_components()
    controlnet = diffusers.ControlNetModel.from_unet(components["unet"], conditioning_embedding_out_channels=(16, 32))
    pipe = diffusers.StableDiffusionControlNetPipeline(tokenizer=None, controlnet=controlnet.eval(), **components)
    torch.manual_seed(0)
    text = torch.randn(1, TEXT, D_TEXT)
    prof = count(pipe, prompt_embeds=text, negative_prompt_embeds=text,
                 image=torch.rand(1, 3, SIDE, SIDE), num_inference_steps=2, height=SIDE,
                 width=SIDE, guidance_scale=7.5)
    latents, t, context = torch.randn(2, 4, SIDE // 2, SIDE // 2), torch.tensor(10), torch.randn(2, TEXT, D_TEXT)
    unet = alone(pipe.unet, latents, t, context)
    control = alone(pipe.controlnet, latents, t, context, controlnet_cond=torch.rand(2, 3, SIDE, SIDE))
    assert set(prof.denoisers) == {"unet", "controlnet"}
    assert [(dict(s.calls), dict(s.macs), s.guidance) for s in prof.steps()] == [
        ({"unet": 1, "controlnet": 1}, {"unet": unet, "controlnet": control}, "batch")] * 2


def test_sd3_joint_attention_pipeline_by_batch():
    """SD3 (tiny): guidance by batch, one transformer call per step on the doubled latents, text and pooled text
    doubled too; each step the transformer alone on those inputs; the VAE decode once."""
    m, d_text, pooled = 7, 24, 20
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        transformer = diffusers.SD3Transformer2DModel(
            sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=2,
            joint_attention_dim=d_text, caption_projection_dim=16, pooled_projection_dim=pooled, out_channels=4).eval()
        vae = diffusers.AutoencoderKL(block_out_channels=[32, 64], in_channels=3, out_channels=3, latent_channels=4,
                                      down_block_types=["DownEncoderBlock2D"] * 2,
                                      up_block_types=["UpDecoderBlock2D"] * 2, norm_num_groups=32,
                                      use_quant_conv=False, use_post_quant_conv=False, shift_factor=0.0609,
                                      scaling_factor=1.5035).eval()
    pipe = diffusers.StableDiffusion3Pipeline(
        transformer=transformer, scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=None,
        tokenizer=None, text_encoder_2=None, tokenizer_2=None, text_encoder_3=None, tokenizer_3=None)
    torch.manual_seed(0)
    text, pooled_text = torch.randn(1, m, d_text), torch.randn(1, pooled)
    prof = count(pipe, prompt_embeds=text, pooled_prompt_embeds=pooled_text,
                 negative_prompt_embeds=text, negative_pooled_prompt_embeds=pooled_text,
                 num_inference_steps=2, height=SIDE, width=SIDE, guidance_scale=5.0)
    latent = SIDE // 2
    one = alone(transformer, hidden_states=torch.randn(2, 4, latent, latent),
                encoder_hidden_states=text.repeat(2, 1, 1), pooled_projections=pooled_text.repeat(2, 1),
                timestep=torch.tensor([500, 500]))
    decode = alone(Decode(vae), torch.randn(1, 4, latent, latent))
    assert [(s.calls, s.macs, s.denoiser_batch, s.guidance) for s in prof.steps()] == [
        ({"transformer": 1}, {"transformer": one}, 2, "batch")] * 2
    assert prof.by_component() == {"vae": decode, "transformer": 2 * one}


@pytest.mark.parametrize("name", ["sd", "flux", "wan"])
def test_a_whole_pipeline_reconciles(name):
    """reconcile() of the whole call: every block of every component against its closed form, summed over the calls
    (the denoiser's over its steps), each row exact or explained."""
    torch.manual_seed(0)
    if name == "sd":
        pipe, text = diffusers.StableDiffusionPipeline(tokenizer=None, **sd_components()), torch.randn(1, TEXT, D_TEXT)
        call = dict(prompt_embeds=text, negative_prompt_embeds=text)
    elif name == "flux":
        pipe, call = flux(), dict(prompt_embeds=torch.randn(1, 8, D_TEXT), pooled_prompt_embeds=torch.randn(1, D_TEXT))
    else:
        text = torch.randn(1, 8, D_TEXT)
        pipe, call = wan(), dict(prompt_embeds=text, negative_prompt_embeds=text, num_frames=9)
    prof = count(pipe, num_inference_steps=2, height=SIDE, width=SIDE, **call)
    rows = prof.reconcile().rows
    assert {r.block.split(".", 1)[0] for r in rows} >= set(prof.denoisers) | {"vae"}
    assert [(r.block, r.role, r.measured, r.predicted) for r in rows if not r.exact and not r.reason] == []


def sdxl_unet(projection: int, context: int) -> nn.Module:
    """A tiny SDXL UNet: cross-attention over text states of width ``context`` (both encoders' concatenated in the
    base, the second's alone in the refiner), the pooled text and the size / crop (/ aesthetic score) ids as added
    conditioning (``text_time``) of ``projection`` inputs."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return diffusers.UNet2DConditionModel(
            block_out_channels=(32, 64), layers_per_block=1, sample_size=SIDE // 2, in_channels=4, out_channels=4,
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), attention_head_dim=(2, 4), use_linear_projection=True,
            addition_embed_type="text_time", addition_time_embed_dim=8, transformer_layers_per_block=(1, 2),
            projection_class_embeddings_input_dim=projection, cross_attention_dim=context,
            norm_num_groups=32).eval()


def sdxl_text_encoders() -> tuple[nn.Module, nn.Module]:
    config = dict(hidden_size=D_TEXT, intermediate_size=37, num_attention_heads=4, num_hidden_layers=2,
                  vocab_size=1000, max_position_embeddings=TEXT)
    return (transformers.CLIPTextModel(transformers.CLIPTextConfig(**config)).eval(),
            transformers.CLIPTextModelWithProjection(transformers.CLIPTextConfig(projection_dim=D_TEXT,
                                                                                 **config)).eval())


def test_sdxl_two_text_encoders_and_the_refiner(tokenizer):
    """SDXL: each text encoder once (the empty negative prompt is zeros: force_zeros_for_empty_prompt), the UNet once
    per step on the doubled batch with the pooled text and the six size / crop ids, the decoder once. The refiner
    (text_encoder_2 only, img2img at strength 0.5 from the base's latents) runs int(steps x 0.5) steps and, given
    latents, no VAE encode."""
    text_encoder, text_encoder_2 = sdxl_text_encoders()
    vae = sd_components()["vae"]
    base = diffusers.StableDiffusionXLPipeline(
        vae=vae, text_encoder=text_encoder, text_encoder_2=text_encoder_2, tokenizer=tokenizer, tokenizer_2=tokenizer,
        unet=sdxl_unet(6 * 8 + D_TEXT, 2 * D_TEXT), scheduler=diffusers.EulerDiscreteScheduler())
    torch.manual_seed(0)
    prof = count(base, prompt="abc", num_inference_steps=STEPS, height=SIDE, width=SIDE, guidance_scale=5.0)
    latent = SIDE // 2
    ids = torch.zeros(1, TEXT, dtype=torch.long)
    conditioning = {"text_embeds": torch.randn(2, D_TEXT), "time_ids": torch.randn(2, 6)}
    unet = alone(base.unet, torch.randn(2, 4, latent, latent), torch.tensor(10.0), torch.randn(2, TEXT, 2 * D_TEXT),
                 added_cond_kwargs=conditioning)
    assert prof.by_component() == {
        "vae": alone(Decode(vae), torch.randn(1, 4, latent, latent)),
        "text_encoder": alone(text_encoder, ids, output_hidden_states=True),
        "text_encoder_2": alone(text_encoder_2, ids, output_hidden_states=True), "unet": STEPS * unet}
    assert [(s.calls, s.denoiser_batch, s.guidance) for s in prof.steps()] == [({"unet": 1}, 2, "batch")] * STEPS
    assert prof.by_component()["text_encoder_2"] - prof.by_component()["text_encoder"] == D_TEXT * D_TEXT  # pooled

    refiner = diffusers.StableDiffusionXLImg2ImgPipeline(
        vae=vae, text_encoder=None, text_encoder_2=text_encoder_2, tokenizer=None, tokenizer_2=tokenizer,
        unet=sdxl_unet(5 * 8 + D_TEXT, D_TEXT), scheduler=diffusers.EulerDiscreteScheduler(),
        requires_aesthetics_score=True)
    steps = 4
    refined = count(refiner, prompt="abc", image=torch.randn(1, 4, latent, latent), strength=0.5,
                    num_inference_steps=steps, guidance_scale=5.0)
    conditioning["time_ids"] = torch.randn(2, 5)
    unet = alone(refiner.unet, torch.randn(2, 4, latent, latent), torch.tensor(10.0),
                 torch.randn(2, TEXT, D_TEXT), added_cond_kwargs=conditioning)
    assert len(refined.steps()) == int(steps * 0.5)
    assert refined.by_component() == {"vae": alone(Decode(vae), torch.randn(1, 4, latent, latent)),
                                      "text_encoder_2": alone(text_encoder_2, ids, output_hidden_states=True),
                                      "unet": int(steps * 0.5) * unet}


def test_the_html_report_has_the_pipeline_by_component_and_by_step(tokenizer, tmp_path):
    """The whole call's page with the pipeline's section: each component's MACs by role (its total the component's)
    and the denoising steps' MACs by component, with their guidance, a row per run of identical steps (here one:
    every step alike)."""
    prof = run_sd(stable_diffusion(tokenizer), "fake")
    page = prof.to_html(tmp_path / "sd.html").read_text()
    section = page[page.index("<section id=pipeline>"):page.index("</section>", page.index("<section id=pipeline>"))]
    by_component, steps, by_role = [  # the section's three tables: a list of cell texts per row
        [cells for row in re.findall(r"<tr>(.*?)</tr>", table) if (cells := re.findall(r"<td[^>]*>([^<]*)</td>", row))]
        for table in re.findall(r"<table>(.*?)</table>", section)]
    roles = prof.by_component_role()
    names = [name for name, r in roles.items() if r]
    assert [row[0] for row in by_component] == [*[r for r, macs in prof.by_role().items() if macs], "total"]
    for role, *values in by_component:
        expected = ([prof.by_component()[n] for n in names] if role == "total"
                    else [roles[n].get(role, 0) for n in names])
        assert values == [f"{v:,}" for v in expected], role
    unet = prof.by_component()["unet"]
    assert steps == [[f"0–{STEPS - 1}", str(STEPS), f"{unet // STEPS:,}", f"{unet // STEPS:,}", f"{unet:,}", "batch"]]
    assert [s.total for s in prof.steps()] == [unet // STEPS] * STEPS
    by_step = prof.by_step_role()  # each step by role, adding up to the step (the denoiser's roles every step)
    assert [sum(r.values()) for r in by_step] == [s.total for s in prof.steps()] and len(by_step) > 1
    assert all(r == by_step[0] for r in by_step) and by_step[0]["attn_scores"] > 0
    assert sum(by_step[0].values()) == prof.by_component()["unet"] // len(by_step)
    assert by_role == [[role, f"{macs:,}"] for role, macs in [*by_step[0].items(), ("total", unet // STEPS)]]
