"""The server's guards as units: the access log's redaction, dashboard sessions, the
per-request mailbox, strict JSON, and the greedy temperature bound (issue 45)."""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest

import paged_np as pnp
from paged_np.engine.sampling import SAMPLING_EPS, sample_tokens
from paged_np.server.auth import RedactQuery, Sessions, redact
from paged_np.server.limits import parse_json
from paged_np.server.loop import Mailbox, Update
from paged_np.server.schemas import APIError


@pytest.mark.parametrize("path, want", [
    ("/v1/cache/stream?api_key=sesame", "/v1/cache/stream?api_key=REDACTED"),
    ("/dashboard?x=1&API_KEY=s&token=t&y=2", "/dashboard?x=1&API_KEY=REDACTED&token=REDACTED&y=2"),
    ("/v1/models", "/v1/models"),
    ("/v1/cache?step=3", "/v1/cache?step=3"),
])
def test_redact_blanks_keys_and_tokens_in_a_query(path, want):
    assert redact(path) == want


def test_the_access_log_filter_rewrites_uvicorns_arguments():
    record = logging.LogRecord("uvicorn.access", logging.INFO, "", 0, '%s - "%s %s HTTP/%s" %d',
                               ("127.0.0.1:1", "GET", "/dashboard?api_key=s3cret", "1.1", 401),
                               None)
    assert RedactQuery().filter(record)
    assert "s3cret" not in record.getMessage() and "REDACTED" in record.getMessage()


def test_sessions_expire_are_bounded_and_unguessable(monkeypatch):
    now = [100.0]
    monkeypatch.setattr("paged_np.server.auth.time.monotonic", lambda: now[0])
    sessions = Sessions(ttl_s=10.0, limit=3)
    a, b, c = sessions.new(), sessions.new(), sessions.new()
    assert len({a, b, c}) == 3 and len(a) >= 40 and all(map(sessions.valid, (a, b, c)))
    d = sessions.new()                                   # one more: the oldest goes
    assert not sessions.valid(a) and sessions.valid(d) and len(sessions) == 3
    assert not sessions.valid("forged") and not sessions.valid("")
    now[0] += 10.0
    assert not sessions.valid(d)                         # expired
    sessions.new()
    assert len(sessions) == 1                            # the expired were swept


def update(n_tokens, finished=False):
    return Update(("x" * n_tokens,), (n_tokens,), ("length" if finished else None,), 3, 0)


def test_a_mailbox_holds_the_newest_update_only():
    async def go():
        box = Mailbox()
        for t in range(1, 1001):                         # a reader that never came
            box.put_nowait(update(t))
        assert (await box.get()).num_tokens == (1000,)
        box.put_nowait(update(1001, finished=True))
        box.close()                                      # finished beats gone
        assert (await box.get()).finished
        box = Mailbox()
        box.put_nowait(update(5))
        box.close()                                      # gone: unfinished work is dropped
        assert await box.get() is None

    asyncio.run(go())


@pytest.mark.parametrize("body, words", [
    (b"[NaN]", "NaN is not a JSON number"),
    (b'{"t": -Infinity}', "-Infinity is not a JSON number"),
    (b"1" * 5000, "too many digits"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'{"a": "\xff"}', "not UTF-8"),
    (b'{"a": ', "Expecting value at line 1 column 7"),
])
def test_strict_json_refusals_say_what_is_wrong(body, words):
    with pytest.raises(APIError) as e:
        parse_json(body)
    assert e.value.status == 400 and words in e.value.message
    assert "Error(" not in e.value.message


def test_temperatures_below_1e_5_are_greedy():
    logits = np.random.default_rng(0).standard_normal((3, 50)).astype(np.float32)
    params = [pnp.SamplingParams(temperature=t) for t in (1e-320, 9.9e-6, 0.0)]
    assert all(p.greedy for p in params) and SAMPLING_EPS == 1e-5
    assert not pnp.SamplingParams(temperature=1e-5).greedy
    rngs = [np.random.default_rng(i) for i in range(3)]
    assert (sample_tokens(logits, params, rngs) == logits.argmax(-1)).all()
