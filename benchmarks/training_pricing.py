"""What do exact FLOPs cost inside a training loop? A batch pricer next to re-profiling, and the training callbacks.

Run from the repository root (the script puts the repository on ``sys.path``; ``transformers``, ``lightning`` and
``tabulate`` are needed)::

    python benchmarks/training_pricing.py            # full: 10,000 batches, 20 re-profiled, 5 reps (~10 min, 2 cores)
    python benchmarks/training_pricing.py --quick    # smoke: 500 batches, 5 re-profiled, 2 reps (~1 min)
    python benchmarks/training_pricing.py --batches 2000 --profile-sample 10 --reps 3 --steps 30

The model is a tiny GPT-2 built from a config with random weights:
``GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=1024))``.
Every number is a median over ``--reps`` repetitions (the machine is noisy).

Part 1: pricing batches versus re-profiling them
------------------------------------------------
``--batches`` batches of random shapes are built first (seed ``--seed``), ``B`` rows of ``n`` tokens with ``B`` in
1..8 and ``n`` in 16..512, of four kinds, in a fixed mix:

    dense        a tensor of token ids ``[B, n]`` (an expanded zero tensor: only the shape is read)       50 %
    padded       ``{"input_ids": [B, n], "attention_mask": [B, n]}`` with right padding                    10 %
    packed pos   ``{"input_ids": [B, n], "position_ids": [B, n]}``, each row 2..6 sequences whose
                 positions restart (packed rows)                                                            25 %
    packed cu    ``{"input_ids": [1, B·n], "cu_seqlens": ...}``, the ``B·n`` tokens as B..2B sequences       15 %

Each repetition

1. builds the pricer, ``flopscope.flops_per_batch(model, lambda n: zeros(1, n), backward=True)`` (five traced
   lengths; a one-off cost, reported apart);
2. prices every batch with it, timed per kind, twice: ``pricer(batch)`` (forward and backward FLOPs) and
   ``pricer.price(batch)`` (FLOPs per role, total, recomputed FLOPs and tokens from one reading of the batch: what
   the callbacks call each step); each ``µs`` column is the total time over the number of batches;
3. re-profiles a sample of ``--profile-sample`` batches (taken from the kinds in turn) with
   ``flopscope.profile(model, ..., mode="fake", backward=True)``, each timed alone. Re-profiling all the batches
   would take too long: its per-batch time is the sample's mean, *extrapolated* to the whole set.

``pricing / re-profiling`` is the per-batch pricing time (the slower of the two readings) over the per-batch
re-profiling time of the same repetition, median over repetitions (target: < 1 %). The first line printed names the
machine (threads, CPUs).

The prices are checked, not just timed (the script stops on a difference): ``price(batch)`` agrees with
``pricer(batch)`` and ``flops_by_role(batch)``, and for every sampled dense or padded batch the price equals
``profile.total_flops()``. A packed batch runs here as dense rows (the GPT-2 of ``transformers``
has no variable-length kernel), so its profile charges the attention core ``n²`` per row, where the pricer charges
``Σ Lᵢ²`` per row, as a variable-length kernel executes it (``docs/conventions.md``): every other role must equal
the profile's, and the attention core must equal the profile's scaled from ``rows · n²`` to ``Σ Lᵢ²``. Once per run
the packed sample with the fewest sequences is also priced against the sum of profiles of its sequences, each
alone: what a variable-length kernel runs.

Part 2: the per-step cost of a training callback
------------------------------------------------
A callback is timed from inside itself during a real fit: a subclass wraps its per-step hooks with
``time.perf_counter``; the one-off trace on fit / train begin is not counted. The first ``--warmup-steps`` steps of
each fit are not counted either; then ``--steps`` steps are, per repetition. Each callback runs twice, logging at
the framework's default interval and at every step (the worst case): logging happens only on logging steps, so the
first row spreads its cost over the steps and the second pays it every step.

- Lightning (``flopscope.integrations.lightning.FlopscopeCallback``): ``lightning.Trainer(accelerator="cpu",
  max_steps=..., logger=CSVLogger(tmpdir), log_every_n_steps=50 or 1)`` on the tiny GPT-2, batches of the dense
  shapes above (random token ids, one ``[B, n]`` tensor a step). Timed: ``on_train_batch_start`` (prices the batch
  once, sets ``pl_module.flops_per_batch``) and ``on_train_batch_end`` (accounts the step; on a logging step, sends
  the rates of the steps since the last one, ~16 metrics, to ``trainer.loggers[...].log_metrics``). ``of which
  logging`` is the time inside the logger's ``log_metrics`` during the end hook (a real ``CSVLogger``, timed by a
  subclass). ``step ms`` runs from the end of the start hook to the start of the end hook.
- Hugging Face (``flopscope.integrations.huggingface.FlopscopeTrainerCallback(peak=...).attach(trainer)``): a real
  ``transformers.Trainer`` (``use_cpu=True``, ``report_to=[]``, ``save_strategy="no"``, ``logging_steps=500``, the
  default, or 1; AdamW) on the tiny GPT-2; each step is one micro-batch of B in 1..8 sequences of 16..512 random
  token ids, right-padded to the longest by a collate function (``input_ids``, ``attention_mask``, ``labels``).
  Timed per optimizer step: ``floating_point_ops`` (the Trainer calls it per micro-batch; it prices the batch) and
  ``on_step_begin``, in the ``pricing`` column; ``on_step_end`` (accounts the step) and ``on_log`` (adds the
  window's ~14 metrics to the logs; counted in the step it follows, the summary log after training in the last
  step) in ``end of step``; ``of which logging`` is ``on_log``. ``step ms`` runs from the end of ``on_step_begin``
  to the start of ``on_step_end``, ``floating_point_ops`` left out.

Per row: the means per step of the pricing hooks, of the end-of-step hooks and of logging; ``callback ms/step``,
their sum, the mean over the timed steps (logging steps included: what the callback costs on average; target:
< 1 ms per step); its median; ``on a logging step``, the median of the callback's time on the steps where it
logged; ``step ms``, the median step; each the median over repetitions. The FLOPs of the first step (the
callback's ``history[0]``) are checked against ``flopscope.profile(..., mode="fake", backward=True)`` of its batch
(for Hugging Face the Trainer's inputs as given, ``labels`` included), and the number of logs against the logging
interval.

Another callback adds a row: a function returning one ``CallbackCost`` per repetition, appended to
``CALLBACK_BENCHMARKS``.
"""

from __future__ import annotations

import argparse
import functools
import gc
import logging
import os
import platform
import random
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402

import flopscope  # noqa: E402
from flopscope.role import Role  # noqa: E402
from flopscope.workloads.training import BatchPricer, flops_per_batch  # noqa: E402

PRICING_TARGET = 0.01  # pricing a batch costs < 1 % of profiling it again
CALLBACK_TARGET_MS = 1.0  # a callback adds < 1 ms per training step
KINDS = (("dense", 50), ("padded", 10), ("packed pos", 25), ("packed cu", 15))  # kind, % of the batches
B_RANGE, N_RANGE = (1, 8), (16, 512)


def tiny_gpt2() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=1024, bos_token_id=0,
                        eos_token_id=0)  # token ids inside the vocabulary: no warning
    return GPT2LMHeadModel(config)


def one_sequence(n: int) -> torch.Tensor:
    return torch.zeros(1, n, dtype=torch.long)


def table(rows: list[list[Any]], headers: list[str]) -> str:
    try:
        from tabulate import tabulate
    except ImportError:
        widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows, strict=True)]
        return "\n".join("  ".join(str(x).rjust(w) for x, w in zip(r, widths, strict=True)) for r in [headers, *rows])
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


# -------------------------------------------------------------------------------------------------
# part 1
@dataclass
class Batch:
    kind: str
    priced: Any  # what the pricer gets
    rows: int
    n: int  # tokens per row
    segments: list[list[int]]  # per row, the lengths of its sequences

    def model_inputs(self) -> dict[str, Any]:
        """The model's keyword arguments for this batch (built only for the re-profiled sample)."""
        if self.kind == "dense":
            return {"input_ids": torch.zeros(self.rows, self.n, dtype=torch.long)}
        if self.kind == "padded":
            return dict(self.priced)
        positions = torch.tensor([[p for length in row for p in range(length)] for row in self.segments])
        return {"input_ids": torch.zeros(self.rows, self.n, dtype=torch.long), "position_ids": positions}


def split(rng: random.Random, n: int, pieces: int) -> list[int]:
    """``n`` tokens as ``pieces`` sequences of random lengths (each at least 1)."""
    pieces = min(pieces, n)
    cuts = sorted(rng.sample(range(1, n), pieces - 1))
    return [b - a for a, b in zip([0, *cuts], [*cuts, n], strict=True)]


def make_batches(count: int, seed: int) -> list[Batch]:
    rng = random.Random(seed)
    kinds = [kind for kind, share in KINDS for _ in range(share)]
    zero = torch.zeros(1, 1, dtype=torch.long)
    batches = []
    for _ in range(count):
        kind = rng.choice(kinds)
        B, n = rng.randint(*B_RANGE), rng.randint(*N_RANGE)
        if kind == "dense":
            batches.append(Batch(kind, zero.expand(B, n), B, n, [[n]] * B))
        elif kind == "padded":
            mask = torch.ones(B, n, dtype=torch.long)
            for row in range(B):
                mask[row, rng.randint(1, n):] = 0
            batches.append(Batch(kind, {"input_ids": zero.expand(B, n), "attention_mask": mask}, B, n, [[n]] * B))
        elif kind == "packed pos":
            segments = [split(rng, n, rng.randint(2, 6)) for _ in range(B)]
            positions = torch.tensor([[p for length in row for p in range(length)] for row in segments])
            batches.append(Batch(kind, {"input_ids": zero.expand(B, n), "position_ids": positions}, B, n, segments))
        else:
            lengths = split(rng, B * n, rng.randint(B, 2 * B))
            offsets = [0]
            for length in lengths:
                offsets.append(offsets[-1] + length)
            priced = {"input_ids": zero.expand(1, B * n), "cu_seqlens": torch.tensor(offsets, dtype=torch.int32)}
            batches.append(Batch(kind, priced, 1, B * n, [lengths]))
    return batches


def sample(batches: list[Batch], size: int) -> list[Batch]:
    """``size`` batches, taken from the kinds in turn (the first of each kind, then the second, ...)."""
    by_kind = {kind: [b for b in batches if b.kind == kind] for kind, _ in KINDS}
    picked: list[Batch] = []
    for i in range(max(map(len, by_kind.values()), default=0)):
        for kind, _ in KINDS:
            if len(picked) < size and i < len(by_kind[kind]):
                picked.append(by_kind[kind][i])
    return picked


def check_price(pricer: BatchPricer, batch: Batch, prof: flopscope.Profile) -> None:
    """The pricer's FLOPs of ``batch`` against a profile of it (see the module docstring for packed rows)."""
    price = pricer(batch.priced)
    everything = pricer.price(batch.priced)  # what a callback reads: the same prices
    assert everything["flops"] == price and everything["flops_by_role"] == pricer.flops_by_role(batch.priced), batch
    assert everything["tokens"] == batch.rows * batch.n and everything["recomputed_flops"] == 0, everything
    if batch.kind in ("dense", "padded"):
        assert price == prof.total_flops(), (batch.kind, batch.rows, batch.n, price, prof.total_flops())
        return
    priced, profiled = pricer.flops_by_role(batch.priced), prof.by_role()
    squares = sum(length * length for row in batch.segments for length in row)
    assert set(priced) == set(profiled), (sorted(priced), sorted(profiled))
    for role, flops in priced.items():
        expected = 2 * profiled[role]
        if Role(role).attention_core:  # n² per row executed, Σ Lᵢ² per row priced
            expected = Fraction(expected * squares, batch.rows * batch.n**2)
        assert flops == expected, (batch.kind, role, batch.segments, flops, expected)


def check_against_sequences(model: torch.nn.Module, pricer: BatchPricer, batch: Batch) -> int:
    """A packed batch's price against the sum of profiles of each of its sequences alone; returns how many."""
    totals: dict[int, int] = {}
    for length in {length for row in batch.segments for length in row}:
        totals[length] = flopscope.profile(model, one_sequence(length), mode="fake", backward=True).total_flops()
    alone = sum(totals[length] for row in batch.segments for length in row)
    assert pricer(batch.priced) == alone, (batch.segments, pricer(batch.priced), alone)
    return sum(map(len, batch.segments))


@dataclass
class PricingRep:
    build_s: float
    pricing_s: dict[str, float]  # kind -> seconds to price all the batches of that kind (pricer(batch))
    price_s: dict[str, float]  # kind -> seconds for pricer.price(batch) of all of them (what a callback calls)
    profile_s: dict[str, list[float]]  # kind -> seconds of each re-profiled batch
    pricer: BatchPricer


def pricing_rep(model: torch.nn.Module, batches: list[Batch], sampled: list[Batch]) -> PricingRep:
    gc.collect()
    start = time.perf_counter()
    pricer = flops_per_batch(model, one_sequence, backward=True)
    build = time.perf_counter() - start
    pricing: dict[str, float] = {}
    everything: dict[str, float] = {}
    for kind, _ in KINDS:
        priced = [b.priced for b in batches if b.kind == kind]
        gc.collect()
        start = time.perf_counter()
        for batch in priced:
            pricer(batch)
        pricing[kind] = time.perf_counter() - start
        gc.collect()
        start = time.perf_counter()
        for batch in priced:
            pricer.price(batch)
        everything[kind] = time.perf_counter() - start
    profiling: dict[str, list[float]] = {kind: [] for kind, _ in KINDS}
    for batch in sampled:
        inputs = batch.model_inputs()
        gc.collect()
        start = time.perf_counter()
        prof = flopscope.profile(model, mode="fake", backward=True, **inputs)
        profiling[batch.kind].append(time.perf_counter() - start)
        check_price(pricer, batch, prof)
    return PricingRep(build, pricing, everything, profiling, pricer)


def run_pricing(args: argparse.Namespace) -> None:
    model = tiny_gpt2()
    batches = make_batches(args.batches, args.seed)
    sampled = sample(batches, args.profile_sample)
    count = {kind: sum(b.kind == kind for b in batches) for kind, _ in KINDS}
    flopscope.profile(model, one_sequence(16), mode="fake", backward=True)  # warm-up: imports, caches
    reps = [pricing_rep(model, batches, sampled) for _ in range(args.reps)]
    packed = [b for b in sampled if b.kind.startswith("packed")]
    sequences = 0
    if packed:
        fewest = min(packed, key=lambda b: sum(map(len, b.segments)))
        sequences = check_against_sequences(model, reps[-1].pricer, fewest)

    def per_batch(rep: PricingRep, kinds: list[str]) -> tuple[float, float, float]:
        """(pricer(batch) s, pricer.price(batch) s, re-profiling s) per batch of these kinds in one repetition."""
        batches_here = sum(count[k] for k in kinds)
        priced = sum(rep.pricing_s[k] for k in kinds) / batches_here
        everything = sum(rep.price_s[k] for k in kinds) / batches_here
        profiled = [t for k in kinds for t in rep.profile_s[k]]
        return priced, everything, (statistics.fmean(profiled) if profiled else float("nan"))

    rows = []
    for label, kinds in [*((kind, [kind]) for kind, _ in KINDS), ("all", [kind for kind, _ in KINDS])]:
        if not sum(count[k] for k in kinds):
            continue
        triples = [per_batch(rep, kinds) for rep in reps]
        call_us = 1e6 * statistics.median(p for p, _, _ in triples)
        price_us = 1e6 * statistics.median(e for _, e, _ in triples)
        profile_ms = 1e3 * statistics.median(q for _, _, q in triples)
        ratio = statistics.median(max(p, e) / q for p, e, q in triples)  # the slower of the two readings
        sampled_here = sum(b.kind in kinds for b in sampled)
        rows.append([label, f"{sum(count[k] for k in kinds):,}", f"{call_us:.1f}", f"{price_us:.1f}", sampled_here,
                     f"{profile_ms:.1f}", f"{100 * ratio:.3f} %" if sampled_here else "n/a",
                     verdict(ratio < PRICING_TARGET) if sampled_here else "n/a"])
    build = statistics.median(rep.build_s for rep in reps)
    print(f"\nPart 1: pricing {args.batches:,} batches (B {B_RANGE[0]}..{B_RANGE[1]}, n {N_RANGE[0]}..{N_RANGE[1]}) "
          f"with flops_per_batch vs re-profiling each (profile, mode='fake', backward=True)")
    print(f"building the pricer (one-off, 5 traced lengths, forward + backward): {1e3 * build:.0f} ms")
    print(table(rows, ["batches", "count", "pricer(batch) µs", "price(batch) µs", "re-profiled",
                       "re-profiling ms/batch", "pricing / re-profiling", f"< {100 * PRICING_TARGET:g} %"]))
    print(f"re-profiling is timed on {len(sampled)} of the {args.batches:,} batches (a sample, every repetition) "
          "and extrapolated per batch; pricing is timed on all of them.")
    print(f"checked: the price of every re-profiled batch equals its profile ({len(sampled)} batches x {args.reps} "
          "reps; packed rows with the attention core at Σ Lᵢ²)"
          + (f", and one packed batch equals the sum of profiles of its {sequences} sequences alone" if packed else ""))


# -------------------------------------------------------------------------------------------------
# part 2
@dataclass
class CallbackCost:
    """What a callback adds per training step, from its own hooks (seconds, one entry per timed step)."""

    start_s: list[float] = field(default_factory=list)  # pricing: the hook(s) before or inside the step
    end_s: list[float] = field(default_factory=list)  # the hook(s) after the step, logging included
    step_s: list[float] = field(default_factory=list)  # the step between them (the callback's own time left out)
    logging_s: list[float] = field(default_factory=list)  # of end_s, handing metrics to the framework (0: no log)
    logged: list[bool] = field(default_factory=list)  # whether the callback logged at this step

    def after(self, skip: int) -> CallbackCost:
        """The steps after the first ``skip`` (warm-up)."""
        return CallbackCost(self.start_s[skip:], self.end_s[skip:], self.step_s[skip:], self.logging_s[skip:],
                            self.logged[skip:])

    def totals(self) -> list[float]:
        """The callback's time at each step, all its hooks together."""
        return [a + b for a, b in zip(self.start_s, self.end_s, strict=True)]


def training_batches(count: int, seed: int) -> list[torch.Tensor]:
    """Token ids of dense batches, B in 1..8 and n in 16..512 as in part 1."""
    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 100, (rng.randint(*B_RANGE), rng.randint(*N_RANGE)), generator=generator)
            for _ in range(count)]


def quiet_frameworks() -> None:
    for name in ("lightning.pytorch", "lightning.fabric", "transformers", "accelerate"):
        logging.getLogger(name).setLevel(logging.ERROR)


def lightning_callback_cost(args: argparse.Namespace, every: int) -> list[CallbackCost]:
    """One CallbackCost per repetition: a real lightning.Trainer fit, logging to a CSVLogger every ``every`` steps,
    with a self-timing FlopscopeCallback."""
    import tempfile

    import lightning.pytorch as pl
    from lightning.pytorch.loggers import CSVLogger

    from flopscope.integrations.lightning import FlopscopeCallback

    class TinyGPT(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = tiny_gpt2()

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.model(ids).logits

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            logits = self(batch)
            return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), batch[:, 1:].flatten())

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    class TimedLogger(CSVLogger):
        """A real CSVLogger that times each ``log_metrics`` call."""

        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            self.calls_s: list[float] = []

        def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
            start = time.perf_counter()
            super().log_metrics(metrics, step)
            self.calls_s.append(time.perf_counter() - start)

    class TimedCallback(FlopscopeCallback):
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            self.cost = CallbackCost()
            self.first_batch: torch.Tensor | None = None

        def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                                 batch_idx: int) -> None:
            start = time.perf_counter()
            super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
            self.cost.start_s.append(time.perf_counter() - start)
            if self.first_batch is None:
                self.first_batch = batch

        def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                               batch_idx: int) -> None:
            loggers = [lg for lg in trainer.loggers if isinstance(lg, TimedLogger)]
            before = [len(lg.calls_s) for lg in loggers]
            start = time.perf_counter()
            self.cost.step_s.append(start - self._start)
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
            self.cost.end_s.append(time.perf_counter() - start)
            calls = [t for lg, n in zip(loggers, before, strict=True) for t in lg.calls_s[n:]]
            self.cost.logging_s.append(sum(calls))
            self.cost.logged.append(bool(calls))

    quiet_frameworks()
    data = training_batches(args.warmup_steps + args.steps, args.seed)
    costs = []
    for rep in range(args.reps):
        module = TinyGPT()
        callback = TimedCallback(one_sequence, peak=1e12)
        with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Lightning's advice (num_workers, log_every_n_steps, ...)
            logger = TimedLogger(tmp)
            trainer = pl.Trainer(accelerator="cpu", max_steps=len(data), logger=logger, log_every_n_steps=every,
                                 enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                                 callbacks=[callback])
            loader = torch.utils.data.DataLoader(data, batch_size=None, shuffle=False)
            gc.collect()
            trainer.fit(module, loader)
        assert not callback.disabled and len(callback.history) == len(data), (callback.disabled, len(callback.history))
        logging_steps = {s for s in range(1, len(data) + 1) if s % every == 0} | {len(data)}
        assert len(callback.logged) == len(logging_steps) == sum(callback.cost.logged), \
            (len(callback.logged), sorted(logging_steps), sum(callback.cost.logged))
        if rep == 0 and callback.first_batch is not None:
            exact = flopscope.profile(module, callback.first_batch, mode="fake", backward=True).total_flops()
            assert callback.history[0]["flops"] == exact, (callback.history[0]["flops"], exact)
        costs.append(callback.cost.after(args.warmup_steps))
    return costs


def hf_batches(count: int, seed: int) -> list[list[torch.Tensor]]:
    """Per optimizer step, B in 1..8 sequences of random token ids, each 16..512 long (padded when collated)."""
    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    return [[torch.randint(0, 100, (rng.randint(*N_RANGE),), generator=generator) for _ in range(rng.randint(*B_RANGE))]
            for _ in range(count)]


def pad_collate(items: list[list[torch.Tensor]]) -> dict[str, torch.Tensor]:
    """One dataset item (a list of sequences) as a right-padded batch: input_ids, attention_mask, labels."""
    (sequences,) = items
    n = max(len(s) for s in sequences)
    ids = torch.zeros(len(sequences), n, dtype=torch.long)
    mask = torch.zeros(len(sequences), n, dtype=torch.long)
    for row, s in enumerate(sequences):
        ids[row, :len(s)], mask[row, :len(s)] = s, 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def hf_callback_cost(args: argparse.Namespace, every: int) -> list[CallbackCost]:
    """One CallbackCost per repetition: a real transformers.Trainer run (CPU, ``logging_steps=every``) with a
    self-timing FlopscopeTrainerCallback attached."""
    import tempfile

    import transformers

    from flopscope.integrations.huggingface import FlopscopeTrainerCallback

    class TimedTrainerCallback(FlopscopeTrainerCallback):
        """Times what the integration adds per optimizer step: ``floating_point_ops`` (per micro-batch) and its
        ``on_step_begin`` / ``on_step_end`` / ``on_log`` hooks (``on_log`` is counted in the step it follows)."""

        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            self.steps: list[dict[str, Any]] = []
            self.first_inputs: dict[str, Any] | None = None
            self._open: dict[str, Any] | None = None  # the step running now
            self._begun = 0.0

        def floating_point_ops(self, inputs: Any) -> int:
            start = time.perf_counter()
            flops = super().floating_point_ops(inputs)
            spent = time.perf_counter() - start
            if self._open is not None:
                self._open["start"] += spent
                self._open["inside"] += spent
            if self.first_inputs is None:
                self.first_inputs = dict(inputs)
            return flops

        def on_step_begin(self, *a: Any, **kw: Any) -> None:
            start = time.perf_counter()
            super().on_step_begin(*a, **kw)
            self._begun = time.perf_counter()
            self._open = {"start": self._begun - start, "inside": 0.0, "end": 0.0, "logging": 0.0, "logged": False}

        def on_step_end(self, *a: Any, **kw: Any) -> None:
            start = time.perf_counter()
            super().on_step_end(*a, **kw)
            spent = time.perf_counter() - start
            step, self._open = self._open, None
            if step is not None:
                step["step"] = start - self._begun - step["inside"]
                step["end"] += spent
                self.steps.append(step)

        def on_log(self, *a: Any, **kw: Any) -> None:
            start = time.perf_counter()
            window = self.window.steps if self.window is not None else 0
            super().on_log(*a, **kw)
            spent = time.perf_counter() - start
            if self.steps:  # the step this log follows (the run's last step for the summary log after training)
                self.steps[-1]["end"] += spent
                self.steps[-1]["logging"] += spent
                self.steps[-1]["logged"] |= bool(window)  # the callback added metrics to these logs

    quiet_frameworks()
    data = hf_batches(args.warmup_steps + args.steps, args.seed)
    costs = []
    for rep in range(args.reps):
        model = tiny_gpt2()
        with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            training = transformers.TrainingArguments(
                output_dir=tmp, use_cpu=True, report_to=[], save_strategy="no", logging_steps=every,
                max_steps=len(data), per_device_train_batch_size=1, remove_unused_columns=False, disable_tqdm=True,
                learning_rate=1e-3, seed=args.seed + rep)
            trainer = transformers.Trainer(model=model, args=training, train_dataset=data, data_collator=pad_collate)
            trainer.remove_callback(transformers.trainer_callback.PrinterCallback)  # it prints every log
            callback = TimedTrainerCallback(peak=1e12).attach(trainer)
            gc.collect()
            trainer.train()
        assert not callback.disabled and len(callback.history) == len(data) == len(callback.steps), \
            (callback.disabled, len(callback.history), len(callback.steps))
        logs = [entry for entry in trainer.state.log_history if "flops_per_second" in entry]
        assert len(logs) == sum(s["logged"] for s in callback.steps) >= 1, (len(logs), every)
        if rep == 0 and callback.first_inputs is not None:
            exact = flopscope.profile(model, mode="fake", backward=True, **callback.first_inputs).total_flops()
            assert callback.history[0]["flops"] == exact, (callback.history[0]["flops"], exact)
        steps = callback.steps
        costs.append(CallbackCost([s["start"] for s in steps], [s["end"] for s in steps], [s["step"] for s in steps],
                                  [s["logging"] for s in steps], [s["logged"] for s in steps]).after(args.warmup_steps))
    return costs


# A row per training callback: (label, function(args) -> one CallbackCost per repetition). Another callback is timed
# the same way, from its own hooks during a real fit, and appended here.
CALLBACK_BENCHMARKS: list[tuple[str, Callable[[argparse.Namespace], list[CallbackCost]]]] = [
    ("Lightning FlopscopeCallback, log_every_n_steps=50", functools.partial(lightning_callback_cost, every=50)),
    ("Lightning FlopscopeCallback, log_every_n_steps=1", functools.partial(lightning_callback_cost, every=1)),
    ("HF FlopscopeTrainerCallback, logging_steps=500", functools.partial(hf_callback_cost, every=500)),
    ("HF FlopscopeTrainerCallback, logging_steps=1", functools.partial(hf_callback_cost, every=1)),
]


def run_callbacks(args: argparse.Namespace) -> None:
    def per_rep(costs: list[CallbackCost], value: Callable[[CallbackCost], float]) -> float:
        return statistics.median(value(c) for c in costs)

    rows = []
    for label, measure in CALLBACK_BENCHMARKS:
        costs = measure(args)
        start = per_rep(costs, lambda c: statistics.fmean(c.start_s))
        end = per_rep(costs, lambda c: statistics.fmean(c.end_s))
        logged = per_rep(costs, lambda c: statistics.fmean(c.logging_s))
        mean = per_rep(costs, lambda c: statistics.fmean(c.totals()))
        median = per_rep(costs, lambda c: statistics.median(c.totals()))
        with_logs = [c for c in costs if any(c.logged)]
        at_log = per_rep(with_logs, lambda c: statistics.median(t for t, f in zip(c.totals(), c.logged, strict=True)
                                                                if f)) if with_logs else None
        step = per_rep(costs, lambda c: statistics.median(c.step_s))
        logging_steps = statistics.median(sum(c.logged) for c in costs)
        rows.append([label, f"{sum(len(c.step_s) for c in costs)}", f"{logging_steps:g}", f"{1e6 * start:.0f}",
                     f"{1e6 * end:.0f}", f"{1e6 * logged:.0f}", f"{1e3 * mean:.3f}", f"{1e3 * median:.3f}",
                     f"{1e3 * at_log:.3f}" if at_log is not None else "n/a",
                     f"{1e3 * step:.1f}", f"{100 * mean / step:.2f} %", verdict(1e3 * mean < CALLBACK_TARGET_MS)])
    warmup = f"{args.warmup_steps} warm-up step{'s' if args.warmup_steps != 1 else ''}"
    print(f"\nPart 2: per-step cost of a training callback, timed inside its own hooks during a real fit "
          f"({args.steps} steps x {args.reps} reps after {warmup} each; "
          f"B {B_RANGE[0]}..{B_RANGE[1]}, n {N_RANGE[0]}..{N_RANGE[1]})")
    print(table(rows, ["callback", "steps", "logging steps / rep", "pricing µs", "end of step µs",
                       "of which logging µs", "callback ms/step", "median ms/step", "on a logging step ms", "step ms",
                       "of the step", f"< {CALLBACK_TARGET_MS:g} ms"]))
    print("pricing, end of step, logging and callback ms/step: means over the timed steps (logging steps included); "
          "median and on a logging step: medians of the callback's time per step; step ms: median.")

# -------------------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=None, help="batches priced (default 10,000; quick 500)")
    parser.add_argument("--profile-sample", type=int, default=None,
                        help="batches re-profiled per repetition (default 20; quick 5)")
    parser.add_argument("--reps", type=int, default=None, help="repetitions, medians over them (default 5; quick 2)")
    parser.add_argument("--steps", type=int, default=None, help="timed training steps per fit (default 50; quick 5)")
    parser.add_argument("--warmup-steps", type=int, default=None,
                        help="untimed steps first in each fit (default 3; quick 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: 500 batches, 5 re-profiled, 2 reps, 5 training steps after 1")
    parser.add_argument("--skip-pricing", action="store_true", help="only part 2")
    parser.add_argument("--skip-callbacks", action="store_true", help="only part 1")
    args = parser.parse_args()
    args.batches = args.batches or (500 if args.quick else 10_000)
    args.profile_sample = args.profile_sample or (5 if args.quick else 20)
    args.reps = args.reps or (2 if args.quick else 5)
    args.steps = args.steps or (5 if args.quick else 50)
    if args.warmup_steps is None:
        args.warmup_steps = 1 if args.quick else 3
    if args.threads:
        torch.set_num_threads(args.threads)

    import transformers

    print(f"flopscope {flopscope.__version__}, torch {torch.__version__}, transformers {transformers.__version__}, "
          f"python {platform.python_version()}, {torch.get_num_threads()} torch threads, {os.cpu_count()} CPUs; "
          f"medians of {args.reps} reps{' (quick)' if args.quick else ''}")
    if not args.skip_pricing:
        run_pricing(args)
    if not args.skip_callbacks:
        run_callbacks(args)


if __name__ == "__main__":
    main()
