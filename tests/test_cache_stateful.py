"""Hypothesis drives random operation sequences through PagedKVCache.

After every step: ``check_invariants()`` holds, pages are conserved, and every
live sequence reads back exactly the K/V it wrote (nothing evicted or
overwritten under it; copy-on-write isolates forks).
"""

import numpy as np
from cache_helpers import expected_kv, extend, read_kv, small_cache
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import paged_np as pnp

# A small vocabulary makes shared prefixes (and so prefix hits) common.
prompts = st.lists(st.integers(0, 3), min_size=1, max_size=14)


class CacheMachine(RuleBasedStateMachine):
    policy = "lru"

    def __init__(self):
        super().__init__()
        self.cache = small_cache(num_pages=10, page_size=3, num_layers=2, num_kv_heads=1,
                                 head_dim=4, policy=self.policy)
        self.next_id = 0

    def live(self):
        return self.cache.seq_ids

    @rule(prompt=prompts)
    def add(self, prompt):
        sid = f"s{self.next_id}"
        self.next_id += 1
        n_hit = self.cache.add_sequence(sid, prompt)
        assert n_hit % 3 == 0 and n_hit <= len(prompt) - 1
        assert self.cache.sequence(sid).token_ids == prompt[:n_hit]
        rest = prompt[n_hit:]
        try:
            extend(self.cache, sid, rest)
        except pnp.OutOfPages:
            self.cache.free(sid)

    @precondition(lambda self: self.live())
    @rule(data=st.data(), n=st.integers(1, 5))
    def generate(self, data, n):
        sid = data.draw(st.sampled_from(self.live()))
        before = self.cache.stats()
        try:
            extend(self.cache, sid, data.draw(st.lists(st.integers(0, 3), min_size=n,
                                                       max_size=n)))
        except pnp.OutOfPages:
            assert self.cache.stats() == before

    @precondition(lambda self: self.live())
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(self.live()))
        child = f"s{self.next_id}"
        self.next_id += 1
        self.cache.fork(parent, child)

    @precondition(lambda self: self.live())
    @rule(data=st.data())
    def free(self, data):
        self.cache.free(data.draw(st.sampled_from(self.live())))

    @precondition(lambda self: self.cache.pool.num_cached)
    @rule(data=st.data())
    def touch(self, data):
        order = self.cache.pool.eviction_order()
        page = data.draw(st.sampled_from(order))
        self.cache.touch(page)
        if self.policy == "lru":
            assert self.cache.pool.eviction_order()[-1] == page

    @rule()
    def batch(self):
        ids = self.live()
        b = self.cache.batch(ids)
        indptr, indices, last = b.to_csr()
        assert indptr[-1] == len(indices)
        assert all(len(self.cache.block_table(s)) == indptr[i + 1] - indptr[i]
                   for i, s in enumerate(ids))

    @invariant()
    def consistent(self):
        self.cache.check_invariants()
        s = self.cache.stats()
        assert s["num_free"] + s["num_cached"] + s["num_in_use"] == 10

    @invariant()
    def every_live_sequence_reads_its_own_kv(self):
        for sid in self.live():
            for layer in range(2):
                k, v = read_kv(self.cache, sid, layer)
                ek, ev = expected_kv(self.cache, sid, layer)
                np.testing.assert_array_equal(k, ek)
                np.testing.assert_array_equal(v, ev)


class FIFOMachine(CacheMachine):
    policy = "fifo"


class LFUMachine(CacheMachine):
    policy = "lfu"


_settings = settings(max_examples=40, stateful_step_count=30, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])
TestLRU = CacheMachine.TestCase
TestLRU.settings = _settings
TestFIFO = FIFOMachine.TestCase
TestFIFO.settings = _settings
TestLFU = LFUMachine.TestCase
TestLFU.settings = _settings
