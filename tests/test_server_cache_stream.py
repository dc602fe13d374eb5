"""The cache's routes over HTTP (issue 28): ``GET /v1/cache``, ``GET /v1/cache/stream``,
``--api-key`` on every route, ``--open``, and streams that clients drop."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from server_helpers import TINY_NAME, make_llm, metrics, tiny, wait_for
from test_server_cache_view import apply, check_matches_cache, comparable

from paged_np.server import ServerThread
from paged_np.server import run as server_run

SYSTEM = "You are a careful assistant who explains paged attention in plain words. " * 3


@pytest.fixture(scope="module")
def model_tok():
    return tiny()


def read_stream(url, out: list, stop: threading.Event, headers=None):
    """Collect ``(event, data, arrival)`` from a cache stream until ``stop`` is set."""
    with httpx.stream("GET", url + "/v1/cache/stream", headers=headers, timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        event = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                out.append((event, json.loads(line[6:]), time.monotonic()))
            if stop.is_set():
                return


def chat(client, content, max_tokens=24):
    return client.chat.completions.create(
        model=TINY_NAME, max_tokens=max_tokens, temperature=0,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}],
        extra_body={"ignore_eos": True})


@pytest.mark.parametrize("prefix_cache", ["hash", "radix"])
def test_stream_starts_with_a_snapshot_and_updates_replay_to_the_end(model_tok, prefix_cache):
    llm = make_llm(*model_tok, num_pages=48, max_num_seqs=8, prefix_cache=prefix_cache)
    with ServerThread(llm) as srv:
        events, stop = [], threading.Event()
        reader = threading.Thread(target=read_stream, args=(srv.url, events, stop))
        reader.start()
        while not events:
            time.sleep(0.01)
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none")
        first = client.chat.completions.create(           # the system prompt, computed once
            model=TINY_NAME, max_tokens=400, temperature=0, stream=True,
            messages=[{"role": "system", "content": SYSTEM},
                      {"role": "user", "content": "first"}], extra_body={"ignore_eos": True})
        next(iter(first))                                  # its prompt is in the cache now
        # Then six more share it, long enough (warm, a tiny-model step is ~2 ms) that
        # their sharing outlives several 0.1 s updates.
        with ThreadPoolExecutor(6) as pool:
            list(pool.map(lambda i: chat(client, f"question {i}", max_tokens=300), range(6)))
        for _ in first:
            pass
        wait_for(srv.url, lambda m: m["paged_np:kv_pages_in_use"] == 0)
        time.sleep(0.3)                                    # the last update (<= 0.1 s later)
        stop.set()
        final = httpx.get(srv.url + "/v1/cache", timeout=10).json()
        check_matches_cache(final, llm.engine)             # idle engine: safe to read here
    reader.join(10)                                        # the server's stop ended it
    kinds = [e for e, _, _ in events]
    assert kinds[0] == "snapshot" and set(kinds[1:]) == {"update"}
    state = events[0][1]
    for _, update, _ in events[1:]:
        apply(state, update)
    assert comparable(state) == comparable(final)
    updates = [u for e, u, _ in events[1:]]
    assert any(r > 1 for u in updates for r, s in zip(u["pages"]["ref_count"],
                                                       u["pages"]["state"]) if s == "in_use")
    assert any(u["hits"] for u in updates)
    # At most 10 updates a second, in the engine's clock and in the reader's.
    times = [u["time"] for u in updates]
    assert all(b - a >= 0.095 for a, b in zip(times, times[1:]))
    assert "text" not in json.dumps(final["requests"]) and "careful" not in json.dumps(updates)


def test_a_forced_eviction_shows(model_tok):
    llm = make_llm(*model_tok, num_pages=12, max_num_seqs=2)     # 12 pages of 16 tokens
    with ServerThread(llm) as srv:
        events, stop = [], threading.Event()
        reader = threading.Thread(target=read_stream, args=(srv.url, events, stop))
        reader.start()
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none")
        for i in range(4):                                  # each leaves ~5 pages cached
            client.completions.create(model=TINY_NAME, prompt=[7 + i] * 70, max_tokens=8,
                                      temperature=0)
        time.sleep(0.3)
        stop.set()
        assert metrics(srv.url)["paged_np:kv_cache_evictions_total"] > 0
    reader.join(10)
    evicted = [p for e, u, _ in events if e == "update" for p in u["evicted"]]
    assert evicted and events[-1][1]["counters"]["evictions"] == len(evicted)


def test_text_only_with_the_flag(model_tok):
    llm = make_llm(*model_tok, num_pages=32)
    with ServerThread(llm, show_text=True) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none")
        stream = client.completions.create(model=TINY_NAME, prompt="tell me about pages",
                                           max_tokens=200, temperature=0, stream=True,
                                           extra_body={"ignore_eos": True})
        next(iter(stream))
        snap = httpx.get(srv.url + "/v1/cache", timeout=10).json()
        stream.close()
    (req,) = snap["requests"]["running"]
    assert "tell me about pages" in req["text"]["prompt"]


ROUTES = [("POST", "/v1/chat/completions", {"model": TINY_NAME, "max_tokens": 2,
                                           "messages": [{"role": "user", "content": "hi"}]}),
          ("POST", "/v1/completions", {"model": TINY_NAME, "prompt": "hi", "max_tokens": 2}),
          ("GET", "/v1/models", None), ("GET", "/metrics", None), ("GET", "/dashboard", None),
          ("GET", "/v1/cache", None), ("GET", "/v1/cache/stream", None)]


def status(url, method, path, body, headers=None, params=None) -> int:
    with httpx.stream(method, url + path, json=body, headers=headers, params=params,
                      timeout=30) as r:
        return r.status_code                               # a stream: the headers suffice


def test_api_key_guards_every_route(model_tok):
    llm = make_llm(*model_tok, num_pages=32)
    with ServerThread(llm, api_key="sesame") as srv:
        good = {"Authorization": "Bearer sesame"}
        for method, path, body in ROUTES:
            assert status(srv.url, method, path, body) == 401, path
            assert status(srv.url, method, path, body, {"Authorization": "Bearer nope"}) == 401
            assert status(srv.url, method, path, body, good) == 200, path
        # A browser's page and EventSource cannot set headers: the dashboard signs in
        # once (a form posts the key) and reads on with a session cookie, never the key.
        for path in ("/dashboard", "/v1/cache", "/v1/cache/stream"):
            assert status(srv.url, "GET", path, None, params={"api_key": "sesame"}) == 401
        login = httpx.post(srv.url + "/dashboard/login", data={"api_key": "sesame"},
                           timeout=10)
        assert login.status_code == 303 and login.headers["location"] == "/dashboard"
        cookie = login.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "sesame" not in cookie
        session = {"Cookie": cookie.split(";")[0]}
        for path in ("/dashboard", "/v1/cache", "/v1/cache/stream"):
            assert status(srv.url, "GET", path, None, session) == 200, path
        for method, path, body in ROUTES[:4]:               # the session opens nothing else
            assert status(srv.url, method, path, body, session) == 401, path
        assert status(srv.url, "GET", "/v1/cache", None,
                      {"Cookie": "paged_np_session=forged"}) == 401
        wrong = httpx.post(srv.url + "/dashboard/login", data={"api_key": "nope"},
                           headers={"Accept": "text/html"}, timeout=10)
        assert wrong.status_code == 401 and "refused" in wrong.text
        assert "set-cookie" not in wrong.headers
        r = httpx.get(srv.url + "/v1/cache", timeout=10)
        assert r.json()["error"]["code"] == "invalid_api_key"
        assert r.headers["www-authenticate"] == "Bearer"
        page = httpx.get(srv.url + "/dashboard", headers={"Accept": "text/html"}, timeout=10)
        assert page.status_code == 401 and 'method="post"' in page.text  # it asks, by POST
        assert status(srv.url, "GET", "/health", None) == 200       # probes stay open
        assert status(srv.url, "GET", "/nowhere", None) == 401      # no map of routes
        assert status(srv.url, "GET", "/nowhere", None, good) == 404
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="sesame")
        assert client.models.list().data[0].id == TINY_NAME
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=srv.url + "/v1", api_key="nope").models.list()


def test_without_a_key_every_route_is_open_and_unknown_paths_404(model_tok):
    llm = make_llm(*model_tok, num_pages=32)
    with ServerThread(llm) as srv:
        for method, path, body in ROUTES:
            assert status(srv.url, method, path, body) == 200, path
        r = httpx.get(srv.url + "/v1/cache/nowhere", timeout=10)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def test_fifty_dropped_streams_leave_nothing_behind(model_tok):
    llm = make_llm(*model_tok, num_pages=64, max_num_seqs=8)
    with ServerThread(llm) as srv:
        view = srv.app.state.server.loop.view
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none")
        with ThreadPoolExecutor(4) as pool:
            chats = [pool.submit(chat, client, f"q{i}", 48) for i in range(8)]
            for _ in range(50):                          # open, read the snapshot, hang up
                with httpx.stream("GET", srv.url + "/v1/cache/stream", timeout=30) as r:
                    for line in r.iter_lines():
                        if line.startswith("data: "):
                            assert json.loads(line[6:])["version"] == 1
                            break
            outs = [c.result(timeout=60) for c in chats]     # the engine never stalled
        assert all(o.usage.completion_tokens == 48 for o in outs)
        deadline = time.monotonic() + 10
        while view.subscribers and time.monotonic() < deadline:
            time.sleep(0.05)
        assert view.subscribers == [] and llm.engine.cache.listeners == ()
        m = wait_for(srv.url, lambda m: m["paged_np:kv_pages_in_use"] == 0)
        assert m["paged_np:kv_pages_in_use"] == 0
        assert m["paged_np:request_success_total{finished_reason=\"length\"}"] == 8


def test_shutdown_ends_an_open_stream(model_tok):
    llm = make_llm(*model_tok, num_pages=32)
    srv = ServerThread(llm, drain_s=0.2).start()
    events, stop = [], threading.Event()
    reader = threading.Thread(target=read_stream, args=(srv.url, events, stop))
    reader.start()
    while not events:
        time.sleep(0.01)
    t0 = time.monotonic()
    srv.stop()
    reader.join(10)
    assert not reader.is_alive() and time.monotonic() - t0 < 5


def test_open_opens_the_dashboard_once_the_server_listens(model_tok, monkeypatch):
    opened = []

    def fake_open(url):                                   # the server answers already
        opened.append((url, httpx.get(url, timeout=10).status_code))

    monkeypatch.setattr(server_run.webbrowser, "open", fake_open)
    llm = make_llm(*model_tok, num_pages=16)
    with ServerThread(llm) as srv:
        url = server_run.dashboard_url("0.0.0.0", srv.port)
        assert url == f"http://127.0.0.1:{srv.port}/dashboard"
        server_run.open_when_started(srv.server, url).join(10)
    assert opened == [(url, 200)]
    assert server_run.dashboard_url("::", 80) == "http://[::1]:80/dashboard"


def test_serve_flags_reach_the_server(monkeypatch):
    from paged_np.cli import serve as serve_cli

    seen = {}
    monkeypatch.setattr("paged_np.server.serve",
                        lambda llm, config: seen.update(vars(config)))
    serve_cli.main(["--model", "tiny-random", "--backend", "numpy", "--open",
                    "--api-key", "k", "--dashboard-show-text"])
    assert (seen["open_browser"], seen["api_key"], seen["show_text"]) == (True, "k", True)
    serve_cli.main(["--model", "tiny-random", "--backend", "numpy"])
    assert (seen["open_browser"], seen["api_key"], seen["show_text"]) == (False, None, False)
