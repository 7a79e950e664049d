"""``flopscope peak``: this CPU's GEMM peak and memory bandwidth, or a GPU's figures.

On a CPU it times square matmuls (the best rate: the MFU denominator of a CPU run) and a
STREAM-like copy. For a GPU it prints the dense datasheet figure of
:data:`flopscope.hardware.peaks.PEAKS` and the bandwidth of ``BANDWIDTH``; with
``--table``, every device of the table. The ridge point (FLOP/s / bandwidth) is the
roofline's knee. Exit 1 when the device has no peak in the table.

The benchmarks, caches and table keys are :mod:`flopscope.hardware.peaks`'s own. They
are read through the module at each call, so a test that patches the module patches
them.
"""

from __future__ import annotations

import argparse
import warnings

import torch

from ...errors import ConfigurationError, FlopscopeWarning
from ...hardware import peaks, probes
from .._options import Commands

_CLI_DTYPES = {str(d).removeprefix("torch."): d for d in probes.CPU_DTYPES}


def register(commands: Commands) -> None:
    """Add ``peak`` and its options to ``commands``."""
    cmd = commands.add_parser(
        "peak", help="measure this CPU's GEMM peak and memory bandwidth (or show a GPU's table "
                     "figures)",
        description="Measure the achieved GEMM throughput of this CPU for a dtype (square matmuls, "
                    "best rate): the MFU denominator of a CPU run, and its memory bandwidth (a "
                    "STREAM-like copy). With --device cuda[:N] or a GPU name, print the GPU's "
                    "dense datasheet figure from flopscope.peaks.PEAKS and its memory bandwidth "
                    "from BANDWIDTH instead; with --table, every device of the table. The ridge "
                    "point (FLOP/s / bandwidth) is the roofline's knee.")
    cmd.add_argument("--dtype", choices=[*sorted(_CLI_DTYPES), "float8_e4m3fn", "float8_e4m3fnuz"],
                     default="float32",
                     help="dtype (default float32)")
    cmd.add_argument("--seconds", type=float, default=1.0,
                     help="benchmark time on CPU, for each of the two benchmarks (default 1.0)")
    cmd.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N, or a GPU name")
    cmd.add_argument("--table", action="store_true",
                     help="print the whole GPU table for --dtype: FLOP/s, memory bandwidth, ridge "
                          "point")
    cmd.add_argument("--save", action="store_true",
                     help="store the CPU figures in ~/.cache/flopscope/peaks.json for "
                          "measure_cpu_peak / measure_cpu_bandwidth(disk_cache=True)")
    cmd.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Print the table, this CPU's measured figures, or the device's datasheet ones."""
    dtype = getattr(torch, args.dtype)
    label = args.dtype
    if args.table:
        return _table(dtype, label)
    dev, raw = peaks._resolve(args.device)
    if dev is not None and dev.type == "cpu":
        return _measure_cpu(args, dtype, label, raw)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FlopscopeWarning)
        value_or_none = peaks.peak_flops(args.device, dtype)
    name = peaks.device_name(args.device)
    if value_or_none is None:
        reason = str(caught[0].message) if caught else "unknown"
        print(f"{name}, {label}: no peak in the table ({reason})")
    else:
        print(f"{name}, {label}: {value_or_none / 1e12:.1f} TFLOP/s dense (datasheet, 2 FLOPs per "
              "MAC)")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FlopscopeWarning)
        bandwidth_or_none = peaks.peak_bandwidth(args.device)
    if bandwidth_or_none is None:
        reason = str(caught[0].message) if caught else "unknown"
        print(f"{name}: memory bandwidth not in the table ({reason})")
    else:
        key = peaks._bandwidth_key(peaks._table_key(dev, raw), raw) or name
        print(f"{key}: memory bandwidth {peaks._format_bandwidth(bandwidth_or_none)} (datasheet); "
              f"ridge point {_ridge(value_or_none, bandwidth_or_none)} ({label})")
    return 0 if value_or_none is not None else 1


def _measure_cpu(args: argparse.Namespace, dtype: torch.dtype, label: str, raw: str) -> int:
    """Time this CPU's GEMM and copy, cache the figures (on disk with ``--save``)."""
    if not args.seconds > 0:
        raise ConfigurationError(f"--seconds must be positive, got {args.seconds}")
    if not dtype.is_floating_point or dtype not in probes.CPU_DTYPES:
        raise ConfigurationError(f"no CPU GEMM benchmark for {label}")
    try:
        value, n, count = probes.gemm_benchmark(dtype, args.seconds)
    except (RuntimeError, NotImplementedError, TypeError) as e:
        raise ConfigurationError(f"this CPU build of PyTorch cannot matmul {label}: {e}") from e
    threads = torch.get_num_threads()
    probes.CPU_CACHE[(dtype, threads)] = value
    if args.save:
        probes.write_disk(probes.disk_key(dtype, threads), value)
    print(f"{raw} ({threads} threads), {label}: {value / 1e9:.1f} GFLOP/s "
          f"(achieved GEMM peak: best of {count} {n}x{n} matmuls in {args.seconds:g} s; 2 FLOPs "
          "per MAC)")
    try:
        bandwidth, nbytes, copies = probes.copy_benchmark(args.seconds, probes.copy_bytes())
    except RuntimeError as e:
        raise ConfigurationError(f"the copy benchmark could not run: {e}") from e
    probes.CPU_BW_CACHE[threads] = bandwidth
    if args.save:
        probes.write_disk(probes.disk_key("copy_bandwidth", threads), bandwidth)
    print(f"{raw} ({threads} threads), memory bandwidth: {bandwidth / peaks._GB:.1f} GB/s "
          f"(STREAM-like copy: best of {copies} copies of {nbytes / 2**20:.0f} MiB, read + write "
          f"bytes counted); ridge point {_ridge(value, bandwidth)}")
    return 0


def _ridge(flops: float | None, bandwidth: float | None) -> str:
    """The ridge point, FLOP/s over bytes/s, as printed; ``-`` without both."""
    return f"{flops / bandwidth:.1f} FLOPs/byte" if flops and bandwidth else "-"


def _table(dtype: torch.dtype, label: str) -> int:
    """Print every device of the table: FLOP/s in ``dtype``, bandwidth, ridge point."""
    rows = []
    for row in peaks.PEAKS:
        variants = [key for _, key in peaks._BANDWIDTH_VARIANTS.get(row, [])] or [row]
        for key in variants:
            flops = peaks.PEAKS[row].get(dtype)
            bandwidth = peaks.BANDWIDTH.get(key)
            rows.append((key, "-" if flops is None else f"{flops / peaks._T:.1f}",
                         "-" if bandwidth is None else peaks._format_bandwidth(bandwidth),
                         _ridge(flops, bandwidth)))
    head = ("device", f"{label} TFLOP/s dense", "memory bandwidth", "ridge point")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]
    for r in [head, *rows]:
        cells = [cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths, strict=True))]
        print("  ".join(cells))
    print("(datasheet figures, dense, per torch device; 2 FLOPs per MAC; bandwidth in decimal "
          "bytes/s)")
    return 0
