"""Speculative decoding on SmolLM2-135M-Instruct: greedy text unchanged, drafts accepted.

An input-grounded chat (repeat a paragraph with its typos corrected) is what n-gram
drafts are for: most of the answer is copied from the prompt. On the file's blocks with
float32 inputs and with int8 inputs (``quantization="gguf_a8"``). The model is fetched
once into ``PAGED_NP_HOME``; if that fails the test FAILS with the fix (it never skips).
"""

from __future__ import annotations

import pytest

import paged_np as pnp

PARAGRAPH = ("The paged cache keeps every sequence's keys and values in fixed-size pages. "
             "A block table maps each logical page to a physical one, so a sequence can "
             "grow without copying, and two requests with the same prompt can share pages.")
MESSAGES = [[{"role": "user", "content": "Repeat this paragraph exactly:\n\n" + PARAGRAPH}],
            [{"role": "user", "content": "Fix the typos and repeat the text:\n\n"
              + PARAGRAPH.replace("every", "evry").replace("physical", "phisical")}]]


@pytest.fixture(scope="module", params=["gguf", "gguf_a8"])
def smollm2(request):
    # gguf_a8: int8 inputs round a value on a rounding boundary a whole step apart, so
    # the verify rows must have decode's bits exactly (batch invariance), not nearly.
    try:
        return pnp.load_model("smollm2-135m-instruct", quantization=request.param)
    except pnp.ModelFetchError as e:
        pytest.fail(f"the speculative real-model test needs SmolLM2-135M-Instruct: {e}")


def test_greedy_text_unchanged_and_drafts_accepted(smollm2):
    model, tok = smollm2
    params = pnp.SamplingParams(max_tokens=64, temperature=0)
    texts, engines = {}, {}
    for spec in (None, {"method": "ngram", "num_speculative_tokens": 4,
                        "prompt_lookup_max": 4, "prompt_lookup_min": 2}):
        llm = pnp.LLM(model, tokenizer=tok, num_pages=32, page_size=16, verbose=False,
                      speculative_config=spec)
        outs = llm.chat(MESSAGES, params)
        texts[spec is not None] = [(o.outputs[0].token_ids, o.outputs[0].text) for o in outs]
        engines[spec is not None] = llm.engine
        assert llm.engine.cache.stats()["num_in_use"] == 0
    assert texts[True] == texts[False]
    m = engines[True].metrics
    assert m["spec_num_accepted_tokens"] > 0
    assert m["steps"] < engines[False].metrics["steps"]
