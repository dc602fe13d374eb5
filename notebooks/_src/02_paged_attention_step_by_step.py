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
#    which uses it to spread one long sequence over several workers;
# 5. the **causal mask** of a prefill or a chunk of queries, and query heads sharing kv
#    heads (**GQA**, **MQA**).
#
# **What you need:** notebook 1 (pages, block tables); softmax and a matrix product in
# NumPy; `exp` and `log` (log-sum-exp is explained here).
#
# **What you will be able to do:** compute attention over a paged sequence in one pass,
# keeping a running max, sum and output; explain why a per-page softmax is wrong and
# merge partial results exactly; say which keys each query of a prefill chunk may see,
# and which kv head each query head reads.

# %%
import numpy as np
import matplotlib.pyplot as plt

import paged_np as pnp
from paged_np import viz
from paged_np.attention.reference import dense_attention
from paged_np.attention.numpy_paged import attend_sequence
from paged_np.attention import split_k
from _exercise import Hint, OneAtATime, attempt, check, check_function, hint, in_one_pass

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
# time and must not keep the scores (a long context has too many). It keeps three
# running things, and reads each page once:
#
# - `m`, the largest score so far;
# - `l = sum exp(s_j - m)`, the softmax's denominator so far;
# - `acc = sum exp(s_j - m) v_j`, the output so far, **not yet divided** by `l` (`[D]`).
#
# For each page, with its scores `s` (`[P]`) and values `V` (`[P, D]`):
#
# ```
# m_new = max(m, s.max())
# alpha = exp(m - m_new)               # rescales what was summed against the old max
# p     = exp(s - m_new)               # [P] this page's unnormalised weights
# l     = alpha * l + p.sum()
# acc   = alpha * acc + p @ V          # [D]
# m     = m_new
# ```
#
# When a page brings a larger score, the max grows and both the old sum and the old
# output are **rescaled** by `alpha`, so every term always refers to the current max.
# After the last page, `out = acc / l` and `lse = m + log l`: the dense answer, exactly,
# in one pass over the pages (FlashAttention's loop, page by page).
#
# The drawing shows the weights' side of it for our query: scores by page with the running max (top), the
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
# ## Prefill and chunks: the causal mask
#
# So far one query, the newest token's, saw every key. A **prefill** computes a whole
# prompt at once: `n_q` queries, the last `n_q` tokens of a sequence of `seq_len`, and
# query `i` sits at position `seq_len - n_q + i`. A token may only attend to itself and
# earlier tokens, so query `i` sees keys `0 .. seq_len - n_q + i` and no later one: the
# **causal mask**, a staircase. A prompt computed in **chunks** (notebook 5's chunked
# prefill) is the same rule with the earlier chunks already in the cache: the chunk's
# first query sees every earlier token and itself, and each later query one more key
# than the query before it. Decode is
# the case `n_q = 1`: the one query sees everything.
#
# Below, a chunk of 5 queries at the end of our 37-token sequence: the mask drawn, and the
# paged kernel checked against a dense softmax masked by hand.

# %%
n_q = 5
q_pos = SEQ_LEN - n_q + np.arange(n_q)                     # [n_q] the queries' positions
mask = np.arange(SEQ_LEN)[None, :] <= q_pos[:, None]       # [n_q, seq_len] True: may see
qc = rng.normal(size=(n_q, 1, D)).astype(np.float32)       # [n_q, H=1, D]
sc = np.where(mask, qc[:, 0] @ k_all[:, 0].T / np.sqrt(D), -np.inf)   # [n_q, seq_len]
wc = np.exp(sc - sc.max(1, keepdims=True)); wc /= wc.sum(1, keepdims=True)
out_chunk = pnp.paged_attention(qc, k_pages, v_pages, bt[None], np.array([SEQ_LEN], np.int32),
                                np.array([0, n_q], np.int32), backend="numpy")  # [n_q, 1, D]
assert np.allclose(out_chunk[:, 0], wc @ v_all[:, 0], atol=1e-5)
fig, ax = plt.subplots(figsize=(8, 1.4))
ax.imshow(mask[:, 24:], cmap="Blues", aspect="auto", extent=(23.5, SEQ_LEN - 0.5, n_q - 0.5, -0.5))
ax.set_xlabel("key position (24 and later; every query sees all the earlier ones)")
ax.set_ylabel("query"); ax.set_title("causal mask of a 5-query chunk", fontsize=9, loc="left");

# %% [markdown]
# ## Query heads that share kv heads: MHA, GQA, MQA
#
# A model has `H` query heads. With **multi-head attention** (MHA) each has its own kv
# head, so the cache stores `H` keys and values per token. **Grouped-query attention**
# (GQA) lets a group of `H / Hkv` query heads share one kv head: query head `h` reads kv
# head `h // (H / Hkv)`, and the cache is `H / Hkv` times smaller (SmolLM2-135M: 9 query
# heads, 3 kv heads). **Multi-query attention** (MQA) is the extreme, `Hkv = 1`: every
# query head reads the same single kv head. The kernel's job is unchanged; it reads each
# kv head's page once and uses it for the whole group, which is what notebook 6 counts as
# more FLOPs per byte.

# %%
H, HKV = 4, 2                                              # 2 query heads per kv head
kv = pnp.PagedKVCache(pnp.CacheConfig(num_pages=8, page_size=P, num_kv_heads=HKV, head_dim=D))
kg, vg = (rng.normal(size=(20, HKV, D)).astype(np.float32) for _ in range(2))
kv.add_sequence("g", [1] * 20); kv.write_kv(0, kv.allocate_slots("g", 20), kg, vg)
qg = rng.normal(size=(1, H, D)).astype(np.float32)         # [1, H, D]
og = pnp.paged_attention(qg, *kv.layer(0), kv.block_table("g")[None],
                         np.array([20], np.int32), backend="numpy")  # [1, H, D]
for h in range(H):                                         # head h reads kv head h // 2
    ref, _ = dense_attention(qg[:, h:h + 1], kg[:, h // (H // HKV)][:, None],
                             vg[:, h // (H // HKV)][:, None])
    assert np.allclose(og[0, h], ref[0, 0], atol=1e-5)
print("query heads 0,1 read kv head 0; 2,3 read kv head 1: checked against dense")

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
# ## Exercise 2b: the one-pass loop, yours
#
# Write `online_attention`: one query `q` (`[D]`) over a sequence of `seq_len` tokens
# whose pages arrive **one at a time**, as a kernel reads them: `for K, V in pages:` gives
# each page's keys and values (`[P, D]` each), in logical order. Keep only `m`, `l` and
# `acc` (the loop above) and return `(out, lse)`: the output `[D]` and the log-sum-exp
# of the scaled scores. Mind the last page: only its first `seq_len - (n_pages - 1) * P`
# rows are the sequence's; the rest is whatever the arena held there.
#
# The check hands the pages over the way a kernel sees them: once, in one buffer that
# the next page overwrites (after the last page it holds NaN), and it traces your
# function's memory. So gathering every key for one softmax at the end is refused, even
# with copies: that is dense attention, and the point of the loop is that it never holds
# the sequence. It runs 20 random sequences (lengths up to 200, page sizes 4 to 16,
# scattered block tables) through yours and the package's kernel and shows the first that
# differs, with both parts of the answer.

# %% exercise 2b
def online_attention(q, pages, seq_len):
    """q [D]; pages: (K [P, D], V [P, D]) per page, in order, once -> (out [D], lse)."""
    raise NotImplementedError        # your code here (about a dozen lines)

# %% check 2b
def package_attention(q, pages, seq_len):
    """The package's kernel on the same pages, read from the arena they came from."""
    out, lse = pnp.paged_attention(q[None, None], pages.k_pages[:, None], pages.v_pages[:, None],
                                   np.asarray(pages.block_table, np.int32)[None],
                                   np.array([seq_len], np.int32), backend="numpy",
                                   return_lse=True)
    return out[0, 0], float(lse[0, 0])


def random_sequence(r):
    ps, d = int(r.choice([4, 8, 16])), 32
    seq_len = int(r.integers(1, 40) if r.random() < 0.4 else r.integers(100, 200))
    n = -(-seq_len // ps)
    kp, vp = (r.normal(size=(64, ps, d)).astype(np.float32) for _ in range(2))
    return r.normal(size=d).astype(np.float32), OneAtATime(kp, vp, r.permutation(64)[:n],
                                                           seq_len), seq_len


r = np.random.default_rng(2)
check_function("2b", lambda q, pages, n: in_one_pass(online_attention, q, pages, n),
               package_attention, [random_sequence(r) for _ in range(20)],
               atol=1e-4, rtol=1e-4, blank="the body of online_attention",
               describe=lambda q, pages, n: repr(pages),
               hints=Hint("three running values: the largest score so far m, the sum l of "
                          "exp(score - m), and acc, the sum of exp(score - m) * v; when a page "
                          "raises m, multiply l and acc by exp(m_old - m_new) before adding "
                          "the page; at the end out = acc / l and lse = m + log(l).",
                          code="m, l, acc = -np.inf, 0.0, np.zeros(D); for i, (K, V) in "
                               "enumerate(pages): rows = min(P, seq_len - i * P); s = "
                               "K[:rows] @ q / np.sqrt(D); m_new = max(m, s.max()); alpha, "
                               "p = np.exp(m - m_new), np.exp(s - m_new); l = alpha * l + "
                               "p.sum(); acc = alpha * acc + p @ V[:rows]; m = m_new."),
               done="One pass, three running values, no page kept: the loop inside every "
                    "paged kernel.")

# %% [markdown]
# ## Self-check
#
# 1. In the online softmax, why must `acc` be rescaled by `alpha` too, not only `l`?
#    <details><summary>answer</summary>`acc` sums `exp(s_j - m) v_j` against the old max;
#    when the max grows, every earlier term must be multiplied by `exp(m_old - m_new)` to
#    refer to the new one, exactly as the terms of `l` are.</details>
# 2. Two pages have `lse_a = 2.0` and `lse_b = 2.0`. What weight does each page's output
#    get in the merge?
#    <details><summary>answer</summary>One half each: `lse = log(2 e^2) = 2 + log 2`, and
#    `exp(2 - lse) = 1/2`.</details>
# 3. A prefill chunk of 4 queries ends a 10-token sequence. How many keys does its first
#    query see?
#    <details><summary>answer</summary>7: it sits at position 10 - 4 + 0 = 6 and sees
#    keys 0 to 6.</details>
# 4. A model has 32 query heads and 8 kv heads. Which kv head does query head 13 read,
#    and how much smaller is its cache than with MHA?
#    <details><summary>answer</summary>13 // (32 / 8) = 3; the cache is 4x smaller.</details>
#
# **Next:** notebook 3 shows what happens to the pages when a request finishes, and how a
# later request reuses them. Notebook 6 makes the kernel fast with Numba.
