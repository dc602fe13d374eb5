# %% [markdown]
# # 12. Below the arena: host memory and disk
#
# When the arena is full, the prefix index evicts a cached page and its K/V is gone: the
# next prompt that needed it computes it again. Every serving system of the last two
# years added a second and a third place to keep such pages (vLLM's CPU offloading,
# SGLang's HiCache, LMCache's CPU and disk backends), because of the lesson of
# notebook 9: **KV bytes are the scarce resource**, and a page need not be recomputed
# if it can be *read back* faster than it is *computed*.
#
# paged_np has two such tiers, each one `EngineConfig` option:
#
# - `host_cache_memory="1GiB"`: a bounded pool of pages in host memory;
# - `disk_cache_dir="..."` (and `disk_cache_memory`): one file per page, kept across
#   restarts, checked by a fingerprint and a checksum before it is ever used.
#
# Pages are named by their prefix hash (notebook 3's SHA-256 chain), which is the same in
# every process, so a page written by yesterday's server is found by today's.
#
# **What you need:** notebooks 3 (hash chains, eviction), 8 (SmolLM2 on the cache) and
# 9 (bytes per token).
#
# **What you will be able to do:** follow a page from the arena to host memory to disk
# and back; say, from two measured numbers, when reading a page back beats computing it
# again; size the bandwidth a tier needs to be worth having.

# %%
import json
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

import paged_np as pnp
from paged_np.hardware import stream_bandwidth
from _exercise import check              # notebooks/_exercise.py: checks your answers

model, tok = pnp.load_model("smollm2-135m-instruct")          # the file's Q4_1 blocks
BENCHMARKS = Path(pnp.__file__).resolve().parents[1] / "benchmarks"   # committed tables
GREEDY = pnp.SamplingParams(max_tokens=1, temperature=0)


def tokens(n, seed):
    """``n`` token ids of SmolLM2's vocabulary (random words: only their number matters)."""
    return np.random.default_rng(seed).integers(1000, 40000, n).tolist()

# %% [markdown]
# ## 1. A page's life, drawn
#
# A small arena (48 pages of 16 tokens), a host pool of 12 pages and a disk tier in a
# temporary directory, writing back (`disk_write_policy="write_back"`: a page reaches
# the disk only when the host pool evicts it; the default, `"write_through"`, also
# writes each page as soon as it is computed, so that a restart finds it).
#
# A 128-token "system prompt" (8 pages) is asked once; then other prompts arrive and
# push it out of the arena, into host memory, then onto disk; then the system prompt is
# asked again. After each request we look up each of its 8 pages by hash in the three
# places.

# %%
page_bytes = pnp.EngineConfig(page_size=16).cache_config(model.cfg).bytes_per_page
disk_dir = Path(tempfile.mkdtemp(prefix="paged_np_tiers_"))
engine = pnp.Engine(model, num_pages=48, page_size=16, max_num_batched_tokens=512,
                    host_cache_memory=12 * page_bytes, disk_cache_dir=str(disk_dir),
                    disk_write_policy="write_back")
cache, tiers = engine.cache, engine.cache.tiers
system = tokens(128, 1)
hashes = cache.prefix_index.page_hashes(system)                # the 8 pages' names


def where():
    """[8, 3] bools: each system page in the arena, the host pool, on disk."""
    return np.array([[cache.prefix_index.lookup(h) is not None, h in tiers.host,
                      h in tiers.disk] for h in hashes])

# %%
moments = []
engine.generate([system + tokens(10, 2)], GREEDY)
moments.append(("asked", where()))
for i in range(6):
    engine.generate([tokens(160, 10 + i)], GREEDY)                # 10 pages each
    moments.append((f"other {i + 1}", where()))
again = engine.generate([system + tokens(10, 3)], GREEDY)[0]
moments.append(("asked again", where()))
print(f"asked again: {again.num_cached_prompt_tokens} of {len(again.prompt_token_ids)} "
      "prompt tokens were not computed")
print({name: t["loaded_tokens"] for name, t in engine.stats()["tiers"].items()},
      "tokens read back, by tier")

# %%
fig, axes = plt.subplots(3, 1, figsize=(10, 4.2), sharex=True)
places = ["arena", "host memory", "disk"]
colors = ["tab:blue", "tab:orange", "tab:green"]
grid = np.stack([w for _, w in moments], axis=1)                # [page, moment, place]
for k, ax in enumerate(axes):
    ax.imshow(grid[:, :, k], aspect="auto", cmap=plt.matplotlib.colors.ListedColormap(
        ["whitesmoke", colors[k]]), vmin=0, vmax=1)
    ax.set_ylabel(places[k], rotation=0, ha="right", va="center")
    ax.set_yticks([0, 7], ["page 0", "page 7"])
axes[-1].set_xticks(range(len(moments)), [m for m, _ in moments])
axes[0].set_title("where the system prompt's 8 pages are, after each request")
plt.show()

# %% [markdown]
# Read the columns left to right. The pages are computed into the arena. The other
# prompts fill it; when no page is free, the LRU victims go to the host pool (the
# prompt's tail first: the cache releases a sequence tail-first). The pool holds 12
# pages, so as the others' pages follow, the oldest move on to disk. When the system
# prompt comes back, its pages miss the arena, are found below it, and are copied into
# fresh arena pages: none of its 128 tokens is prefilled again except the last page's
# question. (The disk keeps its copy: a page is *copied* up, not moved.)
#
# The greedy answer is the one a plain engine gives: the pages read back hold the same
# bytes that were computed.

# %%
plain = pnp.Engine(model, num_pages=48, page_size=16, max_num_batched_tokens=512)
assert plain.generate([system + tokens(10, 3)], GREEDY)[0].token_ids == again.token_ids
print("same first token with and without the tiers:", again.token_ids)

# %% [markdown]
# ## 2. What is in a file on disk
#
# One page, one file, named by its hash. A short preamble, a JSON header, then the
# page's bytes exactly as the arena stores them (every layer, K and V). The header's
# fingerprint is everything that makes those bytes valid for an engine: the model's
# file hash, its config (layers, kv heads, head dim, RoPE), the page size, the KV
# format and the format's version. A different model or format looks in another folder
# and never sees these files; a truncated or corrupted file fails its checksum and is
# recomputed instead (counted in `engine.stats()["tiers"]["disk"]["faults"]`).

# %%
first = sorted(disk_dir.rglob("*.kv"))[0]
raw = first.read_bytes()
n = int.from_bytes(raw[8:12], "little")
header = json.loads(raw[16:16 + n])
print(first.relative_to(disk_dir))
print({k: header[k] for k in ("fingerprint", "hash", "shape", "dtype", "payload_bytes")})
print(f"file {len(raw):,} bytes = 16 + header {n} + page {header['payload_bytes']:,}")
assert header["payload_bytes"] == page_bytes

# %% [markdown]
# ## 3. When reading back beats recomputing
#
# Reading a token back moves its K/V: for SmolLM2 with float32 pages, 30 layers x K and V
# x 3 kv heads x 64 values x 4 bytes = 46,080 bytes. Computing it again costs a share of a
# prefill. So a tier is worth having when
#
# `bytes per token / read bandwidth  <  prefill seconds per token`,
#
# and the **break-even bandwidth** is the bandwidth at which the two are equal. Both
# sides measured here: the prefill of a 256-token prompt, and the read back of the
# system prompt from the scenario above (timed again, from disk, in a fresh engine on
# the same directory: a restart).

# %%
bytes_per_token = page_bytes / 16
fresh = pnp.Engine(model, num_pages=48, page_size=16, max_num_batched_tokens=512)
fresh.generate([tokens(64, 5)], GREEDY)                         # warm up
t0 = time.perf_counter()
fresh.generate([tokens(256, 6)], GREEDY)
prefill_s_per_token = (time.perf_counter() - t0) / 256

restarted = pnp.Engine(model, num_pages=48, page_size=16, disk_cache_dir=str(disk_dir))
t0 = time.perf_counter()
n_read = restarted.cache.add_sequence("r", system + tokens(10, 3))   # the tiers' load
disk_s = time.perf_counter() - t0
disk_gbs = n_read * bytes_per_token / disk_s / 1e9
print(f"prefill: {prefill_s_per_token * 1e3:.2f} ms/token;  disk read back: {n_read} "
      f"tokens in {disk_s * 1e3:.1f} ms = {disk_gbs:.2f} GB/s")

# %% [markdown]
# ## Exercise 12a: the break-even
#
# From `bytes_per_token` and `prefill_s_per_token` measured above, compute
#
# - `break_even_gbs`: the read bandwidth (GB/s, 1 GB = 1e9 bytes) at which reading a token
#   back takes as long as computing it;
# - `disk_speedup`: how many times faster than recomputing a token it is to read it back
#   at `disk_gbs`, the disk tier's measured bandwidth.

# %% exercise 12a
break_even_gbs = None   # GB/s
disk_speedup = None     # recompute time / read-back time, at disk_gbs

# %% check 12a
_be = bytes_per_token / prefill_s_per_token / 1e9
check("12a", dict(break_even_gbs=break_even_gbs, disk_speedup=disk_speedup),
      dict(break_even_gbs=_be, disk_speedup=disk_gbs / _be), rtol=1e-6,
      hints={"break_even_gbs": "bytes_per_token / bandwidth = prefill_s_per_token: solve "
                               "for the bandwidth, then divide by 1e9.",
             "disk_speedup": "read-back time per token is bytes_per_token / (disk_gbs * 1e9)."},
      done="Any tier faster than that bandwidth pays for itself on every page it serves.")

# %% [markdown]
# ## 4. The break-even, drawn
#
# Time per token against a tier's read bandwidth: reading back falls as the bandwidth
# grows, recomputing does not depend on it. The dots are the bandwidths measured: this
# notebook's disk read, and the committed benchmark's host and disk rows
# (`benchmarks/kv_tiers.md`, 2,000 tokens), and the machine's streaming read. With int8
# pages (notebook 10) a token is 12,240 bytes: the break-even moves 3.8x lower.

# %%
bw = np.logspace(-3, 2, 200)                                     # GB/s
bench = json.loads((BENCHMARKS / "kv_tiers.json").read_text())
measured = {"disk (here)": disk_gbs, "machine's stream read": stream_bandwidth(3)}
for way in ("host", "disk"):
    runs = bench["results"][way]
    measured[f"{way} (benchmark)"] = np.median([r["loaded_tokens"] * r["bytes_per_token"]
                                                / r["load_s"] for r in runs]) / 1e9
fig, ax = plt.subplots(figsize=(7, 3.6))
ax.loglog(bw, bytes_per_token / (bw * 1e9) * 1e3, label="read back, float32 pages")
ax.loglog(bw, 12_240 / (bw * 1e9) * 1e3, "--", label="read back, int8 pages")
ax.axhline(prefill_s_per_token * 1e3, color="k", label="recompute (prefill)")
ax.axvline(bytes_per_token / prefill_s_per_token / 1e9, color="gray", ls=":",
           label="break-even, float32")
for name, g in measured.items():
    ax.scatter([g], [bytes_per_token / (g * 1e9) * 1e3], zorder=3, label=name)
ax.set_xlabel("read bandwidth of the tier (GB/s)")
ax.set_ylabel("ms per token")
ax.legend(fontsize=7)
plt.show()

# %% [markdown]
# On the project's 2-core machine a prefill token of SmolLM2 costs from about one to tens
# of milliseconds (the more other jobs share the cores, the more), so the break-even is
# between a few and about 50 MB/s: any disk, even a network one, reads a page back faster
# than the model computes it. The tiers win by one to two orders of magnitude
# (`benchmarks/kv_tiers.md`), and the margin *grows* with the context: a prefill token's
# attention reads every token before it, while a page read back costs the same at any
# position. What limits a tier in practice is not its bandwidth but its size (how many
# pages it keeps, `python -m paged_np simulate --tiers`) and, on a GPU, the PCIe link
# between host and device memory (25-60 GB/s), against a prefill that is 1000x faster
# than here: that is where vLLM's and SGLang's break-even discussions live.
#
# ## Self-check
#
# 1. A page is in the host pool and on disk when a prompt needs it. Which copy is read?
#    <details><summary>answer</summary>The host pool's: the tiers are asked top down, and the
#    first hit ends the lookup for that page.</details>
# 2. Two tenants send the same system prompt with different `cache_salt`s. How many copies
#    of its pages can the disk hold?
#    <details><summary>answer</summary>Two: the salt enters the hash chain (the cache's
#    `extra_key`), so their pages have different names in every tier.</details>
# 3. Why are disk writes atomic (a temporary file renamed), and what happens to a page a
#    crash cut in half anyway?
#    <details><summary>answer</summary>The rename makes a page's name appear only with the
#    whole page behind it; a file that still reads short or wrong fails the checksum, is
#    removed, counted as a fault, and its tokens are recomputed.</details>
# 4. With a reuse gate of 1 (`tier_reuse_gate=1`), which pages never reach a tier?
#    <details><summary>answer</summary>Those only one prompt asked for: a one-off request's
#    pages do not push out pages that are shared.</details>
