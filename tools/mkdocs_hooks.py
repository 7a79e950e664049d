"""mkdocs hook: the example report (docs/guide/example_report.md) made by flopscope itself when the site is built, so
that the page always shows what this checkout draws."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any


def on_post_build(config: Any, **_: Any) -> None:
    from flopscope.cli import main

    page = Path(config["site_dir"]) / "example_report.html"
    settings = ["n_layer=2", "n_embd=64", "n_head=4", "vocab_size=500", "bos_token_id=0", "eos_token_id=0"]
    options = [option for setting in settings for option in ("--set", setting)]
    with contextlib.redirect_stdout(io.StringIO()) as printed:  # (the report's tables: not the build's log)
        code = main(["profile", "hf:gpt2/causal-lm", *options, "--input", "1x128", "--mode", "fake",
                     "--sweep", "64,128,256,512", "--html", str(page)])
    if code != 0:
        raise RuntimeError(f"the example report was not made (flopscope profile exited {code}):\n{printed.getvalue()}")
