"""Peak FLOP/s per device and dtype: the denominator of MFU.

Three rules, each against a recurring bug of other tools' tables (issue 10; Lightning,
nanoGPT, torchtitan):

* **Dense figures only.** NVIDIA prints tensor-core figures "with sparsity" (2:4
  structured sparsity, 2x the dense rate). Every entry below is the dense figure: either
  printed as dense, or the sparse figure halved, written as that arithmetic (``242 * _T
  / 2``) so the datasheet number stays visible.
* **Never another GPU's figure.** A device the matcher does not recognise (an H100 NVL,
  an L40 without S, a GB200, an A10) gives ``None`` and one
  :class:`~flopscope.errors.FlopscopeWarning`, not the A100 row.
* **An override everywhere:** ``peak_flops(..., peak=...)``.

FLOPs are 2 per MAC, as on every datasheet.

``torch.float32`` means IEEE FP32 arithmetic as a default ``torch.matmul`` does it
(``torch.get_float32_matmul_precision() == "highest"``). On NVIDIA that is the plain
FP32 (CUDA-core, non-tensor-core) figure; TF32 is a reduced-precision tensor-core mode
(opt-in with ``torch.backends.cuda.matmul.allow_tf32`` /
``set_float32_matmul_precision("high")``) and is *not* listed under ``torch.float32``:
there is no TF32 torch dtype and this table does not invent one. The dense TF32 figures
are in :data:`TF32_PEAKS` (sources in the comments of :data:`PEAKS`): :func:`peak_flops`
returns the TF32 figure for ``torch.float32`` on an NVIDIA GPU when float32 matmuls run
as TF32 (``tf32=None``: as torch is set now, ``torch.get_float32_matmul_precision() !=
"highest"``), else MFU of a TF32 run would be measured against the FP32 figure and
exceed 100%. On AMD Instinct the FP32 matrix cores compute full FP32 (no reduced
mantissa) and rocBLAS / hipBLASLt use them for SGEMM, so the FP32 *matrix* figure is
listed.

Figures are per torch device: an MI250X package holds two GCDs that PyTorch sees as two
devices, so its datasheet figures are halved.

On CPU there is no table: :func:`~.probes.measure_cpu_peak` times square matmuls and
returns the best achieved rate (``flopscope peak`` prints it), so an MFU on a CPU run is
a fraction of what this machine's GEMM reaches.

**Memory bandwidth** (issue 11, serving and the roofline): :data:`BANDWIDTH` holds each
device's peak DRAM (HBM / GDDR) bandwidth in **bytes per second**, decimal as datasheets
print it (1 TB/s = 1e12 B/s, 1 GB/s = 1e9 B/s), under the same rules: the datasheet line
quoted beside each entry, per torch device (an MI250X GCD gets half the package),
``None`` and one :class:`~flopscope.errors.FlopscopeWarning` for a device not in the
table, and an override, ``peak_bandwidth(..., bandwidth=...)``. One PEAKS row can hide
several memory variants: the A100 40GB (1,555 GB/s), 80GB PCIe (1,935 GB/s) and 80GB SXM
(2,039 GB/s) compute alike but do not read alike, so :func:`peak_bandwidth` tells them
apart by the name torch reports (``"NVIDIA A100-SXM4-80GB"``) and gives ``None`` and a
warning for a name that does not say (a bare ``"A100"``), never a guess. On CPU
:func:`~.probes.measure_cpu_bandwidth` times a STREAM-like copy (read + write bytes
counted).

The roofline: a kernel's arithmetic intensity is its FLOPs per byte moved to and from
that memory; the **ridge point** = peak FLOP/s / bandwidth (FLOPs per byte) separates
memory-bound kernels (intensity below it: time = bytes / bandwidth) from compute-bound
ones (above: time = FLOPs / peak). H100 SXM, bf16: 989.4e12 / 3.35e12 = 295 FLOPs per
byte, while batch-1 decoding of a bf16 model does about 1 FLOP per weight byte (2 FLOPs
per MAC, 2 bytes per weight): memory-bound by two orders of magnitude. Datasheet
bandwidths are peaks; a copy kernel achieves less.
"""

from __future__ import annotations

import re
import threading
import warnings
from typing import Any

import torch

from ..errors import ConfigurationError, FlopscopeWarning
from . import probes

__all__ = ["BANDWIDTH", "PEAKS", "TF32_PEAKS", "device_name", "match_device", "peak_bandwidth",
           "peak_flops"]

_T = 1e12  # TFLOP/s
_P = 1e15  # PFLOP/s
_GB = 1e9  # GB/s, decimal as datasheets print it (bytes per second)
_TB = 1e12  # TB/s

# the OCP FP8 formats of Hopper / Ada / Blackwell
_FP8_NV = (torch.float8_e4m3fn, torch.float8_e5m2)
# MI300's FP8 formats (no inf, unsigned zero)
_FP8_AMD = (torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)


def _same(value: float, *dtypes: torch.dtype) -> dict[torch.dtype, float]:
    return dict.fromkeys(dtypes, value)


# normalised device name -> {dtype: dense FLOP/s}. Per entry: the source, and the figures as printed.
# NVIDIA footnote "*" = "With sparsity"; the dense rate is half of it.
PEAKS: dict[str, dict[torch.dtype, float]] = {
    # NVIDIA A100 Tensor Core GPU datasheet
    # (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf), columns "A100 40GB PCIe /
    # 80GB PCIe / 40GB SXM / 80GB SXM" (same figures for all four): "FP32 19.5 TFLOPS",
    # "Tensor Float 32 (TF32) 156 TFLOPS | 312 TFLOPS*" (TF32 dense 156, not listed),
    # "BFLOAT16 Tensor Core 312 TFLOPS | 624 TFLOPS*", "FP16 Tensor Core 312 TFLOPS |
    # 624 TFLOPS*". No FP8 on Ampere.
    "A100": {torch.float32: 19.5 * _T, torch.bfloat16: 312 * _T, torch.float16: 312 * _T},
    # NVIDIA H100 Tensor Core GPU Architecture whitepaper (GTC 2022), Table "NVIDIA H100
    # SXM5" column, printed dense/sparse: "Peak BF16 Tensor TFLOPS with FP32 Accumulate
    # 989.4/1978.9", same for FP16, "Peak FP8 Tensor TFLOPS with FP32 Accumulate
    # 1978.9/3957.8", "Peak TF32 Tensor TFLOPS 494.7/989.4" (TF32 not listed). The H100
    # datasheet prints the rounded sparse figures "BF16 Tensor Core 1,979 teraFLOPS*",
    # "FP8 3,958 teraFLOPS*" and "FP32 67 teraFLOPS" (SXM column); 1979 / 2 = 989.5 is
    # the same figure rounded differently.
    "H100 SXM": {torch.float32: 67 * _T, torch.bfloat16: 989.4 * _T, torch.float16: 989.4 * _T,
                 **_same(1978.9 * _T, *_FP8_NV)},
    # Same whitepaper, "NVIDIA H100 PCIe" column: "Peak BF16 Tensor TFLOPS with FP32
    # Accumulate 756/1513", FP16 the same, "Peak FP8 ... 1513/3026", "Peak TF32 ...
    # 378/756" (not listed); H100 datasheet, PCIe column: "FP32 51 teraFLOPS".
    "H100 PCIe": {torch.float32: 51 * _T, torch.bfloat16: 756 * _T, torch.float16: 756 * _T,
                  **_same(1513 * _T, *_FP8_NV)},
    # NVIDIA H200 Tensor Core GPU datasheet, "H200 SXM" column: "FP32 67 TFLOPS",
    # "BFLOAT16 Tensor Core 1,979 TFLOPS*", "FP16 Tensor Core 1,979 TFLOPS*", "FP8
    # Tensor Core 3,958 TFLOPS*", "TF32 989 TFLOPS*" (not listed): the H100 SXM5 figures
    # (same GH100 die and clocks, more memory), so the whitepaper's dense 989.4 / 1978.9
    # are used. The H200 NVL (600 W, lower figures) is deliberately not matched.
    "H200": {torch.float32: 67 * _T, torch.bfloat16: 989.4 * _T, torch.float16: 989.4 * _T,
             **_same(1978.9 * _T, *_FP8_NV)},
    # NVIDIA HGX B200 specifications (HGX platform page / Blackwell datasheet),
    # "Individual Blackwell GPU Specifications", HGX B200 column (1,000 W): "FP8/FP6
    # Tensor Core 9 PFLOPS", "FP16/BF16 Tensor Core 4.5 PFLOPS", "TF32 Tensor Core 2.2
    # PFLOPS" (all "with sparsity": dense 4.5, 2.25, 1.1), "FP32 75 TFLOPS". UNSURE:
    # FP32 — some versions of NVIDIA's Blackwell material print 80 TFLOPS for a B200
    # (the GB200 column of the same table prints 80); 75 is the HGX B200 figure as
    # printed. GB200 (1,200 W, 5 PFLOPS BF16 sparse) is a different entry and is not
    # matched.
    "B200": {torch.float32: 75 * _T, torch.bfloat16: 4.5 * _P / 2, torch.float16: 4.5 * _P / 2,
             **_same(9 * _P / 2, *_FP8_NV)},
    # NVIDIA L4 Tensor Core GPU datasheet: "FP32 30.3 teraFLOPS", "TF32 Tensor Core 120
    # teraFLOPS*" (not listed), "FP16 Tensor Core 242 teraFLOPS*", "BFLOAT16 Tensor Core
    # 242 teraFLOPS*", "FP8 Tensor Core 485 teraFLOPs*" (* with sparsity; dense 121 /
    # 121 / 242.5).
    "L4": {torch.float32: 30.3 * _T, torch.bfloat16: 242 * _T / 2, torch.float16: 242 * _T / 2,
           **_same(485 * _T / 2, *_FP8_NV)},
    # NVIDIA L40S GPU datasheet: "FP32 91.6 TFLOPS", "TF32 Tensor Core 183 | 366*
    # TFLOPS" (not listed), "BF16 Tensor Core 362.05 | 733* TFLOPS", "FP16 Tensor Core
    # 362.05 | 733* TFLOPS", "FP8 Tensor Core 733 | 1,466* TFLOPS" (dense | sparse, as
    # printed).
    "L40S": {torch.float32: 91.6 * _T, torch.bfloat16: 362.05 * _T, torch.float16: 362.05 * _T,
             **_same(733 * _T, *_FP8_NV)},
    # AMD Instinct MI250X accelerator datasheet (OAM package = 2 GCDs): "Peak FP32
    # Vector 47.9 TFLOPs", "Peak FP32 Matrix 95.7 TFLOPs", "Peak FP16 383 TFLOPs", "Peak
    # bfloat16 383 TFLOPs". PyTorch sees each GCD as one device, so each figure is
    # halved (the FP32 matrix figure, full FP32, see the module docstring). No FP8 on
    # CDNA 2; AMD prints no sparse figures for the MI200 series.
    "MI250X": {torch.float32: 95.7 * _T / 2, torch.bfloat16: 383 * _T / 2,
               torch.float16: 383 * _T / 2},
    # AMD Instinct MI300X accelerator datasheet: "Peak FP32 Vector 163.4 TFLOPs", "Peak
    # FP32 Matrix 163.4 TFLOPs", "Peak TF32 653.7 TFLOPs" (not listed), "Peak FP16 /
    # Peak bfloat16 1307.4 TFLOPs" (2614.9 with structured sparsity), "Peak FP8 2614.9
    # TFLOPs" (5229.8 with sparsity). One device = the whole MI300X in the default SPX
    # partition mode (CPX mode shows 8 devices with 1/8 each: not handled). MI300X
    # computes FP8 in the FNUZ formats, so those are the FP8 keys here.
    "MI300X": {torch.float32: 163.4 * _T, torch.bfloat16: 1307.4 * _T, torch.float16: 1307.4 * _T,
               **_same(2614.9 * _T, *_FP8_AMD)},
}

# Dense TF32 tensor-core FLOP/s of the NVIDIA entries, from the datasheet lines quoted
# above each PEAKS entry (sparse figures halved); float32 matmuls run at this rate when
# torch allows TF32.
TF32_PEAKS: dict[str, float] = {
    "A100": 156 * _T, "H100 SXM": 494.7 * _T, "H100 PCIe": 378 * _T, "H200": 494.7 * _T,
    "B200": 2.2 * _P / 2, "L4": 120 * _T / 2, "L40S": 183 * _T,
}

# The matcher: (pattern on the name torch.cuda.get_device_name returns, PEAKS key),
# first match wins; a name that matches an exclusion first is unknown. Patterns are
# case-insensitive; \b keeps "A100" from matching "A10", "L4" from matching "L40",
# "B200" from matching "GB200".
_EXCLUDE = [
    r"\bNVL\b",  # H100 NVL / H200 NVL: lower clocks, own datasheets (figures not in PEAKS)
    r"\bGB200\b|\bGH200\b",  # Grace superchips: other power limits and figures
]
_PATTERNS: list[tuple[str, str]] = [
    # "NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB", "...
    # 80GB PCIe"
    (r"\bA100\b", "A100"),
    (r"\bH100\b.*\bPCIe\b", "H100 PCIe"),  # "NVIDIA H100 PCIe"
    # "NVIDIA H100 80GB HBM3" (SXM5 has HBM3, PCIe HBM2e)
    (r"\bH100\b.*(\bSXM|\bHBM3\b)", "H100 SXM"),
    (r"\bH200\b", "H200"),  # "NVIDIA H200" (the SXM part; NVL excluded above)
    (r"\bB200\b", "B200"),  # "NVIDIA B200"
    (r"\bL40S\b", "L40S"),  # "NVIDIA L40S"
    (r"\bL4\b", "L4"),  # "NVIDIA L4"
    # "AMD Instinct MI250X" (not the ambiguous "MI250X / MI250", see below)
    (r"\bMI250X\b(?!\s*/)", "MI250X"),
    (r"\bMI300X\b", "MI300X"),  # "AMD Instinct MI300X"
]
# ROCm may report a gfx90a GCD as "AMD Instinct MI250X / MI250": the compute-unit count
# tells them apart (MI250X: 220 CUs per package = 110 per GCD; MI250: 208 = 104 per
# GCD).
_MI250_AMBIGUOUS = r"\bMI250X\s*/\s*MI250\b"
_MI250X_CUS_PER_GCD = 110


def match_device(name: str, *, compute_units: int | None = None) -> str | None:
    """The :data:`PEAKS` key for a device name as ``torch.cuda.get_device_name`` returns
    it (or a key itself), or ``None`` when the name is not one of the table's
    devices. ``compute_units`` (the device's ``multi_processor_count``) settles
    ROCm's "MI250X / MI250" name."""
    text = " ".join(name.split())
    for key in PEAKS:
        if text.casefold() == key.casefold():
            return key
    if any(re.search(p, text, re.IGNORECASE) for p in _EXCLUDE):
        return None
    if re.search(_MI250_AMBIGUOUS, text, re.IGNORECASE):
        return "MI250X" if compute_units == _MI250X_CUS_PER_GCD else None
    for pattern, key in _PATTERNS:
        if re.search(pattern, text, re.IGNORECASE):
            return key
    return None


def _resolve(device: str | torch.device | None) -> tuple[torch.device | None, str]:
    """(torch device or None for a bare device name, the raw name)."""
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
    if isinstance(device, str):
        try:
            device = torch.device(device)
        except RuntimeError:  # not a device string: a device name ("NVIDIA H100 PCIe", "H100 SXM")
            return None, str(device)
    if device.type == "cpu":
        return device, probes.cpu_model()
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigurationError(f"device {str(device)!r}: CUDA is not available here; pass a "
                                     "device name (\"NVIDIA H100 80GB HBM3\", \"H100 SXM\") or "
                                     "peak=")
        return device, torch.cuda.get_device_name(device)
    return device, device.type  # mps, xpu, meta, ...: not in the table


def _cuda_compute_units(device: torch.device) -> int | None:
    try:
        return int(torch.cuda.get_device_properties(device).multi_processor_count)
    except Exception:  # no driver in a test, or an old torch
        return None


def _table_key(dev: torch.device | None, raw: str) -> str | None:
    """The :data:`PEAKS` key of a resolved device (:func:`_resolve`), or ``None``."""
    units = _cuda_compute_units(dev) if dev is not None and dev.type == "cuda" else None
    return match_device(raw, compute_units=units)


def device_name(device: str | torch.device | None = None) -> str:
    """The name :func:`peak_flops` looks up: the :data:`PEAKS` key of a known GPU
    (``"H100 SXM"``), else the raw name (``torch.cuda.get_device_name``, the CPU
    model for ``"cpu"``, the device type otherwise). ``device`` as in
    :func:`peak_flops`."""
    dev, raw = _resolve(device)
    if dev is not None and dev.type == "cpu":
        return raw
    return _table_key(dev, raw) or raw


_WARNED: set[tuple[str, torch.dtype | str]] = set()
_LOCK = threading.Lock()


def _warn_once(name: str, what: torch.dtype | str, message: str) -> None:
    """Warn once per (device name, what) per process: ``what`` is the dtype of a FLOP/s
    lookup, or ``"bandwidth"``."""
    with _LOCK:
        if (name, what) in _WARNED:
            return
        _WARNED.add((name, what))
    warnings.warn(message, FlopscopeWarning, stacklevel=3)


def _check_override(value: Any, arg: str, unit: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value == float("inf"):
        raise ConfigurationError(f"{arg}= must be a positive, finite number of {unit}, got "
                                 f"{value!r}")
    return float(value)


def peak_flops(device: str | torch.device | None = None, dtype: torch.dtype = torch.bfloat16, *,
               peak: float | None = None, tf32: bool | None = None) -> float | None:
    """Dense peak FLOP/s (2 FLOPs per MAC) of ``device`` for ``dtype``, the denominator
    of MFU.

    ``peak`` overrides: returned as is after a positivity check (``<= 0`` or not a
    number: :class:`~flopscope.errors.ConfigurationError`). ``device``: ``None`` = the
    current CUDA device if there is one, else ``"cpu"``; a ``torch.device`` or device
    string; or a device name as ``torch.cuda.get_device_name`` returns it (``"NVIDIA
    H100 80GB HBM3"``) or a :data:`PEAKS` key. A GPU is looked up in :data:`PEAKS`
    through :func:`match_device`; an unknown device, or a dtype the table has no figure
    for on a known one, gives ``None`` and one
    :class:`~flopscope.errors.FlopscopeWarning` per (device name, dtype) per process,
    never another device's figure. ``"cpu"`` returns the measured figure of
    :func:`~.probes.measure_cpu_peak` (cached; ``None`` and a warning for a dtype the
    CPU cannot matmul). ``tf32``: whether float32 matmuls run as TF32 on an NVIDIA GPU
    (``None``: as torch is set now); then ``torch.float32`` gives the :data:`TF32_PEAKS`
    figure."""
    if peak is not None:
        return _check_override(peak, "peak", "FLOP/s")
    if not isinstance(dtype, torch.dtype):
        raise ConfigurationError(f"dtype must be a torch.dtype (torch.bfloat16, ...), got {dtype!r}")
    dev, raw = _resolve(device)
    if dev is not None and dev.type == "cpu":
        try:
            return probes.measure_cpu_peak(dtype)
        except ConfigurationError as e:
            _warn_once(raw, dtype,
                       f"no CPU peak for {dtype}: {e}; MFU is not available (pass peak=)")
            return None
    key = _table_key(dev, raw)
    if key is None:
        _warn_once(raw, dtype, f"peak FLOP/s unknown for device {raw!r} (known: "
                               f"{', '.join(PEAKS)}); MFU is not available: pass peak= with the "
                               "dense datasheet figure")
        return None
    if tf32 is None:
        tf32 = torch.get_float32_matmul_precision() != "highest"
    figure = TF32_PEAKS.get(key) if dtype == torch.float32 and tf32 and key in TF32_PEAKS else PEAKS[key].get(dtype)
    if figure is None:
        listed = ", ".join(str(d).removeprefix("torch.") for d in PEAKS[key])
        _warn_once(raw, dtype, f"peak FLOP/s of {key} ({raw!r}) unknown for {dtype} (listed: "
                               f"{listed}); MFU is not available: pass peak=")
        return None
    return figure


# ---------------------------------------------------------------------------------------------- bandwidth

# device -> peak DRAM bandwidth in bytes/s (decimal: 1 TB/s = 1e12), per torch device.
# Per entry: the source and the line as printed. Keys are the PEAKS keys, except where
# one PEAKS row covers memory variants of different bandwidth (the A100): those get a
# key per variant, found by _BANDWIDTH_VARIANTS below.
BANDWIDTH: dict[str, float] = {
    # NVIDIA A100 Tensor Core GPU datasheet
    # (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf), columns "A100 40GB PCIe /
    # A100 80GB PCIe / A100 40GB SXM / A100 80GB SXM": "GPU Memory Bandwidth 1,555GB/s |
    # 1,935GB/s | 1,555GB/s | 2,039GB/s" (40GB: HBM2; 80GB: HBM2e, clocked lower on the
    # 300 W PCIe card).
    "A100 40GB": 1555 * _GB,
    "A100 80GB PCIe": 1935 * _GB,
    "A100 80GB SXM": 2039 * _GB,
    # NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column: "GPU memory bandwidth
    # 3.35TB/s" (HBM3); the H100 architecture whitepaper, Table "NVIDIA H100 SXM5":
    # "Memory Bandwidth 3352 GB/sec" (the same, unrounded: 3.352e12 would move the ridge
    # point by 0.06%; the datasheet figure is used).
    "H100 SXM": 3.35 * _TB,
    # Same datasheet, H100 PCIe column: "GPU memory bandwidth 2TB/s" (HBM2e);
    # whitepaper, "NVIDIA H100 PCIe" column: "Memory Bandwidth 2000 GB/sec"; the PCIe
    # product brief: "memory bandwidth greater than 2,000 gigabytes per second". (The
    # H100 NVL, 3.9 TB/s, is not matched.)
    "H100 PCIe": 2 * _TB,
    # NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column: "GPU Memory Bandwidth
    # 4.8TB/s" (141GB HBM3e). The H200 NVL prints 4.8TB/s too, but is not matched (its
    # FLOP/s figures differ; one rule for both tables).
    "H200": 4.8 * _TB,
    # NVIDIA DGX B200 datasheet: "GPU Memory 1,440GB total GPU memory", "64TB/s HBM3e
    # bandwidth", for 8 B200 GPUs: 8 TB/s each, the per-GPU figure of NVIDIA's Blackwell
    # launch material ("8 TB/s" HBM3e). UNSURE: NVIDIA's per-GPU tables have changed
    # between versions (192 GB at launch, 180 GB shipping); I could not verify whether a
    # later HGX B200 table prints a lower per-GPU figure. 8 TB/s = 64 / 8 is used.
    "B200": 8 * _TB,
    # NVIDIA L4 Tensor Core GPU datasheet: "GPU memory bandwidth 300GB/s" (24GB GDDR6).
    "L4": 300 * _GB,
    # NVIDIA L40S GPU datasheet: "GPU Memory Bandwidth 864GB/s" (48GB GDDR6 with ECC).
    "L40S": 864 * _GB,
    # AMD Instinct MI250X accelerator datasheet (OAM package = 2 GCDs): "Peak Memory
    # Bandwidth 3.2 TB/s" (128GB HBM2e, 8192-bit). Each GCD has its own 4 of the 8 HBM2e
    # stacks and PyTorch sees each GCD as one device, so the figure is halved, as PEAKS
    # halves the FLOPs. (The interface rate, 8192 bits x 3.2 Gb/s / 8 = 3,276.8 GB/s, is
    # what AMD rounds to 3.2.)
    "MI250X": 3.2 * _TB / 2,
    # AMD Instinct MI300X accelerator datasheet: "Peak Memory Bandwidth 5.3 TB/s" (192GB
    # HBM3, 8192-bit); one device = the whole MI300X in the default SPX / NPS1 mode, as
    # in PEAKS.
    "MI300X": 5.3 * _TB,
}

# PEAKS keys that cover memory variants of different bandwidth: (pattern on the name
# torch.cuda.get_device_name returns, or a BANDWIDTH key, -> BANDWIDTH key), first match
# wins, case-insensitive. A name that matches none of them (a bare "A100", an "A100
# 80GB" without the form factor) is ambiguous: None and a warning, not the nearest
# variant.
_BANDWIDTH_VARIANTS: dict[str, list[tuple[str, str]]] = {
    "A100": [
        # "NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB": 1,555 GB/s both
        (r"\b40\s*GB\b", "A100 40GB"),
        # "NVIDIA A100 80GB PCIe"
        (r"\b80\s*GB\b.*\bPCIe\b|\bPCIe\b.*\b80\s*GB\b", "A100 80GB PCIe"),
        # "NVIDIA A100-SXM4-80GB"
        (r"\b80\s*GB\b.*\bSXM\d?\b|\bSXM\d?\b.*\b80\s*GB\b", "A100 80GB SXM"),
    ],
}


def _bandwidth_key(row: str | None, name: str) -> str | None:
    """The :data:`BANDWIDTH` key of the device called ``name`` whose :data:`PEAKS` key
    is ``row`` (:func:`match_device`); ``None`` for a device not in the table or a
    name that does not say which memory variant it is."""
    if row is None:
        return None
    variants = _BANDWIDTH_VARIANTS.get(row)
    if variants is None:
        return row if row in BANDWIDTH else None
    text = " ".join(name.split())
    return next((key for pattern, key in variants if re.search(pattern, text, re.IGNORECASE)), None)


def _format_bandwidth(value: float) -> str:
    return f"{value / _TB:.4g} TB/s" if value >= _TB else f"{value / _GB:.4g} GB/s"


def peak_bandwidth(device: str | torch.device | None = None, *,
                   bandwidth: float | None = None) -> float | None:
    """Peak memory (DRAM / HBM) bandwidth of ``device`` in bytes per second (decimal, as
    on datasheets: 3.35 TB/s = 3.35e12), the denominator of a memory-bound kernel's
    time and of the roofline's ridge point (peak FLOP/s / bandwidth, in FLOPs per
    byte).

    ``bandwidth`` overrides: returned as is after a positivity check (``<= 0``, infinite
    or not a number: :class:`~flopscope.errors.ConfigurationError`). ``device`` as in
    :func:`peak_flops`. A GPU is looked up in :data:`BANDWIDTH` through
    :func:`match_device`, and for a PEAKS row with memory variants (the A100) by the
    memory size and form factor in its name; an unknown device, or a name that does not
    say which variant it is, gives ``None`` and one
    :class:`~flopscope.errors.FlopscopeWarning` per device name per process, never
    another device's figure. ``"cpu"`` returns the measured figure of
    :func:`~.probes.measure_cpu_bandwidth` (cached)."""
    if bandwidth is not None:
        return _check_override(bandwidth, "bandwidth", "bytes/s")
    dev, raw = _resolve(device)
    if dev is not None and dev.type == "cpu":
        try:
            return probes.measure_cpu_bandwidth()
        except ConfigurationError as e:
            _warn_once(raw, "bandwidth", f"no CPU memory bandwidth: {e} (pass bandwidth=)")
            return None
    row = _table_key(dev, raw)
    key = _bandwidth_key(row, raw)
    if key is not None:
        return BANDWIDTH[key]
    if row is not None and row in _BANDWIDTH_VARIANTS:
        options = ", ".join(f"{k} {_format_bandwidth(BANDWIDTH[k])}" for _, k in _BANDWIDTH_VARIANTS[row])
        _warn_once(raw, "bandwidth", f"memory bandwidth of {raw!r} unknown: the {row} comes as "
                                     f"{options}, and the name does not say which; pass "
                                     "bandwidth=, or the name torch.cuda.get_device_name returns")
    else:
        _warn_once(raw, "bandwidth", f"memory bandwidth unknown for device {raw!r} (known: "
                                     f"{', '.join(BANDWIDTH)}): pass bandwidth= with the datasheet "
                                     "figure in bytes/s")
    return None
