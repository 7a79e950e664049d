"""Hugging Face ``Trainer``: exact ``total_flos`` and MFU in the logs (``pip install
"torch-flopscope[hf]"``).

    trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    FlopscopeTrainerCallback(peak=...).attach(trainer)
    trainer.train()

The ``Trainer`` prices every micro-batch with its ``floating_point_ops(inputs)`` hook
and adds the result to ``state.total_flos``; its default is ``6 · tokens · parameters``
(no attention term, no logits, biases and norms counted as multiplies, 0 for models that
are not a ``PreTrainedModel``). :meth:`attach` replaces that hook on the trainer
instance with :meth:`FlopscopeTrainerCallback.floating_point_ops`: the exact model FLOPs
(forward and backward) of the batch, from one trace of the model at a few lengths on
train begin (:func:`flopscope.flops_per_batch`, in training mode, so activation
checkpointing shows as recomputed work). A ``Trainer`` subclass may call that method
from its own ``floating_point_ops`` instead.

At each log it adds, over the steps since the last log: ``mfu`` and ``hfu`` (with
``peak_flops``, their denominator, when the device's peak is known),
``flops_per_second`` (model FLOPs), ``tokens_per_second`` and ``flops/<role>``. A step's
time runs from the end of the previous step (from the first step's start for the first).
A failure is warned about once and disables the callback; the trainer then prices with
its own hook again. Training never stops because of it.

``attention="causal"`` or ``"mask"`` prices the attention core by that convention
(:mod:`flopscope.predict.attention`; default ``"executed"``, every pair the kernels
compute): ``total_flos`` and every FLOP-derived metric follow it, and those metrics are
logged with the convention in their names, ``mfu_causal``, ``hfu_causal``,
``flops_per_second_causal``, ``flops_causal/<role>`` (``_mask`` likewise), so runs under
different conventions are never mixed in one chart.
"""

from __future__ import annotations

import time
import warnings
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import torch
from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from ..conventions import EXECUTED, POSITIONS
from ..errors import FlopscopeWarning
from ..workloads.training import AUTO, BatchPricer, Throughput, flops_per_batch, metric_suffix


class FlopscopeTrainerCallback(TrainerCallback):
    """Exact FLOPs per batch and MFU for a ``transformers.Trainer``.

    Args:
        make_inputs: ``make_inputs(n)`` -> the model's inputs for one sequence of ``n``
            tokens (default: token ids under the model's ``main_input_name``: enough for
            decoder-only and encoder models; an encoder-decoder needs its decoder inputs
            too).
        batch_inputs: ``batch_inputs(inputs)`` -> what
            :class:`~flopscope.training.BatchPricer` prices (default: the trainer's
            inputs dict as is: ``input_ids`` with their padding, or packed
            ``position_ids``).
        peak, dtype: the device's dense peak FLOP/s: a number, ``"auto"`` (default:
            looked up for the model's device and ``dtype``) or ``None`` (unknown: no
            MFU), as :class:`~flopscope.training.Throughput` takes it.
        lengths: sequence lengths traced once on train begin (default: 8 to 128, or up
            to the config's position count when it is smaller).
        attention: the convention of the attention core, ``"executed"`` (default),
            ``"causal"`` or ``"mask"`` (see the module docstring).
    """

    def __init__(self, make_inputs: Callable[[int], Any] | None = None, *,
                 batch_inputs: Callable[[Any], Any] | None = None, peak: float | str | None = AUTO,
                 dtype: torch.dtype = torch.float32, lengths: tuple[int, ...] | None = None,
                 attention: str = EXECUTED) -> None:
        self.suffix = metric_suffix(attention)  # checks the name, before training starts
        self.attention = attention
        self.make_inputs, self.batch_inputs = make_inputs, batch_inputs
        self.peak, self.dtype, self.lengths = peak, dtype, lengths
        self.pricer: BatchPricer | None = None
        self.meter: Throughput | None = None  # every step since train begin
        self.window: Throughput | None = None  # the steps since the last log
        self.disabled = False
        self.history: list[dict[str, Any]] = []  # every optimizer step's metrics
        # the trainer's own hook, used once disabled
        self._original: Callable[[Any], int] | None = None
        # micro-batches priced since the last optimizer step
        self._pending: dict[str, Any] = _empty_step()
        self._mark: float | None = None

    def attach(self, trainer: Trainer) -> FlopscopeTrainerCallback:
        """Make ``trainer`` price batches with :meth:`floating_point_ops` and run this
        callback first among its callbacks (so reporting integrations see the metrics
        it adds to the logs)."""
        self._original = trainer.floating_point_ops
        trainer.floating_point_ops = self.floating_point_ops  # type: ignore[method-assign]  # one instance's hook
        trainer.callback_handler.callbacks.insert(0, self)
        return self

    # ---------------------------------------------------------------------------------------------
    def floating_point_ops(self, inputs: Mapping[str, Any]) -> int:
        """Model FLOPs (forward + backward) of one micro-batch: the
        ``Trainer.floating_point_ops`` hook."""
        if not self.disabled and self.pricer is not None:
            try:
                return self._price(self.pricer, inputs)
            except Exception as error:  # a metrics hook must never stop training
                self._disable(error)
        return int(self._original(inputs)) if self._original is not None else 0

    def _price(self, pricer: BatchPricer, inputs: Mapping[str, Any]) -> int:
        priced = pricer.price(self.batch_inputs(inputs) if self.batch_inputs is not None else inputs)
        pending = self._pending
        pending["flops"] += priced["flops"]
        pending["recomputed"] += priced["recomputed_flops"]
        pending["tokens"] += priced["tokens"]
        pending["by_role"].update(priced["flops_by_role"])
        return int(priced["flops"])

    # ---------------------------------------------------------------------------------------------
    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       model: torch.nn.Module | None = None, **kwargs: Any) -> None:
        if model is None or self.disabled:
            return
        try:
            make_inputs = self.make_inputs or _token_ids(getattr(model, "main_input_name",
                                                                 "input_ids"))
            lengths = self.lengths or _lengths(model)
            self.pricer = flops_per_batch(model, make_inputs, backward=True, lengths=lengths,
                                          training=True,
                                          attention=self.attention)
            device = next(model.parameters(), torch.empty(0)).device
            self.meter = Throughput(self.pricer, peak=self.peak, device=device, dtype=self.dtype)
            self.window = self.meter.fresh()
        except Exception as error:  # training goes on with the trainer's own estimate
            self._disable(error)

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                      **kwargs: Any) -> None:
        if self._mark is None:
            self._mark = time.perf_counter()

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        now = time.perf_counter()
        seconds, self._mark = now - (self._mark if self._mark is not None else now), now
        pending, self._pending = self._pending, _empty_step()
        if self.disabled or self.meter is None or not seconds > 0:
            return
        try:
            step = {"flops": pending["flops"], "recomputed": pending["recomputed"],
                    "tokens": pending["tokens"],
                    "flops_by_role": pending["by_role"]}
            self.history.append(self.meter.record(seconds=seconds, **step))
            if self.window is not None:
                self.window.record(seconds=seconds, **step)
        except Exception as error:
            self._disable(error)

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        window = self.window
        self.window = window.fresh() if window is not None else None
        if self.disabled or logs is None or window is None or not window.steps:
            return
        summary = window.summary()
        tag = self.suffix  # the convention, in the name of every FLOP-derived metric
        metrics = {f"flops_per_second{tag}": summary["flops_per_sec"],
                   "tokens_per_second": summary["tokens_per_sec"]}
        if summary["mfu"] is not None:
            metrics |= {f"mfu{tag}": summary["mfu"], f"hfu{tag}": summary["hfu"],
                        "peak_flops": summary["peak"]}
        metrics |= {f"flops{tag}/{role}": float(v) for role, v in summary["flops_by_role"].items()}
        logs.update(metrics)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(metrics)  # the trainer keeps a copy of the logs

    def _disable(self, error: Exception) -> None:
        self.disabled = True
        warnings.warn("flopscope: FlopscopeTrainerCallback disabled itself "
                      f"({type(error).__name__}: {error}); the "
                      "trainer prices batches with its own floating_point_ops again",
                      FlopscopeWarning, stacklevel=3)


def _empty_step() -> dict[str, Any]:
    return {"flops": 0, "recomputed": 0, "tokens": 0, "by_role": Counter()}


def _lengths(model: torch.nn.Module, longest: int = 128) -> tuple[int, ...]:
    """Five lengths up to ``longest``, or up to the position count the config declares
    when it is smaller."""
    declared: dict[str, Any] = getattr(getattr(model, "config", None), "to_dict", dict)()
    positions = next((declared[key] for key in POSITIONS.config if isinstance(declared.get(key), int)), longest)
    top = max(5, min(longest, positions))
    return tuple(sorted({max(1, top * k // 16) for k in (1, 2, 4, 8, 16)}))


def _token_ids(name: str) -> Callable[[int], dict[str, torch.Tensor]]:
    def make_inputs(n: int) -> dict[str, torch.Tensor]:
        return {name: torch.zeros(1, n, dtype=torch.long)}

    return make_inputs
