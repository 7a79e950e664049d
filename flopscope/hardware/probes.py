"""What this machine's CPU achieves, measured: the GEMM peak (square matmuls, best rate)
and the memory bandwidth (a STREAM-like copy, read + write bytes counted), in FLOP/s
and bytes/s, cached per dtype and thread count in memory and, on request, in
``~/.cache/flopscope/peaks.json``. :mod:`flopscope.hardware.peaks` asks these for a
CPU, where no datasheet applies."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigurationError


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _check_seconds(seconds: Any) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
        raise ConfigurationError(f"seconds must be positive, got {seconds!r}")
    return float(seconds)


CPU_CACHE: dict[tuple[torch.dtype, int], float] = {}
CPU_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def _cache_file() -> Path:
    root = os.environ.get("FLOPSCOPE_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache",
                                                                 "flopscope")
    return Path(root) / "peaks.json"


def disk_key(what: torch.dtype | str, threads: int) -> str:
    """``what``: the dtype of a GEMM peak, or ``"copy_bandwidth"``."""
    return f"{cpu_model()}|threads={threads}|{str(what).removeprefix('torch.')}"


def _read_disk(key: str) -> float | None:
    try:
        value = json.loads(_cache_file().read_text(encoding="utf-8")).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def write_disk(key: str, value: float) -> None:
    path = _cache_file()
    try:
        data: dict[str, Any] = {}
        if path.exists():
            loaded = json.loads(path.read_text(encoding="utf-8"))
            data = loaded if isinstance(loaded, dict) else {}
        data[key] = value
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
        tmp.replace(path)
    except (OSError, ValueError):
        pass  # a cache that cannot be written is no error


def gemm_benchmark(dtype: torch.dtype, seconds: float, max_n: int = 1024) -> tuple[float, int, int]:
    """(best FLOP/s, matrix size, matmuls timed) of square ``torch.mm`` in ``dtype`` for
    about ``seconds``."""
    n = 128
    with torch.inference_mode():
        # grow the size while one product stays well inside the budget (a slow dtype
        # keeps small matrices)
        while True:
            a = torch.randn(n, n).to(dtype)
            b = torch.randn(n, n).to(dtype)
            out = torch.mm(a, b)  # warm-up (and: can this CPU matmul this dtype at all)
            dt = float("inf")
            for _ in range(3):  # best of 3: the first products after start-up are slow
                t0 = time.perf_counter()
                torch.mm(a, b, out=out)
                dt = min(dt, time.perf_counter() - t0)
            # the next size costs 8x; keep >= ~4 products in budget
            if n >= max_n or dt * 8 * 4 > seconds:
                break
            n *= 2
        best, count = 0.0, 0
        deadline = time.perf_counter() + seconds
        while True:
            t0 = time.perf_counter()
            torch.mm(a, b, out=out)
            dt = time.perf_counter() - t0
            count += 1
            if dt > 0:
                best = max(best, 2.0 * n ** 3 / dt)
            if time.perf_counter() >= deadline:
                break
    return best, n, count


def measure_cpu_peak(dtype: torch.dtype = torch.float32, *, seconds: float = 0.5,
                     disk_cache: bool = False) -> float:
    """Achieved GEMM FLOP/s (2 per MAC) of this CPU for ``dtype``: square ``torch.mm``
    products (up to 1024 x 1024, smaller for a dtype this CPU computes slowly) timed
    for about ``seconds``; the best rate.

    Cached per (dtype, ``torch.get_num_threads()``) for the process: a second call
    returns the first figure without measuring. ``disk_cache=True`` also reads / writes
    ``~/.cache/flopscope/peaks.json`` (the folder ``$FLOPSCOPE_CACHE_DIR`` if set),
    keyed by the CPU model name, thread count and dtype. A dtype that is not a floating
    type, or that this build of PyTorch cannot matmul on CPU (FP8), is a
    :class:`~flopscope.errors.ConfigurationError`."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ConfigurationError("measure_cpu_peak needs a floating-point torch.dtype, got "
                                 f"{dtype!r}")
    seconds = _check_seconds(seconds)
    threads = torch.get_num_threads()
    cached = CPU_CACHE.get((dtype, threads))
    if cached is not None:
        return cached
    key = disk_key(dtype, threads)
    value = _read_disk(key) if disk_cache else None
    if value is None:
        try:
            value, _, _ = gemm_benchmark(dtype, float(seconds))
        except (RuntimeError, NotImplementedError, TypeError) as e:
            raise ConfigurationError(f"this CPU build of PyTorch cannot matmul {dtype}: {e}") from e
        if not value > 0:
            raise ConfigurationError(f"the {dtype} matmul benchmark measured no time (timer "
                                     "resolution)")
        if disk_cache:
            write_disk(key, value)
    CPU_CACHE[(dtype, threads)] = value
    return value


CPU_BW_CACHE: dict[int, float] = {}
_COPY_MIN_BYTES = 256 * 2**20  # each of the two buffers: a few hundred MB,
_COPY_MAX_BYTES = 512 * 2**20  # 4x the last-level cache (STREAM's rule) where that fits in 512 MiB


def _size_bytes(text: str) -> int:
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    text = text.strip().upper()
    if text and text[-1] in units:
        return int(text[:-1]) * units[text[-1]]
    return int(text)


def _last_level_cache_bytes() -> int:
    """The summed size of this machine's last-level caches from Linux sysfs (each shared
    cache counted once); 0 where that is not readable."""
    caches: dict[tuple[int, str], int] = {}
    for index in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cache/index[0-9]*"):
        try:
            if (index / "type").read_text().strip() == "Instruction":
                continue
            level = int((index / "level").read_text())
            shared = (index / "shared_cpu_list").read_text().strip()
            caches[(level, shared)] = _size_bytes((index / "size").read_text())
        except (OSError, ValueError):
            continue
    if not caches:
        return 0
    top = max(level for level, _ in caches)
    return sum(size for (level, _), size in caches.items() if level == top)


def copy_bytes() -> int:
    """Bytes of each buffer of the copy benchmark: 4x the last-level cache (STREAM's
    rule, so the copy streams from memory, not from cache), at least 256 MiB, at most
    512 MiB."""
    return min(max(4 * _last_level_cache_bytes(), _COPY_MIN_BYTES), _COPY_MAX_BYTES)


def copy_benchmark(seconds: float, nbytes: int) -> tuple[float, int, int]:
    """(best bytes/s, buffer bytes, copies timed) of ``dst.copy_(src)`` between two
    float32 buffers of ``nbytes`` for about ``seconds`` (at least 3 copies); each
    copy moves 2 * nbytes (read + write)."""
    n = max(nbytes // 4, 1)
    moved = 2.0 * 4 * n
    with torch.inference_mode():
        src = torch.ones(n, dtype=torch.float32)  # written: its pages are committed
        dst = torch.empty_like(src)
        dst.copy_(src)  # warm-up: commits dst's pages, starts the thread pool
        best, count = 0.0, 0
        deadline = time.perf_counter() + seconds
        while True:
            t0 = time.perf_counter()
            dst.copy_(src)
            dt = time.perf_counter() - t0
            count += 1
            if dt > 0:
                best = max(best, moved / dt)
            if count >= 3 and time.perf_counter() >= deadline:
                break
        del src, dst
    return best, 4 * n, count


def measure_cpu_bandwidth(*, seconds: float = 0.5, disk_cache: bool = False) -> float:
    """Achieved memory bandwidth of this CPU in bytes per second (decimal: 1 GB/s =
    1e9): a STREAM-like copy, ``dst.copy_(src)`` of two float32 buffers of 256-512
    MiB each (4x the last-level cache, as STREAM asks, within those bounds), timed
    for about ``seconds`` (at least 3 copies); the best rate, counting the bytes read
    plus the bytes written (STREAM's convention: the extra read of a write-allocate
    cache is not counted). Multithreaded as torch is (``torch.get_num_threads()``).

    Cached like :func:`measure_cpu_peak`: per ``torch.get_num_threads()`` for the
    process (a second call returns the first figure without measuring), and with
    ``disk_cache=True`` in ``~/.cache/flopscope/peaks.json`` (the folder
    ``$FLOPSCOPE_CACHE_DIR`` if set), keyed by the CPU model name and thread count.
    Buffers that cannot be allocated, or a timer that measured nothing, are a
    :class:`~flopscope.errors.ConfigurationError`."""
    seconds = _check_seconds(seconds)
    threads = torch.get_num_threads()
    cached = CPU_BW_CACHE.get(threads)
    if cached is not None:
        return cached
    key = disk_key("copy_bandwidth", threads)
    value = _read_disk(key) if disk_cache else None
    if value is None:
        try:
            value, _, _ = copy_benchmark(seconds, copy_bytes())
        except RuntimeError as e:  # "DefaultCPUAllocator: not enough memory"
            raise ConfigurationError(f"the copy benchmark could not run: {e}") from e
        if not value > 0:
            raise ConfigurationError("the copy benchmark measured no time (timer resolution)")
        if disk_cache:
            write_disk(key, value)
    CPU_BW_CACHE[threads] = value
    return value


