"""The bench's report: the markdown tables of ``results.md`` (one section per instruction
set measured) and the roofline figure, from the results of
:func:`paged_np.cli.bench.bench_numba` (which imports this module, never the reverse)."""

from __future__ import annotations

import json
import os

import numpy as np

from .bench_case import HKV, PAGE, B, D, H


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
             "| pages | K layout | context | ms | K/V GB/s | GFLOP/s | FLOP/B | limit "
             "| % of limit | paged read GB/s | % of paged read | vs torch SDPA | vs NumPy kernel |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["decode"]:
        vt = f"{r['speedup_vs_torch']:.2f}x" if "speedup_vs_torch" in r else "-"
        vn = f"{r['speedup_vs_numpy']:.0f}x" if "speedup_vs_numpy" in r else "-"
        lim = r.get("limit", "bandwidth")
        lines.append(f"| {r['dtype']} | {r.get('layout', 'hnd')} | {r['context']} | "
                     f"{r['ms']:.2f} | {r['gbs']:.1f} | "
                     f"{r.get('gflops', float('nan')):.1f} | {r.get('intensity', float('nan')):.0f}"
                     f" | {lim} | {r.get('pct_limit', r['pct_bw']):.0f}% | "
                     f"{r['paged_read_gbs']:.1f} | {r['pct_paged_read']:.0f}% | {vt} | {vn} |")
    p = res["prefill"]
    vt = f", {p['speedup_vs_torch']:.2f}x torch SDPA" if "speedup_vs_torch" in p else ""
    if "k_transposed_ms" in p:  # the transposed-K layout's prefill (the kernel path)
        vt += (f"; K transposed: {p['k_transposed_ms']:.0f} ms"
               + (f", {p['k_transposed_vs_torch']:.2f}x SDPA" if "k_transposed_vs_torch" in p
                  else ""))
    lim = (f"; {p['intensity']:.0f} FLOP/B, {p['pct_limit']:.0f}% of the {p['limit']} limit"
           if "pct_limit" in p else "")
    lines += ["", f"Causal prefill, {p['tokens']} tokens: {p['ms']:.0f} ms, "
              f"{p['gflops']:.1f} GFLOP/s{lim}{vt}.", "",
              "Decode at context 2048, float32, by page size (K/V GB/s):", "",
              "| page size | " + " | ".join(_layouts(res)) + " | paged read |",
              "|---|" + "---|" * len(_layouts(res)) + "---|"]
    lines += [f"| {r['page_size']} | " + " | ".join(f"{r[f'gbs_{x}']:.1f}" for x in _layouts(res))
              + f" | {r['paged_read_gbs']:.1f} |" for r in res["page_sweep"]]
    c = res["compile"]
    lines += ["", f"JIT: cold compile of all kernels {c['cold_s']:.1f} s; import + first call "
              f"with a warm cache {c['warm_s']:.2f} s."]
    return "\n".join(lines) + "\n"


def _layouts(res: dict) -> list:
    """The K layouts the page sweep measured (``gbs_<layout>`` columns; a run from before
    there were layouts has one ``gbs``, of the HND kernel)."""
    for r in res["page_sweep"]:
        if "gbs" in r:
            r["gbs_hnd"] = r.pop("gbs")
    return [k[4:] for k in (res["page_sweep"] or [{}])[0] if k.startswith("gbs_")]


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
        points.append({"label": f"decode {r['dtype']} {r.get('layout', 'hnd')} ctx {r['context']}",
                       "bytes": nbytes,
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
    layouts = _layouts(res)
    width = 0.8 / (len(layouts) + 1)
    for i, name in enumerate(layouts + ["paged read"]):
        key = "paged_read_gbs" if name == "paged read" else f"gbs_{name}"
        ax2.bar(x - 0.4 + width * (i + 0.5), [r[key] for r in ps], width,
                label=name if name == "paged read" else f"decode, K {name}")
    ax2.axhline(res["bandwidth_gbs"], color="k", lw=1, label="streaming read bandwidth")
    ax2.set_xticks(x, [str(r["page_size"]) for r in ps])
    ax2.set(xlabel="page size", ylabel="GB/s", title="decode at 2048, float32")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
