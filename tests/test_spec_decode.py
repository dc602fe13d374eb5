"""Speculative decoding with n-gram drafts (issue 27): exact, and it leaves no trace.

- the proposer against a plain-loop reference, on hand-made and random sequences;
- ``speculative_config`` reaches the engine from a dict, the LLM and the CLI, and a
  bad key is refused by name;
- the acceptance function: greedy keeps the argmax prefix; sampling emits tokens
  distributed exactly as the target p (Monte Carlo, point-mass and general q);
- the engine: greedy tokens identical with and without speculation (batch 1 and
  batched, both prefix caches, both preemption modes, ``n > 1``, a sliding window),
  with drafts actually accepted; ``max_tokens`` and stop tokens never passed;
  drafting pauses for a request whose drafts always fail; sampling unchanged in
  distribution (a chi-square test against the exact p of the first tokens);
- after every run no page is in use.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from engine_helpers import tiny_model

import paged_np as pnp
from paged_np.cli import serve
from paged_np.cli.options import engine_config
from paged_np.engine.rejection import rejection_sample
from paged_np.engine.sampling import probs
from paged_np.engine.spec_decode import (
    BACKOFF_STEPS,
    BREAK_EVEN_TOKENS,
    REJOIN_TOKENS,
    WINDOW,
    DraftBackoff,
    NgramProposer,
    propose_reference,
    rejoin_reference,
)

SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
        "prompt_lookup_min": 1}
GREEDY = pnp.SamplingParams(max_tokens=40, temperature=0)


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def repetitive_prompts(n, seed=0, vocab=128):
    """Prompts that repeat a phrase: the tiny random model then tends to copy, so drafts
    from the prompt are accepted (the tests check that they were)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        phrase = rng.integers(0, vocab, int(rng.integers(4, 12))).tolist()
        tail = rng.integers(0, vocab, int(rng.integers(0, 6))).tolist()
        out.append(phrase * int(rng.integers(2, 4)) + tail)
    return out


def run(model, prompts, params=GREEDY, spec=None, **options):
    """Serve ``prompts``; returns (token ids per sample, metrics). Checks no page is left."""
    options = {"num_pages": 64, "page_size": 4, "max_num_seqs": 4,
               "max_num_batched_tokens": 64, "backend": "numpy", **options}
    engine = pnp.Engine(model, speculative_config=spec, **options)
    outs = engine.generate(prompts, params)
    engine.cache.check_invariants()
    assert engine.cache.stats()["num_in_use"] == 0
    return [[s.token_ids for s in o.samples] for o in outs], engine.metrics


def assert_same_greedy(model, prompts, params=GREEDY, **options):
    plain, m0 = run(model, prompts, params, **options)
    spec, m1 = run(model, prompts, params, spec=SPEC, **options)
    assert spec == plain
    assert m1["spec_num_accepted_tokens"] > 0, "no draft was accepted: the test tests nothing"
    assert m1["steps"] < m0["steps"]
    assert m0["spec_num_draft_tokens"] == 0
    return m0, m1


# ------------------------------------------------------------------ the proposer
@pytest.mark.parametrize("tokens, k, n_max, n_min, drafts", [
    ([1, 2, 3, 4, 1, 2], 3, 4, 1, [3, 4, 1]),        # "1 2" seen at 0: what followed it
    ([1, 2, 3, 1, 2, 9, 1, 2], 2, 2, 1, [9, 1]),      # the latest earlier "1 2", at 3
    ([5, 6, 7, 8, 6, 7, 1, 5, 6, 7], 2, 3, 1, [8, 6]),  # n=3 "5 6 7" beats the later "6 7"
    ([5, 6, 7, 8, 6, 7, 1, 5, 6, 7], 2, 2, 1, [1, 5]),  # n=2 only: the later "6 7" wins
    ([1, 2, 3, 4], 3, 3, 1, []),                      # nothing recurs
    ([1, 2, 3, 2], 3, 3, 2, []),                      # "2" recurs but n >= 2 is asked
    ([7, 7, 7], 4, 2, 1, [7]),                        # the latest is right before the end
    ([7], 4, 3, 1, []),                               # too short for any earlier occurrence
])
def test_proposer_on_hand_made_sequences(tokens, k, n_max, n_min, drafts):
    spec = pnp.SpeculativeConfig(num_speculative_tokens=k, prompt_lookup_max=n_max,
                                 prompt_lookup_min=n_min)
    assert NgramProposer(spec).propose(tokens) == drafts
    assert propose_reference(tokens, k, n_max, n_min) == drafts


def test_proposer_matches_the_reference_on_random_sequences():
    rng = np.random.default_rng(0)
    for _ in range(300):
        tokens = rng.integers(0, 4, int(rng.integers(1, 40))).tolist()
        k, n_min = int(rng.integers(1, 6)), int(rng.integers(1, 4))
        n_max = n_min + int(rng.integers(0, 3))
        spec = pnp.SpeculativeConfig(num_speculative_tokens=k, prompt_lookup_max=n_max,
                                     prompt_lookup_min=n_min)
        assert NgramProposer(spec).propose(tokens) == propose_reference(tokens, k, n_max, n_min)
        assert NgramProposer(spec).propose(tokens, 1) == propose_reference(tokens, 1, n_max,
                                                                           n_min)


TEXT = [10, 11, 12, 13, 14, 15, 16, 17, 18]                      # the text being copied


@pytest.mark.parametrize("output, left_at, drafts", [
    # The model copied 10 11 12, then wrote 99 where the text has 13 (index 3):
    ([10, 11, 12, 99], 12, []),                        # 99 is nowhere near: nothing yet
    ([10, 11, 12, 99, 14], 12, [15, 16, 17]),          # 99 replaced 13: go on after 14
    ([10, 11, 12, 99, 15], 12, [16, 17, 18]),          # 99 replaced 13 14
    ([10, 11, 12, 99, 98, 15], 12, [16, 17, 18]),      # 99 98 replaced 13 14
    ([10, 11, 12, 14], 12, [15, 16, 17]),              # 13 left out
    ([10, 11, 12, 99, 98, 97, 96, 17], 12, []),        # 5 tokens of its own: too late
])
def test_rejoin_finds_where_the_model_takes_up_the_text_again(output, left_at, drafts):
    spec = pnp.SpeculativeConfig(num_speculative_tokens=3, prompt_lookup_max=4,
                                 prompt_lookup_min=3)
    tokens = TEXT + output
    assert NgramProposer(spec).propose(tokens) == []               # no 3-gram recurs
    got, source = NgramProposer(spec).rejoin(tokens, left_at, 3)
    assert got == drafts == rejoin_reference(tokens, left_at, 3, 3)
    assert source == (-1 if not drafts else TEXT.index(drafts[0]))
    assert REJOIN_TOKENS == 3


def test_rejoin_matches_the_reference_on_random_sequences():
    rng = np.random.default_rng(1)
    for _ in range(500):
        tokens = rng.integers(0, 5, int(rng.integers(2, 30))).tolist()
        left_at = int(rng.integers(1, len(tokens) + 1))
        source_at, k = int(rng.integers(-1, left_at + 1)), int(rng.integers(0, 5))
        spec = pnp.SpeculativeConfig(num_speculative_tokens=4)
        assert (NgramProposer(spec).rejoin(tokens, left_at, source_at, k)[0]
                == rejoin_reference(tokens, left_at, source_at, k))


def test_a_rejected_ngram_draft_arms_rejoin_once():
    # record_drafts: after n-gram drafts from index 20 of the context (their original at
    # 5) of which 2 were accepted, the model's own token is at 22 and the text's at 7. A
    # rejoin's own rejection, a full acceptance, and a step without drafts disarm it.
    from types import SimpleNamespace

    engine = pnp.Engine(tiny_model(), speculative_config=SPEC, num_pages=8, page_size=4,
                        backend="numpy")
    req = SimpleNamespace(spec_backoff=DraftBackoff(), spec_token_ids=[1, 2, 3, 4],
                          spec_source=(20, 5, False), spec_rejoin=None)
    engine.scheduler.speculator.record(req, 4, 2)
    assert req.spec_rejoin == (22, 7) and req.spec_token_ids == []
    req.spec_source = (23, 8, True)                                # drafts from rejoin
    engine.scheduler.speculator.record(req, 4, 1)
    assert req.spec_rejoin is None
    req.spec_source = (30, 5, False)
    engine.scheduler.speculator.record(req, 4, 4)                      # all accepted
    assert req.spec_rejoin is None


def test_greedy_is_unchanged_when_drafts_come_from_rejoin(model, monkeypatch):
    # prompt_lookup_min=3: right after a rejection no 3-gram recurs, so drafts come from
    # rejoin; they must be verified like any others.
    spec = dict(SPEC, prompt_lookup_min=3)
    found = []
    real = NgramProposer.rejoin

    def counting(self, *a, **kw):
        out = real(self, *a, **kw)
        found.append(bool(out[0]))
        return out

    monkeypatch.setattr(NgramProposer, "rejoin", counting)
    prompts = repetitive_prompts(8, seed=3)
    plain, _ = run(model, prompts)
    with_spec, metrics = run(model, prompts, spec=spec)
    assert with_spec == plain
    assert any(found), "no draft came from rejoin: the test tests nothing"


# ---------------------------------------------------------------- configuration
def test_config_from_a_dict_the_llm_and_the_cli(model):
    cfg = pnp.EngineConfig(speculative_config=SPEC)
    assert cfg.speculative_config == pnp.SpeculativeConfig(**SPEC)
    args = serve.build_parser().parse_args(
        ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}'])
    assert engine_config(args).speculative_config.num_speculative_tokens == 3
    assert engine_config(serve.build_parser().parse_args([])).speculative_config is None
    tok = pnp.Tokenizer.tiny()
    llm = pnp.LLM(pnp.LlamaModel.random(pnp.ModelConfig(vocab_size=tok.vocab_size)),
                  tokenizer=tok, num_pages=32, verbose=False, speculative_config=SPEC)
    assert llm.engine.scheduler.speculator is not None
    out = llm.generate("abc abc abc abc", pnp.SamplingParams(max_tokens=8, temperature=0))
    assert len(out[0].outputs[0].token_ids) <= 8


@pytest.mark.parametrize("bad, key", [
    ({"method": "eagle"}, "method"), ({"num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"prompt_lookup_min": 5, "prompt_lookup_max": 2}, "prompt_lookup_min"),
    ({"prompt_lookup_max": 0}, "prompt_lookup_max"), ({"ngram_size": 3}, "ngram_size"),
])
def test_bad_speculative_config_names_the_key(bad, key):
    with pytest.raises(pnp.InvalidArgument, match=key):
        pnp.EngineConfig(speculative_config=bad)


def test_cli_refuses_json_that_is_not_an_object(capsys):
    with pytest.raises(SystemExit):
        serve.build_parser().parse_args(["--speculative-config", "[1, 2]"])
    assert "JSON object" in capsys.readouterr().err


# ------------------------------------------------------------- acceptance rule
def test_greedy_acceptance_is_the_argmax_prefix():
    logits = np.zeros((4, 6), np.float32)                        # k = 3 drafts, V = 6
    logits[[0, 1, 2, 3], [2, 5, 1, 4]] = 1.0                     # argmax per row: 2 5 1 4
    rng = np.random.default_rng(0)
    g = pnp.SamplingParams(temperature=0)
    assert rejection_sample(logits, [2, 5, 1], None, g, rng) == [2, 5, 1, 4]   # all + bonus
    assert rejection_sample(logits, [2, 5, 0], None, g, rng) == [2, 5, 1]      # 3rd rejected
    assert rejection_sample(logits, [3, 5, 1], None, g, rng) == [2]            # 1st rejected
    assert rejection_sample(logits[:1], [], None, g, rng) == [2]               # no drafts


def test_acceptance_refuses_bad_arguments():
    logits, g = np.zeros((3, 5), np.float32), pnp.SamplingParams(temperature=0)
    rng = np.random.default_rng(0)
    with pytest.raises(pnp.ShapeError, match="rows"):
        rejection_sample(logits, [1], None, g, rng)
    with pytest.raises(pnp.InvalidArgument, match="draft_token_ids"):
        rejection_sample(logits, [1, 7], None, g, rng)
    with pytest.raises(pnp.ShapeError, match="draft_probs"):
        rejection_sample(logits, [1, 2], np.ones((2, 4)), g, rng)
    q = np.full((2, 5), 0.2)
    q[1, 2] = 0.0
    with pytest.raises(pnp.InvalidArgument, match="draft_probs"):
        rejection_sample(logits, [1, 2], q, g, rng)


@pytest.mark.parametrize("general_q", [False, True])
def test_sampled_tokens_follow_the_target_exactly(general_q):
    """Monte Carlo: each emitted position is distributed as p, whatever the drafts.

    With point-mass q the drafts are fixed; with a general q each draft is drawn from
    q_i, as a draft model would. Position 0 is always emitted: its histogram must be
    p_0. Position 1 (emitted when d_0 was accepted, and then conditioned on it) must be
    p_1 among the runs that kept d_0. Tolerance: 5 binomial standard errors.
    """
    V, k, N = 5, 2, 40000
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(k + 1, V)).astype(np.float32) * 1.5
    params = pnp.SamplingParams(temperature=0.8, top_k=4)
    p = np.stack([probs(row, params) for row in logits])          # [k+1, V] exact target
    q = rng.dirichlet(np.ones(V), size=k) if general_q else None  # [k, V]
    first, second = np.zeros(V), np.zeros(V)
    fixed = [int(np.argsort(p[0])[-2]), int(np.argmax(p[1]))]    # often, not always, kept
    for _ in range(N):
        drafts = ([int(rng.choice(V, p=q[i])) for i in range(k)] if general_q
                  else fixed)
        out = rejection_sample(logits, drafts, q, params, rng)
        assert 1 <= len(out) <= k + 1 and out[:-1] == drafts[:len(out) - 1]
        first[out[0]] += 1
        if len(out) >= 2 and out[0] == drafts[0]:
            second[out[1]] += 1
    assert second.sum() > 1000
    for hist, target in ((first, p[0]), (second, p[1])):
        freq = hist / hist.sum()
        se = np.sqrt(target * (1 - target) / hist.sum()) + 1e-12
        assert np.all(np.abs(freq - target) <= 5 * se + 1e-9), (freq, target)


# ----------------------------------------------------- engine: greedy is unchanged
@pytest.mark.parametrize("prefix_cache", ["hash", "radix"])
def test_greedy_batch_1_unchanged(model, prefix_cache):
    for prompt in repetitive_prompts(3, seed=1):
        assert_same_greedy(model, [prompt], prefix_cache=prefix_cache, max_num_seqs=1)


@pytest.mark.parametrize("prefix_cache", ["hash", "radix"])
def test_greedy_batched_unchanged(model, prefix_cache):
    prompts = repetitive_prompts(6, seed=2)
    prompts.append(prompts[0] + [3, 4])                          # a shared prefix: hits
    m0, m1 = assert_same_greedy(model, prompts, prefix_cache=prefix_cache)
    assert m1["prefix_hit_tokens"] > 0


@pytest.mark.parametrize("prefix_cache", ["hash", "radix"])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_greedy_unchanged_under_preemption(model, mode, prefix_cache):
    prompts = repetitive_prompts(6, seed=3)
    m0, m1 = assert_same_greedy(model, prompts, num_pages=14, preemption_mode=mode,
                                prefix_cache=prefix_cache)
    assert m1["preemptions"] > 0
    if mode == "swap":
        assert m1["swapped_out"] > 0


def test_greedy_n_samples_each_draft_on_their_own(model):
    params = pnp.SamplingParams(max_tokens=30, temperature=0, n=3)
    plain, _ = run(model, repetitive_prompts(2, seed=4), params)
    spec, m = run(model, repetitive_prompts(2, seed=4), params, spec=SPEC)
    assert spec == plain and m["spec_num_accepted_tokens"] > 0
    assert all(s == o[0] for o in spec for s in o)               # greedy: all samples agree


def test_greedy_sliding_window_unchanged(model):
    windowed = tiny_model(sliding_window=6)
    assert_same_greedy(windowed, repetitive_prompts(4, seed=5), num_pages=24)


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5, 8, 13])
def test_max_tokens_never_overshot(model, max_tokens):
    params = pnp.SamplingParams(max_tokens=max_tokens, temperature=0)
    prompts = repetitive_prompts(4, seed=6)
    plain, _ = run(model, prompts, params)
    spec, _ = run(model, prompts, params, spec=SPEC)
    assert spec == plain
    assert all(len(s) == max_tokens for o in spec for s in o)


def test_stop_tokens_never_passed(model):
    prompts = repetitive_prompts(6, seed=7)
    plain, _ = run(model, prompts)
    for o, prompt in zip(plain, prompts):
        ids = o[0]
        for stop in {ids[len(ids) // 2], ids[-3]}:              # a token in the middle
            params = pnp.SamplingParams(max_tokens=40, temperature=0, stop_token_ids=[stop])
            want, _ = run(model, [prompt], params)
            got, _ = run(model, [prompt], params, spec=SPEC)
            assert got == want
            assert got[0][0][-1] == stop and stop not in got[0][0][:-1]


def test_drafting_stops_where_drafts_are_always_rejected():
    """A model whose next token is a hash of its position: the context never predicts
    it, so (nearly) every draft fails, and the request pauses drafting."""
    class Unpredictable(pnp.LlamaModel):
        def forward(self, batch, cache, backend="auto"):
            pos = batch.positions[batch.logits_indices]            # [S]
            logits = np.zeros((len(pos), self.cfg.vocab_size), np.float32)
            logits[np.arange(len(pos)), (pos * 2654435761 >> 7) % 64] = 1.0
            return logits

    base = tiny_model()
    engine = pnp.Engine(Unpredictable(base.cfg, base.w), num_pages=64, page_size=4,
                        speculative_config=SPEC, backend="numpy")
    prompt = list(range(64))                                     # every token recurs: drafts
    rid = engine.add_request(prompt, pnp.SamplingParams(max_tokens=100, temperature=0))
    req = engine.requests[rid].seqs[0]
    while engine.has_unfinished_requests():
        engine.step()
    m = engine.metrics
    assert m["spec_mean_accepted_length"] < BREAK_EVEN_TOKENS
    # Drafted WINDOW steps, paused BACKOFF_STEPS, WINDOW more, paused twice as long, ...
    assert req.spec_backoff.num_pauses >= 2
    assert m["spec_num_drafts"] <= m["steps"] // 3
    assert engine.cache.stats()["num_in_use"] == 0


def test_backoff_pauses_and_forgives():
    b = DraftBackoff()
    for _ in range(WINDOW):
        assert b.should_draft()
        b.record(4, 0)
    assert [b.should_draft() for _ in range(BACKOFF_STEPS)] == [False] * BACKOFF_STEPS
    assert b.should_draft()
    for _ in range(WINDOW):
        b.record(4, 4)                                          # copying again
    assert b.next_pause == BACKOFF_STEPS and b.acceptance_rate == 1.0


def test_metrics_and_stats_report_speculation(model):
    engine = pnp.Engine(model, num_pages=64, page_size=4, speculative_config=SPEC,
                        backend="numpy")
    outs = engine.generate(repetitive_prompts(3, seed=8), GREEDY)
    m, st = engine.metrics, engine.stats()
    for key in ("spec_num_draft_tokens", "spec_num_accepted_tokens", "spec_acceptance_rate",
                "spec_mean_accepted_length"):
        assert m[key] == st[key]
    assert 0 < m["spec_acceptance_rate"] <= 1
    assert m["spec_acceptance_rate"] == m["spec_num_accepted_tokens"] / m["spec_num_draft_tokens"]
    assert m["spec_mean_accepted_length"] == 1 + m["spec_num_accepted_tokens"] / m[
        "spec_num_drafts"]
    assert m["generated_tokens"] == sum(len(o.token_ids) for o in outs)


def test_prometheus_exports_the_spec_counters(model):
    from paged_np.server.metrics import ServerMetrics

    text = ServerMetrics().render()
    for name in ("paged_np:spec_decode_num_draft_tokens_total",
                 "paged_np:spec_decode_num_accepted_tokens_total",
                 "paged_np:spec_decode_draft_acceptance_rate"):
        assert f"\n{name} " in text


# ------------------------------------------------ sampling: the same distribution
def exact_first_tokens(model, prompt, params, depth):
    """The exact joint distribution of the first ``depth`` generated tokens:
    {(t_0, ..., t_{depth-1}): probability}, by enumerating every branch p allows."""
    dist = {(): 1.0}
    for _ in range(depth):
        nxt = {}
        for prefix, pr in dist.items():
            p = probs(model.dense_logits(prompt + list(prefix))[-1], params)
            for t in np.flatnonzero(p > 0):
                nxt[prefix + (int(t),)] = pr * float(p[t])
        dist = nxt
    return dist


def chi_square_pvalue(observed, expected) -> float:
    """Pearson's chi-square goodness of fit; the p-value by the Wilson-Hilferty normal
    approximation of the chi-square tail (within a few percent of the exact tail at
    these degrees of freedom, which is plenty for a 1e-4 threshold; no scipy needed)."""
    x = float(((observed - expected) ** 2 / expected).sum())
    df = len(observed) - 1
    z = ((x / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return 0.5 * math.erfc(z / math.sqrt(2))


def test_sampling_unchanged_in_distribution(model):
    """A chi-square test of the first 3 tokens of 1500 seeded requests against the
    exact p, with and without speculation. The prompt holds every token of the
    vocabulary, so every step after the first has drafts, some accepted, most not.
    Seeds are fixed (the test is deterministic); the threshold p < 1e-4 makes a false
    failure on another seed negligible."""
    rng = np.random.default_rng(0)
    prompt = rng.permutation(128).tolist() + rng.permutation(128).tolist()[:40]
    # max_tokens=4 leaves room for 2 drafts after the first token (never past max_tokens)
    params = pnp.SamplingParams(max_tokens=4, temperature=1.0, top_k=3, seed=1234)
    exact = exact_first_tokens(model, prompt, params, 3)
    cells = sorted(exact)
    N = 1500
    for spec in (None, SPEC):
        engine = pnp.Engine(model, num_pages=256, page_size=16, max_num_seqs=64,
                            max_num_batched_tokens=1024, speculative_config=spec,
                            backend="numpy")
        outs = engine.generate([prompt] * N, params)
        counts = dict.fromkeys(cells, 0)
        for o in outs:
            counts[tuple(o.token_ids[:3])] += 1                  # KeyError: impossible tokens
        observed = np.array([counts[c] for c in cells], float)
        expected = np.array([exact[c] for c in cells]) * N
        # pool the rare cells so every expected count is at least 5
        rare = expected < 5
        observed = np.append(observed[~rare], observed[rare].sum())
        expected = np.append(expected[~rare], expected[rare].sum())
        if expected[-1] == 0:
            observed, expected = observed[:-1], expected[:-1]
        assert chi_square_pvalue(observed, expected) > 1e-4
        assert engine.cache.stats()["num_in_use"] == 0
        if spec is not None:
            m = engine.metrics
            assert m["spec_num_accepted_tokens"] > 100                 # both paths taken
            assert m["spec_num_draft_tokens"] - m["spec_num_accepted_tokens"] > 100


def test_stop_string_cuts_tokens_drafted_past_it(monkeypatch):
    """A stop string completed by an accepted draft: the tokens after it in the same step
    are dropped, as if each had come one step at a time."""
    from paged_np.engine import spec_decode

    # Short accepted drafts are below break-even and would pause drafting (tested
    # apart); here every step should draft, to meet stop strings mid-step.
    monkeypatch.setattr(spec_decode, "BREAK_EVEN_TOKENS", 0.0)
    tok = pnp.Tokenizer.tiny()
    base = pnp.LlamaModel.random(pnp.ModelConfig(vocab_size=tok.vocab_size))
    prompt = "ab ab ab ab ab ab"
    ids = tok.encode(prompt, add_special_tokens=True)
    script = tok.encode(" ab ab ab xy ab ab ab ab ab") + [tok.eos_token_id]

    class Scripted(pnp.LlamaModel):                             # answers with the script
        def forward(self, batch, cache, backend="auto"):
            pos = batch.positions[batch.logits_indices]          # [S]
            logits = np.zeros((len(pos), self.cfg.vocab_size), np.float32)
            for row, p in enumerate(pos.tolist()):
                logits[row, script[min(p + 1 - len(ids), len(script) - 1)]] = 1.0
            return logits

    scripted = Scripted(base.cfg, base.w)
    outs, emitted = {}, {}
    for spec in (None, SPEC):
        llm = pnp.LLM(scripted, tokenizer=tok, num_pages=32, verbose=False,
                      speculative_config=spec)
        for stop in (["ab ab"], ["xy"], [" ab ab ab ab"]):
            o = llm.generate(prompt, pnp.SamplingParams(max_tokens=40, temperature=0,
                                                        stop=stop))[0].outputs[0]
            outs.setdefault(tuple(stop), []).append((o.text, o.token_ids, o.finish_reason))
        assert llm.engine.cache.stats()["num_in_use"] == 0
        emitted[spec is not None] = llm.engine.metrics["generated_tokens"]
        if spec is not None:
            assert llm.engine.metrics["spec_num_accepted_tokens"] > 0
    assert emitted[True] > emitted[False]           # some drafts past a stop were cut
    for stop, (plain, spec) in outs.items():
        assert spec == plain, stop


def test_all_combinations_leave_no_page_in_use(model):
    """A small sweep of options with sampling on: nothing leaks, invariants hold."""
    prompts = repetitive_prompts(5, seed=9)
    params = pnp.SamplingParams(max_tokens=20, temperature=0.7, top_p=0.9, seed=3, n=2)
    for prefix_cache, mode in itertools.product(["hash", "radix"], ["recompute", "swap"]):
        _, m = run(model, prompts, params, spec=SPEC, num_pages=16, prefix_cache=prefix_cache,
                   preemption_mode=mode)
        assert m["spec_num_draft_tokens"] > 0
