"""What the engine counts: ``engine.metrics`` (a run's report) and ``engine.stats()``
(the snapshot a server exports after each step, under vLLM's names).

One definition of the **prefix hit rate** everywhere: prompt tokens the
prefix cache served at their request's *first* admission, over the prompt
tokens admitted (vLLM's ``prefix_cache_hits / prefix_cache_queries``). A
request preempted by recompute comes back and finds its own pages still
cached; that reuse is real (it saves recomputation) but it is not prompts
sharing a prefix, so it has its own counters, ``readmitted_tokens`` and
``readmitted_hit_tokens``, and its own rate, ``readmission_hit_rate``.
(``cache.stats()["hit_rate"]`` counts every ``add_sequence`` call, both kinds.)
"""

from __future__ import annotations

SERIES = ("step", "running", "waiting", "num_free", "num_cached", "num_in_use",
          "scheduled_tokens", "preemptions")


def _ratio(num: int, den: int) -> float:
    return num / den if den else 0.0


class EngineStats:
    """Counters, step timings and the per-step series of one engine.

    The engine writes them (:meth:`record_step`, :meth:`count_prompt`,
    :meth:`count_readmission`); :meth:`metrics` and :meth:`snapshot` read
    them together with the scheduler's and the cache's own public counts.
    """

    def __init__(self):
        self.steps = 0
        self.generated_tokens = 0
        self.scheduled_tokens = 0
        self.peak_pages_in_use = 0
        self.schedule_s = self.model_s = self.sample_s = 0.0
        self.prompt_tokens = 0              # prompts at their first admission
        self.prefix_hit_tokens = 0          # ... of which the prefix cache served
        self.readmitted_tokens = 0          # tokens known again after a preemption
        self.readmitted_hit_tokens = 0      # ... of which the prefix cache served
        self.spec_num_draft_tokens = 0      # speculation: drafts verified
        self.spec_num_accepted_tokens = 0   # ... of which kept
        self.spec_num_drafts = 0            # (request, step) pairs that drafted
        self.series = {k: [] for k in SERIES}

    def count_drafts(self, num_drafted: int, num_accepted: int) -> None:
        """One request's drafting step: ``num_drafted`` drafts, ``num_accepted`` kept."""
        self.spec_num_draft_tokens += num_drafted
        self.spec_num_accepted_tokens += num_accepted
        self.spec_num_drafts += 1

    def spec_counts(self) -> dict:
        """Speculative decoding's counters (vLLM's ``spec_decode_*``); zeros without it.

        ``spec_acceptance_rate``: accepted drafts over drafts.
        ``spec_mean_accepted_length``: tokens a drafting step emits on average,
        accepted drafts plus the one token every step yields (1.0: no gain).
        """
        return {
            "spec_num_draft_tokens": self.spec_num_draft_tokens,
            "spec_num_accepted_tokens": self.spec_num_accepted_tokens,
            "spec_num_drafts": self.spec_num_drafts,
            "spec_acceptance_rate": _ratio(self.spec_num_accepted_tokens,
                                           self.spec_num_draft_tokens),
            "spec_mean_accepted_length": (1.0 + _ratio(self.spec_num_accepted_tokens,
                                                       self.spec_num_drafts)
                                          if self.spec_num_drafts else 0.0),
        }

    def count_prompt(self, num_tokens: int, num_hit: int) -> None:
        self.prompt_tokens += num_tokens
        self.prefix_hit_tokens += num_hit

    def count_readmission(self, num_tokens: int, num_hit: int) -> None:
        self.readmitted_tokens += num_tokens
        self.readmitted_hit_tokens += num_hit

    def record_step(self, schedule_s: float, model_s: float, sample_s: float,
                    scheduled_tokens: int, scheduler, cache) -> None:
        """Add one step's timings and tokens, and its point of every series."""
        self.schedule_s += schedule_s
        self.model_s += model_s
        self.sample_s += sample_s
        self.steps += 1
        self.scheduled_tokens += scheduled_tokens
        pages = _page_counts(cache)
        self.peak_pages_in_use = max(self.peak_pages_in_use, pages["num_in_use"])
        ser = self.series
        ser["step"].append(self.steps)
        ser["running"].append(len(scheduler.running))
        ser["waiting"].append(len(scheduler.waiting))
        for k in ("num_free", "num_cached", "num_in_use"):
            ser[k].append(pages[k])
        ser["scheduled_tokens"].append(self.scheduled_tokens)
        ser["preemptions"].append(scheduler.num_preemptions)

    def metrics(self, scheduler, cache) -> dict:
        """Counters and timings so far, and the per-step ``series`` (lists, one entry a step)."""
        cs = cache.stats()
        total = self.schedule_s + self.model_s + self.sample_s
        return {
            "steps": self.steps,
            "generated_tokens": self.generated_tokens,
            "scheduled_tokens": self.scheduled_tokens,
            "preemptions": scheduler.num_preemptions,
            "swapped_out": scheduler.num_swapped_out,
            "swapped_in": scheduler.num_swapped_in,
            "evictions": cs["evictions"],
            "cow_copies": cs["cow_copies"],
            **self.prefix_counts(),
            **self.spec_counts(),
            "peak_pages_in_use": self.peak_pages_in_use,
            "num_pages": cs["num_pages"],
            "tokens_per_s": self.generated_tokens / total if total else 0.0,
            "time_s": total,
            "schedule_s": self.schedule_s,
            "model_s": self.model_s,
            "sample_s": self.sample_s,
            "overhead_fraction": (total - self.model_s) / total if total else 0.0,
            "tiers": tier_stats(cache),
            "series": {k: list(v) for k, v in self.series.items()},
        }

    def prefix_counts(self) -> dict:
        """The prefix hit rate (first admissions) and, apart, reuse after preemption."""
        return {
            "prefix_hit_rate": _ratio(self.prefix_hit_tokens, self.prompt_tokens),
            "prompt_tokens": self.prompt_tokens,
            "prefix_hit_tokens": self.prefix_hit_tokens,
            "readmission_hit_rate": _ratio(self.readmitted_hit_tokens, self.readmitted_tokens),
            "readmitted_tokens": self.readmitted_tokens,
            "readmitted_hit_tokens": self.readmitted_hit_tokens,
        }

    def snapshot(self, scheduler, cache) -> dict:
        """Now, for a server's gauges and counters (vLLM's ``SchedulerStats``).

        ``num_requests_running`` / ``num_requests_waiting`` count user
        requests with a sample running / waiting (an ``n > 1`` request with
        one sample preempted is in both); pages are the cache's counts;
        ``kv_cache_usage`` is pages in use over all pages.
        """
        pages = cache.stats()
        num_pages = cache.cfg.num_pages
        return {
            "num_requests_running": len({s.parent.request_id for s in scheduler.running}),
            "num_requests_waiting": len({s.parent.request_id for s in scheduler.waiting}),
            "num_seqs_running": len(scheduler.running),
            "num_seqs_waiting": len(scheduler.waiting),
            "kv_pages_total": num_pages,
            "kv_pages_in_use": pages["num_in_use"],
            "kv_pages_free": pages["num_free"],
            "kv_pages_cached": pages["num_cached"],
            "kv_cache_usage": pages["num_in_use"] / num_pages,
            **self.prefix_counts(),
            "preemptions": scheduler.num_preemptions,
            "swapped_out": scheduler.num_swapped_out,
            "swapped_in": scheduler.num_swapped_in,
            "evictions": pages["evictions"],
            "steps": self.steps,
            "generated_tokens": self.generated_tokens,
            **self.spec_counts(),
            "tiers": tier_stats(cache),
        }


def tier_stats(cache) -> dict:
    """Each tier below the arena by name (``host``, ``disk``): pages, bytes,
    capacity_bytes, hits, stores, evictions, faults, loaded_tokens; {} without tiers."""
    tiers = getattr(cache, "tiers", None)
    return {} if tiers is None else tiers.stats()


def _page_counts(cache) -> dict:
    """The page pool's three counts, read every step (``cache.stats()`` does more work)."""
    pool = cache.pool
    return {"num_free": pool.num_free, "num_cached": pool.num_cached,
            "num_in_use": pool.num_in_use}
