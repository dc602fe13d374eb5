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
A decode call keeps its plan (``plans=``) from one call to the next, as a model's
layers share the plan of their step (:class:`paged_np.attention.AttentionMetadata`):
the time is a layer's; the first layer of a step also makes the plan.

Usage::

    python -m paged_np bench            # full run, a few minutes
    python -m paged_np bench --quick    # under a minute
    python -m paged_np bench --backend numba --out benchmarks
    python -m paged_np bench --kv-dtypes    # each kv_cache_dtype: capacity, time, error

Writes ``results.json`` (this run), ``results-<isa>.json`` (this run, kept per
instruction set: see :func:`isa_key`), ``results.md`` (one section per
``results-*.json`` there) and ``roofline.png`` into ``--out`` (default
``paged_np_out/bench/``; ``--out benchmarks`` replaces the repository's
committed results, which is how they are made).
Times are the best of several repeats (the least disturbed run).

The layers, each importing only those below it: :mod:`paged_np.hardware`
measures the limits, :mod:`paged_np.cli.bench_case` makes the decode case,
:mod:`paged_np.cli.bench_report` writes the tables and the figure; this module
runs the cases on top of them (their names are importable from here too), and
hands ``--model`` to :mod:`paged_np.cli.bench_serving` and ``--kv-dtypes`` to
:mod:`paged_np.cli.bench_kv`.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time

import numba
import numpy as np

from ..hardware import (
    best_time,
    cpu_model,
    fma_peak,
    isa_info,
    isa_key,
    paged_reader,
    settle,
    stream_bandwidth,
    versions,
)
from ..registry import KV_LAYOUTS
from . import DEFAULT_OUT
from .bench_case import HKV, PAGE, B, D, H, make_decode_case
from .bench_report import plot, write_results_md, write_table


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
            settle()
            best[name] = min(best[name], best_time(fn, repeat, warmup=0))
    return best


def bench_numba(cfg: dict, log) -> dict:
    """Every figure for the Numba CPU backend; ``cfg`` sets sizes and repeats."""
    from ..attention import numba_cpu

    res = {"decode": [], "page_sweep": [], "prefill": {}}
    torch = cfg["torch"]
    np_forward = _numpy_forward()
    res["isa"] = isa_info()
    log(f"CPU {res['isa']['cpu']} ({res['isa']['cpu_isa']}); Numba target "
        f"{res['isa']['numba_cpu_name']}, code: {res['isa']['codegen']}")
    settle()
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
            k_t = np.ascontiguousarray(k.transpose(0, 1, 3, 2))  # the same keys, [D, page]
            gb = 2 * B * HKV * ctx * D * k.itemsize / 1e9  # K and V bytes read
            fns = {"paged_read": paged_reader(k, v, bt)}
            for layout in KV_LAYOUTS.names():  # each layout's kernel, on the same keys
                kp = k_t if layout == "k_transposed" else k
                fns[layout] = functools.partial(numba_cpu.forward, q, kp, v, bt, sl, qsl,
                                                scale, 0, False, kv_layout=layout, plans={})
            if torch is not None and dtype is np.float32:
                fns["torch"] = _torch_decode(q, k, v, bt, sl)
            for fn in fns.values():  # warm up (compile, first touch)
                fn()
            best = _best_alternating(fns, rounds, rep)
            # The VM's bandwidth drifts (35-59 GB/s within one run was seen): keep the
            # read measured right beside this case too, for a like-for-like ratio.
            bws.append(stream_bandwidth(max(2, cfg["repeat"] // 2)))
            tn = None
            if np_forward is not None and ctx <= cfg["numpy_max_ctx"]:
                tn = best_time(functools.partial(np_forward, *case, scale, 0, False), 1)
            for layout in KV_LAYOUTS.names():
                t = best[layout]
                flops = 4 * B * H * ctx * D  # q.k and p.v: a multiply-add per K/V value per head
                row = {"dtype": np.dtype(dtype).name, "layout": layout, "context": ctx,
                       "ms": t * 1e3, "gbs": gb / t, "paged_read_gbs": gb / best["paged_read"],
                       "gflops": flops / t / 1e9, "intensity": flops / (gb * 1e9),
                       "stream_gbs": bws[-1]}
                if "torch" in best:
                    row["torch_ms"] = best["torch"] * 1e3
                    row["speedup_vs_torch"] = best["torch"] / t
                if tn is not None:
                    row["numpy_ms"], row["speedup_vs_numpy"] = tn * 1e3, tn / t
                res["decode"].append(row)
                log(f"decode {row['dtype']} {layout} ctx {ctx}: {row['ms']:.2f} ms, "
                    f"{row['gbs']:.1f} GB/s (paged read {row['paged_read_gbs']:.1f}, stream "
                    f"{bws[-1]:.1f}), x{row.get('speedup_vs_torch', float('nan')):.2f} vs torch, "
                    f"x{row.get('speedup_vs_numpy', float('nan')):.1f} vs numpy")
    gb = 2 * B * HKV * 2048 * D * 4 / 1e9
    for ps in cfg["page_sizes"]:
        fns = {"paged_read": paged_reader(*make_decode_case(2048, np.float32, page_size=ps)[1:4])}
        for layout in KV_LAYOUTS.names():
            case = make_decode_case(2048, np.float32, page_size=ps, kv_layout=layout)
            fns[layout] = functools.partial(numba_cpu.forward, *case, scale, 0, False,
                                            kv_layout=layout)
        for fn in fns.values():
            fn()
        best = _best_alternating(fns, rounds, rep)
        row = {"page_size": ps, "paged_read_gbs": gb / best["paged_read"]}
        row.update({f"gbs_{layout}": gb / best[layout] for layout in KV_LAYOUTS.names()})
        res["page_sweep"].append(row)
        log(f"page size {ps}: " + ", ".join(f"{layout} {gb / best[layout]:.1f} GB/s"
                                           for layout in KV_LAYOUTS.names())
            + f" (paged read {gb / best['paged_read']:.1f})")
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
    settle(2.0)
    k_t = np.ascontiguousarray(k.transpose(0, 1, 3, 2))  # the same keys, [D, page]
    fns = {"numba": lambda: numba_cpu.forward(q, k, v, bt, sl, qsl, D**-0.5, 0, False),
           "k_transposed": lambda: numba_cpu.forward(q, k_t, v, bt, sl, qsl, D**-0.5, 0, False,
                                                     kv_layout="k_transposed")}
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
    row["k_transposed_ms"] = best["k_transposed"] * 1e3
    if "torch" in best:
        row["torch_ms"], row["speedup_vs_torch"] = best["torch"] * 1e3, best["torch"] / t
        row["k_transposed_vs_torch"] = best["torch"] / best["k_transposed"]
    log(f"prefill {T} tokens: {row['ms']:.1f} ms, {row['gflops']:.1f} GFLOP/s, "
        f"x{row.get('speedup_vs_torch', float('nan')):.2f} vs torch; K transposed "
        f"{row['k_transposed_ms']:.1f} ms, x{row.get('k_transposed_vs_torch', float('nan')):.2f}")
    return row


_PROBE = """
import time, numpy as np
t0 = time.perf_counter()
from paged_np.cli.bench_case import make_decode_case
from paged_np.attention import numba_cpu
for dt in (np.float32, np.float16):  # every kernel, both page dtypes
    q, k, v, bt, sl, qsl = make_decode_case(32, dt)
    numba_cpu.forward(q, k, v, bt, sl, qsl, 0.1, 0, True)  # decode
    numba_cpu.forward(q[:1], k, v, bt[:1], sl[:1], qsl[:2], 0.1, 0, True,
                      num_splits=2)  # split-K and its merge
    kt = np.ascontiguousarray(k.transpose(0, 1, 3, 2))  # the transposed-K layout's tiles
    numba_cpu.forward(q, kt, v, bt, sl, qsl, 0.1, 0, True, kv_layout="k_transposed")
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


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m paged_np bench",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes, under a minute")
    ap.add_argument("--backend", default="numba", choices=sorted(BACKENDS))
    ap.add_argument("--kv-dtypes", action="store_true",
                    help="only the kv_cache_dtype table: capacity, decode time and error of "
                         "float32, float16, int8 and fp8_e4m3 pages (kv_dtype.md)")
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

    if args.kv_dtypes:
        from .bench_kv import run as bench_kv_dtypes

        return bench_kv_dtypes(args.out, args.quick, log)

    load_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    res = BACKENDS[args.backend](cfg, log)
    res["machine"] = {"cpu": cpu_model(), **versions(),
                      "torch": getattr(torch, "__version__", None),
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
