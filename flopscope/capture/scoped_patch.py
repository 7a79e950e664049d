"""A patch of shared objects (a class's methods) held while any thread needs it, with
each thread's own stack of values: what ``flopscope.capture.replay``
(``Tensor.tolist`` / ``numpy`` counted as value reads) and
``flopscope.capture.catalog`` (kernels' ``autograd.Function`` s counted) wrap while a
run watches."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class ScopedPatch:
    """``apply()`` when the first thread enters :meth:`scope`, ``undo()`` when the last
    leaves; :meth:`values` are this thread's values in scope, innermost last (another
    thread's calls of the patched objects see none)."""

    def __init__(self, apply: Callable[[], None], undo: Callable[[], None]) -> None:
        self._apply, self._undo = apply, undo
        self._lock = threading.Lock()
        self._users = 0
        self._local = threading.local()

    @contextmanager
    def scope(self, value: Any) -> Iterator[None]:
        with self._lock:
            if self._users == 0:
                self._apply()
            self._users += 1
        values = self.values()
        values.append(value)
        try:
            yield
        finally:
            values.pop()
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    self._undo()

    def values(self) -> list[Any]:
        found = getattr(self._local, "values", None)
        if found is None:
            found = self._local.values = []
        return found
