"""``GET /metrics``: Prometheus text written by hand (counters, gauges, histograms),
under vLLM's metric names with a ``paged_np:`` prefix.

The engine's numbers come from :meth:`Engine.stats` alone (the loop copies
them after each step), so ``prefix_cache_hit_rate`` is the engine's one
definition, ``metrics["prefix_hit_rate"]``: prompt tokens served at first
admission over prompt tokens admitted (:mod:`paged_np.engine.stats`); reuse
after a preemption is ``prefix_cache_readmission_hit_rate``.
"""

from __future__ import annotations

import threading

TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class Histogram:
    """Cumulative buckets, a sum and a count: what Prometheus calls a histogram."""

    def __init__(self, buckets):
        self.buckets = tuple(buckets)
        self.counts = [0] * len(self.buckets)     # observations <= bucket (cumulative later)
        self.sum = 0.0
        self.count = 0

    def observe(self, x: float) -> None:
        for i, b in enumerate(self.buckets):
            if x <= b:
                self.counts[i] += 1
                break
        self.sum += x
        self.count += 1

    def lines(self, name: str) -> list[str]:
        out, cum = [], 0
        for b, c in zip(self.buckets, self.counts):
            cum += c
            out.append(f'{name}_bucket{{le="{b}"}} {cum}')
        out += [f'{name}_bucket{{le="+Inf"}} {self.count}', f"{name}_sum {self.sum}",
                f"{name}_count {self.count}"]
        return out


class ServerMetrics:
    """What ``GET /metrics`` reports; updated by the engine loop only.

    Names are vLLM's (``vllm:num_requests_running`` ->
    ``paged_np:num_requests_running``), plus a few that show the paged cache
    and the batching directly (pages in use, requests per step).
    """

    def __init__(self):
        self.lock = threading.Lock()
        self.gauges = dict(num_requests_running=0, num_requests_waiting=0, kv_pages_in_use=0,
                           kv_pages_total=0, kv_cache_usage_perc=0.0, prefix_cache_hit_rate=0.0,
                           prefix_cache_readmission_hit_rate=0.0,
                           spec_decode_draft_acceptance_rate=0.0)
        self.counters = dict(prompt_tokens_total=0, generation_tokens_total=0,
                             num_preemptions_total=0, kv_cache_evictions_total=0,
                             prefix_cache_queries_total=0, prefix_cache_hits_total=0,
                             prefix_cache_cached_tokens_total=0, engine_steps_total=0,
                             spec_decode_num_drafts_total=0,
                             spec_decode_num_draft_tokens_total=0,
                             spec_decode_num_accepted_tokens_total=0,
                             cache_view_seconds_total=0.0)
        self.finished: dict[str, int] = {}        # finish reason -> requests
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(TTFT_BUCKETS)
        self.step_requests = Histogram(BATCH_BUCKETS)
        self.step_time = Histogram(ITL_BUCKETS)

    HELP = {
        "num_requests_running": ("gauge", "Requests in the running batch."),
        "num_requests_waiting": ("gauge", "Requests waiting to be admitted."),
        "kv_pages_in_use": ("gauge", "KV cache pages held by running requests."),
        "kv_pages_total": ("gauge", "KV cache pages in the arena."),
        "kv_cache_usage_perc": ("gauge", "Fraction of KV pages in use (1 = full)."),
        "prefix_cache_hit_rate": ("gauge", "Prompt tokens the prefix cache served at their "
                                  "request's first admission / prompt tokens admitted."),
        "prefix_cache_readmission_hit_rate": (
            "gauge", "Tokens found cached again when a preempted request came back / "
                     "tokens it brought back (kept apart from the prompt hit rate)."),
        "prefix_cache_queries_total": ("counter", "Prompt tokens looked up at first admission."),
        "prefix_cache_hits_total": ("counter", "... of which the prefix cache served."),
        "prompt_tokens_total": ("counter", "Prompt tokens of admitted requests."),
        "generation_tokens_total": ("counter", "Tokens generated."),
        "num_preemptions_total": ("counter", "Requests preempted to free pages."),
        "kv_cache_evictions_total": ("counter", "Cached pages evicted for reuse."),
        "prefix_cache_cached_tokens_total": ("counter", "Prompt tokens served from the cache, "
                                             "summed over finished requests."),
        "engine_steps_total": ("counter", "Engine steps run."),
        "spec_decode_draft_acceptance_rate": (
            "gauge", "Speculative decoding: accepted draft tokens / draft tokens verified."),
        "spec_decode_num_drafts_total": ("counter", "Request steps that verified drafts."),
        "spec_decode_num_draft_tokens_total": ("counter", "Draft tokens verified."),
        "spec_decode_num_accepted_tokens_total": ("counter", "Draft tokens accepted."),
        "cache_view_seconds_total": ("counter", "Engine-loop seconds spent building the "
                                     "cache's view for /v1/cache/stream (0 unwatched)."),
    }

    def render(self) -> str:
        p = "paged_np:"
        with self.lock:
            lines = []
            for name, value in {**self.gauges, **self.counters}.items():
                kind, help_ = self.HELP[name]
                lines += [f"# HELP {p}{name} {help_}", f"# TYPE {p}{name} {kind}",
                          f"{p}{name} {value}"]
            lines += [f"# HELP {p}request_success_total Finished requests by reason.",
                      f"# TYPE {p}request_success_total counter"]
            lines += [f'{p}request_success_total{{finished_reason="{r}"}} {n}'
                      for r, n in sorted(self.finished.items())]
            for name, h, help_ in (
                    ("time_to_first_token_seconds", self.ttft, "Arrival to first token."),
                    ("inter_token_latency_seconds", self.itl, "Time between two tokens."),
                    ("e2e_request_latency_seconds", self.e2e, "Arrival to last token."),
                    ("step_num_requests", self.step_requests,
                     "Requests that got new tokens in one engine step."),
                    ("engine_step_seconds", self.step_time, "Time inside one llm.step().")):
                lines += [f"# HELP {p}{name} {help_}", f"# TYPE {p}{name} histogram"]
                lines += h.lines(p + name)
        return "\n".join(lines) + "\n"
