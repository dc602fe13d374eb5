"""Cache-aware scheduling: Engine(schedule="lpm") admits the longest cached prefix first."""

from __future__ import annotations

import pytest
from engine_helpers import prompts, tiny_model

import paged_np as pnp

GREEDY = pnp.SamplingParams(max_tokens=6, temperature=0.0)


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def finish_order(engine, ps, params=GREEDY):
    order = []
    outs = engine.generate(ps, params, progress=lambda o: order.append(o.request_id))
    return outs, order


@pytest.mark.parametrize("prefix_cache", ["hash", "radix"])
def test_lpm_admits_the_longest_cached_prefix_first(model, prefix_cache):
    system = list(range(1, 33))                        # 8 pages of 4
    warm = system + [90, 91]
    lone = [50 + i for i in range(30)]                 # nothing of it is cached
    shared = system + [70, 71, 72]
    orders = {}
    for schedule in ("fcfs", "lpm"):
        engine = pnp.Engine(model, num_pages=64, page_size=4, max_num_seqs=1, backend="numpy",
                            prefix_cache=prefix_cache, schedule=schedule)
        engine.generate([warm], GREEDY)                # caches the system prompt
        outs, orders[schedule] = finish_order(engine, [lone, shared])
        assert [o.token_ids for o in outs] == [model.dense_generate(p, 6) for p in (lone, shared)]
    assert orders["fcfs"] == ["req-1", "req-2"]        # arrival order
    assert orders["lpm"] == ["req-2", "req-1"]         # the cached system prompt goes first


def test_lpm_starvation_is_bounded(model):
    system = list(range(1, 33))
    lone = [50 + i for i in range(30)]
    many = [system + [60 + i, 61, 62] for i in range(8)]
    engine = pnp.Engine(model, num_pages=64, page_size=4, max_num_seqs=1, backend="numpy",
                        prefix_cache="radix", schedule="lpm")
    engine.generate([system + [90]], GREEDY)           # caches the system prompt
    engine.scheduler.max_skips = 2
    _, order = finish_order(engine, [lone] + many)
    # Without the bound the lone prompt would run last; with it, after 3 admissions at most.
    assert order.index("req-1") <= 3, order
    engine.scheduler.max_skips = 10**9
    _, order = finish_order(engine, [lone] + many)
    assert order[-1] == "req-10", order                # unbounded ranking starves it


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("prefix_cache", ["hash", "radix"])
def test_lpm_greedy_equals_dense_under_preemption(model, mode, prefix_cache):
    ps = prompts(14, seed=3, system=list(range(40, 60)))
    params = pnp.SamplingParams(max_tokens=12, temperature=0.0)
    want = [model.dense_generate(p, params.max_tokens) for p in ps]
    engine = pnp.Engine(model, num_pages=18, page_size=4, max_num_seqs=6,
                        max_num_batched_tokens=40, preemption_mode=mode, backend="numpy",
                        prefix_cache=prefix_cache, schedule="lpm")
    outs = engine.generate(ps, params)
    assert [o.token_ids for o in outs] == want
    assert engine.metrics["preemptions"] > 0
    engine.cache.check_invariants()
    assert engine.cache.stats()["num_in_use"] == 0


def test_bad_schedule_is_refused_by_name(model):
    with pytest.raises(pnp.InvalidArgument, match="schedule"):
        pnp.Engine(model, num_pages=8, page_size=4, backend="numpy", schedule="sjf")
