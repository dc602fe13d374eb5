"""``python -m paged_np bench``: how fast is paged attention, against what limit?

A kernel has two limits: the memory bus (bytes per second) and the arithmetic
units (floating point operations per second). The bench measures both on the
machine at hand: the streaming read bandwidth (a parallel Numba sum over 512
MiB) and the peak of fused multiply-adds on all threads (:func:`fma_peak`, in
the vector width Numba compiles for: :func:`isa_info` names it). Each case has
an *arithmetic intensity* ``I`` (FLOP per byte of memory it must move); it can
at best run at ``min(peak_flops, I * bandwidth)``, and every "% of limit" figure
is of that lower limit. Decode reads every cached K and V value once and does
two multiply-adds per value and query head (``I = 2 G / itemsize``: 2 FLOP/byte
in float32 with G = 4), so on a CPU its limit is the memory bus; it is reported
as *effective GB/s of K/V read*. Prefill (``I`` in the hundreds) is limited by
the arithmetic and reported in GFLOP/s. PyTorch's ``scaled_dot_product_attention`` (when torch is
installed, same thread count, K/V contiguous) and the NumPy teaching kernel
run on the same data, in the same process, so the ratios hold on a noisy machine.

Usage::

    python -m paged_np bench            # full run, a few minutes
    python -m paged_np bench --quick    # under a minute
    python -m paged_np bench --backend numba --out benchmarks

Writes ``results.json`` (this run), ``results-<isa>.json`` (this run, kept per
instruction set: see :func:`isa_key`), ``results.md`` (one section per
``results-*.json`` there) and ``roofline.png`` into ``--out`` (default
``paged_np_out/bench/``; ``--out benchmarks`` replaces the repository's
committed results, which is how they are made).
Times are the best of several repeats (the least disturbed run).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numba
import numpy as np

from . import DEFAULT_OUT

# Shapes of the decode case the targets refer to (a Llama-3-8B-like layer).
B, H, HKV, D, PAGE = 8, 32, 8, 128, 16


def _best(fn, repeat: int, warmup: int = 1) -> float:
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
    _settle()
    t = _best(lambda: psum(a, 64), repeat)
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
        t = _best(functools.partial(fn, n, threads, a, b), repeat, warmup=0)
        best = max(best, 2 * width * n * threads / t / 1e9)
    return best


def _cpu_model() -> str:
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
    return {"cpu": _cpu_model(), "cpu_isa": cpu_isa,
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


def make_decode_case(ctx: int, dtype, page_size: int = PAGE, seed: int = 0):
    """Arrays of one decode step: B sequences of ``ctx`` tokens, shuffled pages."""
    rng = np.random.default_rng(seed)
    n_pages = -(-ctx // page_size)
    k = rng.standard_normal((B * n_pages, HKV, page_size, D), np.float32).astype(dtype)
    v = rng.standard_normal((B * n_pages, HKV, page_size, D), np.float32).astype(dtype)
    tables = rng.permutation(B * n_pages).reshape(B, n_pages).astype(np.int32)
    q = rng.standard_normal((B, H, D), np.float32)
    seq_lens = np.full(B, ctx, np.int32)
    qsl = np.arange(B + 1, dtype=np.int32)
    return q, k, v, tables, seq_lens, qsl


def _torch_decode(q, k, v, tables, seq_lens):
    """torch SDPA closure on the same K/V, laid out contiguously [B, Hkv, ctx, D]."""
    import torch

    ctx = int(seq_lens[0])
    kc = k[tables].transpose(0, 2, 1, 3, 4).reshape(B, HKV, -1, D)[:, :, :ctx]
    vc = v[tables].transpose(0, 2, 1, 3, 4).reshape(B, HKV, -1, D)[:, :, :ctx]
    tq = torch.from_numpy(q[:, :, None, :].copy())  # [B, H, 1, D]
    tk = torch.from_numpy(np.ascontiguousarray(kc, np.float32))
    tv = torch.from_numpy(np.ascontiguousarray(vc, np.float32))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    return lambda: sdpa(tq, tk, tv, enable_gqa=True)


def _numpy_forward():
    """The NumPy teaching kernel's ``forward``, when that module exists."""
    try:
        from ..attention import numpy_paged
    except ImportError:
        return None
    return getattr(numpy_paged, "forward", None)


def _best_alternating(fns: dict, rounds: int, repeat: int) -> dict:
    """Best seconds of each function, measured in alternation.

    On a shared machine the available bandwidth drifts from second to
    second; alternating (A, B, A, B, ...) lets every function meet the same
    quiet moments, so the ratio of two best times holds.
    """
    best = {name: float("inf") for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            _settle()
            best[name] = min(best[name], _best(fn, repeat, warmup=0))
    return best


def _settle(seconds: float = 0.5) -> None:
    """Let the machine calm down after the previous measurement.

    OpenMP pools (Numba's ``omp`` layer, PyTorch's) and OpenBLAS keep their
    threads busy-waiting for a while after each parallel call, and after the
    512 MiB streaming read the next BLAS-heavy call ran 30% slower for up to
    a second or two (measured; gone after a 2 s pause). On 2 cores either
    would bias the comparison.
    """
    time.sleep(seconds)


def bench_numba(cfg: dict, log) -> dict:
    """Every figure for the Numba CPU backend; ``cfg`` sets sizes and repeats."""
    from ..attention import numba_cpu

    res = {"decode": [], "page_sweep": [], "prefill": {}}
    torch = cfg["torch"]
    np_forward = _numpy_forward()
    res["isa"] = isa_info()
    log(f"CPU {res['isa']['cpu']} ({res['isa']['cpu_isa']}); Numba target "
        f"{res['isa']['numba_cpu_name']}, code: {res['isa']['codegen']}")
    _settle()
    peak = res["fma_peak_gflops"] = fma_peak(cfg["repeat"])
    log(f"FMA peak: {peak:.1f} GFLOP/s float32 on {numba.get_num_threads()} threads")
    bws = [stream_bandwidth(cfg["repeat"])]  # re-measured between cases; the best counts
    log(f"streaming read bandwidth: {bws[0]:.1f} GB/s")
    scale = D**-0.5
    rounds, rep = cfg["rounds"], max(1, cfg["repeat"] // cfg["rounds"])
    for dtype in (np.float32, np.float16):
        for ctx in cfg["contexts"]:
            case = make_decode_case(ctx, dtype)
            q, k, v, bt, sl, qsl = case
            gb = 2 * B * HKV * ctx * D * k.itemsize / 1e9  # K and V bytes read
            fns = {"numba": functools.partial(numba_cpu.forward, *case, scale, 0, False),
                   "paged_read": paged_reader(k, v, bt)}
            if torch is not None and dtype is np.float32:
                fns["torch"] = _torch_decode(q, k, v, bt, sl)
            for fn in fns.values():  # warm up (compile, first touch)
                fn()
            best = _best_alternating(fns, rounds, rep)
            t = best["numba"]
            flops = 4 * B * H * ctx * D  # q.k and p.v: a multiply-add per K/V value per head
            row = {"dtype": np.dtype(dtype).name, "context": ctx, "ms": t * 1e3,
                   "gbs": gb / t, "paged_read_gbs": gb / best["paged_read"],
                   "gflops": flops / t / 1e9, "intensity": flops / (gb * 1e9)}
            if "torch" in best:
                row["torch_ms"], row["speedup_vs_torch"] = best["torch"] * 1e3, best["torch"] / t
            if np_forward is not None and ctx <= cfg["numpy_max_ctx"]:
                tn = _best(functools.partial(np_forward, *case, scale, 0, False), 1)
                row["numpy_ms"], row["speedup_vs_numpy"] = tn * 1e3, tn / t
            res["decode"].append(row)
            # The VM's bandwidth drifts (35-59 GB/s within one run was seen): keep the
            # read measured right beside this case too, for a like-for-like ratio.
            bws.append(stream_bandwidth(max(2, cfg["repeat"] // 2)))
            row["stream_gbs"] = bws[-1]
            log(f"decode {row['dtype']} ctx {ctx}: {row['ms']:.2f} ms, {row['gbs']:.1f} GB/s "
                f"(paged read {row['paged_read_gbs']:.1f}, stream {bws[-1]:.1f}), "
                f"x{row.get('speedup_vs_torch', float('nan')):.2f} vs torch, "
                f"x{row.get('speedup_vs_numpy', float('nan')):.1f} vs numpy")
    gb = 2 * B * HKV * 2048 * D * 4 / 1e9
    for ps in cfg["page_sizes"]:
        case = make_decode_case(2048, np.float32, page_size=ps)
        fns = {"numba": functools.partial(numba_cpu.forward, *case, scale, 0, False),
               "paged_read": paged_reader(*case[1:4])}
        for fn in fns.values():
            fn()
        best = _best_alternating(fns, rounds, rep)
        res["page_sweep"].append({"page_size": ps, "ms": best["numba"] * 1e3,
                                  "gbs": gb / best["numba"],
                                  "paged_read_gbs": gb / best["paged_read"]})
        log(f"page size {ps}: {best['numba'] * 1e3:.2f} ms, {gb / best['numba']:.1f} GB/s "
            f"(paged read {gb / best['paged_read']:.1f})")
    bw = res["bandwidth_gbs"] = max(bws)
    res["bandwidth_samples_gbs"] = bws
    for row in res["decode"]:
        # The lower limit, in K/V GB/s: the bus, or the FMA peak over the intensity.
        row["limit_gbs"] = min(bw, peak / row["intensity"])
        row["limit"] = "bandwidth" if bw <= peak / row["intensity"] else "FMA peak"
        row["pct_limit"] = 100 * row["gbs"] / row["limit_gbs"]
        row["pct_bw"] = 100 * row["gbs"] / bw
        row["pct_stream_beside"] = 100 * row["gbs"] / row["stream_gbs"]
        row["pct_paged_read"] = 100 * row["gbs"] / row["paged_read_gbs"]
    log(f"streaming read bandwidth, best of {len(bws)} measurements: {bw:.1f} GB/s")
    p = res["prefill"] = bench_prefill(cfg, log)
    p["limit_gflops"] = min(peak, p["intensity"] * bw)
    p["limit"] = "FMA peak" if peak <= p["intensity"] * bw else "bandwidth"
    p["pct_limit"] = 100 * p["gflops"] / p["limit_gflops"]
    log(f"prefill: {p['pct_limit']:.0f}% of the {p['limit']} limit "
        f"({p['limit_gflops']:.0f} GFLOP/s at {p['intensity']:.0f} FLOP/byte)")
    res["compile"] = compile_times(log)
    return res


def bench_prefill(cfg: dict, log) -> dict:
    """Causal prefill of one prompt: GFLOP/s (QK^T and PV, causal half)."""
    from ..attention import numba_cpu

    T = cfg["prefill_tokens"]
    rng = np.random.default_rng(1)
    n_pages = -(-T // PAGE)
    k = rng.standard_normal((n_pages, HKV, PAGE, D), np.float32)
    v = rng.standard_normal((n_pages, HKV, PAGE, D), np.float32)
    bt = rng.permutation(n_pages).astype(np.int32)[None]  # [1, n_pages]
    q = rng.standard_normal((T, H, D), np.float32)
    sl, qsl = np.array([T], np.int32), np.array([0, T], np.int32)
    flops = 4.0 * H * D * T * (T + 1) / 2  # 2 matmuls x 2 flops per multiply-add
    nbytes = 4 * (2 * T * H * D + 2 * T * HKV * D)  # read q, k, v and write out once
    _settle(2.0)
    fns = {"numba": lambda: numba_cpu.forward(q, k, v, bt, sl, qsl, D**-0.5, 0, False)}
    if cfg["torch"] is not None:
        import torch

        kc = k[bt[0]].transpose(1, 0, 2, 3).reshape(HKV, -1, D)[None, :, :T]
        vc = v[bt[0]].transpose(1, 0, 2, 3).reshape(HKV, -1, D)[None, :, :T]
        tq = torch.from_numpy(q.transpose(1, 0, 2)[None].copy())
        tk, tv = torch.from_numpy(kc.copy()), torch.from_numpy(vc.copy())
        sdpa = torch.nn.functional.scaled_dot_product_attention
        fns["torch"] = lambda: sdpa(tq, tk, tv, is_causal=True, enable_gqa=True)
    for fn in fns.values():
        fn()
    best = _best_alternating(fns, cfg["rounds"] + 1, 2)
    t = best["numba"]
    row = {"tokens": T, "ms": t * 1e3, "gflops": flops / t / 1e9, "intensity": flops / nbytes}
    if "torch" in best:
        row["torch_ms"], row["speedup_vs_torch"] = best["torch"] * 1e3, best["torch"] / t
    log(f"prefill {T} tokens: {row['ms']:.1f} ms, {row['gflops']:.1f} GFLOP/s, "
        f"x{row.get('speedup_vs_torch', float('nan')):.2f} vs torch")
    return row


_PROBE = """
import time, numpy as np
t0 = time.perf_counter()
from paged_np.cli.bench import make_decode_case
from paged_np.attention import numba_cpu
for dt in (np.float32, np.float16):  # every kernel, both page dtypes
    q, k, v, bt, sl, qsl = make_decode_case(32, dt)
    numba_cpu.forward(q, k, v, bt, sl, qsl, 0.1, 0, True)  # decode
    numba_cpu.forward(q[:1], k, v, bt[:1], sl[:1], qsl[:2], 0.1, 0, True,
                      num_splits=2)  # split-K and its merge
qp = np.ones((32, q.shape[1], q.shape[2]), np.float32)  # a prefill chunk on BLAS
numba_cpu.forward(qp, k, v, bt[:1], sl[:1], np.array([0, 32], np.int32), 0.1, 0, True,
                  blas_min_queries=1)
print(time.perf_counter() - t0)
"""


def compile_times(log) -> dict:
    """Import + first call in fresh processes: cold (empty JIT cache), then warm."""
    # the folder that holds the package: paged_np/cli/bench.py -> three levels up
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with tempfile.TemporaryDirectory() as cache_dir:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir,
                   PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
        out = {}
        for kind in ("cold_s", "warm_s"):
            r = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True,
                               text=True, check=True)
            out[kind] = float(r.stdout.strip().splitlines()[-1])
    log(f"JIT: cold compile + first call {out['cold_s']:.1f} s, "
        f"warm cache import + first call {out['warm_s']:.2f} s")
    return out


#: backend name -> function(cfg, log) returning the results dict.
BACKENDS = {"numba": bench_numba}


def write_table(res: dict) -> str:
    """The markdown section of one run: the machine, its two limits, then the tables."""
    bw, peak = res["bandwidth_gbs"], res.get("fma_peak_gflops")
    samples = res.get("bandwidth_samples_gbs", [bw])
    isa, m = res.get("isa", {}), res.get("machine", {})
    lines = [f"### {isa.get('codegen', 'unknown ISA')} code on {isa.get('cpu', m.get('cpu', '?'))}",
             "", f"CPU flags: {isa.get('cpu_isa', '?')} ({' '.join(isa.get('cpu_flags', []))}); "
             f"Numba target `{isa.get('numba_cpu_name', '?')}`"
             + ("" if isa.get("numba_cpu_features", "host") == "host"
                else f" with features `{isa['numba_cpu_features'] or '(none beyond the name)'}`")
             + f"; {m.get('threads', '?')} threads, Numba {m.get('numba', '?')}, "
             f"NumPy {m.get('numpy', '?')}, torch {m.get('torch') or '-'}"
             + (", `--quick`" if m.get("quick") else "")
             + (f"; load average {m['load_average'][0]:.1f} at the start, "
                f"{m['load_average'][1]:.1f} at the end" if m.get("load_average") else "")
             + ".", "",
             f"Limits: streaming read **{bw:.1f} GB/s** (best of {len(samples)} reads in this "
             f"run, median {np.median(samples):.1f}); FMA peak **"
             + (f"{peak:.0f} GFLOP/s**" if peak else "-**") + " float32. "
             f"Decode B={B}, heads {H}/{HKV}, head_dim {D}, page {PAGE}. *FLOP/B*: arithmetic "
             "intensity (FLOP per byte of K/V read); *% of limit*: of the lower of "
             "bandwidth and FMA peak / intensity (*limit* names it). *Paged read*: summing the "
             "same K/V tiles in the same order, no attention arithmetic (the limit of the "
             "access pattern).", "",
             "| pages | context | ms | K/V GB/s | GFLOP/s | FLOP/B | limit | % of limit "
             "| paged read GB/s | % of paged read | vs torch SDPA | vs NumPy kernel |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["decode"]:
        vt = f"{r['speedup_vs_torch']:.2f}x" if "speedup_vs_torch" in r else "-"
        vn = f"{r['speedup_vs_numpy']:.0f}x" if "speedup_vs_numpy" in r else "-"
        lim = r.get("limit", "bandwidth")
        lines.append(f"| {r['dtype']} | {r['context']} | {r['ms']:.2f} | {r['gbs']:.1f} | "
                     f"{r.get('gflops', float('nan')):.1f} | {r.get('intensity', float('nan')):.0f}"
                     f" | {lim} | {r.get('pct_limit', r['pct_bw']):.0f}% | "
                     f"{r['paged_read_gbs']:.1f} | {r['pct_paged_read']:.0f}% | {vt} | {vn} |")
    p = res["prefill"]
    vt = f", {p['speedup_vs_torch']:.2f}x torch SDPA" if "speedup_vs_torch" in p else ""
    lim = (f"; {p['intensity']:.0f} FLOP/B, {p['pct_limit']:.0f}% of the {p['limit']} limit"
           if "pct_limit" in p else "")
    lines += ["", f"Causal prefill, {p['tokens']} tokens: {p['ms']:.0f} ms, "
              f"{p['gflops']:.1f} GFLOP/s{lim}{vt}.", "",
              "| page size | ms | GB/s | paged read GB/s |", "|---|---|---|---|"]
    lines += [f"| {r['page_size']} | {r['ms']:.2f} | {r['gbs']:.1f} | {r['paged_read_gbs']:.1f} |"
              for r in res["page_sweep"]]
    c = res["compile"]
    lines += ["", f"JIT: cold compile of all kernels {c['cold_s']:.1f} s; import + first call "
              f"with a warm cache {c['warm_s']:.2f} s."]
    return "\n".join(lines) + "\n"


def write_results_md(out_dir: str) -> str:
    """``results.md``: one section per ISA measured, from the ``results-<isa>.json`` in ``out_dir``.

    Each run of the bench rewrites the file of the code it ran
    (:func:`isa_key`) and keeps the others, so one machine's AVX-512 run does
    not erase another's AVX2 table.
    """
    names = sorted(f for f in os.listdir(out_dir)
                   if f.startswith("results-") and f.endswith(".json"))
    parts = ["Produced by `python -m paged_np bench`, one section per instruction set it ran "
             "(`NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES=` makes Numba emit AVX2 code on an "
             "AVX-512 machine: *AVX2 codegen on an AVX-512 host*, not AVX2 hardware)."]
    for name in names:
        with open(os.path.join(out_dir, name)) as f:
            parts.append(write_table(json.load(f)))
    text = "\n\n".join(parts) + "\n"
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(text)
    return text


def plot(res: dict, path: str) -> None:
    """The roofline (decode and prefill against both limits), and decode across page sizes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..viz.kernels import draw_roofline

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    points = []
    for r in res["decode"]:
        nbytes = r["gbs"] * 1e9 * r["ms"] / 1e3  # K/V bytes per call
        points.append({"label": f"decode {r['dtype']} ctx {r['context']}", "bytes": nbytes,
                       "flops": nbytes * r["intensity"], "seconds": r["ms"] / 1e3})
    p = res["prefill"]
    points.append({"label": f"causal prefill {p['tokens']}", "seconds": p["ms"] / 1e3,
                   "flops": p["gflops"] * 1e9 * p["ms"] / 1e3,
                   "bytes": p["gflops"] * 1e9 * p["ms"] / 1e3 / p["intensity"]})
    draw_roofline(points, res["bandwidth_gbs"] * 1e9, res["fma_peak_gflops"] * 1e9, ax=ax,
                  title=f"{res['isa']['codegen']}: {res['bandwidth_gbs']:.1f} GB/s, "
                        f"{res['fma_peak_gflops']:.0f} GFLOP/s")
    ps = res["page_sweep"]
    x = np.arange(len(ps))
    ax2.bar(x - 0.2, [r["gbs"] for r in ps], 0.4, label="decode")
    ax2.bar(x + 0.2, [r["paged_read_gbs"] for r in ps], 0.4, label="paged read")
    ax2.axhline(res["bandwidth_gbs"], color="k", lw=1, label="streaming read bandwidth")
    ax2.set_xticks(x, [str(r["page_size"]) for r in ps])
    ax2.set(xlabel="page size", ylabel="GB/s", title="decode at 2048, float32")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m paged_np bench",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes, under a minute")
    ap.add_argument("--backend", default="numba", choices=sorted(BACKENDS))
    ap.add_argument("--out", default=DEFAULT_OUT["bench"],
                    help=f"folder for results (default {DEFAULT_OUT['bench']}; the "
                         f"repository's committed figures are regenerated with --out benchmarks)")
    return ap.parse_args(argv)


def main(argv: list[str]) -> int:
    if any(a == "--model" or a.startswith("--model=") for a in argv):   # a real model
        from .bench_serving import main as bench_model_serving

        return bench_model_serving(argv)
    args = parse_args(argv)
    try:
        import torch

        torch.set_num_threads(numba.get_num_threads())
    except ImportError:
        torch = None
    cfg = {"torch": torch, "repeat": 3 if args.quick else 10, "rounds": 1 if args.quick else 3,
           "contexts": (512, 2048) if args.quick else (512, 2048, 8192),
           "numpy_max_ctx": 512 if args.quick else 2048,
           "page_sizes": (16, 64) if args.quick else (8, 16, 32, 64, 128),
           "prefill_tokens": 512 if args.quick else 2048}
    t0 = time.perf_counter()

    def log(msg):
        print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", flush=True)

    load_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    res = BACKENDS[args.backend](cfg, log)
    res["machine"] = {"cpu": _cpu_model(),
                      "threads": numba.get_num_threads(), "numba": numba.__version__,
                      "numpy": np.__version__, "torch": getattr(torch, "__version__", None),
                      "quick": args.quick, "backend": args.backend,
                      # other work on the machine: the 1-minute load average, start and end
                      "load_average": [load_start, os.getloadavg()[0]] if load_start is not None
                      else None}
    os.makedirs(args.out, exist_ok=True)
    for name in ("results.json", f"results-{isa_key(res['isa'])}.json"):  # latest, per ISA
        with open(os.path.join(args.out, name), "w") as f:
            json.dump(res, f, indent=1)
    write_results_md(args.out)
    plot(res, os.path.join(args.out, "roofline.png"))
    print(write_table(res))
    return 0
