# %% [markdown]
# # 8. A real model on the paged cache
#
# Notebooks 1-7 ran a random-weight toy, so a memory bug showed up as an array
# difference. Here the same cache serves **SmolLM2-135M-Instruct** (30 layers, 9 query
# heads over 3 kv heads of 64 dims) through `pnp.LLM`, vLLM's offline API, and a bug
# shows up as a sentence turned to nonsense.
#
# The model is fetched once (98 MB) into `~/.cache/paged_np`. By default `load_model`
# keeps the file's quantized blocks (notebook 9's lesson); here `quantization=None`
# dequantizes them to float32, so a weight is 4 bytes in the counts below. We load it
# once and build a fresh `pnp.LLM` around it for each experiment (`backend="numpy"`: no compile time, easy to read).
#
# **What you need:** notebooks 1-5 (pages, the online softmax, prefix hits, preemption,
# the engine's step); notebook 6's roofline for section 5. About 100 MB of disk for
# the model, downloaded on first use.
#
# **What you will be able to do:** size an arena from a memory budget; see prefix reuse
# and preemption on real chats, with the text unchanged; split a decode step's time
# between weights and KV; read TTFT, time per output token and inter-token latency off a
# run, and trade them against throughput with the engine's two budgets; recognise three
# classic paged-attention mistakes by what they do to real text.

# %%
import time
from contextlib import contextmanager

import numpy as np
import matplotlib.pyplot as plt

import paged_np as pnp
from paged_np import viz
from paged_np.models import llama
from _exercise import check              # notebooks/_exercise.py: checks your answers

t0 = time.perf_counter()
model, tok = pnp.load_model("smollm2-135m-instruct", quantization=None)
cfg = model.cfg
print(f"loaded in {time.perf_counter() - t0:.1f} s: {model.num_parameters / 1e6:.0f} M "
      f"parameters, {cfg.num_layers} layers, {cfg.num_heads} q heads, "
      f"{cfg.num_kv_heads} kv heads x {cfg.head_dim}")


def make_llm(**kw):
    """A fresh LLM (fresh cache) around the loaded model; greedy runs are repeatable."""
    kw.setdefault("backend", "numpy")
    return pnp.LLM(model, tokenizer=tok, verbose=False, **kw)


GREEDY = pnp.SamplingParams(max_tokens=20, temperature=0)
SYSTEM = {"role": "system", "content": (
    "You are a friendly teacher. You answer every question in one short, clear "
    "sentence that a ten year old child can understand, and you never use jargon.")}
QUESTIONS = ["What is the capital of France?", "Why is the sky blue?",
             "What do bees make?"]


def chat_of(question):
    return [SYSTEM, {"role": "user", "content": question}]

# %% [markdown]
# ## 1. The arena, sized from a memory budget
#
# `pnp.LLM(kv_cache_memory="64MiB")` turns bytes into pages once, at start-up, as
# vLLM's `kv_cache_memory_bytes` does. (vLLM's more common knob,
# `gpu_memory_utilization`, is a fraction of the whole GPU, from which vLLM subtracts
# the weights and the activations it profiled; what is left becomes KV blocks.) One page
# holds K and V of `page_size` tokens in
# every layer and kv head, float32:
#
# `2 (K, V) x layers x kv heads x page_size x head_dim x 4 bytes`.

# %%
P = 16
per_page = pnp.EngineConfig(page_size=P).cache_config(cfg).bytes_per_page   # the LLM's own sum
per_token = per_page // P
print(f"one token of KV: {per_token:,} bytes; one page of {P} tokens: "
      f"{per_page / 1024:.0f} KiB")
for budget in ("16MiB", "256MiB", "1GiB"):
    llm = make_llm(kv_cache_memory=budget, page_size=P)
    n = llm.engine.cache.cfg.num_pages
    print(f"{budget:>7}: {n:5d} pages = {n * P:6,d} tokens")
assert per_page == 2 * cfg.num_layers * cfg.num_kv_heads * P * cfg.head_dim * 4

# %% [markdown]
# A chat reserves pages for the tokens it holds, never for the context it *might* reach,
# so the number of concurrent chats depends on how long they really are. The 9 query
# heads share 3 kv heads (grouped-query attention): the cache is 3x smaller than with
# one kv head per query head.
#
# ## Exercise 8a: how many chats fit?
#
# With `kv_cache_memory="64MiB"` and `page_size=16`, how many pages does the arena get
# (`arena_pages`), and how many chats of 1000 tokens each can it hold at once
# (`chats`)? Each chat needs whole pages. Compute them from `per_page`.

# %% exercise 8a
arena_pages = None  # pages in a 64 MiB arena
chats = None        # 1000-token chats that fit at once

# %% check 8a
_n = make_llm(kv_cache_memory="64MiB", page_size=16).engine.cache.cfg.num_pages
check("8a", dict(arena_pages=arena_pages, chats=chats),
      dict(arena_pages=_n, chats=_n // -(-1000 // 16)),
      hints=dict(arena_pages="64 MiB is 64 * 2**20 bytes; a part page is no page: "
                           "round down.",
                 chats="a chat of 1000 tokens needs ceil(1000 / 16) pages."),
      done="A contiguous cache would reserve max_model_len (8192 tokens) per chat: "
           f"{_n * 16 // 8192} chats.")

# %% [markdown]
# ## 2. Chats that share a system prompt, page by page
#
# Every chat starts with the same system prompt. Once the first chat's prompt pages are
# full, they are hashed (notebook 3); the next chats find them in the prefix index and
# point their block tables at the same pages instead of computing them again. We start
# one chat, let it prefill, then add two more.

# %%
llm = make_llm(num_pages=24, page_size=P)
prompt_lens = [len(tok.encode(tok.apply_chat_template(chat_of(q)))) for q in QUESTIONS]
print("prompt tokens:", prompt_lens)
llm.add_request("chat-0", tok.apply_chat_template(chat_of(QUESTIONS[0])), GREEDY)
llm.step()                              # chat 0's prefill: its full pages get hashed
for i in (1, 2):
    llm.add_request(f"chat-{i}", tok.apply_chat_template(chat_of(QUESTIONS[i])), GREEDY)
llm.step()                                  # chats 1 and 2 prefill what was not cached
cache = llm.engine.cache
fig = viz.draw_block_tables(cache, title="three chats, one system prompt")
tables = [cache.block_table(s) for s in cache.seq_ids]
shared = [int(p) for p in tables[0] if all(p in t for t in tables[1:])]
print("pages in all three block tables:", shared,
      "ref counts:", [cache.pool.ref_count(p) for p in shared])
assert shared and all(cache.pool.ref_count(p) == 3 for p in shared)

# %% [markdown]
# The pages drawn with three arrows hold the system prompt once. Let the chats finish:

# %%
answers = {}
while llm.has_unfinished_requests():
    for out in llm.step():
        if out.finished:
            answers[out.request_id] = out
for i, q in enumerate(QUESTIONS):
    out = answers[f"chat-{i}"]
    print(f"{q}\n  -> {out.outputs[0].text!r}  (prompt tokens from the cache: "
          f"{out.num_cached_tokens})")
assert answers["chat-1"].num_cached_tokens == len(shared) * P

# %% [markdown]
# ## 3. A conversation whose every turn reuses the previous turns
#
# A chat client sends the whole conversation again each turn. The previous turns'
# tokens are already in the cache (the prompt's pages, and the pages the answer was
# written into), so only the new part, plus the tail of the last part-filled page, is
# computed. `num_cached_tokens` counts the prompt tokens that came from the cache.

# %%
llm = make_llm(num_pages=48, page_size=P)
conversation = [SYSTEM]
turns = ["Name a planet.", "How big is it?", "Thank you! What colour is it?"]
reused = []
for user in turns:
    conversation.append({"role": "user", "content": user})
    out = llm.chat(conversation, GREEDY)[0]
    conversation.append({"role": "assistant", "content": out.outputs[0].text})
    n = len(out.prompt_token_ids)
    reused.append(out.num_cached_tokens)
    print(f"user: {user}\n  assistant: {out.outputs[0].text!r}\n  prompt {n} tokens, "
          f"{out.num_cached_tokens} from the cache, "
          f"{n - out.num_cached_tokens} computed")
assert reused[0] == 0 and all(r > 0 for r in reused[1:]) and reused[2] > reused[1]

# %% [markdown]
# ## 4. Memory pressure: eviction and preemption, same text
#
# Now the three chats get an arena too small to hold them all to the end: 8 pages
# (128 tokens) for three prompts of ~55 tokens that each grow by 20. The scheduler
# evicts cached pages first (LRU) and, when that is not enough, **preempts** the
# youngest chat: frees its pages and recomputes it later. Greedy text must not change.

# %%
def run(prompts, **kw):
    llm = make_llm(page_size=P, **kw)
    outs = llm.generate(prompts, GREEDY)
    return [o.outputs[0].text for o in outs], llm.engine.metrics


prompts = [tok.apply_chat_template(chat_of(q)) for q in QUESTIONS]
roomy, m_roomy = run(prompts, num_pages=64)
tight, m_tight = run(prompts, num_pages=8)
for k in ("preemptions", "evictions", "steps"):
    print(f"{k:>12}: roomy {m_roomy[k]:3d}   tight {m_tight[k]:3d}")
for a, b in zip(roomy, tight):
    print("same" if a == b else "DIFFERENT", repr(b))
assert tight == roomy and m_tight["preemptions"] > 0 and m_roomy["preemptions"] == 0

# %% [markdown]
# The same text, here. That is a fact about these kernels, not about recompute in
# general (notebook 5's **batch invariance**): the preempted chat's tokens were
# recomputed in a prefill chunk, beside other chats, where they were first computed one
# decode row at a time. The same K/V come back only if every kernel computes a row the
# same whatever else shares the step. Float sums in another order differ in the last
# bits, and with 49,152 logits a near tie at the top is not rare: one flipped argmax and
# the texts part. vLLM offers a batch-invariant mode for this reason; paged_np's kernels
# are batch-invariant for decode and verify steps (`docs/design.md`). Run this cell's
# comparison as a measurement, not a proof.

# %% [markdown]
# ## 5. Where a decode step spends its time
#
# We time attention inside the model's forward (a wrapper around the kernel the model
# calls) and subtract it from the whole forward: the rest is the matmuls (and norms).

# %%
@contextmanager
def attention_kernel(fn):
    """Run the model with ``fn`` in place of ``paged_attention`` (restored after)."""
    old = llama.paged_attention
    llama.paged_attention = fn
    try:
        yield
    finally:
        llama.paged_attention = old


spent = {"attention": 0.0}


def timed_attention(*args, **kw):
    t = time.perf_counter()
    out = pnp.paged_attention(*args, **kw)
    spent["attention"] += time.perf_counter() - t
    return out


llm = make_llm(num_pages=64, page_size=P)
for i, p in enumerate(prompts):
    llm.add_request(i, p, pnp.SamplingParams(max_tokens=12, temperature=0))
llm.step()                                   # the prefills
model_s, steps = llm.engine.metrics["model_s"], 0
with attention_kernel(timed_attention):
    while llm.has_unfinished_requests():
        llm.step()
        steps += 1
fwd = (llm.engine.metrics["model_s"] - model_s) / steps
att = spent["attention"] / steps
print(f"decode step, batch of 3: forward {fwd * 1e3:.0f} ms = attention "
      f"{att * 1e3:.0f} ms + matmuls and the rest {(fwd - att) * 1e3:.0f} ms")

# %% [markdown]
# Why: count the work of one decode token with `L` tokens of context. The matmuls
# touch every weight once per step (shared by the whole batch); attention touches
# every cached K and V of its own sequence.

# %%
L, B = 70, 3                                  # context per chat, chats in the batch
linear = model.num_parameters - cfg.vocab_size * cfg.hidden_size  # tied embedding
linear += cfg.vocab_size * cfg.hidden_size                        # ... used as LM head
mm_flops = 2 * linear * B
mm_bytes = 4 * linear                                              # float32 weights
att_flops = 4 * L * cfg.num_heads * cfg.head_dim * cfg.num_layers * B   # QK^T and PV
att_bytes = per_token * L * B                                     # K and V read once
print(f"matmuls:   {mm_flops / 1e9:6.3f} GFLOP, {mm_bytes / 2**20:7.1f} MiB of weights")
print(f"attention: {att_flops / 1e9:6.3f} GFLOP, {att_bytes / 2**20:7.1f} MiB of KV")
print(f"ratios (matmuls / attention): FLOPs {mm_flops / att_flops:.0f}x, "
      f"bytes {mm_bytes / att_bytes:.0f}x")
print(f"FLOP per byte: matmuls {mm_flops / mm_bytes:.1f}, "
      f"attention {att_flops / att_bytes:.1f}")
assert mm_flops > att_flops and mm_bytes > att_bytes

# %% [markdown]
# Both do about one or two FLOP per byte read: far too few to keep a CPU's arithmetic
# busy (notebook 6's roofline), so both are limited by memory and time follows bytes.
# At 70 tokens of context the weights dwarf the KV cache, so the matmuls dominate. The
# KV read grows with `L x batch` and the weight read does not: at a few thousand tokens
# times a large batch attention takes over, which is why paged attention kernels are
# tuned for bandwidth (notebook 6). The measured split above also carries Python
# overhead per layer, which a compiled server removes.
#
# ## 6. Three classic mistakes, on real text
#
# Three mistakes are easy to make in a paged attention written from scratch, and hard to
# see on random data. Each is written below as a small wrong kernel or policy, switched in
# on purpose, and run on the real model beside the right one.
#
# 1. **Per-page softmax**: it softmaxes each page's scores on its own and adds the
#    pages' outputs. Each page's weights sum to 1, so a sequence of 4 pages gets
#    weights summing to 4, and nothing compares scores across pages (notebook 2's online
#    softmax keeps a running max and rescales).
# 2. **Slice by the query's length**: it keeps `k_page[:n_q]` of each page, the number
#    of query tokens, instead of the number of tokens the page holds. A prefill chunk
#    longer than a page hides it; in decode (`n_q = 1`) each page shows one key.
# 3. **Evicting live pages**: when no page is free, it takes the page allocated first
#    (first in, first out, over *every* page), even one a running sequence still reads.
#    Any order over live pages would be as wrong, LRU included: what must never be
#    evicted is a page someone still holds (`ref_count > 0`).

# %%
def wrong_attention(mistake):
    """A from-scratch paged attention with mistake 1 or 2 (0: none); the package's
    signature, so the model can call it."""

    def attention(q, k_pages, v_pages, block_tables=None, seq_lens=None, query_start_loc=None,
                  scale=None, sliding_window=None, backend=None, return_lse=False, *,
                  metadata=None):
        if metadata is not None:  # the model checks a step's tables once, for every layer
            block_tables, seq_lens = metadata.block_tables, metadata.seq_lens
            query_start_loc = metadata.query_start_loc
        T, H, D = q.shape
        _, Hkv, P, _ = k_pages.shape
        g, scale = H // Hkv, scale or D ** -0.5
        out = np.zeros_like(q)
        for b, L in enumerate(np.asarray(seq_lens)):
            s, e = query_start_loc[b], query_start_loc[b + 1]
            n_q, n_pages = e - s, -(-L // P)
            pos = np.arange(n_pages * P)                    # key positions
            q_pos = L - n_q + np.arange(n_q)                # the queries' positions
            keep = pos[None, :] <= q_pos[:, None]           # causal [n_q, N]
            if mistake == 2:
                keep &= (pos % P < n_q)[None, :]            # k_page[:n_q]: wrong
            pages = block_tables[b, :n_pages]
            K = k_pages[pages].transpose(1, 0, 2, 3).reshape(Hkv, -1, D)  # [Hkv, N, D]
            V = v_pages[pages].transpose(1, 0, 2, 3).reshape(Hkv, -1, D)
            qb = q[s:e].reshape(n_q, Hkv, g, D).transpose(1, 2, 0, 3)  # [Hkv,g,n_q,D]
            sc = np.where(keep, qb @ K[:, None].swapaxes(-1, -2) * scale, -np.inf)
            if mistake == 1:                                # softmax page by page
                sc = sc.reshape(*sc.shape[:-1], n_pages, P)
                w = np.exp(sc - sc.max(-1, keepdims=True, initial=-1e30))
                w = w / np.maximum(w.sum(-1, keepdims=True), 1e-30)  # each page: sum 1
                w = w.reshape(*w.shape[:-2], -1)
            else:
                w = np.exp(sc - sc.max(-1, keepdims=True))
                w /= w.sum(-1, keepdims=True)
            o = w.astype(np.float32) @ V[:, None]           # [Hkv, g, n_q, D]
            out[s:e] = o.transpose(2, 0, 1, 3).reshape(n_q, H, D)
        return out

    return attention

# %% [markdown]
# Before trusting it, the same code without a mistake must match the package's kernel
# on a real cache (mistake 0 is the right softmax over the tokens held):

# %%
rng = np.random.default_rng(0)
shape = (2, 8, cfg.num_kv_heads, P, cfg.head_dim)            # K and V, 8 pages
kp, vp = rng.standard_normal(shape, dtype=np.float32)
bt = np.array([[3, 6, 1, 4], [5, 0, 7, 2]], np.int32)     # two sequences, 4 pages each
lens = np.array([60, 53], np.int32)
for n_q in (20, 1):                                      # a prefill chunk, then decode
    qq = rng.standard_normal((2 * n_q, cfg.num_heads, cfg.head_dim), dtype=np.float32)
    args = (qq, kp, vp, bt, lens, np.array([0, n_q, 2 * n_q], np.int32))
    want = pnp.paged_attention(*args, backend="numpy")
    err = [np.abs(wrong_attention(m)(*args) - want).max() for m in (0, 1, 2)]
    print(f"n_q = {n_q:2d}: max error of mistakes 0, 1, 2:",
          ", ".join(f"{e:.1e}" for e in err))
    assert err[0] < 1e-4 and err[1] > 0.1

# %% [markdown]
# Mistake 3 lives in the page pool. The wrong pool below keeps the real pool's
# bookkeeping but, when nothing is free or cached, hands out the page *in use* that was
# allocated first (first in, first out; and it claims it always has pages, so the
# scheduler never preempts). Both owners then write into the same page.

# %%
def wrong_pool(pool):
    """Switch ``pool`` (a PagePool) to the wrong eviction: FIFO over every page, live
    ones included."""

    class WrongPool(type(pool)):
        @property
        def num_available(self):
            return self.num_pages             # "there is always a page to take"

        def allocate(self, seq_id=None):
            if self.num_free or self.prefix_index.num_evictable:
                p = super().allocate(seq_id)
            else:                             # steal the oldest page, live or not
                p = next(p for p in self.order if self.ref_count(p) > 0)
                self.share(p)                 # keep the ref counts consistent
            self.order = [x for x in self.order if x != p] + [p]
            return p

    pool.__class__ = WrongPool
    pool.order = []
    return pool

# %% [markdown]
# Now each mistake on the three chats. Next to the text we record the logits the
# model produced at each generated token, and compare them with the right run's at
# every token up to the first one that differs (the inputs are the same until then).

# %%
def logits_recorder(llm):
    """Record, per (request, token index), the logits row it was sampled from.

    ``Engine.add_logits_listener`` hands us each row the model scores: here the
    row of each generated token, in order (``position`` is where in the
    sequence it was scored; we only need the count). The row is a view: copy it.
    """
    got, seen = {}, {}

    def record(request_id, sample_index, position, row):
        i = seen.get(request_id, 0)
        got[request_id, i] = row.copy()
        seen[request_id] = i + 1

    llm.engine.add_logits_listener(record)
    return got


def serve(num_pages, kernel=None, pool=None):
    llm = make_llm(num_pages=num_pages, page_size=P)
    if pool:
        pool(llm.engine.cache.pool)
    got = logits_recorder(llm)
    with attention_kernel(kernel or pnp.paged_attention):
        outs = llm.generate(prompts, GREEDY)
    return outs, got


def drift(right, wrong):
    """Max |logit difference| over the tokens up to the first that differs."""
    worst = 0.0
    for (r, w) in zip(right[0], wrong[0]):
        rid, a, b = r.request_id, r.outputs[0].token_ids, w.outputs[0].token_ids
        for i in range(min(len(a), len(b))):
            worst = max(worst, float(np.abs(right[1][rid, i] - wrong[1][rid, i]).max()))
            if a[i] != b[i]:
                break
    return worst


right = serve(64)                    # the package's kernel and pool: the reference
runs = {"1 per-page softmax": serve(64, kernel=wrong_attention(1))}

# %%
runs["2 slice by n_q"] = serve(64, kernel=wrong_attention(2))

# %%
runs["3 FIFO evicts live pages"] = serve(8, pool=wrong_pool)  # section 4's tight arena

# %%
moved = {name: drift(right, r) for name, r in runs.items()}
for i, q in enumerate(QUESTIONS):
    print(f"{q}\n  {'right':>24}: {right[0][i].outputs[0].text!r}")
    for name, (outs, _) in runs.items():
        print(f"  {name:>24}: {outs[i].outputs[0].text!r}")
print()
for name, d in moved.items():
    print(f"mistake {name}: logits move by up to {d:.2f}")

# %%
changed = {name: sum(o.outputs[0].text != r.outputs[0].text
                     for o, r in zip(outs, right[0]))
           for name, (outs, _) in runs.items()}
print("chats whose text changed:", changed)
assert all(n > 0 for n in changed.values()) and all(d > 1.0 for d in moved.values())
fig, ax = plt.subplots(figsize=(6, 2))
ax.barh(list(moved), list(moved.values()), color=["C3", "C1", "C4"])
ax.set_xlabel("max |logit - right logit| before the text parts ways")
ax.invert_yaxis();

# %% [markdown]
# The logits of a 49,152-word vocabulary sit a few units apart at the top: a shift of
# one or two already picks another word, and after that every later token is
# conditioned on the wrong one. The right kernel (notebook 2) and the ref-counted pool
# (notebook 3) are why the tight arena of section 4 gives the same text as a roomy one.
#
# ## 7. Latency: what a user waits for
#
# Throughput (tokens per second over the whole server) is what the operator counts; a
# user waits for three other things, which vLLM's metrics report per request:
#
# - **TTFT**, time to first token: queueing plus the prefill of the prompt;
# - **TPOT**, time per output token: `(t_last - t_first) / (n - 1)`, the pace of the
#   answer once it started;
# - **ITL**, inter-token latency: each gap between two tokens; its tail (p90, max) is the
#   stutter a user sees when a long prefill shares a step with their decode.
#
# The engine reports each request's output after every step (`engine.request_output`)
# and its own step count and time split (`engine.metrics`); stamping each new token with
# the time of its step gives all three. Here the three chats, served together:

# %%
def timed_run(llm, prompts):
    """Serve prompts stepping by hand; the time of each generated token, per request."""
    eng, t0 = llm.engine, time.perf_counter()
    ids = [eng.add_request(tok.encode(p), GREEDY, request_id=f"c{i}")
           for i, p in enumerate(prompts)]
    stamps, outs = {i: [] for i in ids}, {}
    while eng.has_unfinished_requests():
        done = {o.request_id: o for o in eng.step()}
        now = time.perf_counter() - t0
        for i in ids:
            if i in outs:
                continue
            o = done.get(i) or eng.request_output(i)
            stamps[i] += [now] * (len(o.outputs[0].token_ids) - len(stamps[i]))
            if i in done:
                outs[i] = o
    return stamps


stamps = timed_run(make_llm(num_pages=64, page_size=P), prompts)
for i, st in stamps.items():
    gaps = np.diff(st)
    print(f"{i}: TTFT {st[0] * 1e3:5.0f} ms   TPOT {(st[-1] - st[0]) / (len(st) - 1) * 1e3:4.0f} ms"
          f"   ITL median {np.median(gaps) * 1e3:4.0f} ms, max {gaps.max() * 1e3:4.0f} ms")
assert all(len(st) == GREEDY.max_tokens for st in stamps.values())

# %% [markdown]
# All three prompts fit one step, so they share one TTFT: the prefill of every prompt
# together. Why is a prefill step of ~200 tokens not 200 times a decode step? A decode
# step reads every weight to produce one token per sequence: it is **memory-bound**
# (section 5: about 2 FLOP per byte). A prefill step reads the same weights once for
# all its tokens, so its FLOPs per byte grow with the tokens, until the arithmetic, not
# the bus, is the limit: it becomes **compute-bound**. The committed benchmark
# `benchmarks/latency_sweep.py` timed one prefill step of T tokens on this model
# (`benchmarks/latency_sweep.json`; the machine and its load are recorded there):

# %%
import json
from pathlib import Path

sweep_path = Path(pnp.__file__).resolve().parents[1] / "benchmarks" / "latency_sweep.json"
sweep = json.loads(sweep_path.read_text())
pre = sweep["prefill"]
fig, axes = plt.subplots(1, 2, figsize=(10, 3))
axes[0].loglog([p["tokens"] for p in pre], [p["s_per_token"] * 1e3 for p in pre], "o-")
axes[0].set_xlabel("prompt tokens in the step"); axes[0].set_ylabel("ms per token")
axes[0].set_title("prefill: the weights' read shared by more tokens", fontsize=9, loc="left")
for budget in sorted({r["max_num_batched_tokens"] for r in sweep["sweep"]}):
    rows = [r for r in sweep["sweep"] if r["max_num_batched_tokens"] == budget]
    axes[1].plot([r["tpot_mean_s"] * 1e3 for r in rows],
                 [r["throughput_tok_s"] for r in rows], "o-",
                 label=f"max_num_batched_tokens={budget}")
    for r in rows:
        axes[1].annotate(r["max_num_seqs"], (r["tpot_mean_s"] * 1e3, r["throughput_tok_s"]),
                         fontsize=7, xytext=(3, 3), textcoords="offset points")
axes[1].set_xlabel("time per output token (ms)"); axes[1].set_ylabel("throughput (tok/s)")
axes[1].set_title("the sweep: numbers are max_num_seqs", fontsize=9, loc="left")
axes[1].legend(fontsize=7)
print(sweep["machine"])

# %% [markdown]
# What to expect, in principle: one sequence at a time gives a user the best pace per
# token and the server the worst throughput. More seats (`max_num_seqs`) share each read
# of the weights among more sequences, so throughput climbs while each step, and so the
# time per output token, grows slowly (decode is memory-bound). TTFT moves the other way
# with few seats: a request waits for others to *finish* before its prefill starts. A
# small token budget cuts prompts into chunks: a step with a chunk in it is shorter, so
# decodes sharing it stutter less (ITL's tail), and the prompt's own TTFT grows. The two
# budgets are the server's dial between a user's latency and the operator's throughput;
# vLLM exposes the same two.
#
# What the committed run shows is printed below, from the same file. It was measured on
# a 2-core machine that other jobs loaded heavily (its load average is recorded above),
# which stretched every step by a factor that changed from minute to minute: the times
# are noisy, and only the largest differences in them mean anything. The **steps**
# column does not depend on the machine: the same 192 tokens took 192 steps at one seat
# and a tenth of that at twelve, each step one read of the weights. Run
# `python benchmarks/latency_sweep.py` on a quiet machine of your own to see the times
# follow.

# %%
print(f"{'seqs':>4} {'budget':>6} {'steps':>5} {'tok/s':>6} {'TTFT s':>7} {'TPOT ms':>8} "
      f"{'ITL p90 ms':>10}")
for r in sweep["sweep"]:
    print(f"{r['max_num_seqs']:>4} {r['max_num_batched_tokens']:>6} {r['steps']:>5} "
          f"{r['throughput_tok_s']:>6.1f} {r['ttft_mean_s']:>7.1f} "
          f"{r['tpot_mean_s'] * 1e3:>8.0f} {r['itl_p90_s'] * 1e3:>10.0f}")
one = {r["max_num_batched_tokens"]: r for r in sweep["sweep"] if r["max_num_seqs"] == 1}
most = {r["max_num_batched_tokens"]: r for r in sweep["sweep"]
        if r["max_num_seqs"] == max(x["max_num_seqs"] for x in sweep["sweep"])}
for budget in one:
    print(f"budget {budget}: throughput x{most[budget]['throughput_tok_s'] / one[budget]['throughput_tok_s']:.1f}"
          f" from 1 seat to {most[budget]['max_num_seqs']}, TPOT "
          f"x{most[budget]['tpot_mean_s'] / one[budget]['tpot_mean_s']:.1f}, mean TTFT "
          f"x{most[budget]['ttft_mean_s'] / one[budget]['ttft_mean_s']:.2f}")

# %% [markdown]
# ## What this notebook taught, and its exercise
#
# - **8a**: pages from a byte budget, and how many chats that holds.
# - Shared system prompt: pages with ref count 3; multi-turn reuse counted by
#   `num_cached_tokens`; preemption leaves greedy text unchanged.
# - Decode time goes to the matmuls at short context: weights are read once per step,
#   KV once per sequence.
# - TTFT, TPOT and ITL from a run; prefill compute-bound, decode memory-bound; the two
#   budgets trade latency for throughput.
#
# ## Self-check
#
# 1. Three chats share a system prompt of 3 full pages. What are those pages' ref counts
#    while all three run, and what happens to them when all three finish?
#    <details><summary>answer</summary>3 each; when the last chat finishes they drop to
#    0 and become CACHED, ready for the next chat's prefix hit.</details>
# 2. Why does preemption by recompute leave greedy text unchanged?
#    <details><summary>answer</summary>The victim's tokens are recomputed from the same
#    inputs by the same model, so its KV comes out the same (its own cached pages even
#    come back as prefix hits), and greedy picks the same tokens.</details>
# 3. Why does batching more sequences raise throughput but barely slow each decode step at
#    short context?
#    <details><summary>answer</summary>The step reads all the weights once whatever the
#    batch; each added sequence adds only its own KV reads and a row of arithmetic.
#    </details>
# 4. A user complains that answers start late but then stream fast. Which budget do you
#    look at first?
#    <details><summary>answer</summary>TTFT: `max_num_seqs` (requests wait for a seat)
#    and the token budget (a long prompt's chunks).</details>
# 5. Which of the three mistakes changes nothing in decode with one page per sequence?
#    <details><summary>answer</summary>The per-page softmax: with a single page, its
#    softmax is the whole softmax.</details>
