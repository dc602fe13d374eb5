# %% [markdown]
# # 6. Numba kernels and performance
#
# The NumPy kernel of notebook 2 is written to be read. `backend="numba"` computes the
# same thing, compiled and parallel. This notebook asks how fast is fast enough, and
# answers with the **roofline**: decode attention reads every cached K and V byte once
# and does about one floating-point operation per byte, so its speed limit is the memory
# bus, not the arithmetic. We then look at two choices that decide how close a kernel
# gets to that limit: the **layout** of a page in memory, and the **page size**.
#
# **What you need:** notebook 2 (the online softmax, GQA); NumPy; the idea of a compiled
# loop (Numba compiles a Python function with `@njit`; nothing else about Numba is
# assumed).
#
# **What you will be able to do:** say what one vector load of a K page holds in the hnd
# and k_transposed layouts, and find an element's address in each; read the package's
# CPU kernel; compute a kernel's arithmetic intensity and place it on a roofline with its
# memory and compute roofs; write a Numba decode kernel for the NHD page layout, checked
# against the package, and say why it lands where it does.
#
# Timings below are live and noisy (a shared 2-core machine, say); the benchmark numbers
# the README quotes come from `python -m paged_np bench`, read from
# `benchmarks/results.json` when it is there.

# %%
import json
import time
from pathlib import Path

import numpy as np

import paged_np as pnp
from paged_np import viz
from paged_np.cli import bench
from paged_np.attention.reference import dense_attention
from _exercise import Raised, ReturnedNone, attempt, check, check_function  # notebooks/

# %% [markdown]
# ## One decode step, three backends
#
# The bench's decode case: `bench.B` sequences, each with `CTX` tokens of context, a
# Llama-3-8B-like layer (32 query heads, 8 kv heads, head_dim 128), pages shuffled in
# the arena as a long-running server's would be. `CTX` is the size knob. The first Numba
# call compiles the kernel (up to a minute on a cold machine; cached on disk afterwards).

# %%
CTX = 512                                                  # size knob: context length
q, k, v, tables, seq_lens, _ = bench.make_decode_case(CTX, np.float32)
print("q", q.shape, " k_pages", k.shape, " block_tables", tables.shape)
t0 = time.perf_counter()
out_numba = pnp.paged_attention(q, k, v, tables, seq_lens, backend="numba")
print(f"first numba call (compile or load from cache): {time.perf_counter() - t0:.1f} s")
out_numpy = pnp.paged_attention(q, k, v, tables, seq_lens, backend="numpy")
assert np.allclose(out_numba, out_numpy, atol=1e-4)

# %% [markdown]
# And both against the dense truth, for the first sequence (its keys gathered through the
# block table into one contiguous array):

# %%
b = 0
k_seq = k[tables[b]].transpose(0, 2, 1, 3).reshape(-1, k.shape[1], k.shape[3])[:CTX]  # [CTX, Hkv, D]
v_seq = v[tables[b]].transpose(0, 2, 1, 3).reshape(-1, v.shape[1], v.shape[3])[:CTX]
ref, _ = dense_attention(q[b:b + 1], k_seq, v_seq)         # [1, H, D]
print("max |numba - dense| =", np.abs(out_numba[b] - ref[0]).max())
assert np.allclose(out_numba[b], ref[0], atol=1e-4)

# %% [markdown]
# ## Speed: bytes per second, not FLOPs
#
# Per sequence and kv head, decode reads `CTX` keys and `CTX` values of `head_dim` floats.
# Per query head and key it does a dot product for the score and a multiply-add into the
# output: `2 * head_dim` multiply-adds, so `4 * head_dim` FLOPs. With GQA, 4 query heads
# share each kv head's bytes. Hence the **arithmetic intensity**:
#
# $$\frac{\text{FLOPs}}{\text{bytes}} = \frac{4 \cdot H \cdot D}{2 \cdot H_{kv} \cdot D \cdot 4\,\text{bytes}}
#   = \frac{H}{2 H_{kv}} = 2 \ \text{FLOP/byte (float32)} .$$
#
# A CPU core does tens of FLOPs per byte it can fetch, and a GPU hundreds (an H100's
# dense bf16: about 990 TFLOP/s over 3.35 TB/s, about 300), so decode waits on memory on
# both. Its speed is best stated as bytes of K/V read per second:

# %%
def best_of(fn, repeat=5):
    """Seconds of the fastest of `repeat` calls (the least disturbed), after a warm-up."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter(); fn(); times.append(time.perf_counter() - t0)
    return min(times)

kv_bytes = k.nbytes + v.nbytes                             # every page is read once
flops = 4 * q.shape[0] * q.shape[1] * CTX * q.shape[2]     # B * H * CTX * 4D
assert np.isclose(flops / kv_bytes, q.shape[1] / (2 * k.shape[1]))   # = 2 for float32
t_numba = best_of(lambda: pnp.paged_attention(q, k, v, tables, seq_lens, backend="numba"))
t_numpy = best_of(lambda: pnp.paged_attention(q, k, v, tables, seq_lens, backend="numpy"))
for name, t in (("numpy", t_numpy), ("numba", t_numba)):
    print(f"{name}: {t * 1e3:7.2f} ms  {kv_bytes / t / 1e9:6.2f} GB/s of K/V")

# %% [markdown]
# ## Two layouts of a K page
#
# A score is `q . k`: `head_dim` multiply-adds. A CPU does them in **vectors**: one
# 512-bit load brings 16 float32 from 16 consecutive addresses into a register, and one
# instruction multiplies-and-adds all 16 lanes. So what a load holds depends on how the
# page lies in memory. Two layouts of one kv head's K page:
#
# - **hnd** (the arena's today): `[page_size, head_dim]`, row `t` is key `t`. A load
#   holds 16 dimensions of *one* key: it gives 16 partial sums of one score, which must
#   be added across the lanes at the end (the package's 4x4 score tile keeps 16 such
#   sums and reduces each once).
# - **k_transposed**: `[head_dim, page_size]`, row `d` is dimension `d` of every key. A
#   load holds dimension `d` of 16 consecutive *keys*: `acc[0:16] += q[d] * load` is one
#   multiply-add into each of 16 scores, key `t` staying in lane `t`; nothing is reduced.
#
# This is vLLM's original key cache, `[num_blocks, num_kv_heads, head_size / x,
# block_size, x]`, with `x = 1`: on a GPU each thread owned one key and read `x` of its
# dimensions (16 bytes) at once; on a CPU the vector runs across keys, so `x` is one
# element. V pages stay `[page_size, head_dim]` in both. In the drawing, the numbers are
# addresses, the colour is the key, and the red cells are one load:

# %%
fig = viz.draw_k_layouts(page_size=16, head_dim=16, load=1)

# %% [markdown]
# Same bytes, same scores, two orders of work. With a `head_dim` of 128, the hnd row
# `q @ k_page.T` reduces along each key's row; the k_transposed loop adds one row of
# `kT_page` per dimension, as the kernel's registers do:

# %%
rng = np.random.default_rng(1)
k_page = rng.standard_normal((16, 128), np.float32)        # hnd: [page_size, head_dim]
kT_page = np.ascontiguousarray(k_page.T)                   # k_transposed: [head_dim, page_size]
q1 = rng.standard_normal(128, np.float32)                  # one query row [head_dim]
print("strides (bytes): hnd", k_page.strides, " k_transposed", kT_page.strides)
acc = np.zeros(16, np.float32)                             # [page_size]: lane t = key t's score
for d in range(128):
    acc += q1[d] * kT_page[d]                              # one broadcast multiply-add per dim
assert np.allclose(q1 @ k_page.T, q1 @ kT_page, atol=1e-4)  # [16] both ways
assert np.allclose(q1 @ k_page.T, acc, atol=1e-4)

# %% [markdown]
# ## Exercise 6a: where key t's dimension d lives
#
# A page of 16 keys of 8 dims is 128 floats in a row of memory. For every key `t` and
# dimension `d` (the grids `t`, `d` below, `[16, 8]` each), write the address of that
# element in an **hnd** page (`addr_hnd`) and in a **k_transposed** page (`addr_kt`),
# as NumPy expressions in `t` and `d`. The check builds each page's memory as
# `np.arange(128)` in its memory shape and reads the answer off it.

# %% exercise 6a
t, d = np.indices((16, 8))     # [16, 8]: t[i, j] = i (the key), d[i, j] = j (the dim)
addr_hnd = None                # [16, 8]: address of key t's dim d in an hnd page
addr_kt = None                 # [16, 8]: the same in a k_transposed page

# %% check 6a
memory = np.arange(16 * 8)                                 # address i holds element i
check("6a", dict(addr_hnd=addr_hnd, addr_kt=addr_kt),
      dict(addr_hnd=memory.reshape(16, 8),                 # memory [P, D]: [t, d]
           addr_kt=memory.reshape(8, 16).T),               # memory [D, P]: [d, t], seen as [t, d]
      hints=dict(addr_hnd="rows of head_dim = 8 floats, one per key: skip t rows, then d.",
                 addr_kt="rows of page_size = 16 floats, one per dim: skip d rows, then t."),
      done="Neighbouring addresses hold the next dim of one key in hnd, the next key in "
           "k_transposed: a 16-float load is a column of addr_kt (dim d of all 16 keys) "
           "but two keys' rows of addr_hnd (head_dim is 8 here).")

# %% [markdown]
# ## The roofline
#
# A kernel has two speed limits. The **bandwidth roof** is what the memory bus can
# deliver: `bench.stream_bandwidth()` measures it (a parallel sum over 512 MiB). The
# **compute roof** is the arithmetic the cores can do: `bench.fma_peak()` measures it
# (fused multiply-adds in registers, every core). The bench stored both in
# `results.json`; we measure them live only when that file is absent. On the log-log
# plot, a kernel with intensity `I` can at best reach `min(peak, I * bandwidth)` FLOP/s:
# the slanted roof left of the **ridge point** `peak / bandwidth`, the flat one right of
# it. The percentage beside each dot is how much of its limit it gets.

# %%
results_path = Path(pnp.__file__).resolve().parents[1] / "benchmarks" / "results.json"
res = json.loads(results_path.read_text()) if results_path.exists() else None
bandwidth = res["bandwidth_gbs"] * 1e9 if res else bench.stream_bandwidth(repeat=2) * 1e9
peak = res["fma_peak_gflops"] * 1e9 if res else bench.fma_peak(2) * 1e9
print(f"roofs: {bandwidth / 1e9:.1f} GB/s, {peak / 1e9:.0f} GFLOP/s; "
      f"ridge point {peak / bandwidth:.1f} FLOP/byte")
points = [{"label": f"{n} K hnd (live, ctx {CTX})", "flops": flops, "bytes": kv_bytes,
           "seconds": t} for n, t in (("numpy", t_numpy), ("numba", t_numba))]
decode = (res or {}).get("decode", [])                     # the bench's own decode rows
cases = sorted({(row["dtype"], row["context"]) for row in decode})
for row in decode:
    layout = row.get("layout", "hnd")                      # older files: hnd only
    nbytes = row["gbs"] * 1e9 * row["ms"] / 1e3            # bytes it read per call
    itemsize = 4 if row["dtype"] == "float32" else 2
    points.append({"label": f"bench {row['dtype']} ctx {row['context']}, "
                            f"{viz.layouts.K_LAYOUTS[layout]}", "bytes": nbytes,
                   "flops": nbytes * bench.H / (2 * bench.HKV) * 4 / itemsize,
                   "seconds": row["ms"] / 1e3, "marker": "o" if layout == "hnd" else "s",
                   "color": f"C{2 + cases.index((row['dtype'], row['context']))}"})
fig = viz.draw_roofline(points, peak_bandwidth=bandwidth, peak_flops=peak)

# %% [markdown]
# A bench case run in both K layouts is one colour: a circle for hnd, a square for
# k_transposed, at the same intensity (the same bytes, the same FLOPs; only the order of
# the work differs). Every dot sits under the slanted roof, at intensity 2 (float32) or 4
# (float16: half the bytes for the same FLOPs), far left of the ridge point: decode
# attention would need several times more FLOPs per byte before the arithmetic, not the
# bus, limited it. (A prefill chunk reuses each key for many queries and moves right; a
# big enough one crosses the ridge and becomes compute-bound.) How far below the roof a
# dot sits is the kernel's inefficiency: loop overhead, the threads' start-up, cache misses on the block table.
# Long contexts on a small machine fall further below: the working set no longer fits
# in the caches and the two cores compete for the bus.
#
# ## Layout: head-major pages read faster
#
# The arena stores a page as `[num_kv_heads, page_size, head_dim]` (**HND**, head-major;
# FlashInfer offers it as `kv_layout="HND"`, though its wrappers default to `"NHD"`): for
# one kv head, a page is one contiguous `page_size x head_dim` tile. The alternative, **NHD** (token-major, `[page_size, num_kv_heads, head_dim]`),
# interleaves the heads, so one head's keys come in `head_dim`-float pieces with the
# other heads' keys between them. A kernel reads one kv head at a time:

# %%
N_PAGES = 1024                                             # size knob (x 64 KiB per page)
rng = np.random.default_rng(0)
k_hnd = rng.standard_normal((N_PAGES, 8, 16, 128), np.float32)   # [pages, Hkv, P, D]
k_nhd = np.ascontiguousarray(k_hnd.transpose(0, 2, 1, 3))       # [pages, P, Hkv, D]
print(f"HND: one head of one page is {k_hnd[0, 3].nbytes} contiguous bytes")
print(f"NHD: it comes in {k_nhd[0, :, 3].shape[0]} pieces of {128 * 4} bytes, "
      f"{k_nhd.strides[1]} bytes apart")
t_hnd = best_of(lambda: k_hnd[:, 3].sum())                 # sum one head over all pages
t_nhd = best_of(lambda: k_nhd[:, :, 3].sum())
print(f"HND {t_hnd * 1e3:.1f} ms   NHD {t_nhd * 1e3:.1f} ms   ratio {t_nhd / t_hnd:.2f}")
assert np.isclose(k_hnd[:, 3].sum(), k_nhd[:, :, 3].sum(), rtol=1e-3)

# %% [markdown]
# On the machines this project was measured on, the Numba decode kernel read HND pages
# 1.6-1.9x faster than NHD ones at long context. The reason is the one above: a long
# contiguous run lets the hardware prefetcher stream, and every cache line fetched is
# fully used.
#
# ## Inside the CPU kernel
#
# The Numba kernel is plain Python loops, compiled. Its core is one **work item**: some
# queries times the query heads of some kv heads, against a range of keys. It copies the
# queries into a tile, walks the keys a block of pages at a time (scores of every page,
# the causal mask where needed, the online softmax of notebook 2, `acc += p @ V`), and
# divides by `l` at the end. Here is its source, as the package has it:

# %%
import inspect

from paged_np.attention import numba_cpu

source = inspect.getsource(numba_cpu)
start = source.index("@njit(**JIT_OPTIONS)\ndef _attend_item")
print(source[start:source.index("\n\n\n", start)])

# %% [markdown]
# The helpers it calls (`tile_scores`, `online_softmax`, `accumulate_pv`, in
# `paged_np/attention/numba_kernels.py`) work on tiles of 4 rows so the compiler keeps
# them in vector registers. The loop over kv heads sits *inside* the loop over pages: in
# HND one page's kv-head tiles lie side by side, so a block of pages is one stretch of
# memory.
#
# ## Page size
#
# Small pages waste less memory (notebook 1) but cost the kernel: one block-table lookup
# and one short run of memory per page. The bench swept the page size at context 2048:

# %%
if res:                                                    # rows with gbs_hnd, gbs_k_transposed
    sweep = res["page_sweep"]                              # (older files: gbs, hnd's)
else:                                                      # no results.json: measure live, hnd
    sweep = []
    for ps in (8, 16, 64):
        case = bench.make_decode_case(CTX, np.float32, page_size=ps)
        t = best_of(lambda: pnp.paged_attention(*case[:5], backend="numba"), repeat=3)
        sweep.append({"page_size": ps, "gbs_hnd": case[1].nbytes * 2 / t / 1e9})
fig = viz.draw_page_sweep(sweep, title="decode across page sizes, one bar per K layout")

# %% [markdown]
# Larger pages read faster, up to a point; vLLM's default of 16 trades a little speed
# for little waste and fine-grained sharing (a prefix is shared in whole pages only).
# k_transposed's fast path scores 16 keys per load, so it needs a page of a multiple of
# 16 keys; a page of 8 takes a plainer loop (`tile_scores_kt_any` in
# `paged_np/attention/numba_kt.py`).
#
# ## Exercise 6: intensity of float16 and of MQA
#
# Using the formula above, compute the arithmetic intensity (FLOP per byte of K/V) of
# decode for (a) `float16` pages with the bench's shapes (32 query heads, 8 kv heads), and
# (b) `float32` pages with multi-query attention (32 query heads, 1 kv head). The check
# counts FLOPs and bytes of a real case.

# %% exercise 6
intensity_fp16 = None     # FLOP per byte: float16 pages, 32 query heads, 8 kv heads
intensity_mqa = None      # FLOP per byte: float32 pages, 32 query heads, 1 kv head

# %% check 6
# count the FLOPs of a real decode case, and the bytes of its float16 pages and of
# float32 pages with one kv head
q16, k16, v16, *_ = bench.make_decode_case(64, np.float16)
f16 = 4 * q16.shape[0] * q16.shape[1] * 64 * q16.shape[2]
k_mqa = np.zeros((q16.shape[0] * 4, 1, 16, 128), np.float32)  # B * 4 pages of 16 = 64 tokens
check("6", dict(intensity_fp16=intensity_fp16, intensity_mqa=intensity_mqa),
      dict(intensity_fp16=f16 / (k16.nbytes + v16.nbytes),
           intensity_mqa=f16 / (2 * k_mqa.nbytes)),
      hints=dict(intensity_fp16="same FLOPs, but each K/V value is 2 bytes instead of 4.",
                 intensity_mqa="every query head now reads the one kv head: the FLOPs "
                               "stay, the bytes shrink by the group size."),
      done="Still far below a GPU's ridge point: decode stays memory-bound.")

# %% [markdown]
# ## Exercise 6b: a decode kernel for NHD pages, yours
#
# Write `decode_nhd`: decode attention (one query per sequence) over pages stored **NHD**,
# `k_pages[page, offset, kv_head, d]` (`[num_pages, P, Hkv, D]`), with `q` `[B, H, D]`,
# `block_tables` `[B, max_pages]` and `seq_lens` `[B]`; return `out` `[B, H, D]`
# (float32). Query head `h` reads kv head `h // (H // Hkv)`; scale `1 / sqrt(D)`. Any
# correct way is accepted; to place it on the roofline make it fast: put `@njit` on it
# (`from numba import njit, prange`) and run the `(b, h)` pairs in a `prange`. The check
# runs 20 random small batches through yours and the package's kernel (on the same pages
# in HND), then times yours on the bench case above and draws it on the roofline.

# %% exercise 6b
def decode_nhd(q, k_pages, v_pages, block_tables, seq_lens):
    """q [B, H, D]; k_pages, v_pages [num_pages, P, Hkv, D] (NHD) -> out [B, H, D]."""
    raise NotImplementedError        # your code here

# %% check 6b
def hnd(pages):
    return np.ascontiguousarray(pages.transpose(0, 2, 1, 3))     # NHD <-> HND


def random_batch(r):
    B, H, Hkv, D, P = 3, 4, 2, 8, 4
    lens = r.integers(1, 30, B).astype(np.int32)
    tables = np.stack([r.permutation(24)[:8] for _ in range(B)]).astype(np.int32)
    k_nhd, v_nhd = (r.standard_normal((24, P, Hkv, D), np.float32) for _ in range(2))
    return r.standard_normal((B, H, D), np.float32), k_nhd, v_nhd, tables, lens


r = np.random.default_rng(7)
check_function("6b", decode_nhd,
               lambda q, k, v, bt, lens: pnp.paged_attention(q, hnd(k), hnd(v), bt, lens,
                                                             backend="numpy"),
               [random_batch(r) for _ in range(20)], atol=1e-4, rtol=1e-4,
               describe=lambda q, k, v, bt, lens: f"seq_lens={lens.tolist()}",
               hints="per (b, h): kv head h // (H // Hkv); for t < seq_lens[b], the key is "
                     "k_pages[block_tables[b, t // P], t % P, kv_head]; an online softmax "
                     "(m, l, acc) or a plain one over the gathered scores.",
               done="Now see where it lands on the roofline (below).")
k_nhd_case, v_nhd_case = hnd(k), hnd(v)                    # the bench case, in NHD
mine = attempt(decode_nhd, q, k_nhd_case, v_nhd_case, tables, seq_lens)
if mine is not None and not isinstance(mine, (Raised, ReturnedNone)):  # right or not, timed
    t_mine = best_of(lambda: decode_nhd(q, k_nhd_case, v_nhd_case, tables, seq_lens), 3)
    print(f"yours: {t_mine * 1e3:.1f} ms, {kv_bytes / t_mine / 1e9:.2f} GB/s of K/V; "
          f"the package's numba kernel {t_numba * 1e3:.1f} ms")
    fig = viz.draw_roofline(points[:2] + [{"label": "yours (NHD)", "flops": flops,
                                           "bytes": kv_bytes, "seconds": t_mine}],
                            peak_bandwidth=bandwidth, peak_flops=peak)

# %% [markdown]
# ## Self-check
#
# 1. What is the arithmetic intensity of float32 decode with 32 query heads and 8 kv
#    heads, and is it left or right of a CPU's ridge point?
#    <details><summary>answer</summary>32 / (2 * 8) = 2 FLOP/byte: far left of a ridge
#    point of several FLOP per byte, so memory-bound.</details>
# 2. What moves a kernel to the right on the roofline?
#    <details><summary>answer</summary>More FLOPs per byte read: more query heads per kv
#    head (GQA, MQA), fewer bytes per value (float16, 8-bit), or many queries per key (a
#    prefill chunk).</details>
# 3. Why does the package store pages HND?
#    <details><summary>answer</summary>A kernel reads one kv head at a time; in HND that
#    head's page is one contiguous `page_size x head_dim` run the prefetcher can stream.
#    </details>
# 4. One 16-float load of a K page (head_dim 128, page_size 16): what does it hold in
#    hnd, and in k_transposed, and which needs a reduction across the lanes?
#    <details><summary>answer</summary>hnd: 16 dimensions of one key, partial sums of
#    one score, added across the lanes at the end. k_transposed: one dimension of the
#    page's 16 keys, one multiply-add into each of 16 scores; nothing is reduced.
#    </details>
# 5. Your NHD kernel ran slower than the package's. Name two reasons other than layout.
#    <details><summary>answer</summary>One key at a time with an `exp` per key (the
#    package scores a block of keys and rescales once per block) and no tiling of rows
#    into vector registers; and each query head re-reads its kv head's keys instead of
#    the group sharing one read.</details>
