"""The OpenAI-compatible server, driven by the official ``openai`` client.

A tiny random model and the tiny tokenizer keep these fast; the text they
produce is gibberish, but it must be *the same* gibberish as ``LLM.generate``
gives for the same greedy request, streamed or not, alone or among 32 clients.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from server_helpers import TINY_NAME, chat_ids, make_llm, metrics, reference, tiny, wait_for

from paged_np.server import ServerThread

MAX_TOKENS = 12


@pytest.fixture(scope="module")
def tiny_pair():
    return tiny()


@pytest.fixture(scope="module")
def server(tiny_pair):
    model, tok = tiny_pair
    with ServerThread(make_llm(model, tok)) as srv:
        yield srv


@pytest.fixture(scope="module")
def ref(tiny_pair):
    model, tok = tiny_pair
    return make_llm(model, tok)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                         timeout=60)


def user(text):
    return [{"role": "user", "content": text}]


# ------------------------------------------------------------------ same text as generate
def test_chat_equals_generate(client, ref, tiny_pair):
    tok = tiny_pair[1]
    msgs = user("What is the capital of France?")
    want_text, want_reason, want_n = reference(ref, [chat_ids(tok, msgs)], MAX_TOKENS)[0]
    r = client.chat.completions.create(model=TINY_NAME, messages=msgs, max_tokens=MAX_TOKENS,
                                       temperature=0)
    assert r.choices[0].message.content == want_text
    assert r.choices[0].finish_reason == want_reason
    assert r.usage.prompt_tokens == len(chat_ids(tok, msgs))
    assert r.usage.completion_tokens == want_n
    assert r.object == "chat.completion" and r.model == TINY_NAME

    stream = client.chat.completions.create(model=TINY_NAME, messages=msgs, stream=True,
                                            max_tokens=MAX_TOKENS, temperature=0,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert text == want_text
    assert reasons[-1] == want_reason and all(r is None for r in reasons[:-1])
    assert chunks[0].choices[0].delta.role == "assistant"
    usage = chunks[-1].usage                        # include_usage: a last chunk, no choices
    assert chunks[-1].choices == [] and usage.completion_tokens == want_n
    # The same prompt a second time: its full pages come from the prefix cache.
    assert usage.prompt_tokens_details.cached_tokens >= 16


def test_completions_equal_generate(client, ref, tiny_pair):
    tok = tiny_pair[1]
    prompt = "The paged cache keeps the keys"
    ids = tok.encode(prompt)
    want_text, want_reason, _ = reference(ref, [ids], MAX_TOKENS)[0]
    r = client.completions.create(model=TINY_NAME, prompt=prompt, max_tokens=MAX_TOKENS,
                                  temperature=0)
    assert (r.choices[0].text, r.choices[0].finish_reason) == (want_text, want_reason)
    assert r.usage.prompt_tokens == len(ids)
    r = client.completions.create(model=TINY_NAME, prompt=ids, max_tokens=MAX_TOKENS,
                                  temperature=0)                   # token ids as the prompt
    assert r.choices[0].text == want_text
    stream = client.completions.create(model=TINY_NAME, prompt=prompt, max_tokens=MAX_TOKENS,
                                       temperature=0, stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) == want_text
    assert chunks[-1].choices[0].finish_reason == want_reason


def test_stop_string_cuts_the_text(client, ref, tiny_pair):
    tok = tiny_pair[1]
    prompt = "Hello! How are you"
    full, _, _ = reference(ref, [tok.encode(prompt)], 24)[0]
    stop = full[5:8]                                # a piece of what the model will say
    want = full[:full.find(stop)]
    r = client.completions.create(model=TINY_NAME, prompt=prompt, max_tokens=24, temperature=0,
                                  stop=[stop])
    assert r.choices[0].text == want and r.choices[0].finish_reason == "stop"
    stream = client.completions.create(model=TINY_NAME, prompt=prompt, max_tokens=24,
                                       temperature=0, stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in stream) == want    # never sent, then taken back


def test_n_samples(client):
    kw = dict(model=TINY_NAME, prompt="Hello", max_tokens=8, temperature=1.0, seed=7, n=3)
    a = client.completions.create(**kw)
    assert sorted(c.index for c in a.choices) == [0, 1, 2]
    assert len({c.text for c in a.choices}) > 1                      # three different draws
    assert 3 <= a.usage.completion_tokens <= 3 * 8
    stream = client.completions.create(**kw, stream=True)
    texts = ["", "", ""]
    reasons = [None] * 3
    for c in stream:
        for ch in c.choices:
            texts[ch.index] += ch.text
            reasons[ch.index] = ch.finish_reason or reasons[ch.index]
    assert all(r in ("length", "stop") for r in reasons)


def test_models_and_health(client, server):
    assert [m.id for m in client.models.list().data] == [TINY_NAME]
    r = httpx.get(server.url + "/health", timeout=10)
    assert r.status_code == 200


# ------------------------------------------------------------------ many clients at once
def test_32_concurrent_streaming_clients_share_steps(client, server, ref, tiny_pair):
    tok = tiny_pair[1]
    prompts = [f"Question {i}: what is {i} plus {i}?" for i in range(32)]
    wants = reference(ref, [chat_ids(tok, user(p)) for p in prompts], MAX_TOKENS)
    before = metrics(server.url)

    def one(p):
        stream = client.chat.completions.create(model=TINY_NAME, messages=user(p), stream=True,
                                                max_tokens=MAX_TOKENS, temperature=0)
        chunks = list(stream)
        return ("".join(c.choices[0].delta.content or "" for c in chunks if c.choices),
                chunks[-1].choices[0].finish_reason)

    with ThreadPoolExecutor(32) as pool:
        got = list(pool.map(one, prompts, timeout=120))
    assert got == [(t, r) for t, r, _ in wants]
    m = wait_for(server.url, lambda m: m["paged_np:num_requests_running"] == 0)
    assert m["paged_np:kv_pages_in_use"] == 0
    assert m["paged_np:num_requests_waiting"] == 0
    # Steps in which more than one request got a token: continuous batching across clients.
    shared = lambda m: m["paged_np:step_num_requests_count"] - m[  # noqa: E731
        'paged_np:step_num_requests_bucket{le="1.0"}']
    assert shared(m) - shared(before) > 0
    assert m['paged_np:step_num_requests_bucket{le="+Inf"}'] > m[
        'paged_np:step_num_requests_bucket{le="8.0"}']                  # some held > 8 requests
    assert m["paged_np:time_to_first_token_seconds_count"] - before[
        "paged_np:time_to_first_token_seconds_count"] == 32


def test_client_disconnect_frees_pages(client, server, ref, tiny_pair):
    tok = tiny_pair[1]
    # A prompt the model does not stop on for 400 tokens: the request would hold pages long.
    prompt = next(p for p in ("Hello", "The answer is", "When two requests share")
                  if reference(ref, [tok.encode(p)], 400)[0][1] == "length")
    aborted = metrics(server.url).get('paged_np:request_success_total{finished_reason="abort"}', 0)
    with httpx.Client(timeout=30) as h:
        with h.stream("POST", server.url + "/v1/completions",
                      json={"model": TINY_NAME, "prompt": prompt, "max_tokens": 400,
                            "temperature": 0, "stream": True}) as r:
            lines = r.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            mid = metrics(server.url)
            assert mid["paged_np:kv_pages_in_use"] > 0 and mid["paged_np:num_requests_running"]
        # Leaving the block closes the connection mid-stream.
    m = wait_for(server.url, lambda m: m["paged_np:kv_pages_in_use"] == 0)
    assert m["paged_np:kv_pages_in_use"] == 0 and m["paged_np:num_requests_running"] == 0
    assert m['paged_np:request_success_total{finished_reason="abort"}'] == aborted + 1
    assert m["paged_np:generation_tokens_total"] < 400 * 100   # it did not run on to the end



def test_metrics_hit_rate_is_the_engines(tiny_pair):
    """/metrics reports the engine's one prefix hit rate (first admissions), and
    re-admission reuse under its own name, even when a small cache preempts."""
    model, tok = tiny_pair
    llm = make_llm(model, tok, num_pages=12, max_num_seqs=8)
    system = "You are a helpful assistant who answers in one short sentence. "
    with ServerThread(llm) as srv:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=60)

        def one(i):
            return c.completions.create(model=TINY_NAME, prompt=system + f"Question {i}?",
                                        max_tokens=24, temperature=0)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(one, range(8), timeout=120))
        m = wait_for(srv.url, lambda m: m["paged_np:num_requests_running"] == 0
                     and m["paged_np:num_requests_waiting"] == 0)
    em = llm.engine.metrics
    assert em["prefix_hit_tokens"] > 0                     # the system prompt was shared
    assert m["paged_np:prefix_cache_hit_rate"] == pytest.approx(em["prefix_hit_rate"])
    assert m["paged_np:prefix_cache_queries_total"] == em["prompt_tokens"]
    assert m["paged_np:prefix_cache_hits_total"] == em["prefix_hit_tokens"]
    assert m["paged_np:prefix_cache_readmission_hit_rate"] == pytest.approx(
        em["readmission_hit_rate"])
    assert m["paged_np:num_preemptions_total"] == em["preemptions"]

# ------------------------------------------------------------------ bad requests
GOOD_CHAT = {"model": TINY_NAME, "messages": [{"role": "user", "content": "Hi"}],
             "max_tokens": 4, "temperature": 0}
GOOD_COMPLETION = {"model": TINY_NAME, "prompt": "Hi", "max_tokens": 4, "temperature": 0}
LONG_PROMPT = "the pages " * 600                 # about 1,200 tokens: past the 1,024 context


def chat(**kw):
    return ("/v1/chat/completions", {**GOOD_CHAT, **kw})


def completion(**kw):
    return ("/v1/completions", {**GOOD_COMPLETION, **kw})


BAD = {
    "missing messages": (("/v1/chat/completions", {"model": TINY_NAME}), "messages"),
    "empty messages": (chat(messages=[]), "messages"),
    "unknown role": (chat(messages=[{"role": "wizard", "content": "Hi"}]), "messages.0.role"),
    "non-string content": (chat(messages=[{"role": "user", "content": 5}]),
                           "messages.0.content"),
    "max_tokens 0": (chat(max_tokens=0), "max_tokens"),
    "max_tokens past the context": (chat(max_tokens=5000), "max_tokens"),
    "negative temperature": (chat(temperature=-0.5), "temperature"),
    "top_p 0": (chat(top_p=0), "top_p"),
    "top_p above 1": (completion(top_p=1.5), "top_p"),
    "n above the limit": (chat(n=33), "n"),
    "unknown model": (chat(model="gpt-5"), "model"),
    "prompt past the context": (completion(prompt=LONG_PROMPT), "prompt"),
    "chat past the context": (chat(messages=[{"role": "user", "content": LONG_PROMPT}]),
                              "messages"),
    "token id outside the vocabulary": (completion(prompt=[1, 2, 10**6]), "prompt"),
    "missing model": (("/v1/completions", {"prompt": "Hi"}), "model"),
    "empty stop string": (completion(stop=[""]), None),
    "stop not a string": (completion(stop=[3]), "stop"),
    "logprobs above the limit": (completion(logprobs=21), "logprobs"),
    "top_logprobs without logprobs": (chat(top_logprobs=2), "top_logprobs"),
    "top_logprobs above the limit": (chat(logprobs=True, top_logprobs=21), "top_logprobs"),
}


def assert_openai_error(r, status, param=None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"]
    if param is not None:
        assert err["param"] == param and param.split(".")[0] in err["message"]


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_request_gets_400_and_the_server_keeps_serving(server, case):
    (path, body), param = BAD[case]
    with httpx.Client(base_url=server.url, timeout=30) as h:
        assert_openai_error(h.post(path, json=body), 400, param)
        good = h.post(path, json=GOOD_CHAT if "chat" in path else GOOD_COMPLETION)
        assert good.status_code == 200 and good.json()["choices"]


def test_invalid_json_and_content_type_and_unknown_route(server):
    with httpx.Client(base_url=server.url, timeout=30) as h:
        r = h.post("/v1/chat/completions", content=b'{"model": "tiny-random", "messages": [',
                   headers={"Content-Type": "application/json"})
        assert_openai_error(r, 400)
        assert "JSON" in r.json()["error"]["message"]
        r = h.post("/v1/completions", content=b"prompt=Hi",
                   headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert_openai_error(r, 400)
        assert "Content-Type" in r.json()["error"]["message"]
        assert_openai_error(h.get("/v1/nothing-here"), 404)
        assert h.post("/v1/chat/completions", json=GOOD_CHAT).status_code == 200


def test_openai_client_sees_bad_request_error(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=TINY_NAME, messages=user("Hi"), temperature=-1)
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="nope", messages=user("Hi"))
