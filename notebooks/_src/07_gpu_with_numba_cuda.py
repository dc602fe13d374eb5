# %% [markdown]
# # 7. On the GPU with numba.cuda
#
# `backend="cuda"` runs paged attention as a `numba.cuda` kernel, and
# `PagedKVCache(cfg, device="cuda")` keeps the arena in GPU memory. The bookkeeping
# (pool, block tables, LRU list, hashes) stays on the host: it is small, branchy work.
# Only the arena and the arithmetic move.
#
# No GPU? Numba's **CUDA simulator** runs the same kernels in Python, one thread per
# GPU thread: slow (tiny shapes only) but exact, which is all a lesson needs. The
# simulator must be chosen *before* numba is imported, so this is the first cell.
#
# **What you need:** notebooks 2 and 6 (the online softmax, GQA, the roofline); the words
# of CUDA are explained as they come (thread, block, grid, warp, shared memory).
#
# **What you will be able to do:** say which thread of the CUDA kernel computes which
# score, loads which key and writes which output column; count the thread blocks of a
# batch; check a device kernel against the host one.

# %%
import os

USE_SIMULATOR = True                  # set False on a machine with an NVIDIA GPU
os.environ["NUMBA_ENABLE_CUDASIM"] = "1" if USE_SIMULATOR else "0"

# %%
import numpy as np
import matplotlib.pyplot as plt

import paged_np as pnp
from paged_np import viz
from paged_np.attention import numba_cuda as nc
from _exercise import check              # notebooks/_exercise.py: checks your answers

rng = np.random.default_rng(0)
print("simulator:", nc.SIMULATOR)
print(f"a block: {nc.K.THREADS} threads = {nc.K.ROWS} rows x {nc.K.TILE_N} key lanes")

# %% [markdown]
# ## How the work is cut
#
# One **thread block** computes `ROWS` *rows* against one kv head, where a row is a pair
# (query token, query head of the GQA group). The block walks the sequence's keys in
# tiles of `TILE_N` positions, reading the block table once per key into shared memory,
# and keeps the online softmax of notebook 2 per row. So the grid is
#
# `(row tiles, num_kv_heads, num_splits)`, with `ceil(n_q * group / ROWS)` row tiles per
# sequence.
#
# `nc.plan` lists the row tiles of a batch on the host, once per step (FlashInfer's
# *plan/run* split), and picks a split-K count that fills the GPU. Here a batch of three
# sequences: a 13-token prefill chunk and two decodes, with 8 query heads over 2 kv heads.

# %%
H, HKV, D, P = 8, 2, 16, 4
seq_lens = np.array([13, 9, 6], np.int32)
n_q = np.array([13, 1, 1])                                 # prefill chunk, decode, decode
qsl = np.concatenate([[0], np.cumsum(n_q)]).astype(np.int32)   # [B+1] query_start_loc
p = nc.plan(seq_lens, qsl, H, HKV)
group = H // HKV
by_hand = int(np.sum(-(-n_q * group // nc.K.ROWS)))        # row tiles, summed over sequences
print("row tiles:", p.num_work, " grid:", (p.num_work, HKV, p.num_splits))
assert p.num_work == by_hand

# %% [markdown]
# The picture: each sequence's rows (queries x heads of a group) in tiles of `ROWS`; one
# thread block per tile and kv head. The prefill chunk needs many blocks, a decode one.

# %%
fig, ax = plt.subplots(figsize=(7, 1.8))
for b in range(3):
    rows = int(n_q[b] * group)
    for t in range(-(-rows // nc.K.ROWS)):
        w = min(nc.K.ROWS, rows - t * nc.K.ROWS)
        ax.barh(b, w, left=t * nc.K.ROWS, color=f"C{b}", edgecolor="black")
ax.set_yticks(range(3), [f"seq {b}: n_q={n_q[b]}" for b in range(3)])
ax.set_xlabel(f"rows = queries x {group} heads of a group (one box = one thread block)");

# %% [markdown]
# ## Inside a block: which thread touches which data
#
# A block has `THREADS = ROWS x TILE_N` threads (128: four **warps** of 32). Only a
# warp's 32 threads run in lock-step, one instruction for all of them; the four warps
# are scheduled independently and meet only at `cuda.syncthreads()`, which is why the
# kernel needs a barrier between phases. The kernel gives each thread a different job in
# each phase of a key tile;
# here are the lines that decide it, from the kernel's source:

# %%
import inspect

from paged_np.attention import cuda_kernels

src = inspect.getsource(cuda_kernels)
for needle in ("    tid = cuda.threadIdx.x", "    r = tid // TILE_N", "    n = tid - r",
               "        for idx in range(tid, TILE_N * head_dim, THREADS):",
               "            nn = idx // head_dim", "            d = idx - nn * head_dim"):
    line = next(ln for ln in src.splitlines() if ln.startswith(needle))
    print(line.strip())

# %% [markdown]
# - **Staging** (K and V of a tile into shared memory): thread `tid` loads the elements
#   `idx = tid, tid + THREADS, ...` of the `[TILE_N, head_dim]` tile, element `idx` being
#   key `idx // head_dim`, dimension `idx % head_dim`. Neighbouring threads read
#   neighbouring `d` of one key: one contiguous run of the page, a **coalesced** read.
# - **Scores**: thread `tid` is row `r = tid // TILE_N` (a query head of a query) and key
#   lane `n = tid % TILE_N`: it computes one score `q_r . k_n`. The 16 lanes of a row sit
#   in one warp, so the row's max and sum are warp shuffles, no shared memory.
# - **Output**: thread `t` owns output columns `d = t, t + THREADS, ...` of every row and
#   keeps them in registers (`acc`), rescaled by each tile's `alpha`.
#
# Drawn for `head_dim = 32` (each colour is one warp; the number is the thread):

# %%
K = nc.K
fig, axes = plt.subplots(1, 2, figsize=(11, 2.8))
score_tid = np.arange(K.THREADS).reshape(K.ROWS, K.TILE_N)      # [ROWS, TILE_N] tid of (r, n)
stage_tid = np.zeros((K.TILE_N, 32), int)                       # [TILE_N, head_dim]
for tid in range(K.THREADS):
    for idx in range(tid, K.TILE_N * 32, K.THREADS):
        stage_tid[idx // 32, idx % 32] = tid
for ax, m, title, xl, yl in ((axes[0], score_tid, "scores: thread of (row, key lane)",
                              "key lane n", "row r"),
                             (axes[1], stage_tid, "staging: thread that loads K[key, d]",
                              "d", "key of the tile")):
    ax.imshow(m // 32, cmap="tab10", vmin=0, vmax=9, aspect="auto")
    for (i, j), t in np.ndenumerate(m):
        if j % (4 if m is stage_tid else 1) == 0:
            ax.text(j, i, t, ha="center", va="center", fontsize=5)
    ax.set_title(title, fontsize=9, loc="left"); ax.set_xlabel(xl); ax.set_ylabel(yl)
assert stage_tid[0, 5] == 5 and stage_tid[8, 0] == (8 * 32) % K.THREADS

# %% [markdown]
# ## A cache whose arena lives on the device
#
# The same calls as in every other notebook. `write_kv` now runs a small kernel
# (vLLM's `reshape_and_cache`) that scatters K and V into their slots, and a
# copy-on-write copy is a device-to-device copy. Let us fill the three sequences and
# check the device arena against a host cache that got the same writes.

# %%
cfg = pnp.CacheConfig(num_pages=16, page_size=P, num_kv_heads=HKV, head_dim=D)
gpu, cpu = pnp.PagedKVCache(cfg, device="cuda"), pnp.PagedKVCache(cfg)
for b, n in enumerate(seq_lens):
    k, v = rng.normal(size=(2, n, HKV, D)).astype(np.float32)    # [n, Hkv, D] each
    for cache in (gpu, cpu):
        cache.add_sequence(b, list(range(100 * b, 100 * b + n)))
        slots = cache.allocate_slots(b, int(n))
        cache.write_kv(0, slots, k, v)
        cache.append_tokens(b, list(range(100 * b, 100 * b + n)))
print(type(gpu.arena).__name__, gpu.arena.shape)
assert np.array_equal(gpu.arena.copy_to_host(), cpu.arena)
fig = viz.draw_block_tables(gpu, title="block tables of the device cache (kept on the host)")

# %% [markdown]
# ## Attention on the device, checked against NumPy
#
# `cache.layer(0)` now gives device views; `paged_attention` sees device pages and picks
# the cuda backend (`backend="auto"` would too). The result must match the NumPy kernel
# on the host copy, prefill chunk and decodes alike.

# %%
q = rng.normal(size=(int(qsl[-1]), H, D)).astype(np.float32)     # [T, H, D]
batch = gpu.batch([0, 1, 2])
out_gpu = pnp.paged_attention(q, *gpu.layer(0), batch.block_tables, batch.seq_lens,
                              query_start_loc=qsl, backend="cuda")
out_cpu = pnp.paged_attention(q, *cpu.layer(0), batch.block_tables, batch.seq_lens,
                              query_start_loc=qsl, backend="numpy")
print("max |cuda - numpy| =", np.abs(out_gpu - out_cpu).max())
assert np.allclose(out_gpu, out_cpu, atol=1e-5)

# %% [markdown]
# ## Split-K on the device
#
# With few rows, `num_kv_heads * row tiles` blocks leave most of a GPU's multiprocessors
# idle. The grid's third axis cuts each tile's keys into `num_splits` ranges; each block
# writes a partial output and its log-sum-exp, and a second kernel merges them exactly
# (notebook 2's formula). Any split count gives the same answer:

# %%
args = (q, *gpu.layer(0), batch.block_tables, batch.seq_lens, qsl, D ** -0.5, 0, True)
for splits in (1, 3):
    o, lse = nc.forward(*args, num_splits=splits)
    print(f"num_splits={splits}: max error {np.abs(o - out_cpu).max():.1e}")
    assert np.allclose(o, out_cpu, atol=1e-5)

# %% [markdown]
# On a real GPU the kernel is measured by `python -m paged_np bench --backend cuda`
# (decode bandwidth against the device's own copy bandwidth); the simulator gives no
# meaningful times.
#
# ## Exercise 7: how many thread blocks?
#
# A decode batch of 5 sequences (one query each) on a model with 32 query heads and 8 kv
# heads. How many row tiles (`p.num_work`) does the plan list, and how many thread blocks
# does the attention kernel launch with `num_splits = 4`?

# %% exercise 7
num_work = None     # row tiles in the plan
blocks = None       # thread blocks the attention kernel launches

# %% check 7
p5 = nc.plan(np.full(5, 64, np.int32), np.arange(6, dtype=np.int32), 32, 8, num_splits=4)
check("7", dict(num_work=num_work, blocks=blocks),
      dict(num_work=p5.num_work, blocks=p5.num_work * 8 * p5.num_splits),
      hints=dict(num_work=f"a sequence has n_q x group rows, cut in tiles of ROWS = "
                          f"{nc.K.ROWS}: round up, per sequence.",
                 blocks="the grid is (row tiles, num_kv_heads, num_splits)."),
      done=f"Without split-K, {p5.num_work * 8} blocks: fewer than an A100 has "
           "multiprocessors (108), which is why split-K exists.")

# %% [markdown]
# ## Self-check
#
# 1. In the score phase, which thread computes the score of row 3 against key lane 5?
#    <details><summary>answer</summary>`tid = 3 * TILE_N + 5 = 53`.</details>
# 2. Why do neighbouring threads load neighbouring `d` of one key, not neighbouring keys?
#    <details><summary>answer</summary>In HND one key's `head_dim` values are contiguous,
#    so a warp's 32 loads hit one run of memory (coalesced); neighbouring keys would be
#    `head_dim` floats apart.</details>
# 3. A decode batch of 2 sequences, 8 query heads, 8 kv heads (MHA), `ROWS = 8`: how many
#    row tiles, and how full is each?
#    <details><summary>answer</summary>2 (one per sequence); a decode row tile has
#    `n_q x group = 1` row of 8, so 7/8 of its score threads idle: GQA fills tiles
#    better.</details>
# 4. What stays on the host when the arena is on the device, and why?
#    <details><summary>answer</summary>The pool, block tables, hashes and eviction order:
#    small branchy bookkeeping; only the arena and the arithmetic move.</details>
