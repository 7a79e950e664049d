"""A pipeline call as a workload: calls x MACs per call of each entry point (the denoiser's as steps x passes, with
its batch), adding up to the measured total; each component against its blocks' closed forms; and the scaling in
resolution as exact polynomials in the pixels P = height x width, equal to the closed forms' coefficients."""

from __future__ import annotations

import warnings
from fractions import Fraction

import pytest
import torch

import flopscope
from flopscope.errors import ConfigurationError
from flopscope.predict.polynomial import Polynomial
from flopscope.workloads.resolution import resolution_scaling

diffusers = pytest.importorskip("diffusers")

from test_pipeline import D_TEXT, SIDE, TEXT, Decode, alone, count, flux, sd_components  # noqa: E402


def test_stable_diffusion_workload_is_steps_times_the_doubled_batch_call():
    """SD with CFG by batch: the UNet once per step on batch 2, the VAE decoder once (and its post-quant conv); the
    terms add up to the total; each component's blocks are exact against their closed forms."""
    torch.manual_seed(0)
    steps, text = 3, torch.randn(1, TEXT, D_TEXT)
    pipe = diffusers.StableDiffusionPipeline(tokenizer=None, **sd_components())
    prof = count(pipe, prompt_embeds=text, negative_prompt_embeds=text, num_inference_steps=steps, height=SIDE,
                 width=SIDE)
    latent = SIDE // 2
    unet = alone(pipe.unet, torch.randn(2, 4, latent, latent), torch.tensor(10), torch.randn(2, TEXT, D_TEXT))
    work = prof.workload()
    (term,) = [t for t in work.terms if t.component == "unet"]
    assert (term.entry, term.steps, term.passes, term.batch, term.guidance, term.macs_per_call) == (
        "unet", steps, 1, 2, "batch", unet)
    assert sum(t.total for t in work.terms if t.component == "vae") == alone(Decode(pipe.vae),
                                                                             torch.randn(1, 4, latent, latent))
    assert work.total == work.measured == prof.total()
    for component in work.components:
        assert component.reconciled == component.predicted, component  # every closed-form row exact
        assert component.measured == component.reconciled + sum(component.outside.values())
    assert f"unet: {steps} steps x 1 pass x {unet:,} (batch 2, guidance by batch)" in work.formula()
    assert "equal to the measured total" in work.to_table()


def test_flux_true_cfg_workload_is_steps_times_two_passes():
    torch.manual_seed(0)
    text, pooled = torch.randn(1, 8, D_TEXT), torch.randn(1, D_TEXT)
    pipe = flux()
    prof = count(pipe, prompt_embeds=text, pooled_prompt_embeds=pooled, negative_prompt_embeds=text,
                 negative_pooled_prompt_embeds=pooled, true_cfg_scale=2.0, num_inference_steps=3, height=SIDE,
                 width=SIDE)
    (term,) = [t for t in prof.workload().terms if t.component == "transformer"]
    assert (term.steps, term.passes, term.batch, term.guidance, term.calls) == (3, 2, 1, "passes", 6)
    assert term.total == prof.by_component()["transformer"]


def test_flux_scales_in_resolution_as_its_closed_forms():
    """Tiny Flux (VAE of one block: no spatial compression; latents packed 2x2, so n = P / 4 image tokens; m = 8 text
    tokens; one double and one single block of h·d_k = d = 32): joint attention's scores are 2 layers x h·d_k x
    (n + m)², its q projection 2 layers x (n + m) x d²; the VAE's one-head mid-block attention over P latent pixels of
    4 channels is 4·P². Each polynomial is the measured one, and the closed forms' too; the whole call's polynomial
    predicts a fifth size exactly."""
    torch.manual_seed(0)
    text, pooled = torch.randn(1, 8, D_TEXT), torch.randn(1, D_TEXT)
    call = dict(prompt_embeds=text, pooled_prompt_embeds=pooled, num_inference_steps=1)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scaling = resolution_scaling(flux(), [32, 48, 64, (32, 80)], **call)
    assert scaling.sizes == ((32, 32), (48, 48), (32, 80), (64, 64))
    m, d = 8, 32
    n_plus_m = Polynomial((Fraction(m), Fraction(1, 4)))  # P / 4 + m
    transformer = scaling.components["transformer"]
    scores = Polynomial(tuple(2 * d * c for c in _square(n_plus_m).coefficients))
    assert transformer.polynomials["attn_scores"] == scores
    assert transformer.polynomials["q_proj"] == Polynomial(tuple(2 * d * d * c for c in n_plus_m.coefficients))
    assert scaling.components["vae"].polynomials["attn_scores"] == Polynomial((Fraction(0), Fraction(0),
                                                                                Fraction(4)))
    for name, component in scaling.components.items():
        assert all(component.matches(role) for role, form in component.predicted.items() if form is not None), name
    assert transformer.polynomials["attn_scores"].degree == 2 and transformer.polynomials["ffn_up"].degree == 1
    fifth = count(flux(), height=96, width=96, **call).total()
    assert scaling.total()(96 * 96) == fifth


def _square(poly: Polynomial) -> Polynomial:
    a, b = poly.coefficients
    return Polynomial((a * a, 2 * a * b, b * b))


def test_resolution_scaling_refuses_too_few_sizes_and_its_own_arguments():
    with pytest.raises(ConfigurationError, match="at least 4 sizes"):
        resolution_scaling(flux(), [32, 48, (48, 48), 64])
    with pytest.raises(ConfigurationError, match="sets height and width"):
        resolution_scaling(flux(), [32, 48, 64, 80], height=32)


def test_profile_pipeline_exports_the_workload():
    assert flopscope.Workload is not None and flopscope.resolution_scaling is resolution_scaling
