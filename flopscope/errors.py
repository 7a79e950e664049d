"""The one family of errors flopscope raises, and its warning category.

Every error names what the user needs to act: the module path, the ATen op and the shapes involved.
Each error also subclasses the built-in exception that fits it, so ``except TypeError`` keeps working.
"""

from __future__ import annotations


class FlopscopeError(Exception):
    """Base class of every error raised by flopscope."""


class NotAModuleError(FlopscopeError, TypeError):
    """The object given to :func:`flopscope.profile` is not a ``torch.nn.Module``."""


class InputError(FlopscopeError, TypeError):
    """The inputs do not fit the model's ``forward`` signature."""


class ForwardError(FlopscopeError, RuntimeError):
    """The model's forward raised; the original exception is ``__cause__``."""


class FakeTensorError(FlopscopeError, RuntimeError):
    """The model cannot be counted on fake tensors (and, for a meta model, cannot run for real)."""


class RegistryError(FlopscopeError, ValueError):
    """A formula registry was used wrongly (for instance, registering an op twice)."""


class FlopscopeWarning(UserWarning):
    """Warnings about counting: unsupported ops, a fall-back from fake to real execution."""
