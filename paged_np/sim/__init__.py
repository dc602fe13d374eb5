"""Memory simulation: the vLLM paper's waste and sharing figures through the real pool.

:mod:`.workloads` makes synthetic traces, :mod:`.contiguous` the baselines that
reserve one contiguous slab per request, :mod:`.trace_engine` the engine with its
model taken out (its scheduler, cache and post-processing run a trace),
:mod:`.simulate` serves a trace both ways and counts the memory,
:mod:`.prefix` compares prefix indexes and schedules, and :mod:`.plot` draws
the result. Run it with ``python -m paged_np simulate``.
"""
