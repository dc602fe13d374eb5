"""Where does KV memory go? Reproduce the vLLM paper's memory figures by accounting.

Run it::

    python -m paged_np simulate --quick                 # well under a minute
    python -m paged_np simulate --json out.json --plot out.png --seed 0

No attention is computed: a request is its lengths and token ids, and each
scheduler step writes one token per running request. What is measured is where
the KV memory goes, under three experiments from Kwon et al. (SOSP 2023):

1. **Memory breakdown** (the paper's Fig. 2). A trace is served FCFS with
   continuous batching under a fixed budget of ``KV_SLOTS`` token slots
   (OPT-13B on an A100-40GB: about 12 GiB of KV at 800 KiB per token).
   ``kv_cache_dtype`` changes the bytes of a token and so the slots the same
   12 GiB hold (:func:`kv_slots`): float16 is the paper's, int8 and fp8
   hold 1.94x its tokens (a float32 scale per token and head included).

   - *Contiguous* (Orca): at admission a request gets one contiguous range of
     slots from a first-fit allocator: the model's maximum length (2048,
     ``orca_max``), the next power of two of its true length (``orca_pow2``),
     or exactly its true length (``orca_oracle``). It keeps them to the end.
   - *Paged*: the engine's own :class:`~paged_np.engine.scheduler.Scheduler`
     over the real :class:`~paged_np.PagedKVCache` (a tiny arena, see
     :mod:`.trace_engine`) with no model: pages are allocated on demand; when a
     decode step finds no page, the last-admitted request is preempted
     (freed, and recomputed later), as vLLM does. Admission keeps 1% of
     pages free (vLLM v0's watermark, :class:`~.trace_engine.WatermarkCache`).

   At every step at which some request is still waiting (the server is
   full: memory, not demand, is the limit), after the step's writes, the
   slots split into four categories, as fractions of all KV slots, averaged
   over those steps (they sum to 1):

   - ``token_states``: slots holding a written token's KV;
   - ``reservation``: allocated slots that this request *will* fill later
     (true final length minus current length, within what it holds);
   - ``internal_frag``: allocated slots it will *never* fill (a contiguous
     reservation beyond the final length; the tail of a paged request's last
     page beyond its final length);
   - ``external_frag``: free slots while a request waits: holes too small
     for the next request, memory idle because of the batch cap or the
     paged watermark (the paper's "external fragmentation & others").

   ``batch_size`` is the mean number of running requests over those steps.
   The paper's time-averaged numbers come from real traces and a real server;
   ours from the synthetic traces of :mod:`paged_np.sim.workloads`.

2. **Sharing savings** (the paper's Fig. 15). Each request runs alone in a
   cache large enough for it; at every step we count the pages in use with
   sharing (``fork`` + copy-on-write through the real cache) and the pages
   the same sequences would take with no sharing (each sample or beam its
   own copy: ``n * ceil(len / page_size)``). The saving is ``1 - shared /
   unshared`` over all steps of all requests: the cut in time-averaged KV.

3. **Prefix caching and eviction** (not in the paper). Multi-turn chat and
   few-shot traces are served one request at a time through the real cache,
   whose pages stay CACHED after a request ends; the hit rate (prompt tokens
   reused / prompt tokens) is swept over cache sizes for every eviction
   policy of :data:`~paged_np.registry.EVICTION_POLICIES` (the package's
   three, and any a user registers). The largest size holds every page, so its
   hit rate is the trace's maximum reusable fraction
   (:func:`max_reusable_fraction`, computed independently with a trie).

Simplifications: one token per request per step (a prompt is written in its
first step together with the first output token); no prefill/decode
timing; the first-fit allocator stands in for Orca's; no swapping.
"""

from __future__ import annotations

import sys
from collections import deque

import numpy as np

from ..cache.kv_cache import PagedKVCache
from ..config import CacheConfig
from ..engine.config import EngineConfig
from ..engine.scheduler import Scheduler
from ..errors import InvalidArgument
from ..registry import EVICTION_POLICIES
from . import workloads as wl
from .contiguous import MAX_LEN, SCHEMES, FirstFit, reserve_size
from .trace_engine import TINY_MODEL, WatermarkCache, trace_request

KV_SLOTS = 15728  # 12 GiB of KV / 800 KiB per token (OPT-13B: 2 * 40 layers * 5120 * 2 bytes)
#: OPT-13B's KV shape: layers, heads, head size (2 * 40 * 40 * 128 values per token).
OPT13B = dict(num_layers=40, num_kv_heads=40, head_dim=128)
KV_BYTES = 15728 * 800 * 1024  # the budget KV_SLOTS comes from


def page_bytes(kv_cache_dtype: str = "float16", page_size: int = 16) -> int:
    """Bytes of one OPT-13B page in ``kv_cache_dtype`` (:attr:`CacheConfig.bytes_per_page`:
    the 8-bit formats' scales included)."""
    return CacheConfig(num_pages=1, page_size=page_size, dtype=kv_cache_dtype,
                       **OPT13B).bytes_per_page


def kv_slots(kv_cache_dtype: str = "float16", page_size: int = 16) -> int:
    """Token slots OPT-13B's 12 GiB of KV hold in ``kv_cache_dtype`` (float16: KV_SLOTS)."""
    return KV_BYTES // page_bytes(kv_cache_dtype, page_size) * page_size
MAX_BATCH = 256  # vLLM's default max_num_seqs
WATERMARK = 0.01  # vLLM keeps 1% of pages free when admitting
CATEGORIES = ("token_states", "reservation", "internal_frag", "external_frag")
WIDTHS = (2, 4, 6)  # the paper's parallel sizes and beam widths (Fig. 15)

#: The paper's numbers, quoted in the JSON and the plots (fractions).
PAPER = {
    "token_states": {"orca_max": 0.204, "orca_oracle": 0.382, "paged": 0.963},
    "parallel_sampling": {"alpaca": (0.061, 0.098), "sharegpt": (0.162, 0.305)},
    "beam_search": {"alpaca": (0.376, 0.552), "sharegpt": (0.443, 0.663)},
}


def accounting_cache(num_pages: int, page_size: int, policy: str = "lru") -> PagedKVCache:
    """A real PagedKVCache whose arena is negligible (1 layer, 1 head, head_dim 1)."""
    cfg = CacheConfig(num_pages=num_pages, page_size=page_size, num_layers=1,
                      num_kv_heads=1, head_dim=1, eviction_policy=policy)
    return PagedKVCache(cfg, record_events=False)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# ------------------------------------------------------------------ 1. memory breakdown
def _summary(acc: np.ndarray, steps: int, total: int, **extra) -> dict:
    """acc = sums over measured steps of [token, reservation, internal, free slots, batch]."""
    steps = max(steps, 1)
    out = {c: float(acc[i] / (steps * total)) for i, c in enumerate(CATEGORIES)}
    out.update(batch_size=float(acc[4] / steps), measured_steps=int(steps), **extra)
    return out


def serve_contiguous(requests, scheme: str, num_slots: int = KV_SLOTS, max_len: int = MAX_LEN,
                     max_batch: int = MAX_BATCH) -> dict:
    """Serve ``requests`` (all arrived at time 0) with Orca-style reservations."""
    alloc = FirstFit(num_slots)
    waiting = deque(requests)
    running = []  # [offset, reserved, ctx, final] per running request
    acc, steps = np.zeros(5), 0
    while waiting or running:
        while waiting and len(running) < max_batch:  # FCFS: the head waits, nobody overtakes
            r = waiting[0]
            size = reserve_size(r.total_len, scheme, max_len)
            if size > num_slots:
                raise InvalidArgument(f"request {r.req_id} needs {size} slots > num_slots")
            off = alloc.allocate(size)
            if off is None:
                break
            waiting.popleft()
            running.append([off, size, r.input_len, r.total_len])
        for s in running:  # every request writes one token (the first step: its prompt too)
            s[2] += 1
        if waiting:
            tok = sum(s[2] for s in running)
            res = sum(s[3] - s[2] for s in running)
            internal = sum(s[1] - s[3] for s in running)
            acc += (tok, res, internal, num_slots - alloc.used, len(running))
            steps += 1
        for s in running:
            if s[2] == s[3]:
                alloc.free(s[0], s[1])
        running = [s for s in running if s[2] < s[3]]
    return _summary(acc, steps, num_slots)


def serve_paged(requests, page_size: int, num_slots: int = KV_SLOTS,
                max_batch: int = MAX_BATCH, watermark: float = WATERMARK) -> dict:
    """Serve ``requests`` (all arrived at time 0) with the engine's Scheduler and cache.

    Each step is the engine's :class:`~paged_np.engine.scheduler.Scheduler`
    deciding: every running request grows by one token (when no page is
    there, the newest running request is preempted and will recompute), then
    waiting requests are admitted first come first served, under the seat cap
    ``max_batch`` and the watermark (:class:`~.trace_engine.WatermarkCache`), but
    not in a step that preempted. The token budget is the arena, so it never
    binds: a whole prompt is one step. The scheduled tokens are then written
    (``append_tokens``), the slots counted, and each request either finishes
    or learns its next token from the trace.

    A request knows one token more than its prompt when it arrives: its first
    output token, written in its first step together with the prompt (see the
    module docstring); from then on it learns a token per step.
    """
    num_pages = num_slots // page_size
    config = EngineConfig(num_pages=num_pages, page_size=page_size, max_num_seqs=max_batch,
                          max_num_batched_tokens=num_pages * page_size)
    cache = WatermarkCache(config.cache_config(TINY_MODEL), int(np.ceil(watermark * num_pages)))
    sched = Scheduler(cache, config)
    by_id = {r.req_id: r for r in requests}
    for r in requests:
        req = trace_request(r.req_id, r.prompt.tolist(), r.output_len)
        req.sample.token_ids.append(int(r.output[0]))          # written with the prompt
        sched.add(req)
    acc, steps = np.zeros(5), 0
    while sched.waiting or sched.running:
        out = sched.schedule()
        if out.failed:
            req, reason = out.failed[0]
            raise InvalidArgument(f"request {req.seq_id} does not fit in {num_pages} pages: "
                                  f"{reason}")
        for req, n, _ in out.scheduled:                         # the step's tokens, written
            c = req.num_computed_tokens
            cache.append_tokens(req.seq_id, req.tokens(c, c + n))
        if sched.waiting:
            ctx = [req.num_computed_tokens for req in sched.running]
            final = [by_id[req.seq_id].total_len for req in sched.running]
            tok = sum(ctx)
            # Slack of the last page that the request will still fill: reservation.
            res = sum(min(f, _ceil_div(c, page_size) * page_size) - c
                      for c, f in zip(ctx, final))
            free = cache.num_available_pages * page_size        # FREE or evictable CACHED
            held = num_pages * page_size - free
            acc += (tok, res, held - tok - res, free, len(sched.running))
            steps += 1
        for req, _, _ in out.scheduled:
            r, known = by_id[req.seq_id], req.sample.token_ids
            if req.num_computed_tokens == r.total_len:
                sched.remove(req)                               # its full pages stay cached
            else:
                known.append(int(r.output[len(known)]))         # the trace's next token
    return _summary(acc, steps, num_pages * page_size, preemptions=sched.num_preemptions)


# ------------------------------------------------------------------ 2. sharing savings
def parallel_sampling_pages(requests, n: int, page_size: int) -> tuple[int, int]:
    """Page-steps (shared, unshared) of parallel sampling with ``n`` samples per request.

    The prompt is written once, then forked ``n - 1`` times; every sample
    writes ``output_len`` tokens of its own (copy-on-write splits the shared
    last prompt page).
    """
    cache = accounting_cache(n * _ceil_div(2 * MAX_LEN, page_size) + 1, page_size)
    shared = unshared = 0
    for r in requests:
        P = r.input_len
        cache.add_sequence(0, r.prompt)
        cache.allocate_slots(0, P)
        cache.append_tokens(0, r.prompt)
        for j in range(1, n):
            cache.fork(0, j)
        for t in range(r.output_len):
            for j in range(n):  # sample j's token differs from the others'
                cache.allocate_slots(j, 1)
                cache.append_tokens(j, [(int(r.output[t]) + j) % wl.VOCAB_SIZE])
            shared += cache.pool.num_in_use
            unshared += n * _ceil_div(P + t + 1, page_size)
        for j in range(n):
            cache.free(j)
    return shared, unshared


def beam_search_pages(requests, width: int, page_size: int, rng: np.random.Generator,
                      ambiguity: float = 0.04) -> tuple[int, int]:
    """Page-steps (shared, unshared) of beam search of ``width`` k per request.

    Each step follows :func:`~paged_np.sim.workloads.beam_search_tree`: a beam
    chosen once continues as itself, one chosen again is forked, one not chosen
    is freed; then every beam writes its token (copy-on-write where shared).
    """
    cache = accounting_cache(width * _ceil_div(2 * MAX_LEN, page_size) + 1, page_size)
    shared = unshared = 0
    next_id = 0
    for r in requests:
        P = r.input_len
        parents, tokens = wl.beam_search_tree(width, r.output_len, rng, ambiguity)
        beams = [next_id]
        next_id += 1
        cache.add_sequence(beams[0], r.prompt)
        cache.allocate_slots(beams[0], P)
        cache.append_tokens(beams[0], r.prompt)
        for t in range(r.output_len):
            new, taken = [], set()
            for p in parents[t]:  # forks first: fork refuses a parent with pending slots
                sid = beams[p]
                if sid in taken:
                    cache.fork(sid, next_id)
                    sid, next_id = next_id, next_id + 1
                taken.add(sid)
                new.append(sid)
            for sid in beams:
                if sid not in taken:  # pruned: no new beam extends it
                    cache.free(sid)
            for sid, tok in zip(new, tokens[t]):
                cache.allocate_slots(sid, 1)
                cache.append_tokens(sid, [int(tok)])
            beams = new
            shared += cache.pool.num_in_use
            unshared += width * _ceil_div(P + t + 1, page_size)
        for sid in beams:
            cache.free(sid)
    return shared, unshared


def savings(shared_unshared: tuple[int, int]) -> float:
    shared, unshared = shared_unshared
    return 1.0 - shared / unshared if unshared else 0.0


# ------------------------------------------------------------------ 3. prefix caching
def hit_rate(trace, policy: str, num_pages: int, page_size: int) -> float:
    """Serve ``trace`` one request at a time through a cache of ``num_pages``; prompt hit rate."""
    cache = accounting_cache(num_pages, page_size, policy)
    for r in trace:
        hit = cache.add_sequence(0, r.prompt)
        cache.allocate_slots(0, r.total_len - hit)
        cache.append_tokens(0, np.concatenate([r.prompt[hit:], r.output]))
        cache.free(0)  # full pages stay CACHED, for later prompts to reuse
    return cache.stats()["hit_rate"]


def max_reusable_fraction(trace, page_size: int) -> float:
    """Prompt tokens an infinite prefix cache could reuse / prompt tokens (a trie; no cache).

    A prompt reuses its longest run of leading whole pages that an earlier
    request wrote (prompt or output), at most ``len(prompt) - 1`` tokens.
    """
    trie: dict = {}  # (parent node, page tokens) -> node
    hits = total = 0
    for r in trace:
        node, n = 0, 0
        for i in range((r.input_len - 1) // page_size):
            node = trie.get((node, tuple(r.prompt[i * page_size:(i + 1) * page_size])))
            if node is None:
                break
            n += 1
        hits += n * page_size
        total += r.input_len
        seq = np.concatenate([r.prompt, r.output])
        node = 0
        for i in range(len(seq) // page_size):
            node = trie.setdefault((node, tuple(seq[i * page_size:(i + 1) * page_size])),
                                   len(trie) + 1)
    return hits / total if total else 0.0


def cache_sizes(trace, page_size: int, points: int) -> list[int]:
    """Geometric sizes from the largest request to every page of the trace at once."""
    lo = max(_ceil_div(r.total_len, page_size) for r in trace)
    hi = lo + sum(r.total_len // page_size for r in trace)  # enough for everything
    return sorted({int(round(x)) for x in np.geomspace(lo, hi, points)})


# ------------------------------------------------------------------ the whole run
#: Sizes of the full run and of ``--quick``.
SIZES = {
    False: dict(requests=1000, page_sizes=(8, 16, 32), sharing_requests=100,
                conversations=60, fewshot=200, points=8),
    True: dict(requests=200, page_sizes=(16,), sharing_requests=12,
               conversations=15, fewshot=60, points=4),
}


def run(seed: int = 0, quick: bool = False, progress: bool = True,
        kv_cache_dtype: str = "float16") -> dict:
    """Run the three experiments; return the results dict that ``--json`` writes.

    Every experiment draws from its own generator, seeded by ``(seed, k)``, so
    results do not depend on which experiments run or in which order.
    ``kv_cache_dtype`` sets the memory breakdown's token slots (:func:`kv_slots`).
    """
    from tqdm import tqdm

    size = SIZES[quick]
    rng = lambda k: np.random.default_rng([seed, k])  # noqa: E731
    traces = {d: wl.sample_requests(m, size["requests"], rng(i))
              for i, (d, m) in enumerate(wl.DATASETS.items())}
    sharing = {d: t[:size["sharing_requests"]] for d, t in traces.items()}
    prefix = {"chat": wl.chat_trace(rng(10), num_conversations=size["conversations"]),
              "fewshot": wl.fewshot_trace(rng(11), num_requests=size["fewshot"])}
    ps = 16  # vLLM's default page (block) size: the headline everywhere
    slots = kv_slots(kv_cache_dtype, ps)

    jobs = []  # (key path, function): one progress-bar tick each
    for d, t in traces.items():
        for s in SCHEMES:
            jobs.append((("breakdown", d, s),
                         lambda t=t, s=s: serve_contiguous(t, s, num_slots=slots)))
        for p in size["page_sizes"]:
            jobs.append((("breakdown", d, f"paged_{p}"),
                         lambda t=t, p=p: serve_paged(t, p, num_slots=slots)))
    for i, (d, t) in enumerate(sharing.items()):
        for n in WIDTHS:
            jobs.append((("parallel_sampling", d, str(n)),
                         lambda t=t, n=n: savings(parallel_sampling_pages(t, n, ps))))
            jobs.append((("beam_search", d, str(n)), lambda t=t, n=n, d=d, i=i: savings(
                beam_search_pages(t, n, ps, rng(20 + 10 * i + n), wl.BEAM_AMBIGUITY[d]))))
    for name, t in prefix.items():
        for pol in EVICTION_POLICIES:
            for c in cache_sizes(t, ps, size["points"]):
                jobs.append((("policies", name, pol, c),
                             lambda t=t, pol=pol, c=c: hit_rate(t, pol, c, ps)))

    raw: dict = {}
    for key, fn in tqdm(jobs, desc="simulate", disable=not progress, file=sys.stderr):
        raw[key] = fn()

    by_ds = {d: {k[2]: v for k, v in raw.items() if k[:2] == ("breakdown", d)} for d in traces}
    headline = dict(by_ds["sharegpt"])
    headline["paged"] = headline[f"paged_{ps}"]
    widths = {kind: {d: {k[2]: v for k, v in raw.items() if k[:2] == (kind, d)} for d in sharing}
              for kind in ("parallel_sampling", "beam_search")}
    curves = {name: {pol: [{"cache_pages": k[3], "hit_rate": v} for k, v in raw.items()
                           if k[:3] == ("policies", name, pol)] for pol in EVICTION_POLICIES}
              for name in prefix}
    return {
        "seed": seed,
        "quick": quick,
        "config": {"kv_slots": slots, "kv_cache_dtype": kv_cache_dtype, "max_len": MAX_LEN,
                   "max_batch": MAX_BATCH,
                   "watermark": WATERMARK, "page_size": ps, "page_sizes": list(size["page_sizes"]),
                   "widths": list(WIDTHS), "beam_ambiguity": wl.BEAM_AMBIGUITY, **size},
        "datasets": {d: {"requests": len(t),
                         "published_mean_input": wl.DATASETS[d].input_mean,
                         "published_mean_output": wl.DATASETS[d].output_mean,
                         "mean_input": float(np.mean([r.input_len for r in t])),
                         "mean_output": float(np.mean([r.output_len for r in t]))}
                     for d, t in traces.items()},
        "memory_breakdown": {s: headline[s] for s in (*SCHEMES, "paged")},
        "memory_breakdown_by_dataset": by_ds,
        "sharing_savings": {
            # Headline: ShareGPT, averaged over the widths 2, 4, 6.
            **{kind: float(np.mean(list(widths[kind]["sharegpt"].values())))
               for kind in ("parallel_sampling", "beam_search")},
            "by_dataset": widths,
        },
        "policies": curves["chat"],
        "policies_fewshot": curves["fewshot"],
        "max_reusable": {name: max_reusable_fraction(t, ps) for name, t in prefix.items()},
        "paper": PAPER,
    }
