"""``python -m paged_np bench --kv-dtypes``: each kv_cache_dtype's capacity, speed and error.

For every KV page format (:data:`paged_np.registry.KV_FORMATS`, read when
the bench runs: float32, which ``kv_cache_dtype="auto"`` stores, then the
smaller ones) on the bench's decode case (:mod:`.bench_case`: B = 8
sequences, 32 query heads over 8 kv heads of 128, pages of 16 tokens,
shuffled in the arena):

- **capacity**: pages per MiB (scales included) for that shape and for
  SmolLM2-135M's (30 layers, 3 kv heads of 64), and the ratio to float32;
- **decode time** of the Numba kernel at each context, all formats timed in
  alternation in one process (so their ratios hold on a shared machine), and
  the ratio to float32;
- **error**: the decode output against the same attention over the float32
  K/V the pages were made from, ``max|out - ref| / max|ref|``.

Writes ``kv_dtype.json`` and ``kv_dtype.md`` into ``--out`` (``--out benchmarks``
replaces the committed table). ``--quick`` runs context 2048 only.
"""

from __future__ import annotations

import functools
import json
import os

import numpy as np

from ..cache.kv_quant import dequantize, quantize
from ..config import CacheConfig, storage_dtype
from ..hardware import best_time, cpu_model, isa_info, settle, versions
from ..registry import KV_FORMATS
from .bench_case import HKV, B, D, H, make_decode_case

#: The format every ratio is against: what ``kv_cache_dtype="auto"`` stores.
REFERENCE = "float32"
#: (name, num_layers, num_kv_heads, head_dim) of the shapes whose capacity is tabled.
SHAPES = (("bench case (Llama-3-8B-like layer)", 1, HKV, D), ("SmolLM2-135M", 30, 3, 64))


def pages_per_mib(fmt: str, num_layers: int, num_kv_heads: int, head_dim: int,
                  page_size: int = 16) -> float:
    """Pages of ``page_size`` tokens one MiB holds in format ``fmt`` (scales included)."""
    cfg = CacheConfig(num_pages=1, page_size=page_size, num_layers=num_layers,
                      num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=fmt)
    return 2**20 / cfg.bytes_per_page


def _pages(fmt: str, k: np.ndarray, v: np.ndarray):
    """``(k_pages, v_pages, scales kwargs)`` of float32 pages stored in ``fmt``."""
    if CacheConfig(num_pages=1, dtype=fmt).quantized is False:    # a float format
        dt = storage_dtype(fmt)
        return k.astype(dt), v.astype(dt), {}
    (kq, ks), (vq, vs) = quantize(k, fmt), quantize(v, fmt)
    return kq, vq, {"k_scales": ks, "v_scales": vs}


def _rel_err(x, ref) -> float:
    return float(np.abs(x - ref).max() / np.abs(ref).max())


def bench_kv_dtypes(contexts, rounds: int, repeat: int, log) -> dict:
    """Every figure of the table; see the module docstring."""
    from ..attention import numba_cpu

    formats = (REFERENCE, *(f for f in KV_FORMATS if f != REFERENCE))
    res = {"capacity": [], "decode": []}
    for name, layers, hkv, d in SHAPES:
        f32 = pages_per_mib(REFERENCE, layers, hkv, d)
        for fmt in formats:
            ppm = pages_per_mib(fmt, layers, hkv, d)
            res["capacity"].append({"shape": name, "dtype": fmt, "pages_per_mib": ppm,
                                    "vs_float32": ppm / f32,
                                    "tokens_per_gib": ppm * 1024 * 16})
    scale = D**-0.5
    for ctx in contexts:
        q, k, v, bt, sl, qsl = make_decode_case(ctx, np.float32)
        fns, errs, nbytes = {}, {}, {}
        ref = numba_cpu.forward(q, k, v, bt, sl, qsl, scale, 0, False)[0]
        for fmt in formats:
            kp, vp, kw = _pages(fmt, k, v)
            fns[fmt] = functools.partial(numba_cpu.forward, q, kp, vp, bt, sl, qsl, scale, 0,
                                         False, **kw)
            out = fns[fmt]()[0]                               # warm up: compile, first touch
            errs[fmt] = _rel_err(out, ref)
            if kw:   # the kernel equals attention on the dequantized K/V; the rest is the format
                kd, vd = dequantize(kp, kw["k_scales"]), dequantize(vp, kw["v_scales"])
                exact = numba_cpu.forward(q, kd, vd, bt, sl, qsl, scale, 0, False)[0]
                errs[fmt + "_kernel"] = _rel_err(out, exact)
            nbytes[fmt] = kp.nbytes + vp.nbytes + sum(s.nbytes for s in kw.values())
            del kp, vp, kw
        times = {fmt: [] for fmt in fns}                      # best of `repeat`, per round
        for _ in range(rounds):
            for fmt, fn in fns.items():
                settle(0.3)
                times[fmt].append(best_time(fn, repeat, warmup=0))
        best = {fmt: min(t) for fmt, t in times.items()}
        for fmt in formats:
            # Each round times every format back to back: the median of the rounds' ratios
            # is the figure that holds when other work comes and goes between rounds.
            per_round = [t / t32 for t, t32 in zip(times[fmt], times[REFERENCE])]
            row = {"context": ctx, "dtype": fmt, "ms": best[fmt] * 1e3,
                   "vs_float32": float(np.median(per_round)),
                   "vs_float32_best": best[fmt] / best[REFERENCE],
                   "vs_float32_rounds": [round(r, 3) for r in per_round],
                   "gbs": nbytes[fmt] / best[fmt] / 1e9,
                   "rel_error_vs_float32": errs[fmt],
                   "kernel_error_vs_dequantized": errs.get(fmt + "_kernel")}
            res["decode"].append(row)
            log(f"decode ctx {ctx} {fmt}: {row['ms']:.2f} ms (x{row['vs_float32']:.3f} of "
                f"float32), {row['gbs']:.1f} GB/s, error {errs[fmt]:.2e}")
    return res


def write_kv_table(res: dict) -> str:
    """The Markdown of ``kv_dtype.md``."""
    m = res["machine"]
    lines = [
        "# KV cache dtypes: capacity, decode time, error",
        "",
        "Made by `python -m paged_np bench --kv-dtypes --out benchmarks` "
        "(`paged_np/cli/bench_kv.py`).",
        f"Machine: {m['cpu']}, Numba target {m['isa']['numba_cpu_name']} "
        f"({m['isa']['cpu_isa']}), {m['threads']} threads, numba {m['numba']}; "
        f"1-minute load average {m['load_average']} at start and end "
        "(the machine was shared with other work: read the ratios, which come from "
        f"formats timed back to back in each of {m['rounds']} rounds; a round's time of a "
        "format is its best of a few calls).",
        "",
        "## Capacity (scales included), pages of 16 tokens",
        "",
        "| shape | kv_cache_dtype | pages per MiB | tokens per GiB | vs float32 |",
        "|---|---|---|---|---|",
    ]
    for r in res["capacity"]:
        lines.append(f"| {r['shape']} | {r['dtype']} | {r['pages_per_mib']:.2f} | "
                     f"{r['tokens_per_gib']:,.0f} | {r['vs_float32']:.2f}x |")
    lines += [
        "",
        f"## Decode attention, Numba CPU kernel, B = {B}, {H} query heads over {HKV} kv "
        f"heads of {D}",
        "",
        "`error` is `max|out - ref| / max|ref|` against the same attention over the "
        "float32 K/V the pages were made from (random normal K/V; on a real model's K/V see "
        "`kv_scale_granularity.md`); `kernel error` is against attention over the "
        "dequantized K/V, the kernel's own rounding. `vs float32`: the median over the "
        "rounds of the ratio within a round (min-max over rounds beside it); `ms`: the "
        "best round.",
        "",
        "| context | kv_cache_dtype | ms | vs float32 (min-max) | GB/s of K/V read | error | "
        "kernel error |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in res["decode"]:
        kerr = r["kernel_error_vs_dequantized"]
        lines.append(f"| {r['context']} | {r['dtype']} | {r['ms']:.2f} | "
                     f"{r['vs_float32']:.3f}x ({min(r['vs_float32_rounds']):.2f}-"
                     f"{max(r['vs_float32_rounds']):.2f}) | {r['gbs']:.1f} | "
                     f"{r['rel_error_vs_float32']:.1e} | "
                     f"{'-' if kerr is None else f'{kerr:.1e}'} |")
    return "\n".join(lines) + "\n"


def run(out_dir: str, quick: bool, log) -> int:
    """Measure, write ``kv_dtype.json`` and ``kv_dtype.md`` into ``out_dir``, print the table."""
    rounds, repeat = (2, 2) if quick else (9, 3)
    load = [os.getloadavg()[0]] if hasattr(os, "getloadavg") else []
    res = bench_kv_dtypes((2048,) if quick else (2048, 8192), rounds, repeat, log)
    if load:
        load.append(os.getloadavg()[0])
    res["machine"] = {"cpu": cpu_model(), "isa": isa_info(), **versions(), "quick": quick,
                      "rounds": rounds, "load_average": [round(x, 2) for x in load] or None}
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "kv_dtype.json"), "w") as f:
        json.dump(res, f, indent=1)
    table = write_kv_table(res)
    with open(os.path.join(out_dir, "kv_dtype.md"), "w") as f:
        f.write(table)
    print(table)
    return 0
