"""Triton kernels launched from a plain Python function (no ``autograd.Function`` around them: mamba-ssm's
``selective_state_update``, fla's ``fused_recurrent_kda``), counted at the launch (``flopscope.capture.launches``):
priced by a catalog entry for the kernel's name, else listed by name in ``unsupported()``; on fake tensors and meta
not launched. A kernel of the test's own, launched as those libraries launch theirs (a buffer from ``empty_like``,
then ``kernel[grid](...)``), its output read by a projection inside the same module.

Runs where Triton imports: the matrix's ``kernels`` cell (a CPU build: Triton compiles nothing here, and cannot launch
on a CPU, so real mode is a GPU's: ``tests/test_cuda.py``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import flopscope
from flopscope.capture import catalog
from flopscope.capture.records import after_write

triton = pytest.importorskip("triton", reason="Triton is installed in the matrix's kernels cell")
tl = pytest.importorskip("triton.language")

B, D = 4, 32


@triton.jit
def _twice_kernel(x_ptr, out_ptr, n, block: tl.constexpr):
    i = tl.program_id(0) * block + tl.arange(0, block)
    tl.store(out_ptr + i, tl.load(x_ptr + i, mask=i < n) * 2, mask=i < n)


def twice(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    _twice_kernel[(triton.cdiv(x.numel(), 128),)](x, out, x.numel(), block=128)
    return out


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(D, D, bias=False)

    def forward(self, x):
        return self.proj(twice(x)) + x  # (x read again after the launch)


@pytest.fixture
def priced():
    """A catalog entry for the kernel (pretending it multiplies: B·D MACs, one per element), removed afterwards."""
    entry = catalog.Kernel("test.twice", "triton:_twice_kernel", ("x_ptr", "n"), lambda x_ptr, n, **_: n,
                           lambda named: None, writes=("out_ptr",))
    catalog.register(entry)
    try:
        yield entry
    finally:
        catalog.CATALOG.remove(entry)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_an_unknown_launch_is_listed_by_its_kernels_name(device):
    with torch.no_grad():
        prof = flopscope.profile(Block().to(device), torch.randn(B, D, device=device), mode="fake")
    assert prof.unsupported() == {"triton kernel _twice_kernel": 1}
    assert prof.total() == B * D * D  # (the projection)
    assert "empty_like_after_triton_kernel__twice_kernel" in str(prof.graph)  # (what the projection reads)
    # its input is read, not written: only the buffer an `empty` made is a version after the launch
    assert sum(op.target is after_write for op in prof._ops) == 1


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_a_launch_with_an_entry_is_priced_and_its_output_is_its_work(priced, device):
    with torch.no_grad():
        prof = flopscope.profile(Block().to(device), torch.randn(B, D, device=device), mode="fake")
    assert prof.unsupported() == {}
    assert prof.total() == B * D + B * D * D
    launch = next(op for op in prof._ops if op.op_name == "test.twice")
    assert launch.module == ""
    # the projection reads the buffer the kernel wrote: a version of the empty buffer, written by the launch
    assert any(op.target is after_write and op.args[1] is launch for op in prof._ops)
    assert "empty_like_after_twice" in str(prof.graph)


def test_the_launch_is_unwrapped_after_the_profile():
    jit = triton.runtime.jit.KernelInterface
    before = jit.__getitem__
    with torch.no_grad():
        flopscope.profile(Block(), torch.randn(B, D), mode="fake")
    assert jit.__getitem__ is before


class Doubled(torch.autograd.Function):
    """Twice its input; its backward launches the Triton kernel (a Function the catalog does not know)."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return twice(grad)


class BackwardBlock(Block):
    def forward(self, x):
        return self.proj(Doubled.apply(x))


def test_a_launch_in_the_backward_pass_is_listed_too():
    prof = flopscope.profile(BackwardBlock(), torch.randn(B, D, requires_grad=True), mode="fake", backward=True)
    assert prof.unsupported() == {"triton kernel _twice_kernel": 1}
    assert prof.total(phase="backward") == 2 * B * D * D  # (the projection's two gradients)
