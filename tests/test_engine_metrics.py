"""The engine's prefix hit rate counts prompt tokens once, at first admission."""

from __future__ import annotations

import pytest
from engine_helpers import prompts, tiny_model

import paged_np as pnp


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def test_hit_rate_counts_prompts_not_recomputation_after_preemption(model):
    """Recompute preemption re-admits prompt + generated tokens; their reuse is its own metric."""
    ps = prompts(14, seed=3, system=list(range(40, 60)))
    engine = pnp.Engine(model, num_pages=18, page_size=4, max_num_seqs=6,
                        max_num_batched_tokens=40, preemption_mode="recompute",
                        backend="numpy")
    outs = engine.generate(ps, pnp.SamplingParams(max_tokens=12, temperature=0.0))
    m, cs = engine.metrics, engine.cache.stats()
    assert m["preemptions"] > 0
    # The hit rate, recomputed from each request's own first-admission hits.
    hits = sum(o.num_cached_prompt_tokens for o in outs)
    assert (m["prefix_hit_tokens"], m["prompt_tokens"]) == (hits, sum(map(len, ps)))
    assert m["prefix_hit_rate"] == pytest.approx(hits / sum(map(len, ps)))
    # The cache counts every add_sequence (re-admissions, and admissions undone for
    # want of pages and tried again): the figure the old label called the hit rate.
    assert m["readmitted_hit_tokens"] > 0
    assert cs["hits"] >= m["prefix_hit_tokens"] + m["readmitted_hit_tokens"]
    assert cs["hit_rate"] > m["prefix_hit_rate"]


def test_demo_summary_labels_the_two_figures():
    from paged_np.cli.demo import summary

    m = dict(generated_tokens=1, steps=1, tokens_per_s=1.0, peak_pages_in_use=1, num_pages=2,
             prefix_hit_rate=0.25, readmitted_hit_tokens=7, readmitted_tokens=9,
             evictions=0, preemptions=1, swapped_out=0, cow_copies=0, schedule_s=0.0,
             model_s=0.0, sample_s=0.0)
    text = summary(m, 1, 0)
    assert "25.0% of prompt tokens (first admission)" in text
    assert "7 of 9 re-admitted tokens" in text


def test_stats_is_the_servers_snapshot_and_agrees_with_metrics(model):
    """engine.stats(): what a server exports, from the engine's and the cache's counts."""
    ps = prompts(10, seed=4, system=list(range(40, 60)))
    engine = pnp.Engine(model, num_pages=18, page_size=4, max_num_seqs=6,
                        max_num_batched_tokens=40, backend="numpy")
    for p in ps:
        engine.add_request(p, pnp.SamplingParams(max_tokens=10, temperature=0.0))
    engine.step()
    mid = engine.stats()
    assert mid["num_requests_running"] + mid["num_requests_waiting"] == len(ps)
    assert mid["num_seqs_running"] == len(engine.scheduler.running)
    assert mid["kv_pages_in_use"] + mid["kv_pages_free"] + mid["kv_pages_cached"] == 18
    assert mid["kv_cache_usage"] == pytest.approx(mid["kv_pages_in_use"] / 18)
    while engine.has_unfinished_requests():
        engine.step()
    st, m = engine.stats(), engine.metrics
    for k in ("prefix_hit_rate", "prompt_tokens", "prefix_hit_tokens", "readmission_hit_rate",
              "readmitted_tokens", "readmitted_hit_tokens", "preemptions", "evictions",
              "steps", "generated_tokens"):
        assert st[k] == m[k], k
    assert st["num_requests_running"] == st["num_requests_waiting"] == st["kv_pages_in_use"] == 0
