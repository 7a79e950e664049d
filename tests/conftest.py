import importlib.metadata
import importlib.util
import json
import os
import sys
import sysconfig
import warnings
from pathlib import Path

import pytest


def _check_installed() -> None:
    """.ci/run's wheel phase (FLOPSCOPE_EXPECT_INSTALLED=1) runs the suite against the installed wheel: flopscope
    must come from this interpreter's site-packages, not from a checkout on sys.path nor an editable install."""
    spec = importlib.util.find_spec("flopscope")
    origin = Path(spec.origin).resolve() if spec is not None and spec.origin else None
    site_packages = {Path(sysconfig.get_paths()[key]).resolve() for key in ("purelib", "platlib")}
    if origin is None or not any(origin.is_relative_to(s) for s in site_packages):
        raise pytest.UsageError(f"FLOPSCOPE_EXPECT_INSTALLED=1, but flopscope is imported from {origin}, "
                                f"not from site-packages ({', '.join(map(str, sorted(site_packages)))})")
    direct_url = importlib.metadata.distribution("torch-flopscope").read_text("direct_url.json")
    if direct_url and json.loads(direct_url).get("dir_info", {}).get("editable"):
        raise pytest.UsageError("FLOPSCOPE_EXPECT_INSTALLED=1, but torch-flopscope is an editable install")


if os.environ.get("FLOPSCOPE_EXPECT_INSTALLED") == "1":
    _check_installed()

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, os.path.dirname(__file__))  # closed_forms, zoo
warnings.filterwarnings("ignore", category=FutureWarning)
