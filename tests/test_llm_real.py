"""pnp.LLM serving SmolLM2-135M-Instruct: chat answers equal transformers' greedy tokens
(tests/data/smollm2_golden.json) on a cache too small for all of them, with prefix hits,
under both preemption modes.

The model is fetched once into ``PAGED_NP_HOME``; if that fails the test FAILS with the fix.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import paged_np as pnp
from paged_np.engine.dense_check import check_against_dense

GOLDEN = json.loads((Path(__file__).parent / "data" / "smollm2_golden.json").read_text())


@pytest.fixture(scope="session")
def smollm2_loaded():
    try:
        return pnp.load_model("smollm2-135m-instruct")
    except pnp.ModelFetchError as e:
        pytest.fail(f"pnp.LLM's real-model test needs SmolLM2-135M-Instruct: {e}")


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_chat_under_preemption_equals_transformers(smollm2_loaded, mode):
    model, tok = smollm2_loaded
    records = GOLDEN["records"]
    # 7 pages of 16 tokens: the three requests (37 + 32 tokens at most each) cannot all stay.
    llm = pnp.LLM(model, tokenizer=tok, num_pages=7, page_size=16, max_num_seqs=3,
                  max_num_batched_tokens=128, preemption_mode=mode, verbose=False)
    params = pnp.SamplingParams(max_tokens=GOLDEN["max_new_tokens"], temperature=0)
    outs = llm.chat([r["messages"] for r in records], params)
    for o, r in zip(outs, records):
        assert o.prompt == r["prompt"] and o.prompt_token_ids == r["prompt_ids"]
        assert o.outputs[0].token_ids == r["greedy_ids"]
        assert o.outputs[0].text == r["greedy_text"]
        assert o.outputs[0].finish_reason == ("stop" if r["greedy_ids"][-1] == 2 else "length")
    m = llm.engine.metrics
    assert m["preemptions"] > 0
    # all three share the default system turn: the later ones reuse its first page
    assert sum(o.num_cached_tokens for o in outs) >= 16


def test_stop_string_and_teacher_forced_check(smollm2_loaded):
    model, tok = smollm2_loaded
    r = GOLDEN["records"][1]                     # the haiku: "In the realm of memories, ..."
    llm = pnp.LLM(model, tokenizer=tok, num_pages=8, verbose=False)
    out = llm.chat(r["messages"], pnp.SamplingParams(max_tokens=32, temperature=0,
                                                     stop=["memories"]))[0]
    c = out.outputs[0]
    assert c.text == "In the realm of " and c.finish_reason == "stop"
    assert c.token_ids == r["greedy_ids"][:len(c.token_ids)]
    check = check_against_dense(model, out.prompt_token_ids, c.token_ids)
    assert check.ok and check.checked == len(c.token_ids)
