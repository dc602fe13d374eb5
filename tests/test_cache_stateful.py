"""Hypothesis drives random operation sequences through PagedKVCache.

After every step: ``check_invariants()`` holds, pages are conserved, every live
sequence reads back exactly the K/V it wrote (nothing evicted or overwritten
under it; copy-on-write isolates forks), a page is in two block tables only
when a fork or a prefix hit put it there, and every eviction picked the page
a plain-list model of the policy predicts.
"""

import numpy as np
from cache_helpers import expected_kv, extend, read_kv, small_cache
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import paged_np as pnp

# A small vocabulary makes shared prefixes (and so prefix hits) common.
prompts = st.lists(st.integers(0, 3), min_size=1, max_size=14)
NUM_PAGES = 10


class PolicyModel:
    """The eviction order as a plain list, rebuilt from first principles.

    LRU: by the time a page was last released or touched. FIFO: by the time it
    was first cached (hits and touches change nothing). LFU: by prefix hits,
    then like LRU. O(n) per step, which is fine for a model.
    """

    def __init__(self, policy):
        self.policy = policy
        self.t = 0
        self.last = {}    # cached page -> time released or touched
        self.first = {}   # page -> time first cached (until evicted)
        self.hits = {}    # page -> prefix hits (until evicted)

    def victim(self):
        key = {"lru": lambda p: self.last[p],
               "fifo": lambda p: self.first[p],
               "lfu": lambda p: (self.hits.get(p, 0), self.last[p])}[self.policy]
        return min(self.last, key=key)

    def on_event(self, kind, page):
        self.t += 1
        if kind == "cache":
            self.last[page] = self.t
            self.first.setdefault(page, self.t)
        elif kind == "hit":
            self.last.pop(page, None)
            self.hits[page] = self.hits.get(page, 0) + 1
        elif kind == "evict":
            expected = self.victim()
            assert page == expected, f"{self.policy} evicted {page}, the model says {expected}"
            del self.last[page]
            self.first.pop(page, None)
            self.hits.pop(page, None)
        elif kind == "free":  # contents dropped
            self.first.pop(page, None)
            self.hits.pop(page, None)

    def on_touch(self, page):
        self.t += 1
        self.last[page] = self.t


class CacheMachine(RuleBasedStateMachine):
    policy = "lru"

    def __init__(self):
        super().__init__()
        self.cache = small_cache(num_pages=NUM_PAGES, page_size=3, num_layers=2,
                                 num_kv_heads=1, head_dim=4, policy=self.policy)
        self.model = PolicyModel(self.policy)
        # Wrap the cache's own listener on the pool and on the index (evictions).
        self.cache.pool.listener = self.cache.prefix_index.listener = self._listen
        self.next_id = 0
        self.family = {}  # seq id -> id of the fork root it descends from

    def _listen(self, kind, page, seq_id):
        self.model.on_event(kind, page)
        self.cache._log(kind, page, seq_id)

    def live(self):
        return self.cache.seq_ids

    def _new_id(self):
        self.next_id += 1
        return f"s{self.next_id}"

    @rule(prompt=prompts)
    def add(self, prompt):
        sid = self._new_id()
        n_hit = self.cache.add_sequence(sid, prompt)
        assert n_hit % 3 == 0 and n_hit <= len(prompt) - 1
        assert self.cache.sequence(sid).token_ids == prompt[:n_hit]
        self.family[sid] = sid
        try:
            extend(self.cache, sid, prompt[n_hit:])
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
        except (pnp.OutOfPages, pnp.InvalidArgument):  # no room now / ever: refused
            assert self.cache.stats() == before

    @precondition(lambda self: self.live())
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(self.live()))
        child = self._new_id()
        self.cache.fork(parent, child)
        self.family[child] = self.family[parent]

    @precondition(lambda self: self.live())
    @rule(data=st.data())
    def free(self, data):
        self.cache.free(data.draw(st.sampled_from(self.live())))

    @precondition(lambda self: self.cache.pool.num_cached)
    @rule(data=st.data())
    def mark_used(self, data):
        page = data.draw(st.sampled_from(self.cache.pool.eviction_order()))
        self.cache.mark_used(page)
        self.model.on_touch(page)

    @rule()
    def batch(self):
        ids = self.live()
        b = self.cache.batch(ids)
        indptr, indices, last = b.to_csr()
        assert indptr[-1] == len(indices)
        for i, s in enumerate(ids):
            np.testing.assert_array_equal(indices[indptr[i]:indptr[i + 1]],
                                          self.cache.block_table(s))

    @invariant()
    def consistent(self):
        self.cache.check_invariants()
        s = self.cache.stats()
        assert s["num_free"] + s["num_cached"] + s["num_in_use"] == NUM_PAGES
        assert sorted(self.cache.pool.eviction_order()) == sorted(self.model.last)

    @invariant()
    def shared_pages_come_from_forks_or_prefix_hits(self):
        holders = {}
        for sid in self.live():
            for p in self.cache.sequence(sid).block_table:
                holders.setdefault(p, []).append(sid)
        for p, sids in holders.items():
            if len(sids) > 1:
                indexed = self.cache.prefix_index.page_hash(p) is not None
                one_family = len({self.family[s] for s in sids}) == 1
                assert indexed or one_family, f"page {p} shared by {sids} without a reason"

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


_settings = settings(max_examples=60, stateful_step_count=50, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])
TestLRU = CacheMachine.TestCase
TestLRU.settings = _settings
TestFIFO = FIFOMachine.TestCase
TestFIFO.settings = _settings
TestLFU = LFUMachine.TestCase
TestLFU.settings = _settings
