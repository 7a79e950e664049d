"""Kernels launched outside the dispatcher, counted at their ``autograd.Function`` (``flopscope.capture.catalog``): one
record per call with its formula, nothing inside it counted twice, on fake tensors and meta without running it, the
Function as it was afterwards. The function here is a real ``autograd.Function`` whose products NumPy computes (as a
Triton kernel's, they never reach the dispatcher); fla's own kernels are profiled in ``tests/test_fla_kernels.py``,
which the matrix's ``kernels`` cell runs with flash-linear-attention installed."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import flopscope
from flopscope.capture import catalog
from flopscope.capture.undispatched import OUTSIDE
from flopscope.formulas import OpFamily

B, K, N = 3, 4, 5


class NumpyProduct(torch.autograd.Function):
    """``x @ w`` by NumPy into ``torch.empty`` (a kernel outside the dispatcher), its backward too."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        out = torch.empty(x.shape[0], w.shape[1])
        np.matmul(x.detach().numpy(), w.detach().numpy(), out=out.numpy())
        ctx.save_for_backward(x, w)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, w = ctx.saved_tensors
        return (torch.from_numpy(grad.numpy() @ w.detach().numpy().T),
                torch.from_numpy(x.detach().numpy().T @ grad.numpy()))


KERNEL = catalog.Kernel(
    "test.numpy_product", f"{NumpyProduct.__module__}.{NumpyProduct.__qualname__}", ("x", "w"),
    formula=lambda x, w, **_: x[0] * x[1] * w[1],
    outputs=lambda named: named["x"].new_empty((named["x"].shape[0], named["w"].shape[1])),
    backward=lambda x, w, **_: 2 * x[0] * x[1] * w[1], family=OpFamily.MATMUL, operands=(0, 1))


class Ext(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(K, N))
        self.head = nn.Linear(N, 2, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(NumpyProduct.apply(x, self.w))


@pytest.fixture
def registered():
    catalog.register(KERNEL)
    try:
        yield
    finally:
        catalog.CATALOG.remove(KERNEL)


def profile(model: nn.Module, *args: Any, **kwargs: Any) -> flopscope.Profile:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return flopscope.profile(model, *args, **kwargs)


@pytest.mark.parametrize("mode", ["real", "fake"])
def test_a_catalog_kernel_is_one_record_with_its_formula(registered, mode):
    """B·K·N for the kernel, B·N·2 for the head; nothing flagged (its buffer is the record's output); on fake
    tensors the NumPy kernel is not run at all (it could not)."""
    forward, backward = vars(NumpyProduct)["forward"], vars(NumpyProduct)["backward"]
    with torch.no_grad():
        prof = profile(Ext(), torch.randn(B, K), mode=mode)
    assert prof.total() == B * K * N + B * N * 2
    assert prof.unsupported() == {}
    kernels = [op for op in prof._ops if op.op_name == "test.numpy_product"]
    assert [op.macs for op in kernels] == [B * K * N]
    assert vars(NumpyProduct)["forward"] is forward and vars(NumpyProduct)["backward"] is backward


def test_without_its_entry_the_kernel_is_flagged_not_counted():
    """The control: the same model without the catalog entry counts the head only, and says why."""
    with torch.no_grad():
        prof = profile(Ext(), torch.randn(B, K), mode="real")
    assert prof.total() == B * N * 2
    assert prof.unsupported() == {OUTSIDE + "": 1}


def test_on_meta_the_kernel_counts_without_running(registered):
    with torch.device("meta"):
        model = Ext()
    with torch.no_grad():
        prof = profile(model, torch.randn(B, K, device="meta"))
    assert prof.total() == B * K * N + B * N * 2


@pytest.mark.parametrize("mode", ["real", "fake"])
def test_its_backward_is_its_own_record_attributed_to_the_forward(registered, mode):
    """A training step: the forward's B·K·N + B·N·2, the backward's 2·B·K·N (the catalog's backward formula) and the
    head's two gradients 2·B·N·2; the backward record belongs to the forward's module and phase "backward"."""
    prof = profile(Ext(), torch.randn(B, K, requires_grad=True), mode=mode, backward=True)
    assert prof.total() == B * K * N + B * N * 2 + 2 * B * K * N + 2 * B * N * 2
    assert prof.total(phase="backward") == 2 * B * K * N + 2 * B * N * 2
    kernels = [op for op in prof._ops if op.op_name == "test.numpy_product"]
    assert [(op.phase, op.macs) for op in kernels] == [("forward", B * K * N), ("backward", 2 * B * K * N)]
    assert kernels[1].forward is kernels[0]
