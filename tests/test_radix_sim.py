"""The prefix-cache simulation and the admission order it shares with the engine."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from paged_np.registry import SCHEDULES
from paged_np.sim import prefix, workloads
from paged_np.sim.simulate import max_reusable_fraction


@pytest.mark.parametrize("prefix_cache", ["hash", "radix"])
@pytest.mark.parametrize("page_size", [1, 4])
def test_one_at_a_time_with_room_for_everything_reaches_the_optimal_hit_rate(prefix_cache,
                                                                            page_size):
    trace = workloads.fewshot_trace(np.random.default_rng(0), num_requests=25, num_tasks=3)
    pages = sum(-(-r.total_len // page_size) for r in trace)            # never evicts
    res = prefix.serve(trace, [-1] * len(trace), prefix_cache, "fcfs", pages, page_size,
                       max_running=1)
    assert res["preemptions"] == 0
    assert res["hit_rate"] == pytest.approx(max_reusable_fraction(trace, page_size))


def test_branching_children_wait_for_their_parent():
    trace, parent = workloads.branching_trace(np.random.default_rng(1), num_problems=2, branch=2)
    assert len(trace) == 2 * (2 + 4)
    for i, p in enumerate(parent):
        if p >= 0:
            r, q = trace[i], trace[p]
            base = np.concatenate([q.prompt, q.output])
            np.testing.assert_array_equal(r.prompt[:len(base)], base)


@pytest.mark.parametrize("schedule", ["fcfs", "lpm"])
def test_small_cache_run_keeps_the_cache_consistent(schedule):
    trace, parent = workloads.branching_trace(np.random.default_rng(2), num_problems=3)
    for pc in ("hash", "radix"):
        res = prefix.serve(trace, parent, pc, schedule, num_pages=60, page_size=16)
        assert 0 < res["hit_rate"] <= max_reusable_fraction(trace, 16) + 1e-12
        assert res["prefill_tokens"] >= (1 - res["hit_rate"]) * res["prompt_tokens"] - 1e-9


STORED = Path(__file__).resolve().parents[1] / "benchmarks" / "prefix_cache.json"


def test_engine_run_gives_the_stored_rows():
    """Served by the engine (its post-processing included), the few-shot trace at page 16
    and a quarter of its distinct tokens gives the committed rows exactly, preemptions
    included, for both indexes and both schedules."""
    stored = [r for r in json.loads(STORED.read_text())["rows"]
              if (r["workload"], r["page_size"], r["cache_fraction"]) == ("fewshot", 16, 0.25)]
    assert len(stored) == 4 and any(r["preemptions"] for r in stored)
    trace, parent = prefix.make_traces(0)["fewshot"]
    for row in stored:
        res = prefix.serve(trace, parent, row["prefix_cache"], row["schedule"],
                           row["cache_pages"], 16)
        assert {k: row[k] for k in res} == res, (row["prefix_cache"], row["schedule"])


def test_report_of_the_stored_json_is_the_stored_table():
    """The table's columns come from the results (not the registries of the day)."""
    table = prefix.report(json.loads(STORED.read_text()))
    assert table.strip() == STORED.with_name("prefix_cache_table.md").read_text().strip()


def admission_order(n, schedule, *args, **kw):
    return SCHEDULES.load(schedule)(n, *args, **kw)


def test_admission_order_fcfs_lpm_and_starvation():
    plen = [0, 30, 10, 30, 5]
    skipped = [0, 0, 0, 0, 0]
    assert admission_order(5, "fcfs", plen.__getitem__, skipped.__getitem__) == [0, 1, 2, 3, 4]
    assert admission_order(5, "lpm", plen.__getitem__, skipped.__getitem__) == [1, 3, 2, 4, 0]
    skipped = [40, 0, 0, 0, 50]                     # 0 and 4 were passed over too often
    assert admission_order(5, "lpm", plen.__getitem__, skipped.__getitem__,
                           max_skips=32) == [0, 4, 1, 3, 2]
    # Only the head of a long queue is ranked; the rest follow in arrival order.
    assert admission_order(5, "lpm", plen.__getitem__, ([0] * 5).__getitem__,
                           window=2) == [1, 0, 2, 3, 4]
