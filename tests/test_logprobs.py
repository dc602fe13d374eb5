"""vLLM's logprobs on the engine (small random model): the shapes vLLM returns, the values
equal to the dense path's log-softmax, under chunked prefill, preemption (recompute and
swap), prefix caching, forks and speculation; the LLM's decoded tokens and stop strings."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import prompts, tiny_model

import paged_np as pnp
from paged_np.engine.logprobs import log_softmax, logprob_dicts, perplexity

ATOL = 1e-4                      # float32 paged attention against float32 dense attention


def dense_logprobs(model, ids):
    """The truth: float64 [L, V] log-softmax of the dense path's logits at every position."""
    return log_softmax(model.dense_logits(ids))


def check_entries(d, row, token, k):
    """One position's dict against the dense row: the token first, then exactly the top k."""
    top = np.argsort(-row, kind="stable")[:k].tolist()
    assert next(iter(d)) == token                                # the scored token first
    assert set(d) == {token, *top} and len(d) == k + (token not in top)
    for t, lp in d.items():
        assert lp.logprob == pytest.approx(row[t], abs=ATOL)
        assert lp.rank == int((row >= row[t]).sum())             # 1-based, in the vocabulary


def check_prompt_logprobs(model, out, k):
    prompt = out.prompt_token_ids
    ref = dense_logprobs(model, prompt)                          # [P, V]
    pl = out.prompt_logprobs
    assert pl[0] is None and len(pl) == len(prompt)
    for i in range(1, len(prompt)):
        check_entries(pl[i], ref[i - 1], prompt[i], k)


def check_sample_logprobs(model, out, k):
    for s in out.outputs:
        ref = dense_logprobs(model, out.prompt_token_ids + s.token_ids)
        P = len(out.prompt_token_ids)
        assert len(s.logprobs) == len(s.token_ids)
        for j, (d, t) in enumerate(zip(s.logprobs, s.token_ids)):
            check_entries(d, ref[P - 1 + j], t, k)
        assert s.cumulative_logprob == pytest.approx(sum(d[t].logprob for d, t in
                                                         zip(s.logprobs, s.token_ids)))


def test_logprob_dicts_rank_and_order():
    logits = np.array([[0.0, 2.0, 1.0, 2.0, -1.0]], np.float32)  # a tie at the top
    (d,) = logprob_dicts(logits, [2], 2)
    assert list(d) == [2, 1, 3]                                  # the token, then the top 2
    lp = log_softmax(logits)[0]
    assert d[2].rank == 3 and d[2].logprob == pytest.approx(lp[2])
    assert d[1].rank == 1 and d[3].rank == 2                     # top-k ranks are 1..k
    (d,) = logprob_dicts(logits, [1], 2)
    assert list(d) == [1, 3] and d[1].rank == 2                  # ties count as more likely
    (d,) = logprob_dicts(logits, [4], -1)                        # -1: the whole vocabulary
    assert len(d) == 5 and np.exp([v.logprob for v in d.values()]).sum() == pytest.approx(1)


@pytest.mark.parametrize("budget,page_size", [(512, 16), (7, 4), (16, 8)])
def test_prompt_and_sample_logprobs_equal_dense(budget, page_size):
    model = tiny_model()
    eng = pnp.Engine(model, num_pages=64, page_size=page_size, max_num_seqs=4,
                     max_num_batched_tokens=budget, backend="numpy")
    ps = prompts(4, seed=1, low=5, high=40)
    outs = eng.generate(ps, pnp.SamplingParams(max_tokens=6, temperature=0, logprobs=3,
                                               prompt_logprobs=2))
    for out in outs:
        check_prompt_logprobs(model, out, 2)
        check_sample_logprobs(model, out, 3)


def test_none_unless_asked_and_bad_values_refused():
    eng = pnp.Engine(tiny_model(), num_pages=16, backend="numpy")
    (out,) = eng.generate([[1, 2, 3]], pnp.SamplingParams(max_tokens=2, temperature=0))
    assert out.prompt_logprobs is None and out.outputs[0].logprobs is None
    assert out.outputs[0].cumulative_logprob is None
    with pytest.raises(pnp.InvalidArgument, match="SamplingParams.logprobs"):
        pnp.SamplingParams(logprobs=-2)
    with pytest.raises(pnp.DTypeError, match="SamplingParams.prompt_logprobs"):
        pnp.SamplingParams(prompt_logprobs="3")


def test_prompt_logprobs_skip_the_prefix_cache_then_share_it():
    model = tiny_model()
    eng = pnp.Engine(model, num_pages=32, page_size=4, backend="numpy")
    p = prompts(1, seed=2, low=30, high=31)[0]
    greedy = pnp.SamplingParams(max_tokens=2, temperature=0)
    (first,) = eng.generate([p], greedy)
    (scored,) = eng.generate([p], pnp.SamplingParams(max_tokens=2, temperature=0,
                                                     prompt_logprobs=0))
    assert scored.num_cached_prompt_tokens == 0                  # computed every prompt token
    check_prompt_logprobs(model, scored, 0)
    (again,) = eng.generate([p], greedy)
    assert again.num_cached_prompt_tokens == 28                  # its pages are shared after
    assert again.token_ids == scored.token_ids == first.token_ids


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_logprobs_survive_preemption_mid_prefill(mode):
    model = tiny_model()
    eng = pnp.Engine(model, num_pages=14, page_size=4, max_num_seqs=4,
                     max_num_batched_tokens=12, preemption_mode=mode, backend="numpy")
    ps = prompts(4, seed=3, low=18, high=26)
    outs = eng.generate(ps, pnp.SamplingParams(max_tokens=8, temperature=0, logprobs=1,
                                               prompt_logprobs=1))
    assert eng.metrics["preemptions"] > 0
    for out, p in zip(outs, ps):
        assert out.token_ids == model.dense_generate(p, 8)
        check_prompt_logprobs(model, out, 1)                     # each position once
        check_sample_logprobs(model, out, 1)


def test_forks_and_speculation_score_their_own_tokens():
    model = tiny_model()
    p = [5, 6, 7, 5, 6, 7, 5, 6, 7, 5, 6]                        # n-grams to draft from
    eng = pnp.Engine(model, num_pages=32, page_size=4, backend="numpy",
                     speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    (spec,) = eng.generate([p], pnp.SamplingParams(max_tokens=12, temperature=0, logprobs=2))
    check_sample_logprobs(model, spec, 2)
    eng = pnp.Engine(model, num_pages=32, page_size=4, backend="numpy")
    (forked,) = eng.generate([p], pnp.SamplingParams(max_tokens=5, n=3, seed=1, logprobs=0,
                                                     prompt_logprobs=0))
    check_sample_logprobs(model, forked, 0)
    check_prompt_logprobs(model, forked, 0)


def test_logits_listener_sees_every_scored_row_once():
    model = tiny_model()
    eng = pnp.Engine(model, num_pages=32, page_size=4, max_num_batched_tokens=5,
                     backend="numpy")
    seen = {}
    eng.add_logits_listener(lambda rid, j, pos, row: seen.setdefault((rid, j, pos), []).append(
        row.copy()))
    p = prompts(1, seed=4, low=13, high=14)[0]
    (out,) = eng.generate([p], pnp.SamplingParams(max_tokens=3, temperature=0,
                                                  prompt_logprobs=0))
    ref = model.dense_logits(p + out.token_ids)                  # [L, V]
    assert sorted(pos for _, _, pos in seen) == list(range(len(p) + 2))
    for (_, _, pos), rows in seen.items():
        assert len(rows) == 1
        np.testing.assert_allclose(rows[0], ref[pos], atol=1e-4)
    with pytest.raises(pnp.DTypeError, match="callable"):
        eng.add_logits_listener(3)


def test_llm_decodes_tokens_and_cuts_logprobs_at_a_stop_string():
    tok = pnp.Tokenizer.tiny()
    model = pnp.LlamaModel.random(pnp.ModelConfig(vocab_size=tok.vocab_size), seed=0)
    llm = pnp.LLM(model, tokenizer=tok, num_pages=64, backend="numpy", verbose=False)
    (free,) = llm.generate("hello world", pnp.SamplingParams(max_tokens=12, temperature=0,
                                                             ignore_eos=True))
    stop = tok.decode(free.outputs[0].token_ids[3:5])
    params = pnp.SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=2,
                                prompt_logprobs=1, stop=stop)
    (out,) = llm.generate("hello world", params)
    s = out.outputs[0]
    assert s.finish_reason == "stop" and len(s.logprobs) == len(s.token_ids) < 12
    check_sample_logprobs(model, out, 2)
    check_prompt_logprobs(model, out, 1)
    for d in s.logprobs + out.prompt_logprobs[1:]:
        assert all(lp.decoded_token == tok.decode([t], skip_special_tokens=False)
                   for t, lp in d.items())


def test_perplexity_is_exp_of_the_mean_negative_logprob():
    lps = [None] + [{3: pnp.Logprob(-1.0, 1)}, {4: pnp.Logprob(-3.0, 2)}]
    assert perplexity(lps) == pytest.approx(np.exp(2.0))
