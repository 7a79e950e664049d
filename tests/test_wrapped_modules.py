"""Modules people wrap or build differently (issue 9): quantized models, in-place activations and ``out=``
variants, complex dtypes, ``nn.DataParallel`` and ``record_function`` blocks.

Every expected number is a closed form of the shapes: convolutions ``out.numel() · (C_in/g) · Πk`` (transposed:
``x.numel() · (C_out/g) · Πk``), linear layers rows · in · out, pointwise work 1 per output element.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import torch.ao.nn.intrinsic.quantized as nniq
import torch.ao.nn.intrinsic.quantized.dynamic as nniqd
import torch.ao.nn.quantized as nnq
import torch.ao.nn.quantized.dynamic as nnqd
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import flopscope
from flopscope import formulas
from flopscope.errors import FakeTensorError, FlopscopeWarning
from flopscope.formulas import elementwise

aten = torch.ops.aten
DOCS = Path(__file__).resolve().parent.parent / "docs"

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:torch")  # eager quantization's deprecation notices


def profile_quietly(model: nn.Module, *args: object, **kwargs: object) -> tuple[flopscope.Profile, list[str]]:
    """The profile and the messages of the FlopscopeWarnings it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prof = flopscope.profile(model, *args, **kwargs)
    return prof, [str(w.message) for w in caught if issubclass(w.category, FlopscopeWarning)]


def quantized(*shape: int) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.quantize_per_tensor(torch.randn(*shape), 0.1, 0, torch.quint8)


def conv_macs(out_shape: tuple[int, ...], c_in: int, groups: int, kernel: tuple[int, ...]) -> int:
    return math.prod(out_shape) * (c_in // groups) * math.prod(kernel)


# --------------------------------------------------------------------------------------------------
# 1. quantized models
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("groups", [1, 4])
def test_quantized_conv2d_counts_as_its_float_convolution(groups):
    """nnq.Conv2d(16, 32, 3, padding=1) on a quint8 [1, 16, 8, 8]: 1·32·8·8·(16/g)·9 (294,912; g=4: 73,728)."""
    conv = nnq.Conv2d(16, 32, 3, padding=1, groups=groups)
    prof, warned = profile_quietly(conv, quantized(1, 16, 8, 8), mode="real")
    expected = 1 * 32 * 8 * 8 * (16 // groups) * 9
    assert expected == (294_912 if groups == 1 else 73_728)
    assert prof.total() == expected and prof.by_op() == {"quantized.conv2d": expected}
    assert prof.by_role() == {"conv": expected} and prof.unsupported() == {} and warned == []


@pytest.mark.parametrize(("module", "x_shape", "out_shape", "transposed"), [
    (lambda: nnq.Conv1d(4, 6, 3, stride=2), (2, 4, 11), (2, 6, 5), False),
    (lambda: nnq.Conv3d(4, 8, 3, padding=1, groups=2), (1, 4, 5, 5, 5), (1, 8, 5, 5, 5), False),
    (lambda: nniq.ConvReLU2d(8, 16, 3, stride=2, padding=1), (2, 8, 9, 9), (2, 16, 5, 5),
     False),
    (lambda: nnq.ConvTranspose1d(4, 6, 3, stride=2, groups=2), (2, 4, 7), (2, 6, 15), True),
    (lambda: nnq.ConvTranspose2d(4, 6, 3), (1, 4, 5, 5), (1, 6, 7, 7), True),
    (lambda: nnq.ConvTranspose3d(4, 6, 3), (1, 4, 3, 3, 3), (1, 6, 5, 5, 5), True),
], ids=["conv1d", "conv3d", "conv2d_relu", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"])
def test_every_quantized_convolution_counts_as_its_float_convolution(module, x_shape, out_shape, transposed):
    """Weight shape, groups and direction come from the packed parameters; stride and padding via the output."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        conv = module()
    prof, warned = profile_quietly(conv, quantized(*x_shape), mode="real")
    c_in, groups, kernel = conv.in_channels, conv.groups, tuple(conv.kernel_size)
    expected = (math.prod(x_shape) * (conv.out_channels // groups) * math.prod(kernel) if transposed
                else conv_macs(out_shape, c_in, groups, kernel))
    assert tuple(prof.output.shape) == out_shape
    assert prof.total() == expected and prof.unsupported() == {} and warned == []
    assert prof.by_role() == {"conv": expected}


@pytest.mark.parametrize("mode", ["real", "fake"])
def test_dynamically_quantized_convolutions(mode):
    """Dynamic quantized convolutions take a float input, so they count on fake tensors too."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = nn.Sequential(nnqd.Conv2d(4, 6, 3, padding=1), nnqd.ConvTranspose2d(6, 4, 3))
    prof, warned = profile_quietly(model, torch.randn(1, 4, 5, 5), mode=mode)
    assert prof.by_module()["0"] == conv_macs((1, 6, 5, 5), 4, 1, (3, 3))
    assert prof.by_module()["1"] == 1 * 6 * 5 * 5 * 4 * 9  # transposed: x.numel() · C_out · Πk
    assert prof.unsupported() == {} and warned == []


@contextmanager
def quantized_engine(name: str) -> Iterator[None]:
    previous = torch.backends.quantized.engine
    torch.backends.quantized.engine = name
    try:
        yield
    finally:
        torch.backends.quantized.engine = previous


@pytest.mark.parametrize(("engine", "make", "dynamic"), [
    ("x86", lambda d_in, d_out: nnq.Linear(d_in, d_out), False),
    ("x86", lambda d_in, d_out: nniq.LinearReLU(d_in, d_out), False),
    ("onednn", lambda d_in, d_out: nniq.LinearLeakyReLU(d_in, d_out, 0.1), False),
    ("onednn", lambda d_in, d_out: nniq.LinearTanh(d_in, d_out), False),
    ("x86", lambda d_in, d_out: nnqd.Linear(d_in, d_out), True),
    ("x86", lambda d_in, d_out: nniqd.LinearReLU(d_in, d_out), True),
    ("x86", lambda d_in, d_out: nnqd.Linear(d_in, d_out, dtype=torch.float16), True),
], ids=["linear", "linear_relu", "linear_leaky_relu", "linear_tanh", "linear_dynamic", "linear_relu_dynamic",
        "linear_dynamic_fp16"])
def test_every_quantized_linear_counts_rows_times_in_times_out(engine, make, dynamic):
    """Static, fused (ReLU, LeakyReLU, tanh) and dynamic (int8, fp16) quantized linears: rows·in·out, and their
    registry family says why it is not MATMUL."""
    rows, d_in, d_out = 5, 16, 8
    with quantized_engine(engine), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        layer = make(d_in, d_out)
        prof, warned = profile_quietly(layer, torch.randn(rows, d_in) if dynamic else quantized(rows, d_in),
                                       mode="real")
    assert prof.total() == rows * d_in * d_out
    assert prof.unsupported() == {} and warned == []
    # the packed weight is a script object, not a tensor: no operand a role pass could follow, so OTHER
    op = next(iter(prof.by_op())).replace(".", "::", 1)
    spec = formulas.REGISTRY.spec(op)
    assert spec is not None and spec.family is flopscope.OpFamily.OTHER
    doc = " ".join((spec.formula.__doc__ or "").split())  # (the words, wherever the docstring wraps)
    assert "packed" in doc and "not a tensor" in doc


class SmallCNN(nn.Module):
    """A torchvision-style classifier: stem, strided grouped conv, global pool, linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.quant = torch.ao.quantization.QuantStub()
        self.conv1, self.relu1 = nn.Conv2d(3, 8, 3, padding=1), nn.ReLU()
        self.conv2, self.relu2 = nn.Conv2d(8, 16, 3, stride=2, padding=1, groups=2), nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)
        self.dequant = torch.ao.quantization.DeQuantStub()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu2(self.conv2(self.relu1(self.conv1(self.quant(x)))))
        return self.dequant(self.fc(torch.flatten(self.pool(x), 1)))


def test_statically_quantized_classifier_counts_what_its_float_twin_counts():
    torch.manual_seed(0)
    float_model = SmallCNN().eval()
    model = copy.deepcopy(float_model)
    model.qconfig = torch.ao.quantization.get_default_qconfig("fbgemm")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = torch.ao.quantization.fuse_modules(model, [["conv1", "relu1"], ["conv2", "relu2"]])
        model = torch.ao.quantization.prepare(model)
        model(torch.randn(4, 3, 16, 16))  # calibration
        model = torch.ao.quantization.convert(model)
    x = torch.randn(2, 3, 16, 16)
    expected = {"conv1": 2 * 8 * 16 * 16 * 3 * 9, "conv2": 2 * 16 * 8 * 8 * (8 // 2) * 9, "fc": 2 * 16 * 10}
    float_prof = flopscope.profile(float_model, x, mode="real")
    prof, warned = profile_quietly(model, x, mode="real")
    assert prof.total() == float_prof.total() == sum(expected.values())
    assert {path: prof.by_module()[path] for path in expected} == expected
    assert {path: float_prof.by_module()[path] for path in expected} == expected
    assert set(prof.by_op()) == {"quantized.conv2d_relu", "quantized.linear"}
    # quantize and dequantize are pointwise work (1 per element); the fused ReLUs are inside their kernels
    assert prof.elementwise()["pointwise"] == 2 * 3 * 16 * 16 + 2 * 10
    assert prof.unsupported() == {} and warned == []


def test_quantized_input_in_auto_mode_falls_back_to_real():
    """Needs the conversion fix in flopscope/capture/fake.py (FakeConverter: a tensor fake mode cannot represent is a
    FakeTensorError on fake tensors): the default mode falls back to real with the usual warning."""
    conv = nnq.Conv2d(16, 32, 3, padding=1)
    with pytest.warns(FlopscopeWarning, match="counted in real mode instead"):
        prof = flopscope.profile(conv, quantized(1, 16, 8, 8))
    assert prof.mode == "real" and prof.total() == 1 * 32 * 8 * 8 * 16 * 9


def test_quantized_input_in_fake_mode_is_a_fake_tensor_error():
    """Needs the same conversion fix: not torch's raw UnsupportedFakeTensorException."""
    conv = nnq.Conv2d(16, 32, 3, padding=1)
    with pytest.raises(FakeTensorError, match="mode='real'"):
        flopscope.profile(conv, quantized(1, 16, 8, 8), mode="fake")


class TwiceThroughOneLayer(nn.Module):
    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(self.layer(x))


def test_dynamically_quantized_linear_counts_on_fake_tensors_every_time():
    """Needs the fake-tensor cache fix in flopscope/runner.py / fake.py: FakeTensorMode's (class-wide) dispatch
    cache keys an op on its arguments, a packed-params script object among them, and comparing two such keys
    raises "'__eq__' is not implemented for LinearPackedParamsBase" (the second profile, or a second call)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = torch.ao.quantization.quantize_dynamic(nn.Sequential(nn.Linear(16, 16)), {nn.Linear},
                                                       dtype=torch.qint8)
    for _ in range(3):
        assert flopscope.profile(model, torch.randn(5, 16), mode="fake").total() == 5 * 16 * 16
    twice = TwiceThroughOneLayer(model[0])
    assert flopscope.profile(twice, torch.randn(5, 16), mode="fake").total() == 2 * 5 * 16 * 16


# --------------------------------------------------------------------------------------------------
# 2. in-place activations and out= variants inherit their functional op's class
# --------------------------------------------------------------------------------------------------
class RReLU(nn.Module):
    def __init__(self, inplace: bool) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rrelu(x, training=True, inplace=self.inplace)


@pytest.mark.parametrize("mode", ["real", "fake"])
@pytest.mark.parametrize("make", [
    lambda inplace: nn.Hardswish(inplace=inplace),
    lambda inplace: nn.Mish(inplace=inplace),
    lambda inplace: nn.Threshold(0.1, 20, inplace=inplace),
    RReLU,
], ids=["hardswish", "mish", "threshold", "rrelu"])
def test_inplace_activation_is_pointwise_like_its_functional_op(make, mode):
    x = torch.randn(2, 8)
    counts = {}
    for inplace in (False, True):
        prof, warned = profile_quietly(nn.Sequential(make(inplace)), x.clone(), mode=mode)
        assert prof.unsupported() == {} and warned == [], inplace
        counts[inplace] = prof.elementwise()
    assert counts[True] == counts[False] == {"pointwise": 2 * 8}


class OutVariants(nn.Module):
    """``out=`` overloads (whose ATen tags are often missing) and in-place reductions and GEMMs."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(6, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        torch._C._nn.gelu(x, out=y)  # aten.gelu.out
        z = torch.empty_like(x)
        torch._C._nn.elu(y, out=z)  # aten.elu.out
        z.clone().cumsum_(0)  # aten.cumsum_
        out = torch.zeros(x.shape[0], 3)
        return out.addmm_(z, self.w)  # aten.addmm_


@pytest.mark.parametrize("mode", ["real", "fake"])
def test_out_and_inplace_variants_count_as_their_op(mode):
    prof, warned = profile_quietly(OutVariants(), torch.randn(4, 6), mode=mode)
    assert prof.unsupported() == {} and warned == []
    assert prof.elementwise() == {"pointwise": 2 * 4 * 6, "reduction": 4 * 6}
    assert prof.by_op() == {"aten.addmm_": 4 * 6 * 3}


def test_variants_resolve_to_their_functional_op_by_rule():
    """The rule, not a list: foo_ -> foo, foo.out -> the overload of foo with the same inputs."""
    assert formulas.functional_overload(aten.hardswish_.default) is aten.hardswish.default
    assert formulas.functional_overload(aten.rrelu_with_noise_.default) is aten.rrelu_with_noise.default
    assert formulas.functional_overload(aten.add.out) is aten.add.Tensor
    assert formulas.functional_overload(aten.threshold.out) is aten.threshold.default
    assert formulas.functional_overload(aten.__iand__.Tensor) is aten.__iand__.Tensor  # a dunder, not in-place
    assert formulas.REGISTRY.spec(aten.mm.out) is formulas.REGISTRY.spec(aten.mm)
    assert formulas.REGISTRY.spec(aten.baddbmm_.default) is formulas.REGISTRY.spec(aten.baddbmm)
    assert elementwise.is_zero_cost(aten.fill_.Scalar) and elementwise.is_zero_cost(aten.squeeze_.dim)
    for functional in (aten.relu, aten.mish, aten.threshold, aten.rrelu_with_noise, aten.erf, aten.sin):
        twin = formulas.inplace_packet(functional)
        assert functional in elementwise.ACTIVATION_OPS and twin in elementwise.ACTIVATION_OPS, functional
        assert elementwise.rule_for(twin.default) == elementwise.rule_for(functional.default)
    # the tables name functional ops only: every in-place twin is derived
    for table in (elementwise.RULES, elementwise.ZERO_COST):
        twins = [op for op in table if formulas.functional_packet(op) in table]
        assert twins == [], twins


def test_inplace_threshold_between_two_linears_is_an_ffn():
    """The FFN pass finds the activation through its in-place twin."""
    ffn = nn.Sequential(nn.Linear(8, 32), nn.Threshold(0.1, 0.0, inplace=True), nn.Linear(32, 8))
    prof = flopscope.profile(ffn, torch.randn(2, 5, 8), mode="fake")
    assert prof.by_role() == {"ffn_up": 2 * 5 * 8 * 32, "ffn_down": 2 * 5 * 32 * 8}


# --------------------------------------------------------------------------------------------------
# 3. complex dtypes
# --------------------------------------------------------------------------------------------------
class MatMul(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.mm(a, b)


@pytest.mark.parametrize("mode", ["real", "fake"])
def test_complex_gemm_is_one_mac_per_complex_multiply_accumulate(mode):
    """[4, 8] @ [8, 3] in complex64: 4·8·3 MACs (each four real multiplies), as FlopCounterMode counts it
    (2·4·8·3 FLOPs); the convention is written where the count is defined."""
    a, b = torch.randn(4, 8, dtype=torch.complex64), torch.randn(8, 3, dtype=torch.complex64)
    prof = flopscope.profile(MatMul(), a, b, mode=mode)
    assert prof.total() == 4 * 8 * 3 and prof.total_flops() == 2 * 4 * 8 * 3
    with FlopCounterMode(display=False) as counter:
        torch.mm(a, b)
    assert counter.get_total_flops() == prof.total_flops()
    convention = " ".join((formulas.registry.__doc__ or "").split())
    assert "complex" in convention and "four real multiplies" in convention
    units = (DOCS / "conventions.md").read_text().split("## 2.")[0]  # section 1
    assert "complex" in units and "FlopCounterMode" in units


# --------------------------------------------------------------------------------------------------
# 4. DataParallel and record_function blocks
# --------------------------------------------------------------------------------------------------
def test_data_parallel_in_real_mode_counts_its_module_and_no_bookkeeping():
    if torch.cuda.device_count() > 1:
        pytest.skip("several GPUs: DataParallel runs its replicas in threads of its own (not tested here)")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.DataParallel(nn.Linear(8, 4).to(device))
    # no GPU: DataParallel.forward runs self.module inside record_function; one GPU: scatters the input to it first
    assert model.device_ids == ([0] if device == "cuda" else [])
    prof, warned = profile_quietly(model, torch.randn(2, 8, device=device), mode="real")
    assert prof.total() == 2 * 8 * 4 and prof.by_module()["module"] == 2 * 8 * 4
    assert prof.unsupported() == {} and warned == []


class Recorded(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.profiler.record_function("my block"):
            return self.fc(x)


@pytest.mark.parametrize("mode", ["real", "fake"])
def test_record_function_bookkeeping_is_zero_cost(mode):
    prof, warned = profile_quietly(Recorded(), torch.randn(2, 8), mode=mode)
    assert prof.total() == 2 * 8 * 4
    assert prof.unsupported() == {} and warned == []
    assert elementwise.is_zero_cost(torch.ops.profiler._record_function_enter_new.default)
