"""A restarted server answers a repeated long system prompt from its disk tier: the hit is
counted (``/metrics``, ``/v1/cache``) and the greedy text is the same; ``cache_salt`` in
the body keeps another tenant off those pages."""

from __future__ import annotations

import httpx
from server_helpers import TINY_NAME, make_llm, metrics, tiny, wait_for

from paged_np.server import ServerThread

SYSTEM = ("You are a careful assistant. You answer every question about paged KV caches "
          "in one short sentence, naming the page, the block table and the arena. ") * 4


def _ask(srv, salt=None):
    body = {"model": TINY_NAME, "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": "What is a page?"}]}
    if salt is not None:
        body["cache_salt"] = salt
    r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    wait_for(srv.url, lambda m: m["paged_np:num_requests_running"] == 0)
    return r.json()["choices"][0]["message"]["content"]


def test_a_restarted_server_answers_a_long_system_prompt_from_disk(tmp_path):
    model, tok = tiny()
    hits = 'paged_np:kv_tier_hits_total{tier="disk"}'
    with ServerThread(make_llm(model, tok, num_pages=64, disk_cache_dir=str(tmp_path))) as srv:
        first = _ask(srv)
        assert metrics(srv.url)[hits] == 0
    llm = make_llm(model, tok, num_pages=64, disk_cache_dir=str(tmp_path))   # a restart
    with ServerThread(llm) as srv:
        other = _ask(srv, salt="another-tenant")
        assert metrics(srv.url)[hits] == 0                     # salted: none of those pages
        again = _ask(srv)
        m = metrics(srv.url)
        view = httpx.get(srv.url + "/v1/cache", timeout=10).json()
    assert again == first and other == first                  # same greedy text
    assert m[hits] > 0 and m['paged_np:kv_tier_loaded_tokens_total{tier="disk"}'] >= 16
    assert m['paged_np:kv_tier_faults_total{tier="disk"}'] == 0
    assert view["counters"]["tiers"]["disk"]["hits"] == m[hits]
