"""Logprobs over HTTP, read with the official ``openai`` client: OpenAI's chat shape
(``logprobs.content``) and completions shape (four parallel lists), streamed or not, equal
to what ``LLM.generate`` reports with ``SamplingParams(logprobs=k)``."""

from __future__ import annotations

import openai
import pytest
from server_helpers import TINY_NAME, chat_ids, make_llm, tiny

import paged_np as pnp
from paged_np.server import ServerThread

MAX_TOKENS = 10
K = 3


@pytest.fixture(scope="module")
def tiny_pair():
    return tiny()


@pytest.fixture(scope="module")
def client(tiny_pair):
    model, tok = tiny_pair
    with ServerThread(make_llm(model, tok)) as srv:
        yield openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0,
                            timeout=60)


@pytest.fixture(scope="module")
def ref(tiny_pair):
    model, tok = tiny_pair
    return make_llm(model, tok)


def reference(llm, prompt_ids):
    """Sample 0 of a greedy request with ``logprobs=K``: its tokens and their dicts."""
    params = pnp.SamplingParams(max_tokens=MAX_TOKENS, temperature=0, logprobs=K)
    (out,) = llm.generate([list(prompt_ids)], params)
    return out.outputs[0]


def ranked(d):
    """The top-K entries of one position, most likely first: [(text, logprob)]."""
    items = sorted((lp.rank, lp.decoded_token, lp.logprob) for lp in d.values() if lp.rank <= K)
    return [(text, lp) for _, text, lp in items[:K]]


def test_chat_logprobs_in_openai_shape(client, ref, tiny_pair):
    tok = tiny_pair[1]
    msgs = [{"role": "user", "content": "Name a colour."}]
    want = reference(ref, chat_ids(tok, msgs))
    r = client.chat.completions.create(model=TINY_NAME, messages=msgs, max_tokens=MAX_TOKENS,
                                       temperature=0, logprobs=True, top_logprobs=K)
    content = r.choices[0].logprobs.content
    assert len(content) == len(want.token_ids) == r.usage.completion_tokens
    for item, t, d in zip(content, want.token_ids, want.logprobs):
        assert item.token == d[t].decoded_token == tok.decode([t], skip_special_tokens=False)
        assert item.logprob == pytest.approx(d[t].logprob)
        assert bytes(item.bytes) == item.token.encode()
        assert [(x.token, pytest.approx(x.logprob)) for x in item.top_logprobs] == ranked(d)
    # Streamed: the chunks' logprobs, joined, are the same list (to rounding: this time
    # the prompt's pages come from the prefix cache, a different sum order).
    chunks = list(client.chat.completions.create(
        model=TINY_NAME, messages=msgs, max_tokens=MAX_TOKENS, temperature=0, stream=True,
        logprobs=True, top_logprobs=K))
    streamed = [x for c in chunks if c.choices and c.choices[0].logprobs
                for x in c.choices[0].logprobs.content]
    assert [x.token for x in streamed] == [x.token for x in content]
    assert [x.logprob for x in streamed] == pytest.approx([x.logprob for x in content], abs=1e-5)
    # Not asked: null, as before.
    r = client.chat.completions.create(model=TINY_NAME, messages=msgs, max_tokens=2,
                                       temperature=0)
    assert r.choices[0].logprobs is None


def test_completion_logprobs_in_openai_shape(client, ref, tiny_pair):
    tok = tiny_pair[1]
    prompt = "The paged cache keeps"
    want = reference(ref, tok.encode(prompt, add_special_tokens=True))
    r = client.completions.create(model=TINY_NAME, prompt=prompt, max_tokens=MAX_TOKENS,
                                  temperature=0, logprobs=K)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(want.token_ids) == r.usage.completion_tokens
    assert lp.token_logprobs == pytest.approx([d[t].logprob for t, d in
                                               zip(want.token_ids, want.logprobs)])
    # text_offset: where each token's text starts; the tokens' texts make the completion.
    assert lp.text_offset == [sum(len(x) for x in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert "".join(lp.tokens) == r.choices[0].text
    for top, t, d in zip(lp.top_logprobs, want.token_ids, want.logprobs):
        # Keyed by text, as OpenAI's shape is: two byte tokens that decode alike (a half
        # UTF-8 character each) share one key, in vLLM too.
        assert top == pytest.approx({v.decoded_token: v.logprob for v in d.values()})
        assert len(d) in (K, K + 1) and d[t].decoded_token in top   # the sampled one too
    chunks = list(client.completions.create(model=TINY_NAME, prompt=prompt,
                                            max_tokens=MAX_TOKENS, temperature=0,
                                            logprobs=K, stream=True))
    parts = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
    assert [t for p in parts for t in p.tokens] == lp.tokens
    assert [o for p in parts for o in p.text_offset] == lp.text_offset
