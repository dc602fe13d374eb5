"""Errors inside the engine fail only their own request (HTTP 500), never the loop; a
bug's text goes to the server's log, never into a response."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from server_helpers import TINY_NAME, make_llm, metrics, tiny

from paged_np.errors import PagedNPError
from paged_np.server import ServerThread

POISON = "poison"


class FaultyLLM:
    """An LLM whose add_request fails for one prompt, and whose step can be made to fail."""

    def __init__(self, llm, tok):
        self._llm = llm
        self._poison = tok.encode(POISON)
        self.fail_next_step = False

    def __getattr__(self, name):
        return getattr(self._llm, name)

    def add_request(self, request_id, prompt, params, **kw):
        if list(prompt[-len(self._poison):]) == self._poison:
            raise PagedNPError("the engine cannot take this request (test fault)")
        return self._llm.add_request(request_id, prompt, params, **kw)

    def step(self):
        if self.fail_next_step:
            self.fail_next_step = False
            raise RuntimeError("a step blew up (test fault)")
        return self._llm.step()


@pytest.fixture(scope="module")
def faulty():
    model, tok = tiny()
    llm = FaultyLLM(make_llm(model, tok), tok)
    with ServerThread(llm) as srv:
        yield srv, llm


def post(url, prompt, max_tokens=8, stream=False):
    body = {"model": TINY_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": stream}
    return httpx.post(url + "/v1/completions", json=body, timeout=60)


def test_a_refused_request_fails_alone(faulty):
    srv, _ = faulty
    with ThreadPoolExecutor(4) as pool:
        rs = list(pool.map(lambda p: post(srv.url, p, 16), ["Hello", POISON, "The answer", "Hi"]))
    assert [r.status_code for r in rs] == [200, 500, 200, 200]
    err = rs[1].json()["error"]
    assert "test fault" in err["message"] and err["type"] == "server_error"


def test_a_failed_step_fails_its_requests_and_the_loop_goes_on(faulty, caplog):
    srv, llm = faulty
    llm.fail_next_step = True
    with caplog.at_level("ERROR", logger="paged_np.server"):
        r = post(srv.url, "Hello")
    # The exception's text is for the server's log, not for the client.
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    assert "step blew up" not in r.text and "Error" not in r.json()["error"]["message"]
    assert "step blew up" in caplog.text
    r = post(srv.url, "Hello")                                 # the next one is served
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("length", "stop")
    assert httpx.get(srv.url + "/health", timeout=10).status_code == 200
    assert metrics(srv.url)["paged_np:kv_pages_in_use"] == 0
