"""flopscope.hardware.peaks: the dense peak table, the name matcher, the warnings, the override, the CPU benchmark."""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import pytest
import torch

from flopscope.cli.commands import peak
from flopscope.errors import ConfigurationError, FlopscopeWarning
from flopscope.hardware import peaks, probes
from flopscope.hardware.peaks import (
    BANDWIDTH,
    PEAKS,
    device_name,
    match_device,
    peak_bandwidth,
    peak_flops,
)
from flopscope.hardware.probes import measure_cpu_bandwidth, measure_cpu_peak

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
    monkeypatch.setattr(probes, "CPU_CACHE", {})
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
    assert device_name("cpu") == probes.cpu_model()


def test_cpu_dtype_that_cannot_be_benchmarked(monkeypatch):
    monkeypatch.setattr(probes, "CPU_CACHE", {})
    with pytest.raises(ConfigurationError):
        measure_cpu_peak(torch.int32)
    with pytest.raises(ConfigurationError):
        measure_cpu_peak(torch.float32, seconds=0)

    def cannot(*args, **kwargs):
        raise RuntimeError('"addmm_impl_cpu_" not implemented for Float8_e4m3fn')

    monkeypatch.setattr(probes, "gemm_benchmark", cannot)
    with pytest.raises(ConfigurationError, match="cannot matmul"):
        measure_cpu_peak(torch.float8_e4m3fn)
    with pytest.warns(FlopscopeWarning, match="float8"):
        assert peak_flops("cpu", torch.float8_e4m3fn) is None


def test_disk_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("FLOPSCOPE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(probes, "CPU_CACHE", {})
    calls = []

    def fake(dtype, seconds, max_n=1024):
        calls.append(dtype)
        return 3e10, 64, 5

    monkeypatch.setattr(probes, "gemm_benchmark", fake)
    assert measure_cpu_peak(torch.float64, disk_cache=True) == 3e10
    stored = json.loads((tmp_path / "peaks.json").read_text())
    assert list(stored.values()) == [3e10]
    assert f"threads={torch.get_num_threads()}" in next(iter(stored))
    monkeypatch.setattr(probes, "CPU_CACHE", {})  # a new process: read from disk, no benchmark
    assert measure_cpu_peak(torch.float64, disk_cache=True) == 3e10
    assert calls == [torch.float64]


def _cli(argv):
    parser = argparse.ArgumentParser(prog="flopscope")
    peak.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.run(args)


def test_cli_measures_this_cpu(capsys, monkeypatch):
    monkeypatch.setattr(probes, "CPU_CACHE", {})
    monkeypatch.setattr(probes, "CPU_BW_CACHE", {})
    monkeypatch.setattr(probes, "copy_bytes", lambda: 16 * 2**20)  # a short copy: the real size is tested above
    assert _cli(["peak", "--dtype", "float32", "--seconds", "0.1"]) == 0
    out = capsys.readouterr().out
    assert "float32" in out and "GFLOP/s" in out and "threads" in out
    assert "memory bandwidth" in out and "GB/s" in out and "16 MiB" in out and "ridge point" in out
    assert probes.CPU_BW_CACHE[torch.get_num_threads()] > 0  # the measured figure is the cached one


def test_cli_prints_a_gpu_table_figure(capsys):
    assert _cli(["peak", "--device", "NVIDIA H100 80GB HBM3", "--dtype", "bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "H100 SXM, bfloat16: 989.4 TFLOP/s dense" in out
    assert "H100 SXM: memory bandwidth 3.35 TB/s (datasheet); ridge point 295.3 FLOPs/byte" in out
    assert _cli(["peak", "--device", "NVIDIA A100-SXM4-80GB", "--dtype", "bfloat16"]) == 0
    assert "A100 80GB SXM: memory bandwidth 2.039 TB/s" in capsys.readouterr().out
    assert _cli(["peak", "--device", "NVIDIA L40", "--dtype", "bfloat16"]) == 1
    out = capsys.readouterr().out
    assert "no peak in the table" in out and "memory bandwidth not in the table" in out


def test_cli_table_has_a_bandwidth_column(capsys):
    assert _cli(["peak", "--table", "--dtype", "bfloat16"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "memory bandwidth" in lines[0] and "ridge point" in lines[0]
    rows = {line.split("  ")[0].strip(): line for line in lines[1:]}
    assert set(BANDWIDTH) <= set(rows)  # one row per BANDWIDTH key: the A100 variants each get their own
    assert "2.039 TB/s" in rows["A100 80GB SXM"] and "1.555 TB/s" in rows["A100 40GB"]
    assert "989.4" in rows["H100 SXM"] and "295.3 FLOPs/byte" in rows["H100 SXM"]
    assert "864 GB/s" in rows["L40S"]


# ------------------------------------------------------------------------------------------ memory bandwidth

# what torch.cuda.get_device_name returns -> bytes/s as the datasheet prints it (decimal: 1 GB/s = 1e9 B/s)
BANDWIDTH_NAMES = {
    "NVIDIA A100-SXM4-80GB": 2039e9,  # "2,039GB/s" (80GB SXM column)
    "NVIDIA A100-SXM4-40GB": 1555e9,  # "1,555GB/s" (40GB SXM)
    "NVIDIA A100-PCIE-40GB": 1555e9,  # "1,555GB/s" (40GB PCIe)
    "NVIDIA A100 80GB PCIe": 1935e9,  # "1,935GB/s" (80GB PCIe)
    "NVIDIA H100 80GB HBM3": 3.35e12,  # "3.35TB/s"
    "NVIDIA H100 PCIe": 2e12,  # "2TB/s"
    "NVIDIA H200": 4.8e12,  # "4.8TB/s"
    "NVIDIA B200": 8e12,  # 64 TB/s for 8 GPUs
    "NVIDIA L4": 300e9,  # "300GB/s"
    "NVIDIA L40S": 864e9,  # "864GB/s"
    "AMD Instinct MI250X": 3.2e12 / 2,  # "3.2 TB/s" per package of 2 GCDs = 2 torch devices
    "AMD Instinct MI300X": 5.3e12,  # "5.3 TB/s"
}


@pytest.mark.parametrize("raw,value", sorted(BANDWIDTH_NAMES.items()))
def test_bandwidth_of_each_torch_name(raw, value):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a known device never warns
        assert peak_bandwidth(raw) == value
        assert peak_bandwidth(raw.lower()) == value


def test_every_peaks_device_has_a_bandwidth_or_is_deliberately_ambiguous():
    covered = set()
    for row in PEAKS:
        variants = [key for _, key in peaks._BANDWIDTH_VARIANTS.get(row, [])]
        if variants:  # the A100: one FLOP/s row, three memory systems
            assert row not in BANDWIDTH, row  # no figure for the bare row: it would be a guess
            assert all(key in BANDWIDTH for key in variants), row
            covered.update(variants)
        else:
            assert row in BANDWIDTH, row
            covered.add(row)
    assert covered == set(BANDWIDTH)  # and nothing else: no device the FLOP table does not know
    assert set(peaks._BANDWIDTH_VARIANTS) == {"A100"}
    for key, value in BANDWIDTH.items():
        assert peak_bandwidth(key) == value, key  # a BANDWIDTH key is a name too
        assert 100e9 <= value <= 10e12, key  # bytes/s: a GB/s or TB/s figure left unscaled would fail
    assert peak_bandwidth("NVIDIA H200") > peak_bandwidth("NVIDIA H100 80GB HBM3")  # same compute, faster HBM3e


def test_a100_variants_resolve_to_their_own_figures_and_a_bare_a100_is_not_guessed():
    assert peak_bandwidth("NVIDIA A100-SXM4-80GB") == 2039e9
    assert peak_bandwidth("NVIDIA A100 80GB PCIe") == 1935e9
    assert peak_bandwidth("NVIDIA A100-SXM4-40GB") == peak_bandwidth("NVIDIA A100-PCIE-40GB") == 1555e9
    assert len({peak_flops(name, torch.bfloat16) for name in BANDWIDTH_NAMES if "A100" in name}) == 1  # same FLOPs
    for ambiguous in ("A100", "NVIDIA A100", "NVIDIA A100 80GB"):  # the 80GB without its form factor: 1,935 or 2,039
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert peak_bandwidth(ambiguous) is None
            assert peak_bandwidth(ambiguous) is None
        ours = [str(w.message) for w in caught if issubclass(w.category, FlopscopeWarning)]
        assert len(ours) == 1, ambiguous
        assert "A100 80GB SXM 2.039 TB/s" in ours[0] and "bandwidth=" in ours[0]
    assert peak_bandwidth("A100", bandwidth=2039e9) == 2039e9  # the way out: say it


@pytest.mark.parametrize("raw", UNKNOWN)
def test_unknown_device_bandwidth_is_none_with_exactly_one_warning(raw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert peak_bandwidth(raw) is None
        assert peak_bandwidth(raw) is None
    ours = [w for w in caught if issubclass(w.category, FlopscopeWarning)]
    assert len(ours) == 1
    assert repr(raw) in str(ours[0].message) and "bandwidth=" in str(ours[0].message)
    assert ours[0].filename == __file__  # points at the caller


def test_bandwidth_warning_is_its_own_from_the_flops_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert peak_flops("NVIDIA H100 NVL", torch.bfloat16) is None
        assert peak_bandwidth("NVIDIA H100 NVL") is None  # not swallowed by the FLOP/s warning of the same name
    messages = [str(w.message) for w in caught if issubclass(w.category, FlopscopeWarning)]
    assert len(messages) == 2 and "peak FLOP/s" in messages[0] and "memory bandwidth" in messages[1]
    with pytest.warns(FlopscopeWarning, match="meta"):
        assert peak_bandwidth("meta") is None


def test_bandwidth_override_and_its_errors():
    assert peak_bandwidth("NVIDIA L4", bandwidth=250e9) == 250e9
    assert peak_bandwidth("no such gpu", bandwidth=1) == 1.0  # no lookup, no warning
    assert isinstance(peak_bandwidth("no such gpu", bandwidth=1), float)
    for bad in (0, -1.0, float("nan"), float("inf"), "3.35e12", True, [3.35e12]):
        with pytest.raises(ConfigurationError, match="bandwidth="):
            peak_bandwidth("NVIDIA L4", bandwidth=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):  # ConfigurationError is a ValueError
        peak_bandwidth(bandwidth=-5)


def test_cuda_device_bandwidth_is_looked_up_by_its_name(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100 80GB PCIe")
    assert peak_bandwidth() == 1935e9  # device None = the current CUDA device
    assert peak_bandwidth("cuda:0") == 1935e9
    assert device_name("cuda") == "A100"  # the FLOP/s row: one for all A100s
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "AMD Instinct MI250X / MI250")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: argparse.Namespace(
        multi_processor_count=110))  # ROCm's ambiguous name, settled by the CU count as for FLOP/s
    assert peak_bandwidth("cuda") == 1.6e12
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigurationError, match="CUDA is not available"):
        peak_bandwidth("cuda:0")


def test_ridge_point_of_h100_sxm_bf16():
    # ridge point = peak FLOP/s / bandwidth = 989.4e12 / 3.35e12 FLOPs per byte = 989.4 / 3.35;
    # 3.35 x 295 = 988.25, and the remaining 1.15 / 3.35 = 0.34: about 295.3 FLOPs per byte. A kernel with fewer
    # FLOPs per byte of HBM traffic than that (batch-1 bf16 decoding: ~1) is memory-bound on an H100 SXM.
    ridge = peak_flops("NVIDIA H100 80GB HBM3", torch.bfloat16) / peak_bandwidth("NVIDIA H100 80GB HBM3")
    assert ridge == pytest.approx(295.34, abs=0.01)
    assert round(ridge) == 295


def test_every_bandwidth_entry_has_a_source_comment():
    source = Path(peaks.__file__).read_text(encoding="utf-8")
    lines = source[source.index("BANDWIDTH: dict"):source.index("_BANDWIDTH_VARIANTS: dict")].splitlines()
    for key in BANDWIDTH:
        at = next(i for i, line in enumerate(lines) if line.lstrip().startswith(f'"{key}":'))
        while not lines[at - 1].lstrip().startswith("#"):  # A100 variants share the comment above the first
            at -= 1
            assert lines[at].lstrip().startswith('"'), key
        comment = []
        for line in reversed(lines[:at]):
            if not line.lstrip().startswith("#"):
                break
            comment.append(line)
        text = " ".join(comment)
        assert any(word in text.lower() for word in ("datasheet", "whitepaper", "specifications")), key
        assert "GB/s" in text or "TB/s" in text, key  # the figure as printed


def test_measure_cpu_bandwidth_is_plausible_and_cached(monkeypatch):
    monkeypatch.setattr(probes, "CPU_BW_CACHE", {})
    t0 = time.perf_counter()
    first = measure_cpu_bandwidth(seconds=0.01)  # a tiny budget: still at least 3 copies of >= 256 MiB
    t1 = time.perf_counter()
    second = measure_cpu_bandwidth(seconds=0.01)
    t2 = time.perf_counter()
    assert isinstance(first, float) and first > 1e8  # > 0.1 GB/s
    assert first < 1e13  # no CPU's DRAM reaches 10 TB/s: a broken timer or an unscaled figure would
    assert second is first
    assert t2 - t1 < (t1 - t0) / 10
    assert peak_bandwidth("cpu") is first  # "cpu" goes through the same cache
    with pytest.raises(ConfigurationError):
        measure_cpu_bandwidth(seconds=0)


def test_copy_benchmark_counts_read_plus_write_bytes(monkeypatch):
    clock = iter(range(1000))  # every perf_counter call is one second later: every copy takes 1 s

    class FakeTime:
        @staticmethod
        def perf_counter():
            return float(next(clock))

    monkeypatch.setattr(probes, "time", FakeTime)
    rate, nbytes, copies = probes.copy_benchmark(0.5, 2**20)
    assert nbytes == 2**20 and copies == 3  # the budget is spent, but best of at least 3
    assert rate == 2 * 2**20  # bytes read + bytes written, per second


def test_copy_size_follows_streams_rule_within_bounds(monkeypatch):
    assert probes._size_bytes("307200K") == 300 * 2**20 and probes._size_bytes("32M") == 32 * 2**20
    for llc, expected in ((0, 256 * 2**20), (100 * 2**20, 400 * 2**20), (300 * 2**20, 512 * 2**20)):
        monkeypatch.setattr(probes, "_last_level_cache_bytes", lambda llc=llc: llc)
        assert probes.copy_bytes() == expected


def test_bandwidth_disk_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("FLOPSCOPE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(probes, "CPU_BW_CACHE", {})
    calls = []

    def fake(seconds, nbytes):
        calls.append(nbytes)
        return 2e10, nbytes, 3

    monkeypatch.setattr(probes, "copy_benchmark", fake)
    assert measure_cpu_bandwidth(disk_cache=True) == 2e10
    stored = json.loads((tmp_path / "peaks.json").read_text())
    assert list(stored.values()) == [2e10]
    key = next(iter(stored))
    assert key.endswith("copy_bandwidth") and f"threads={torch.get_num_threads()}" in key
    monkeypatch.setattr(probes, "CPU_BW_CACHE", {})  # a new process: read from disk, no benchmark
    assert measure_cpu_bandwidth(disk_cache=True) == 2e10
    assert len(calls) == 1
