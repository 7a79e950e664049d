"""An error of the model's run, rebuilt as a :class:`~flopscope.errors.RunError`.

:func:`explain` names where the run failed (the module, the op and its shapes) and what
to do. On fake tensors the failure may be theirs, and it says so, so that
``mode="auto"`` runs the model for real instead.
"""

from __future__ import annotations

from typing import cast

from torch import nn

from ..errors import FakeTensorError, ForwardError, cause_of_kind
from . import undispatched
from .fake import needs_real_data
from .model_caches import fake_tensors_held
from .module_tracker import ModuleTracker
from .recorder import FakeTensorInRealRun, OpFailure, Recorder, RefusedInput
from .records import op_name


def explain(model: nn.Module, error: Exception, recorder: Recorder, tracker: ModuleTracker,
            fake: bool, *, backward: bool = False) -> Exception:
    """The error to raise for a forward (or, ``backward``, its backward) that failed.

    It says where it happened, and what to do. On fake tensors the error may be theirs,
    and ``mode="auto"`` then runs the model for real: a fake kernel's backward can fail
    where the real one runs (a fake cuDNN RNN has no flat weight buffer). Not when a
    real kernel would refuse the same input.
    """
    failure: OpFailure | None = recorder.failure
    frames = tracker.failed_in(error)
    module = frames[-1].path if frames else (failure.module if failure else "")
    name = type(model).__name__
    what = f"the backward pass of {name}" if backward else f"{name}.forward"
    where = failure.describe() if failure is not None else f"module '{module}'" if frames or not backward else what
    at = f" at {where}" if where != what else ""
    met = cast(FakeTensorInRealRun | None, cause_of_kind(error, FakeTensorInRealRun))
    if met is not None:
        return ForwardError(f"{what} cannot be counted for real: {met.where.describe()} got a fake "
                            f"tensor, which a real run cannot execute; {_origin(model, met)}")
    limitation = needs_real_data(error) if fake else None
    if limitation is not None:
        func = getattr(limitation, "func", None)
        if func is not None and (failure is None or failure.op != op_name(func)):
            where = f"op {op_name(func)} in module '{module}'"
        return FakeTensorError(f"{name} cannot be counted on fake tensors: {where} needs real "
                               "data; use mode='real'",
                               on_fake_tensors=True, where=where,
                               reason=f"it needs real data: {type(limitation).__name__}",
                               largest_tensor_bytes=recorder.largest_out)
    refused = cause_of_kind(error, RefusedInput)
    # what the real kernel would refuse: the same error in every mode, no fall-back
    if refused is not None:
        return ForwardError(f"{what} cannot run{at}: {refused}")
    if fake and undispatched.converts_to_numpy(error):
        reason = "it converts a tensor to NumPy (.numpy()), work outside the ATen dispatcher a fake tensor cannot do"
        return FakeTensorError(f"{name} cannot be counted on fake tensors{at}: {reason}; count it "
                               "with mode='real', which lists that work in prof.unsupported() (its "
                               "multiplies are not counted)",
                               on_fake_tensors=True, where=where, reason=reason,
                               largest_tensor_bytes=recorder.largest_out)
    message = f"{what} raised {type(error).__name__}{at}: {error}"
    if not fake:
        return ForwardError(message)
    return ForwardError(message + " (on fake tensors: if the model runs with mode='real', fake "
                                  "tensors are the "
                        "cause)", on_fake_tensors=True, where=where,
                        reason=f"{type(error).__name__}: {_first_line(str(error))}",
                        largest_tensor_bytes=recorder.largest_out)


def _origin(model: nn.Module, met: FakeTensorInRealRun) -> str:
    """Where the fake tensor a real run met came from, and what to do about it."""
    if met.ours:
        held = fake_tensors_held(model, possible=True)
        return ("it was made by an earlier fake run of flopscope and kept by the model's code"
                + (f", probably in {'; '.join(held)}" if held else " where flopscope cannot see it")
                + "; empty that cache (cache_clear()) and count again")
    return ("it was made under a FakeTensorMode of the caller's (a tensor the model's code keeps, "
            "or one reached from outside its state and inputs); count the model with mode='fake'")


def _first_line(text: str, limit: int = 120) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."
