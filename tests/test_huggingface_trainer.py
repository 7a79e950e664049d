"""The Trainer integration with a real transformers.Trainer (CPU, 3 steps, a tiny GPT-2 built from a config)."""

from __future__ import annotations

import warnings

import pytest
import torch

import flopscope

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # the Trainer needs it

L, D, HEADS, V, N, B, STEPS = 2, 32, 4, 100, 24, 2, 3


def gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=L, n_embd=D, n_head=HEADS, vocab_size=V,
                                                                n_positions=64, bos_token_id=0, eos_token_id=0))


class Tokens(torch.utils.data.Dataset):
    def __init__(self, count: int) -> None:
        self.ids = torch.randint(0, V, (count, N))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def trainer_for(model: torch.nn.Module, tmp_path, **args) -> transformers.Trainer:
    arguments = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=STEPS, per_device_train_batch_size=B, learning_rate=0.0,
        logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, **args)
    return transformers.Trainer(model=model, args=arguments, train_dataset=Tokens(B * STEPS * 4))


def step_flops(batch: int) -> int:
    """A GPT-2 training step from the closed form: per token, L·12·d² (QKV, output projection, 4d FFN) and the
    logits d·V; per sequence, L·2·n²·d (scores and weighted sum); backward twice the forward (every GEMM's input
    needs a gradient: the first layer's comes from the embeddings); 2 FLOPs per MAC."""
    forward = batch * (N * (L * 12 * D * D + D * V) + L * 2 * N * N * D)
    return 2 * 3 * forward


def test_total_flos_is_the_exact_count_and_mfu_is_logged(tmp_path) -> None:
    from flopscope.integrations.huggingface import FlopscopeTrainerCallback

    model = gpt2()
    trainer = trainer_for(model, tmp_path)
    callback = FlopscopeTrainerCallback(peak=1e12).attach(trainer)
    with warnings.catch_warnings():
        warnings.simplefilter("error", flopscope.FlopscopeWarning)
        trainer.train()
    assert not callback.disabled
    batch = torch.zeros(B, N, dtype=torch.long)
    exact = flopscope.profile(model, input_ids=batch, labels=batch, mode="fake", backward=True).total_flops()
    assert exact == step_flops(B)
    assert trainer.state.total_flos == STEPS * exact
    # what the Trainer's own hook reports: 6 · tokens · non-embedding parameters, where those parameters are
    # L·(12·d² + 13·d) + 2·d (weights, biases, two LayerNorms per layer, the final one): it misses the attention
    # core (2·L·n·d per token) and the logits (d·V per token) and counts biases and norms as multiplies
    tokens = B * N
    six_n = transformers.Trainer.floating_point_ops(trainer, {"input_ids": batch})
    assert six_n == 6 * tokens * (L * (12 * D * D + 13 * D) + 2 * D)
    assert exact - six_n == 6 * tokens * (L * 2 * N * D + D * V) - 6 * tokens * (L * 13 * D + 2 * D)
    print(f"6N estimate {six_n:,} FLOPs per step vs exact {exact:,}: {six_n / exact - 1:+.1%}")
    steps = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(steps) == STEPS
    for entry in steps:
        assert entry["peak_flops"] == 1e12
        assert entry["mfu"] == pytest.approx(entry["flops_per_second"] / 1e12)
        assert entry["hfu"] == pytest.approx(entry["mfu"])  # no activation checkpointing: nothing recomputed
        assert entry["tokens_per_second"] == pytest.approx(entry["flops_per_second"] * tokens / exact)
        assert entry["flops/attn_scores"] == 2 * 3 * L * B * N * N * D  # B·n²·d MACs per layer, 3 for a step
    assert [step["flops"] for step in callback.history] == [exact] * STEPS


def test_gradient_accumulation_and_checkpointing(tmp_path) -> None:
    from flopscope.integrations.huggingface import FlopscopeTrainerCallback

    model = gpt2()
    trainer = trainer_for(model, tmp_path, gradient_accumulation_steps=2, gradient_checkpointing=True,
                          gradient_checkpointing_kwargs={"use_reentrant": True})
    callback = FlopscopeTrainerCallback(peak=1e12).attach(trainer)
    trainer.train()
    assert not callback.disabled
    assert trainer.state.total_flos == STEPS * 2 * step_flops(B)  # two micro-batches per optimizer step
    # the reentrant checkpoint runs each layer's forward again: hardware FLOPs, in HFU and not in MFU
    layers_forward = B * (N * L * 12 * D * D + L * 2 * N * N * D)
    assert [step["recomputed_flops"] for step in callback.history] == [2 * 2 * layers_forward] * STEPS
    entry = next(entry for entry in trainer.state.log_history if "mfu" in entry)
    ratio = (step_flops(B) + 2 * layers_forward) / step_flops(B)
    assert entry["hfu"] == pytest.approx(entry["mfu"] * ratio)


def test_a_failing_callback_disables_itself_and_the_trainer_goes_on(tmp_path) -> None:
    from flopscope.integrations.huggingface import FlopscopeTrainerCallback

    model = gpt2()
    trainer = trainer_for(model, tmp_path)
    callback = FlopscopeTrainerCallback(batch_inputs=lambda inputs: {"labels": inputs["labels"]},
                                        peak=1e12).attach(trainer)
    with pytest.warns(flopscope.FlopscopeWarning, match="disabled itself.*cannot price a batch with keys"):
        trainer.train()
    assert callback.disabled
    assert trainer.state.global_step == STEPS
    six_n = transformers.Trainer.floating_point_ops(trainer, {"input_ids": torch.zeros(B, N, dtype=torch.long)})
    assert trainer.state.total_flos == STEPS * six_n  # priced by the trainer's own hook again
    assert all("mfu" not in entry for entry in trainer.state.log_history)
