"""The screenshots of the HTML report in docs/, drawn by headless Chromium from pages ``prof.to_html`` wrote:

- a tiny GPT-2 built from its config (no download), one module's details shown (the page's ``#tip=`` address);
- with ``--pipeline``: Stable Diffusion 1.5's shapes built from configs on meta (nothing allocated; a stand-in
  tokenizer padding the prompt to CLIP's 77 tokens), 20 steps at 512², the top of its page: the call by component
  and by step, and the module tree rooted at the pipeline.

    python tools/report_screenshot.py [docs/html_report.png]
    python tools/report_screenshot.py --pipeline [docs/pipeline_report.png]

Needs Debian's ``chromium`` (or another Chromium / Chrome on PATH) and transformers (and diffusers for
``--pipeline``); Pillow, if installed, packs the PNG to a 128-colour palette.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel

import flopscope

LAYERS, WIDTH, HEADS, VOCAB, TOKENS = 4, 256, 4, 2000, 256
WINDOW = (1200, 760)
PIPELINE_WINDOW = (1200, 1000)
STEPS, SIDE = 20, 512


def gpt2_page(folder: Path) -> tuple[Path, str]:
    torch.manual_seed(0)
    config = GPT2Config(n_layer=LAYERS, n_embd=WIDTH, n_head=HEADS, vocab_size=VOCAB, n_positions=TOKENS,
                        bos_token_id=0, eos_token_id=0)
    prof = flopscope.profile(GPT2LMHeadModel(config).eval(), torch.zeros(1, TOKENS, dtype=torch.long))
    page = prof.to_html(folder / "gpt2.html", title=f"flopscope: GPT-2, {LAYERS} layers, d {WIDTH}, n {TOKENS} "
                                                    "(tiny, from its config)")
    return page, "#tip=transformer.h.1.attn"


def stable_diffusion_page(folder: Path) -> tuple[Path, str]:
    import diffusers
    import transformers

    from flopscope.workloads.pipeline_configs import ShapeTokenizer

    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        unet = diffusers.UNet2DConditionModel(cross_attention_dim=768, sample_size=SIDE // 8)
        vae = diffusers.AutoencoderKL(block_out_channels=[128, 256, 512, 512], layers_per_block=2,
                                      down_block_types=["DownEncoderBlock2D"] * 4,
                                      up_block_types=["UpDecoderBlock2D"] * 4, latent_channels=4)
        text_encoder = transformers.CLIPTextModel(transformers.CLIPTextConfig(
            hidden_size=768, intermediate_size=3072, num_attention_heads=12, num_hidden_layers=12))
    pipe: Any = diffusers.StableDiffusionPipeline(  # (its scheduler's tensors on the CPU: it runs as written)
        unet=unet.eval(), vae=vae.eval(), text_encoder=text_encoder.eval(), tokenizer=ShapeTokenizer(),
        scheduler=diffusers.DDIMScheduler(steps_offset=1, clip_sample=False), safety_checker=None,
        feature_extractor=None, requires_safety_checker=False)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prof = flopscope.profile_pipeline(pipe, prompt="a photo of a cat", num_inference_steps=STEPS, height=SIDE,
                                          width=SIDE)
    page = prof.to_html(folder / "sd.html", title=f"flopscope: Stable Diffusion 1.5 shapes, {STEPS} steps at "
                                                  f"{SIDE}² (from configs, on meta)")
    return page, ""


def main(argv: list[str]) -> int:
    pipeline = "--pipeline" in argv
    argv = [a for a in argv if a != "--pipeline"]
    out = Path(argv[0] if argv else "docs/pipeline_report.png" if pipeline else "docs/html_report.png").resolve()
    browser = next((found for name in ("chromium", "chromium-browser", "google-chrome")
                    if (found := shutil.which(name))), None)
    if browser is None:
        print("no chromium on PATH (Debian: apt-get install chromium)", file=sys.stderr)
        return 1
    window = PIPELINE_WINDOW if pipeline else WINDOW
    with tempfile.TemporaryDirectory() as work:
        page, fragment = (stable_diffusion_page if pipeline else gpt2_page)(Path(work))
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--user-data-dir={work}/profile", f"--window-size={window[0]},{window[1]}",
                        f"--screenshot={out}", page.as_uri() + fragment],
                       check=True, capture_output=True)
    try:
        from PIL import Image
    except ImportError:
        pass
    else:
        Image.open(out).convert("RGB").quantize(128).save(out, optimize=True)
    print(f"wrote {out} ({out.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
