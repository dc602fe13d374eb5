"""Helpers for the reliability tests: engine consistency checks and fault injection.

- :func:`assert_engine_consistent` checks, between two steps (also right after a
  step that raised), that the engine's records and the cache agree: the cache
  holds exactly the running sequences, each with the tokens the engine thinks
  are computed, no page is held by nobody, the swap space adds up.
- :func:`assert_nothing_held` is the end-of-run check: zero pages in use.
- :class:`Faults` wraps a function so that chosen calls raise :class:`InjectedFault`.
"""

from __future__ import annotations

import numpy as np

from paged_np.engine.request import RUNNING, SWAPPED, WAITING


class InjectedFault(RuntimeError):
    """The error a :class:`Faults` wrapper raises (never raised by paged_np itself)."""


class Faults:
    """Make calls of a function fail: at the given call numbers, or at random.

    ``Faults(fn, at={3, 7})`` raises on the 3rd and 7th call (1-based);
    ``Faults(fn, p=0.2, seed=1)`` raises on each call with probability 0.2.
    ``armed`` turns injection off without unwrapping.
    """

    def __init__(self, fn, at=(), p=0.0, seed=0):
        self.fn, self.at, self.p = fn, set(at), p
        self.rng = np.random.default_rng(seed)
        self.calls = 0
        self.raised = 0
        self.armed = True

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.armed and (self.calls in self.at or (self.p and self.rng.random() < self.p)):
            self.raised += 1
            raise InjectedFault(f"injected fault on call {self.calls}")
        return self.fn(*args, **kwargs)


def assert_engine_consistent(engine) -> None:
    """The engine's queues, its requests and the cache tell the same story."""
    cache, sched = engine.cache, engine.scheduler
    cache.check_invariants()                    # ref counts == holders, conservation, ...
    running = {s.seq_id: s for s in sched.running}
    waiting = list(sched.waiting)
    assert len(running) == len(sched.running), "a sequence runs twice"
    assert set(cache.seq_ids) == set(running), (
        f"cache holds {sorted(map(str, cache.seq_ids))} but the running sequences are "
        f"{sorted(map(str, running))}: an orphan (leaked) or a missing sequence")
    for s in sched.running:
        assert s.status == RUNNING, f"running seq {s.seq_id} has status {s.status}"
        assert cache.num_computed_tokens(s.seq_id) == s.num_computed_tokens, (
            f"seq {s.seq_id}: cache has {cache.num_computed_tokens(s.seq_id)} tokens, "
            f"engine thinks "
            f"{s.num_computed_tokens} are computed")
        assert s.num_computed_tokens <= s.num_tokens
    for s in waiting:
        assert s.status in (WAITING, SWAPPED), f"waiting seq {s.seq_id} has status {s.status}"
        assert s.seq_id not in running
        assert (s.swap_pages is not None) == (s.status == SWAPPED)
        assert s.seq is None, f"waiting seq {s.seq_id} still points into the cache"
    if sched.swap is not None:
        held = sum(len(s.swap_pages) for s in waiting if s.swap_pages is not None)
        assert sched.swap.num_free + held == sched.swap.data.shape[2], "swap pages leaked"
    live = {id(s.parent) for s in sched.running} | {id(s.parent) for s in waiting}
    assert live <= {id(r) for r in engine.requests.values()}, "a finished request still runs"
    for req in engine.requests.values():
        assert not req.output.finished, f"request {req.request_id} finished but still listed"


def assert_nothing_held(engine) -> None:
    """After every request finished or was aborted: zero leaked pages."""
    assert_engine_consistent(engine)
    stats = engine.cache.stats()
    assert stats["num_in_use"] == 0, f"{stats['num_in_use']} pages leaked"
    assert stats["num_sequences"] == 0
    assert stats["num_free"] + stats["num_cached"] == stats["num_pages"]
    assert not engine.scheduler.running and not engine.scheduler.waiting
    assert not engine.requests
