"""The one family of errors flopscope raises, and its warning category.

Every error names what the user needs to act: the module path, the ATen op and the
shapes involved. Each error also subclasses the built-in exception that fits it, so
``except TypeError`` keeps working.
"""

from __future__ import annotations


class FlopscopeError(Exception):
    """Base class of every error raised by flopscope."""


class NotAModuleError(FlopscopeError, TypeError):
    """The object given to :func:`flopscope.profile` is not a ``torch.nn.Module``."""


class InputError(FlopscopeError, TypeError):
    """The inputs do not fit the model's ``forward`` signature."""


class RunError(FlopscopeError, RuntimeError):
    """A counted run failed. ``on_fake_tensors``: it failed while running on fake
    tensors (``mode="auto"`` then runs the model for real); ``where`` names the op,
    module and shapes, ``reason`` the cause in one line (both for the fall-back
    note)."""

    def __init__(self, message: str, *, on_fake_tensors: bool = False, where: str = "",
                 reason: str = "",
                 largest_tensor_bytes: int = 0) -> None:
        super().__init__(message)
        self.on_fake_tensors = on_fake_tensors
        self.where = where
        self.reason = reason
        # the largest tensor the failed run made (bytes)
        self.largest_tensor_bytes = largest_tensor_bytes


class ForwardError(RunError):
    """The model's forward (or backward) raised; the original exception is
    ``__cause__``."""


class FakeTensorError(RunError):
    """The model cannot be counted on fake tensors (and, for a meta model, cannot run
    for real)."""


class DoesNotFitError(RunError, MemoryError):
    """A real run refused before anything is allocated: the model's parameters and
    buffers plus the largest activation of its fake run (``needed_bytes``) exceed the
    memory available where it would run (``available_bytes``); see
    :mod:`flopscope.memory`. The message names both sizes and what to do instead."""

    def __init__(self, message: str, *, needed_bytes: int, available_bytes: int) -> None:
        super().__init__(message)
        self.needed_bytes = needed_bytes  # bytes
        self.available_bytes = available_bytes  # bytes


class RegistryError(FlopscopeError, ValueError):
    """A formula registry was used wrongly (for instance, registering an op twice)."""


class FormulaError(FlopscopeError, ValueError):
    """A formula was called with shapes it cannot count (a missing output shape, a wrong
    rank)."""


class ConfigurationError(FlopscopeError, ValueError):
    """An argument of a flopscope function is out of its domain (a head count that does
    not divide the width, an unknown mode or tool, too few sweep lengths)."""


class UsageError(ConfigurationError):
    """An argument a command-line target cannot take (:mod:`flopscope.targets`): a
    setting (``--set KEY=VALUE``) that is not ``KEY=VALUE`` or whose value is of
    another type than its key's, an input shape (``--input``) of another form than
    the model takes. The command line reports it as bad usage (exit 2)."""


class RoleError(FlopscopeError, ValueError):
    """A role name that is not one of :class:`flopscope.Role`."""


class NotFoundError(FlopscopeError, KeyError):
    """A name that is not there: a module path of the profiled model, a graph node, a
    comparison row."""

    def __str__(self) -> str:  # KeyError quotes its message; this one is a sentence
        return str(self.args[0]) if self.args else ""


class BudgetError(FlopscopeError, AssertionError):
    """A count differs from its budget (:mod:`flopscope.testing`): an
    ``AssertionError``, so test runners report a failure, not an error."""


class RecordingError(FlopscopeError, AttributeError):
    """A :class:`flopscope.profiler` was queried inside its ``with`` block. Also an
    ``AttributeError``, so ``hasattr()`` and ``getattr(prof, name, default)`` answer
    as for a missing attribute meanwhile."""


class SymbolicError(FlopscopeError, RuntimeError):
    """A symbolic trace (:mod:`flopscope.symbolic`, ``scaling(method="symbolic")``)
    cannot give the model's polynomials: the model specialises on the variable (the
    message names the guard and where it was added), its inputs do not vary as dims
    equal to it, or the trace disagrees with a profile at a sampled length."""


class FlopscopeWarning(UserWarning):
    """Warnings about counting: unsupported ops, a fall-back from fake to real
    execution."""


def cause_of_kind(error: BaseException, kinds: type[BaseException] | tuple[type[BaseException], ...]
                  ) -> BaseException | None:
    """``error`` itself or the first exception of one of ``kinds`` in its chain of
    causes / contexts."""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        if isinstance(e, kinds):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None
