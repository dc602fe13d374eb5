# %% [markdown]
# # 3. LRU eviction and prefix caching
#
# When a request finishes, the KV it computed is still correct for any later request
# whose prompt starts the same way: the same system prompt, the same few-shot examples,
# the earlier turns of a chat. **Prefix caching** keeps those pages around and hands them
# to the next request that asks, so their tokens are not computed again.
#
# Keeping pages around costs memory, so they are kept only while nobody else needs the
# room. A finished sequence's full pages become **CACHED**: not in use, but findable by a
# hash of their contents. When an allocation finds no free page, the **LRU list** names
# the cached page released longest ago, and that page is **evicted** (its hash forgotten,
# the page reused).
#
# ```
# FREE --allocate--> IN_USE --last release, full and hashed--> CACHED --evict--> FREE
#                      ^------------------ prefix hit ------------'
# ```
#
# **What you need:** notebook 1 (pages, the free list, block tables); what a hash
# function is. Notebook 2 is not needed here.
#
# **What you will be able to do:** follow a page through FREE, IN_USE and CACHED; predict
# which page LRU evicts; write the longest-prefix lookup over the hash chain and an
# eviction policy of your own, both checked against the package; say when LRU, FIFO and
# LFU win, and what a radix tree changes.

# %%
import copy

import numpy as np
import matplotlib.pyplot as plt

import paged_np as pnp
from paged_np import viz
from paged_np.cache.hash_index import hash_page, ROOT_HASH
from _exercise import Hint, check, check_function, hint, ties_at_random  # notebooks/

rng = np.random.default_rng(0)

# %% [markdown]
# Two helpers used throughout, made only of the cache's public calls: `compute` stands in
# for the model (it writes random K/V for some tokens), `serve` runs one whole request.

# %%
def compute(cache, sid, token_ids):
    """Stand-in for the model: random K/V for token_ids, written into the cache."""
    if len(token_ids) == 0:
        return
    slots = cache.allocate_slots(sid, len(token_ids))
    kv = rng.normal(size=(len(token_ids), cache.cfg.num_kv_heads, cache.cfg.head_dim))
    for layer in range(cache.cfg.num_layers):
        cache.write_kv(layer, slots, kv, kv)
    cache.append_tokens(sid, token_ids)

# %%
def serve(cache, sid, prompt, n_generate=0):
    """One request: reuse what is cached, compute the rest of the prompt, generate, finish."""
    n_hit = cache.add_sequence(sid, prompt)
    compute(cache, sid, prompt[n_hit:])
    for _ in range(n_generate):
        compute(cache, sid, [int(rng.integers(1000, 2000))])
    cache.free(sid)
    return n_hit

# %% [markdown]
# ## Hashing pages: a chain
#
# A page is findable by a hash of its tokens **and of everything before it**: the hash of
# page `i` digests the hash of page `i - 1` and page `i`'s token ids (SHA-256, so it is the
# same in every process). Two pages holding the same four tokens at different places in
# different prompts therefore get different hashes, and a hit on page `i` implies the whole
# prefix up to `i` matches.
#
# Only *full* pages are hashed: a partly written page may still change.

# %%
system = [11, 12, 13, 14, 15, 16, 17, 18]                 # two pages of 4
h0 = hash_page(ROOT_HASH, system[:4])
h1 = hash_page(h0, system[4:])
h_same_tokens_first = hash_page(ROOT_HASH, system[4:])   # page 1's tokens, but at the start
print(h1.hex()[:16], "vs", h_same_tokens_first.hex()[:16])
assert h1 != h_same_tokens_first

cache = pnp.PagedKVCache(pnp.CacheConfig(num_pages=12, page_size=4, head_dim=8))
cache.add_sequence("A", system + [21, 22, 23])
compute(cache, "A", system + [21, 22, 23])
assert cache.sequence("A").prefix_handle == [h0, h1]      # its handle: the same chain

# %% [markdown]
# ## A hit
#
# A finishes. Its two full pages become CACHED (gold); its last page, only 3/4 full and
# never hashed, goes straight back to FREE. Then B arrives with the same system prompt:
# `add_sequence` walks B's prompt page by page, looks each hash up, and takes the pages it
# finds. It returns the number of prompt tokens it reused.

# %%
cache.free("A")
fig = viz.draw_arena(cache, title="A finished: its full pages are cached")
n_hit = cache.add_sequence("B", system + [31, 32])
print("B reused", n_hit, "tokens; block table", cache.block_table("B"))
assert n_hit == 8 and list(cache.block_table("B")) == [0, 1]

# %% [markdown]
# One rule: a request always computes at least its last prompt token, because that
# token's output gives the logits of the first generated token. So a prompt of exactly
# two pages, both cached, reuses only the first page (reuse is rounded down to whole
# pages).

# %%
compute(cache, "B", [31, 32])
print("reused for an 8-token prompt:", cache.add_sequence("C", system))
assert cache.num_computed_tokens("C") == 4
cache.free("B"); cache.free("C")

# %% [markdown]
# ## The LRU list in motion
#
# Now several requests come and go in a small cache of 8 pages. Each one's pages join
# the **young** (right) end of the eviction line when it finishes, tail first, so a
# sequence's later pages are evicted before its prefix. A prefix hit takes a page out of
# the line; an allocation with no free page evicts from the **old** (left) end.

# %%
cache = pnp.PagedKVCache(pnp.CacheConfig(num_pages=8, page_size=4, head_dim=8))
for sid, question in [("q1", [21, 22, 23, 24]), ("q2", [31, 32, 33, 34]),
                      ("q3", [41, 42, 43, 44])]:
    serve(cache, sid, system + question + [0])
    cache.tick()                                           # one step per request
fig = viz.draw_lru(cache)
print("eviction order (next victim first):", cache.pool.eviction_order())

# %% [markdown]
# q1 finished first, so its question page is the next victim; the system-prompt pages
# were hit by q2 and q3 and released again, so they sit near the young end. A long
# request now needs 6 new pages while only 3 are free: three cached pages are evicted,
# oldest first.

# %%
before = cache.pool.eviction_order()
serve(cache, "long", list(range(500, 524)))
cache.tick()
victims = [e.page_id for e in cache.events if e.kind == "evict"]
print("evicted:", victims)
assert victims == before[:len(victims)]                   # exactly the oldest ones
fig = viz.draw_lru(cache, title="after the long request")

# %% [markdown]
# The whole story as an animation, one frame per cache event (press play): each frame's
# title names the event. Pages take their owner's colour while in use; gold is cached,
# grey free.

# %%
anim = viz.animate_events(cache.events, num_pages=8, by="event")
viz.animation_html(anim)

# %% [markdown]
# With `ipywidgets` installed (`pip install paged-np[notebooks]`) the next cell gives a
# slider over the same frames; without it, a static strip of frames.

# %%
viz.event_slider(cache.events, num_pages=8, by="event", static_frames=5)

# %% [markdown]
# ## Over a longer run: the timeline
#
# `cache.events` logs every allocation, hit, release and eviction with the step it
# happened in. Replaying it gives the number of pages in each state over time. Below,
# requests overlap as in a server: one arrives per step, each running request generates
# one token per step, and each finishes after 6. A prompt is one of four system prompts
# (some more popular than others) plus the user's own question.

# %%
N_REQUESTS = 60                                            # size knob
systems = [list(range(1000 * s, 1000 * s + 12)) for s in range(1, 5)]  # 3 pages each
popularity = np.array([0.55, 0.25, 0.12, 0.08])

def workload(n, seed=0):
    r = np.random.default_rng(seed)
    return [systems[r.choice(4, p=popularity)] + list(r.integers(5000, 9000, r.integers(3, 10)))
            for _ in range(n)]

# %%
cache = pnp.PagedKVCache(pnp.CacheConfig(num_pages=32, page_size=4, head_dim=8))
running = {}                                               # seq id -> tokens left to generate
for step, prompt in enumerate(workload(N_REQUESTS) + [None] * 6):
    if prompt is not None:                                 # a request arrives
        compute(cache, step, prompt[cache.add_sequence(step, prompt):])
        running[step] = 6
    for sid in list(running):                              # every running request decodes
        compute(cache, sid, [int(rng.integers(1000, 2000))])
        running[sid] -= 1
        if running[sid] == 0:                              # done: release its pages
            del running[sid]
            cache.free(sid)
    cache.tick()
fig = viz.draw_timeline(cache.events, num_pages=32)
print({k: round(v, 3) for k, v in cache.stats().items() if k in ("hit_rate", "evictions")})

# %% [markdown]
# The in-use band is the working set: the requests running now. Everything else soon
# turns gold: freed pages stay cached until an allocation needs them, because every page
# that stays cached is a chance for a hit. From then on each new page costs an eviction
# (the black marks).
#
# ## Which page should go? LRU vs FIFO vs LFU
#
# The policy is pluggable (`CacheConfig(eviction_policy=...)`). **FIFO** evicts by the time
# a page was first cached, ignoring hits; **LFU** evicts the page with the fewest hits.
# Let us measure the prefix hit rate (prompt tokens reused / prompt tokens) of each on the
# same workload, over a range of cache sizes.

# %%
def hit_rate(policy, num_pages, prompts):
    c = pnp.PagedKVCache(pnp.CacheConfig(num_pages=num_pages, page_size=4, head_dim=4,
                                         eviction_policy=policy), record_events=False)
    for i, prompt in enumerate(prompts):
        serve(c, i, prompt, n_generate=4)
    return c.stats()["hit_rate"]

prompts = workload(N_REQUESTS * 3, seed=1)
sizes = [8, 12, 16, 24, 32, 48]
rates = {pol: [hit_rate(pol, n, prompts) for n in sizes] for pol in ("lru", "fifo", "lfu")}
fig, ax = plt.subplots(figsize=(6, 3))
for pol, r in rates.items():
    ax.plot(sizes, r, "o-", label=pol)
ax.set_xlabel("num_pages"); ax.set_ylabel("prefix hit rate"); ax.legend();
assert rates["fifo"][-1] < rates["lru"][-1] <= rates["lfu"][-1]

# %% [markdown]
# FIFO evicts the popular system prompt in its turn however often it is hit, so even a
# large cache keeps losing it. LRU keeps it as long as it is hit more often than the cache
# turns over. LFU keeps it best here, because popularity in this workload never changes;
# its risk is the opposite one: a page that *was* popular stays long after it stopped
# being asked for.
#
# ## Exercise 3: predict the next victim
#
# Starting from the state below, the check performs: `mark_used` on the page that is currently
# the next victim (it moves to the young end, as if just used), then a new request whose
# prompt is the second system prompt `systems[1]` plus two tokens. Which page will be the
# next victim after that? Write `next_victim` as a page id, using only
# `order = cache.pool.eviction_order()` as printed and the hit rule. (The check works on a
# copy of the cache, so you can run it as often as you like.)

# %%
cache = pnp.PagedKVCache(pnp.CacheConfig(num_pages=12, page_size=4, head_dim=8))
for i, s in enumerate(systems[:3]):
    serve(cache, f"s{i}", s + [7])                        # 3 cached pages per system prompt
order = cache.pool.eviction_order()
print("eviction order now:", order)
print("pages of systems[1]:", order[3:6][::-1], "(released tail first)")

# %% exercise 3
next_victim = None      # a page id

# %% check 3
trial = copy.deepcopy(cache)                              # the real cache stays as it is
trial.mark_used(order[0])
trial.add_sequence("new", systems[1] + [1, 2])
check("3", {"next_victim": next_victim}, {"next_victim": trial.pool.eviction_order()[0]},
      hints="mark_used moves order[0] to the young end of the line; the new request's hit "
            "takes the pages of systems[1] out of the line (they are in use again). "
            "Which page is then at the old end?",
      done=f"The line is now {trial.pool.eviction_order()}.")

# %% [markdown]
# ## The same prefixes as a radix tree
#
# SGLang finds cached prefixes with a **radix tree** instead of a hash chain: edges carry
# runs of tokens, a node holds the pages of its edge, a live sequence *locks* its path
# (`lock_ref`), and eviction takes the least recently used unlocked **leaf** first:
# a lookup walks from the root, so evicting an inner node would strand its whole subtree
# (its children's K/V still in memory, but no path reaches them), while a leaf strands
# nothing. `CacheConfig(prefix_cache="radix")`
# puts the tree behind the same `PagedKVCache` methods. Serve the same prompts through
# both: they reuse the same tokens. Left, the hash chain's cached pages in LRU order;
# right, the tree, drawn from its state: gold nodes are CACHED (nothing locks them), the
# red outline is the next leaf to go.

# %%
from paged_np.viz.radix import draw_radix_tree

questions = [systems[i % 2] + [50 + i, 51, 52, 53, 54] for i in range(4)]
caches = {pc: pnp.PagedKVCache(pnp.CacheConfig(num_pages=24, page_size=4, head_dim=8,
                                               prefix_cache=pc))
          for pc in ("hash", "radix")}
hits = {pc: [serve(c, f"q{i}", q) for i, q in enumerate(questions)]
        for pc, c in caches.items()}
print("prompt tokens reused, per request:", hits)
fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
viz.draw_lru(caches["hash"], ax=axes[0], title="hash chain: cached pages, LRU first")
draw_radix_tree(caches["radix"], ax=axes[1], title="radix tree: two system prompts, "
                "two questions each")
assert hits["hash"] == hits["radix"] == [0, 0, 12, 12]

# %% [markdown]
# Both found the same 12 tokens for `q2` and `q3`. Where the tree differs is not in what
# it finds but in how it is usually run: token by token (`page_size=1`) and with the
# scheduler admitting the requests with the longest cached prefix first.
# `python -m paged_np simulate --prefix-cache` measures both; the docs page *Prefix
# caching and the LRU list* has the numbers.
#
# ## Exercise 3b: which leaf goes next?
#
# The tree has four leaves, one per question (`q0` to `q3`, served in that order). Now
# `q0`'s prompt is asked again (served and finished, as above). Which question's leaf
# does eviction take next? Write `next_leaf` as the request's name (`"q0"` ... `"q3"`).
# (The check works on a copy of the cache.)

# %% exercise 3b
next_leaf = None        # "q0", "q1", "q2" or "q3"

# %% check 3b
tree_cache = copy.deepcopy(caches["radix"])
serve(tree_cache, "again", questions[0])
leaf = tree_cache.prefix_index.node_of(tree_cache.prefix_index.eviction_order()[0])
owner = next(f"q{i}" for i, q in enumerate(questions)
             if tuple(q[:len(tree_cache.prefix_index.tokens_to(leaf))])
             == tree_cache.prefix_index.tokens_to(leaf))
check("3b", {"next_leaf": next_leaf}, {"next_leaf": owner},
      hints="serving q0 again touches every node on its path, so its leaf is now the "
            "youngest; of the others, which was used longest ago?",
      done=f"{owner}'s leaf goes first; its system prompt's node stays, since another "
           "leaf below it still needs it.")

# %% [markdown]
# ## Exercise 3c: the longest cached prefix, yours
#
# Write the lookup `add_sequence` starts with: walk the prompt page by page, hash each full
# page with its parent's hash (`hash_page(parent, page_tokens)`, starting from
# `ROOT_HASH`), ask the index for it (`index.lookup(h, page_tokens)`: a page id, or None),
# and stop at the first miss. Return the page ids found, in order. The check serves 12
# random requests (some sharing system prompts) into a cache, then asks yours and the
# package's `match_prefix` about 20 random prompts.

# %% exercise 3c
def cached_prefix(index, token_ids, page_size):
    """Page ids of the longest cached prefix of token_ids (whole pages), in order."""
    raise NotImplementedError        # your code here (about seven lines)

# %% check 3c
r = np.random.default_rng(3)
heads = [[int(t) for t in r.integers(0, 50, 12)] for _ in range(3)]  # 3 shared openings


def random_prompt():
    """One of 3 openings cut anywhere (0 to 3 pages of it), then up to 8 random tokens."""
    head = heads[r.integers(3)][:int(r.integers(0, 13))]
    return head + [int(t) for t in r.integers(0, 50, r.integers(1, 9))]


lookup_cache = pnp.PagedKVCache(pnp.CacheConfig(num_pages=32, page_size=4, head_dim=4))
for i in range(12):
    serve(lookup_cache, f"r{i}", random_prompt())
check_function("3c", cached_prefix,
               lambda index, ids, ps: list(index.match_prefix(ids)[0]),
               [(lookup_cache.prefix_index, random_prompt(), 4) for _ in range(20)],
               describe=lambda index, ids, ps: f"token_ids={ids}",
               hints=Hint("each full page's hash digests its parent's, from ROOT_HASH; "
                          "walk the pages in order and stop at the first the index does not "
                          "hold (a partial last page is never looked up).",
                          code="parent = ROOT_HASH; for page i: tokens = token_ids[i*P:(i+1)*P]"
                               ", only while they are a full page; h = hash_page(parent, "
                               "tokens); page = index.lookup(h, tokens); stop at None; "
                               "parent = h."),
               done="A hit on page i means the whole prefix up to i matched, because each "
                    "hash digests its parent's.")

# %% [markdown]
# ## Exercise 3d: a policy of your own
#
# A policy is one method, `priority(entry)`: the evictable entry with the smallest key goes
# first. An entry has `last_access_time`, `hit_count` and `creation_time` (ticks of the
# index's one logical clock). Write LFU with LRU among equals: **fewest prefix hits first,
# and of those, the one used longest ago**. The check plugs your class into
# `CacheConfig(eviction_policy=...)`, serves the same 20 random workloads through it and
# through the package's `LFUPolicy` in a cache of 10 pages, checks the pool's invariants
# after every request, and compares the pages evicted, in order.
#
# One catch the check closes: left to itself, the index's heap breaks ties between equal
# keys in the order the entries were queued, which *is* LRU's order, so a key that says
# nothing about age would still look right. The check breaks ties **at random** instead
# (`ties_at_random`: your key, then a hash of the stamps), for yours and for the
# package's alike: only a key that names the tie-break itself evicts like `LFUPolicy`.

# %% exercise 3d
class MyLFU(pnp.EvictionPolicy):
    name = "my-lfu"

    def priority(self, entry):
        raise NotImplementedError    # your code here (one line)

# %% check 3d
def evictions(policy, prompts):
    """The pages evicted, in order, serving prompts with this policy; invariants checked."""
    c = pnp.PagedKVCache(pnp.CacheConfig(num_pages=10, page_size=4, head_dim=4,
                                         eviction_policy=policy))
    for i, prompt in enumerate(prompts):
        serve(c, i, prompt, n_generate=2)
        c.check_invariants()
    return [e.page_id for e in c.events if e.kind == "evict"]


a, b = [1, 2, 3, 4, 5], [11, 12, 13, 14, 15]               # one full page each, then a token
tie_case = [a, b, b, a, list(range(100, 136))]             # equal hits; a made first, used last
check_function("3d", lambda prompts: evictions(ties_at_random(MyLFU, 3), prompts),
               lambda prompts: evictions(ties_at_random(pnp.LFUPolicy, 3), prompts),
               [(tie_case,)] + [([random_prompt() for _ in range(12)],) for _ in range(20)],
               describe=lambda prompts: ("two pages with a hit each, the older one used "
                                         "last; then a long prompt" if prompts is tie_case
                                         else f"12 prompts starting {prompts[0][:6]}..."),
               blank="MyLFU.priority",
               hints=Hint("two rules, the second only among equals under the first: "
                          "fewer hits go first, and among equal hits the older use goes "
                          "first. A key can carry both, and Python compares it item by "
                          "item.",
                          code="return (entry.hit_count, entry.last_access_time)"),
               done="Any sortable key makes a policy: the capstone asks you to design one "
                    "and defend it.")

# %% [markdown]
# ## Self-check
#
# 1. Why does a page's hash digest its parent's hash and not only its own tokens?
#    <details><summary>answer</summary>So that a hit on page i means the whole prefix up
#    to page i matches: the same tokens after a different start must not be reused (their
#    K/V depend on everything before them).</details>
# 2. Which pages of a finished request become CACHED, and which FREE?
#    <details><summary>answer</summary>Its full pages (hashed) become CACHED; a partly
#    filled last page was never hashed and goes FREE.</details>
# 3. A prompt of exactly 8 tokens, both of its pages cached (P = 4): how many tokens are
#    reused, and why?
#    <details><summary>answer</summary>4: the last prompt token is always computed, since
#    its output gives the first generated token's logits; reuse is rounded down to whole
#    pages.</details>
# 4. When does LFU lose to LRU?
#    <details><summary>answer</summary>When popularity shifts: a page that was hit often
#    long ago keeps its count and stays, while the newly popular prefix is evicted.</details>
#
# **Next:** notebook 4 shares pages between *live* sequences (parallel sampling, beam
# search) and copies a page only when one of them writes into it.
