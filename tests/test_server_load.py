"""A bounded load test (issue 45): 64 concurrent clients against a real ``serve``
process for a fixed time, loopback only.

The clients mix what a server meets: streaming and plain chats and completions,
streams dropped after their first token, and bad requests (bad JSON, a lone
surrogate, a string for a number, too many stop strings, an oversized body).
Every good request must finish (200, a finish reason, ``[DONE]`` for a stream),
every bad one must be a 4xx in OpenAI's shape, ``/health`` must keep answering, and
once the clients stop the pages in use return to 0 and the server's memory to
within a bound of where it was after a warm-up round.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
from server_helpers import TINY_NAME, ServeProcess, metrics, wait_for

CLIENTS = 64
WARMUP_S = 4.0
LOAD_S = 20.0
MEMORY_BOUND_MB = 150

BAD = [
    (b'{"model": ', 400),
    (b'{"model": "tiny-random", "messages": [{"role": "user", "content": "\\ud800"}]}', 400),
    (b'{"model": "tiny-random", "prompt": "x", "temperature": "0.5"}', 400),
    (json.dumps({"model": TINY_NAME, "prompt": "x", "stop": list("abcdefgh")}).encode(), 400),
    (json.dumps({"model": TINY_NAME, "prompt": "x" * (2 << 20)}).encode(), 413),
]


def good_request(i: int, k: int) -> tuple[str, dict]:
    """Client ``i``'s ``k``-th request: chat or completion, a few samples sometimes."""
    common = {"model": TINY_NAME, "max_tokens": 8 + (i + k) % 17, "temperature": 0.7,
              "seed": i * 1000 + k, "ignore_eos": (i + k) % 3 == 0}
    if (i + k) % 2:
        return "/v1/chat/completions", {**common, "n": 1 + (k % 3 == 0), "messages": [
            {"role": "system", "content": "You keep the cache in pages."},
            {"role": "user", "content": f"client {i} asks question {k}"}]}
    return "/v1/completions", {**common, "prompt": f"The pages of client {i}, turn {k}:"}


class Tally:
    def __init__(self):
        self.good = self.good_ok = self.bad = self.bad_ok = self.dropped = 0
        self.failures: list[str] = []

    def fail(self, what: str):
        if len(self.failures) < 20:
            self.failures.append(what)


async def plain(c: httpx.AsyncClient, path, body, tally: Tally):
    tally.good += 1
    r = await c.post(path, json=body)
    if r.status_code != 200:
        return tally.fail(f"{path} {r.status_code} {r.text[:200]}")
    choices = r.json()["choices"]
    if len(choices) != body.get("n", 1) or any(
            ch["finish_reason"] not in ("length", "stop") for ch in choices):
        return tally.fail(f"{path} unfinished {choices}")
    tally.good_ok += 1


async def streamed(c: httpx.AsyncClient, path, body, tally: Tally, drop: bool):
    if not drop:
        tally.good += 1
    reasons, done = set(), False
    async with c.stream("POST", path, json={**body, "stream": True}) as r:
        if r.status_code != 200:
            return tally.fail(f"stream {path} {r.status_code}")
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if drop:                                     # hang up after the first event
                tally.dropped += 1
                return
            if line == "data: [DONE]":
                done = True
                break
            for ch in json.loads(line[6:]).get("choices", []):
                if ch.get("finish_reason"):
                    reasons.add(ch["finish_reason"])
    if done and reasons and reasons <= {"length", "stop"}:
        tally.good_ok += 1
    else:
        tally.fail(f"stream {path} done={done} reasons={reasons}")


async def bad(c: httpx.AsyncClient, i: int, k: int, tally: Tally):
    body, want = BAD[(i + k) % len(BAD)]
    tally.bad += 1
    r = await c.post("/v1/completions" if b'"prompt"' in body else "/v1/chat/completions",
                     content=body, headers={"Content-Type": "application/json"})
    err = r.json().get("error", {}) if r.headers.get("content-type", "").startswith(
        "application/json") else {}
    if r.status_code == want and err.get("type") == "invalid_request_error" \
            and "Traceback" not in r.text:
        tally.bad_ok += 1
    else:
        tally.fail(f"bad {body[:40]!r}: {r.status_code} {r.text[:200]}")


async def client(url: str, i: int, deadline: float, tally: Tally):
    """One client: requests back to back until the deadline, its kind by ``i``."""
    async with httpx.AsyncClient(base_url=url, timeout=120) as c:
        k = 0
        while time.monotonic() < deadline:
            path, body = good_request(i, k)
            kind = (i + k) % 8
            if kind in (0, 1, 2):
                await streamed(c, path, body, tally, drop=False)
            elif kind == 3:
                await streamed(c, path, body, tally, drop=True)
            elif kind == 4:
                await bad(c, i, k, tally)
            else:
                await plain(c, path, body, tally)
            k += 1


async def health_times(url: str, deadline: float) -> list:
    """Seconds each ``/health`` took, asked every 0.1 s while the clients run."""
    times = []
    async with httpx.AsyncClient(base_url=url, timeout=120) as c:
        while time.monotonic() < deadline:
            t0 = time.perf_counter()
            assert (await c.get("/health")).status_code == 200
            times.append(time.perf_counter() - t0)
            await asyncio.sleep(0.1)
    return times


async def run(url: str, seconds: float) -> tuple[Tally, list]:
    tally = Tally()
    deadline = time.monotonic() + seconds
    health, *_ = await asyncio.gather(health_times(url, deadline),
                                      *(client(url, i, deadline, tally) for i in range(CLIENTS)))
    return tally, sorted(health)


def test_64_clients_good_bad_and_gone():
    with ServeProcess("--log-level", "warning") as srv:
        asyncio.run(run(srv.url, WARMUP_S))              # warm: first allocations, caches
        wait_for(srv.url, lambda m: m["paged_np:num_requests_running"] == 0, timeout=60)
        rss0 = srv.rss_mb()
        tally, health = asyncio.run(run(srv.url, LOAD_S))
        m = wait_for(srv.url, lambda m: m["paged_np:kv_pages_in_use"] == 0
                     and m["paged_np:num_requests_running"] == 0
                     and m["paged_np:num_requests_waiting"] == 0, timeout=60)
        time.sleep(1.0)
        rss1 = srv.rss_mb()
        print(f"{tally.good} good ({tally.good_ok} ok), {tally.bad} bad ({tally.bad_ok} ok), "
              f"{tally.dropped} dropped; /health median {health[len(health) // 2]:.3f} s, "
              f"worst {health[-1]:.2f} s; rss {rss0:.0f} -> "
              f"{rss1:.0f} MiB")
        assert tally.failures == [], tally.failures
        assert tally.good_ok == tally.good > CLIENTS and tally.bad_ok == tally.bad > 0
        assert tally.dropped > 0
        assert m["paged_np:kv_pages_in_use"] == 0
        assert httpx.get(srv.url + "/health", timeout=10).status_code == 200
        # /health is answered throughout: usually at once, at worst in seconds on two
        # shared cores (before issue 45 one large request blocked it for 30-57 s)
        assert health[len(health) // 2] < 1.0 and health[-1] < 15.0
        assert rss1 - rss0 < MEMORY_BOUND_MB
        assert "Traceback" not in srv.log()
        assert metrics(srv.url)["paged_np:request_success_total{finished_reason=\"abort\"}"] > 0
