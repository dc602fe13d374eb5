"""``GET /metrics`` read back with ``prometheus_client``'s own parser: the same names,
types and labels as before the library wrote it, and the engine's numbers exactly."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families  # the serve extra's
from server_helpers import TINY_NAME, make_llm, tiny, wait_for

from paged_np.server import ServerThread
from paged_np.server.metrics import ServerMetrics

#: Every family /metrics served when it was written by hand (the reference), by type.
#: A counter family is named without its ``_total`` (the parser's way).
FAMILIES = {
    "gauge": ["num_requests_running", "num_requests_waiting", "kv_pages_in_use",
              "kv_pages_total", "kv_cache_usage_perc", "prefix_cache_hit_rate",
              "prefix_cache_readmission_hit_rate", "spec_decode_draft_acceptance_rate"],
    "counter": ["prompt_tokens", "generation_tokens", "num_preemptions", "kv_cache_evictions",
                "prefix_cache_queries", "prefix_cache_hits", "prefix_cache_cached_tokens",
                "engine_steps", "spec_decode_num_drafts", "spec_decode_num_draft_tokens",
                "spec_decode_num_accepted_tokens", "cache_view_seconds", "request_success"],
    "histogram": ["time_to_first_token_seconds", "inter_token_latency_seconds",
                  "e2e_request_latency_seconds", "step_num_requests", "engine_step_seconds"],
}
#: /metrics sample -> its key in engine.stats().
FROM_ENGINE = {
    "num_requests_running": "num_requests_running", "num_requests_waiting": "num_requests_waiting",
    "kv_pages_in_use": "kv_pages_in_use", "kv_pages_total": "kv_pages_total",
    "kv_cache_usage_perc": "kv_cache_usage", "prefix_cache_hit_rate": "prefix_hit_rate",
    "prefix_cache_readmission_hit_rate": "readmission_hit_rate",
    "prefix_cache_queries_total": "prompt_tokens", "prefix_cache_hits_total": "prefix_hit_tokens",
    "num_preemptions_total": "preemptions", "kv_cache_evictions_total": "evictions",
    "spec_decode_draft_acceptance_rate": "spec_acceptance_rate",
    "spec_decode_num_drafts_total": "spec_num_drafts",
    "spec_decode_num_draft_tokens_total": "spec_num_draft_tokens",
    "spec_decode_num_accepted_tokens_total": "spec_num_accepted_tokens",
}


def parse(text: str) -> tuple[dict, dict]:
    """``({family: type}, {(sample name, labels): value})`` without the ``paged_np:`` prefix."""
    types, samples = {}, {}
    for fam in text_string_to_metric_families(text):
        assert fam.name.startswith("paged_np:"), fam.name
        types[fam.name.removeprefix("paged_np:")] = fam.type
        for s in fam.samples:
            key = (s.name.removeprefix("paged_np:"), tuple(sorted(s.labels.items())))
            samples[key] = s.value
    return types, samples


def test_metrics_parse_and_match_the_engine():
    model, tok = tiny()
    llm = make_llm(model, tok, num_pages=12, max_num_seqs=8)
    prompt = "You are a helpful assistant who answers in one short sentence. Question "
    with ServerThread(llm) as srv:
        for i in range(4):
            r = httpx.post(srv.url + "/v1/completions", timeout=60, json={
                "model": TINY_NAME, "prompt": prompt + str(i), "max_tokens": 8,
                "temperature": 0})
            assert r.status_code == 200
        wait_for(srv.url, lambda m: m["paged_np:num_requests_running"] == 0)
        resp = httpx.get(srv.url + "/metrics", timeout=10)
        stats = llm.engine.stats()
    assert resp.headers["content-type"].startswith("text/plain; version=0.0.4")
    types, samples = parse(resp.text)
    assert types == {name: kind for kind, names in FAMILIES.items() for name in names}
    for name, key in FROM_ENGINE.items():
        assert samples[(name, ())] == pytest.approx(stats[key]), name
    assert stats["prefix_hit_tokens"] > 0 and stats["kv_pages_total"] == 12
    # the server's own counts: 4 requests in, each finished by its length
    assert samples[("request_success_total", (("finished_reason", "length"),))] == 4
    assert samples[("generation_tokens_total", ())] == 4 * 8
    assert samples[("time_to_first_token_seconds_count", ())] == 4
    assert samples[("time_to_first_token_seconds_bucket", (("le", "+Inf"),))] == 4
    assert samples[("prompt_tokens_total", ())] == stats["prompt_tokens"]


def test_two_apps_in_one_process_keep_their_own_registry():
    a, b = ServerMetrics(), ServerMetrics()
    a.prompt_tokens.inc(5)
    a.finish("stop")
    a.set_engine_stats({"kv_pages_in_use": 3}, cache_view_s=0.25)
    _, sa = parse(a.render())
    _, sb = parse(b.render())
    assert (sa[("prompt_tokens_total", ())], sb[("prompt_tokens_total", ())]) == (5, 0)
    assert (sa[("kv_pages_in_use", ())], sb[("kv_pages_in_use", ())]) == (3, 0)
    assert sa[("cache_view_seconds_total", ())] == 0.25
    assert ("request_success_total", (("finished_reason", "stop"),)) not in sb
    assert a.registry is not b.registry
    assert not any(name.endswith("_created") for name, _ in sa)
