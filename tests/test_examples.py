"""Every script in examples/ runs (small sizes) and says what it claims."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_every_example_is_tested():
    assert {p.stem for p in EXAMPLES.glob("*.py")} == {"huggingface_from_config", "training_step",
                                                       "custom_block_rule", "scaling_plot", "seed_exercise"}


def test_huggingface_from_config(capsys):
    pytest.importorskip("transformers")
    prof = load("huggingface_from_config").main(["--layers", "1", "--n", "32"])
    assert prof.reconcile().all_exact()
    assert "Kaplan" in capsys.readouterr().out


def test_training_step():
    pytest.importorskip("transformers")
    prof = load("training_step").main(["--layers", "1", "--n", "16"])
    forward, backward = prof.by_role(phase="forward"), prof.by_role(phase="backward")
    assert backward["ffn_up"] == 2 * forward["ffn_up"] and backward["q_proj"] == 2 * forward["q_proj"]


def test_custom_block_rule():
    roles = load("custom_block_rule").main([])
    n, d = 128, 64
    assert roles == {"q_proj": n * d * d, "k_proj": n * d * d, "v_proj": n * d * d,
                     "attn_scores": d * n * d + n * d * d, "other": n * d * d}


def test_scaling_plot(tmp_path):
    result = load("scaling_plot").main(["--out", str(tmp_path / "s.png"), "--d", "64"])
    d = 64
    assert result.crossover() == 2 * d + 4 * d + 1  # 2n²d > n(4d² + 2·d·4d)  <=>  n > 6d
    assert (tmp_path / "s.png").stat().st_size > 10_000


def test_seed_exercise():
    ours, theirs = load("seed_exercise").main([])
    n, d, B = 64, 128, 2
    assert ours == theirs == {"q_proj": B * n * d * d, "k_proj": B * n * d * d, "v_proj": B * n * d * d,
                              "out_proj": B * n * d * d, "attn_scores": B * n * n * d,
                              "attn_weighted_sum": B * n * n * d}
