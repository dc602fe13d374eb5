"""The quantized kernels one by one: SmolLM2's real matrices, float32 BLAS beside them.

    python benchmarks/quant_kernels.py [--threads 1] [--rounds 5]

Writes ``benchmarks/quant_kernels.md``. For each input row count T (1-3: the
``rows`` kernel; from 4: ``batch``) it times one pass over the 30 layers'
four fused projections and the tied LM head, held as the file's blocks
(Q4_1 projections, Q8_0 head) and as float32 (BLAS), alternating, and
reports the best pass of ``--rounds``. Four ablations beside them: the
``rows`` kernel at every T (why ``batch`` takes over at 4); ``batch`` with
one input row and eight weights per pass over the accumulators instead of
four rows and four weights (:func:`one_row_batch`, the Q4 projections); the
batch kernel the package did not pick for this CPU (``batch`` where it runs
``batch_registers``, with 16 vector registers, and the other way round with 32);
and every matrix repacked with 64 lanes, where the package gives 128 to those
whose row count allows it (the kernels take the lane count from the array's
shape). ``--out`` names the table (default ``benchmarks/quant_kernels.md``).
"""

from __future__ import annotations

import argparse
import operator
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
from numba import njit, prange

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # this checkout's paged_np

import paged_np as pnp  # noqa: E402
from paged_np.cli.machine import cpu_model, isa_info  # noqa: E402
from paged_np.config import JIT_OPTIONS  # noqa: E402
from paged_np.models.blas import pinned_threads  # noqa: E402
from paged_np.quant import FEW_ROWS, QuantMatrix  # noqa: E402
from paged_np.quant import kernels as K  # noqa: E402
from paged_np.quant.matrix import BATCH_KERNEL  # noqa: E402


@njit(**JIT_OPTIONS)
def _one_row_tile(w, x, base, t0, t1, acc):
    """The ablation of ``kernels._multiply_tile``: one row, eight weights per pass."""
    for t in range(t0, t1):
        a = acc[t - t0]
        for j in range(base, base + 32, 8):
            x0, x1, x2, x3 = x[t, j], x[t, j + 1], x[t, j + 2], x[t, j + 3]
            x4, x5, x6, x7 = x[t, j + 4], x[t, j + 5], x[t, j + 6], x[t, j + 7]
            i = j - base
            w0, w1, w2, w3, w4, w5, w6, w7 = (w[i], w[i + 1], w[i + 2], w[i + 3], w[i + 4],
                                              w[i + 5], w[i + 6], w[i + 7])
            for r in range(w.shape[1]):
                a[r] += (w0[r] * x0 + w1[r] * x1 + w2[r] * x2 + w3[r] * x3
                         + w4[r] * x4 + w5[r] * x5 + w6[r] * x6 + w7[r] * x7)


@njit(parallel=True, **JIT_OPTIONS)
def _one_row_q4(qs, d, m, x, y):
    G, nb, _, R = qs.shape
    for g in prange(G):
        w = np.empty((32, R), np.float32)
        acc = np.empty((K.BATCH, R), np.float32)
        for t0 in range(0, x.shape[0], K.BATCH):
            t1 = min(x.shape[0], t0 + K.BATCH)
            acc[:] = 0.0
            for b in range(nb):
                K.dequantize_q4_block(qs, d, m, g, b, w)
                _one_row_tile(w, x, b * 32, t0, t1, acc)
            for t in range(t0, t1):
                y[t, g * R:(g + 1) * R] = acc[t - t0]


def one_row_batch(x, qm):
    """``x @ qm`` through :func:`_one_row_q4` (Q4 matrices only)."""
    y = np.empty((x.shape[0], qm.qs.shape[0] * qm.qs.shape[3]), np.float32)
    _one_row_q4(qm.qs, qm.d, qm.m, x, y)
    return y


def rows_only(x, qm):
    """``x @ qm`` through the ``rows`` kernel whatever T is."""
    y = np.empty((x.shape[0], qm.qs.shape[0] * qm.qs.shape[3]), np.float32)
    K.rows(qm.qs, qm.d, qm.m, x, y)
    return y


OTHER_BATCH = K.batch if BATCH_KERNEL is K.batch_registers else K.batch_registers


def other_batch(x, qm):
    """``x @ qm`` with the batch kernel :data:`BATCH_KERNEL` did not pick (from 4 rows)."""
    if x.shape[0] <= FEW_ROWS:
        return x @ qm
    y = np.empty((x.shape[0], qm.qs.shape[0] * qm.qs.shape[3]), np.float32)
    OTHER_BATCH(qm.qs, qm.d, qm.m, x, y)
    return y[:, :qm.shape[1]]


def with_lanes(qm: QuantMatrix, lanes: int) -> QuantMatrix:
    """The same weights regrouped ``lanes`` output rows per group (128 or 64 -> 64)."""
    G, nb, j, R = qm.qs.shape
    k = R // lanes

    def split(a):                                            # [G, nb, x, R] -> [G*k, nb, x, lanes]
        return np.ascontiguousarray(a.reshape(G, nb, -1, k, lanes).transpose(0, 3, 1, 2, 4)
                                    .reshape(G * k, nb, -1, lanes))

    def split2(a):                                           # [G, nb, R] -> [G*k, nb, lanes]
        return None if a is None else split(a[:, :, None])[:, :, 0]

    return QuantMatrix(qm.fmt, qm.shape, qs=split(qm.qs), d=split2(qm.d), m=split2(qm.m))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 64, 110])
    ap.add_argument("--out", default=str(Path(__file__).parent / "quant_kernels.md"))
    args = ap.parse_args(argv)
    model, _ = pnp.load_model("smollm2-135m-instruct")
    proj = [*model.wqkv, *model.w["wo"], *model.w_gate_up, *model.w["w_down"]]
    head = model.w["embed"]
    sets = {"quantized": proj + [head],
            "float32": [np.asarray(m) for m in proj] + [np.asarray(head)],
            "rows kernel": proj + [head],
            "one row per pass": proj + [head],
            "other batch kernel": proj + [head],
            "64 lanes everywhere": [with_lanes(m, 64) for m in proj] + [with_lanes(head, 64)]}
    how = {"rows kernel": rows_only,
           "one row per pass": lambda x, m: one_row_batch(x, m) if m.fmt != "Q8_0" else x @ m,
           "other batch kernel": other_batch}
    nbytes = {k: sum(m.nbytes for m in v) for k, v in sets.items()}
    rng = np.random.default_rng(0)
    out = Path(args.out)
    out_arg = "" if out.name == "quant_kernels.md" else f" --out benchmarks/{out.name}"
    lines = ["# Quantized kernels, one pass over SmolLM2-135M's matrices", "",
             f"`python benchmarks/quant_kernels.py --threads {args.threads}{out_arg}`. Machine: "
             f"{cpu_model()}, {os.cpu_count()} cores, {isa_info()['codegen']}, "
             f"{args.threads} thread(s), NumPy {np.__version__}, Python "
             f"{platform.python_version()}; shared with other jobs, so read the ratios. "
             "One pass: the 120 projections and the tied LM head "
             f"({nbytes['quantized'] / 2**20:.0f} MiB quantized, "
             f"{nbytes['float32'] / 2**20:.0f} MiB float32); best of "
             f"{args.rounds} alternating rounds.", "",
             "| rows T | kernel | quantized ms | float32 ms | float32 / quantized | "
             f"rows kernel ms | one row per pass ms | {OTHER_BATCH.__name__} ms | "
             "64 lanes everywhere ms | quantized GB/s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    with pinned_threads(args.threads):
        for T in args.rows:
            xs = {k: rng.standard_normal((T, k), dtype=np.float32) for k in (576, 1536)}
            best = dict.fromkeys(sets, np.inf)
            for _ in range(args.rounds + 1):                  # the first round compiles
                for name, mats in sets.items():
                    t0 = time.perf_counter()
                    mul = how.get(name, operator.matmul)
                    for m in mats:
                        mul(xs[m.shape[0]], m)
                    best[name] = min(best[name], time.perf_counter() - t0)
            kernel = "rows" if T <= FEW_ROWS else BATCH_KERNEL.__name__
            q, f = best["quantized"], best["float32"]
            lines.append(f"| {T} | {kernel} | {1e3 * q:.1f} | {1e3 * f:.1f} | {f / q:.2f}x | "
                         f"{1e3 * best['rows kernel']:.1f} | "
                         f"{1e3 * best['one row per pass']:.1f} | "
                         f"{1e3 * best['other batch kernel']:.1f} | "
                         f"{1e3 * best['64 lanes everywhere']:.1f} | "
                         f"{nbytes['quantized'] / q / 1e9:.1f} |")
            print(lines[-1], flush=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
