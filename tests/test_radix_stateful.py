"""Hypothesis drives the same random operations through a hash-chain cache and a radix cache.

Every live sequence keeps a shadow copy of the K/V it wrote (copied on fork).
After every step, in both caches: ``check_invariants()`` holds, every live
sequence reads back exactly its shadow (nothing live was evicted or
overwritten), and -- while memory has never run short, so that neither cache
has evicted anything -- both reused exactly the same prefix tokens.

A second machine runs the radix cache alone in a tiny arena, where eviction,
edge splits, forks and sliding-window releases happen all the time.
"""

import numpy as np
from cache_helpers import token_kv
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import paged_np as pnp

prompts = st.lists(st.integers(0, 3), min_size=1, max_size=14)   # small vocab: many hits


def make_cache(prefix_cache, num_pages, page_size):
    return pnp.PagedKVCache(pnp.CacheConfig(
        num_pages=num_pages, page_size=page_size, num_layers=2, num_kv_heads=1, head_dim=4,
        prefix_cache=prefix_cache))


class Shadowed:
    """One cache plus the K/V each live sequence wrote, kept outside the arena."""

    def __init__(self, cache):
        self.cache = cache
        self.shadow = {}   # seq id -> [(k, v) per layer], each [num_tokens, Hkv, D]

    def add(self, sid, prompt):
        n_hit = self.cache.add_sequence(sid, prompt)
        # Reused tokens: their K/V must be what this prompt would have written.
        self.shadow[sid] = [token_kv(self.cache, prompt[:n_hit], np.arange(n_hit), layer)
                            for layer in range(2)]
        return n_hit

    def extend(self, sid, token_ids):
        c = self.cache
        start = c.num_computed_tokens(sid)
        slots = c.allocate_slots(sid, len(token_ids))
        pos = np.arange(start, start + len(token_ids))
        for layer in range(2):
            k, v = token_kv(c, token_ids, pos, layer)
            c.write_kv(layer, slots, k, v)
            sk, sv = self.shadow[sid][layer]
            self.shadow[sid][layer] = (np.concatenate([sk, k]), np.concatenate([sv, v]))
        c.append_tokens(sid, token_ids)

    def fork(self, parent, child):
        self.cache.fork(parent, child)
        self.shadow[child] = [(k.copy(), v.copy()) for k, v in self.shadow[parent]]

    def free(self, sid):
        self.cache.free(sid)
        del self.shadow[sid]

    def check(self):
        c = self.cache
        c.check_invariants()
        ps = c.page_size
        for sid, layers in self.shadow.items():
            bt = c.block_table(sid)
            n = c.num_computed_tokens(sid)
            pos = np.arange(n)
            held = bt[pos // ps] >= 0        # pages a sliding window released are not read
            pages, off = bt[pos // ps][held], (pos % ps)[held]
            for layer, (sk, sv) in enumerate(layers):
                k_pages, v_pages = c.layer(layer)
                np.testing.assert_array_equal(k_pages[pages, :, off, :], sk[held])
                np.testing.assert_array_equal(v_pages[pages, :, off, :], sv[held])


class PairMachine(RuleBasedStateMachine):
    """Hash and radix side by side, same operations, same arena size."""

    num_pages = 40
    page_size = 2

    def __init__(self):
        super().__init__()
        self.both = [Shadowed(make_cache(pc, self.num_pages, self.page_size))
                     for pc in ("hash", "radix")]
        self.next_id = 0

    def live(self):
        return self.both[0].cache.seq_ids

    def _new_id(self):
        self.next_id += 1
        return f"s{self.next_id}"

    def _no_eviction_yet(self):
        return all(s.cache.stats()["evictions"] == 0 for s in self.both)

    def _each(self, fn):
        """Run fn on both; both must succeed or both refuse for lack of pages."""
        outcomes = []
        for s in self.both:
            try:
                outcomes.append(fn(s))
            except pnp.OutOfPages:
                outcomes.append(pnp.OutOfPages)
        return outcomes

    @rule(prompt=prompts)
    def add(self, prompt):
        sid = self._new_id()
        exact = self._no_eviction_yet()
        hits = [s.add(sid, prompt) for s in self.both]
        if exact:
            assert hits[0] == hits[1], f"hash reused {hits[0]} tokens, radix {hits[1]}"
        for s, n_hit in zip(self.both, hits):
            try:
                s.extend(sid, prompt[n_hit:])
            except pnp.OutOfPages:
                s.free(sid)
        if sid in self.both[0].cache and sid not in self.both[1].cache:
            self.both[0].free(sid)       # keep the live sets equal
        elif sid in self.both[1].cache and sid not in self.both[0].cache:
            self.both[1].free(sid)

    @precondition(lambda self: self.live())
    @rule(data=st.data(), n=st.integers(1, 5))
    def generate(self, data, n):
        sid = data.draw(st.sampled_from(self.live()))
        toks = data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
        self._each(lambda s: s.extend(sid, toks))

    @precondition(lambda self: self.live())
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(self.live()))
        child = self._new_id()
        for s in self.both:
            s.fork(parent, child)

    @precondition(lambda self: self.live())
    @rule(data=st.data())
    def free(self, data):
        sid = data.draw(st.sampled_from(self.live()))
        for s in self.both:
            s.free(sid)

    @invariant()
    def both_hold_their_kv(self):
        for s in self.both:
            s.check()


class RadixMachine(RuleBasedStateMachine):
    """The radix cache alone in a tiny arena: evictions, splits, forks, window releases."""

    num_pages = 10
    page_size = 3

    def __init__(self):
        super().__init__()
        self.s = Shadowed(make_cache("radix", self.num_pages, self.page_size))
        self.next_id = 0

    def live(self):
        return self.s.cache.seq_ids

    @rule(prompt=prompts)
    def add(self, prompt):
        self.next_id += 1
        sid = f"s{self.next_id}"
        n_hit = self.s.add(sid, prompt)
        try:
            self.s.extend(sid, prompt[n_hit:])
        except (pnp.OutOfPages, pnp.InvalidArgument):      # no room now / ever
            self.s.free(sid)

    @precondition(lambda self: self.live())
    @rule(data=st.data(), n=st.integers(1, 5))
    def generate(self, data, n):
        sid = data.draw(st.sampled_from(self.live()))
        before = self.s.cache.stats()
        try:
            self.s.extend(sid, data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)))
        except (pnp.OutOfPages, pnp.InvalidArgument):
            assert self.s.cache.stats() == before                  # refused: nothing changed

    @precondition(lambda self: self.live())
    @rule(data=st.data())
    def fork(self, data):
        self.next_id += 1
        self.s.fork(data.draw(st.sampled_from(self.live())), f"s{self.next_id}")

    @precondition(lambda self: self.live())
    @rule(data=st.data())
    def free(self, data):
        self.s.free(data.draw(st.sampled_from(self.live())))

    @precondition(lambda self: self.live())
    @rule(data=st.data(), k=st.integers(0, 12))
    def release_window(self, data, k):
        self.s.cache.release_pages_before(data.draw(st.sampled_from(self.live())), k)

    @precondition(lambda self: self.s.cache.pool.eviction_order())
    @rule(data=st.data())
    def mark_used(self, data):
        self.s.cache.mark_used(data.draw(st.sampled_from(self.s.cache.pool.eviction_order())))

    @invariant()
    def holds_its_kv(self):
        self.s.check()
        pool = self.s.cache.pool
        assert pool.num_free + pool.num_cached + pool.num_in_use == self.num_pages
        # Every evictable page is idle and off every live path.
        locked = {p for n in pool.prefix_index.nodes() if n.lock_ref for p in n.value}
        assert not locked & set(pool.eviction_order()), "a locked page is up for eviction"


class PairMachineTokens(PairMachine):
    page_size = 1


class RadixMachineTokens(RadixMachine):
    num_pages = 16
    page_size = 1


_settings = settings(max_examples=40, stateful_step_count=40, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])
TestPair = PairMachine.TestCase
TestPair.settings = _settings
TestPairTokens = PairMachineTokens.TestCase
TestPairTokens.settings = _settings
TestRadix = RadixMachine.TestCase
TestRadix.settings = _settings
TestRadixTokens = RadixMachineTokens.TestCase
TestRadixTokens.settings = _settings
