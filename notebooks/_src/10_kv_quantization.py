# %% [markdown]
# # 10. Quantized KV pages: int8 and fp8
#
# The KV cache is the memory this package manages, and so far every page held float32
# (or float16) numbers. A page of 8-bit numbers holds the same tokens in a quarter of
# float32's bytes: about **4x the tokens in the same memory**, so 4x the chats before
# anyone is preempted, and at long context the decode kernel, which is limited by the
# memory bus, reads 4x fewer bytes. vLLM stores KV as fp8, llama.cpp as q8_0
# (`--cache-type-k q8_0`). The price is rounding. This lesson measures both sides.
#
# `kv_cache_dtype` (vLLM's name) picks the format: `"auto"` (float32), `"float16"`,
# `"int8"` or `"fp8_e4m3"`.
#
# **What you need:** notebook 6 (why decode is bound by the bytes it reads) and notebook
# 8 (the engine on a real model); notebook 9's idea of a scale helps.
#
# **What you will be able to do:** quantize a page of K or V to int8 by hand, with one
# scale per token, checked against the package; say why the granularity of the scale
# matters when a few channels are large; tell int8's flat error from fp8's relative one;
# count what 8-bit pages buy in capacity and cost in attention error; say how vLLM's
# fp8 cache differs from paged_np's in where its scales live.

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

import paged_np as pnp
from paged_np.attention.reference import dense_attention
from paged_np.cache.kv_quant import FP8_E4M3, dequantize, quantize
from _exercise import Hint, check, hint  # notebooks/_exercise.py: checks your answers

rng = np.random.default_rng(0)
BENCHMARKS = Path(pnp.__file__).resolve().parents[1] / "benchmarks"   # committed tables

# %% [markdown]
# ## One row, one scale
#
# An 8-bit number has 256 values, so a K or V row must be *scaled* into their range
# first. paged_np keeps one float32 **scale per token and kv head**: the `head_dim`
# values one token writes for one kv head share it. (vLLM does not: its fp8 KV cache
# keeps one scale per *tensor*, a `k_scale` and a `v_scale` per layer, calibrated ahead
# of time or left at 1.0, and some of its attention backends one per kv head; no token
# stores a scale of its own. Coarser scales cost no bytes per token; a token's scale
# fits its own values.) Symmetric quantization, int8:
#
# ```
# scale = max(|x|) / 127        # the row's largest value becomes +-127
# code  = round(x / scale)      # int8 in [-127, 127]
# x'    = code * scale          # what attention reads back
# ```
#
# Rounding moves each value by at most half a step, `scale / 2`. Here is one page of K
# (one kv head, 16 tokens of 64 values) with a few large channels, as real models have.

# %%
page = rng.standard_normal((16, 64)).astype(np.float32)         # [page_size, head_dim]
page[:, [3, 40]] *= 8                                           # two outlier channels
codes, scales = quantize(page, "int8")                          # int8 [16, 64], f32 [16]
back = dequantize(codes, scales)                                # float32 [16, 64]
print("token 0: x =", page[0, :4].round(3), "codes", codes[0, :4], "scale", scales[0])
print("largest error:", np.abs(back - page).max(), " half a step:", scales.max() / 2)
assert (np.abs(back - page) <= scales[:, None] / 2 * 1.0001).all()

# %% [markdown]
# ## The error of a page, drawn
#
# Each cell below is one value of the page: its error after int8 and after fp8
# quantization. fp8 e4m3 (1 sign, 4 exponent, 3 mantissa bits) keeps a *relative*
# precision: small values are stored finely, large ones coarsely. int8 has the same
# absolute step across the row, so its error is flat.

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 3.2), sharey=True)
for ax, fmt in zip(axes, ("int8", "fp8_e4m3")):
    err = np.abs(dequantize(*quantize(page, fmt)) - page)       # [16, 64]
    im = ax.imshow(err, aspect="auto", cmap="magma")
    ax.set(title=f"{fmt}: |x' - x| (max {err.max():.3f})", xlabel="head_dim",
           ylabel="token of the page")
    fig.colorbar(im, ax=ax)
plt.show()

# %% [markdown]
# The two outlier columns set each row's scale, so the *other* values of a row get a
# coarse step too: that is why a scale per token (and not one per page) matters, and
# why llama.cpp's q8_0 uses a scale per 32 values. paged_np measured the three choices
# on SmolLM2's real K/V (`benchmarks/kv_scale_granularity.md`).

# %%
print((BENCHMARKS / "kv_scale_granularity.md").read_text())

# %% [markdown]
# ## The fp8 grid
#
# fp8 e4m3 values are not evenly spaced: every power of two holds 8 of them. The 256
# codes are read back through a table (`FP8_E4M3`); its positive half, drawn beside
# int8's evenly spaced grid (both scaled to a maximum of 1):

# %%
pos = FP8_E4M3[:0x7F] / 448                                     # codes 0..126, ascending
plt.figure(figsize=(9, 1.8))
plt.plot(pos, np.zeros_like(pos) + 1, "|", ms=14, label="fp8 e4m3 / 448")
plt.plot(np.arange(128) / 127, np.zeros(128), "|", ms=14, label="int8 / 127")
plt.yticks([]); plt.xlabel("value / max"); plt.legend(loc="center right")
plt.show()

# %% [markdown]
# ## Capacity: pages per MiB
#
# The same 64 MiB budget, four formats (the tiny test model: 2 layers, 2 kv heads of
# 32). The 8-bit pages pay 4 bytes of scale per 32-byte row, so they hold 3.56x
# float32's pages here, 3.76x with SmolLM2's rows of 64.

# %%
model_cfg = pnp.ModelConfig()
formats = ["auto", "float16", "int8", "fp8_e4m3"]
pages = {f: pnp.EngineConfig(kv_cache_dtype=f, kv_cache_memory="64MiB")
         .cache_config(model_cfg).num_pages for f in formats}
for f in formats:
    print(f"{f:>9}: {pages[f]:>7,} pages  ({pages[f] / pages['auto']:.2f}x float32)")
assert pages["int8"] >= 3.5 * pages["auto"]

# %% [markdown]
# ## Quality: how far attention moves
#
# A decode step over a paged cache of 300 tokens, once per format. The kernel reads the
# codes, widens them, and multiplies each score and each weight by its token's scale;
# the result is compared with the same attention over the float32 K/V.

# %%
def attention_error(fmt, n=300, heads=(8, 2), d=64, ps=16):
    cache = pnp.PagedKVCache(pnp.CacheConfig(num_pages=32, page_size=ps, num_kv_heads=2,
                                             head_dim=d, dtype=fmt))
    cache.add_sequence("a", list(range(n)))
    k, v = (rng.standard_normal((n, 2, d)).astype(np.float32) for _ in range(2))
    k[:, :, [3, 40]] *= 8                                       # outlier channels again
    cache.write_kv(0, cache.allocate_slots("a", n), k, v)
    cache.append_tokens("a", list(range(n)))
    q = rng.standard_normal((1, heads[0], d)).astype(np.float32)
    b = cache.batch(["a"])
    kp, vp = cache.layer(0)
    ks, vs = cache.layer_scales(0)
    out = pnp.paged_attention(q, kp, vp, b.block_tables, b.seq_lens, k_scales=ks,
                              v_scales=vs, backend="numpy")
    ref, _ = dense_attention(q, k, v, dtype=np.float32)
    return float(np.abs(out - ref[-1:]).max() / np.abs(ref).max())

errors = {f: attention_error(f) for f in formats}
print({f: f"{e:.1e}" for f, e in errors.items()})
plt.figure(figsize=(5, 3.2))
for f in formats:
    plt.scatter(pages[f] / pages["auto"], max(errors[f], 1e-9), s=60)
    plt.annotate(f, (pages[f] / pages["auto"], max(errors[f], 1e-9)), xytext=(6, 4),
                 textcoords="offset points")
plt.yscale("log"); plt.xlabel("pages per MiB / float32's"); plt.ylabel("attention error")
plt.title("capacity against quality"); plt.show()

# %% [markdown]
# **Perplexity.** The attention error is a proxy. What a user notices is the model's
# answers; `python -m paged_np eval` measures perplexity through `prompt_logprobs` for
# each `kv_cache_dtype` (and each weight format) on 2048 tokens of English text that
# ships with Python. Its committed table:

# %%
print((BENCHMARKS / "perplexity_kv.md").read_text())

# %% [markdown]
# ## The engine with int8 pages
#
# `kv_cache_dtype` is an engine option like any other (`LLM`, `Engine`, `serve`,
# `--kv-cache-dtype` on every command). The write path quantizes each token's row as it
# is written; copy-on-write copies a page's scales with it, swap moves them, a prefix
# hit reuses them. The tiny random model, float32 pages against int8 pages:

# %%
model = pnp.LlamaModel.random(pnp.ModelConfig(), seed=0)
params = pnp.SamplingParams(max_tokens=12, temperature=0)
prompt = list(range(5, 45))
texts = {}
for f in ("auto", "int8"):
    engine = pnp.Engine(model, num_pages=24, page_size=8, kv_cache_dtype=f, backend="numpy")
    texts[f] = engine.generate([prompt], params)[0].token_ids
    print(f"{f:>5}: {texts[f]}   ({engine.cache.cfg.bytes_per_page} bytes per page)")

# %% [markdown]
# ## Exercise 10: quantize one page by hand
#
# Write `my_quantize(page)`: for a float32 page `[page_size, head_dim]` of one kv head,
# return `(codes, scales)`: int8 codes `[page_size, head_dim]` and float32 scales
# `[page_size]`, one per token, as described at the top (symmetric, largest value to
# +-127, round to the nearest integer). Then `worst`: the largest `|x' - x|` your codes
# give on `page`. The check compares with `paged_np.cache.kv_quant.quantize`.

# %% exercise 10
def my_quantize(page):
    raise NotImplementedError


worst = None        # max |dequantized - page| of your codes

# %% check 10
from _exercise import attempt

got = attempt(my_quantize, page)
want_codes, want_scales = quantize(page, "int8")
ok_shape = isinstance(got, tuple) and len(got) == 2
check("10", dict(codes=got[0] if ok_shape else got, scales=got[1] if ok_shape else got,
                 worst=worst),
      dict(codes=want_codes, scales=want_scales,
           worst=float(np.abs(dequantize(want_codes, want_scales) - page).max())),
      hints=dict(codes=Hint("each value divided by its own token's scale, rounded to "
                            "the nearest integer, stored as int8.",
                            code="np.rint(page / scales[:, None]).astype(np.int8)"),
                 scales=Hint("one scale per token (a row of the page): the row's largest "
                             "magnitude maps to 127.",
                             code="np.abs(page).max(axis=1) / 127, as float32"),
                 worst=Hint("what attention reads back is code x scale; the worst error "
                            "is the largest distance from the page, over the whole page.",
                            code="np.abs(codes * scales[:, None] - page).max()")),
      done="one scale per token: a page fills token by token, and no token's scale ever "
           "changes after it is written.", atol=1e-5)

# %% [markdown]
# ## Self-check
#
# 1. A token's K row for one kv head is `[0.5, -2.54, 1.0]`. Its int8 scale, and the code
#    of 1.0?
#    <details><summary>answer</summary>scale = 2.54 / 127 = 0.02; code = round(1.0 /
#    0.02) = 50.</details>
# 2. Why does one large channel hurt the other values of its row, and how does a finer
#    scale help?
#    <details><summary>answer</summary>The largest value sets the step, so every value of
#    the row is rounded on that coarse grid; a scale per smaller group (llama.cpp's q8_0:
#    per 32 values) gives the other groups a step of their own.</details>
# 3. int8 or fp8 e4m3: which keeps small values better, and why?
#    <details><summary>answer</summary>fp8: its grid is relative (8 values per power of
#    two), so small values get small steps; int8's step is the same across the row.
#    </details>
# 4. Why does an 8-bit page of head_dim 64 hold 3.76x float32's tokens, not 4x?
#    <details><summary>answer</summary>Each row pays a 4-byte float32 scale: 64 + 4 = 68
#    bytes against 256, and 256 / 68 = 3.76.</details>
# 5. vLLM's fp8 KV cache and paged_np's: where do the scales live?
#    <details><summary>answer</summary>vLLM: one scale per tensor (per layer, for K and
#    for V), or per kv head in some backends, fixed before serving. paged_np: one per
#    token and kv head, computed as each token is written.</details>
