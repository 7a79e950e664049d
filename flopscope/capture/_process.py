"""The process-wide switches held while a capture runs.

Each is set by the first capture to enter and put back by the last one to leave, since
captures may run in several threads at once (:class:`WhileCapturing`):

- :func:`paused_gc`: Python's cyclic collector paused for the capture's many small
  objects;
- :data:`deeper_recursion`: the recursion limit raised by :data:`EXTRA_FRAMES`;
- :data:`eager_flex_attention`: FlexAttention called directly, not through
  ``torch.compile``;
- :data:`known_tensor_data`: ``torch.tensor`` and its kin read the values the recorder
  knows;
- :func:`quiet_fake_tensor_log`: this thread's tracebacks of failed fake kernels
  dropped.

:func:`flopscope.capture.engine.capture_contexts` enters them in their order.
"""

from __future__ import annotations

import gc
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from .recorder import CONSTRUCTORS_FROM_DATA, from_known_data


class WhileCapturing:
    """A process-wide setting changed while any capture runs.

    The first capture to enter saves it and sets it; the last one to leave puts it back
    (captures may run in several threads at once). ``value(old)`` is the setting while
    capturing.
    """

    def __init__(self, read: Callable[[], Any], write: Callable[[Any], None],
                 value: Callable[[Any], Any]) -> None:
        self._read, self._write, self._value = read, write, value
        self._lock = threading.Lock()
        self._users = 0
        self._saved: Any = None

    @contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            if self._users == 0:
                self._saved = self._read()
                self._write(self._value(self._saved))
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    self._write(self._saved)


EXTRA_FRAMES = 400
"""Python frames flopscope adds to a forward's deepest call.

They are hooks and dispatch, at every nesting level. The recursion limit is raised by
this much while a capture runs, so a model as deep as a plain forward can run is as deep
as flopscope can count."""
deeper_recursion = WhileCapturing(sys.getrecursionlimit, sys.setrecursionlimit,
                                  lambda limit: limit + EXTRA_FRAMES)
"""Raise the recursion limit by :data:`EXTRA_FRAMES` while any capture runs.

There is one limit per interpreter."""


def _flex_module() -> Any:
    return sys.modules.get("torch.nn.attention.flex_attention")


def _set_flex_debug(value: Any) -> None:
    module = _flex_module()
    if module is not None and value is not None:
        module._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = value


eager_flex_attention = WhileCapturing(lambda: getattr(_flex_module(),
                                                      "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG",
                                                      None),
                                      _set_flex_debug, lambda old: None if old is None else True)
"""While a capture runs, FlexAttention (once imported) calls its op directly.

Its documented debug switch makes it do so. Outside ``torch.compile`` it wraps the op in
``torch.compile(fullgraph=True)``, which Dynamo refuses under any dispatch mode. Called
directly, the op runs the same eager (dense) implementation it compiles to there."""


def _constructors() -> tuple[Any, ...]:
    return tuple(getattr(torch, name) for name in CONSTRUCTORS_FROM_DATA)


def _set_constructors(functions: tuple[Any, ...]) -> None:
    for name, function in zip(CONSTRUCTORS_FROM_DATA, functions, strict=True):
        setattr(torch, name, function)


known_tensor_data = WhileCapturing(_constructors, _set_constructors,
                                   lambda old: tuple(from_known_data(function) for function in old))
"""While a fake run counts, ``torch.tensor`` and its kin read known values.

They are ``torch.tensor``, ``as_tensor`` and ``asarray``. They take one-element fake
tensors in their data at the values the recorder knows
(:func:`~flopscope.capture.recorder.from_known_data`). In other threads, and for other
data, the original functions run. They are put back when the last capture ends."""


@contextmanager
def paused_gc(promote: bool = False) -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the block.

    A capture allocates tens of thousands of small objects (fake tensors, graph
    records), and the full collections they trigger cost 10-20 % of the run. Cycles made
    meanwhile are collected once it is re-enabled.

    ``promote`` (a fake run, whose objects hold no memory of note): when the collector
    is re-enabled, the objects the block allocated are moved to the oldest generation at
    once. They are the capture's records, alive as long as the profile. ``gc.freeze()``
    then ``gc.unfreeze()`` costs two list splices, where the two young collections that
    would move them there cost 0.4-0.5 s of a 2.6 s count of a 28-step Flux.1-dev
    pipeline (565 thousand objects). The cycles left by the block, and the caller's
    young objects, are then collected by the next full collection (``gc.collect()``),
    not the next young one. Not where the process has frozen objects
    (``gc.get_freeze_count()``, a pre-fork server's): ``unfreeze`` would thaw them.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            if promote and not gc.get_freeze_count():
                gc.freeze()
                gc.unfreeze()
            gc.enable()


class _ThisThreadOnly(logging.Filter):
    """Drops the records of one thread (never the logger's level, a global)."""

    def __init__(self) -> None:
        super().__init__()
        self.thread = threading.get_ident()

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread != self.thread


@contextmanager
def quiet_fake_tensor_log() -> Iterator[None]:
    """Drop this thread's records of the fake-tensor logger for the block.

    FakeTensorMode logs a traceback when an op's fake kernel fails; flopscope reports
    that itself. Only this thread's records are dropped, by a filter of its own, so
    concurrent profiles cannot leave the logger changed.
    """
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    quiet = _ThisThreadOnly()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)
