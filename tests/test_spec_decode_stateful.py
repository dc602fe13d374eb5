"""Rollback leaves no trace: hypothesis drives speculative steps through the cache.

Each speculative step is what the engine does with drafts: allocate slots for an
input token and ``k`` drafts, write K/V into all of them, append the input and a
random number of accepted drafts, ``discard_pending``. Rejected drafts use token
ids (>= 100) that no verified token ever has, so a page holding one must never be
found by a lookup. After every step, on both prefix indexes:

- ``check_invariants()`` (ref counts equal the block tables holding each page);
- each sequence holds exactly the pages its verified tokens need, none past them;
- each sequence reads back the K/V of its verified tokens;
- the prefix index serves every full page of each sequence's verified tokens and
  nothing of a rejected path beyond the verified pages.

Forks share pages, so drafting on a fork copies its shared last page (copy-on-write)
before writing; a sliding-window release runs in between.
"""

from __future__ import annotations

import numpy as np
import pytest
from cache_helpers import extend, read_kv, small_cache, token_kv
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

REJECTED = 100        # rejected drafts are >= this; verified tokens are < 4
PAGE_SIZE = 4


def speculate(cache, sid, input_token, accepted, rejected):
    """One engine step with drafts: returns the pages ``discard_pending`` gave back."""
    drafts = list(accepted) + list(rejected)
    start = cache.num_computed_tokens(sid)
    slots = cache.allocate_slots(sid, 1 + len(drafts))
    pos = np.arange(start, start + 1 + len(drafts))
    for layer in range(cache.cfg.num_layers):
        k, v = token_kv(cache, [input_token] + drafts, pos, layer)
        cache.write_kv(layer, slots, k, v)
    cache.append_tokens(sid, [input_token] + list(accepted))
    return cache.discard_pending(sid)


class SpecMachine(RuleBasedStateMachine):
    prefix_cache = "hash"

    def __init__(self):
        super().__init__()
        self.cache = small_cache(num_pages=14, page_size=PAGE_SIZE, num_layers=1,
                                 prefix_cache=self.prefix_cache)
        self.tokens = {}          # sid -> verified tokens (the shadow copy)
        self.next_id = 0

    def live(self):
        return sorted(self.tokens)

    @rule(prompt=st.lists(st.integers(0, 3), min_size=1, max_size=10))
    def add(self, prompt):
        sid, self.next_id = self.next_id, self.next_id + 1
        n_hit = self.cache.add_sequence(sid, prompt)
        if not self.cache.can_allocate(sid, len(prompt) - n_hit):
            self.cache.free(sid)
            return
        extend(self.cache, sid, prompt[n_hit:])
        self.tokens[sid] = list(prompt)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), k=st.integers(1, 6))
    def speculate(self, data, k):
        sid = data.draw(st.sampled_from(self.live()))
        accepted = data.draw(st.lists(st.integers(0, 3), max_size=k))
        rejected = [REJECTED + i for i in range(k - len(accepted))]
        if not self.cache.can_allocate(sid, 1 + k):
            return
        before, token = self.tokens[sid], data.draw(st.integers(0, 3))
        held = len(self.cache.sequence(sid).block_table)
        freed = speculate(self.cache, sid, token, accepted, rejected)
        self.tokens[sid] = after = before + [token] + accepted
        need = -(-len(after) // PAGE_SIZE)
        grown = -(-(len(before) + 1 + k) // PAGE_SIZE)
        assert freed == max(0, grown - need) and len(self.cache.sequence(sid).block_table) \
            == need >= held
        # The whole path, rejected drafts included, is served only up to its verified pages.
        path = after + rejected + [0]
        assert self.cache.num_cached_prefix_tokens(path) <= len(after) // PAGE_SIZE * PAGE_SIZE

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(self.live()))
        sid, self.next_id = self.next_id, self.next_id + 1
        self.cache.fork(parent, sid)
        self.tokens[sid] = list(self.tokens[parent])

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def free(self, data):
        sid = data.draw(st.sampled_from(self.live()))
        self.cache.free(sid)
        del self.tokens[sid]

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), window=st.integers(1, 9))
    def release_window(self, data, window):
        sid = data.draw(st.sampled_from(self.live()))
        n = self.cache.num_computed_tokens(sid)
        self.cache.release_pages_before(sid, n - window + 1)

    @invariant()
    def rollback_left_no_trace(self):
        cache = self.cache
        cache.check_invariants()
        for sid, toks in self.tokens.items():
            seq = cache.sequence(sid)
            assert seq.token_ids == toks and seq.num_pending == 0
            assert len(seq.block_table) == -(-len(toks) // PAGE_SIZE)   # none past them
            # Every verified full page is found (until an eviction: a page whose twin was
            # indexed first stays out of the index, and the twin may then be evicted).
            full = len(toks) // PAGE_SIZE * PAGE_SIZE
            found = cache.num_cached_prefix_tokens(toks + [0])
            assert found == full if cache.stats()["evictions"] == 0 else found <= full
            if cache.num_released_pages(sid) == 0:
                k, _ = read_kv(cache, sid, 0)
                want, _ = token_kv(cache, toks, np.arange(len(toks)), 0)
                np.testing.assert_array_equal(k, want)


class RadixSpecMachine(SpecMachine):
    prefix_cache = "radix"


SETTINGS = settings(max_examples=60, stateful_step_count=30, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
TestHashRollback = SpecMachine.TestCase
TestHashRollback.settings = SETTINGS
TestRadixRollback = RadixSpecMachine.TestCase
TestRadixRollback.settings = SETTINGS


@pytest.mark.parametrize("prefix_cache", ["hash", "radix"])
def test_rollback_across_a_page_boundary(prefix_cache):
    """6 tokens (pages [0..3], [4..5]); 1 + 5 slots reach position 11, a third page;
    2 drafts accepted: 9 tokens, so the third page (positions 8..11) stays and nothing
    is freed; 0 accepted on the next step frees the fresh fourth page."""
    cache = small_cache(num_pages=8, page_size=4, num_layers=1, prefix_cache=prefix_cache)
    prompt = [1, 2, 3, 1, 2, 3]
    cache.add_sequence("a", prompt)
    extend(cache, "a", prompt)
    assert speculate(cache, "a", 1, [2, 3], [100, 101, 102]) == 0
    assert cache.num_computed_tokens("a") == 9 and len(cache.block_table("a")) == 3
    free_before = cache.stats()["num_free"]
    assert speculate(cache, "a", 1, [], [100, 101, 102, 103]) == 1   # pos 10..14: page 4 back
    assert cache.num_computed_tokens("a") == 10 and len(cache.block_table("a")) == 3
    assert cache.stats()["num_free"] == free_before
    cache.check_invariants()
    toks = prompt + [1, 2, 3, 1]
    assert cache.num_cached_prefix_tokens(toks + [0]) == 8          # two full verified pages
    assert cache.num_cached_prefix_tokens(prompt + [1, 100, 101, 0]) <= 4
    cache.free("a")
    assert cache.stats()["num_in_use"] == 0


def test_rollback_of_a_fork_keeps_its_copy_and_the_parent_intact():
    """A fork drafting into its shared last page copies it first (copy-on-write);
    the rollback keeps the copy, and the parent's page and K/V are untouched."""
    cache = small_cache(num_pages=8, page_size=4, num_layers=1)
    prompt = [1, 2, 3, 1, 2, 3]
    cache.add_sequence("p", prompt)
    extend(cache, "p", prompt)
    cache.fork("p", "c")
    shared = cache.block_table("p")[-1]
    assert speculate(cache, "c", 0, [1], [100, 101, 102, 103]) == 1
    assert cache.block_table("c")[-1] != shared and cache.block_table("p")[-1] == shared
    assert cache.stats()["cow_copies"] == 1 and cache.pool.ref_count(shared) == 1
    cache.check_invariants()
    k, _ = read_kv(cache, "p", 0)
    want, _ = token_kv(cache, prompt, np.arange(6), 0)
    np.testing.assert_array_equal(k, want)
    cache.free("p")
    cache.free("c")
    assert cache.stats()["num_in_use"] == 0


def test_discard_pending_names_an_unknown_sequence():
    import paged_np as pnp

    cache = small_cache()
    with pytest.raises(pnp.UnknownSequence, match="'x'"):
        cache.discard_pending("x")
    cache.add_sequence("a", [1, 2])
    assert cache.discard_pending("a") == 0                          # nothing pending: no-op
