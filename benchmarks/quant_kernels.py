"""The quantized kernels one by one: SmolLM2's real matrices, float32 BLAS beside them.

    python benchmarks/quant_kernels.py [--threads 1] [--rounds 5]

Writes ``benchmarks/quant_kernels.md``. For each input row count T (1-3: the
``rows`` kernel; from 4: ``batch``) it times one pass over the 30 layers'
four fused projections and the tied LM head, held as the file's blocks
(Q4_1 projections, Q8_0 head) and as float32 (BLAS), alternating, and
reports the best pass of ``--rounds``. Five ablations beside them:
``rows`` as it was before its rows shared each conversion
(:func:`per_row_rows`: every input row converts the codes again), run at
every T (why ``batch`` takes over at 4, and what sharing saves at 2-3); the batch kernel
as it was before every row got the bits of a one-row product
(:func:`dequantized_tile_batch`: each block dequantized to ``d q + m`` in the
tile, the sums carried across blocks, no scale per block: fewer operations,
another rounding); ``batch`` with each thread taking whole groups of output rows
(:func:`whole_groups`, as before the threads shared a group's strips: SmolLM2's 576-row
matrices have 9 groups, 5 for one thread and 4 for the other); ``batch`` with each
block's codes converted into the tile before its passes and no prefetch
(:func:`tile_first`, as before the first pass converted them); and the matrices
whose row count allows it (fused gate/up, the LM head) repacked with 128 lanes,
as the package did before all had 64 (the kernels take the lane count from the
matrix's record, ``GroupedBlocks.lanes``). ``--out`` names the table (default
``benchmarks/quant_kernels.md``).

    python benchmarks/quant_kernels.py --ir [--ref bdde226]

A noise-free proxy instead of timings (:func:`ir_report`): compiles ``batch`` for each
kind of codes (Q4_1, Q8_0) here and at the git revision ``--ref`` (default bdde226, the
kernels before they took records), checks that both give the same bits at ``--rows``
(default 9 and 16: one compiled body serves every T), and counts what the compiled
loops do: the fma calls in the LLVM IR, and in the assembly each innermost loop that
multiplies, its instructions and ``vfmadd``s per iteration. The hot loops are the
passes that read the tile (every pass but a block's first).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import operator
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numba
import numpy as np
from numba import njit, prange

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # this checkout's paged_np

import paged_np as pnp  # noqa: E402
from paged_np.config import JIT_OPTIONS  # noqa: E402
from paged_np.hardware import cpu_model, isa_info  # noqa: E402
from paged_np.models.blas import pinned_threads  # noqa: E402
from paged_np.quant import FEW_ROWS, Q4, QuantMatrix  # noqa: E402
from paged_np.quant import kernels as K  # noqa: E402
from paged_np.quant import passes as P  # noqa: E402
from paged_np.quant.layouts import GroupedBlocks, codes_kind  # noqa: E402
from paged_np.quant.simd import fma, load_f32, splat, store_f32  # noqa: E402


# ------------------------------------ the ablation: codes converted per row
@njit(parallel=True, **JIT_OPTIONS)
def per_row_rows(w, x, y):
    """The ``rows`` kernel before its rows shared the codes' conversion: the same
    operations per row (``K._block_dot``), each input row converting the block's codes
    again; any T."""
    R = w.lanes
    T, N = x.values.shape[0], y.shape[1]
    yf = y.reshape(y.size)
    for g in prange(w.groups):
        acc = np.zeros(T * R, np.float32)                        # [T, R]
        for b in range(w.blocks):
            blk = K.block_at(w, g, b)
            for t in range(T):
                for c in range(0, R, 64):
                    s0, s1, s2, s3 = K._block_dot(w, blk, c, x, t)
                    P.scale_into(acc, t, c, s0, w, blk, x, t)
                    P.scale_into(acc, t, c + 16, s1, w, blk, x, t)
                    P.scale_into(acc, t, c + 32, s2, w, blk, x, t)
                    P.scale_into(acc, t, c + 48, s3, w, blk, x, t)
        for t in range(T):
            yf[t * N + g * R:t * N + (g + 1) * R] = acc[t * R:(t + 1) * R]


# ------------------------------------------- the ablation: a dequantized tile
@njit(**JIT_OPTIONS)
def _dequantize_q4_block(w, blk, tile):
    """A Q4 block of one row group -> ``tile`` float32 [32, LANES]: ``d * q + m``.

    The high nibble without a shift: ``byte - lo = 16 hi`` exactly, and
    ``(d / 16) (16 hi) = d hi`` exactly (a power of two), so each weight gets the same
    bits as ``d * hi + m``; Numba's ``uint8 >> 4`` became 64-bit shifts and a repack
    (measured 1.1-1.4x slower for the whole dequantization, on AVX2).
    """
    R = w.lanes
    db, mb = w.scales[blk.scales:blk.scales + R], w.mins[blk.scales:blk.scales + R]
    for j in range(16):
        row, lo, hi = w.codes[blk.codes + j * R:blk.codes + (j + 1) * R], tile[j], tile[j + 16]
        for r in range(R):
            q = np.int32(row[r])
            low = np.float32(q & np.int32(15))
            lo[r] = db[r] * low + mb[r]
            hi[r] = (db[r] * np.float32(0.0625)) * (np.float32(q) - low) + mb[r]


@njit(**JIT_OPTIONS)
def _dequantize_q8_block(w, blk, tile):
    """A Q8 block of one row group -> ``tile`` float32 [32, LANES]: ``d * q``."""
    R = w.lanes
    db = w.scales[blk.scales:blk.scales + R]
    for j in range(32):
        row, wj = w.codes[blk.codes + j * R:blk.codes + (j + 1) * R].view(np.int8), tile[j]
        for r in range(R):
            wj[r] = db[r] * np.float32(row[r])


@njit(inline="always", **JIT_OPTIONS)
def _dq_pass3(wf, R, x, base, acc, i, t, c):
    """Rows ``t..t+2`` of ``x``, lanes ``c..c+15`` of the tile ``wf`` (flat [32, R]), into
    ``acc`` (flat [rows, R]) from its row ``i``."""
    o = i * R + c
    a0, a1, a2 = load_f32(acc, o), load_f32(acc, o + R), load_f32(acc, o + 2 * R)
    for j in range(32):
        w = load_f32(wf, j * R + c)
        a0 = fma(w, splat(x[t, base + j]), a0)
        a1 = fma(w, splat(x[t + 1, base + j]), a1)
        a2 = fma(w, splat(x[t + 2, base + j]), a2)
    store_f32(acc, o, a0)
    store_f32(acc, o + R, a1)
    store_f32(acc, o + 2 * R, a2)


@njit(inline="always", **JIT_OPTIONS)
def _dq_pass4(wf, R, x, base, acc, i, t, c):
    """:func:`_dq_pass3` for four rows."""
    o = i * R + c
    a0, a1 = load_f32(acc, o), load_f32(acc, o + R)
    a2, a3 = load_f32(acc, o + 2 * R), load_f32(acc, o + 3 * R)
    for j in range(32):
        w = load_f32(wf, j * R + c)
        a0 = fma(w, splat(x[t, base + j]), a0)
        a1 = fma(w, splat(x[t + 1, base + j]), a1)
        a2 = fma(w, splat(x[t + 2, base + j]), a2)
        a3 = fma(w, splat(x[t + 3, base + j]), a3)
    store_f32(acc, o, a0)
    store_f32(acc, o + R, a1)
    store_f32(acc, o + 2 * R, a2)
    store_f32(acc, o + 3 * R, a3)


@njit(inline="always", **JIT_OPTIONS)
def _dq_pass5(wf, R, x, base, acc, i, t, c):
    """:func:`_dq_pass3` for five rows (10 of AVX2's 16 registers hold the sums)."""
    o = i * R + c
    a0, a1 = load_f32(acc, o), load_f32(acc, o + R)
    a2, a3, a4 = load_f32(acc, o + 2 * R), load_f32(acc, o + 3 * R), load_f32(acc, o + 4 * R)
    for j in range(32):
        w = load_f32(wf, j * R + c)
        a0 = fma(w, splat(x[t, base + j]), a0)
        a1 = fma(w, splat(x[t + 1, base + j]), a1)
        a2 = fma(w, splat(x[t + 2, base + j]), a2)
        a3 = fma(w, splat(x[t + 3, base + j]), a3)
        a4 = fma(w, splat(x[t + 4, base + j]), a4)
    store_f32(acc, o, a0)
    store_f32(acc, o + R, a1)
    store_f32(acc, o + 2 * R, a2)
    store_f32(acc, o + 3 * R, a3)
    store_f32(acc, o + 4 * R, a4)


@njit(parallel=True, **JIT_OPTIONS)
def dequantized_tile_batch(w, x, y):
    """The package's ``batch`` before its rows were made batch-invariant: each block
    dequantized (``d q + m``, rounded once) into the tile, the sums carried across blocks
    (no scale per block), so its rounding differs from ``rows``'. From 4 rows."""
    R = w.lanes
    T = x.shape[0]
    if T < 4:
        raise ValueError("x: needs at least 4 input rows")
    chunks = -(-T // K.BATCH)
    for g in prange(w.groups):
        tile = np.empty((32, R), np.float32)
        wf = tile.reshape(32 * R)
        acc = np.empty((K.BATCH, R), np.float32)
        accf = acc.reshape(K.BATCH * R)
        for k in range(chunks):
            t0, t1 = k * T // chunks, (k + 1) * T // chunks
            acc[:] = 0.0
            for b in range(w.blocks):
                blk = K.block_at(w, g, b)
                if codes_kind(w) == Q4:
                    _dequantize_q4_block(w, blk, tile)
                else:
                    _dequantize_q8_block(w, blk, tile)
                t = t0
                while t < t1:
                    n = P.pass_rows(t1 - t)
                    for c in range(0, R, 16):
                        if n == 5:
                            _dq_pass5(wf, R, x, b * 32, accf, t - t0, t, c)
                        elif n == 4:
                            _dq_pass4(wf, R, x, b * 32, accf, t - t0, t, c)
                        else:
                            _dq_pass3(wf, R, x, b * 32, accf, t - t0, t, c)
                    t += n
            for t in range(t0, t1):
                y[t, g * R:(g + 1) * R] = acc[t - t0]


# ---------------------------- the ablation: the codes tile converted before the passes
@njit(parallel=True, **JIT_OPTIONS)
def tile_first_batch(w, x, y, parts):
    """``batch`` as it was before its first pass over a block converted the codes: the
    whole block converted into the tile first (``P.tile_row`` row after row), then every
    pass reading it there; no prefetch. The same operations on the same bits."""
    G, J, R = w.groups, w.code_rows, w.lanes
    T, N = x.values.shape[0], y.shape[1]
    yf = y.reshape(y.size)
    chunks = -(-T // K.BATCH)
    strips = R // 16
    parts = max(1, min(parts, G * strips))
    for part in prange(parts):
        tile, acc = np.empty(32 * R, np.float32), np.empty(K.BATCH * R, np.float32)
        work = K.Scratch(tile, acc)
        s_lo, s_hi = part * G * strips // parts, (part + 1) * G * strips // parts
        for g in range(s_lo // strips, (s_hi - 1) // strips + 1):
            c_lo = (max(s_lo, g * strips) - g * strips) * 16
            c_hi = (min(s_hi, (g + 1) * strips) - g * strips) * 16
            for k in range(chunks):
                t0, t1 = k * T // chunks, (k + 1) * T // chunks
                acc[:] = 0.0
                for b in range(w.blocks):
                    blk = K.block_at(w, g, b)
                    for j in range(J):
                        for c in range(c_lo, c_hi, 16):
                            p = blk.codes + j * R + c
                            if codes_kind(w) == Q4:
                                P.tile_row(w.codes, p, tile, 2 * j * R + c, True, P.LOW)
                                P.tile_row(w.codes, p, tile, (2 * j + 1) * R + c, True, P.BYTE)
                            else:
                                P.tile_row(w.codes, p, tile, j * R + c, True, P.SIGNED)
                    t = t0
                    while t < t1:
                        n = P.pass_rows(t1 - t)
                        for c in range(c_lo, c_hi, 16):
                            P._pass_of(w, blk, x, work, t, t - t0, c, n, False)
                        t += n
                for t in range(t0, t1):
                    o, a = t * N + g * R, (t - t0) * R
                    yf[o + c_lo:o + c_hi] = acc[a + c_lo:a + c_hi]


def codes_per_row(x, qm):
    """``x @ qm`` through :func:`per_row_rows` whatever T is."""
    w = qm.packed
    y = np.empty((x.shape[0], w.padded_rows), np.float32)
    per_row_rows(w, K.inputs(x, w.kind), y)
    return y


def dequantized_tile(x, qm):
    """``x @ qm`` with :func:`dequantized_tile_batch` from 4 rows (``rows`` below)."""
    if x.shape[0] <= FEW_ROWS:
        return x @ qm
    y = np.empty((x.shape[0], qm.packed.padded_rows), np.float32)
    dequantized_tile_batch(qm.packed, x, y)
    return y[:, :qm.shape[1]]


def whole_groups(x, qm):
    """``x @ qm`` with ``batch``'s threads taking whole groups of output rows (as before
    they shared the strips of a group): ``threads`` = the group count makes one part per
    group, and Numba deals the parts out to its threads."""
    if x.shape[0] <= FEW_ROWS:
        return x @ qm
    w = qm.packed
    y = np.empty((x.shape[0], w.padded_rows), np.float32)
    K.batch(w, K.inputs(x, w.kind), y, w.groups)
    return y[:, :qm.shape[1]]


def tile_first(x, qm):
    """``x @ qm`` with :func:`tile_first_batch` from 4 rows (``rows`` below)."""
    if x.shape[0] <= FEW_ROWS:
        return x @ qm
    w = qm.packed
    y = np.empty((x.shape[0], w.padded_rows), np.float32)
    tile_first_batch(w, K.inputs(x, w.kind), y, numba.get_num_threads())
    return y[:, :qm.shape[1]]


def with_lanes(qm: QuantMatrix, lanes: int) -> QuantMatrix:
    """The same weights regrouped ``lanes`` output rows per group (64 -> 128 where the
    row count allows: the package's layout before every matrix had groups of 64)."""
    if qm.shape[1] % lanes:
        return qm
    return QuantMatrix(qm.fmt, qm.shape, GroupedBlocks.pack(qm.packed.kind, *qm.blocks(),
                                                            lanes=lanes))


# ------------------------------------------- the proxy: the compiled loops, counted
def ref_kernels(rev: str):
    """``paged_np/quant/kernels.py`` (and the ``passes.py`` beside it) at git revision
    ``rev``, imported as a package of its own (``quant_ref_<rev>``) that uses this
    checkout's :mod:`paged_np.quant.simd`, config and errors."""
    root = Path(__file__).resolve().parents[1]
    pkg = "quant_ref_" + re.sub(r"\W", "_", rev)
    d = Path(tempfile.mkdtemp(prefix="quant_ref")) / pkg
    d.mkdir()
    (d / "__init__.py").write_text("")
    for name in ("kernels.py", "passes.py"):
        src = subprocess.run(["git", "-C", str(root), "show", f"{rev}:paged_np/quant/{name}"],
                             capture_output=True, text=True, check=True).stdout
        src = src.replace("from ..", "from paged_np.").replace("from .passes", f"from {pkg}.passes")
        src = re.sub(r"from \.(\w+) import", r"from paged_np.quant.\1 import", src)
        (d / name).write_text(src)
    sys.path.insert(0, str(d.parent))
    return importlib.import_module(f"{pkg}.kernels")


def uncached(dispatcher):
    """A fresh copy of a jitted kernel, compiled here rather than loaded from Numba's cache
    (code loaded from the cache has no LLVM IR to show)."""
    return njit(**dict(dispatcher.targetoptions, cache=False))(dispatcher.py_func)


def call_batch(kern, w: GroupedBlocks, x, y, parts: int = 2):
    """``kern.batch`` on ``w``: records (this package), or bdde226's arrays (``qs, d, m``
    shaped ``[G, nb, J, R]``, ``m`` None for Q8, then ``xp, xs``)."""
    batch, inputs = kern["batch"], kern["inputs"]
    if list(inspect.signature(batch.py_func).parameters)[0] == "qs":
        G, nb, J, R = w.groups, w.blocks, w.code_rows, w.lanes
        q4 = w.kind == Q4
        m = w.mins.reshape(G, nb, R) if q4 else None
        batch(w.codes.reshape(G, nb, J, R), w.scales.reshape(G, nb, R), m, *inputs(x, q4),
              y, parts)
    else:
        batch(w, inputs(x, w.kind), y, parts)


def loop_counts(asm: str) -> dict:
    """Counts in the assembly of ``batch``'s parallel body (Numba's parfor gufunc): all
    its instructions and ``vfmadd``s, and each innermost loop that multiplies (a backward
    jump with no other inside it), as ``(instructions, vfmadd)`` per iteration."""
    m = re.search(r"\n(_ZN\w*numba_parfor_gufunc\w+):\n(.*?)\n\s+\.cfi_endproc", asm, re.S)
    labels, ins = {}, []
    for line in m.group(2).splitlines():
        s = line.split("#")[0].strip()
        if re.match(r"^\.?[\w.$]+:$", s):
            labels[s[:-1]] = len(ins)
        elif s and not s.startswith("."):
            ins.append(s)
    loops = []
    for k, i in enumerate(ins):
        j = re.match(r"j\w+\s+(\S+)$", i)
        if j and labels.get(j.group(1), k + 1) <= k:
            loops.append((labels[j.group(1)], k))
    inner = [(lo, hi) for lo, hi in loops
             if not any(lo <= a and b <= hi and (a, b) != (lo, hi) for a, b in loops)]

    def fmas(a):
        return sum(i.startswith("vfmadd") for i in a)

    hot = [(hi - lo + 1, fmas(ins[lo:hi + 1])) for lo, hi in inner]
    return {"instructions": len(ins), "vfmadd": fmas(ins),
            "loops": sorted((h for h in hot if h[1]), key=lambda h: (-h[1], h[0]))}


def ir_report(ref: str, rows) -> list[str]:
    """The proxy's table: for Q4_1 and Q8_0, ``batch`` here and at ``ref``, compiled
    fresh, checked bit-equal at each of ``rows``, its IR and assembly counted."""
    here = {"batch": uncached(K.batch), "inputs": K.inputs}
    old = ref_kernels(ref)
    there = {"batch": uncached(old.batch), "inputs": old.inputs}
    rng = np.random.default_rng(0)
    out, k = 128, 576
    lines = ["| format | kernel | IR fma | asm vfmadd | asm instructions | innermost "
             "multiplying loops: instructions/vfmadd per iteration |", "|---|---|---|---|---|---|"]
    for fmt, kind in (("Q4_1", Q4), ("Q8_0", pnp.quant.Q8)):
        if kind == Q4:
            q = rng.integers(0, 16, (out, k // 32, 32)).astype(np.uint8)
        else:
            q = rng.integers(-128, 128, (out, k // 32, 32)).astype(np.int8)
        d, m = (rng.random((out, k // 32), dtype=np.float32) for _ in range(2))
        w = GroupedBlocks.pack(kind, q, d, m)
        for T in rows:
            x = rng.standard_normal((T, k), dtype=np.float32)
            ys = [np.full((T, w.padded_rows), np.nan, np.float32) for _ in range(2)]
            call_batch(here, w, x, ys[0])
            call_batch(there, w, x, ys[1])
            assert np.array_equal(ys[0], ys[1]), f"{fmt} T={T}: not the bits of {ref}"
        for name, kern in ((ref, there), ("here", here)):
            sig = kern["batch"].signatures[-1]                 # the one just compiled
            ir = kern["batch"].inspect_llvm(sig)
            c = loop_counts(kern["batch"].inspect_asm(sig))
            loops = ", ".join(f"{n}/{f}" for n, f in c["loops"])
            fma = len(re.findall(r"call [^\n]*@llvm\.fma\.v16f32", ir))
            lines.append(f"| {fmt} | {name} | {fma} "
                         f"| {c['vfmadd']} | {c['instructions']} | {loops} |")
            print(lines[-1], flush=True)
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ir", action="store_true",
                    help="count batch's compiled loops here and at --ref (no timing)")
    ap.add_argument("--ref", default="bdde226")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 64, 110])
    ap.add_argument("--out", default=str(Path(__file__).parent / "quant_kernels.md"))
    args = ap.parse_args(argv)
    if args.ir:
        ir_report(args.ref, args.rows if "--rows" in (argv or sys.argv) else [9, 16])
        return 0
    model, _ = pnp.load_model("smollm2-135m-instruct")
    proj = [*model.wqkv, *model.w["wo"], *model.w_gate_up, *model.w["w_down"]]
    head = model.w["embed"]
    # float32 (BLAS) last in a round, then a pause: OpenBLAS's threads spin after their
    # call and slowed whichever Numba set came next (the rows kernel at T = 1 took 2x the
    # same kernel's time in the "quantized" column when it followed float32).
    sets = {"quantized": proj + [head],
            "codes per row": proj + [head],
            "dequantized tile": proj + [head],
            "whole groups": proj + [head],
            "tile first": proj + [head],
            "128 lanes": [with_lanes(m, 128) for m in proj] + [with_lanes(head, 128)],
            "float32": [np.asarray(m) for m in proj] + [np.asarray(head)]}
    how = {"codes per row": codes_per_row, "dequantized tile": dequantized_tile,
           "whole groups": whole_groups, "tile first": tile_first}
    nbytes = {k: sum(m.nbytes for m in v) for k, v in sets.items()}
    rng = np.random.default_rng(0)
    out = Path(args.out)
    out_arg = "" if out.name == "quant_kernels.md" else f" --out benchmarks/{out.name}"
    if args.rounds != ap.get_default("rounds"):
        out_arg = f" --rounds {args.rounds}" + out_arg
    if args.rows != ap.get_default("rows"):
        out_arg = f" --rows {' '.join(map(str, args.rows))}" + out_arg
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
             "codes per row ms | dequantized tile ms | whole groups ms | tile first ms | "
             "128 lanes ms | quantized GB/s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    with pinned_threads(args.threads):
        for T in args.rows:
            xs = {k: rng.standard_normal((T, k), dtype=np.float32) for k in (576, 1536)}
            best = dict.fromkeys(sets, np.inf)
            numba_sets = [k for k in sets if k != "float32"]
            for r in range(args.rounds + 1):                  # the first round compiles
                # The Numba sets take turns to go first after the pause (the first set of
                # a round measured up to 15% slower than the same kernel later in it).
                k = r % len(numba_sets)
                for name in numba_sets[k:] + numba_sets[:k] + ["float32"]:
                    mats = sets[name]
                    t0 = time.perf_counter()
                    mul = how.get(name, operator.matmul)
                    for m in mats:
                        mul(xs[m.shape[0]], m)
                    best[name] = min(best[name], time.perf_counter() - t0)
                    if name == "float32":
                        time.sleep(0.3)                   # until OpenBLAS's threads park
            kernel = "rows" if T <= FEW_ROWS else "batch"
            q, f = best["quantized"], best["float32"]
            lines.append(f"| {T} | {kernel} | {1e3 * q:.1f} | {1e3 * f:.1f} | {f / q:.2f}x | "
                         f"{1e3 * best['codes per row']:.1f} | "
                         f"{1e3 * best['dequantized tile']:.1f} | "
                         f"{1e3 * best['whole groups']:.1f} | "
                         f"{1e3 * best['tile first']:.1f} | "
                         f"{1e3 * best['128 lanes']:.1f} | "
                         f"{nbytes['quantized'] / q / 1e9:.1f} |")
            print(lines[-1], flush=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
