"""Whole diffusion pipelines counted on meta, built from configs written here (the published shapes; no download, no
weights), with the time and the peak memory of the count:

- ``flux``: Flux.1-dev (12 B transformer, T5-XXL and CLIP-L text encoders, the 16-channel VAE) at 1024², 28 steps,
  guidance 3.5 (guidance-distilled: one transformer pass per step);
- ``wan``: Wan 2.1 T2V 14 B (UMT5-XXL text encoder, the causal 3-D VAE) for 81 frames at 480p (832x480), 50 steps,
  guidance 5.0 (two transformer passes per step).

    python benchmarks/pipeline_count.py [--model flux|wan] [--steps N] [--no-reuse]

Prints the component table, the per-step MACs, how repeated calls were counted, the wall time of building on meta and
of the count (``profile_pipeline``, after a one-step count that warms the process), the peak RSS of this process
(``ru_maxrss``), and the count of one transformer forward alone (``flopscope.profile`` on the input shapes of its
call in the one-step run) with the pipeline's ratio to it.
``--no-reuse`` captures every call (the count is the same; the time is what replaying repeated calls saves). Units:
MACs (FLOPs = 2 x MACs).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the flopscope checkout

FLUX_DEV = {
    "transformer": ("diffusers", "FluxTransformer2DModel", {
        "patch_size": 1, "in_channels": 64, "num_layers": 19, "num_single_layers": 38, "attention_head_dim": 128,
        "num_attention_heads": 24, "joint_attention_dim": 4096, "pooled_projection_dim": 768, "guidance_embeds": True,
        "axes_dims_rope": [16, 56, 56]}),
    "vae": ("diffusers", "AutoencoderKL", {
        "in_channels": 3, "out_channels": 3, "latent_channels": 16, "block_out_channels": [128, 256, 512, 512],
        "layers_per_block": 2, "down_block_types": ["DownEncoderBlock2D"] * 4,
        "up_block_types": ["UpDecoderBlock2D"] * 4, "norm_num_groups": 32, "use_quant_conv": False,
        "use_post_quant_conv": False, "scaling_factor": 0.3611, "shift_factor": 0.1159, "sample_size": 1024}),
    "text_encoder": ("transformers", "CLIPTextModel", {
        "model_type": "clip_text_model", "hidden_size": 768, "intermediate_size": 3072, "num_attention_heads": 12,
        "num_hidden_layers": 12, "max_position_embeddings": 77, "vocab_size": 49408, "projection_dim": 768}),
    "text_encoder_2": ("transformers", "T5EncoderModel", {
        "model_type": "t5", "d_model": 4096, "d_ff": 10240, "d_kv": 64, "num_heads": 64, "num_layers": 24,
        "vocab_size": 32128, "feed_forward_proj": "gated-gelu", "is_encoder_decoder": False}),
    "scheduler": ("diffusers", "FlowMatchEulerDiscreteScheduler", {
        "shift": 3.0, "use_dynamic_shifting": True, "base_shift": 0.5, "max_shift": 1.15, "base_image_seq_len": 256,
        "max_image_seq_len": 4096}),
    "tokenizer": ("transformers", "CLIPTokenizer", {"model_max_length": 77}),
    "tokenizer_2": ("transformers", "T5TokenizerFast", {"model_max_length": 512}),
}


def write_configs(folder: Path, pipeline: str, components: dict) -> Path:
    """A configs-only pipeline folder: model_index.json, each model's config.json, the scheduler's config, and each
    tokenizer's tokenizer_config.json (its length: flopscope's stand-in tokenizer pads to it)."""
    index = {"_class_name": pipeline}
    for name, (library, cls, config) in components.items():
        index[name] = [library, cls]
        sub = folder / name
        sub.mkdir(parents=True, exist_ok=True)
        file = ("scheduler_config.json" if "Scheduler" in cls else "tokenizer_config.json" if "Tokenizer" in cls
                else "config.json")
        (sub / file).write_text(json.dumps({"_class_name": cls, **config}))
    (folder / "model_index.json").write_text(json.dumps(index))
    return folder


WAN_T2V_14B = {
    "transformer": ("diffusers", "WanTransformer3DModel", {
        "patch_size": [1, 2, 2], "num_attention_heads": 40, "attention_head_dim": 128, "in_channels": 16,
        "out_channels": 16, "text_dim": 4096, "freq_dim": 256, "ffn_dim": 13824, "num_layers": 40,
        "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads", "eps": 1e-6, "rope_max_seq_len": 1024}),
    "vae": ("diffusers", "AutoencoderKLWan", {
        "base_dim": 96, "z_dim": 16, "dim_mult": [1, 2, 4, 4], "num_res_blocks": 2, "attn_scales": [],
        "temperal_downsample": [False, True, True], "dropout": 0.0,
        "latents_mean": [-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508, 0.4134, -0.0715, 0.5517,
                         -0.3632, -0.1922, -0.9497, 0.2503, -0.2921],
        "latents_std": [2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743, 3.2687, 2.1526, 2.8652, 1.5579,
                        1.6382, 1.1253, 2.8251, 1.916]}),
    "text_encoder": ("transformers", "UMT5EncoderModel", {
        "model_type": "umt5", "d_model": 4096, "d_ff": 10240, "d_kv": 64, "num_heads": 64, "num_layers": 24,
        "vocab_size": 256384, "feed_forward_proj": "gated-gelu", "is_encoder_decoder": False,
        "relative_attention_num_buckets": 32}),
    "scheduler": ("diffusers", "UniPCMultistepScheduler", {
        "prediction_type": "flow_prediction", "use_flow_sigmas": True, "flow_shift": 3.0, "num_train_timesteps": 1000}),
    "tokenizer": ("transformers", "T5TokenizerFast", {"model_max_length": 512}),
}

PIPELINES = {
    # name: (pipeline class, components, call arguments)
    "flux": ("FluxPipeline", FLUX_DEV, dict(num_inference_steps=28, guidance_scale=3.5, height=1024, width=1024)),
    "wan": ("WanPipeline", WAN_T2V_14B, dict(num_inference_steps=50, guidance_scale=5.0, height=480, width=832,
                                            num_frames=81)),
}


PIPELINE_VS_FORWARD = {"flux": 2, "wan": 3}
"""Issue 49's targets: the whole pipeline's count / one denoiser forward's count (Flux.1-dev's 28 steps, Wan 2.1's
50 steps of two passes each)."""


class first_call:  # noqa: N801  (a hook's holder, named as what it keeps)
    """The inputs of ``module``'s first call, as meta tensors of the same shapes and dtypes (the call itself runs on the
    pipeline's fake tensors) and the other arguments as given: ``inputs = (args, kwargs)``."""

    def __init__(self, module: Any) -> None:
        self.inputs: tuple[tuple[Any, ...], dict[str, Any]] | None = None
        self.handle = module.register_forward_pre_hook(self._keep, with_kwargs=True)

    def _keep(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        import torch
        from torch.utils import _pytree as pytree

        if self.inputs is None:
            self.inputs = pytree.tree_map_only(torch.Tensor, lambda t: torch.empty(t.shape, dtype=t.dtype,
                                                                                   device="meta"), (args, kwargs))


def one_forward_seconds(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> float:
    """The median wall seconds of 3 counts (``flopscope.profile``, fake) of ``module`` on ``args``, ``kwargs``."""
    import torch

    import flopscope

    seconds = []
    for _ in range(3):
        t0 = time.perf_counter()
        with torch.no_grad():
            flopscope.profile(module, *args, mode="fake", forward_kwargs=kwargs)
        seconds.append(time.perf_counter() - t0)
    return statistics.median(seconds)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=sorted(PIPELINES), default="flux")
    ap.add_argument("--steps", type=int, help="denoising steps (default: the model's)")
    ap.add_argument("--no-reuse", action="store_true", help="capture every call (no replay of repeated calls)")
    args = ap.parse_args()
    import torch

    from flopscope import profile_pipeline
    from flopscope.workloads.pipeline_configs import pipeline_from_configs
    warnings.simplefilter("ignore")
    cls, components, call = PIPELINES[args.model]
    call = {**call, **({"num_inference_steps": args.steps} if args.steps else {})}
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_configs(Path(tmp), cls, components)
        t0 = time.perf_counter()
        pipe = pipeline_from_configs(folder)
        built = time.perf_counter() - t0
        first = first_call(pipe.transformer)  # (a module with a hook of its own is never replayed: in a one-step run
        # of its own, first, which also warms what a first count in a process pays once: lazy imports, kernel caches)
        try:
            with torch.no_grad():
                profile_pipeline(pipe, prompt="a photo of a cat", **{**call, "num_inference_steps": 1})
        finally:
            first.handle.remove()
        assert first.inputs is not None
        t0 = time.perf_counter()
        with torch.no_grad():
            prof = profile_pipeline(pipe, prompt="a photo of a cat", reuse=not args.no_reuse, **call)
        counted = time.perf_counter() - t0
        one = one_forward_seconds(pipe.transformer, *first.inputs)
    parameters = sum(p.numel() for c in pipe.components.values() if isinstance(c, torch.nn.Module)
                     for p in c.parameters())
    shape = ", ".join(f"{k}={v}" for k, v in call.items())
    print(f"{cls} ({args.model}), {shape}: {parameters:,} parameters on meta")
    print(prof.summary_table("github"))
    per_step = {s.total for s in prof.steps()}
    print(f"\nper step: {', '.join(f'{m:,}' for m in sorted(per_step))} MACs ({len(prof.steps())} steps, guidance "
          f"{prof.steps()[0].guidance if prof.steps() else '-'})")
    for line in prof.reuse:
        print(f"reuse: {line}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB (Linux)
    print(f"built on meta in {built:.1f} s; counted in {counted:.1f} s; peak RSS {peak:.2f} GiB")
    print(f"one transformer forward (its input shapes in the pipeline, on meta) counted in {one:.2f} s "
          f"(flopscope.profile, the median of 3): the pipeline is {counted / one:.1f}x it"
          + ("" if args.steps else f" (issue 49's target: <= {PIPELINE_VS_FORWARD[args.model]})"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
