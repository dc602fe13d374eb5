"""The engine: same tokens as the dense reference, whatever the memory pressure."""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pytest
from engine_helpers import BACKENDS, prompts, tiny_model

import paged_np as pnp

GREEDY = pnp.SamplingParams(max_tokens=12, temperature=0.0)


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture(scope="module")
def workload(model):
    ps = prompts(14, seed=3, system=list(range(40, 60)))
    return ps, [model.dense_generate(p, GREEDY.max_tokens) for p in ps]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_greedy_equals_dense_under_preemption(model, workload, mode, backend):
    ps, want = workload
    engine = pnp.Engine(model, num_pages=18, page_size=4, max_num_seqs=6,
                        max_num_batched_tokens=40, preemption_mode=mode, backend=backend)
    outs = engine.generate(ps, GREEDY)
    assert [o.token_ids for o in outs] == want
    assert all(o.finish_reason == "length" for o in outs)
    m = engine.metrics
    assert m["preemptions"] > 0                                 # the cache was too small
    if mode == "swap":
        assert m["swapped_out"] > 0 and m["swapped_in"] > 0
    assert m["peak_pages_in_use"] <= 18
    engine.cache.check_invariants()
    assert engine.cache.stats()["num_in_use"] == 0              # everything released


def test_swap_falls_back_to_recompute_when_swap_space_is_full(model, workload):
    ps, want = workload
    engine = pnp.Engine(model, num_pages=18, page_size=4, max_num_seqs=6,
                        max_num_batched_tokens=40, preemption_mode="swap", swap_pages=2,
                        backend="numpy")
    assert [o.token_ids for o in engine.generate(ps, GREEDY)] == want
    assert engine.metrics["preemptions"] > engine.metrics["swapped_out"]


def test_prefix_hits_across_requests_sharing_a_system_prompt(model):
    system = list(range(1, 33))                                 # 8 full pages of 4
    ps = [system + [100 + i, 7, 8] for i in range(4)]
    engine = pnp.Engine(model, num_pages=64, page_size=4, max_num_seqs=1,
                        backend="numpy")
    outs = engine.generate(ps, GREEDY)
    assert outs[0].num_cached_prompt_tokens == 0
    assert [o.num_cached_prompt_tokens for o in outs[1:]] == [32, 32, 32]
    assert engine.metrics["prefix_hit_rate"] == pytest.approx(96 / (4 * 35))
    assert [o.token_ids for o in outs] == [model.dense_generate(p, 12) for p in ps]


def test_n4_sampling_shares_the_prompt_pages(model):
    prompt = list(range(1, 63))                                 # 15.5 pages of 4
    params = pnp.SamplingParams(max_tokens=6, temperature=1.0, n=4, seed=5)
    engine = pnp.Engine(model, num_pages=64, page_size=4, max_num_seqs=4, backend="numpy")
    (out,) = engine.generate([prompt], params)
    assert len(out.samples) == 4 and out.finished
    assert all(len(s.token_ids) == 6 for s in out.samples)
    assert len({tuple(s.token_ids) for s in out.samples}) > 1  # they did sample apart
    alone = -(-(len(prompt) + 6) // 4)                          # pages of one sample
    assert engine.metrics["peak_pages_in_use"] <= alone + 3 * 3  # far below 4 * alone
    assert engine.metrics["cow_copies"] >= 1                     # the shared last page

    greedy = pnp.SamplingParams(max_tokens=6, temperature=0.0, n=4)
    (out,) = engine.generate([prompt], greedy)
    want = model.dense_generate(prompt, 6)
    assert all(s.token_ids == want for s in out.samples)


def test_seeded_sampling_is_reproducible_even_under_preemption(model):
    ps = prompts(8, seed=9)
    params = pnp.SamplingParams(max_tokens=10, temperature=0.8, top_k=20, top_p=0.9,
                                seed=1234, n=2)
    roomy = pnp.Engine(model, num_pages=128, page_size=4, max_num_seqs=16, backend="numpy")
    tight = pnp.Engine(model, num_pages=12, page_size=4, max_num_seqs=4,
                       max_num_batched_tokens=16, backend="numpy")
    a = roomy.generate(ps, params)
    b = tight.generate(ps, params)
    assert tight.metrics["preemptions"] > 0
    assert [[s.token_ids for s in o.samples] for o in a] == \
        [[s.token_ids for s in o.samples] for o in b]
    other = pnp.SamplingParams(max_tokens=10, temperature=0.8, top_k=20, top_p=0.9,
                               seed=4321, n=2)
    c = roomy.generate(ps, other)
    assert [o.samples[0].token_ids for o in a] != [o.samples[0].token_ids for o in c]


def test_top_k_1_and_tiny_top_p_are_greedy(model):
    ps = prompts(3, seed=1)
    want = [model.dense_generate(p, 8) for p in ps]
    engine = pnp.Engine(model, num_pages=64, page_size=4, backend="numpy")
    for params in (pnp.SamplingParams(max_tokens=8, top_k=1, seed=0),
                   pnp.SamplingParams(max_tokens=8, top_p=1e-9, seed=0)):
        assert [o.token_ids for o in engine.generate(ps, params)] == want


def test_stop_token_ends_a_sample(model):
    prompt = [5, 6, 7]
    ref = model.dense_generate(prompt, 10)
    engine = pnp.Engine(model, num_pages=16, page_size=4, backend="numpy")
    (out,) = engine.generate([prompt], pnp.SamplingParams(max_tokens=10, temperature=0,
                                                          stop_token_ids=[ref[3]]))
    stop = ref.index(ref[3])
    assert out.token_ids == ref[:stop + 1] and out.finish_reason == "stop"


def test_a_prompt_that_never_fits_fails_alone(model):
    ps = prompts(5, seed=2)
    huge = list(range(100)) * 2                                  # 200 tokens > 16 * 4 slots
    engine = pnp.Engine(model, num_pages=16, page_size=4, backend="numpy")
    outs = engine.generate(ps[:2] + [huge] + ps[2:], GREEDY)
    assert outs[2].finish_reason == "error" and outs[2].token_ids == []
    assert "never fit" in outs[2].error and "num_pages=16" in outs[2].error
    others = [o for i, o in enumerate(outs) if i != 2]
    assert [o.token_ids for o in others] == [model.dense_generate(p, 12) for p in ps]


def test_a_sequence_that_outgrows_the_cache_fails_alone(model):
    long_prompt = list(range(50))                                # fits in 64 slots...
    engine = pnp.Engine(model, num_pages=16, page_size=4, backend="numpy")
    outs = engine.generate([long_prompt, [1, 2, 3]],
                           pnp.SamplingParams(max_tokens=30, temperature=0))
    assert outs[0].finish_reason == "error" and "cannot fit" in outs[0].error
    assert outs[0].token_ids == model.dense_generate(long_prompt, 15)  # ...until it is full
    assert outs[1].token_ids == model.dense_generate([1, 2, 3], 30)
    engine.cache.check_invariants()


def test_abort_frees_pages(model):
    engine = pnp.Engine(model, num_pages=32, page_size=4, backend="numpy")
    a = engine.add_request(list(range(30)), GREEDY)
    b = engine.add_request(list(range(10)), GREEDY)
    engine.step()
    engine.step()
    in_use = engine.cache.stats()["num_in_use"]
    engine.abort(a)
    assert engine.cache.stats()["num_in_use"] < in_use
    done = []
    while engine.has_unfinished_requests():
        done += engine.step()
    assert {o.request_id: o.finish_reason for o in done} == {a: "abort", b: "length"}
    assert engine.cache.stats()["num_in_use"] == 0
    with pytest.raises(pnp.UnknownRequest, match="request_id"):
        engine.abort(a)


def test_metrics_series_has_one_entry_per_step(model):
    engine = pnp.Engine(model, num_pages=16, page_size=4, max_num_seqs=4, backend="numpy")
    engine.generate(prompts(6, seed=4), GREEDY)
    m = engine.metrics
    for key in ("running", "waiting", "num_free", "num_cached", "num_in_use"):
        assert len(m["series"][key]) == m["steps"]
    s = m["series"]
    assert all(f + c + u == 16 for f, c, u in zip(s["num_free"], s["num_cached"],
                                                  s["num_in_use"]))
    assert max(s["running"]) <= 4 and m["generated_tokens"] == 6 * 12
    assert m["schedule_s"] > 0 and m["model_s"] > 0 and m["tokens_per_s"] > 0


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_tokens=0), "max_tokens"), (dict(temperature=-1.0), "temperature"),
    (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(top_k=-2), "top_k"),
    (dict(n=0), "n"), (dict(seed=-1), "seed"), (dict(stop_token_ids=[-3]), "stop_token_ids"),
    (dict(temperature=float("nan")), "temperature"),
])
def test_invalid_sampling_params(kwargs, match):
    with pytest.raises(pnp.InvalidArgument, match=match):
        pnp.SamplingParams(**kwargs)


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_tokens=1.5), "max_tokens"), (dict(n="2"), "n"), (dict(top_p="x"), "top_p"),
    (dict(stop_token_ids=3), "stop_token_ids"),
])
def test_sampling_params_of_the_wrong_type(kwargs, match):
    with pytest.raises(pnp.DTypeError, match=match):
        pnp.SamplingParams(**kwargs)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(num_pages=0), pnp.InvalidArgument, "num_pages"),
    (dict(page_size=0), pnp.InvalidArgument, "page_size"),
    (dict(max_num_seqs=0), pnp.InvalidArgument, "max_num_seqs"),
    (dict(max_num_batched_tokens=0), pnp.InvalidArgument, "max_num_batched_tokens"),
    (dict(preemption_mode="drop"), pnp.InvalidArgument, "preemption_mode"),
    (dict(backend="tpu"), pnp.InvalidArgument, "backend"),
    (dict(eviction_policy="mru"), pnp.InvalidArgument, "eviction_policy"),
    (dict(swap_pages=-1), pnp.InvalidArgument, "swap_pages"),
    (dict(num_pages=2.0), pnp.DTypeError, "num_pages"),
])
def test_invalid_engine_args(model, kwargs, error, match):
    args = dict(num_pages=8, page_size=4)
    with pytest.raises(error, match=match):
        pnp.Engine(model, **{**args, **kwargs})


def test_invalid_requests(model):
    engine = pnp.Engine(model, num_pages=8, page_size=4, max_num_seqs=2, backend="numpy")
    with pytest.raises(pnp.DTypeError, match="model"):
        pnp.Engine("llama", num_pages=8)
    with pytest.raises(pnp.InvalidArgument, match="prompt"):
        engine.add_request([])
    with pytest.raises(pnp.InvalidArgument, match="prompt"):
        engine.add_request([1, -2])
    with pytest.raises(pnp.InvalidArgument, match="vocabulary"):
        engine.add_request([1, 1000])
    with pytest.raises(pnp.InvalidArgument, match="max_num_seqs"):
        engine.add_request([1, 2], pnp.SamplingParams(n=3))
    with pytest.raises(pnp.DTypeError, match="params"):
        engine.add_request([1, 2], {"max_tokens": 3})
    engine.add_request([1, 2], request_id="x")
    with pytest.raises(pnp.InvalidArgument, match="request_id"):
        engine.add_request([1, 2], request_id="x")
    with pytest.raises(pnp.InvalidArgument, match="params"):
        engine.generate([[1], [2]], [GREEDY])
    assert np.all(engine.cache.block_table is not None)


# ------------------------------------------------------------------ one config, ask first
def test_engine_takes_a_config_and_options_replace_its_fields(model):
    cfg = pnp.EngineConfig(num_pages=24, page_size=8, max_num_seqs=3, backend="numpy")
    engine = pnp.Engine(model, cfg, schedule="lpm")
    assert engine.config == dataclasses.replace(cfg, schedule="lpm")
    assert (engine.cache.cfg.num_pages, engine.cache.cfg.page_size) == (24, 8)
    assert engine.scheduler.max_num_seqs == 3 and engine.scheduler.config.schedule == "lpm"
    with pytest.raises(pnp.InvalidArgument, match="unknown engine option"):
        pnp.Engine(model, num_pages=8, max_seqs=2)


def test_the_scheduler_never_catches_out_of_pages():
    """It asks the cache (can_allocate) instead: OutOfPages is an error for callers only."""
    import paged_np.engine.scheduler as scheduler

    src = inspect.getsource(scheduler)
    assert "except OutOfPages" not in src and "OutOfPages" not in src
    assert "can_allocate" in src


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_no_allocation_when_the_cache_says_no(model, mode, monkeypatch):
    """allocate_slots runs only after can_allocate said yes for at least those tokens."""
    engine = pnp.Engine(model, num_pages=14, page_size=4, max_num_seqs=6,
                        max_num_batched_tokens=40, backend="numpy", preemption_mode=mode)
    cache, said = engine.cache, {}
    real_can, real_alloc = cache.can_allocate, cache.allocate_slots

    def can_allocate(seq_id, n):
        said[seq_id] = real_can(seq_id, n) and n
        return bool(said[seq_id])

    def allocate_slots(seq_id, n):                 # (a swap-in takes its share first)
        assert said.get(seq_id, 0) >= n, f"allocate_slots({seq_id}, {n}) without asking"
        said[seq_id] -= n
        return real_alloc(seq_id, n)

    monkeypatch.setattr(cache, "can_allocate", can_allocate)
    monkeypatch.setattr(cache, "allocate_slots", allocate_slots)
    ps = prompts(10, seed=5)
    outs = engine.generate(ps, pnp.SamplingParams(max_tokens=12, temperature=0.0))
    assert engine.metrics["preemptions"] > 0                  # pages did run out
    assert (engine.metrics["swapped_in"] > 0) == (mode == "swap")
    for p, o in zip(ps, outs):
        assert o.token_ids == model.dense_generate(p, max_tokens=12)
    # A cache that always says no: nothing is allocated; the request fails, it does not raise.
    monkeypatch.setattr(cache, "can_allocate", lambda seq_id, n: False)
    out = engine.generate([[1, 2, 3]], pnp.SamplingParams(max_tokens=2))[0]
    assert out.finish_reason == "error" and "cannot fit" in out.error
    assert engine.cache.stats()["num_in_use"] == 0
