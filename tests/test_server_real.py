"""The server on the real SmolLM2-135M-Instruct, through the ``openai`` client.

The checkpoint is fetched once into ``PAGED_NP_HOME`` (98 MB); without a
network the fetch fails with the command that fixes it (it never skips).
"""

from __future__ import annotations

import openai
import pytest
from server_helpers import chat_ids, make_llm, reference

from paged_np.server import ServerThread

NAME = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def real():
    from paged_np.models import load_model

    return load_model(NAME)


def test_real_model_chat_over_http_equals_generate(real):
    model, tok = real
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    want_text, want_reason, want_n = reference(make_llm(model, tok, num_pages=64, name=NAME),
                                               [chat_ids(tok, msgs)], 12)[0]
    with ServerThread(make_llm(model, tok, num_pages=64, name=NAME)) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0,
                               timeout=300)
        r = client.chat.completions.create(model=NAME, messages=msgs, max_tokens=12,
                                           temperature=0)
    assert r.choices[0].message.content == want_text
    assert (r.choices[0].finish_reason, r.usage.completion_tokens) == (want_reason, want_n)
    # The chat template and the end-of-turn token work: a short answer that stops by itself
    # and names the city (greedy decoding of this checkpoint).
    assert want_reason == "stop" and "Paris" in want_text
