"""The cache's live view (issue 28): ``CacheView`` against the cache it reads, with both
prefix indexes, and updates that replay to the next snapshot. The HTTP side is in
tests/test_server_cache_stream.py."""

from __future__ import annotations

import json

import pytest
from server_helpers import make_llm, tiny

import paged_np as pnp
from paged_np.server.cache_view import CacheView, Subscriber

SYSTEM = list(range(3, 3 + 40))          # a 40-token "system prompt": two full pages of 16


class Now:
    """An event loop stand-in that runs ``call_soon_threadsafe`` at once (one thread here)."""

    def call_soon_threadsafe(self, fn, *args):
        fn(*args)


def drain(sub):
    out = []
    while not sub.queue.empty():
        out.append(sub.queue.get_nowait())
    return out


def apply(state: dict, update: dict) -> dict:
    """What a client does with an update: the changed pages' new values, the rest whole."""
    pages = state["pages"]
    for i, p in enumerate(update["pages"]["changed"]):
        for k in ("state", "ref_count", "owner"):
            pages[k][p] = update["pages"][k][i]
    for k in ("step", "time", "lru", "tree", "requests", "counters", "hits", "evicted"):
        state[k] = update[k]
    return state


def comparable(snap: dict) -> dict:
    return {k: snap[k] for k in ("step", "pages", "lru", "tree", "requests", "counters")}


def check_matches_cache(snap: dict, engine) -> None:
    """Every field of a snapshot against the cache and the engine, read independently."""
    cache, pool = engine.cache, engine.cache.pool
    n = cache.cfg.num_pages
    pages = snap["pages"]
    assert pages["state"] == [pool.state(p) for p in range(n)]
    assert pages["ref_count"] == [pool.ref_count(p) for p in range(n)]
    holders: dict = {}                   # page -> ids of the live requests holding it
    for parent in engine.requests.values():
        for r in parent.seqs:
            if r.seq is not None:
                rid = str(parent.request_id) + (f"#{r.sample.index}" if r.sample.index else "")
                for p in r.seq.block_table:
                    if p >= 0:
                        holders.setdefault(p, set()).add(rid)
    for p in range(n):
        if pages["ref_count"][p]:
            assert pages["owner"][p] in holders[p]
        else:
            assert pages["owner"][p] is None and p not in holders
    assert snap["lru"] == pool.eviction_order()
    index = cache.prefix_index
    if index.kind == "radix":
        nodes = snap["tree"]["nodes"]
        ids = {nd["id"] for nd in nodes}
        assert sorted(p for nd in nodes for p in nd["pages"]) == index.pages()
        for nd in nodes:
            assert nd["parent"] is None or nd["parent"] in ids
            assert nd["num_tokens"] == len(nd["pages"]) * cache.page_size
        assert [(nd["id"], nd["lock_ref"]) for nd in nodes] == [
            (t.id, t.lock_ref) for t in index.nodes()]
    else:
        assert snap["tree"] is None
    sched = engine.scheduler
    assert [r["num_computed_tokens"] for r in snap["requests"]["running"]] == [
        r.num_computed_tokens for r in sched.running]
    assert len(snap["requests"]["waiting"]) == len(sched.waiting)
    assert snap["counters"] == json.loads(json.dumps(engine.stats()))
    assert snap["config"]["num_pages"] == n and snap["config"]["prefix_cache"] == index.kind


def run(prefix_cache, num_pages=12, show_text=False):
    """A replayed run: every step's update applied to the first snapshot equals a fresh
    snapshot, which matches the cache. Returns the updates."""
    model, tok = tiny()
    llm = make_llm(model, tok, num_pages=num_pages, max_num_seqs=4,
                   prefix_cache=prefix_cache)
    view = CacheView(llm, show_text=show_text, max_updates_per_s=1e9)  # every step
    sub = Subscriber(Now(), maxsize=10_000)
    view.watch(sub)
    ((event, data),) = drain(sub)
    assert event == "snapshot"
    state = json.loads(data)
    check_matches_cache(state, llm.engine)
    greedy = pnp.SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    llm.add_request("first", SYSTEM + [60, 61], greedy)
    updates, pending = [], [
        ("second", SYSTEM + [70, 71, 72], greedy),               # shares the system prompt
        ("pair", SYSTEM + [80], pnp.SamplingParams(max_tokens=10, n=2, temperature=1.0,
                                                  seed=1, ignore_eos=True)),   # a fork
        ("long", list(range(100, 150)), greedy),                 # room only by eviction
    ]
    while llm.has_unfinished_requests() or pending:
        if pending and llm.engine.stats()["steps"] % 3 == 2:
            llm.add_request(*pending.pop(0))
        llm.step()
        view.mark_dirty()
        assert view.publish()
        for event, data in drain(sub):
            assert event == "update"
            update = json.loads(data)
            updates.append(update)
            apply(state, update)
        snap = view.snapshot()
        assert comparable(state) == comparable(json.loads(json.dumps(snap)))
        check_matches_cache(snap, llm.engine)
    view.unwatch(sub)
    assert llm.engine.cache.listeners == ()        # nobody watches: no listener
    return updates


@pytest.mark.parametrize("prefix_cache", ["hash", "radix"])
def test_updates_replay_to_the_snapshot_which_matches_the_cache(prefix_cache):
    updates = run(prefix_cache)
    # The shared system prompt: pages held by two requests at once.
    shared = [u for u in updates for i, p in enumerate(u["pages"]["changed"])
              if u["pages"]["ref_count"][i] > 1 and u["pages"]["state"][i] == "in_use"]
    assert shared
    assert any(u["hits"] for u in updates)         # the prefix lookups that found it
    # The arena is too small for everything: cached pages were evicted, and shown.
    evicted = [p for u in updates for p in u["evicted"]]
    assert evicted and updates[-1]["counters"]["evictions"] == len(evicted)
    assert all(p in u["pages"]["changed"] for u in updates for p in u["evicted"])
    assert updates[-1]["counters"]["kv_pages_in_use"] == 0


def test_no_text_unless_asked():
    model, tok = tiny()
    llm = make_llm(model, tok, num_pages=16)
    prompt = "a secret question about paging"
    llm.add_request("q", prompt, pnp.SamplingParams(max_tokens=4, temperature=0.0))
    llm.step()
    hidden = CacheView(llm).snapshot()
    (req,) = hidden["requests"]["running"]
    assert "text" not in req and "secret" not in json.dumps(hidden)
    shown = CacheView(llm, show_text=True).snapshot()
    (req,) = shown["requests"]["running"]
    assert req["text"]["prompt"].strip() == prompt
    assert req["text"]["answer"] == llm.engine.request_output("q").outputs[0].text


def test_a_reader_that_falls_behind_is_sent_a_snapshot():
    model, tok = tiny()
    llm = make_llm(model, tok, num_pages=16)
    view = CacheView(llm, max_updates_per_s=1e9)
    slow = Subscriber(Now(), maxsize=2)
    view.watch(slow)
    llm.add_request("q", list(range(5, 30)), pnp.SamplingParams(max_tokens=8, temperature=0.0))
    events = []
    for _ in range(6):
        llm.step()
        view.mark_dirty()
        view.publish()
    events = [e for e, _ in drain(slow)]
    # Never more than maxsize queued; the overflow was replaced by a fresh snapshot.
    assert len(events) <= 2 and events[0] == "snapshot"


def test_publish_is_rate_limited_and_free_when_nobody_watches():
    model, tok = tiny()
    llm = make_llm(model, tok, num_pages=16)
    view = CacheView(llm)                          # 10 a second
    view.mark_dirty()
    assert not view.publish()                      # nobody watches
    assert llm.engine.cache.listeners == ()
    sub = Subscriber(Now())
    view.watch(sub)
    view.mark_dirty()
    assert view.publish()
    view.mark_dirty()
    assert not view.publish()                      # within 0.1 s of the last one
    assert 0 < view.wait_s(0.5) <= 0.1
