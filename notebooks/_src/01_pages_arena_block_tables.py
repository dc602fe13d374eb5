# %% [markdown]
# # 1. Pages, the arena and block tables
#
# A language model generating text keeps, for every token it has seen, a **key** and a
# **value** vector in every layer: the *KV cache*. Each new token attends to all of them,
# so they must stay in memory for as long as the request runs. On a serving GPU this
# cache, not the model weights, decides how many requests fit at once.
#
# This notebook builds the idea that vLLM's paper (Kwon et al., 2023) starts from:
#
# 1. reserving one contiguous slab per request wastes most of the memory;
# 2. cutting the cache into small fixed-size **pages** inside one preallocated **arena**
#    wastes almost nothing;
# 3. a per-sequence **block table** says which page holds which stretch of tokens, and a
#    **slot** number says where one token's K and V live.
#
# Everything below calls `paged_np`; nothing is re-implemented, except in the exercises,
# where you write pieces of it yourself and the package checks them.
#
# **What you need:** Python and NumPy (indexing, `np.sum`, integer division); what a
# transformer's attention computes, roughly (a query compared with every earlier key).
# No GPU, no model download.
#
# **What you will be able to do:** size a request's pages and find any token's slot by
# hand; say how much memory contiguous reservation and paging waste; write the
# allocator's `allocate_slots` on a free list yourself, checked against the package's.

# %%
import copy

import numpy as np
import matplotlib.pyplot as plt

import paged_np as pnp
from paged_np import viz
from _exercise import Hint, attempt, check, check_function, hint  # notebooks/_exercise.py

rng = np.random.default_rng(0)

# %% [markdown]
# ## Contiguous reservation wastes memory
#
# A server does not know in advance how long an answer will be, so a simple design
# reserves room for `max_len` tokens per request. Requests are usually much shorter.
# Below, 16 requests with lengths drawn between 50 and 800 tokens, and a reservation of
# 2048 tokens each. With pages of 16 tokens, a request only ever wastes the unused tail
# of its last page.

# %%
MAX_LEN, PAGE_SIZE = 2048, 16
lengths = rng.integers(50, 800, size=16)                    # [16] tokens per request
reserved = len(lengths) * MAX_LEN                           # contiguous: max_len each
paged = int(np.sum(-(-lengths // PAGE_SIZE)) * PAGE_SIZE)   # whole pages, rounded up
used = int(lengths.sum())
print(f"tokens stored: {used}")
print(f"contiguous:    {reserved} slots reserved, {1 - used / reserved:.0%} wasted")
print(f"paged:         {paged} slots reserved, {1 - used / paged:.1%} wasted")
assert paged - used < len(lengths) * PAGE_SIZE   # at most one partial page per request

# %% [markdown]
# The picture makes the difference plain. Each request has two bars: blue is what it
# uses, grey what a contiguous reservation wastes, red what paging wastes (a sliver at
# most one page high, barely visible).

# %%
fig, ax = plt.subplots(figsize=(8, 2.6))
x = np.arange(len(lengths))                                 # [16] one pair of bars each
paged_slots = -(-lengths // PAGE_SIZE) * PAGE_SIZE          # [16] whole pages
for dx, reserved_i, color, name in ((-0.2, MAX_LEN, "#dddddd", "contiguous"),
                                    (0.2, paged_slots, "#d62728", "paged")):
    ax.bar(x + dx, lengths, 0.38, color="#4c72b0")
    ax.bar(x + dx, reserved_i - lengths, 0.38, bottom=lengths, color=color,
           label=f"wasted, {name}")
ax.bar([], [], color="#4c72b0", label="tokens used")
ax.set_title("per request: contiguous (left bar) vs paged (right bar)", fontsize=9, loc="left")
ax.set_xlabel("request"); ax.set_ylabel("token slots"); ax.legend(fontsize=8, ncol=3);

# %% [markdown]
# ## The arena: one array, allocated once
#
# `paged_np` allocates every page up front in one NumPy array, the **arena**, of shape
# `[num_layers, 2 (K and V), num_pages, num_kv_heads, page_size, head_dim]`.
# Nothing in a step ever allocates memory that grows with the context: a request only
# borrows page ids. A page holds `page_size` consecutive tokens of one sequence, for
# every layer.

# %%
cfg = pnp.CacheConfig(num_pages=16, page_size=4, num_layers=2, num_kv_heads=2, head_dim=8)
cache = pnp.PagedKVCache(cfg)
print("arena shape:", cache.arena.shape, cache.arena.dtype)
print("bytes per page (all layers, K and V):", cfg.bytes_per_page)
k_pages, v_pages = cache.layer(0)          # views, [num_pages, num_kv_heads, page_size, head_dim]
assert cache.arena.nbytes == cfg.num_pages * cfg.bytes_per_page
assert np.shares_memory(k_pages, cache.arena)

# %% [markdown]
# ## A sequence arrives
#
# The life of a sequence is four calls:
#
# - `add_sequence(sid, prompt)` registers it (and reuses cached pages, notebook 3);
# - `allocate_slots(sid, n)` finds pages for the next `n` tokens and returns their **slots**;
# - `write_kv(layer, slots, k, v)` stores the model's K and V (once per layer);
# - `append_tokens(sid, ids)` records that those tokens are now written.
#
# A real model computes K and V; here random vectors stand in for it. `compute` is just
# those three calls in a row, and we use it everywhere below.

# %%
def compute(cache, sid, token_ids):
    """Run the model on token_ids (a stand-in: random K/V) and write them into the cache."""
    slots = cache.allocate_slots(sid, len(token_ids))       # int64 [n]
    shape = (len(token_ids), cache.cfg.num_kv_heads, cache.cfg.head_dim)
    for layer in range(cache.cfg.num_layers):
        cache.write_kv(layer, slots, rng.normal(size=shape), rng.normal(size=shape))
    cache.append_tokens(sid, token_ids)
    return slots

# %% [markdown]
# A arrives with a 6-token prompt; B arrives with 5 tokens while A is running; then A
# generates four tokens, one per step (decode).

# %%
prompt_a = list(range(100, 106))                  # A: 6 tokens -> 2 pages of 4
cache.add_sequence("A", prompt_a)
slots_a = [compute(cache, "A", prompt_a)]
cache.add_sequence("B", [7, 7, 7, 7, 7])          # B: 5 tokens, arrives meanwhile
compute(cache, "B", [7, 7, 7, 7, 7])
for tok in [106, 107, 108, 109]:                   # A generates 4 tokens, one per step
    slots_a.append(compute(cache, "A", [tok]))
slots_a = np.concatenate(slots_a)                  # [10] slots of A's tokens
print("block table of A:", cache.block_table("A"), "  of B:", cache.block_table("B"))
print("slots of A:", slots_a)

# %% [markdown]
# A's third page is not next to its second one: B took pages 2 and 3 in between. In the
# drawing of the arena each square is a page, coloured by its owner; grey pages are free.
# A's last page has two of its four slots used, B's last page one.

# %%
fig = viz.draw_arena(cache, title="A and B, interleaved")

# %% [markdown]
# ## Slots: where one token lives
#
# Token `t` of a sequence lives on logical page `t // P` (with `P = page_size`), at
# offset `t % P`. The block table turns the logical page into a page id, and the slot is
#
# $$\text{slot} = \text{block\_table}[t \,//\, P] \cdot P + t \bmod P .$$
#
# Let us derive A's slots by hand and check them against what the cache returned.

# %%
P = cache.page_size
t = np.arange(len(slots_a))                                # [10] token positions
bt = cache.block_table("A")                               # [3] page ids
by_hand = bt[t // P].astype(np.int64) * P + t % P         # [10] slots
print(by_hand)
assert np.array_equal(by_hand, slots_a)

# %% [markdown]
# A slot is all `write_kv` needs: it splits it back into `(page id, offset)` with
# `divmod(slot, P)`. To see that, overwrite A's keys in layer 0 with something we can
# recognise (every component of token `t`'s key equals `t`) and read token 9 back through
# the block table.

# %%
k_known = np.broadcast_to(t[:, None, None], (10, 2, 8)).astype(np.float32)  # [n, Hkv, D]
cache.write_kv(0, slots_a, k_known, k_known)
page, offset = bt[9 // P], 9 % P
print(f"token 9 -> page {page}, offset {offset}:", k_pages[page, 0, offset, :3], "...")
assert divmod(int(slots_a[9]), P) == (page, offset)
assert np.all(k_pages[page, :, offset] == 9)              # [Hkv, D] all nines

# %% [markdown]
# ## A batch: block tables as arrows
#
# A third sequence arrives and B grows by a few tokens. Pages are handed out in whatever
# order they are free, so a sequence's pages need not be neighbours in the arena, and
# that is the whole point: no sequence needs a contiguous run of memory.
#
# The drawing shows each sequence's logical pages on top and an arrow to the page that
# holds it; a shaded box is as full as the page is.

# %%
cache.add_sequence("C", list(range(200, 213)))
compute(cache, "C", list(range(200, 213)))
compute(cache, "B", [8, 8, 8, 8])                          # B grows onto a fresh page
fig = viz.draw_block_tables(cache)

# %% [markdown]
# The attention kernel gets all of this as two small integer arrays: the block tables,
# padded with `-1` to the longest one, and the sequence lengths. FlashInfer prefers a
# compressed (CSR) form of the same thing: `kv_indptr`, `kv_indices`, `last_page_len`.

# %%
batch = cache.batch(["A", "B", "C"])
print("block_tables =\n", batch.block_tables)
print("seq_lens =", batch.seq_lens)
indptr, indices, last_len = batch.to_csr()
print("kv_indptr =", indptr, " kv_indices =", indices, " last_page_len =", last_len)
assert list(indices[indptr[1]:indptr[2]]) == list(cache.block_table("B"))

# %% [markdown]
# ## Exercise 1a: pages and slots of a new sequence
#
# A fourth sequence `D` arrives with a 9-token prompt. Work out, with pencil or code:
#
# 1. `n_pages`: how many pages D needs;
# 2. `free_after`: how many pages will be free in the arena afterwards;
# 3. `slot_of_last`: the slot of D's last token (the allocator hands out the free pages
#    in the order printed below).
#
# Replace each `None` with your answer, run the cell, then run the check below it. The
# check runs D through a copy of the cache, so you can run it as often as you like.

# The free list is a **stack** (last in, first out): a page given back goes on top and is
# the next one handed out. So far nothing has been given back, and a fresh stack holds
# the pages so that page 0 comes out first: the free pages come out in increasing order
# *for now*. After a request finishes, its pages come out first, in whatever order it
# freed them (exercise 1c).
#
# > **vLLM V0 and V1.** A free list kept as a stack, and notebook 4's fork with
# > copy-on-write, are the design of vLLM's first engine, **V0** (the paper's). vLLM's
# > current engine, **V1**, does both otherwise. Its free blocks wait in one **FIFO**
# > queue (`FreeKVCacheBlockQueue`) that doubles as the **LRU order** of the prefix
# > cache: a finished request's blocks join the tail (its last block first, so a prefix
# > outlives its tail), an allocation takes the block at the head, and a block keeps its
# > hash, findable, until it reaches the head and is reused. V1 has **no copy-on-write**:
# > a request for `n > 1` samples runs as `n` requests that share the prompt's *full*
# > blocks through prefix caching, each computing its own partial last block. paged_np
# > teaches V0's stack and fork (notebooks 1, 4, 5), keeps cached pages in an LRU order
# > of their own (notebook 3), and schedules like V1 (notebook 5).

# %%
d_prompt = list(range(300, 309))
next_free = sorted(p for p in range(cfg.num_pages) if cache.pool.state(p) == "free")
print("free pages (nothing freed yet, so they come out in this order):", next_free)

# %% exercise 1a
n_pages = None          # pages D needs
free_after = None       # pages still free once D is written
slot_of_last = None     # slot of D's last token (an int)

# %% check 1a
trial = copy.deepcopy(cache)                              # the real cache stays as it is
trial.add_sequence("D", d_prompt)
d_slots = compute(trial, "D", d_prompt)
trial.check_invariants()
check("1a", dict(n_pages=n_pages, free_after=free_after, slot_of_last=slot_of_last),
      dict(n_pages=len(trial.block_table("D")), free_after=trial.stats()["num_free"],
           slot_of_last=int(d_slots[-1])),
      hints=dict(n_pages="a page holds P tokens; round up.",
                 free_after="count the free pages printed above, minus D's.",
                 slot_of_last="page id * P + offset; which of D's pages holds token 8, "
                              "and at which offset?"),
      done=f"D's block table is {trial.block_table('D')}.")

# %% [markdown]
# ## Exercise 1b: how much does the page size waste?
#
# With pages of `P` tokens, a sequence of `n` tokens reserves `ceil(n / P) * P` slots and
# leaves the unused tail of its last page empty. Write the body of `waste_fraction`: for
# the request lengths of the first cell (`lengths`, an int array), the **fraction of the
# reserved slots that hold no token**. The check builds a real cache for `P = 1, 16, 256`,
# allocates every request, and counts the slots of the pages it used.

# %% exercise 1b
def waste_fraction(lengths, page_size):
    """Fraction of reserved slots left empty: lengths [n] int, page_size P -> float."""
    raise NotImplementedError        # your code here (two or three lines of NumPy)

# %% check 1b
want = {}
for ps in (1, 16, 256):
    c = pnp.PagedKVCache(pnp.CacheConfig(num_pages=int(np.sum(-(-lengths // ps))),
                                         page_size=ps, head_dim=4), record_events=False)
    for i, n in enumerate(lengths):
        c.add_sequence(i, [1] * int(n))
        c.allocate_slots(i, int(n))
    want[ps] = 1 - lengths.sum() / (c.stats()["num_in_use"] * ps)
got = [attempt(waste_fraction, lengths, ps) for ps in want]
check("1b", {"waste_fraction": None if None in got else got},
      {"waste_fraction": list(want.values())},
      hints="reserved = sum over requests of ceil(n / P) * P (-(-n // P) is ceil in "
            "integers); the waste is 1 - used / reserved.",
      done=", ".join(f"P={ps}: {w:.1%} wasted" for ps, w in want.items()))

# %% [markdown]
# Small pages waste less but make the kernel's reads shorter and the tables longer;
# vLLM uses 16 tokens by default. Notebook 6 measures what the page size does to speed.
#
# ## Exercise 1c: write `allocate_slots` yourself
#
# Now the allocator's central call. A sequence has `num_tokens` tokens written, in the
# pages of its `block_table`; it asks for the slots of its next `n` tokens. Fill the last
# page first; when it is full, take a page from the top of the free list (`free.pop()`:
# the list's end is the top of the stack) and append it to the block table. Return the
# `n` slots as a list of ints; change `free` and `block_table` in place, as the allocator
# does.
#
# The check builds 20 random states in a real `PagedKVCache` (a free list scrambled by
# requests that finished in a random order, a sequence part-way through its last page),
# runs your function and the package's `allocate_slots` on each, and shows the first
# case where they differ. (The package's version also evicts cached pages and copies
# shared ones, notebooks 3 and 4; these cases need neither.) A wrong answer first shows
# only the case, for you to compare; run the check again after your next try for a hint
# on the idea; `hint("1c")` prints the code if you want it.

# %% exercise 1c
def allocate_slots(free, block_table, num_tokens, n, page_size):
    """Slots of tokens num_tokens .. num_tokens + n - 1; pops pages off `free` as needed.

    free: list of page ids, the top of the stack last; block_table: list of page ids.
    Returns a list of n ints.
    """
    raise NotImplementedError        # your code here (about six lines)

# %% check 1c
def package_allocate_slots(free, block_table, num_tokens, n, page_size):
    """The same state built in a real cache through its public calls; its answer."""
    N = max(free + block_table) + 1
    c = pnp.PagedKVCache(pnp.CacheConfig(num_pages=N, page_size=page_size, head_dim=4),
                         record_events=False)
    for p in range(N):                   # one one-token request per page: page p is "f{p}"'s
        c.add_sequence(f"f{p}", [1000 + p]); c.allocate_slots(f"f{p}", 1)
    for p in reversed(block_table):      # freed last-first, so they come out in order
        c.free(f"f{p}")
    c.add_sequence("s", list(range(num_tokens)))
    c.allocate_slots("s", num_tokens); c.append_tokens("s", list(range(num_tokens)))
    assert list(c.block_table("s")) == list(block_table)
    for p in free:                       # the free list, bottom of the stack first
        c.free(f"f{p}")
    return [int(x) for x in c.allocate_slots("s", n)]


def random_case(r, page_size=4):
    pages = [int(p) for p in r.permutation(12)]
    num_tokens = int(r.integers(1, 3 * page_size))
    held = -(-num_tokens // page_size)               # pages the sequence holds
    return (pages[held:held + int(r.integers(3, 8))], pages[:held], num_tokens,
            int(r.integers(1, 2 * page_size + 2)), page_size)


r = np.random.default_rng(1)
check_function("1c", allocate_slots, package_allocate_slots,
               [random_case(r) for _ in range(20)],
               describe=lambda free, bt, t, n, P: f"free={free}, block_table={bt}, "
                                                  f"num_tokens={t}, n={n}, P={P}",
               hints=Hint("token t lives on logical page t // P at offset t % P; a "
                          "sequence needs a fresh page exactly when t // P is one past the "
                          "end of its block table, and the top of the stack is the end of "
                          "the list.",
                          code="for t in range(num_tokens, num_tokens + n): if t // P == "
                               "len(block_table): block_table.append(free.pop()); then "
                               "slots.append(block_table[t // P] * P + t % P)."),
               done="That is the allocator of vLLM V0's block manager, minus eviction and "
                    "copy-on-write (V1 takes the head of a FIFO queue instead of a stack's "
                    "top).")

# %% [markdown]
# ## Self-check
#
# 1. A request of 100 tokens with pages of 16: how many pages, and how many slots wasted?
#    <details><summary>answer</summary>7 pages (ceil(100 / 16)); 7 * 16 - 100 = 12 slots,
#    all in the last page.</details>
# 2. Token 37 of a sequence whose block table is `[9, 2, 5]`, pages of 16: its slot?
#    <details><summary>answer</summary>37 // 16 = 2, so page 5, offset 37 % 16 = 5:
#    slot 5 * 16 + 5 = 85.</details>
# 3. Why need a sequence's pages not be neighbours in the arena?
#    <details><summary>answer</summary>They need not be: the block table maps each
#    logical page to any page, so a new request can take whatever pages are free, and no
#    contiguous run is ever needed (no external fragmentation).</details>
# 4. Request A frees pages 3 then 7; which page does the next allocation get?
#    <details><summary>answer</summary>7: the free list is a stack, the last page given
#    back is the first handed out (vLLM V0). In vLLM V1 both would join the tail of a FIFO
#    queue, and the next allocation takes whatever block has waited longest at its head.
#    </details>
#
# **Next:** notebook 2 shows how attention reads a sequence whose keys are scattered over
# pages, and notebook 3 what happens to pages when a request finishes.
