"""Hash chain vs radix tree, FCFS vs longest-prefix-match, on SGLang-shaped workloads.

Run it::

    python -m paged_np simulate --prefix-cache                   # about a minute
    python -m paged_np simulate --prefix-cache --json out.json --markdown out.md

Four traces of token ids, shaped like the workloads of the SGLang paper
(Zheng et al., 2024):

- ``fewshot``: a task's fixed block of examples, then one question; tasks
  drawn Zipf(1), so a few preambles are popular (:func:`~.workloads.fewshot_trace`);
- ``chat``: multi-turn conversations; each turn's prompt is the whole
  conversation so far, so it can start only when the previous turn has
  finished (:func:`~.workloads.chat_trace`);
- ``branching``: tree-of-thought; ``b`` samples of one problem prompt, then
  for each thought ``b`` continuations of prompt + thought (a child starts
  when its parent finishes);
- ``system``: a few long system prompts shared by many short questions.

Every request is served through the real :class:`~paged_np.PagedKVCache`
(an arena of negligible size: the bookkeeping is what is measured) with
``prefix_cache="hash"`` or ``"radix"``. Admission is a *simulation* of the
engine's scheduler, not the scheduler itself (there is no model to run): all
requests without a parent are waiting at step 0 (an offline batch, as in
SGLang's benchmarks); each step, every running request decodes
``DECODE_CHUNK`` tokens (when pages run out the most recently admitted one
is preempted and recomputed later, as in the engine), then waiting requests
are admitted while seats and pages allow, in the order
:func:`paged_np.engine.schedule_policy.admission_order` gives, the very
function the engine's scheduler uses for ``Engine(schedule="fcfs"|"lpm")``.
An admission prefills its whole prompt at once, minus the cached prefix.

Reported per run: the prompt hit rate (tokens reused at each request's
first admission / prompt tokens), the prefill tokens computed (every
admission, so the recomputation after a preemption counts), preemptions;
and per trace the *optimal* hit rate, computed independently of any cache:
an offline trie over the trace in its own order with unlimited memory
(:func:`~.simulate.max_reusable_fraction`), in which a prompt reuses every
whole page an earlier request wrote.
"""

from __future__ import annotations

import numpy as np

from ..cache.kv_cache import PagedKVCache
from ..config import CacheConfig
from ..engine.schedule_policy import admission_order
from ..errors import OutOfPages
from . import workloads as wl
from .simulate import max_reusable_fraction

WORKLOADS = ("fewshot", "chat", "branching", "system")
PREFIX_CACHES = ("hash", "radix")
SCHEDULES = ("fcfs", "lpm")
PAGE_SIZES = (1, 16)
#: Cache sizes as fractions of the trace's distinct tokens (its trie with unlimited cache).
FRACTIONS = (0.1, 0.25, 0.5)
MAX_RUNNING = 16        # seats: requests running at once
DECODE_CHUNK = 8        # tokens each running request writes per step (keeps the run short)


# -------------------------------------------------------------------- traces
def make_traces(seed: int = 0) -> dict:
    """``{name: (requests, parent)}`` for the four workloads."""
    rng = lambda k: np.random.default_rng([seed, 100 + k])  # noqa: E731
    fewshot = wl.fewshot_trace(rng(0), num_requests=120, num_tasks=8)
    chat = wl.chat_trace(rng(1), num_conversations=24, mean_turns=4.0, reply_mean=120.0)
    system = wl.system_prompt_trace(rng(3), num_requests=120)
    return {
        "fewshot": (fewshot, [-1] * len(fewshot)),
        "chat": (chat, wl.chat_parents(chat)),
        "branching": wl.branching_trace(rng(2), num_problems=10),
        "system": (system, [-1] * len(system)),
    }


def distinct_tokens(trace, page_size: int) -> int:
    """Tokens in whole pages of the trace's trie: what an unlimited cache would hold."""
    seen: set = set()
    for r in trace:
        seq = np.concatenate([r.prompt, r.output])
        node = ()
        for i in range(len(seq) // page_size):
            node = (hash(node), tuple(seq[i * page_size:(i + 1) * page_size]))
            seen.add(node)
    return len(seen) * page_size


# --------------------------------------------------------------------- serving
def serve(trace, parent, prefix_cache: str, schedule: str, num_pages: int, page_size: int,
          max_running: int = MAX_RUNNING, chunk: int = DECODE_CHUNK) -> dict:
    """Serve the trace through a real PagedKVCache; see the module docstring."""
    cache = PagedKVCache(CacheConfig(num_pages=num_pages, page_size=page_size, num_layers=1,
                                     num_kv_heads=1, head_dim=1, prefix_cache=prefix_cache),
                         record_events=False)
    prompts = [r.prompt.tolist() for r in trace]
    hashes: dict = {}                         # hash chain of each prompt, made once (as vLLM)

    def prefix_len(req):
        if prefix_cache == "hash" and req not in hashes:
            hashes[req] = cache.prompt_page_hashes(prompts[req])
        return cache.num_cached_prefix_tokens(prompts[req], page_hashes=hashes.get(req))

    outputs = [r.output.tolist() for r in trace]
    children: dict = {}
    for i, p in enumerate(parent):
        children.setdefault(p, []).append(i)
    waiting = list(children.get(-1, []))      # arrival order
    arrived_at = {i: 0 for i in waiting}      # admissions counter when it joined the queue
    running: list = []                        # [request, tokens of output written], by admission
    admissions = prefill = preemptions = 0
    first_hit: dict = {}                      # request -> tokens reused at its first admission
    while waiting or running:
        # 1. Decode: every running request writes its next chunk of output.
        i = 0
        while i < len(running):
            req, done = running[i]
            n = min(chunk, len(outputs[req]) - done)
            try:
                cache.allocate_slots(req, n)
            except OutOfPages:
                victim, _ = running.pop()     # the newest, maybe this one
                cache.free(victim)
                preemptions += 1
                waiting.insert(0, victim)
                arrived_at[victim] = admissions
                continue
            cache.append_tokens(req, outputs[req][done:done + n])
            running[i][1] += n
            if running[i][1] == len(outputs[req]):
                cache.free(req)
                running.pop(i)
                for c in children.get(req, []):
                    waiting.append(c)
                    arrived_at[c] = admissions
                continue
            i += 1
        # 2. Admit, in the schedule's order, while seats and pages allow.
        if len(running) < max_running and waiting:
            queue, now = waiting, admissions
            order = admission_order(
                len(queue), schedule,
                prefix_len=lambda j: prefix_len(queue[j]),  # noqa: B023
                skipped=lambda j: now - arrived_at[queue[j]])  # noqa: B023
            admitted = set()
            for j in order:
                if len(running) >= max_running:
                    break
                req = waiting[j]
                hit = cache.add_sequence(req, prompts[req])
                try:
                    cache.allocate_slots(req, len(prompts[req]) - hit)
                except OutOfPages:
                    cache.free(req)
                    if running:
                        break                 # wait for pages to come back
                    raise
                cache.append_tokens(req, prompts[req][hit:])
                first_hit.setdefault(req, hit)
                prefill += len(prompts[req]) - hit
                admissions += 1
                running.append([req, 0])
                admitted.add(j)
            waiting = [r for j, r in enumerate(waiting) if j not in admitted]
    cache.check_invariants()
    prompt_tokens = sum(len(p) for p in prompts)
    return {"hit_rate": sum(first_hit.values()) / prompt_tokens, "prefill_tokens": prefill,
            "preemptions": preemptions, "prompt_tokens": prompt_tokens}


def run(seed: int = 0, progress: bool = True, workloads=WORKLOADS, page_sizes=PAGE_SIZES,
        fractions=FRACTIONS) -> dict:
    """Every (workload, page size, cache size, prefix cache, schedule); the JSON's contents."""
    import sys

    from tqdm import tqdm

    traces = make_traces(seed)
    jobs = []
    info = {}
    for name in workloads:
        trace, parent = traces[name]
        for ps in page_sizes:
            distinct = distinct_tokens(trace, ps)
            biggest = max(r.total_len for r in trace)
            info[(name, ps)] = {
                "requests": len(trace),
                "prompt_tokens": int(sum(r.input_len for r in trace)),
                "distinct_tokens": distinct,
                "optimal_hit_rate": max_reusable_fraction(trace, ps),
            }
            for f in fractions:
                # Never below what the running requests need at once (two of the longest).
                pages = max(int(f * distinct) // ps, 2 * (-(-biggest // ps)))
                for pc in PREFIX_CACHES:
                    for sch in SCHEDULES:
                        jobs.append((name, ps, f, pages, pc, sch))
    rows = []
    for name, ps, f, pages, pc, sch in tqdm(jobs, desc="prefix cache", disable=not progress,
                                            file=sys.stderr):
        trace, parent = traces[name]
        res = serve(trace, parent, pc, sch, pages, ps)
        opt = info[(name, ps)]["optimal_hit_rate"]
        rows.append({"workload": name, "page_size": ps, "cache_fraction": f,
                     "cache_pages": pages, "prefix_cache": pc, "schedule": sch, **res,
                     "optimal_hit_rate": opt,
                     "of_optimal": res["hit_rate"] / opt if opt else 0.0})
    return {"seed": seed, "max_running": MAX_RUNNING, "decode_chunk": DECODE_CHUNK,
            "traces": {f"{k[0]}/ps{k[1]}": v for k, v in info.items()}, "rows": rows}


def report(res: dict) -> str:
    """The results as a Markdown table (one row per workload, page size and cache size)."""
    head = ("| workload | page | cache (pages, % of distinct) | optimal hit | "
            + " | ".join(f"{pc} {sch} hit / prefill" for pc in PREFIX_CACHES for sch in SCHEDULES)
            + " |")
    lines = [head, "|" + "---|" * (4 + len(PREFIX_CACHES) * len(SCHEDULES))]
    groups: dict = {}
    for r in res["rows"]:
        groups.setdefault((r["workload"], r["page_size"], r["cache_fraction"]), {})[
            (r["prefix_cache"], r["schedule"])] = r
    for (name, ps, f), g in groups.items():
        any_row = next(iter(g.values()))
        cells = [f"{g[(pc, s)]['hit_rate']:.1%} / {g[(pc, s)]['prefill_tokens']:,}"
                 for pc in PREFIX_CACHES for s in SCHEDULES]
        lines.append(f"| {name} | {ps} | {any_row['cache_pages']:,} ({f:.0%}) | "
                     f"{any_row['optimal_hit_rate']:.1%} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
