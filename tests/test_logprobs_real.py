"""SmolLM2-135M-Instruct's logprobs and perplexity against transformers' log-softmax
(``tests/data/smollm2_logprobs_golden.json``, written by ``make_logprobs_golden.py``).

The engine serves the golden prompts on a cache too small for all of them, in chunks, so
that prompt logprobs cross chunked prefill and preemption. The model is fetched once
into ``PAGED_NP_HOME``; if that fails the tests FAIL with the fix.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import paged_np as pnp
from paged_np.engine.perplexity import EvalRun, eval_text_info, eval_token_ids, evaluate

GOLDEN = json.loads((Path(__file__).parent / "data" / "smollm2_logprobs_golden.json").read_text())
ATOL = 2e-3                      # nats: float32 logits agree within 2e-4 (test_models_real.py)
SLICE = 128                      # tokens of the perplexity text scored here (the table: 2048)
GEN = 12                         # generated tokens compared (the golden has up to 32)


@pytest.fixture(scope="module")
def smollm2():
    try:
        return pnp.load_model("smollm2-135m-instruct")
    except pnp.ModelFetchError as e:
        pytest.fail(f"the logprobs real-model tests need SmolLM2-135M-Instruct: {e}")


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_prompt_and_sample_logprobs_equal_transformers(smollm2, mode):
    model, tok = smollm2
    recs = GOLDEN["prompts"]
    k = GOLDEN["top"]
    # 10 pages of 8 tokens: two prompts (35-38 tokens, 5 pages each) fill them; decoding
    # needs a sixth page, so one is preempted, and prefill runs in chunks of 24 tokens.
    llm = pnp.LLM(model, tokenizer=tok, num_pages=10, page_size=8, max_num_seqs=3,
                  max_num_batched_tokens=24, preemption_mode=mode, verbose=False)
    params = pnp.SamplingParams(max_tokens=GEN, temperature=0, logprobs=k, prompt_logprobs=k)
    outs = llm.generate([r["prompt_ids"] for r in recs], params)
    assert llm.engine.metrics["preemptions"] > 0                 # the case this test is for
    for out, rec in zip(outs, recs):
        s = out.outputs[0]
        assert s.token_ids == rec["greedy_ids"][:GEN]
        P = len(rec["prompt_ids"])
        positions = out.prompt_logprobs[1:] + s.logprobs         # row i scores token i + 1
        tokens = rec["prompt_ids"][1:] + s.token_ids
        assert out.prompt_logprobs[0] is None and len(positions) == P - 1 + len(s.token_ids)
        for i, (d, t) in enumerate(zip(positions, tokens)):
            assert next(iter(d)) == t
            assert d[t].logprob == pytest.approx(rec["token_logprobs"][i], abs=ATOL)
            top = {u: lp.logprob for u, lp in d.items() if lp.rank <= k}
            want = dict(zip(rec["top_ids"][i], rec["top_logprobs"][i]))
            for u, v in want.items():                            # near-ties may swap places
                if u in top:
                    assert top[u] == pytest.approx(v, abs=ATOL)
                else:
                    assert v <= min(top.values()) + ATOL, (i, u, v, top)
        assert s.cumulative_logprob == pytest.approx(sum(rec["token_logprobs"][P - 1:P - 1 + GEN]),
                                                     abs=ATOL * len(s.token_ids))
        assert all(lp.decoded_token is not None for d in positions for lp in d.values())


def test_perplexity_equals_transformers(smollm2):
    model, tok = smollm2
    text = GOLDEN["text"]
    assert eval_text_info()["sha256"] == text["sha256"], (
        "this Python's pydoc_data text differs from the one the golden file was made on: "
        "run tests/data/make_logprobs_golden.py again")
    ids = eval_token_ids(tok, SLICE)
    assert ids == text["token_ids"][:SLICE]
    want = np.array(text["token_logprobs"][:SLICE - 1])
    runs = [EvalRun("whole", pnp.EngineConfig(num_pages=16, max_num_batched_tokens=512)),
            EvalRun("chunks", pnp.EngineConfig(num_pages=16, page_size=8,
                                               max_num_batched_tokens=40))]
    results = evaluate(model, ids, runs)
    ppl_hf = float(np.exp(-want.mean()))
    for r in results:
        assert r.num_scored == SLICE - 1
        assert abs(r.perplexity / ppl_hf - 1) < 1e-3             # the target: 0.5%
    assert results[1].kl_mean < 1e-6 and results[1].top1 == 1.0  # chunking changes nothing


def test_eval_repeats_every_run_on_each_weight_format(tmp_path):
    """``eval --weights none,gguf``: the file's blocks, multiplied in another order than
    their float32 dequantization, give the same distribution (KL ~ 0), and each KV
    dtype run is repeated on the quantized weights."""
    from paged_np.cli import eval as eval_cli

    out = tmp_path / "eval.json"
    assert eval_cli.main(["--num-tokens", "64", "--weights", "none,gguf",
                          "--sweep", "kv_cache_dtype=int8", "--json", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert [r["label"] for r in runs] == ["reference", "kv_cache_dtype=int8",
                                          "reference, weights=gguf",
                                          "kv_cache_dtype=int8, weights=gguf"]
    ref, int8, q_ref, q_int8 = runs
    assert abs(q_ref["perplexity"] / ref["perplexity"] - 1) < 1e-4
    assert q_ref["kl_mean"] < 1e-6 and q_ref["top1"] == 1.0
    # 8-bit pages round each K/V value to a code: the 1e-7 that another summation order
    # moves a value flips the codes that sat on a rounding boundary, so the two int8 runs
    # are not equal. Over 64 tokens those flips move int8's cost by a third either way
    # (0.83-1.37% measured on the two formats as the SiLU's division changed its last
    # bit), so what int8 costs must agree on both weight formats within a factor of 2:
    # a run that lost its KV dtype costs 0, one that broke costs 10x.
    cost = int8["perplexity"] / ref["perplexity"] - 1
    q_cost = q_int8["perplexity"] / q_ref["perplexity"] - 1
    assert cost > 0 and 0.5 < q_cost / cost < 2, (cost, q_cost)
