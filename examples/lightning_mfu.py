"""MFU in a ``lightning.Trainer``: flopscope prices every batch exactly; Lightning's
ThroughputMonitor reads it.

    python examples/lightning_mfu.py --steps 4

The batches have variable length (each is padded to its longest sequence), so every step
costs something else. ``FlopscopeCallback`` traces the model once on fit start, then
sets ``pl_module.flops_per_batch`` to the exact FLOPs (forward + backward) of each
batch, which Lightning's own ``ThroughputMonitor`` reads. The MFU denominator is this
CPU's measured fp32 GEMM peak (``flopscope peak``); on a GPU leave ``peak`` out and the
callback looks up the dense datasheet figure. The table compares each step's exact FLOPs
with the 6·N·tokens estimate of ``transformers.Trainer.floating_point_ops``.
"""

from __future__ import annotations

import argparse

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ThroughputMonitor
from lightning.pytorch.loggers import Logger
from transformers import GPT2Config, GPT2LMHeadModel

from flopscope.hardware.probes import measure_cpu_peak
from flopscope.integrations.lightning import FlopscopeCallback

VOCAB = 1000


class TinyGPT(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB,
                            n_positions=128, bos_token_id=0, eos_token_id=0)
        self.model = GPT2LMHeadModel(config)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(ids).logits

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        # right padding: causal attention never lets a real token see it
        logits = self(batch["input_ids"])[:, :-1].flatten(0, 1)
        labels = batch["labels"][:, 1:].flatten()
        return torch.nn.functional.cross_entropy(logits, labels)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


def pad(sequences: list[torch.Tensor]) -> dict:
    """Pad to the longest sequence of the batch; padded labels are ignored by the
    loss."""
    ids = torch.nn.utils.rnn.pad_sequence(sequences, batch_first=True)
    labels = torch.nn.utils.rnn.pad_sequence(sequences, batch_first=True,
                                             padding_value=-100)
    return {"input_ids": ids, "labels": labels}


class Recorder(Logger):
    """Keeps what Lightning logs, in memory (ThroughputMonitor logs only through a
    logger)."""

    name, version = "recorder", 0

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[dict] = []

    def log_hyperparams(self, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        self.rows.append(dict(metrics))


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=2)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    lengths = torch.randint(8, 120, (args.steps * args.batch,))
    sequences = [torch.randint(0, VOCAB, (int(n),)) for n in lengths]
    data = torch.utils.data.DataLoader(sequences, batch_size=args.batch, collate_fn=pad)
    module = TinyGPT()

    # the MFU denominator: this CPU's best fp32 matmul rate
    peak = measure_cpu_peak(torch.float32)
    flopscope_cb = FlopscopeCallback(lambda n: torch.zeros(1, n, dtype=torch.long),
                                     peak=peak)
    # window_size=2: a FLOP/s from every step on (default: 100 steps); on CPU it has no
    # peak, so no MFU
    monitor = ThroughputMonitor(batch_size_fn=lambda b: b["input_ids"].shape[0],
                                length_fn=lambda b: b["input_ids"].numel(),
                                window_size=2)
    logger = Recorder()
    trainer = pl.Trainer(accelerator="cpu", max_steps=args.steps, logger=logger,
                         log_every_n_steps=1, callbacks=[flopscope_cb, monitor],
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(module, data)

    # what Hugging Face's Trainer multiplies by 6
    n_params = module.model.num_parameters(exclude_embeddings=True)
    monitored = [row.get("train/device/flops_per_sec") for row in logger.rows
                 if "train/batches" in row]
    rows = []
    print(f"{'step':>4} {'shape':>7} {'tokens':>6} {'exact FLOPs':>14} "
          f"{'6·N·tokens':>14} {'6ND err':>8} {'MFU':>6} {'GFLOP/s':>8} "
          f"{'ThroughputMonitor GFLOP/s':>25}")
    history = zip(data, flopscope_cb.history, monitored, strict=True)
    for i, (batch, step, seen) in enumerate(history):
        shape = tuple(batch["input_ids"].shape)
        # padding included: the work that runs (and what Hugging Face counts)
        tokens = shape[0] * shape[1]
        hf = 6 * n_params * tokens
        rows.append({"shape": shape, "tokens": tokens, "hf_flops": hf,
                     "monitor_flops_per_sec": seen, **step})
        error = (hf - step["flops"]) / step["flops"]
        monitor_rate = "—" if seen is None else f"{float(seen) / 1e9:.2f}"
        print(f"{i + 1:>4} {'×'.join(map(str, shape)):>7} {tokens:>6} "
              f"{step['flops']:>14,} {hf:>14,} {error:>+8.1%} {step['mfu']:>6.1%} "
              f"{step['flops_per_sec'] / 1e9:>8.2f} {monitor_rate:>25}")
    print(f"MFU = FLOP/s ÷ {peak / 1e9:,.1f} GFLOP/s (this CPU's measured fp32 GEMM "
          f"peak); N = {n_params:,} non-embedding parameters")
    return rows


if __name__ == "__main__":
    main()
