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


class Recorded(pl.loggers.Logger):
    """A Lightning logger that keeps what it is sent (a real Logger: the trainer drives it)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "recorded"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics, step=None) -> None:
        self.rows.append((step, dict(metrics)))


def test_the_callback_logs_the_exact_flops_of_every_step() -> None:
    from flopscope.integrations.lightning import FlopscopeCallback

    data = torch.utils.data.DataLoader(torch.randint(0, VOCAB, (3 * BATCH, N)), batch_size=BATCH)
    module = TinyGPT()
    callback = FlopscopeCallback(lambda n: torch.zeros(1, n, dtype=torch.long), peak=1e12, lengths=(4, 8, 16, 32, 48))
    logger = Recorded()
    trainer = pl.Trainer(accelerator="cpu", max_steps=3, logger=logger, log_every_n_steps=1,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[callback])
    trainer.fit(module, data)
    exact = flopscope.profile(module, torch.zeros(BATCH, N, dtype=torch.long), mode="fake", backward=True)
    assert [step["flops"] for step in callback.history] == [exact.total_flops()] * 3
    assert module.flops_per_batch == exact.total_flops()  # what ThroughputMonitor reads
    logged = [(step, metrics) for step, metrics in logger.rows if "throughput/device/mfu" in metrics]
    assert [step for step, _ in logged] == [1, 2, 3]  # every step: log_every_n_steps=1
    for _, metrics in logged:
        assert metrics["throughput/flops_per_batch"] == exact.total_flops()
        assert metrics["throughput/device/peak_flops"] == 1e12
        assert metrics["throughput/device/mfu"] == pytest.approx(metrics["throughput/device/flops_per_sec"] / 1e12)
        assert metrics["throughput/flops/attn_scores"] == 2 * exact.by_role()["attn_scores"]
    assert not callback.disabled


def test_the_callback_logs_the_rates_of_the_steps_between_logs() -> None:
    from flopscope.integrations.lightning import FlopscopeCallback

    data = torch.utils.data.DataLoader(torch.randint(0, VOCAB, (4 * BATCH, N)), batch_size=BATCH)
    callback = FlopscopeCallback(lambda n: torch.zeros(1, n, dtype=torch.long), peak=1e12, lengths=(4, 8, 16, 32, 48))
    logger = Recorded()
    trainer = pl.Trainer(accelerator="cpu", max_steps=4, logger=logger, log_every_n_steps=2,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[callback])
    trainer.fit(TinyGPT(), data)
    logged = [(step, metrics) for step, metrics in logger.rows if "throughput/device/mfu" in metrics]
    assert [step for step, _ in logged] == [2, 4]
    for i, (_, metrics) in enumerate(logged):
        window = callback.history[2 * i: 2 * i + 2]
        assert metrics["throughput/device/flops_per_sec"] == pytest.approx(
            sum(s["flops"] for s in window) / sum(s["seconds"] for s in window))


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
