"""Lightning: a callback that prices every training batch exactly and logs MFU
(``pip install "torch-flopscope[lightning]"``).

    trainer = lightning.Trainer(callbacks=[FlopscopeCallback(lambda n: torch.zeros(1, n,
    dtype=torch.long))])

On fit start it traces the module once at a few lengths
(:func:`flopscope.flops_per_batch`, forward and backward); on each step it sets
``pl_module.flops_per_batch`` (what Lightning's ``ThroughputMonitor`` reads) to the
exact FLOPs of that batch, and every ``log_every_n_steps`` it sends the trainer's
loggers, over the steps since the last time: ``throughput/flops_per_batch`` (mean),
``throughput/device/flops_per_sec``, ``throughput/device/mfu`` and ``hfu`` (with
``throughput/device/peak_flops``, their denominator, when the peak is known),
``throughput/tokens_per_sec`` and ``throughput/flops/<role>`` (mean per batch). A
failure is logged once and disables the callback: it never stops training.

``attention="causal"`` or ``"mask"`` prices the attention core by that convention
(:mod:`flopscope.predict.attention`; default ``"executed"``): ``flops_per_batch`` and
every FLOP-derived metric follow it, logged with the convention in their names
(``throughput/device/mfu_causal``, ``.../hfu_causal``, ``.../flops_per_sec_causal``,
``throughput/flops_per_batch_causal``, ``throughput/flops_causal/<role>``; ``_mask``
likewise).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch

from ..conventions import EXECUTED
from ..errors import FlopscopeWarning
from ..workloads.training import AUTO, BatchPricer, Throughput, flops_per_batch, metric_suffix


class FlopscopeCallback(pl.Callback):
    """Exact FLOPs per batch and MFU for a ``lightning.Trainer``.

    Args:
        make_inputs: ``make_inputs(n)`` -> the module's inputs for one sequence of ``n``
            tokens.
        batch_inputs: ``batch_inputs(batch)`` -> what
            :class:`~flopscope.training.BatchPricer` prices (token ids ``[B, n]``, a
            dict of model inputs, or lengths); default: the batch itself, or its
            ``input_ids``.
        model: ``model(pl_module)`` -> the module to trace (default: the LightningModule
        itself). peak, dtype: the device's dense peak FLOP/s: a number, ``"auto"``
        (default: looked up for the module's
            device and ``dtype``) or ``None`` (unknown: no MFU), as
            :class:`~flopscope.training.Throughput` takes it.
        lengths: sequence lengths traced once on fit start (in training mode, so
            activation checkpointing shows as recomputed work: HFU).
        loss: ``loss(output)`` -> the scalar whose backward is priced (default: the sum
            of the floating outputs; the backward's multiplies are the same for any loss
            of the logits).
        attention: the convention of the attention core, ``"executed"`` (default),
            ``"causal"`` or ``"mask"`` (see the module docstring).
    """

    def __init__(self, make_inputs: Callable[[int], Any], *,
                 batch_inputs: Callable[[Any], Any] | None = None,
                 model: Callable[[pl.LightningModule], torch.nn.Module] | None = None,
                 peak: float | str | None = AUTO,
                 dtype: torch.dtype = torch.float32,
                 lengths: tuple[int, ...] = (8, 16, 32, 64, 128),
                 loss: Callable[[Any], torch.Tensor] | None = None,
                 attention: str = EXECUTED) -> None:
        super().__init__()
        self.suffix = metric_suffix(attention)  # checks the name, before training starts
        self.attention = attention
        self.make_inputs, self.batch_inputs, self.model, self.loss = make_inputs, batch_inputs, model, loss
        self.peak, self.dtype, self.lengths = peak, dtype, lengths
        self.pricer: BatchPricer | None = None
        self.meter: Throughput | None = None
        self.disabled = False
        self.history: list[dict[str, Any]] = []  # every step's metrics (Throughput.record)
        self.logged: list[dict[str, float]] = []  # what was sent to the loggers, per logging step
        self.window: Throughput | None = None  # the steps since the last logging step
        self._priced: dict[str, Any] | None = None
        self._start = 0.0

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._guard(self._prepare, pl_module)

    def _prepare(self, pl_module: pl.LightningModule) -> None:
        module = self.model(pl_module) if self.model is not None else pl_module
        self.pricer = flops_per_batch(module, self.make_inputs, backward=True, lengths=self.lengths,
                                      loss=self.loss,
                                      training=True, attention=self.attention)
        self.meter = Throughput(self.pricer, peak=self.peak, device=pl_module.device,
                                dtype=self.dtype)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if not self.disabled:
            self._guard(self._price, pl_module, batch)
        self._start = time.perf_counter()

    def _price(self, pl_module: pl.LightningModule, batch: Any) -> None:
        if self.pricer is not None:
            self._priced = self.pricer.price(self._inputs(batch))  # read the batch once per step
            setattr(pl_module, "flops_per_batch", self._priced["flops"])  # noqa: B010  what ThroughputMonitor reads

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                           batch: Any,
                           batch_idx: int) -> None:
        seconds = time.perf_counter() - self._start
        if not self.disabled and self.meter is not None and self._priced is not None:
            self._guard(self._log, trainer, seconds)

    def _log(self, trainer: pl.Trainer, seconds: float) -> None:
        """Account the step; at each logging step (``log_every_n_steps``) send the rates
        of the steps since the last one to the trainer's loggers, as
        ``ThroughputMonitor`` does (``LightningModule.log`` costs about half a
        millisecond per metric)."""
        priced, self._priced = self._priced, None
        if priced is None or self.meter is None:
            return
        step = dict(seconds=seconds, recomputed=priced["recomputed_flops"], tokens=priced["tokens"],
                    flops_by_role=priced["flops_by_role"])
        self.history.append(self.meter.record(priced["flops"], **step))
        window = self.window if self.window is not None else self.meter.fresh()
        window.record(priced["flops"], **step)
        self.window = window
        every = max(1, int(getattr(trainer, "log_every_n_steps", 1) or 1))
        if trainer.global_step % every and not trainer.is_last_batch:
            return
        self.window = self.meter.fresh()
        summary = window.summary()
        tag = self.suffix  # the convention, in the name of every FLOP-derived metric
        metrics = {f"throughput/flops_per_batch{tag}": summary["flops"] / summary["steps"],
                   f"throughput/device/flops_per_sec{tag}": summary["flops_per_sec"],
                   "throughput/tokens_per_sec": summary["tokens_per_sec"]}
        if summary["mfu"] is not None:
            metrics |= {f"throughput/device/mfu{tag}": summary["mfu"],
                        f"throughput/device/hfu{tag}": summary["hfu"],
                        "throughput/device/peak_flops": summary["peak"]}
        metrics |= {f"throughput/flops{tag}/{role}": v / summary["steps"]
                    for role, v in summary["flops_by_role"].items()}
        self.logged.append(metrics)
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)

    def _inputs(self, batch: Any) -> Any:
        if self.batch_inputs is not None:
            return self.batch_inputs(batch)
        if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor):
            return batch[0]
        return batch

    def _guard(self, action: Callable[..., Any], *args: Any) -> None:
        """Run ``action``; a failure warns once and disables the callback (training goes
        on)."""
        try:
            action(*args)
        except Exception as error:  # a metrics callback must never stop training
            self.disabled = True
            warnings.warn(f"flopscope: FlopscopeCallback disabled itself: {type(error).__name__}: "
                          f"{error}",
                          FlopscopeWarning, stacklevel=2)
