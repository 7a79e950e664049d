"""flopscope.peaks: the dense peak table, the name matcher, the warnings, the override, the CPU benchmark."""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import pytest
import torch

from flopscope import peaks
from flopscope.errors import ConfigurationError, FlopscopeWarning
from flopscope.peaks import PEAKS, device_name, match_device, measure_cpu_peak, peak_flops

# what torch.cuda.get_device_name returns on each device (ROCm included), and the table entry it must map to
NAMES = {
    "NVIDIA A100-SXM4-80GB": "A100",
    "NVIDIA A100-SXM4-40GB": "A100",
    "NVIDIA A100-PCIE-40GB": "A100",
    "NVIDIA A100 80GB PCIe": "A100",
    "NVIDIA H100 80GB HBM3": "H100 SXM",
    "NVIDIA H100 PCIe": "H100 PCIe",
    "NVIDIA H200": "H200",
    "NVIDIA B200": "B200",
    "NVIDIA L4": "L4",
    "NVIDIA L40S": "L40S",
    "AMD Instinct MI250X": "MI250X",
    "AMD Instinct MI300X": "MI300X",
}
# near misses: another device's figure would be wrong for each
UNKNOWN = ["NVIDIA A10", "NVIDIA A10G", "NVIDIA A100X", "NVIDIA H100 NVL", "NVIDIA H200 NVL", "NVIDIA GH200 480GB",
           "NVIDIA GB200", "NVIDIA L40", "NVIDIA H100", "NVIDIA B100", "AMD Instinct MI250", "AMD Instinct MI300A",
           "NVIDIA GeForce RTX 4090", "Tesla T4", ""]


@pytest.fixture(autouse=True)
def _fresh_warnings():
    peaks._WARNED.clear()
    yield
    peaks._WARNED.clear()


@pytest.mark.parametrize("raw,key", sorted(NAMES.items()))
def test_matcher_maps_torch_names_to_table_keys(raw, key):
    assert match_device(raw) == key
    assert match_device(raw.lower()) == key  # case does not matter
    assert key in PEAKS


@pytest.mark.parametrize("raw", UNKNOWN)
def test_matcher_never_borrows_another_devices_row(raw):
    assert match_device(raw) is None


def test_matcher_accepts_table_keys_and_settles_the_ambiguous_mi250_name():
    for key in PEAKS:
        assert match_device(key) == key
    assert match_device("AMD Instinct MI250X / MI250", compute_units=110) == "MI250X"
    assert match_device("AMD Instinct MI250X / MI250", compute_units=104) is None  # an MI250: not in the table
    assert match_device("AMD Instinct MI250X / MI250") is None


def test_dense_figures_never_sparse():
    # H100 datasheet prints "BF16 Tensor Core 1,979 teraFLOPS*" (* with sparsity); the whitepaper's dense figure
    # is 989.4. The table holds the dense one, never the sparse.
    h100 = peak_flops("NVIDIA H100 80GB HBM3", torch.bfloat16)
    assert h100 == 989.4e12
    assert h100 == pytest.approx(1979e12 / 2, rel=1e-3)
    assert peak_flops("NVIDIA H100 80GB HBM3", torch.float8_e4m3fn) == pytest.approx(3958e12 / 2, rel=1e-3)
    assert peak_flops("NVIDIA A100-SXM4-80GB", torch.bfloat16) == 624e12 / 2  # "312 TFLOPS | 624 TFLOPS*"
    assert peak_flops("NVIDIA L4", torch.bfloat16) == 242e12 / 2  # "242 teraFLOPS*"
    # "362.05 | 733*": the L40S datasheet prints its dense figure (slightly under half the sparse one)
    assert peak_flops("NVIDIA L40S", torch.float16) == 362.05e12
    assert peak_flops("NVIDIA B200", torch.bfloat16) == 4.5e15 / 2  # "4.5 PFLOPS" with sparsity
    assert peak_flops("AMD Instinct MI300X", torch.bfloat16) == 1307.4e12  # 2614.9 is the sparse figure
    assert peak_flops("AMD Instinct MI250X", torch.bfloat16) == 383e12 / 2  # per GCD: a package is 2 devices
    # a tensor-core figure is never lower than the FP32 one, and FP8 is never below BF16
    for key, row in PEAKS.items():
        assert row[torch.bfloat16] == row[torch.float16], key
        assert row[torch.bfloat16] > row[torch.float32], key
        for fp8 in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
            if fp8 in row:
                assert row[fp8] == pytest.approx(2 * row[torch.bfloat16], rel=0.02), key
    assert PEAKS["H200"] == PEAKS["H100 SXM"]  # same GH100 SXM5 compute


def test_float32_is_plain_fp32_not_tf32():
    assert torch.get_float32_matmul_precision() == "highest"  # torch's default: IEEE FP32 matmuls
    assert peak_flops("NVIDIA A100-SXM4-40GB", torch.float32) == 19.5e12  # TF32 would be 156e12
    assert peak_flops("NVIDIA H100 80GB HBM3", torch.float32) == 67e12  # TF32 would be 494.7e12


def test_float32_with_tf32_on_is_the_tf32_tensor_core_figure():
    assert peak_flops("NVIDIA A100-SXM4-40GB", torch.float32, tf32=True) == 156e12
    assert peak_flops("NVIDIA L4", torch.float32, tf32=True) == 120e12 / 2  # "120 teraFLOPS*", with sparsity
    assert peak_flops("NVIDIA A100-SXM4-40GB", torch.bfloat16, tf32=True) == 312e12  # other dtypes: unchanged
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")  # what turns TF32 on for float32 matmuls
        assert peak_flops("NVIDIA H100 80GB HBM3", torch.float32) == 494.7e12
        assert peak_flops("NVIDIA H100 80GB HBM3", torch.float32, tf32=False) == 67e12
        assert peak_flops("AMD Instinct MI300X", torch.float32) == 163.4e12  # full FP32 matrix cores: no TF32 row
    finally:
        torch.set_float32_matmul_precision(before)


def test_unknown_device_is_none_with_exactly_one_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert peak_flops("NVIDIA H100 NVL", torch.bfloat16) is None
        assert peak_flops("NVIDIA H100 NVL", torch.bfloat16) is None
    ours = [w for w in caught if issubclass(w.category, FlopscopeWarning)]
    assert len(ours) == 1
    assert "NVIDIA H100 NVL" in str(ours[0].message) and "peak=" in str(ours[0].message)
    assert ours[0].filename == __file__  # points at the caller
    with pytest.warns(FlopscopeWarning):  # another dtype is another (device, dtype) pair
        assert peak_flops("NVIDIA H100 NVL", torch.float16) is None


def test_unknown_dtype_of_a_known_device_is_none_with_one_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert peak_flops("NVIDIA A100-SXM4-80GB", torch.float8_e4m3fn) is None  # no FP8 on Ampere
        assert peak_flops("NVIDIA A100-SXM4-80GB", torch.float8_e4m3fn) is None
        assert peak_flops("AMD Instinct MI300X", torch.float8_e4m3fn) is None  # MI300X's FP8 is the fnuz kind
    ours = [str(w.message) for w in caught if issubclass(w.category, FlopscopeWarning)]
    assert len(ours) == 2
    assert "A100" in ours[0] and "float8_e4m3fn" in ours[0]


def test_other_device_types_are_unknown():
    with pytest.warns(FlopscopeWarning, match="meta"):
        assert peak_flops("meta", torch.bfloat16) is None


def test_override_and_its_errors():
    assert peak_flops("NVIDIA L4", torch.bfloat16, peak=100e12) == 100e12
    assert peak_flops("no such gpu", peak=5) == 5.0  # no lookup, no warning
    for bad in (0, -1.0, float("nan"), float("inf"), "312e12", True):
        with pytest.raises(ConfigurationError):
            peak_flops("NVIDIA L4", peak=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):  # ConfigurationError is a ValueError
        peak_flops(peak=0)
    with pytest.raises(ConfigurationError):
        peak_flops("NVIDIA L4", "bfloat16")  # type: ignore[arg-type]


def test_cuda_device_is_looked_up_by_its_name(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 PCIe")
    assert peak_flops() == 756e12  # device None = the current CUDA device, dtype bfloat16
    assert peak_flops("cuda:0", torch.float8_e4m3fn) == 1513e12
    assert peak_flops(torch.device("cuda", 0), torch.float32) == 51e12
    assert device_name("cuda") == "H100 PCIe"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA GeForce RTX 3050")
    assert device_name("cuda") == "NVIDIA GeForce RTX 3050"
    with pytest.warns(FlopscopeWarning, match="RTX 3050"):
        assert peak_flops("cuda") is None


def test_cuda_requested_without_cuda_is_a_configuration_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigurationError, match="CUDA is not available"):
        peak_flops("cuda:0")


def test_every_entry_has_a_source_comment():
    source = Path(peaks.__file__).read_text(encoding="utf-8")
    table = source[source.index("PEAKS: dict"):source.index("# The matcher")]
    lines = table.splitlines()
    for key in PEAKS:
        at = next(i for i, line in enumerate(lines) if line.lstrip().startswith(f'"{key}":'))
        assert lines[at - 1].lstrip().startswith("#"), key
        comment = []
        for line in reversed(lines[:at]):
            if not line.lstrip().startswith("#"):
                break
            comment.append(line)
        text = " ".join(comment).lower()
        assert "datasheet" in text or "whitepaper" in text or "specifications" in text, key


def test_measure_cpu_peak_is_plausible_and_cached(monkeypatch):
    monkeypatch.setattr(peaks, "_CPU_CACHE", {})
    t0 = time.perf_counter()
    first = measure_cpu_peak(torch.float32, seconds=0.2)
    t1 = time.perf_counter()
    second = measure_cpu_peak(torch.float32, seconds=0.2)
    t2 = time.perf_counter()
    assert isinstance(first, float) and first > 1e8
    assert first < 1e15  # no CPU reaches a PFLOP/s: a broken timer would
    assert second is first
    assert t2 - t1 < (t1 - t0) / 10
    assert peak_flops("cpu", torch.float32) is first  # "cpu" goes through the same cache
    assert device_name("cpu") == peaks._cpu_model()


def test_cpu_dtype_that_cannot_be_benchmarked(monkeypatch):
    monkeypatch.setattr(peaks, "_CPU_CACHE", {})
    with pytest.raises(ConfigurationError):
        measure_cpu_peak(torch.int32)
    with pytest.raises(ConfigurationError):
        measure_cpu_peak(torch.float32, seconds=0)

    def cannot(*args, **kwargs):
        raise RuntimeError('"addmm_impl_cpu_" not implemented for Float8_e4m3fn')

    monkeypatch.setattr(peaks, "_benchmark", cannot)
    with pytest.raises(ConfigurationError, match="cannot matmul"):
        measure_cpu_peak(torch.float8_e4m3fn)
    with pytest.warns(FlopscopeWarning, match="float8"):
        assert peak_flops("cpu", torch.float8_e4m3fn) is None


def test_disk_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("FLOPSCOPE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(peaks, "_CPU_CACHE", {})
    calls = []

    def fake(dtype, seconds, max_n=1024):
        calls.append(dtype)
        return 3e10, 64, 5

    monkeypatch.setattr(peaks, "_benchmark", fake)
    assert measure_cpu_peak(torch.float64, disk_cache=True) == 3e10
    stored = json.loads((tmp_path / "peaks.json").read_text())
    assert list(stored.values()) == [3e10]
    assert f"threads={torch.get_num_threads()}" in next(iter(stored))
    monkeypatch.setattr(peaks, "_CPU_CACHE", {})  # a new process: read from disk, no benchmark
    assert measure_cpu_peak(torch.float64, disk_cache=True) == 3e10
    assert calls == [torch.float64]


def _cli(argv):
    parser = argparse.ArgumentParser(prog="flopscope")
    peaks.register_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.run(args)


def test_cli_measures_this_cpu(capsys, monkeypatch):
    monkeypatch.setattr(peaks, "_CPU_CACHE", {})
    assert _cli(["peak", "--dtype", "float32", "--seconds", "0.1"]) == 0
    out = capsys.readouterr().out
    assert "float32" in out and "GFLOP/s" in out and "threads" in out


def test_cli_prints_a_gpu_table_figure(capsys):
    assert _cli(["peak", "--device", "NVIDIA H100 80GB HBM3", "--dtype", "bfloat16"]) == 0
    assert "H100 SXM, bfloat16: 989.4 TFLOP/s dense" in capsys.readouterr().out
    assert _cli(["peak", "--device", "NVIDIA L40", "--dtype", "bfloat16"]) == 1
    assert "no peak in the table" in capsys.readouterr().out
