"""``python -m paged_np bench``: how fast is paged attention, against what limit?

Decode reads every cached K and V value once and does two multiply-adds per
value and query head, so on a CPU its speed limit is the memory bus, not the
arithmetic. The bench therefore first measures that limit (a parallel Numba sum
over 512 MiB: the streaming read bandwidth), then reports decode as *effective
GB/s of K/V read* and as a percentage of it. Prefill is arithmetic-bound and is
reported in GFLOP/s. PyTorch's ``scaled_dot_product_attention`` (when torch is
installed, same thread count, K/V contiguous) and the NumPy teaching kernel
run on the same data, in the same process, so the ratios hold on a noisy machine.

Usage::

    python -m paged_np bench            # full run, a few minutes
    python -m paged_np bench --quick    # under a minute
    python -m paged_np bench --backend numba --out benchmarks

Writes ``results.json``, ``results.md`` and ``roofline.png`` into ``--out``
(default ``paged_np_out/bench/``; ``--out benchmarks`` replaces the
repository's committed results, which is how they are made).
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
            row = {"dtype": np.dtype(dtype).name, "context": ctx, "ms": t * 1e3,
                   "gbs": gb / t, "paged_read_gbs": gb / best["paged_read"]}
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
        row["pct_bw"] = 100 * row["gbs"] / bw
        row["pct_stream_beside"] = 100 * row["gbs"] / row["stream_gbs"]
        row["pct_paged_read"] = 100 * row["gbs"] / row["paged_read_gbs"]
    log(f"streaming read bandwidth, best of {len(bws)} measurements: {bw:.1f} GB/s")
    res["prefill"] = bench_prefill(cfg, log)
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
    row = {"tokens": T, "ms": t * 1e3, "gflops": flops / t / 1e9}
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
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
    """The markdown table the README quotes."""
    bw = res["bandwidth_gbs"]
    samples = res.get("bandwidth_samples_gbs", [bw])
    lines = [f"Streaming read bandwidth: **{bw:.1f} GB/s**, the best of {len(samples)} reads "
             f"in this run (median {np.median(samples):.1f}). Decode B={B}, heads {H}/{HKV}, "
             f"head_dim {D}, page {PAGE}. *% of bw*: of the best read; *% beside*: of the read "
             "measured right after the case. *Paged read*: summing the same K/V tiles in the "
             "same order, no attention arithmetic (the limit of the access pattern).", "",
             "| pages | context | ms | K/V GB/s | % of bw | % beside | paged read GB/s "
             "| % of paged read | vs torch SDPA | vs NumPy kernel |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["decode"]:
        vt = f"{r['speedup_vs_torch']:.2f}x" if "speedup_vs_torch" in r else "-"
        vn = f"{r['speedup_vs_numpy']:.0f}x" if "speedup_vs_numpy" in r else "-"
        lines.append(f"| {r['dtype']} | {r['context']} | {r['ms']:.2f} | {r['gbs']:.1f} | "
                     f"{r['pct_bw']:.0f}% | {r.get('pct_stream_beside', float('nan')):.0f}% | "
                     f"{r['paged_read_gbs']:.1f} | "
                     f"{r['pct_paged_read']:.0f}% | {vt} | {vn} |")
    p = res["prefill"]
    vt = f", {p['speedup_vs_torch']:.2f}x torch SDPA" if "speedup_vs_torch" in p else ""
    lines += ["", f"Causal prefill, {p['tokens']} tokens: {p['ms']:.0f} ms, "
              f"{p['gflops']:.1f} GFLOP/s{vt}.", "",
              "| page size | ms | GB/s | paged read GB/s |", "|---|---|---|---|"]
    lines += [f"| {r['page_size']} | {r['ms']:.2f} | {r['gbs']:.1f} | {r['paged_read_gbs']:.1f} |"
              for r in res["page_sweep"]]
    c = res["compile"]
    lines += ["", f"JIT: cold compile of all kernels {c['cold_s']:.1f} s; import + first call "
              f"with a warm cache {c['warm_s']:.2f} s."]
    return "\n".join(lines) + "\n"


def plot(res: dict, path: str) -> None:
    """Roofline-style picture: decode GB/s per context against the bandwidth line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for dt in ("float32", "float16"):
        rows = [r for r in res["decode"] if r["dtype"] == dt]
        ax.plot([r["context"] for r in rows], [r["gbs"] for r in rows], "o-", label=f"numba {dt}")
    rows = [r for r in res["decode"] if "torch_ms" in r]
    if rows:  # torch read the same float32 bytes
        ax.plot([r["context"] for r in rows], [r["gbs"] * r["speedup_vs_torch"] ** -1
                                               for r in rows], "s--", label="torch SDPA")
    ax.plot([r["context"] for r in res["decode"] if r["dtype"] == "float32"],
            [r["paged_read_gbs"] for r in res["decode"] if r["dtype"] == "float32"], "k:",
            label="paged read (same tiles, no arithmetic)")
    ax.axhline(res["bandwidth_gbs"], color="k", lw=1, label="streaming read bandwidth")
    ax.set(xscale="log", xlabel="context (tokens)", ylabel="effective K/V GB/s",
           title="decode vs the memory bus")
    ax.legend(fontsize=8)
    ps = res["page_sweep"]
    x = np.arange(len(ps))
    ax2.bar(x - 0.2, [r["gbs"] for r in ps], 0.4, label="decode")
    ax2.bar(x + 0.2, [r["paged_read_gbs"] for r in ps], 0.4, label="paged read")
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

    res = BACKENDS[args.backend](cfg, log)
    res["machine"] = {"cpu": platform.processor() or platform.machine(),
                      "threads": numba.get_num_threads(), "numba": numba.__version__,
                      "numpy": np.__version__, "torch": getattr(torch, "__version__", None),
                      "quick": args.quick, "backend": args.backend}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(res, f, indent=1)
    table = write_table(res)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(table)
    plot(res, os.path.join(args.out, "roofline.png"))
    print(table)
    return 0
