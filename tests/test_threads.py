"""Profiles from several threads: each gives the single-thread answer, and the shared model is never touched."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor

import flopscope
from flopscope.studies.models import TransformerBlock

D, H, D_FF, N = 64, 4, 128, 32
TOTAL = N * (4 * D * D + 2 * D * D_FF) + 2 * N * N * D  # TransformerBlock's closed form (seed study)


def _in_threads(work: Callable[[], Any], threads: int = 4, repeats: int = 5) -> list[Any]:
    """Run ``work`` ``repeats`` times in each of ``threads`` threads started together; results or errors."""
    results: list[Any] = []
    lock, start = threading.Lock(), threading.Barrier(threads)

    def worker() -> None:
        start.wait()
        for _ in range(repeats):
            try:
                value: Any = work()
            except Exception as error:  # a failure is a result to assert on, not a crash of the thread
                value = error
            with lock:
                results.append(value)

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in pool), "a profiling thread hung"
    return results


def test_fake_profiles_from_four_threads_agree_and_leave_the_model_and_logger_alone() -> None:
    model, x = TransformerBlock(D, H, D_FF), torch.randn(1, N, D)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    level, filters = logger.level, list(logger.filters)
    totals = _in_threads(lambda: flopscope.profile(model, x, mode="fake").total())
    assert totals == [TOTAL] * 20
    assert not any(isinstance(p, FakeTensor) for p in model.parameters())
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())
    assert logger.level == level and logger.filters == filters


def test_real_profiles_from_four_threads_attribute_modules_per_thread() -> None:
    model, x = TransformerBlock(D, H, D_FF).eval(), torch.randn(1, N, D)
    with torch.no_grad():
        alone = flopscope.profile(model, x, mode="real").by_module()
    assert alone["attention"] == N * 4 * D * D + 2 * N * N * D and alone["ffn"] == N * 2 * D * D_FF

    def work() -> dict[str, int]:
        with torch.no_grad():
            return flopscope.profile(model, x, mode="real").by_module()

    assert _in_threads(work) == [alone] * 20


def test_a_thread_running_the_model_is_unaffected_by_fake_profiles_elsewhere() -> None:
    model, x = TransformerBlock(D, H, D_FF).eval(), torch.randn(1, N, D)
    with torch.no_grad():
        expected = model(x)
    stop = threading.Event()
    outputs: list[Any] = []

    def run_model() -> None:
        while not stop.is_set():
            try:
                with torch.no_grad():
                    outputs.append(model(x))
            except Exception as error:  # recorded, asserted below
                outputs.append(error)

    runner = threading.Thread(target=run_model)
    runner.start()
    try:
        totals = [flopscope.profile(model, x, mode="fake").total() for _ in range(10)]
    finally:
        stop.set()
        runner.join(timeout=60)
    assert not runner.is_alive()
    assert totals == [TOTAL] * 10 and outputs
    assert all(isinstance(y, torch.Tensor) and not isinstance(y, FakeTensor) for y in outputs)
    assert all(torch.equal(y, expected) for y in outputs)


def test_a_profiler_block_says_how_many_forwards_other_threads_ran() -> None:
    model, x = TransformerBlock(D, H, D_FF).eval(), torch.randn(1, N, D)
    with pytest.warns(flopscope.FlopscopeWarning, match="3 forward.*other threads"), \
            torch.no_grad(), flopscope.profiler(model) as prof:
        model(x)
        worker = threading.Thread(target=lambda: [model(x) for _ in range(3)])
        worker.start()
        worker.join(timeout=60)
    assert prof.total() == TOTAL  # the opening thread's forward, once



def test_a_profiler_block_counts_a_submodule_called_by_another_thread_as_foreign() -> None:
    model, x = TransformerBlock(D, H, D_FF).eval(), torch.randn(1, N, D)
    with pytest.warns(flopscope.FlopscopeWarning, match="1 forward.*other threads"), torch.no_grad(), \
            flopscope.profiler(model) as prof:
        worker = threading.Thread(target=lambda: model.ffn(x))
        worker.start()
        worker.join(timeout=60)
    assert prof.total() == 0
