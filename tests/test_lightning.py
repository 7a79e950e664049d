"""The Lightning callback with a real lightning.Trainer (CPU, 3 steps, a tiny GPT built from a config)."""

from __future__ import annotations

import pytest
import torch

import flopscope

pl = pytest.importorskip("lightning.pytorch")

VOCAB, N, BATCH = 100, 24, 2


class TinyGPT(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel

        self.model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=64,
                                                bos_token_id=0, eos_token_id=0))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(ids).logits

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        logits = self(batch)
        return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), batch[:, 1:].flatten())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)  # lr 0: every step sees the same model


def test_the_callback_logs_the_exact_flops_of_every_step() -> None:
    from flopscope.integrations.lightning import FlopscopeCallback

    data = torch.utils.data.DataLoader(torch.randint(0, VOCAB, (3 * BATCH, N)), batch_size=BATCH)
    module = TinyGPT()
    callback = FlopscopeCallback(lambda n: torch.zeros(1, n, dtype=torch.long), peak=1e12, lengths=(4, 8, 16, 32, 48))
    trainer = pl.Trainer(accelerator="cpu", max_steps=3, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[callback])
    trainer.fit(module, data)
    exact = flopscope.profile(module, torch.zeros(BATCH, N, dtype=torch.long), mode="fake", backward=True)
    assert [step["flops"] for step in callback.history] == [exact.total_flops()] * 3
    assert module.flops_per_batch == exact.total_flops()  # what ThroughputMonitor reads
    logged = {k: float(v) for k, v in trainer.callback_metrics.items()}  # Lightning keeps them as float32 tensors
    assert logged["throughput/flops_per_batch"] == pytest.approx(exact.total_flops(), rel=1e-6)
    assert logged["throughput/device/peak_flops"] == pytest.approx(1e12, rel=1e-6)
    assert logged["throughput/flops/attn_scores"] == pytest.approx(2 * exact.by_role()["attn_scores"], rel=1e-6)
    assert not callback.disabled


def test_a_callback_that_fails_disables_itself_and_training_goes_on() -> None:
    from flopscope.integrations.lightning import FlopscopeCallback

    data = torch.utils.data.DataLoader(torch.randint(0, VOCAB, (2 * BATCH, N)), batch_size=BATCH)
    module = TinyGPT()
    callback = FlopscopeCallback(lambda n: torch.zeros(1, n, dtype=torch.long), batch_inputs=lambda b: {"labels": b},
                                 peak=1e12)
    trainer = pl.Trainer(accelerator="cpu", max_steps=2, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[callback])
    with pytest.warns(flopscope.FlopscopeWarning, match="disabled itself"):
        trainer.fit(module, data)
    assert callback.disabled and trainer.global_step == 2
