# %% [markdown]
# # 5. Serving: continuous batching and preemption
#
# Notebooks 1 to 4 built the cache and drove it by hand. A server drives it from a loop:
# requests arrive at any time, each wants its prompt computed and then one token after
# another, and the pages must be shared among all of them. `pnp.Engine` is that loop.
# One call to `engine.step()` is **one forward pass of the model over a batch**, and the
# batch changes at every step: a request joins as soon as there is room and leaves the
# step it finishes. That is **continuous batching** (Orca, vLLM): nobody waits for the
# longest request of a batch to end.
#
# ```
# step:  schedule (tokens per sequence, slots)  ->  model.forward(batch)  ->  sample
#            |                                                              |
#            +-- out of pages? preempt the newest (recompute or swap)       +-- done? free
# ```
#
# This notebook runs the engine on a tiny Llama-style model with random weights. Its
# tokens mean nothing, but they are deterministic, so every answer can be checked against
# `model.dense_generate`, which recomputes the whole sequence at every token with no cache
# at all. At the end we step back and measure, as the vLLM paper did, how much of the KV
# memory holds tokens at all under contiguous reservation and under paging.
#
# **What you need:** notebooks 1, 3 and 4 (pages, prefix hits, fork); what a language
# model's generation loop does (one token at a time, each from the previous ones).
# Notebook 2 helps for the causal mask of a chunk.
#
# **What you will be able to do:** work out what each engine step computes under the two
# budgets; predict and write the preempt-newest loop, checked against the scheduler;
# explain recompute against swap, and why recompute gives the same tokens only with
# batch-invariant kernels; say where batching saves (the weights, read once per step)
# and where it does not (each sequence's KV); say which pages speculative decoding's
# rejected drafts give back; write the sampling rule that keeps drafts exact in
# distribution, checked by a chi-square test. (Latency, TTFT, TPOT and ITL, is
# notebook 8's.)

# %%
import numpy as np
import matplotlib.pyplot as plt

import paged_np as pnp
from paged_np import viz
from paged_np.sim import simulate, workloads
from paged_np.engine.replay import replay   # the loop the demo runs, from the library
from _exercise import Hint, check, check_function, check_property, hint  # notebooks/

N_REQUESTS = 24          # size knob: requests in the streams below
N_SIM = 200              # size knob: requests in the memory-breakdown simulation
BACKEND = "numpy"        # the NumPy attention kernel: no compile time (notebook 6 is Numba's)

model = pnp.LlamaModel.random(pnp.ModelConfig(), seed=0)
print(model.cfg)

# %% [markdown]
# ## What one step runs
#
# The scheduler (`paged_np.engine.scheduler`, after vLLM's V1) has no separate "prefill" and
# "decode" phases. Each sequence knows `num_tokens` tokens (prompt plus generated so far),
# of which `num_computed_tokens` have their KV in the cache; a step gives it up to
# `num_tokens - num_computed_tokens` more. A decode is the case where that is 1; a long prompt is
# cut into chunks (**chunked prefill**). Two budgets bound a step:
#
# - `max_num_batched_tokens`: tokens in the whole step (the cost of the forward pass);
# - `max_num_seqs`: sequences running at once.
#
# Running sequences are served first, oldest first; then waiting ones are admitted in
# order while the budgets (and the pages) allow. A sequence samples a token in the step
# that computes the last token it knows.
#
# Three prompts of 50, 20 and 10 tokens arrive together; the token budget is 32. Before
# running it, work out the tokens of each step:
#
# | step | A (50) | B (20) | C (10) | total |
# |---|---|---|---|---|
# | 1 | 32 (chunk) | waits: no budget left | waits | 32 |
# | 2 | 18 (prompt done, samples) | 14 (chunk) | waits | 32 |
# | 3 | 1 (decode) | 6 (prompt done) | 10 (prompt done) | 17 |
# | 4 | 1 | 1 | 1 | 3 |

# %%
engine = pnp.Engine(model, num_pages=32, page_size=8, max_num_seqs=8,
                    max_num_batched_tokens=32, backend=BACKEND)
rng = np.random.default_rng(0)
for rid, length in (("A", 50), ("B", 20), ("C", 10)):
    engine.add_request(rng.integers(0, 256, length).tolist(),
                       pnp.SamplingParams(max_tokens=4, temperature=0.0), request_id=rid)
for _ in range(4):
    engine.step()
    print(f"step {engine.metrics['steps']}: computed / known =",
          {s.parent.request_id: f"{s.num_computed_tokens}/{s.num_tokens}"
           for s in engine.scheduler.running})

# %%
tokens_per_step = np.diff(engine.metrics["series"]["scheduled_tokens"], prepend=0)  # [steps]
by_hand = [32, 18 + 14, 1 + 6 + 10, 1 + 1 + 1]
print("tokens per step:", tokens_per_step.tolist())
assert tokens_per_step.tolist() == by_hand

# %% [markdown]
# Step 3 is the interesting one: one batch holds a decode (A), the end of a chunked prompt
# (B) and a whole prompt (C). The model does not care: it sees 17 query tokens with their
# positions, and `paged_attention` takes each sequence's block table and `query_start_loc`
# to know which keys every query may see.
#
# ## A stream of requests
#
# Now a stream like a server's: two requests arrive per step, every other one starts with
# the same 24-token system prompt (three pages of 8), and each asks for 8 to 24 tokens.
# `paged_np.engine.replay.replay` feeds each request to the engine at its arrival step and steps
# until everything is done. First a roomy cache of 64 pages.

# %%
def workload(n, seed=0):
    """n requests (arrival step, prompt, max_tokens); the even ones share a system prompt."""
    r = np.random.default_rng(seed)
    system = r.integers(0, 256, 24).tolist()
    user = [r.integers(0, 256, r.integers(4, 17)).tolist() for _ in range(n)]   # 4-16 tokens
    return [(i // 2, (system if i % 2 == 0 else []) + user[i], int(r.integers(8, 25)))
            for i in range(n)]

work = workload(N_REQUESTS)
roomy = pnp.Engine(model, num_pages=64, page_size=8, max_num_seqs=8,
                   max_num_batched_tokens=64, backend=BACKEND, record_events=True)
outs = replay(roomy, work)
fig = viz.draw_timeline(roomy.cache.events, 64, roomy.metrics, title="64 pages: no pressure")

# %% [markdown]
# Top: the arena's pages by state at each step; bottom: requests running and waiting. The
# blue band rises while requests pile in and falls as they finish. Running never exceeds
# 8: here the requests queue for the `max_num_seqs` seats, not for pages; at most about
# half of the 64 pages are ever in use (`peak_pages_in_use` below). Finished requests
# leave their full pages **cached** (gold): the system prompt's pages among them, which
# is why every later request that starts with it is served those 24 tokens for free (a
# prefix hit, notebook 3). The first one computes them; the others hit.

# %%
hits = [o.num_cached_prompt_tokens for o in outs]
print("prompt tokens served from the cache:", hits)
assert hits[0] == 0 and all(h == 24 for h in hits[2::2])
for o, (_, prompt, max_tokens) in list(zip(outs, work))[:3]:       # the dense truth
    assert o.token_ids == model.dense_generate(prompt, max_tokens)
m = roomy.metrics
print({k: m[k] for k in ("steps", "generated_tokens", "peak_pages_in_use", "prefix_hit_rate")})

# %% [markdown]
# ## When the pages run out: preemption
#
# The same stream in **20 pages** cannot keep everyone. Pages are taken one at a time as
# sequences grow, so the shortage shows up in the middle of a decode: a running sequence
# needs a page and there is none, free or cached. The scheduler then **preempts** the
# running request admitted last (it has done the least work), possibly the very one that
# asked, and retries. A step that preempted admits nobody new.
#
# What happens to the victim's KV is the `preemption_mode`:
#
# - `"recompute"`: drop it. The victim goes back to the front of the queue and, when
#   readmitted, prefills its prompt *and the tokens it had generated* again, in one chunked
#   prefill. Its full pages went to the cached state when it was freed, so whatever
#   was not evicted meanwhile is a prefix hit and costs nothing.
# - `"swap"`: copy its pages to host memory (`SwapArena`, vLLM's CPU swap space), free
#   them, and copy them back before it runs again. No compute is repeated; the price is
#   the copies (over PCIe, on a GPU) and the host memory.
#
# vLLM's current (V1) scheduler only recomputes: a prefill is fast on a GPU, and a swap's
# copies compete with the model for the bus. Either way the tokens must not change.

# %%
runs = {}
for mode in ("recompute", "swap"):
    eng = pnp.Engine(model, num_pages=20, page_size=8, max_num_seqs=8,
                     max_num_batched_tokens=64, preemption_mode=mode, backend=BACKEND,
                     record_events=True)
    runs[mode] = (eng, replay(eng, work))
eng = runs["recompute"][0]
fig = viz.draw_timeline(eng.cache.events, 20, eng.metrics, title="20 pages, recompute")

# %% [markdown]
# Now the arena is full most of the time and the queue grows longer than before: fewer
# than 8 requests fit. The red lines mark preemptions; each one frees a victim's pages,
# many of them as cached (gold) pages that the next allocations evict (the black marks).
# The swap run's drawing looks the same (in this run both modes preempt at the same
# steps); they differ in what a victim costs when it comes back. Compare the counters:

# %%
keys = ("steps", "preemptions", "swapped_out", "swapped_in", "scheduled_tokens", "evictions")
print(f"{'':>18}" + "".join(f"{k:>18}" for k in keys))
rows = [("64 pages", roomy.metrics)] + [(f"20, {k}", e.metrics) for k, (e, _) in runs.items()]
for name, m in rows:
    print(f"{name:>18}" + "".join(f"{m[k]:>18}" for k in keys))
rec, swp = runs["recompute"][0].metrics, runs["swap"][0].metrics
print("tokens computed again by recompute:", rec["scheduled_tokens"] - swp["scheduled_tokens"])
assert rec["preemptions"] > 0                   # the small cache did preempt
for mode, (_, o) in runs.items():               # ... and nobody's answer changed
    assert [x.token_ids for x in o] == [x.token_ids for x in outs], mode

# %% [markdown]
# `scheduled_tokens` counts the tokens that went through the model. The roomy run and the
# swap run compute each token once; recompute pays extra for every preemption (less than
# the victims' whole length, thanks to the prefix hits on their own cached pages). Every
# request's tokens are the same in all three runs, and the same as the dense reference
# checked above: paging, preemption and swapping change *when* work is done, never *what*
# is computed.
#
# > **Batch invariance.** "Recompute gives the same K/V, so the same text" hides an
# > assumption. The victim's tokens are computed again in another shape of step: a
# > prefill chunk of many rows, beside other sequences, where they were first computed
# > one decode row at a time. The maths is the same; the floating-point sums need not
# > be. A kernel that splits its work by the batch (split-K over a long context, a tile
# > size chosen from the number of rows, a BLAS path picked by matrix shape) adds the
# > same numbers in another order and gets other last bits. Then a greedy argmax that is
# > a near tie can flip, and the texts part from there. The same text is guaranteed only
# > with **batch-invariant** kernels, which compute a row alike whatever else is in the
# > step. vLLM offers that as an opt-in mode, at some cost in speed (He et al.,
# > *Defeating Nondeterminism in LLM Inference*, Thinking Machines, 2025); paged_np's
# > Numba kernels are batch-invariant for decode and verify steps by construction
# > (`docs/design.md`, "Batch invariance and speculative decoding"); a recompute's long
# > prefill chunk is outside that promise. The assert above
# > holds for this tiny model in float32 on the NumPy backend; it is a measurement of
# > this run, not a law of recompute. Notebook 8 meets the same question on a real model.
#
# ## Exercise 5: who is preempted, and when?
#
# A cache of only **6 pages of 4 tokens**. Three requests are admitted together in the
# order A, B, C, with prompts of **6, 3 and 6** tokens, and each asks for 8 tokens. Step 1
# computes all three prompts and samples each one's first token; from step 2 on, every
# step writes the KV of each sequence's newest token (position `len(prompt)` in step 2,
# one more each step) and samples the next.
#
# Which request is preempted first, and at which step? (Count each sequence's pages after
# step 1, then find the step at which a sequence's new token starts a page, and whether a
# free page is left for it.) Set `victim` and `at_step`.

# %% exercise 5
victim = None       # "A", "B" or "C"
at_step = None      # the step (1, 2, ...) in which it is preempted

# %% check 5
ex = pnp.Engine(model, num_pages=6, page_size=4, max_num_seqs=8, backend=BACKEND)
ex_rng = np.random.default_rng(5)         # its own: running this cell again changes nothing
for rid, length in (("A", 6), ("B", 3), ("C", 6)):
    ex.add_request(ex_rng.integers(0, 256, length).tolist(),
                   pnp.SamplingParams(max_tokens=8, temperature=0.0), request_id=rid)
while ex.metrics["preemptions"] == 0:
    ex.step()
first = ex.scheduler.waiting[0].parent.request_id           # the victim waits at the front
check("5", dict(victim=victim, at_step=at_step),
      dict(victim=first, at_step=ex.metrics["steps"]),
      hints=dict(victim="the scheduler frees room by preempting the newest running "
                        "request, whoever asked for the page.",
                 at_step="pages after step 1: A 2, B 1, C 2, one free. In which step does "
                         "a token at position 4 or 8 need a fresh page, and is one left?"),
      done=f"{first} is preempted at step {ex.metrics['steps']}, although A asked for the "
           "page.")

# %% [markdown]
# ## Exercise 5c: the preempt-newest loop, yours
#
# Now write the scheduler's loop for a step in which every running request decodes one
# token. `running` lists the requests oldest first; `held[r]` is how many pages `r` holds;
# `need[r]` how many fresh pages its next token needs (0 or 1); `available` the pages an
# allocation can get now (free plus evictable cached). Serve the requests oldest first.
# While a request's need exceeds what is available, preempt the **newest** running
# request (the last of the list, perhaps the one asking): it leaves the list and its
# pages become available. A request that preempted itself ends the step. Return
# `(scheduled, preempted)`: the names served, and the names preempted in the order they
# were.
#
# The check runs 20 random small servers (6 to 10 pages, 3 to 5 requests) to a random
# step, gives you the state, lets the real `Engine` take the step, and compares.

# %% exercise 5c
def schedule_decodes(running, held, need, available):
    """-> (scheduled, preempted): lists of request names."""
    raise NotImplementedError        # your code here (about ten lines)

# %% check 5c
def replay(recipe):
    """A small engine fed the recipe's requests and stepped its number of steps."""
    num_pages, requests, steps = recipe
    e = pnp.Engine(model, num_pages=num_pages, page_size=4, max_num_seqs=8,
                   max_num_batched_tokens=256, backend=BACKEND)
    for i, (prompt, max_tokens) in enumerate(requests):
        e.add_request(prompt, pnp.SamplingParams(max_tokens=max_tokens, temperature=0.0),
                      request_id=f"r{i}")
    for _ in range(steps):
        e.step()
    return e


def decoding(e):
    run = e.scheduler.running
    return len(run) >= 2 and all(q.num_tokens - q.num_computed_tokens == 1 for q in run)


def short_of_pages(e):
    need = sum(e.cache.num_pages_needed(q.seq_id, 1) for q in e.scheduler.running)
    return need > e.cache.num_available_pages


def random_recipe(r):
    """A random small stream, stepped until every running request decodes (most cases
    short of pages, so that someone is preempted)."""
    while True:
        requests = [(r.integers(0, 256, int(r.integers(2, 10))).tolist(),
                     int(r.integers(4, 12))) for _ in range(int(r.integers(3, 6)))]
        recipe = [int(r.integers(6, 11)), requests, 0]
        e = replay(recipe)
        for steps in range(1, 8):
            e.step()
            if decoding(e) and (short_of_pages(e) or r.random() < 0.3):
                return (recipe[0], requests, steps)


def engine_view(recipe):
    e = replay(recipe)
    run = e.scheduler.running
    return ([q.parent.request_id for q in run],
            {q.parent.request_id: len(e.cache.block_table(q.seq_id)) for q in run},
            {q.parent.request_id: e.cache.num_pages_needed(q.seq_id, 1) for q in run},
            e.cache.num_available_pages)


def engine_step(recipe):
    e = replay(recipe)
    reqs = list(e.scheduler.running)
    before = {q.parent.request_id: (q.num_tokens, q.num_preemptions) for q in reqs}
    e.step()
    scheduled = [q.parent.request_id for q in reqs                  # sampled a token
                 if q.num_tokens > before[q.parent.request_id][0]]
    preempted = [q.parent.request_id for q in reversed(reqs)        # newest go first
                 if q.num_preemptions > before[q.parent.request_id][1]]
    return scheduled, preempted


r = np.random.default_rng(6)
recipes = [random_recipe(r) for _ in range(20)]
check_function("5c", lambda recipe: schedule_decodes(*engine_view(recipe)), engine_step,
               [(x,) for x in recipes], blank="the body of schedule_decodes",
               describe=lambda recipe: "running={}, held={}, need={}, available={}".format(
                   *engine_view(recipe)),
               hints="for each request in order: while need > available, pop the last "
                     "running one (append it to preempted, add its held pages to "
                     "available); if that was the request itself, stop; else take its "
                     "pages and schedule it.",
               done="The scheduler's preempt-newest rule: the newest request has done the "
                    "least work, so preempting it wastes the least.")

# %% [markdown]
# ## Parallel sampling: n answers, one prompt's pages
#
# `SamplingParams(n=4)` asks for four samples of one prompt. The engine computes the prompt
# once, then **forks** the sequence three times (notebook 4): the full prompt pages are
# shared, the partly filled last one is copied on the first write (three copies: the last
# writer keeps the original). Each sample has its own random generator, seeded by
# `(seed, request, sample)`, so the answers differ from each other and are reproducible.
#
# > **vLLM V0 and V1.** Forking a sequence and copying its partial page on the first
# > write is vLLM **V0**'s way (and paged_np's). vLLM **V1** has no copy-on-write: it
# > turns `n = 4` into four requests with the same prompt, which share the prompt's
# > *full* blocks through prefix caching and each compute their own partial last block;
# > its free blocks form a FIFO queue that is also the LRU order of cached blocks, where
# > V0 kept a free list (notebook 1). The pages saved are nearly the same.

# %%
P, G = 37, 12                                              # prompt and max_tokens
par = pnp.Engine(model, num_pages=64, page_size=8, backend=BACKEND)
prompt = rng.integers(0, 256, P).tolist()
out = par.generate([prompt], pnp.SamplingParams(max_tokens=G, temperature=1.0, n=4, seed=1))[0]
for s in out.samples:
    print(f"sample {s.index}: {s.token_ids}")
m = par.metrics
print("peak pages in use:", m["peak_pages_in_use"], " copy-on-write copies:", m["cow_copies"])

# %% [markdown]
# Count the peak by hand. A sample's last token is sampled but never written (no query
# will ever read its KV), and samples that finish give their pages back in that same step,
# so the most a sample holds is `P + G - 2` written tokens. The `P // 8` full prompt pages
# are stored once; everything after them is per sample.

# %%
page = 8
full_prompt_pages = P // page
per_sample = -(-(P + G - 2) // page) - full_prompt_pages        # own pages of one sample
shared = full_prompt_pages + 4 * per_sample
unshared = 4 * -(-(P + G - 2) // page)                          # four separate requests
print(f"shared {shared} pages vs {unshared} without sharing")
assert (m["peak_pages_in_use"], m["cow_copies"]) == (shared, 3)

# %% [markdown]
# ## The paper's figure: where does KV memory go?
#
# Before vLLM, servers such as Orca gave each request one **contiguous** range of KV
# slots at admission, sized for the longest answer it might give, because it cannot know
# in advance how long the answer will be. The vLLM paper (Kwon et al., SOSP 2023, Fig. 2)
# measured where that memory goes, in four parts:
#
# - **token states**: slots holding a token's KV: the only useful part;
# - **reservation**: slots held now for tokens the request will write later;
# - **internal fragmentation**: held slots that will never be written (the answer ended
#   before the reservation did);
# - **external fragmentation & others**: free slots that nobody can use (holes too small
#   for the next request).
#
# `paged_np.sim.simulate` replays a ShareGPT-like trace through the three Orca variants
# (reserve the model's maximum of 2048 tokens, the next power of two of the true length,
# or, as an oracle, exactly the true length) and through the real paged cache with pages
# of 16, with the KV budget of an OPT-13B on an A100 (15,728 token slots). No attention is
# computed: only the bookkeeping. `N_SIM` is the size knob (the paper's own figure and
# `python -m paged_np simulate` use more requests).

# %%
trace = workloads.sample_requests(workloads.DATASETS["sharegpt"], N_SIM, np.random.default_rng(0))
breakdown = {s: simulate.serve_contiguous(trace, s) for s in simulate.SCHEMES}
breakdown["paged"] = simulate.serve_paged(trace, page_size=16)
for name, b in breakdown.items():
    paper = simulate.PAPER["token_states"].get(name)             # the paper's Fig. 2
    print(f"{name:>12}: token states {b['token_states']:6.1%}  (paper: "
          f"{'-' if paper is None else f'{paper:.1%}'})   running requests {b['batch_size']:5.1f}")

# %%
from paged_np.sim import plot as simulate_plot

fig = simulate_plot.plot_breakdown({"memory_breakdown": breakdown})

# %% [markdown]
# With the maximum reservation, most of the memory is reserved or wasted, and only a
# handful of requests fit: 15,728 slots hold `15728 // 2048 = 7` reservations of 2048,
# whatever the requests' true lengths. Even the oracle, which knows every length in
# advance, loses memory to reservation (a request holds its whole length from the first
# token) and to holes between ranges. Paging allocates a page only when a token needs it,
# so the only waste is the unfilled tail of each request's last page: less than one page
# per running request. (Our numbers differ from the paper's by a few points: a synthetic
# trace, a simpler allocator, `N_SIM` requests. The ordering and the size of the gap are
# the point.) Two of these facts by hand:

# %%
assert breakdown["orca_max"]["batch_size"] == simulate.KV_SLOTS // 2048
paged = breakdown["paged"]
wasted_slots = paged["internal_frag"] * simulate.KV_SLOTS     # per measured step, on average
assert wasted_slots <= (16 - 1) * paged["batch_size"]
print(f"paged: {wasted_slots:.0f} slots wasted for {paged['batch_size']:.0f} running requests")

# %% [markdown]
# More requests running at once is the whole point, and the reason is the **weights**: a
# decode step reads every weight matrix once, whatever the batch size, and multiplies it
# by one row per running sequence. The weight traffic is paid once per step and shared by
# the whole batch, so a bigger batch turns it into more tokens per second. The KV traffic
# is *not* shared: each sequence reads its own keys and values, so KV bytes per step grow
# with the batch (and with each context). Paging's gain is that the memory it saves holds
# more sequences, so more tokens share each read of the weights, until the KV reads
# themselves dominate (notebook 8 measures the split on a real model). That is where
# vLLM's throughput gains come from.
#
# ## Speculative decoding: pages for drafts, and rollback
#
# A server with one user has no batch to fill, and a decode step at batch 1 is
# **memory-bound**: to produce one token it multiplies one row by every weight matrix, so
# it reads all the weights (513 MiB for SmolLM2-135M in float32) for 2 floating-point
# operations per weight. A CPU core can do tens of operations per byte it reads, a GPU
# hundreds (an H100's dense bf16, about 990 TFLOP/s over 3.35 TB/s: about 300). Give the same step **1 + k rows** and the weights are still read once: the step
# costs about one step (as long as the matrix product streams each weight once for all
# rows), and if the k extra rows were the right next tokens, it yields up to k + 1 tokens.
#
# Where do good guesses come from, without a second model? **Prompt lookup** (vLLM's
# `speculative_config={"method": "ngram"}`): find an earlier place where the context's
# last n tokens occur, trying the longest n first (from `prompt_lookup_max` down to
# `prompt_lookup_min`), and propose the k tokens that followed it there. Which place, if
# the n-gram occurs more than once? vLLM takes its **earliest** occurrence; paged_np takes
# the **latest** (the most recent copy is the likelier one to be continued), a choice of
# its own, so the two can draft differently on the same context. A request that copies (repeat this
# paragraph, fix its typos, rename a variable in this function) is full of such places.
# (Right after the model departs from the text, say to fix a typo, no n-gram recurs for
# a few tokens; paged_np then also looks for the model's last token just past where it
# left the text, and proposes what follows it there: `NgramProposer.rejoin`.)
#
# The engine runs the input token and the k drafts as one sequence's 1 + k query rows:
# `allocate_slots(seq, 1 + k)` takes slots for all of them, possibly a fresh page, and
# the forward writes their K/V. Greedy acceptance keeps the longest prefix of drafts equal
# to the model's own argmax, then one more token from the model (`paged_np.engine.rejection`;
# sampling has an exact rule too). The K/V of the input token and the accepted drafts are
# right; the rejected drafts' are not, and must leave **no trace**:
#
# - **in the block table**: the sequence goes back to its verified length
#   (`cache.discard_pending`). Pages wholly past it return to the pool; a partly
#   written page stays, and its stale slots are simply written again next step. A page
#   kept for a rejected draft would be read by the kernel (`seq_len`) or leak.
# - **in the prefix index**: only verified tokens are appended, so only pages full of
#   verified tokens are hashed (or inserted in the radix tree). A page hashed with a draft in
#   it stays with the sequence, whose next step overwrites the draft's slot with the real
#   token: the index would then serve, to a later prompt, K/V that does not match its hash.
#
# Below: pages of 4, a sequence with 6 tokens written (L0 full, L1 half). The step runs its
# input token and k = 4 drafts, positions 6 to 10: L1 fills and L2 is allocated. The model
# accepts 1 draft, so 8 tokens are written and L2, holding only rejected positions, goes back.

# %%
PS, K, ACCEPT = 4, 4, 1
sc = pnp.PagedKVCache(pnp.CacheConfig(num_pages=6, page_size=PS, head_dim=8))
written = [11, 12, 13, 14, 15, 16]                     # positions 0..5
sc.add_sequence("s", written); sc.allocate_slots("s", 6); sc.append_tokens("s", written)
fig, axes = plt.subplots(3, 1, figsize=(6, 8))
viz.draw_block_tables(sc, ax=axes[0], title="before the step: 6 tokens written")
step_tokens = [17, 21, 22, 23, 24]                     # input token, then K drafts
sc.allocate_slots("s", 1 + K)                          # slots for positions 6..10
viz.draw_block_tables(sc, ax=axes[1], title=f"allocate_slots(1 + {K}): L2 is new")
l2 = sc.block_table("s")[2]
sc.append_tokens("s", step_tokens[:1 + ACCEPT])        # only verified tokens are written
n_freed = sc.discard_pending("s")                      # rejected drafts' slots dropped
viz.draw_block_tables(sc, ax=axes[2], title=f"{ACCEPT} draft accepted, discard_pending")
fig.tight_layout()
assert (n_freed, sc.num_computed_tokens("s"), sc.pool.state(l2)) == (1, 8, "free")
sc.check_invariants()

# %% [markdown]
# L1 is now full of verified tokens (15 and 16, then the input token 17 and the accepted
# draft 21), so it was hashed into the prefix index; L2 never was, and is free again. A prompt
# that starts with the 8 verified tokens finds both pages; one that continues with the
# rejected drafts finds nothing more.

# %%
probe = written + step_tokens[:1 + ACCEPT] + step_tokens[1 + ACCEPT:] + [0]  # 12 + 1 tokens
print("cached prefix of the probe:", sc.num_cached_prefix_tokens(probe), "tokens")
assert sc.num_cached_prefix_tokens(probe) == 8

# %% [markdown]
# Now on the tiny model. Its weights are random, but greedy decoding of a random model
# soon falls into loops, which n-gram drafts predict; the prompt repeats a phrase, so the
# lookup has something to find from the start. Greedy tokens must be exactly those of
# plain decoding and of `dense_generate`, in fewer steps.

# %%
spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3,
        "prompt_lookup_min": 1}
loop_prompt = np.random.default_rng(0).integers(0, 256, 12).tolist() * 3
greedy = pnp.SamplingParams(max_tokens=40, temperature=0.0)
spec_runs = {}
for name, config in (("plain", None), ("ngram", spec)):
    e = pnp.Engine(model, num_pages=32, page_size=8, backend=BACKEND, speculative_config=config)
    spec_runs[name] = (e.generate([loop_prompt], greedy)[0].token_ids, e.metrics)
sm = spec_runs["ngram"][1]
print({k: round(sm[k], 2) for k in ("spec_num_draft_tokens", "spec_num_accepted_tokens",
                                    "spec_acceptance_rate", "spec_mean_accepted_length")})
print("steps: plain", spec_runs["plain"][1]["steps"], " with drafts", sm["steps"])
assert spec_runs["ngram"][0] == spec_runs["plain"][0] == model.dense_generate(loop_prompt, 40)
assert sm["spec_num_accepted_tokens"] > 0 and sm["steps"] < spec_runs["plain"][1]["steps"]

# %% [markdown]
# `spec_acceptance_rate` is accepted drafts over drafts; `spec_mean_accepted_length` is
# the tokens a drafting step emits (1 + accepted drafts; 1.0 means no gain). Whether that
# buys time depends on what a 1 + k row step costs. On SmolLM2-135M with 2 CPU threads
# (`python benchmarks/spec_decode.py`, the table "What a drafting step costs" in
# `benchmarks/spec_decode.md`) a step of 1 + 8 rows costs several one-row steps, not
# "about one step": the weights are read once, but each row still does its own
# arithmetic, and two CPU cores do it about as slowly as they read the weights. So
# copying chats gain less than their acceptance promises, and the engine stops drafting
# for a request whose drafts keep failing.
#
# ## Exercise 5b: what does rollback give back?
#
# Pages of **4** tokens. A sequence has **14** tokens written (L0 to L3; L3 holds two).
# This step runs its input token and **k = 7** drafts: `allocate_slots` gives 8 slots,
# positions 14 to 21. The model accepts the first **2** drafts. How many tokens are
# written after the step (`written_after`), and which logical pages does
# `discard_pending` give back (`freed`, a list of logical page numbers, `[]` if none)?

# %% exercise 5b
written_after = None    # tokens written after the step
freed = None            # logical pages given back, e.g. [4, 5]

# %% check 5b
rb = pnp.PagedKVCache(pnp.CacheConfig(num_pages=8, page_size=4, head_dim=8))
rb_ids = list(range(100, 122))                          # 14 written, 1 input, 7 drafts
rb.add_sequence("s", rb_ids[:14]); rb.allocate_slots("s", 14); rb.append_tokens("s", rb_ids[:14])
rb.allocate_slots("s", 1 + 7)
grown = len(rb.block_table("s"))                        # pages while the drafts are in
rb.append_tokens("s", rb_ids[14:14 + 1 + 2])            # the input token, 2 accepted drafts
rb.discard_pending("s")
kept = len(rb.block_table("s"))
check("5b", dict(written_after=written_after, freed=freed),
      dict(written_after=rb.num_computed_tokens("s"), freed=list(range(kept, grown))),
      hints=dict(written_after="the step writes its input token and the accepted drafts; "
                               "the token the model adds after them is sampled, not yet "
                               "written.",
                 freed="a page stays if it holds any written position (position p is in "
                       "logical page p // 4); the allocation reached position 21."),
      done=f"{rb.num_computed_tokens('s')} tokens in {kept} pages; "
           f"{', '.join(f'L{i}' for i in range(kept, grown))} held only rejected drafts.")

# %% [markdown]
# ## Sampling with drafts: the acceptance rule
#
# Greedy verification keeps a draft when it equals the model's argmax. With sampling
# (`temperature > 0`) there is no single right token: the model gives a distribution `p`
# over the vocabulary, and plain decoding draws from it. A draft `d` was itself drawn
# from a distribution `q` (a draft model's; for prompt lookup, a point mass on `d`). The
# rule of Leviathan et al. and Chen et al. (2023) keeps the output **exactly** distributed
# as `p`, whatever `q` is:
#
# - keep `d` with probability `min(1, p(d) / q(d))`;
# - if it is rejected, draw instead from the **residual** `max(0, p - q)`, normalised.
#
# Why it is exact: token `x` comes out either as an accepted draft, with probability
# `q(x) min(1, p(x)/q(x)) = min(p(x), q(x))`, or from the residual after a rejection. A
# rejection happens with probability `1 - sum_y min(p(y), q(y)) = sum_y max(0, p(y) - q(y))`,
# which is exactly the residual's normalising sum, so the second way gives
# `max(0, p(x) - q(x))`. The two add up to `min(p, q) + max(0, p - q) = p(x)`. Where the
# draft model over-proposes a token (`q > p`), the test takes some of it away; the
# residual gives it back where `q` under-proposed. `paged_np.engine.rejection` applies
# this row by row, stopping at the first rejection.
#
# ## Exercise 5d: the rule, yours, tested by its distribution
#
# Write `accept_probability(p, q, d)` (the probability of keeping draft `d`) and
# `residual(p, q)` (the distribution, `[V]`, summing to 1, drawn from after a rejection).
# The check does not compare your numbers with the package's: it **samples**. For four
# pairs of `p` and `q` (one a point mass, as prompt lookup's drafts are) it draws 40,000
# tokens by speculation with your two functions and 40,000 by plain sampling from `p`,
# and runs a chi-square test of the two counts: if they differ by more than chance allows
# (at the 0.1% level), your rule changes the distribution, and the check shows the token
# that moved most.

# %% exercise 5d
def accept_probability(p, q, d):
    """p, q: [V] target and draft distributions; d: the draft -> P(keep d), a float."""
    raise NotImplementedError        # your code here (one line)


def residual(p, q):
    """p, q: [V] -> [V], the distribution to draw from when the draft is rejected."""
    raise NotImplementedError        # your code here (two lines)

# %% check 5d
from statistics import NormalDist

N_DRAWS = 40_000


def chi_square(a, b):
    """Two count vectors [V]: the chi-square statistic of homogeneity, and its degrees of
    freedom (tokens neither sample drew are left out)."""
    keep = (a + b) > 0
    a, b = a[keep], b[keep]
    expected_a = (a + b) * a.sum() / (a.sum() + b.sum())
    expected_b = (a + b) - expected_a
    stat = (((a - expected_a) ** 2 / expected_a) + ((b - expected_b) ** 2 / expected_b)).sum()
    return float(stat), int(keep.sum()) - 1


def critical(df, alpha=0.001):
    """The chi-square value exceeded with probability alpha (Wilson-Hilferty)."""
    z = NormalDist().inv_cdf(1 - alpha)
    return df * (1 - 2 / (9 * df) + z * np.sqrt(2 / (9 * df))) ** 3


def speculative_counts(accept, resid, p, q, seed):
    """N_DRAWS tokens drawn by speculation with these two functions: counts [V]."""
    r = np.random.default_rng(seed)
    V = len(p)
    a = np.array([float(accept(p, q, d)) if q[d] > 0 else 0.0          # [V] P(keep d),
                  for d in range(V)])                                 # for d ~ q only
    res = np.asarray(resid(p, q), dtype=np.float64)                     # [V]
    if a.shape != (V,) or res.shape != (V,) or not (0 <= a).all() or not (a <= 1 + 1e-9).all():
        raise ValueError(f"accept_probability must be in [0, 1] and residual [V]; got "
                         f"{np.round(a, 3)} and shape {res.shape}")
    if (res < 0).any() or not np.isclose(res.sum(), 1.0):
        raise ValueError(f"residual must be a distribution (>= 0, sum 1); sums to {res.sum():.4f}")
    drafts = r.choice(V, size=N_DRAWS, p=q)                             # [N] d ~ q
    kept = r.random(N_DRAWS) < a[drafts]                                # [N] the test
    out = np.where(kept, drafts, r.choice(V, size=N_DRAWS, p=res))      # [N] else resample
    return np.bincount(out, minlength=V)


def distribution_test(accept, resid, p, q, seed):
    """None if speculation with these functions draws as plain sampling from p does;
    else how it differs."""
    spec = speculative_counts(accept, resid, p, q, seed)
    plain = np.bincount(np.random.default_rng(seed + 1).choice(len(p), size=N_DRAWS, p=p),
                        minlength=len(p))                               # no drafts
    stat, df = chi_square(spec, plain)
    if stat <= critical(df):
        return None
    x = int(np.argmax(np.abs(spec - plain)))
    return (f"your rule draws another distribution (chi-square {stat:.0f}, more than the "
            f"{critical(df):.0f} chance allows at 0.1%): token {x} comes "
            f"{spec[x] / N_DRAWS:.1%} of the time with your rule, {plain[x] / N_DRAWS:.1%} "
            f"without drafts (p = {p[x]:.1%}, q = {q[x]:.1%})")


def pq_case(r, point_mass=False, V=8):
    p = r.dirichlet(np.ones(V))
    q = np.eye(V)[int(r.integers(V))] if point_mass else r.dirichlet(np.ones(V) * 0.5)
    return p, q, int(r.integers(1 << 30))


r = np.random.default_rng(8)
cases = [pq_case(r), pq_case(r), pq_case(r, point_mass=True), pq_case(r)]
check_property("5d", lambda p, q, seed: distribution_test(accept_probability, residual,
                                                          p, q, seed),
               cases, blank="accept_probability and residual",
               describe=lambda p, q, seed: f"p={np.round(p, 2).tolist()}, "
                                           f"q={np.round(q, 2).tolist()}",
               hints=Hint("an accepted draft gives token x with probability min(p(x), q(x)); "
                          "the residual must make up exactly what is missing, p(x) - "
                          "min(p(x), q(x)), and be a distribution.",
                          code="accept: min(1.0, p[d] / q[d]); residual: r = np.maximum(p - "
                               "q, 0.0); return r / r.sum()"),
               done=f"{N_DRAWS:,} draws each, indistinguishable from sampling without "
                    "drafts: speculation changes the speed, never the distribution. "
                    "paged_np.engine.rejection.rejection_sample applies the same rule.")

# %% [markdown]
# **Try it:** make the roomy cache smaller (48, 32 pages) and watch the preemptions
# appear; raise `max_num_batched_tokens` in the first example and see the chunks vanish;
# set `N_SIM = 1000` for the full simulation; give the speculative run 8 drafts
# (`"num_speculative_tokens": 8`), or a prompt that does not repeat itself, and watch
# the acceptance.
#
# ## Self-check
#
# 1. A step's token budget is 32; a running decode and a waiting 40-token prompt. What
#    does the step compute?
#    <details><summary>answer</summary>The decode's 1 token and a 31-token chunk of the
#    prompt (chunked prefill); the prompt's last 9 tokens come next step.</details>
# 2. Why preempt the newest running request rather than the one that needs the page?
#    <details><summary>answer</summary>The newest has done the least work, so
#    recomputing it later wastes the least; the oldest finish first and free their
#    pages.</details>
# 3. Recompute or swap: which repeats compute, and which moves bytes?
#    <details><summary>answer</summary>Recompute drops the KV and prefills again (partly
#    saved by prefix hits on its own cached pages); swap copies the pages to host memory
#    and back, computing nothing twice.</details>
# 4. A draft model proposes token `d` with `q(d) = 0.5`; the target gives it `p(d) = 0.2`.
#    How often is it kept, and where does the rest of the probability go?
#    <details><summary>answer</summary>40% of the time (`min(1, 0.2 / 0.5)`); after a
#    rejection the token is drawn from `max(0, p - q)` normalised, which never gives `d`
#    again (there `p < q`) and restores the tokens the draft model under-proposed.
#    </details>
# 5. Why can recomputing a preempted request change greedy text on some engines?
#    <details><summary>answer</summary>The recompute runs the tokens in another batch
#    shape (a prefill chunk); kernels that are not batch-invariant sum in another order,
#    the last bits of the logits move, and a near tie in the argmax can flip.</details>
# 6. Does a bigger batch share the KV reads of a decode step?
#    <details><summary>answer</summary>No: each sequence reads its own KV. It shares the
#    weights' read, once per step for the whole batch.</details>
#
# **Next:** notebook 6 makes the attention kernel fast with Numba and asks how fast it can
# be.
