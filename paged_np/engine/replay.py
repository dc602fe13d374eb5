"""Driving an engine from a script: a stream of requests, a JIT warm-up, a summary table.

The demo (``python -m paged_np demo``), the chat command and the notebooks all
replay a scripted workload the same way, so the loop lives here, in the
library, and each of them imports it::

    from paged_np.engine.replay import replay, summary, warm_up

    warm_up(model, page_size=16, backend="auto")          # compile before the clock
    work = [(0, prompt_a, 16), (0, prompt_b, 8), (1, prompt_c, 32)]
    outs = replay(engine, work)                           # RequestOutputs, in order
    print(summary(engine.metrics, len(outs), 0))

A workload is a list of ``(arrival step, prompt token ids, max_tokens)``:
:func:`replay` adds each request at its arrival step (continuous batching:
requests join the running batch between steps, as they would reach a
server) and steps until everything is done. Greedy sampling throughout, so
a run can be checked token for token against ``model.dense_generate``.

Compared with vLLM: its ``LLM.generate`` submits everything at step 0; a
stream with arrival times is what its serving benchmarks replay against the
HTTP server. Here it is one loop over :meth:`Engine.step`.
"""

from __future__ import annotations

import gc
import time

from .engine import Engine
from .sampling import SamplingParams


def replay(engine: Engine, work, on_finish=None) -> list:
    """Feed requests at their arrival steps, step until all are done; outputs in order.

    ``work``: ``[(arrival_step, prompt_ids, max_tokens), ...]`` sorted by
    arrival; request ``i`` gets ``request_id=i``. ``on_finish(output)`` is
    called as each request finishes (a progress bar, say).
    """
    pending = list(enumerate(work))
    results = {}
    step = 0
    while pending or engine.has_unfinished_requests():
        while pending and pending[0][1][0] <= step:
            i, (_, prompt, max_tokens) = pending.pop(0)
            engine.add_request(prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0),
                               request_id=i)
        for out in engine.step():
            results[out.request_id] = out
            if on_finish is not None:
                on_finish(out)
        step += 1
    return [results[i] for i in range(len(work))]


def warm_up(model, page_size: int, backend: str, kv_cache_dtype: str = "auto") -> float:
    """Compile the kernels before the clock starts; returns the seconds it took.

    Numba compiles each kernel on its first call with a new signature (tens
    of seconds cold, ``benchmarks/compile_log.md``; well under a second when
    its on-disk cache is warm). This runs a small workload through the same
    engine code a served run takes, so that nothing compiles inside the
    serving loop and its tokens/s measures serving, not compiling:

    - a 130-token prompt: a prefill long enough for the BLAS attention path;
    - four short prompts that share a page-long prefix, the first admitted
      while the long one decodes, the other three a step later (prefix-cache
      hits: prefills over cached pages, beside a decode);
    - ``max_tokens`` of 1 to 5, so that the decode batch shrinks from four
      sequences to one: the quantized products' ``batch`` kernel (4 or more
      rows) and their ``rows`` kernel (1 to 3), for every weight format of
      the model (the LM head's too: logits for 1 to 4 rows).

    ``kv_cache_dtype``: the pages' format, whose kernels are the ones
    compiled. ``tests/test_first_run.py`` checks, on the demo, that the
    serving loop compiles nothing after this.
    """
    t0 = time.perf_counter()
    V = model.cfg.vocab_size
    shared = [(7 * i + 3) % V for i in range(page_size + 1)]     # one full page, then more
    work = [(0, [i % V for i in range(130)], 5)]
    work += [(min(i + 1, 2), shared + [(11 * i + j) % V for j in range(3 + i)], 1 + i)
             for i in range(4)]
    pages = sum(-(-(len(p) + n) // page_size) for _, p, n in work) + 1
    engine = Engine(model, num_pages=pages, page_size=page_size, max_num_batched_tokens=256,
                    backend=backend, kv_cache_dtype=kv_cache_dtype)
    replay(engine, work)
    # A cold compile leaves ~300k Python objects behind (Numba's IR; a full collection
    # then takes 0.2 s on the 2-core machine): collect them here, not in the timed loop.
    gc.collect()
    return time.perf_counter() - t0


def summary(m: dict, n_requests: int, n_failed: int) -> str:
    """A run's table from ``engine.metrics``: throughput, pages, prefix hits, preemptions."""
    rows = [
        ("requests", f"{n_requests}" + (f" ({n_failed} failed)" if n_failed else "")),
        ("generated tokens", f"{m['generated_tokens']}"),
        ("engine steps", f"{m['steps']}"),
        ("tokens/s", f"{m['tokens_per_s']:.0f}"),
        ("peak pages in use", f"{m['peak_pages_in_use']} / {m['num_pages']}"),
        ("prefix hit rate", f"{m['prefix_hit_rate']:.1%} of prompt tokens (first admission)"),
        ("reused after preemption", f"{m['readmitted_hit_tokens']} of "
                                    f"{m['readmitted_tokens']} re-admitted tokens"),
        ("evictions", f"{m['evictions']}"),
        ("preemptions", f"{m['preemptions']}"
         + (f" ({m['swapped_out']} swapped)" if m["swapped_out"] else "")),
        ("copy-on-write copies", f"{m['cow_copies']}"),
        ("time: schedule / model / sample",
         f"{m['schedule_s']:.2f} s / {m['model_s']:.2f} s / {m['sample_s']:.2f} s"),
    ]
    width = max(len(k) for k, _ in rows)
    line = "-" * (width + 30)
    return "\n".join([line] + [f"{k:<{width}}  {v}" for k, v in rows] + [line])
