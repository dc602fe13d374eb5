"""``GET /metrics``: the server's numbers in Prometheus text, through ``prometheus_client``.

The names are vLLM's with a ``paged_np:`` prefix (``vllm:num_requests_running``
-> ``paged_np:num_requests_running``), plus a few that show the paged cache and
the batching directly (pages in use, requests per step). Two kinds of number:

- **the server's own**, counted by the engine loop as things happen: tokens in
  and out, steps, finished requests by reason, and five latency histograms.
  These are ``prometheus_client`` ``Counter`` and ``Histogram`` objects.
- **the engine's**, copied from :meth:`Engine.stats` alone after each step
  (:meth:`ServerMetrics.set_engine_stats`) and exported as they are at scrape
  time by a small collector (``prometheus_client``'s pattern for numbers
  another object keeps). So ``prefix_cache_hit_rate`` is the engine's one
  definition, ``metrics["prefix_hit_rate"]``: prompt tokens served at first
  admission over prompt tokens admitted (:mod:`paged_np.engine.stats`); reuse
  after a preemption is ``prefix_cache_readmission_hit_rate``.

Each :class:`ServerMetrics` has its own ``CollectorRegistry`` (never the
process-wide default), so two apps in one process (tests, a notebook) keep
apart. Compared with vLLM: the same library and names; vLLM also labels each
series with the model name, and runs one registry per process.
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

PREFIX = "paged_np:"
TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)

#: The engine's numbers: metric name -> (type, key of :meth:`Engine.stats`, help).
ENGINE_METRICS = {
    "num_requests_running": ("gauge", "num_requests_running", "Requests in the running batch."),
    "num_requests_waiting": ("gauge", "num_requests_waiting", "Requests waiting to be admitted."),
    "kv_pages_in_use": ("gauge", "kv_pages_in_use", "KV cache pages held by running requests."),
    "kv_pages_total": ("gauge", "kv_pages_total", "KV cache pages in the arena."),
    "kv_cache_usage_perc": ("gauge", "kv_cache_usage", "Fraction of KV pages in use (1 = full)."),
    "prefix_cache_hit_rate": ("gauge", "prefix_hit_rate", "Prompt tokens the prefix cache served "
                              "at their request's first admission / prompt tokens admitted."),
    "prefix_cache_readmission_hit_rate": (
        "gauge", "readmission_hit_rate", "Tokens found cached again when a preempted request "
        "came back / tokens it brought back (kept apart from the prompt hit rate)."),
    "prefix_cache_queries_total": ("counter", "prompt_tokens",
                                   "Prompt tokens looked up at first admission."),
    "prefix_cache_hits_total": ("counter", "prefix_hit_tokens",
                                "... of which the prefix cache served."),
    "num_preemptions_total": ("counter", "preemptions", "Requests preempted to free pages."),
    "kv_cache_evictions_total": ("counter", "evictions", "Cached pages evicted for reuse."),
    "spec_decode_draft_acceptance_rate": (
        "gauge", "spec_acceptance_rate",
        "Speculative decoding: accepted draft tokens / draft tokens verified."),
    "spec_decode_num_drafts_total": ("counter", "spec_num_drafts",
                                     "Request steps that verified drafts."),
    "spec_decode_num_draft_tokens_total": ("counter", "spec_num_draft_tokens",
                                           "Draft tokens verified."),
    "spec_decode_num_accepted_tokens_total": ("counter", "spec_num_accepted_tokens",
                                              "Draft tokens accepted."),
}
#: The tiers below the arena, one series per tier (label ``tier``: host, disk), from
#: ``Engine.stats()["tiers"]``: metric name -> (type, key of a tier's stats, help).
TIER_METRICS = {
    "kv_tier_pages": ("gauge", "pages", "Pages held in a tier below the arena."),
    "kv_tier_bytes": ("gauge", "bytes", "Bytes held in a tier below the arena."),
    "kv_tier_capacity_bytes": ("gauge", "capacity_bytes", "A tier's budget in bytes."),
    "kv_tier_hits_total": ("counter", "hits", "Pages a prefix lookup found in a tier."),
    "kv_tier_loaded_tokens_total": ("counter", "loaded_tokens",
                                    "Prompt tokens copied back from a tier, not recomputed."),
    "kv_tier_stores_total": ("counter", "stores", "Pages stored into a tier."),
    "kv_tier_evictions_total": ("counter", "evictions", "Pages a tier dropped to make room."),
    "kv_tier_faults_total": ("counter", "faults", "Pages a tier could not store or give "
                             "back intact (counted as misses, recomputed)."),
}
#: The server's one number kept outside the engine and counted by it: the cache view's time.
CACHE_VIEW_SECONDS = ("cache_view_seconds_total", "Engine-loop seconds spent building the "
                      "cache's view for /v1/cache/stream (0 unwatched).")


class ServerMetrics:
    """What ``GET /metrics`` reports (:meth:`render`); updated by the engine loop only.

    The loop counts with :attr:`prompt_tokens`, :attr:`generation_tokens`,
    :attr:`cached_tokens`, :attr:`engine_steps` (``.inc(n)``), :meth:`finish`,
    and the histograms (``.observe(seconds)``); after each step it hands over
    the engine's snapshot with :meth:`set_engine_stats`.
    """

    def __init__(self):
        self.registry = CollectorRegistry()          # this app's own: never the global one
        self.lock = threading.Lock()                 # guards the engine snapshot below
        self.engine_stats: dict = {}
        self.cache_view_s = 0.0
        reg, p = self.registry, PREFIX
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens of admitted requests.",
                                     registry=reg)
        self.generation_tokens = Counter(p + "generation_tokens", "Tokens generated.",
                                         registry=reg)
        self.cached_tokens = Counter(p + "prefix_cache_cached_tokens", "Prompt tokens served "
                                     "from the cache, summed over finished requests.",
                                     registry=reg)
        self.engine_steps = Counter(p + "engine_steps", "Engine steps run.", registry=reg)
        self.request_success = Counter(p + "request_success", "Finished requests by reason.",
                                       ["finished_reason"], registry=reg)
        self.ttft = Histogram(p + "time_to_first_token_seconds", "Arrival to first token.",
                              buckets=TTFT_BUCKETS, registry=reg)
        self.itl = Histogram(p + "inter_token_latency_seconds", "Time between two tokens.",
                             buckets=ITL_BUCKETS, registry=reg)
        self.e2e = Histogram(p + "e2e_request_latency_seconds", "Arrival to last token.",
                             buckets=TTFT_BUCKETS, registry=reg)
        self.step_requests = Histogram(p + "step_num_requests", "Requests that got new tokens "
                                       "in one engine step.", buckets=BATCH_BUCKETS, registry=reg)
        self.step_time = Histogram(p + "engine_step_seconds", "Time inside one llm.step().",
                                   buckets=ITL_BUCKETS, registry=reg)
        reg.register(_EngineCollector(self))

    def finish(self, reason: str) -> None:
        """One request finished (``stop``, ``length``, ``abort``, ``error``)."""
        self.request_success.labels(finished_reason=reason).inc()

    def set_engine_stats(self, stats: dict, cache_view_s: float) -> None:
        """The engine's snapshot (:meth:`Engine.stats`) and the view's seconds, as of now."""
        with self.lock:
            self.engine_stats, self.cache_view_s = dict(stats), float(cache_view_s)

    def render(self) -> str:
        """The Prometheus text exposition of every metric (``GET /metrics``)."""
        return generate_latest(_WithoutCreated(self.registry)).decode("utf-8")


class _EngineCollector:
    """Exports the engine's latest snapshot at scrape time (the numbers are the engine's)."""

    def __init__(self, metrics: ServerMetrics):
        self.metrics = metrics

    def describe(self):
        return []                                    # nothing to check at registration

    def collect(self):
        m = self.metrics
        with m.lock:
            stats, view_s = m.engine_stats, m.cache_view_s
        for name, (kind, key, help_) in ENGINE_METRICS.items():
            family = GaugeMetricFamily if kind == "gauge" else CounterMetricFamily
            yield family(PREFIX + name, help_, value=stats.get(key, 0))
        tiers = stats.get("tiers") or {}
        for name, (kind, key, help_) in TIER_METRICS.items() if tiers else ():
            family = (GaugeMetricFamily if kind == "gauge" else CounterMetricFamily)(
                PREFIX + name, help_, labels=["tier"])
            for tier, counts in tiers.items():
                family.add_metric([tier], counts.get(key, 0))
            yield family
        name, help_ = CACHE_VIEW_SECONDS
        yield CounterMetricFamily(PREFIX + name, help_, value=view_s)


class _WithoutCreated:
    """The registry's metrics minus ``prometheus_client``'s ``*_created`` timestamps (vLLM
    turns them off too, for the whole process; here only this app's output drops them)."""

    def __init__(self, registry: CollectorRegistry):
        self.registry = registry

    def collect(self):
        for family in self.registry.collect():
            family.samples = [s for s in family.samples if not s.name.endswith("_created")]
            yield family
