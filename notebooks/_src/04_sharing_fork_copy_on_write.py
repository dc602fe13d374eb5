# %% [markdown]
# # 4. Sharing pages: fork and copy-on-write
#
# Some requests ask for several answers to **one** prompt: parallel sampling (`n = 4`
# completions), beam search (keep the `k` best continuations). Every answer starts from
# the same prompt KV. Copying that KV once per answer would multiply the memory by `n`;
# instead the answers **share** the prompt's pages, exactly like processes after a Unix
# `fork()` share memory pages.
#
# Sharing is safe as long as nobody writes. The first time an answer writes into a page
# that others also hold (the prompt's partly filled last page), that page is **copied**
# first: *copy-on-write*. Each page counts its holders (`ref_count`); a page with
# `ref_count > 1` is copied before a write, a page with `ref_count == 1` is written in
# place.
#
# > **vLLM V0 and V1.** Fork and copy-on-write are how vLLM's first engine (**V0**, the
# > paper's) shared pages, and how this notebook and paged_np do. vLLM's current engine,
# > **V1**, has **no copy-on-write** and no fork: a request for `n > 1` samples runs as
# > `n` requests with the same prompt, which share the prompt's *full* blocks through
# > prefix caching (notebook 3), while each computes and owns its partial last block (a
# > few prompt tokens computed `n` times instead of one page copied `n - 1` times). Its
# > free blocks form a FIFO queue that is also the LRU order of cached blocks, where
# > V0 kept a free list (notebook 1). Beam search in V1 is built outside the engine core
# > on the same prefix sharing. The memory saved is nearly the same; what differs is who
# > shares (requests through the prefix cache, not sequences through a block table).
#
# **What you need:** notebook 1 (pages, block tables, `allocate_slots`); notebook 3's
# page states help but are not required.
#
# **What you will be able to do:** say what a fork costs and when a write copies a page;
# write the copy-on-write step inside an allocation, checked against the package; count
# the pages parallel sampling and beam search save.

# %%
import numpy as np
import matplotlib.pyplot as plt

import paged_np as pnp
from paged_np import viz
from _exercise import Hint, check, check_function, hint  # notebooks/_exercise.py

rng = np.random.default_rng(0)

# %%
def compute(cache, sid, token_ids):
    """Stand-in for the model: random K/V for token_ids, written into the cache."""
    slots = cache.allocate_slots(sid, len(token_ids))
    kv = rng.normal(size=(len(token_ids), cache.cfg.num_kv_heads, cache.cfg.head_dim))
    for layer in range(cache.cfg.num_layers):
        cache.write_kv(layer, slots, kv, kv)
    cache.append_tokens(sid, token_ids)
    return slots

# %% [markdown]
# ## Parallel sampling: four answers, one prompt
#
# A 10-token prompt fills two pages and half of a third (`page_size = 4`). After the
# prompt is computed, `fork` gives three more sequences the same block table: no page is
# copied, every page's `ref_count` is now 4.

# %%
cache = pnp.PagedKVCache(pnp.CacheConfig(num_pages=16, page_size=4, num_layers=2,
                                         num_kv_heads=1, head_dim=8))
prompt = list(range(100, 110))
cache.add_sequence("s0", prompt)
compute(cache, "s0", prompt)
for child in ("s1", "s2", "s3"):
    cache.fork("s0", child)
print("block tables:", {s: cache.block_table(s).tolist() for s in cache.seq_ids})
print("ref counts of pages 0-2:", [cache.pool.ref_count(p) for p in range(3)])
assert all(cache.pool.ref_count(p) == 4 for p in range(3))
fig = viz.draw_block_tables(cache)

# %% [markdown]
# Four sequences, twelve logical pages, three physical pages: every arrow lands on one of
# pages 0, 1, 2, each marked `x4`.
#
# ## The first write copies the shared page
#
# Now each sample generates its first token. Its position (10) is on logical page 2,
# which all four share. `allocate_slots` sees `ref_count > 1`, copies the page (every
# layer) to a fresh one, points the sequence's block table at the copy, and drops its
# reference to the original. The last sample to write finds `ref_count == 1`: the page is
# its alone by then, and it writes in place. So four writers make **three** copies.

# %%
for s, tok in zip(("s0", "s1", "s2", "s3"), (201, 202, 203, 204)):
    compute(cache, s, [tok])
print("cow copies:", cache.stats()["cow_copies"])
print("block tables:", {s: cache.block_table(s).tolist() for s in cache.seq_ids})
assert cache.stats()["cow_copies"] == 3
cache.check_invariants()
fig = viz.draw_block_tables(cache)

# %% [markdown]
# A copy carries the prompt tokens that were already on the page. Check it in the arena:
# the first two slots of each copy hold the same K as the original page (tokens 8 and 9),
# while slot 2 holds each sample's own token.

# %%
k_pages, _ = cache.layer(0)                            # [num_pages, 1, page_size, head_dim]
last_pages = [int(cache.block_table(s)[2]) for s in ("s0", "s1", "s2", "s3")]
reference = k_pages[last_pages[-1], :, :2]             # s3 kept the original page
for p in last_pages:
    assert np.array_equal(k_pages[p, :, :2], reference)        # prompt tokens 8, 9: copied
print("slot 2 of each copy (first component):", [float(k_pages[p, 0, 2, 0]) for p in last_pages])
assert len({float(k_pages[p, 0, 2, 0]) for p in last_pages}) == 4  # four different tokens

# %% [markdown]
# From here on each sample writes into its own pages; only the two full prompt pages stay
# shared. The saving is the prompt, once per extra sample. For long prompts and short
# answers (a typical chat turn) that is most of the memory.
#
# ## How much does sharing save?
#
# Let us measure it with the cache itself: `n` samples of a prompt of `PROMPT` tokens, each
# generating `GEN` tokens, with and without fork (without: every sample computes its own
# copy of the prompt).

# %%
PROMPT, GEN, P = 200, 40, 16                            # size knobs (tokens)

def pages_in_use(n, share):
    c = pnp.PagedKVCache(pnp.CacheConfig(num_pages=1024, page_size=P, head_dim=4),
                         record_events=False)
    ids = list(range(1, PROMPT + 1))
    for i in range(n if not share else 1):
        c.add_sequence(i, ids); c.allocate_slots(i, PROMPT); c.append_tokens(i, ids)
    for i in range(1, n if share else 0):
        c.fork(0, i)
    for i in range(n):
        c.allocate_slots(i, GEN); c.append_tokens(i, [7] * GEN)
    return c.stats()["num_in_use"]

# %%
ns = np.arange(1, 9)
shared = [pages_in_use(n, True) for n in ns]
separate = [pages_in_use(n, False) for n in ns]
print("shared:  ", shared, "\nseparate:", separate)

# %% [markdown]
# Derive the shared count by hand: the prompt's full pages are stored once; each sample
# owns the rest of its sequence, from its copy of the partly filled prompt page to the end.

# %%
full_prompt_pages = PROMPT // P
own_pages = -(-(PROMPT + GEN) // P) - full_prompt_pages      # pages per sample
by_hand = full_prompt_pages + ns * own_pages
assert list(by_hand) == shared

fig, ax = plt.subplots(figsize=(6, 3))
ax.plot(ns, separate, "o-", label="each sample has its own prompt")
ax.plot(ns, shared, "o-", label="fork + copy-on-write")
ax.set_xlabel("samples n"); ax.set_ylabel("pages in use"); ax.legend(fontsize=8);

# %% [markdown]
# ## Beam search: fork the winners, free the losers
#
# Beam search keeps the `k` best partial answers. At each step every beam proposes
# continuations; the best `k` survive. A survivor that is not the first child of its parent
# is a `fork`, a beam with no survivor is `free`d. Over a few steps the beams end up sharing
# a common stem of pages and differing only in their tails. Below, scores are random (a
# stand-in for the model's log-probabilities); the memory bookkeeping is the real one.

# %%
K, STEPS = 3, 9                                           # beam width, decode steps
cache = pnp.PagedKVCache(pnp.CacheConfig(num_pages=24, page_size=4, head_dim=8))
cache.add_sequence("b0", prompt)
compute(cache, "b0", prompt)
beams, next_id = {"b0": 0.0}, 1                          # beam id -> score

# %%
for step in range(STEPS):
    cands = [(score + rng.normal(), b, tok) for b, score in beams.items() for tok in (1, 2)]
    taken, survivors = set(), {}
    for score, parent, tok in sorted(cands, reverse=True)[:K]:   # the K best candidates
        sid = parent
        if parent in taken:                  # the parent's second surviving child: fork
            sid, next_id = f"b{next_id}", next_id + 1
            cache.fork(parent, sid)
        taken.add(parent)
        survivors[sid] = (score, tok)
    for b in set(beams) - taken:             # beams with no surviving child: release
        cache.free(b)
    for sid, (score, tok) in survivors.items():
        compute(cache, sid, [tok])           # copy-on-write happens here when needed
    beams = {sid: score for sid, (score, _) in survivors.items()}

# %%
cache.check_invariants()
fig = viz.draw_block_tables(cache, title="beam search after 9 steps: a shared stem, own tails")

# %% [markdown]
# ## Exercise 4: when does a fork cost nothing?
#
# A sequence of **12** tokens (exactly three pages of 4) is forked into `n = 5` children
# (so six sequences in all), and then every one of the six writes one token. How many
# copy-on-write copies happen, and how many pages are in use afterwards?
# Set `cow` and `in_use`, then run the check.

# %% exercise 4
cow = None          # copy-on-write copies
in_use = None       # pages in use after the six writes

# %% check 4
c = pnp.PagedKVCache(pnp.CacheConfig(num_pages=16, page_size=4, head_dim=8))
c.add_sequence("p", list(range(12)))
compute(c, "p", list(range(12)))
for i in range(5):
    c.fork("p", f"c{i}")
for s in c.seq_ids:
    compute(c, s, [99])
check("4", dict(cow=cow, in_use=in_use),
      dict(cow=c.stats()["cow_copies"], in_use=c.stats()["num_in_use"]),
      hints=dict(cow="a copy happens only when a sequence writes into a shared page that "
                     "still has room. Has the last page of 12 tokens any room?",
                 in_use="the shared pages are stored once; then count the pages the six "
                        "new tokens land on."),
      done="A fork at a page boundary costs nothing: every write goes to a fresh page.")

# %% [markdown]
# ## Exercise 4b: copy-on-write inside an allocation, yours
#
# Now write the allocation's copy-on-write step. A sequence has `num_tokens` tokens
# written in the pages of `block_table` and asks for room for `n` more. `ref_counts[p]`
# says how many block tables hold page `p`; `free` is the free list (top of the stack
# last). Return the new block table and the copies made, as `(block_table, copies)` with
# `copies` a list of `(src, dst)` pages. The package's rule, in order:
#
# 1. the pages this allocation writes into are those from `num_tokens // P` up to the
#    last one the `num_tokens + n` tokens need; of those already in the table, each one
#    with `ref_counts > 1` is shared and must be **copied**;
# 2. take all the fresh pages at once from the free list (`free.pop()` each): first one
#    per copy, in table order (each replaces its shared page in the table), then the
#    pages the table still lacks, appended.
#
# The check builds 20 random states in a real cache (a prompt forked into several
# samples, some of which have written already), runs `allocate_slots` there and your
# function here, and compares the block tables and the copies. A wrong answer shows the
# case first; run the check again after your next try for the idea; `hint("4b")` prints
# code.

# %% exercise 4b
def allocate_with_cow(block_table, ref_counts, free, num_tokens, n, page_size):
    """-> (new block_table, [(src, dst), ...]) for n more tokens; pops pages off free."""
    raise NotImplementedError        # your code here (about eight lines)

# %% check 4b
class CowCase:
    """A sequence in a real cache, about to allocate n slots; plain data for you."""

    def __init__(self, r, P=4):
        self.c = pnp.PagedKVCache(pnp.CacheConfig(num_pages=40, page_size=P, head_dim=4))
        ids = list(range(int(r.integers(1, 3 * P))))
        self.c.add_sequence("p", ids); compute(self.c, "p", ids)
        for k in range(int(r.integers(1, 4))):               # the samples share p's pages
            self.c.fork("p", f"s{k}")
        for sid in list(self.c.seq_ids)[:int(r.integers(0, 3))]:   # some write already
            compute(self.c, sid, [7] * int(r.integers(1, P + 2)))
        self.sid = str(r.choice(self.c.seq_ids))
        self.n = int(r.integers(1, 2 * P + 2))

    def plain(self):
        bt = [int(p) for p in self.c.block_table(self.sid)]
        refs = {p: self.c.pool.ref_count(p) for p in bt}
        free = sorted((p for p in range(self.c.cfg.num_pages)   # never freed: a fresh stack
                       if self.c.pool.state(p) == "free"), reverse=True)
        return bt, refs, free, self.c.num_computed_tokens(self.sid), self.n, self.c.page_size

    def package(self):
        before = [int(p) for p in self.c.block_table(self.sid)]
        self.c.allocate_slots(self.sid, self.n)
        self.c.check_invariants()
        after = [int(p) for p in self.c.block_table(self.sid)]
        return after, [(a, b) for a, b in zip(before, after) if a != b]

    def __repr__(self):
        bt, refs, free, t, n, P = self.plain()
        return f"block_table={bt}, ref_counts={refs}, num_tokens={t}, n={n}, P={P}"


r = np.random.default_rng(4)
check_function("4b", lambda case: allocate_with_cow(*case.plain()), CowCase.package,
               [(CowCase(r),) for _ in range(20)], blank="the body of allocate_with_cow",
               hints=Hint("only the pages this allocation writes into can need a copy: "
                          "from the page holding token num_tokens to the last page the new "
                          "tokens reach, those already in the table with more than one "
                          "holder. Copies take fresh pages before the table grows.",
                          code="first = num_tokens // P, need = ceil((num_tokens + n) / P); "
                               "cow = [i for i in range(first, min(len(bt), need)) if "
                               "ref_counts[bt[i]] > 1]; pop len(cow) + max(0, need - "
                               "len(bt)) pages."),
               done="The copy happens inside the allocation, before any write: the kernel "
                    "never sees a shared page it could corrupt.")

# %% [markdown]
# ## Self-check
#
# 1. Four samples share a 10-token prompt (P = 4). How many copies happen when each
#    writes its first token?
#    <details><summary>answer</summary>Three: the shared last page has room, so the first
#    three writers copy it; the last writer finds `ref_count == 1` and writes in place.
#    </details>
# 2. What does a fork cost in pages and in copies?
#    <details><summary>answer</summary>Nothing at the fork itself: the child's block table
#    lists the parent's pages and each page's `ref_count` goes up by one.</details>
# 3. When a beam dies, which of its pages go FREE?
#    <details><summary>answer</summary>Only those no other beam holds (`ref_count` drops
#    to 0); shared stem pages lose one reference and stay.</details>
#
# **Next:** notebook 5 puts the cache under a scheduler: continuous batching, and what
# the engine does when the pages run out (preemption).
