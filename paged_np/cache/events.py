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


class EventLog:
    """The clock, the kept events and the listeners of a cache (its base class).

    ``record_events``: keep every event in :attr:`events`. The pool and the
    prefix index call :meth:`_log` (their ``listener``) for their own events.
    """

    def __init__(self, record_events: bool = True):
        self.events: list[Event] = []
        self.record_events = record_events
        self.listeners: tuple = ()                   # see add_listener
        self.clock = 0

    def tick(self) -> int:
        """Advance the event clock by one step (the engine ticks once per step)."""
        self.clock += 1
        return self.clock

    def add_listener(self, fn) -> None:
        """Call ``fn(event)`` on each later event, logged or not (kinds: :data:`KINDS`)."""
        self.listeners = (*self.listeners, fn)       # a new tuple: safe to swap any time

    def remove_listener(self, fn) -> None:
        self.listeners = tuple(f for f in self.listeners if f != fn)

    def _log(self, kind: str, page_id: int, seq_id) -> None:
        """Record one event (the pool's and the index's listener too); tell the listeners."""
        if self.record_events or self.listeners:
            event = Event(self.clock, kind, page_id, seq_id)
            if self.record_events:
                self.events.append(event)
            for fn in self.listeners:
                fn(event)
