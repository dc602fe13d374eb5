"""The serving simulation: accounting on hand-computed traces, sharing savings of
tiny forks, prefix-cache hit rates against an independent trie, determinism."""

import json
from pathlib import Path

import numpy as np
import pytest

from paged_np.cli import simulate as simulate_cli
from paged_np.errors import InvalidArgument
from paged_np.registry import EVICTION_POLICIES
from paged_np.sim import simulate as sim
from paged_np.sim import workloads as wl
from paged_np.sim.contiguous import FirstFit, reserve_size
from paged_np.sim.workloads import Request


def req(i, p, o, first=0):
    """A request with prompt length p and output length o; distinct tokens per request."""
    base = 1000 * i + first
    return Request(i, np.arange(base, base + p, dtype=np.int64),
                   np.arange(base + 500, base + 500 + o, dtype=np.int64))


# --------------------------------------------------------------------------- contiguous
def test_first_fit_splits_fills_and_merges_holes():
    a = FirstFit(10)
    assert a.allocate(4) == 0 and a.allocate(4) == 4
    a.free(0, 4)
    assert a.allocate(5) is None  # 6 slots free, but in holes of 4 and 2
    assert a.allocate(3) == 0  # first fit: the leftmost hole
    a.free(0, 3)
    a.free(4, 4)  # merges with [0, 4) and [8, 10)
    assert (a.starts, a.lens, a.used) == ([0], [10], 0)
    assert a.allocate(10) == 0


def test_reserve_sizes():
    assert [reserve_size(n, "orca_max", 2048) for n in (1, 300, 2048)] == [2048] * 3
    assert [reserve_size(n, "orca_pow2", 2048) for n in (1, 2, 3, 300, 1024, 1025)] == [
        1, 2, 4, 512, 1024, 2048]
    assert reserve_size(300, "orca_oracle") == 300
    with pytest.raises(InvalidArgument, match="scheme"):
        reserve_size(3, "buddy")


def test_orca_max_breakdown_by_hand():
    # 10 slots, max length 8: one request at a time; C keeps the queue non-empty.
    # A (P=2, O=3): steps 1-3 hold ctx 3, 4, 5 of final 5 in 8 reserved slots;
    # B (P=1, O=2): steps 4-5 hold ctx 2, 3 of final 3; C is admitted at step 6.
    reqs = [req(0, 2, 3), req(1, 1, 2), req(2, 1, 1)]
    r = sim.serve_contiguous(reqs, "orca_max", num_slots=10, max_len=8)
    assert r["measured_steps"] == 5
    assert r["token_states"] == pytest.approx((3 + 4 + 5 + 2 + 3) / 50)
    assert r["reservation"] == pytest.approx((2 + 1 + 0 + 1 + 0) / 50)
    assert r["internal_frag"] == pytest.approx((3 + 3 + 3 + 5 + 5) / 50)
    assert r["external_frag"] == pytest.approx(10 / 50)
    assert r["batch_size"] == 1.0


def test_orca_oracle_breakdown_by_hand():
    # 9 slots: A (5) and B (3) fit, C (2) waits for B's range.
    reqs = [req(0, 2, 3), req(1, 1, 2), req(2, 1, 1)]
    r = sim.serve_contiguous(reqs, "orca_oracle", num_slots=9)
    assert r["measured_steps"] == 2
    assert r["token_states"] == pytest.approx((5 + 7) / 18)  # (3+2), (4+3)
    assert r["reservation"] == pytest.approx((3 + 1) / 18)
    assert r["internal_frag"] == 0.0
    assert r["external_frag"] == pytest.approx(2 / 18)
    assert r["batch_size"] == 2.0


# --------------------------------------------------------------------------- paged
def test_paged_breakdown_by_hand():
    # 4 pages of 4 slots, no watermark. A (P=5, O=2, final 7) and B (P=6, O=2,
    # final 8) take 2 pages each; C waits. Step 1: ctx 6 and 7; step 2: 7 and 8.
    # Last-page slack up to the final length is reservation, beyond it internal.
    reqs = [req(0, 5, 2), req(1, 6, 2), req(2, 3, 1)]
    r = sim.serve_paged(reqs, page_size=4, num_slots=16, watermark=0.0)
    assert r["measured_steps"] == 2
    assert r["token_states"] == pytest.approx((13 + 15) / 32)
    assert r["reservation"] == pytest.approx((2 + 0) / 32)
    assert r["internal_frag"] == pytest.approx((1 + 1) / 32)
    assert r["external_frag"] == 0.0
    assert r["batch_size"] == 2.0
    assert r["preemptions"] == 0


def test_paged_preempts_the_last_admitted_and_finishes_everything():
    # Two requests of final length 9 (3 pages each) in 4 pages: at ctx 9 one must go.
    reqs = [req(0, 3, 6), req(1, 3, 6)]
    r = sim.serve_paged(reqs, page_size=4, num_slots=16, watermark=0.0)
    assert r["preemptions"] == 1
    with pytest.raises(InvalidArgument, match="does not fit"):
        sim.serve_paged([req(0, 30, 5)], page_size=4, num_slots=16, watermark=0.0)


STORED = Path(__file__).resolve().parents[1] / "benchmarks" / "simulate_vllm_paper.json"


def test_paged_headline_is_the_stored_figure():
    """The engine's Scheduler reproduces the paper figure in the committed JSON exactly:
    ShareGPT-like, 1000 requests, seed 0, page 16 (its time-averaged shares, mean batch,
    measured steps and preemptions)."""
    stored = json.loads(STORED.read_text())
    trace = wl.sample_requests(wl.SHAREGPT, 1000, np.random.default_rng([0, 0]))
    assert wl.DATASETS["sharegpt"] is wl.SHAREGPT and list(wl.DATASETS)[0] == "sharegpt"
    assert sim.serve_paged(trace, 16) == stored["memory_breakdown"]["paged"]


@pytest.mark.slow
def test_full_run_is_the_stored_json():
    """``simulate --seed 0`` (the full run) gives every number of the committed JSON."""
    stored = json.loads(STORED.read_text())
    res = json.loads(json.dumps(sim.run(0, quick=False, progress=False)))
    for key, want in stored.items():
        if key == "config":       # the JSON predates the kv_cache_dtype entry
            assert want.items() <= res[key].items()
        else:
            assert res[key] == want, key


@pytest.mark.parametrize("scheme", sim.SCHEMES)
def test_categories_sum_to_one(scheme):
    reqs = wl.sample_requests(wl.SHAREGPT, 80, np.random.default_rng(0))
    for r in (sim.serve_contiguous(reqs, scheme), sim.serve_paged(reqs, 16)):
        assert sum(r[c] for c in sim.CATEGORIES) == pytest.approx(1.0)
        assert min(r[c] for c in sim.CATEGORIES) >= 0.0


# --------------------------------------------------------------------------- sharing
def test_parallel_sampling_savings_by_hand():
    # P=6, page 4: pages [0-3] full, [4-5] half. After the fork both samples
    # write: the first copies the half page (copy-on-write), the second writes
    # in place: 3 pages in use at both steps, against 2 * 2 without sharing.
    assert sim.parallel_sampling_pages([req(0, 6, 2)], 2, 4) == (6, 8)
    assert sim.savings((6, 8)) == 0.25
    # n = 1 shares nothing.
    s, u = sim.parallel_sampling_pages([req(0, 6, 2)], 1, 4)
    assert s == u


def test_beam_search_savings_by_hand(monkeypatch):
    # Width 2, P=4 (one full page). Step 0: both beams extend the prompt, each
    # opens its own page. Step 1: both extend beam 0 (beam 1 is pruned): one
    # copies beam 0's shared last page. 3 pages in use each step, 4 unshared.
    tree = (np.array([[0, 0], [0, 0]]), np.array([[1, 2], [3, 4]]))
    monkeypatch.setattr(wl, "beam_search_tree", lambda *a, **k: tree)
    assert sim.beam_search_pages([req(0, 4, 2)], 2, 4, np.random.default_rng(0)) == (6, 8)


def test_beam_search_shares_more_than_parallel_sampling():
    reqs = wl.sample_requests(wl.ALPACA, 10, np.random.default_rng(0))
    par = sim.savings(sim.parallel_sampling_pages(reqs, 4, 16))
    beam = sim.savings(sim.beam_search_pages(reqs, 4, 16, np.random.default_rng(1), 0.25))
    assert 0 < par < beam < 0.75  # 0.75 = 1 - 1/4: at most one copy of four


# --------------------------------------------------------------------------- prefix caching
def test_hit_rate_of_a_two_turn_chat_by_hand():
    # Turn 1 writes 9 + 3 = 12 tokens: 3 full pages of 4. Turn 2's prompt is those 12
    # tokens + 2 more: it reuses all 3 pages. 12 of 9 + 14 prompt tokens.
    t1 = req(0, 9, 3)
    t2 = Request(1, np.concatenate([t1.prompt, t1.output, [7, 8]]), np.array([9]))
    assert sim.max_reusable_fraction([t1, t2], 4) == pytest.approx(12 / 23)
    for policy in EVICTION_POLICIES:
        for pages in (4, 100):  # 4: exactly enough for turn 2 to keep its 3 hits
            assert sim.hit_rate([t1, t2], policy, pages, 4) == pytest.approx(12 / 23)


def test_hit_rate_curves_reach_the_trace_maximum():
    trace = wl.chat_trace(np.random.default_rng(0), num_conversations=10)
    sizes = sim.cache_sizes(trace, 16, 4)
    best = sim.max_reusable_fraction(trace, 16)
    assert 0.3 < best < 1.0
    for policy in EVICTION_POLICIES:
        curve = [sim.hit_rate(trace, policy, s, 16) for s in sizes]
        assert curve[-1] == pytest.approx(best)  # big enough for everything
        assert curve[0] <= curve[-1] and max(curve) <= best + 1e-12


# --------------------------------------------------------------------------- the whole run
TINY = dict(requests=60, page_sizes=(16,), sharing_requests=3, conversations=5, fewshot=15,
            points=3)


@pytest.fixture(scope="module")
def tiny_runs():
    saved = sim.SIZES[True]
    sim.SIZES[True] = TINY
    try:
        yield [sim.run(seed, quick=True, progress=False) for seed in (5, 5, 6)]
    finally:
        sim.SIZES[True] = saved


def test_run_is_deterministic_for_a_seed(tiny_runs):
    a, b, c = (json.dumps(r, sort_keys=True) for r in tiny_runs)
    assert a == b
    assert a != c


def test_json_schema(tiny_runs):
    res = json.loads(json.dumps(tiny_runs[0]))  # survives JSON
    for scheme in ("orca_max", "orca_pow2", "orca_oracle", "paged"):
        for c in ("token_states", "reservation", "internal_frag", "external_frag"):
            assert 0.0 <= res["memory_breakdown"][scheme][c] <= 1.0
    for kind in ("parallel_sampling", "beam_search"):
        assert 0.0 < res["sharing_savings"][kind] < 1.0
    for policy in ("lru", "fifo", "lfu"):
        curve = res["policies"][policy]
        assert curve and all(set(p) == {"cache_pages", "hit_rate"} for p in curve)
        assert [p["cache_pages"] for p in curve] == sorted(p["cache_pages"] for p in curve)


def test_main_writes_json_and_plot(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sim.SIZES, True, TINY)
    js, png = tmp_path / "r.json", tmp_path / "r.png"
    assert simulate_cli.main(["--quick", "--seed", "1", "--json", str(js), "--plot", str(png)]) == 0
    assert "memory breakdown" in capsys.readouterr().out
    assert json.loads(js.read_text())["seed"] == 1
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
