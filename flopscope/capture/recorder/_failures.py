"""Where an op failed: :class:`OpFailure`, and the errors the recorder raises from
inside an op.

:class:`RefusedInput` is what a real kernel would refuse, found on fake tensors.
:class:`FakeTensorInRealRun` is a real run meeting a fake tensor. Both are raised from
inside the op, as a kernel's error would be; the runner explains them to the user.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..module_tracker import ModuleCall
from ..records import Shape, op_name
from ._tensors import shapes


class RefusedInput(RuntimeError):  # noqa: N818  (a kernel's refusal, raised as the kernel would)
    """What a real kernel would refuse, found on fake tensors (whose kernels check
    shapes only): operands of different dtypes, an index out of its table's range.
    Raised from inside the op, like the real error."""


@dataclass(frozen=True, slots=True)
class OpFailure:
    """Where an op raised: the op, the innermost module path and the shapes of its
    tensor inputs."""

    op: str
    module: str
    input_shapes: tuple[Shape, ...]

    def describe(self) -> str:
        shapes = ", ".join(str(list(s)) for s in self.input_shapes) or "no tensor inputs"
        return f"op {self.op} in module '{self.module}' with input shapes {shapes}"


def failure_at(func: Any, stack: tuple[ModuleCall, ...], args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> OpFailure:
    """The failure of ``func`` called with ``args`` and ``kwargs`` in the module calls
    ``stack``."""
    return OpFailure(op_name(func), stack[-1].path if stack else "", shapes((args, kwargs)))


class FakeTensorInRealRun(RuntimeError):  # noqa: N818  (raised from inside the op, as a kernel's error)
    """A real run met a fake tensor: ``where`` the op, module and shapes; ``ours``: a
    fake tensor made by one of flopscope's fake runs (a cache of the model's code kept
    it), else one the caller made."""

    def __init__(self, where: OpFailure, ours: bool) -> None:
        super().__init__(f"{where.describe()} got a fake tensor in a real run")
        self.where, self.ours = where, ours
