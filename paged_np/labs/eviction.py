"""Lab 5, an eviction priority: ``priority(entry)`` and ``choose_victim(entries, ref_count,
priority)``.

When an allocation finds no FREE page, a CACHED one (held by the prefix index,
by no sequence) gives up its contents. The learner writes the policy the
package calls LFU, *with LRU among equals*: fewest prefix hits first, and of
those the one used longest ago (a key that ties on hits alone leaves the
choice to chance, which is how a bad policy passes for a good one); and the
choice of the victim, among **only** the pages no sequence holds: evicting a
live page would overwrite K/V a running sequence is still reading.

How they enter the engine: the policy is an
:class:`~paged_np.EvictionPolicy` subclass registered in ``EVICTION_POLICIES``
(the index orders its candidates by it); the lab's prefix index (a
:class:`~paged_np.HashIndex` subclass) hands the learner's ``choose_victim``
*every* page it indexes, live ones too, with the pool's ``ref_count``, and
refuses a live or out-of-order choice where it is made. The learner's run
must evict the same pages, in the same order, as the package's LFU.
"""

from __future__ import annotations

import types

from ..cache.eviction import EvictionPolicy, LFUPolicy
from .report import LabFailure, show

TITLE = "an eviction priority"
FILE = "05_eviction.py"
FUNCTIONS = ("priority", "choose_victim")
BLAME = "priority"

HINTS = {
    "priority": (
        "The smallest key goes first. Fewest hits first; among pages with as many hits, "
        "the one whose last use is oldest (smallest last_access_time). Python compares "
        "tuples item by item.",
        "return (entry.hit_count, entry.last_access_time)."),
    "choose_victim": (
        "Only a page no block table holds (ref_count 0: CACHED) may be evicted; a page in "
        "use holds K/V a running sequence reads at its next step. Among those, the "
        "smallest priority.",
        "idle = [e for e in entries if ref_count(e.page_id) == 0]; return min(idle, "
        "key=priority).page_id."),
}


def stamps(e) -> str:
    return (f"page {e.page_id} (hit_count={e.hit_count}, last_access_time="
            f"{e.last_access_time}, creation_time={e.creation_time})")


def ordered(learner, entries) -> list:
    """``entries`` sorted by the learner's priority (refusing keys that cannot be sorted)."""
    keys = [learner.call("priority", e, case=stamps(e)) for e in entries]
    try:
        order = sorted(range(len(entries)), key=lambda i: keys[i])
    except TypeError as exc:
        raise LabFailure("priority", [f"returned keys that cannot be compared: "
                                      f"{[show(k) for k in keys]} ({exc})"],
                         "; ".join(stamps(e) for e in entries)) from None
    return [(entries[i], keys[i]) for i in order]


def check_priority(learner, entries) -> None:
    """The learner's order of ``entries`` must be LFU's, ties broken by recency."""
    want = sorted(entries, key=LFUPolicy().priority)
    got = ordered(learner, entries)
    for w, (g, key) in zip(want, got):
        if g is not w:
            wkey = learner.call("priority", w)
            tie = " (a tie: which goes first is then up to chance)" if wkey == key else ""
            raise LabFailure("priority", [
                f"{stamps(w)} must be evicted before {stamps(g)}: fewest hits first, then "
                "the one used longest ago",
                f"your keys: page {w.page_id} -> {show(wkey)}, page {g.page_id} -> "
                f"{show(key)}{tie}"], "entries " + "; ".join(stamps(e) for e in entries))


def call_choose_victim(learner, entries, ref_count, priority) -> int:
    """The learner's victim, refused if it is live or not the smallest idle priority."""
    case = "the indexed pages:" + "".join(
        f"\n    {stamps(e)}, ref_count={ref_count(e.page_id)}" for e in entries)
    got = learner.call("choose_victim", list(entries), ref_count, priority, case=case)
    ids = {e.page_id: e for e in entries}
    if isinstance(got, bool) or not isinstance(got, int) or got not in ids:
        raise LabFailure("choose_victim", f"returned {show(got)}: the page id of one of the "
                                          "entries is due", case)
    if ref_count(got) > 0:
        raise LabFailure("choose_victim", [
            f"chose page {got}, which {ref_count(got)} block table(s) still hold: a live "
            "page evicted would have its K/V overwritten under the sequence reading it",
            "only pages with ref_count 0 (CACHED) may be evicted"], case)
    idle = [e for e in entries if ref_count(e.page_id) == 0]
    best = min(idle, key=priority)
    if priority(ids[got]) != priority(best):
        raise LabFailure("choose_victim", [
            f"chose page {got} (priority {show(priority(ids[got]))}), but page {best.page_id} "
            f"has the smallest priority of the idle pages ({show(priority(best))})"], case)
    return got


def policy_class(learner):
    class LabPolicy(EvictionPolicy):
        name = "lab"

        def priority(self, entry):
            return learner.call("priority", entry)

    return LabPolicy


class EvictMixin:
    """The lab's index: every indexed page is offered to the learner's ``choose_victim``."""

    evict_learner = None
    lab_cache = None                       # the cache whose pool counts references

    def evict(self, num_pages, seq_id=None):
        out = []
        while len(out) < num_pages and self._queued:
            entries = sorted(self._entry.values(), key=lambda e: e.page_id)
            p = call_choose_victim(self.evict_learner, entries, self.lab_cache.pool.ref_count,
                                   self.policy.priority)
            del self._queued[p]                           # its heap entry is stale now
            e = self._entry.pop(p)
            del self._by_hash[e.hash]
            out.append(p)
            self._emit("evict", p, seq_id)
        return out


class LinkMixin:
    """The lab's cache: tells its index which cache (and so which pool) it serves."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.prefix_index.lab_cache = self


def evictions(cache_class, cfg, prompts) -> list:
    """Pages evicted, in order, serving ``prompts`` (no model); invariants after each."""
    from .prefix import serve_prompt

    c = cache_class(cfg)
    for i, prompt in enumerate(prompts):
        serve_prompt(c, i, prompt)
        c.check_invariants()
    return [e.page_id for e in c.events if e.kind == "evict"]


def check(learner, rng) -> None:
    """The order alone (ties included), the victim alone, then a cache under pressure."""
    import paged_np as pnp

    from ..registry import KV_CACHES
    from .runner import installed

    def entry(p, hits, last):
        return types.SimpleNamespace(page_id=p, hit_count=hits, last_access_time=last,
                                     creation_time=last - int(rng.integers(0, 3)))

    check_priority(learner, [entry(0, 2, 9), entry(1, 2, 5)])        # a tie on hits
    check_priority(learner, [entry(0, 1, 3), entry(1, 0, 8)])        # hits before age
    for _ in range(20):
        n = int(rng.integers(2, 8))
        times = rng.permutation(50)[:n]
        check_priority(learner, [entry(i, int(rng.integers(0, 3)), int(times[i]))
                                 for i in range(n)])
    lfu = LFUPolicy().priority
    for _ in range(20):
        n = int(rng.integers(2, 8))
        times = rng.permutation(50)[:n]
        es = [entry(i, int(rng.integers(0, 3)), int(times[i])) for i in range(n)]
        refs = {e.page_id: int(rng.choice([0, 0, 1, 2])) for e in es}
        refs[min(es, key=lfu).page_id] = 1           # the best-ranked page is live
        refs[es[-1].page_id] = 0                      # and at least one is idle
        call_choose_victim(learner, es, refs.__getitem__, lfu)
    heads = [[int(t) for t in rng.integers(0, 30, 8)] for _ in range(3)]
    with installed([swap(learner)]) as options:
        for _ in range(6):
            prompts = [heads[int(rng.integers(3))][:int(rng.integers(0, 9))]
                       + [int(t) for t in rng.integers(0, 30, int(rng.integers(1, 6)))]
                       for _ in range(14)]
            base = dict(num_pages=10, page_size=4, head_dim=4)
            mine = evictions(KV_CACHES.load(options["kv_cache"]), pnp.CacheConfig(
                prefix_cache=options["prefix_cache"],
                eviction_policy=options["eviction_policy"], **base), prompts)
            want = evictions(pnp.PagedKVCache, pnp.CacheConfig(eviction_policy="lfu", **base),
                             prompts)
            if mine != want:
                raise LabFailure("priority", [f"evicted pages {mine}",
                                              f"the package's LFU evicts {want}"],
                                 f"14 prompts through a cache of 10 pages of 4: {prompts}")


def swap(learner):
    from ..registry import EVICTION_POLICIES
    from .runner import Swap

    index = type("LabEvict", (EvictMixin,), {"evict_learner": learner})
    return Swap(cache_mixins=[LinkMixin], index_mixins=[index],
                entries=[(EVICTION_POLICIES, policy_class(learner))],
                reference={"eviction_policy": "lfu"}, compare=("tokens", "evictions"))
