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

Every trace is served by a real :class:`~paged_np.Engine` (``prefix_cache="hash"``
or ``"radix"``, ``schedule="fcfs"`` or ``"lpm"``, one
:class:`~paged_np.EngineConfig`) with the model taken out
(:func:`~.trace_engine.trace_step`): nothing is computed (the arena is one layer
of one head, the bookkeeping is what is measured) and the model's logits
are replaced by the trace's next output token, which the engine's greedy
sampler then picks. So admission, chunked prefill, the token and seat
budgets, preemption (the newest running request, recomputed later), the
lpm ranking, the post-processing (append, sample, finish at
``max_tokens``) and the hit-rate count are the engine's, not a copy. All
requests without a parent are waiting at step 0 (an offline batch, as in
SGLang's benchmarks); a request whose parent is still running joins the
queue when it finishes. Each step decodes one token per running request;
``MAX_BATCHED_TOKENS`` is large enough that a whole prompt is one chunk.

Reported per run: the prompt hit rate (tokens reused at each request's
first admission / prompt tokens: the engine's ``prefix_hit_rate``), the
prefill tokens (prompt tokens computed over every admission, so the
recomputation after a preemption counts), preemptions, engine steps;
and per trace the *optimal* hit rate, computed independently of any cache:
an offline trie over the trace in its own order with unlimited memory
(:func:`~.simulate.max_reusable_fraction`), in which a prompt reuses every
whole page an earlier request wrote. (The engine never computes the KV of
a request's last generated token, which it does not feed back, so a chat
turn whose history ends exactly on a page boundary finds one page fewer
than the trie: the optimum is a bound, not always reachable.)
"""

from __future__ import annotations

import numpy as np

from ..engine.config import EngineConfig
from ..engine.engine import Engine
from ..engine.sampling import SamplingParams
from ..errors import InvalidArgument
from ..registry import PREFIX_INDEXES, SCHEDULES
from . import workloads as wl
from .simulate import max_reusable_fraction
from .trace_engine import stand_in_model, trace_step

WORKLOADS = ("fewshot", "chat", "branching", "system")
PAGE_SIZES = (1, 16)
#: Cache sizes as fractions of the trace's distinct tokens (its trie with unlimited cache).
FRACTIONS = (0.1, 0.25, 0.5)
MAX_RUNNING = 16        # seats: requests running at once (the engine's max_num_seqs)
#: Tokens in one step (max_num_batched_tokens): vLLM's offline default, so a whole
#: prompt of these traces (at most 2,048 tokens) is one chunk, as in SGLang's runs.
MAX_BATCHED_TOKENS = 8192


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
          max_running: int = MAX_RUNNING,
          max_batched_tokens: int = MAX_BATCHED_TOKENS, eviction_policy="lru",
          **options) -> dict:
    """Serve the trace with the engine, its model replaced by the trace; see the module docstring.

    Each step is :func:`~.trace_engine.trace_step`: the engine's scheduler picks the
    tokens (admitting, chunking, preempting) and the engine's post-processing
    records them, "samples" the trace's next output token, and finishes a
    request at its last one (its full pages stay cached); the requests
    waiting for it then join the queue. ``eviction_policy`` is
    :class:`~paged_np.EngineConfig`'s (a name or an ``EvictionPolicy``
    subclass: the capstone of the notebooks measures its own here). ``options``: any
    other EngineConfig field (the tiers below the arena: :mod:`.tiers`).
    """
    config = EngineConfig(num_pages=num_pages, page_size=page_size, max_num_seqs=max_running,
                          max_num_batched_tokens=max_batched_tokens, schedule=schedule,
                          prefix_cache=prefix_cache, eviction_policy=eviction_policy,
                          record_events=False, **options)
    engine = Engine(stand_in_model(), config)
    outputs = [r.output.tolist() for r in trace]
    children: dict = {}
    for i, p in enumerate(parent):
        children.setdefault(p, []).append(i)

    def add(i: int) -> None:                      # trace request i, id i, greedy, no stop
        engine.add_request(trace[i].prompt.tolist(),
                           SamplingParams(max_tokens=len(outputs[i]), temperature=0.0),
                           request_id=i, request_index=i)

    for i in children.get(-1, []):                # an offline batch: all waiting at step 0
        add(i)
    prefill = 0
    while engine.has_unfinished_requests():
        finished, computed = trace_step(engine, outputs)
        prefill += computed
        for out in finished:
            if out.error:
                raise InvalidArgument(f"prefix simulation: {out.error}")
            for c in children.get(out.request_id, []):
                add(c)
    engine.cache.check_invariants()
    m = engine.metrics
    return {"hit_rate": m["prefix_hit_rate"], "prefill_tokens": prefill,
            "preemptions": m["preemptions"], "prompt_tokens": m["prompt_tokens"],
            "steps": m["steps"], **({"tiers": m["tiers"]} if m["tiers"] else {})}


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
                for pc in PREFIX_INDEXES:
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
    return {"seed": seed, "max_running": MAX_RUNNING, "max_batched_tokens": MAX_BATCHED_TOKENS,
            "traces": {f"{k[0]}/ps{k[1]}": v for k, v in info.items()}, "rows": rows}


def report(res: dict) -> str:
    """The results as a Markdown table (one row per workload, page size and cache size).

    Its columns are the (index, schedule) pairs the results hold, in the order run.
    """
    cols = list(dict.fromkeys((r["prefix_cache"], r["schedule"]) for r in res["rows"]))
    head = ("| workload | page | cache (pages, % of distinct) | optimal hit | "
            + " | ".join(f"{pc} {sch} hit / prefill" for pc, sch in cols) + " |")
    lines = [head, "|" + "---|" * (4 + len(cols))]
    groups: dict = {}
    for r in res["rows"]:
        groups.setdefault((r["workload"], r["page_size"], r["cache_fraction"]), {})[
            (r["prefix_cache"], r["schedule"])] = r
    for (name, ps, f), g in groups.items():
        any_row = next(iter(g.values()))
        cells = [f"{g[c]['hit_rate']:.1%} / {g[c]['prefill_tokens']:,}" for c in cols]
        lines.append(f"| {name} | {ps} | {any_row['cache_pages']:,} ({f:.0%}) | "
                     f"{any_row['optimal_hit_rate']:.1%} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
