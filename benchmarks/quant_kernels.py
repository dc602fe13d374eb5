"""The quantized kernels one by one: SmolLM2's real matrices, float32 BLAS beside them.

    python benchmarks/quant_kernels.py [--threads 1] [--rounds 5]

Writes ``benchmarks/quant_kernels.md``. For each input row count T (1: decode;
2-16: the few-row kernel; 64: panel + BLAS) it times one pass over the 30
layers' four fused projections and the tied LM head, held as the file's
blocks (Q4_1 projections, Q8_0 head) and as float32 (BLAS), alternating, and
reports the best pass of ``--rounds``. It also repacks the Q4_1 projections
with 32 lanes instead of 64 (the kernels take the lane count from the
array's shape) to show why the layout has 64.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # this checkout's paged_np

import paged_np as pnp  # noqa: E402
from paged_np.cli.machine import cpu_model, isa_info  # noqa: E402
from paged_np.models.blas import pinned_threads  # noqa: E402
from paged_np.quant import QuantMatrix  # noqa: E402


def with_lanes(qm: QuantMatrix, lanes: int) -> QuantMatrix:
    """The same Q4 weights regrouped ``lanes`` output rows per group (64 -> 32)."""
    G, nb, j, R = qm.qs.shape
    k = R // lanes

    def split(a):                                            # [G, nb, x, R] -> [G*k, nb, x, lanes]
        return np.ascontiguousarray(a.reshape(G, nb, -1, k, lanes).transpose(0, 3, 1, 2, 4)
                                    .reshape(G * k, nb, -1, lanes))

    return QuantMatrix(qm.fmt, qm.shape, qs=split(qm.qs), d=split(qm.d[:, :, None])[:, :, 0],
                       m=split(qm.m[:, :, None])[:, :, 0])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 64])
    args = ap.parse_args(argv)
    model, _ = pnp.load_model("smollm2-135m-instruct")
    proj = [*model.wqkv, *model.w["wo"], *model.w_gate_up, *model.w["w_down"]]
    sets = {"quantized": proj + [model.w["embed"]],
            "float32": [np.asarray(m) for m in proj] + [np.asarray(model.w["embed"])],
            "Q4_1 with 32 lanes": [with_lanes(m, 32) for m in proj] + [model.w["embed"]]}
    nbytes = {k: sum(m.nbytes for m in v) for k, v in sets.items()}
    rng = np.random.default_rng(0)
    lines = ["# Quantized kernels, one pass over SmolLM2-135M's matrices", "",
             f"`python benchmarks/quant_kernels.py --threads {args.threads}`. Machine: "
             f"{cpu_model()}, {os.cpu_count()} cores, {isa_info()['codegen']}, "
             f"{args.threads} thread(s), NumPy {np.__version__}, Python "
             f"{platform.python_version()}; shared with other jobs, so read the ratios. "
             "One pass: the 120 projections and the tied LM head "
             f"({nbytes['quantized'] / 2**20:.0f} MiB quantized, "
             f"{nbytes['float32'] / 2**20:.0f} MiB float32); best of "
             f"{args.rounds} alternating rounds.", "",
             "| rows T | kernel | quantized ms | float32 ms | float32 / quantized | "
             "Q4_1 32 lanes ms | quantized GB/s |", "|---|---|---|---|---|---|---|"]
    with pinned_threads(args.threads):
        for T in args.rows:
            xs = {k: rng.standard_normal((T, k), dtype=np.float32) for k in (576, 1536)}
            best = dict.fromkeys(sets, np.inf)
            for _ in range(args.rounds + 1):                  # the first round compiles
                for name, mats in sets.items():
                    t0 = time.perf_counter()
                    for m in mats:
                        xs[m.shape[0]] @ m
                    best[name] = min(best[name], time.perf_counter() - t0)
            kernel = "rows" if T <= 16 else "panel + BLAS"
            q, f, r32 = best["quantized"], best["float32"], best["Q4_1 with 32 lanes"]
            lines.append(f"| {T} | {kernel} | {1e3 * q:.1f} | {1e3 * f:.1f} | {f / q:.2f}x | "
                         f"{1e3 * r32:.1f} | {nbytes['quantized'] / q / 1e9:.1f} |")
            print(lines[-1], flush=True)
    out = Path(__file__).parent / "quant_kernels.md"
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
