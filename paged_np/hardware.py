"""Hardware probes: the machine's two limits, measured where paged_np runs (its streaming
read bandwidth and its peak of fused multiply-adds), the instruction set Numba compiles
for, and the timing helpers every benchmark shares.

:func:`stream_bandwidth` (a parallel Numba sum over 512 MiB), :func:`fma_peak`
(independent multiply-add chains on every thread, in the vector width of the
target), :func:`isa_info` (what the CPU has and what Numba emits for it), and
:func:`paged_reader` (the same K/V tiles decode reads, summed in its order: the
limit of the access pattern), with :func:`best_time`, :func:`settle`,
:func:`machine_line` and :func:`versions` for a result's header.
``python -m paged_np bench`` reports every kernel against these,
:mod:`paged_np.cli.bench_model` reuses the read, and the scripts in
``benchmarks/`` and notebook 09 import them from here. Nothing here imports
the rest of the package: it is the bottom layer.
"""

from __future__ import annotations

import functools
import os
import platform
import time

import numba
import numpy as np


def best_time(fn, repeat: int, warmup: int = 1) -> float:
    """Seconds of the fastest of ``repeat`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


@functools.cache
def _readers():
    """Two parallel Numba sums (compiled on first use, not cached on disk)."""
    from numba import njit, prange

    @njit(parallel=True, fastmath=True)
    def psum(a, n_chunks):  # a contiguous array, read front to back
        chunk = (a.size + n_chunks - 1) // n_chunks
        parts = np.zeros(n_chunks, np.float32)
        for c in prange(n_chunks):
            part = a[c * chunk:min(a.size, (c + 1) * chunk)]
            s = np.float32(0.0)
            for i in range(part.size):  # from 0: LLVM vectorises this loop
                s += part[i]
            parts[c] = s
        return parts.sum()

    @njit(parallel=True, fastmath=True)
    def paged_sum(k, v, tables, n_pages):  # the K/V tiles decode reads, in its order
        B, Hkv = tables.shape[0], k.shape[1]
        parts = np.zeros(B * Hkv, np.float32)
        for w in prange(B * Hkv):
            b, h = w // Hkv, w % Hkv
            s = np.float32(0.0)
            for j in range(n_pages):
                kt, vt = k[tables[b, j], h], v[tables[b, j], h]  # [page_size, D] each
                for t in range(kt.shape[0]):
                    for d in range(kt.shape[1]):
                        s += np.float32(kt[t, d]) + np.float32(vt[t, d])
            parts[w] = s
        return parts.sum()

    return psum, paged_sum


def stream_bandwidth(repeat: int = 5) -> float:
    """Streaming read bandwidth in GB/s: a parallel Numba sum over 512 MiB."""
    psum = _readers()[0]
    a = _stream_buffer()
    settle()
    t = best_time(lambda: psum(a, 64), repeat)
    return a.nbytes / t / 1e9


@functools.cache
def _stream_buffer():
    return np.ones(512 * 2**20 // 4, np.float32)  # 512 MiB, allocated once


#: Independent accumulators per thread tried by :func:`fma_peak`: 128 floats are
#: 8 zmm or 16 ymm registers, 64 floats 4 zmm or 8 ymm (AVX2 has 16 registers).
_FMA_WIDTHS = (64, 128)


@functools.cache
def _fma_kernel(width: int):
    """``n`` rounds of ``acc = acc * a + b`` over ``width`` floats per chunk, chunks in parallel.

    LLVM keeps ``acc`` in vector registers (the loop over ``width`` is unrolled
    and vectorised: ``width / lanes`` independent FMA chains), so nothing but
    the fused multiply-adds runs in the inner loop.
    """
    from numba import njit, prange

    @njit(parallel=True, fastmath=True)
    def fma_rounds(n, n_chunks, a, b):
        out = np.zeros(n_chunks, np.float32)
        for c in prange(n_chunks):
            acc = np.empty(width, np.float32)
            for i in range(width):
                acc[i] = np.float32(i) * np.float32(1e-3)
            for _ in range(n):
                for i in range(width):
                    acc[i] = acc[i] * a + b
            s = np.float32(0.0)
            for i in range(width):
                s += acc[i]
            out[c] = s
        return out.sum()

    return fma_rounds


def fma_peak(repeat: int = 5) -> float:
    """Peak float32 GFLOP/s of fused multiply-adds on all Numba threads (2 FLOP per FMA).

    One chunk per thread, each with independent FMA chains held in registers;
    the best of two chain counts (:data:`_FMA_WIDTHS`), since 16 AVX2
    registers cannot hold as many as 32 AVX-512 ones.
    """
    threads = numba.get_num_threads()
    a, b = np.float32(0.999), np.float32(1e-3)
    best = 0.0
    for width in _FMA_WIDTHS:
        fn = _fma_kernel(width)
        fn(10, threads, a, b)  # compile
        n = 100_000_000 // width  # ~0.1 s per call at 100 GFLOP/s on 2 threads
        t = best_time(functools.partial(fn, n, threads, a, b), repeat, warmup=0)
        best = max(best, 2 * width * n * threads / t / 1e9)
    return best


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo on Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_flags() -> set:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def machine_line() -> str:
    """One line for a benchmark's header: ``"<CPU model>, <n> cores, <ISA>"`` (no compile)."""
    flags = _cpu_flags()
    isa = "AVX-512" if "avx512f" in flags else ("AVX2" if "avx2" in flags else "no AVX2")
    return f"{cpu_model()}, {os.cpu_count()} cores, {isa}"


def versions() -> dict:
    """The software a measurement ran on: Numba's threads and each library's version."""
    return {"threads": numba.get_num_threads(),
            **{lib.__name__: lib.__version__ for lib in (numba, np)}}


def isa_info() -> dict:
    """What the CPU offers and what Numba compiles for.

    ``cpu_isa`` comes from the CPU flags; ``codegen`` from the instructions
    Numba generated for :func:`fma_peak`'s kernel: 512-bit ``zmm`` vectors,
    256-bit ``ymm`` ones with the 32 registers of AVX-512VL (``ymm16``-``ymm31``:
    LLVM's choice on Intel AVX-512 parts, which slow their clock on zmm code),
    or 256-bit with the 16 registers of AVX2. ``NUMBA_CPU_NAME`` and
    ``NUMBA_CPU_FEATURES`` change the latter, not the former (``NUMBA_CPU_NAME=haswell
    NUMBA_CPU_FEATURES=''`` gives AVX2 code on an AVX-512 machine).
    """
    import re

    import llvmlite.binding as ll
    from numba.core import config

    flags = _cpu_flags()
    cpu_isa = ("AVX-512" if "avx512f" in flags else "AVX2" if {"avx2", "fma"} <= flags
               else "SSE/other")
    fn = _fma_kernel(_FMA_WIDTHS[-1])
    fn(1, 1, np.float32(1.0), np.float32(0.0))
    asm = "\n".join(fn.inspect_asm().values())
    if re.search(r"%zmm", asm):
        codegen = "AVX-512 (512-bit zmm)"
    elif re.search(r"%ymm(1[6-9]|2\d|3[01])\b", asm):
        codegen = "AVX-512VL (256-bit ymm, 32 registers)"
    elif re.search(r"%ymm", asm):
        codegen = "AVX2 (256-bit ymm, 16 registers)"
    else:
        codegen = "SSE (128-bit xmm)"
    features = config.CPU_FEATURES
    return {"cpu": cpu_model(), "cpu_isa": cpu_isa,
            "cpu_flags": sorted(f for f in flags if f.startswith(("avx", "fma", "f16c"))),
            "numba_cpu_name": config.CPU_NAME or ll.get_host_cpu_name(),
            "numba_cpu_features": "host" if features is None else features,
            "codegen": codegen}


def isa_key(info: dict) -> str:
    """A short name for the code Numba generates: ``avx512``, ``avx512vl``, ``avx2`` or ``sse``."""
    return info["codegen"].split(" ")[0].lower().replace("-", "")


def paged_reader(k, v, tables):
    """A function that sums exactly the K/V tiles a decode step reads, in its order.

    No arithmetic beyond the sum: its GB/s is the limit that the access
    pattern itself (``page_size * head_dim`` contiguous values, then a jump
    to another page) puts on decode.
    """
    paged_sum = _readers()[1]
    if k.dtype == np.float16:  # Numba has no float16 arrays: sum the bits (same bytes)
        k, v = k.view(np.uint16), v.view(np.uint16)
    return functools.partial(paged_sum, k, v, tables, tables.shape[1])


def settle(seconds: float = 0.5) -> None:
    """Let the machine calm down after the previous measurement.

    OpenMP pools (Numba's ``omp`` layer, PyTorch's) and OpenBLAS keep their
    threads busy-waiting for a while after each parallel call, and after the
    512 MiB streaming read the next BLAS-heavy call ran 30% slower for up to
    a second or two (measured; gone after a 2 s pause). On 2 cores either
    would bias the comparison.
    """
    time.sleep(seconds)
