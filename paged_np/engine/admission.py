"""In which order waiting requests are admitted: first come first served, or cache-aware.

``fcfs`` admits in arrival order (vLLM's default). ``lpm`` (SGLang's
*longest prefix match*) admits first the requests whose prompt has the
longest cached prefix: they cost the least prefill, and admitting requests
that share a prefix together keeps that prefix cached while they run,
instead of letting unrelated prompts evict it in between.

Ranking alone can starve a request whose prefix is never cached (a lone
prompt behind a steady stream of requests sharing a popular one). So each
waiting request counts the admissions made since it entered the queue;
once that count passes ``max_skips`` it is *starving* and goes ahead of
every ranked request (starving requests among themselves keep arrival
order). A request therefore waits at most ``max_skips`` admissions plus
those of the starving requests ahead of it: the delay is bounded.

Each order is a function with one signature, registered by name in
:data:`paged_np.registry.SCHEDULES` (``EngineConfig.schedule``); the engine's
scheduler (:mod:`.scheduler`) calls the one chosen, and the prefix-cache
simulation (:mod:`paged_np.sim.prefix`) drives that same scheduler.
"""

from __future__ import annotations

#: Admissions a waiting request may be passed over by under ``lpm`` before it goes first.
MAX_SKIPS = 32
#: ``lpm`` ranks only this many requests at the head of the queue (SGLang falls
#: back to FCFS for long queues too): matching every prompt each step costs time.
LPM_WINDOW = 128


def fcfs(num_waiting: int, prefix_len=None, skipped=None, max_skips: int = MAX_SKIPS,
         window: int = LPM_WINDOW) -> list[int]:
    """Arrival order: positions ``0..num_waiting-1`` of the waiting queue as they stand."""
    return list(range(num_waiting))


def lpm(num_waiting: int, prefix_len, skipped, max_skips: int = MAX_SKIPS,
        window: int = LPM_WINDOW) -> list[int]:
    """Positions ``0..num_waiting-1`` of the waiting queue (arrival order), longest
    cached prefix first, starving requests before all.

    ``prefix_len(i)`` gives the cached prefix tokens of request ``i``,
    ``skipped(i)`` the admissions made since it arrived; both are called only
    for the first ``window`` requests (the rest follow in arrival order).
    """
    if num_waiting <= 1:
        return list(range(num_waiting))
    head = range(min(num_waiting, window))
    starving = [i for i in head if skipped(i) > max_skips]
    rest = [i for i in head if skipped(i) <= max_skips]
    rest.sort(key=lambda i: -prefix_len(i))   # stable: ties keep arrival order
    return starving + rest + list(range(len(head), num_waiting))
