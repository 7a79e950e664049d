"""The screenshot of the HTML report in docs/: a tiny GPT-2 built from its config (no download), its report written
by ``prof.to_html`` and drawn by headless Chromium with one module's details shown (the page's ``#tip=`` address).

    python tools/report_screenshot.py [docs/html_report.png]

Needs Debian's ``chromium`` (or another Chromium / Chrome on PATH) and transformers; Pillow, if installed, packs the
PNG to a 128-colour palette.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel

import flopscope

LAYERS, WIDTH, HEADS, VOCAB, TOKENS = 4, 256, 4, 2000, 256
WINDOW = (1200, 760)


def main(argv: list[str]) -> int:
    out = Path(argv[0] if argv else "docs/html_report.png").resolve()
    browser = next((found for name in ("chromium", "chromium-browser", "google-chrome")
                    if (found := shutil.which(name))), None)
    if browser is None:
        print("no chromium on PATH (Debian: apt-get install chromium)", file=sys.stderr)
        return 1
    torch.manual_seed(0)
    config = GPT2Config(n_layer=LAYERS, n_embd=WIDTH, n_head=HEADS, vocab_size=VOCAB, n_positions=TOKENS,
                        bos_token_id=0, eos_token_id=0)
    prof = flopscope.profile(GPT2LMHeadModel(config).eval(), torch.zeros(1, TOKENS, dtype=torch.long))
    with tempfile.TemporaryDirectory() as work:
        page = prof.to_html(Path(work) / "gpt2.html", title=f"flopscope: GPT-2, {LAYERS} layers, d {WIDTH}, "
                                                             f"n {TOKENS} (tiny, from its config)")
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--user-data-dir={work}/profile", f"--window-size={WINDOW[0]},{WINDOW[1]}",
                        f"--screenshot={out}", page.as_uri() + "#tip=transformer.h.1.attn"],
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
