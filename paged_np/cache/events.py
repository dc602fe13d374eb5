"""What happened to which page: the cache's events, for drawings and live views.

An :class:`Event` is ``(step, kind, page_id, seq_id)``: ``step`` is ``cache.clock``
(the engine ticks it once per step), ``seq_id`` the sequence the page was acted
for. The pool, the prefix index and the cache each record their own (see
:data:`KINDS`). There are two ways to read them:

- ``PagedKVCache(cfg, record_events=True)`` keeps every event in ``cache.events``,
  for a run drawn afterwards (:func:`paged_np.viz.replay_events`); the list grows
  with the run, so the engine leaves it off by default;
- ``cache.add_listener(fn)`` calls ``fn(event)`` as each event happens and keeps
  nothing: a live view of a long run (the server's ``/v1/cache/stream``,
  :mod:`paged_np.server.cache_view`). With neither, no event is even built.

Compared with vLLM: its ``KVCacheEvent`` stream (``BlockStored``, ``BlockRemoved``)
reports only what a prefix index across servers needs; these name every move a
page makes, as a textbook figure would.
"""

from __future__ import annotations

from collections import namedtuple

__all__ = ["Event", "KINDS"]

#: Each event's ``kind`` and what it means for its page.
KINDS = {
    "allocate": "taken for a sequence (FREE, or evicted just before): IN_USE, ref_count 1",
    "hit": "a prefix lookup found it cached: the sequence takes a reference",
    "fork": "a forked child shares it: one more reference",
    "cow": "the fresh copy a sequence writes instead of a shared page (copy-on-write)",
    "cache": "its last reference dropped and the index holds it: CACHED",
    "free": "its last reference dropped and the index does not hold it: FREE",
    "evict": "the index gave it up to make room (it is allocated again at once)",
    "hash": "it joined the hash index (a full page)",
    "insert": "it joined the radix tree (a full page)",
}

#: One entry of ``cache.events``, and what a listener is called with.
Event = namedtuple("Event", "step kind page_id seq_id")
