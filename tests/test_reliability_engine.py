"""The engine under faults, aborts and long random workloads: nothing leaks, nothing lies.

Promises checked here:

- an exception raised in the middle of a step (inside the model's forward, at
  any layer, or while the step's results are recorded and sampled) leaves the
  engine consistent: ``check_invariants()`` holds, the cache holds exactly the
  running sequences, no page is held by nobody; calling ``step()`` again
  retries, and the greedy tokens still equal ``dense_generate``;
- ``abort`` at any moment (also right after a failed step) gives back every
  page of the request;
- a random workload (arrivals, shared prefixes, ``n > 1``, stop tokens,
  sampling, aborts, faults, preemption under both modes) ends with zero pages
  in use. The CI version runs a few hundred steps; the 10,000-step version is
  ``@pytest.mark.slow`` (``python -m pytest -m slow``).
"""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import prompts, tiny_model
from reliability_helpers import (
    Faults,
    InjectedFault,
    assert_engine_consistent,
    assert_nothing_held,
)

import paged_np as pnp
import paged_np.models.llama as model_module

GREEDY = pnp.SamplingParams(max_tokens=8, temperature=0.0)


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture(scope="module")
def workload(model):
    ps = prompts(8, seed=3, system=list(range(40, 60)))
    return ps, [model.dense_generate(p, GREEDY.max_tokens) for p in ps]


def make_engine(model, mode="recompute", num_pages=18, **kw):
    """A cache small enough that the workload preempts."""
    args = dict(num_pages=num_pages, page_size=4, max_num_seqs=4, max_num_batched_tokens=24,
                preemption_mode=mode, backend="numpy")
    return pnp.Engine(model, **{**args, **kw})


def run_with_retries(engine, max_failures=10_000):
    """Step until done; after each injected fault check consistency and retry."""
    results, failures = {}, 0
    while engine.has_unfinished_requests():
        try:
            for out in engine.step():
                results[out.request_id] = out
        except InjectedFault:
            failures += 1
            assert failures < max_failures, "the engine makes no progress"
            assert_engine_consistent(engine)
    return results, failures


# Where a fault is injected: (what is patched, attribute). "model" sites are
# methods of the model (patched on the instance), "engine" sites are names the
# engine module calls, "cache" sites are methods of the engine's cache.
FAULT_SITES = {
    "embed (forward start)": ("model", "embed"),
    "qkv (before a layer's write_kv)": ("model", "qkv"),
    "paged_attention (after a layer's write_kv)": ("model_module", "paged_attention"),
    "finish_layer": ("model", "finish_layer"),
    "logits (forward end)": ("model", "logits"),
    "append_tokens (recording the step)": ("cache", "append_tokens"),
    "sample_tokens (after every append)": ("engine", "sampler"),
}


def inject(monkeypatch, engine, site, **fault_args) -> Faults:
    where, name = FAULT_SITES[site]
    target = {"model": engine.model, "cache": engine.cache, "model_module": model_module,
              "engine": engine}[where]
    faults = Faults(getattr(target, name), **fault_args)
    monkeypatch.setattr(target, name, faults)
    return faults


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("site", list(FAULT_SITES))
def test_a_failed_step_can_be_retried_and_tokens_equal_dense(model, workload, site, mode,
                                                             monkeypatch):
    ps, want = workload
    engine = make_engine(model, mode)
    faults = inject(monkeypatch, engine, site, p=0.3, seed=len(site))
    ids = [engine.add_request(p, GREEDY, request_index=i) for i, p in enumerate(ps)]
    results, failures = run_with_retries(engine)
    assert failures == faults.raised > 0
    assert [results[i].token_ids for i in ids] == want
    assert all(results[i].finish_reason == "length" for i in ids)
    assert_nothing_held(engine)


@pytest.mark.parametrize("site", ["paged_attention (after a layer's write_kv)",
                                  "append_tokens (recording the step)",
                                  "sample_tokens (after every append)"])
def test_faults_with_a_sliding_window_and_n_greater_than_one(site, monkeypatch):
    """Window pages already given back, forks after the prompt: a retry is still exact."""
    windowed = tiny_model(seed=1, sliding_window=8)
    ps = prompts(5, seed=6, system=list(range(60, 76)))
    want = [windowed.dense_generate(p, 12) for p in ps]
    engine = make_engine(windowed, num_pages=8, max_num_seqs=6)
    faults = inject(monkeypatch, engine, site, p=0.3, seed=5)
    params = pnp.SamplingParams(max_tokens=12, temperature=0.0, n=2)
    ids = [engine.add_request(p, params, request_index=i) for i, p in enumerate(ps)]
    results, failures = run_with_retries(engine)
    assert failures == faults.raised > 0
    for rid, w in zip(ids, want):
        assert [s.token_ids for s in results[rid].samples] == [w, w]
    assert_nothing_held(engine)


@pytest.mark.parametrize("layer_call", [1, 2, 3, 4, 5, 6])
def test_fault_at_each_layer_of_one_step(model, workload, layer_call, monkeypatch):
    """The k-th attention call fails: layers before it already wrote their K/V."""
    ps, want = workload
    engine = make_engine(model, num_pages=64)
    faults = inject(monkeypatch, engine, "paged_attention (after a layer's write_kv)",
                    at={layer_call})
    ids = [engine.add_request(p, GREEDY, request_index=i) for i, p in enumerate(ps[:4])]
    results, failures = run_with_retries(engine)
    assert failures == faults.raised == 1
    assert [results[i].token_ids for i in ids] == want[:4]
    assert_nothing_held(engine)


def test_generate_serves_requests_queued_before_it(model, workload):
    """generate() returns its own outputs; an earlier add_request's comes from step()."""
    ps, want = workload
    engine = make_engine(model, num_pages=64)
    early = engine.add_request(ps[0], GREEDY, request_index=0)
    outs = engine.generate(ps[1:3], GREEDY)
    assert [o.token_ids for o in outs] == [model.dense_generate(p, 8) for p in ps[1:3]]
    later = []
    while engine.has_unfinished_requests():
        later += engine.step()
    assert [o.request_id for o in later] == [early] and later[0].token_ids == want[0]
    assert_nothing_held(engine)


def test_generate_interrupted_by_a_fault_loses_no_output(model, workload, monkeypatch):
    """A step raising inside generate(): every request's output still comes back once."""
    ps, want = workload
    engine = make_engine(model)
    inject(monkeypatch, engine, "paged_attention (after a layer's write_kv)", at={60})
    with pytest.raises(InjectedFault):
        engine.generate(ps, GREEDY)
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    by_id = {o.request_id: o for o in outs}
    assert len(by_id) == len(outs) == len(ps)                    # each exactly once
    assert [by_id[f"req-{i}"].token_ids for i in range(len(ps))] == want
    assert_nothing_held(engine)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_abort_right_after_a_failed_step_frees_everything(model, workload, mode, monkeypatch):
    """A failed step leaves slots allocated but unwritten; abort still frees them."""
    ps, _ = workload
    engine = make_engine(model, mode)
    inject(monkeypatch, engine, "paged_attention (after a layer's write_kv)", at={6})
    ids = [engine.add_request(p, GREEDY, request_index=i) for i, p in enumerate(ps)]
    with pytest.raises(InjectedFault):
        for _ in range(10):
            engine.step()
    assert any(engine.cache.sequence(s).num_pending for s in engine.cache.seq_ids)
    for rid in ids:
        if rid in engine.requests:
            engine.abort(rid)
            assert_engine_consistent(engine)
    engine.step()                                                # hands back the outputs
    assert_nothing_held(engine)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_aborts_at_random_times_free_every_page(model, workload, mode, seed):
    ps, want = workload
    rng = np.random.default_rng(seed)
    engine = make_engine(model, mode, max_num_seqs=6)
    params = [GREEDY, pnp.SamplingParams(max_tokens=8, temperature=0.8, n=3, seed=seed)]
    ids = [engine.add_request(p, params[i % 2], request_index=i) for i, p in enumerate(ps)]
    results, aborted = {}, set()
    while engine.has_unfinished_requests():
        live = list(engine.requests)
        if live and rng.random() < 0.15:
            rid = live[int(rng.integers(len(live)))]
            engine.abort(rid)
            aborted.add(rid)
            assert_engine_consistent(engine)
        for out in engine.step():
            results[out.request_id] = out
        assert_engine_consistent(engine)
    assert aborted and set(results) == set(ids)
    for i, rid in enumerate(ids):
        out = results[rid]
        if rid in aborted:
            assert out.finished and any(s.finish_reason == "abort" for s in out.samples)
        elif i % 2 == 0:
            assert out.token_ids == want[i]                      # greedy survivors: exact
    assert_nothing_held(engine)


# ---------------------------------------------------------------------------
# Random workloads: short in CI, 10,000 steps under -m slow.
# ---------------------------------------------------------------------------
def random_workload(model, num_steps, seed, mode, check_every=1, dense_every=1):
    """Drive an engine with random arrivals, aborts and faults for ``num_steps`` steps,
    then drain it. Returns the engine and a few counters."""
    rng = np.random.default_rng(seed)
    vocab = model.cfg.vocab_size
    systems = [rng.integers(0, vocab, int(rng.integers(4, 24))).tolist() for _ in range(3)]
    engine = make_engine(model, mode, num_pages=24, max_num_seqs=5, max_num_batched_tokens=32,
                         eviction_policy=("lru", "fifo", "lfu")[seed % 3])
    faults = Faults(model_module.paged_attention, p=0.02, seed=seed)
    greedy, results = {}, {}
    aborts = failures = 0

    def add_random_request(i):
        body = rng.integers(0, vocab, int(rng.integers(1, 20))).tolist()
        prompt = (systems[int(rng.integers(3))] if rng.random() < 0.6 else []) + body
        kind = rng.random()
        if kind < 0.5:
            params = pnp.SamplingParams(max_tokens=int(rng.integers(1, 10)), temperature=0.0)
        else:
            params = pnp.SamplingParams(
                max_tokens=int(rng.integers(1, 10)), temperature=1.0, seed=int(i),
                n=int(rng.integers(1, 4)), top_k=int(rng.integers(0, 20)),
                stop_token_ids=rng.integers(0, vocab, 3).tolist())
        rid = engine.add_request(prompt, params)
        if params.greedy and i % dense_every == 0:
            greedy[rid] = (prompt, params.max_tokens)

    original = model_module.paged_attention
    model_module.paged_attention = faults
    try:
        i = step = 0
        while step < num_steps or engine.has_unfinished_requests():
            draining = step >= num_steps
            if not draining and rng.random() < 0.35:
                add_random_request(i)
                i += 1
            live = list(engine.requests)
            if live and not draining and rng.random() < 0.03:
                engine.abort(live[int(rng.integers(len(live)))])
                aborts += 1
            faults.armed = not draining
            try:
                for out in engine.step():
                    results[out.request_id] = out
            except InjectedFault:
                failures += 1
            if step % check_every == 0:
                assert_engine_consistent(engine)
            step += 1
            assert step < num_steps + 5_000, "the workload does not drain"
    finally:
        model_module.paged_attention = original
    assert_nothing_held(engine)
    for rid, (prompt, max_tokens) in greedy.items():
        out = results[rid]
        if out.finish_reason == "length":
            assert out.token_ids == model.dense_generate(prompt, max_tokens), rid
    return engine, dict(requests=i, aborts=aborts, failures=failures, results=results,
                        steps=step)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_short_random_workload_leaks_nothing(model, mode):
    engine, info = random_workload(model, 300, seed=7 if mode == "swap" else 8, mode=mode)
    assert info["requests"] > 50 and info["aborts"] > 0 and info["failures"] > 0
    assert engine.metrics["preemptions"] > 0
    assert engine.metrics["evictions"] > 0
    reasons = {o.finish_reason for o in info["results"].values()}
    assert {"length", "abort"} <= reasons


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_10k_step_random_workload_leaks_nothing(model, mode):
    engine, info = random_workload(model, 10_000, seed=11, mode=mode, check_every=10,
                                   dense_every=10)
    assert info["steps"] >= 10_000                              # failed steps included
    assert engine.metrics["steps"] + info["failures"] == info["steps"]
    assert info["requests"] > 3000
