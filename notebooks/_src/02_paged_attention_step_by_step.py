# %% [markdown]
# # 2. Paged attention, step by step
#
# At every step a new token's query attends to all the keys and values of its sequence.
# In a paged cache those keys are not one array: they are spread over pages of the arena,
# in the order the block table gives. This notebook computes attention the obvious way
# first, then **page by page**, the way every paged kernel does:
#
# 1. dense attention: all scores, one softmax;
# 2. the **online softmax**: one page at a time, with a running max and a running sum;
# 3. a tempting shortcut (softmax each page on its own and add the results) and why it is
#    **wrong**, with numbers;
# 4. **log-sum-exp merging**, which combines per-page results *exactly*, and split-K,
#    which uses it to spread one long sequence over several workers.

# %%
import numpy as np
import matplotlib.pyplot as plt

import paged_np as pnp
from paged_np import viz
from paged_np.attention.reference import dense_attention
from paged_np.attention.numpy_paged import attend_sequence
from paged_np.attention import split_k
from _exercise import attempt, check      # notebooks/_exercise.py: checks your answers

rng = np.random.default_rng(0)

# %% [markdown]
# ## A sequence in the cache
#
# One sequence of `SEQ_LEN` tokens, one kv head of dimension `D`, pages of `P` tokens. We
# keep the K and V we write (`k_all`, `v_all`) to compare with; the kernels only see the
# pages and the block table. Token 20's key is made to match the query `q` well, so the
# attention has something to find. A second, short sequence is interleaved with it, so its pages
# are not contiguous.

# %%
SEQ_LEN, D, P = 37, 16, 8                                  # size knobs
cache = pnp.PagedKVCache(pnp.CacheConfig(num_pages=16, page_size=P, num_kv_heads=1, head_dim=D))
k_all = rng.normal(size=(SEQ_LEN, 1, D)).astype(np.float32)   # [seq_len, Hkv, D]
v_all = rng.normal(size=(SEQ_LEN, 1, D)).astype(np.float32)
q = rng.normal(size=(1, 1, D)).astype(np.float32)          # [n_q=1, H=1, D] a decode query
k_all[20, 0] += 1.2 * q[0, 0]                              # token 20 matches the query well

# %%
cache.add_sequence("x", [1] * SEQ_LEN)
cache.add_sequence("y", [2] * 12)
for start, end in ((0, 20), (20, SEQ_LEN)):                # x in two chunks, y in between
    slots = cache.allocate_slots("x", end - start)
    cache.write_kv(0, slots, k_all[start:end], v_all[start:end])
    cache.append_tokens("x", [1] * (end - start))
    if start == 0:
        y_slots = cache.allocate_slots("y", 12)
        cache.write_kv(0, y_slots, np.zeros((12, 1, D)), np.zeros((12, 1, D)))
        cache.append_tokens("y", [2] * 12)
bt = cache.block_table("x")
print("block table of x:", bt)

# %% [markdown]
# ## Dense attention, for reference
#
# For one query `q` (the newest token's), the scores are `s_j = q . k_j / sqrt(D)`; the weights are
# `softmax(s)`; the output is `sum_j w_j v_j`. The log of the softmax's denominator,
# `lse = log sum_j exp(s_j)`, will matter later. Here it is by hand, checked against the
# package's dense reference (which handles batches, heads and masks).

# %%
s = k_all[:, 0] @ q[0, 0] / np.sqrt(D)                     # [seq_len] scores
w = np.exp(s - s.max()) / np.exp(s - s.max()).sum()        # [seq_len] softmax
out_dense = w @ v_all[:, 0]                                # [D]
lse_dense = s.max() + np.log(np.exp(s - s.max()).sum())    # log-sum-exp, computed stably
ref_out, ref_lse = dense_attention(q, k_all, v_all)        # [1, 1, D], [1, 1]
assert np.allclose(out_dense, ref_out[0, 0], atol=1e-5) and np.isclose(lse_dense, ref_lse[0, 0])

# %% [markdown]
# ## The keys, page by page
#
# A paged kernel never builds `k_all`. It walks the block table: logical page `i` is page
# `bt[i]`, a `[P, D]` tile per head. Only the first `SEQ_LEN % P` rows of the last page are
# used; the rest is whatever was there before and must never be read.

# %%
k_pages, v_pages = cache.layer(0)                          # [num_pages, Hkv, P, D]
tiles = [k_pages[p, 0] for p in bt]                        # [P, D] each, in logical order
k_gathered = np.concatenate(tiles)[:SEQ_LEN]               # [seq_len, D]
print(f"{len(bt)} pages; the last one holds {SEQ_LEN - (len(bt) - 1) * P} of {P} tokens")
assert np.array_equal(k_gathered, k_all[:, 0])

# %% [markdown]
# ## The online softmax
#
# Softmax needs the max and the sum over *all* scores, but a kernel sees one page at a
# time. It keeps a running max `m` and a running sum `l = sum exp(s - m)`. When a page
# brings a larger score, the max grows and the old sum is **rescaled** by
# `alpha = exp(m_old - m_new)`, so every term always refers to the current max. At the end
# the weights are `exp(s - m) / l` and `lse = m + log l`: the dense answer, exactly.
#
# The drawing shows it for our query: scores by page with the running max (top), the
# running sum with the rescaling factor where the max jumps (middle), and the final
# weights beside the dense softmax (bottom).

# %%
fig = viz.draw_online_softmax(q[0, 0], k_all[:, 0], page_size=P)
trace = viz.online_softmax_trace(q[0, 0], k_all[:, 0], page_size=P)
assert np.allclose(trace["weights"], w) and np.isclose(trace["lse"], ref_lse[0, 0])

# %% [markdown]
# The package's NumPy kernel does the same, vectorised over heads and queries, and
# reading the pages through the block table:

# %%
out_paged = pnp.paged_attention(q, k_pages, v_pages, bt[None], np.array([SEQ_LEN], np.int32),
                                backend="numpy")           # [1, 1, D]
print("max |paged - dense| =", np.abs(out_paged - ref_out).max())
assert np.allclose(out_paged, ref_out, atol=1e-5)

# %% [markdown]
# ## The tempting shortcut, and why it is wrong
#
# Why not attend to each page on its own (its own softmax, its own output) and then add
# the page outputs, or average them? Let us measure. `attend_sequence` with
# `first_page=i, end_page=i + 1` gives page `i`'s own result: `out_i` (normalised by the
# page's own denominator) and `lse_i`.

# %%
n_pages = len(bt)
parts = [attend_sequence(q, k_pages, v_pages, bt, SEQ_LEN, 1 / np.sqrt(D), 0,
                         first_page=i, end_page=i + 1) for i in range(n_pages)]
outs = np.stack([o[0, 0] for o, _ in parts])               # [n_pages, D] per-page outputs
lses = np.array([l[0, 0] for _, l in parts])               # [n_pages]    per-page lse
wrong_sum, wrong_mean = outs.sum(0), outs.mean(0)          # [D] each
for name, o in (("sum of page outputs", wrong_sum), ("mean of page outputs", wrong_mean)):
    print(f"{name:22s} max error {np.abs(o - out_dense).max():.3f}")
assert np.abs(wrong_sum - out_dense).max() > 0.1 and np.abs(wrong_mean - out_dense).max() > 0.1

# %% [markdown]
# Both are far off. Each page's softmax divides by *its own* denominator
# `Z_i = sum_{j in page i} exp(s_j)`, so each page gets total weight 1: the sum gives the
# pages `n_pages` in total, the mean gives every page the same weight `1/n_pages`. The
# right weight of page `i` is its share of the whole denominator, `Z_i / Z`. A page that
# holds the one key our query cares about (token 20, on page 2) deserves almost all of it:

# %%
share = np.exp(lses - lse_dense)                           # [n_pages] Z_i / Z
print("right weight of each page:", np.round(share, 3), " (mean gives", 1 / n_pages, "each)")
assert np.isclose(share.sum(), 1.0)

# %% [markdown]
# ## Log-sum-exp merging is exact
#
# That share is all the merge needs, and `lse_i = log Z_i` carries it. For two parts `a`
# and `b` over disjoint keys:
#
# $$\mathrm{lse} = \log(e^{\mathrm{lse}_a} + e^{\mathrm{lse}_b}), \qquad
#   \mathrm{out} = e^{\mathrm{lse}_a - \mathrm{lse}}\,\mathrm{out}_a + e^{\mathrm{lse}_b - \mathrm{lse}}\,\mathrm{out}_b .$$
#
# No approximation: it is the same sum, regrouped. `pnp.merge_attention_states` does it
# (stably, relative to the larger `lse`). Merging the pages one after another:

# %%
out_m, lse_m = parts[0]
for o, l in parts[1:]:
    out_m, lse_m = pnp.merge_attention_states(out_m, lse_m, o, l)
print(f"{'merged with lse':22s} max error {np.abs(out_m[0, 0] - out_dense).max():.2e}")
assert np.allclose(out_m[0, 0], out_dense, atol=1e-5) and np.isclose(lse_m[0, 0], lse_dense)

# %% [markdown]
# The three answers side by side, component by component of the output vector:

# %%
fig, ax = plt.subplots(figsize=(8, 2.8))
ax.plot(out_dense, "k-", lw=2, label="dense (truth)")
ax.plot(out_m[0, 0], "o", color="tab:green", label="lse merge of pages")
ax.plot(wrong_mean, "x--", color="tab:red", label="mean of per-page softmax")
ax.set_xlabel("output component"); ax.legend(fontsize=8);

# %% [markdown]
# ## Split-K: one long sequence, several workers
#
# In a decode step each sequence has one query. A kernel that gives each (sequence, head)
# to one worker leaves most workers idle when the batch is small and the context long.
# Split-K cuts a sequence's pages into runs, attends to each run in parallel, and merges
# the partial results with the formula above. Any split gives the same answer:

# %%
args = (q, k_pages, v_pages, bt[None].astype(np.int32), np.array([SEQ_LEN], np.int32),
        np.array([0, 1], np.int32), 1 / np.sqrt(D), 0, True)
for splits in (1, 2, 3, 5):
    o, l = split_k.forward(*args, num_splits=splits)
    print(f"num_splits={splits}: max error {np.abs(o - ref_out).max():.1e}")
    assert np.allclose(o, ref_out, atol=1e-5) and np.allclose(l, ref_lse, atol=1e-5)

# %% [markdown]
# ## Exercise 2: merge by hand
#
# Write the body of `merge_pages`: from the per-page results `outs` (`[n_pages, D]`) and
# `lses` (`[n_pages]`) computed above, the full output (`[D]`), **without**
# `merge_attention_states`, in two or three lines of NumPy. Run the cell, then the check,
# which compares your output with the package's paged kernel.

# %% exercise 2
def merge_pages(outs, lses):
    """outs [n_pages, D], lses [n_pages] -> the output over all pages, [D]."""
    raise NotImplementedError        # your code here

# %% check 2
check("2", {"merge_pages": attempt(merge_pages, outs, lses)},
      {"merge_pages": out_paged[0, 0]}, atol=1e-5,
      hints="first the total lse = log(sum(exp(lses))), stably: subtract lses.max() "
            "before exp and add it back; then page i weighs exp(lses[i] - lse). A plain "
            "mean of the pages is the wrong answer drawn above.",
      done="Exact: the pages' outputs, weighted by their share of the softmax mass.")

# %% [markdown]
# **Next:** notebook 3 shows what happens to the pages when a request finishes, and how a
# later request reuses them. Notebook 6 makes the kernel fast with Numba.
