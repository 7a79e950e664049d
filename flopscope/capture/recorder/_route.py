"""Routing: which dispatches reach the recorder's records, and which a tensor subclass
takes.

A DTensor or a jagged nested tensor runs its ops on its local or packed tensors: the
recorder hands the op back (``NotImplemented``) and records what they run. DTensor works
out output shapes by running the op once more on fake tensors: that is not the rank's
work. On a torch whose higher-order ops know no ``supports_higher_order_operators``
(2.6), :func:`route_higher_order_ops` routes them to the recorder by its class.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode

from ...formulas import registry as formulas
from ..fake import loaded_dtensor


def subclass_kind(types: Sequence[type]) -> str:
    """How the recorder treats a dispatch whose tensors have these types: ``"dtensor"``
    and ``"jagged"`` run their ops on their local / packed tensors (those are recorded),
    ``"fake"`` fake tensors, ``""`` plain tensors."""
    dtensor = loaded_dtensor()
    if dtensor is not None and any(issubclass(t, dtensor) for t in types):
        return "dtensor"
    if any(issubclass(t, formulas.JaggedTensor) for t in types):
        return "jagged"
    return "fake" if any(issubclass(t, FakeTensor) for t in types) else ""


@functools.cache
def _shape_propagation_code() -> Any:
    """The code of DTensor's output-shape propagation, which runs the op once more on
    fake tensors of the global shapes (on flopscope's own fake mode in a fake run, where
    no other sign tells those ops apart). Asked only once a DTensor op was seen, so
    torch.distributed.tensor is imported already."""
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    return getattr(getattr(ShardingPropagator, "_propagate_tensor_meta_non_cached", None),
                   "__code__", None)


def in_shape_propagation() -> bool:
    """Whether DTensor's output-shape propagation called the dispatch running now."""
    code = _shape_propagation_code()
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


_HOPS_LOCK = threading.Lock()


def route_higher_order_ops(mode: type[TorchDispatchMode]) -> None:
    """On a torch whose higher-order ops know no ``supports_higher_order_operators``
    (2.6), an op finds a mode's rule by the mode's exact class: give ``mode`` one for
    each, passing the op to its dispatch as later torch does. Run at each new recorder
    (higher-order ops are made as their modules are imported), under a lock."""
    with _HOPS_LOCK:
        for op in list(torch._ops._higher_order_ops.values()):
            if mode not in op.python_key_table:
                op.py_impl(mode)(functools.partial(_dispatch_higher_order_op, op))


def _dispatch_higher_order_op(op: Any, mode: TorchDispatchMode, *args: Any, **kwargs: Any) -> Any:
    return mode.__torch_dispatch__(op, [], args, kwargs)
