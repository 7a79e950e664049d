"""Never a silent zero, also outside the dispatcher (issue 23, item 7): work that never reaches the ATen dispatcher
(NumPy on ``.numpy()`` views, ``torch.from_numpy`` of a NumPy result, a C++ extension filling ``torch::empty``) is
listed by module path in ``prof.unsupported()`` and said in the notes and one warning, in real mode; fake mode
refuses it naming the module. What does reach the dispatcher (views of inputs, parameters returned as they are,
constructors, ops inside an ``autograd.Function``) is never flagged. Expected MACs are closed forms: the work the
dispatcher saw, nothing of what it did not."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import flopscope
from flopscope.capture.undispatched import OUTSIDE

B, K, N, D = 3, 4, 5, 2
PHRASE = "computed outside the ATen dispatcher: its multiplies are not counted"


class NumpyMatmul(torch.autograd.Function):
    """``x @ w`` in NumPy (an extension-like kernel the dispatcher never sees), with a torch backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return torch.from_numpy(x.detach().numpy() @ w.detach().numpy())

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, w = ctx.saved_tensors
        return grad @ w.T, x.T @ grad


class NumpyIntoEmpty(torch.autograd.Function):
    """NumPy writing into a torch tensor's memory through its ``.numpy()`` view (as an extension writes into
    ``torch::empty``): the dispatcher sees only the allocation."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        out = torch.empty(x.shape[0], w.shape[1])
        np.matmul(x.detach().numpy(), w.detach().numpy(), out=out.numpy())
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None]:
        return None, None


class NumpyThroughBytes(torch.autograd.Function):
    """A result that no op makes at all: NumPy's bytes wrapped by ``torch.frombuffer`` (not dispatched)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        result = x.detach().numpy() @ w.detach().numpy()
        return torch.frombuffer(bytearray(result.tobytes()), dtype=torch.float32).view(result.shape)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None]:
        return None, None


class TorchMatmul(torch.autograd.Function):
    """The same product with a torch op inside: dispatched, counted, not flagged."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x @ w

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None]:
        return None, None


class Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


class Ext(nn.Module):
    """``function.apply(x, self.w)``: an extension module of shape [B, K] -> [B, N]."""

    def __init__(self, function: type[torch.autograd.Function] = NumpyMatmul) -> None:
        super().__init__()
        self.function = function
        self.w = nn.Parameter(torch.randn(K, N))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.function.apply(x, self.w)


class FromNumpy(nn.Module):
    """``torch.from_numpy(x.numpy() @ w)`` with ``w`` a NumPy array: no autograd.Function at all."""

    def __init__(self) -> None:
        super().__init__()
        self.w = np.random.default_rng(0).standard_normal((N, N)).astype(np.float32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(x.detach().numpy() @ self.w)


class Model(nn.Module):
    """ext ([B, K] -> [B, N], outside the dispatcher) -> np ([B, N] -> [B, N], outside) -> head (Linear(N, D))."""

    def __init__(self, function: type[torch.autograd.Function] = NumpyMatmul) -> None:
        super().__init__()
        self.ext, self.np, self.head = Ext(function), FromNumpy(), nn.Linear(N, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.np(self.ext(x)))


def _profile(model: nn.Module, *args: Any, **kwargs: Any) -> tuple[flopscope.Profile, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prof = flopscope.profile(model, *args, **kwargs)
    return prof, [str(w.message) for w in caught if issubclass(w.category, flopscope.FlopscopeWarning)]


def test_numpy_inside_an_autograd_function_and_from_numpy_are_listed_by_module_path() -> None:
    prof, warned = _profile(Model(), torch.randn(B, K), mode="real")
    assert prof.total() == B * N * D  # the head; the two NumPy products (B*K*N, B*N*N MACs) are not seen
    assert prof.unsupported() == {OUTSIDE + "ext": 1, OUTSIDE + "np": 1}
    ext = next(note for note in prof.notes if "module 'ext'" in note)
    assert f"[{B}, {N}]" in ext and "NumpyMatmul.forward" in ext and PHRASE in ext and "NumPy" in ext
    from_numpy = next(note for note in prof.notes if "module 'np'" in note)
    assert f"[{B}, {N}]" in from_numpy and PHRASE in from_numpy and ".forward" not in from_numpy
    assert sum(PHRASE in message for message in warned) == 2
    assert not any("no formula for" in message for message in warned)  # said once, as what it is


def test_a_numpy_function_used_inside_a_module_is_found_where_it_runs() -> None:
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(K, N))
            self.proj = nn.Linear(N, D)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(NumpyMatmul.apply(x, self.w))

    model = nn.Sequential(Block(), Block())
    model[1].proj = nn.Linear(N, D)
    model[1].w = nn.Parameter(torch.randn(D, N))
    prof, _ = _profile(model, torch.randn(B, K), mode="real")
    assert prof.total() == 2 * B * N * D
    assert prof.unsupported() == {OUTSIDE + "0": 1, OUTSIDE + "1": 1}


def test_it_is_found_with_grad_mode_off_too() -> None:
    with torch.no_grad():
        prof, _ = _profile(Model(), torch.randn(B, K), mode="real")
    assert prof.unsupported() == {OUTSIDE + "ext": 1, OUTSIDE + "np": 1}
    assert any("NumpyMatmul.forward" in note for note in prof.notes)  # no autograd node: found by its apply


@pytest.mark.parametrize(("function", "shape", "source"), [
    (NumpyIntoEmpty, [B, N], "empty / empty_like that no ATen op wrote"),  # the module's output
    (NumpyThroughBytes, [B * N], "NumPy"),  # the bytes, where the view of them first reads them
])
def test_numpy_writing_into_torch_memory_or_bytes_no_op_made_is_found(function: type, shape: list[int],
                                                                      source: str) -> None:
    prof, _ = _profile(Ext(function), torch.randn(B, K), mode="real")
    assert prof.total() == 0
    assert prof.unsupported() == {OUTSIDE: 1}  # the root module
    (note,) = prof.notes
    assert f"module '': a tensor of shape {shape} made in {function.__qualname__}.forward" in note
    assert PHRASE in note and source in note


def test_every_call_is_counted_and_its_notes_fold_by_module() -> None:
    model = Ext()

    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ext = model

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.ext(x) + self.ext(x)

    prof, _ = _profile(Twice(), torch.randn(B, K), mode="real")
    assert prof.unsupported() == {OUTSIDE + "ext": 2}
    (note,) = prof.notes
    assert "module 'ext', 2 calls" in note


def test_the_backward_of_a_numpy_function_counts_its_torch_products() -> None:
    prof, _ = _profile(Ext(), torch.randn(B, K), mode="real", backward=True)
    # forward: outside the dispatcher; backward: grad @ w.T ([B, N] x [N, K]) and x.T @ grad ([K, B] x [B, N])
    assert prof.by_phase() == {"backward": B * N * K + K * B * N}
    assert prof.unsupported() == {OUTSIDE + "": 1}


@pytest.mark.parametrize("reentrant", [True, False])
def test_a_forward_that_checkpointing_runs_again_is_listed_once(reentrant: bool) -> None:
    from torch.utils.checkpoint import checkpoint

    class Checkpointed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ext, self.head = Ext(), nn.Linear(N, D)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(checkpoint(self.ext, x, use_reentrant=reentrant))

    x = torch.randn(B, K, requires_grad=True)
    prof, _ = _profile(Checkpointed(), x, mode="real", backward=True)
    assert prof.unsupported() == {OUTSIDE + "ext": 1}
    assert prof.by_phase()["forward"] == B * N * D


def test_fake_mode_refuses_numpy_naming_the_module_and_auto_counts_it_for_real() -> None:
    with pytest.raises(flopscope.FakeTensorError, match=r"module 'ext'.*\.numpy\(\).*mode='real'"):
        flopscope.profile(Model(), torch.randn(B, K), mode="fake")
    prof, warned = _profile(Model(), torch.randn(B, K))  # auto: falls back to a real run, which finds both
    assert prof.mode == "real"
    assert prof.unsupported() == {OUTSIDE + "ext": 1, OUTSIDE + "np": 1}
    assert any("module 'ext' could not run on fake tensors" in message for message in warned)


# -------------------------------------------------------------------------------------------------
# no false positives: what reaches the dispatcher, or existed before the run


class Returns(nn.Module):
    """A module that returns, by ``kind``, something that is not work outside the dispatcher."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.weight = nn.Parameter(torch.randn(B, K))
        self.table = torch.from_numpy(np.arange(B * K, dtype=np.float32).reshape(B, K))  # NumPy memory, made before
        self.lin = nn.Linear(K, K)

    def forward(self, x: torch.Tensor) -> Any:
        kind = self.kind
        if kind == "input":
            return x
        if kind == "view":
            return x.view(-1)[: B * K].view(B, K), x.t()
        if kind == "data":
            return x.data
        if kind == "parameter":
            return self.weight
        if kind == "attribute":
            return self.table.to(torch.float32)  # the same tensor: no op runs
        if kind == "attribute_read":
            return self.lin(x + self.table)
        if kind == "constructors":
            return (torch.tensor([1.0, 2.0]), torch.tensor(3), torch.zeros(B, K),
                    torch.empty(B, K).fill_(1.0), torch.arange(K), self.lin(x))
        if kind == "function":
            return TorchMatmul.apply(x, self.weight.T), Identity.apply(x)
        if kind == "dict":
            return {"out": self.lin(x), "same": x, "none": None}
        raise AssertionError(kind)


KINDS = ["input", "view", "data", "parameter", "attribute", "attribute_read", "constructors", "function", "dict"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("grad", [True, False])
def test_what_reaches_the_dispatcher_or_existed_before_is_not_flagged(kind: str, grad: bool) -> None:
    x = torch.randn(B, K, requires_grad=grad)
    prof, warned = _profile(Returns(kind), x, mode="real")
    assert prof.unsupported() == {}
    assert not any("outside the ATen dispatcher" in message for message in warned + prof.notes)
    linear = B * K * K
    expected = {"attribute_read": linear, "constructors": linear, "function": B * K * B, "dict": linear}
    assert prof.total() == expected.get(kind, 0)


def test_numpy_outside_the_models_modules_is_not_its_work() -> None:
    model = nn.Linear(K, N)
    array = np.ones((B, K), np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with flopscope.profiler(model, mode="real") as prof:
            model(torch.from_numpy(array @ np.eye(K, dtype=np.float32)))  # the caller's NumPy, before the forward
    assert prof.result.unsupported() == {}
    assert prof.result.total() == B * K * N


# -------------------------------------------------------------------------------------------------
# a real C++ extension (torch.utils.cpp_extension.load_inline), where a compiler builds it in under 60 s

_RAW_MM = textwrap.dedent(r"""
    #include <torch/extension.h>
    // out = a @ b by a loop over data pointers: no ATen op but the allocation (torch::empty)
    torch::Tensor raw_mm(torch::Tensor a, torch::Tensor b) {
      auto a_ = a.contiguous(); auto b_ = b.contiguous();
      int64_t m = a_.size(0), k = a_.size(1), n = b_.size(1);
      auto out = torch::empty({m, n}, a_.options());
      const float* pa = a_.data_ptr<float>(); const float* pb = b_.data_ptr<float>(); float* po = out.data_ptr<float>();
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          float s = 0;
          for (int64_t p = 0; p < k; ++p) s += pa[i * k + p] * pb[p * n + j];
          po[i * n + j] = s;
        }
      return out;
    }
""")
_BUILD = textwrap.dedent("""
    import sys
    from torch.utils.cpp_extension import load_inline
    load_inline("flopscope_raw_mm", cpp_sources=sys.argv[2], functions=["raw_mm"], build_directory=sys.argv[1],
                extra_cflags=["-O1"])
""")


@pytest.fixture(scope="module")
def raw_mm() -> Any:
    import importlib.util
    import shutil

    from torch.utils import cpp_extension

    if shutil.which(os.environ.get("CXX", "c++")) is None:
        pytest.skip("no C++ compiler")
    try:
        cpp_extension.verify_ninja_availability()
    except RuntimeError:
        pytest.skip("no ninja: torch.utils.cpp_extension cannot build")
    digest = hashlib.sha1((_RAW_MM + torch.__version__ + sys.version).encode()).hexdigest()[:12]
    built = Path(tempfile.gettempdir()) / f"flopscope-raw-mm-{digest}"
    if not (built / "flopscope_raw_mm.so").exists():  # built once per machine, source and torch; in 60 s or skipped
        fresh = Path(tempfile.mkdtemp(prefix="flopscope-raw-mm-"))
        start = time.perf_counter()
        build = subprocess.Popen([sys.executable, "-c", _BUILD, str(fresh), _RAW_MM], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, env={**os.environ, "MAX_JOBS": "2"}, start_new_session=True)
        try:
            _, stderr = build.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(build.pid, signal.SIGKILL)  # the compiler too
            build.wait()
            pytest.skip("building a C++ extension took more than 60 s here (optional test)")
        if build.returncode != 0:
            pytest.skip(f"the C++ extension did not build: {stderr.decode()[-300:]}")
        if not built.exists():
            fresh.rename(built)
        print(f"built in {time.perf_counter() - start:.1f} s")
    # the built module itself (load_inline would check, and may redo, the build)
    spec = importlib.util.spec_from_file_location("flopscope_raw_mm", built / "flopscope_raw_mm.so")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_cpp_extension_filling_torch_empty_is_found(raw_mm: Any) -> None:
    class RawMatmul(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return raw_mm.raw_mm(x, w)

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None]:
            return None, None

    x = torch.randn(B, K)
    model = Model(RawMatmul)
    assert torch.allclose(RawMatmul.apply(x, model.ext.w), x @ model.ext.w, atol=1e-5)  # it does compute
    prof, _ = _profile(model, x, mode="real")
    assert prof.total() == B * N * D
    assert prof.unsupported() == {OUTSIDE + "ext": 1, OUTSIDE + "np": 1}
    ext = next(note for note in prof.notes if "module 'ext'" in note)
    assert "RawMatmul.forward" in ext and "empty" in ext and PHRASE in ext


class MixerThroughNorm(nn.Module):
    """A linear-attention mixer as Qwen3-Next's ``GatedDeltaNet`` runs with fla installed: a kernel outside the
    dispatcher (here NumPy; there a Triton kernel) fills a buffer from ``torch.empty``, and the module goes on with
    it, a norm and an output projection, before it returns: the buffer is never a module's output."""

    def __init__(self, filled: bool = False) -> None:
        super().__init__()
        self.filled = filled  # the control: the buffer written by an ATen op (copy_), nothing outside
        self.w = nn.Parameter(torch.randn(K, N))
        self.norm, self.out_proj = nn.LayerNorm(N), nn.Linear(N, D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        core = torch.empty(x.shape[0], N)
        if self.filled:
            core.copy_(x @ self.w)
        else:
            np.matmul(x.detach().numpy(), self.w.detach().numpy(), out=core.numpy())
        return self.out_proj(self.norm(core))


class Mixers(nn.Module):
    def __init__(self, filled: bool = False) -> None:
        super().__init__()
        self.mixer = MixerThroughNorm(filled)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mixer(x)


def test_a_buffer_filled_outside_the_dispatcher_and_read_inside_the_module_is_found() -> None:
    """The kernel's product (B·K·N MACs) is not seen; the projection's (B·N·D) is; the buffer is listed at the module
    call that allocated it, naming the op that read it first (the norm's) and where. Its control, the same buffer
    filled by an ATen op, counts B·K·N + B·N·D and flags nothing."""
    with torch.no_grad():
        prof, warned = _profile(Mixers(), torch.randn(B, K), mode="real")
        control, quiet = _profile(Mixers(filled=True), torch.randn(B, K), mode="real")
    assert prof.total() == B * N * D
    assert prof.unsupported() == {OUTSIDE + "mixer": 1}
    note = next(note for note in prof.notes if "module 'mixer'" in note)
    assert f"[{B}, {N}]" in note and PHRASE in note and "read by native_layer_norm in module 'mixer.norm'" in note
    assert sum(PHRASE in message for message in warned) == 1
    assert control.total() == B * K * N + B * N * D
    assert control.unsupported() == {} and not any(PHRASE in message for message in quiet)


class NotRead(nn.Module):
    """Ops that take an ``empty`` but do not read its values: the ``add*`` products with ``beta=0`` (PyTorch: "if beta
    is 0, then input will be ignored") and the ``*_like`` / ``new_*`` factories (its shape only). With ``beta=1`` the
    product reads it (``read``): that one is flagged."""

    def __init__(self, read: bool = False) -> None:
        super().__init__()
        self.beta = 1 if read else 0

    def forward(self, a: torch.Tensor, b: torch.Tensor, v: torch.Tensor) -> list[torch.Tensor]:
        beta = self.beta
        bmm = torch.baddbmm(torch.empty(2, B, N), a.expand(2, B, K), b.expand(2, K, N), beta=beta, alpha=0.5)
        return [bmm, torch.addmm(torch.empty(B, N), a, b, beta=beta),
                torch.addbmm(torch.empty(B, N), a.expand(2, B, K), b.expand(2, K, N), beta=beta),
                torch.addmv(torch.empty(B), a, v, beta=beta),
                torch.zeros_like(torch.empty(B, K)) + torch.full_like(torch.empty(B, K), 2.0),
                torch.empty(B).new_zeros(B, K) + torch.empty(B).new_full((B, K), 1.0)]


def test_an_empty_that_an_op_does_not_read_is_not_flagged() -> None:
    a, b, v = torch.randn(B, K), torch.randn(K, N), torch.randn(K)
    prof, warned = _profile(NotRead(), a, b, v, mode="real")
    assert prof.unsupported() == {} and not any(PHRASE in message for message in warned)
    products = 2 * B * K * N + B * K * N + 2 * B * K * N + B * K
    assert prof.total() == products
    read, _ = _profile(NotRead(read=True), a, b, v, mode="real")  # beta=1: each of the four products reads its empty
    assert read.unsupported() == {OUTSIDE: 4}
    assert read.total() == products
