"""The cache as JSON: the data behind ``GET /v1/cache``, ``GET /v1/cache/stream`` and
the ``/dashboard`` page (schema version 1).

Everything here runs on the engine loop's thread, between two steps, and reads
the engine and the cache through their public methods only (``cache.pool``,
``cache.block_table``, ``cache.num_released_pages``, ``cache.prefix_index.walk()``,
``engine.scheduler``, ``engine.stats()``): it never asks which index the cache
has, nor reads a tree node or a request's sequence.

**The snapshot** (``GET /v1/cache``, and the stream's first event)::

    {"version": 1, "step": int, "time": float (Unix seconds),
     "config": {"num_pages", "page_size", "prefix_cache" ("hash"|"radix"),
                "eviction_policy", "schedule", "kv_cache_dtype" ("float32"), "bytes_per_page",
                "max_num_seqs", "speculative": bool},
     "pages": {"state": ["free"|"cached"|"in_use", ...],   # one per page id
               "ref_count": [int, ...],                      # block tables holding it
               "owner": [id or null, ...]},                  # the first live request holding it
     "lru": [page ids],          # cached pages, next victim first (pool.eviction_order())
     "tree": null | {"nodes": [{"id", "parent" (null below a root), "num_tokens",
                                "pages": [...], "lock_ref"}]},   # the radix index only
     "requests": {"running": [R, ...], "waiting": [R, ...]},
     "counters": {...},          # engine.stats(): generated_tokens, prefix_hit_rate,
                                 # preemptions, evictions, kv_pages_in_use, spec_* ...
     "hits": [page ids],         # pages a prefix lookup hit since the last update
     "evicted": [page ids]}      # pages evicted since the last update

    R = {"id", "request_id", "sample", "status", "num_tokens", "num_computed_tokens",
         "num_pages", "cached_prompt_tokens", "text"?}

One ``R`` per sample: ``request_id`` is the user's request (the completion's
``id``), ``sample`` its index; ``id`` is ``request_id`` for sample 0 and
``request_id#j`` for sample ``j``, and ``owner`` names these ids. ``text``
(``{"prompt", "answer"}``) is there only when the server runs with
``--dashboard-show-text``; by default the view shows counts, pages and states.

**An update** (the stream's later events) carries what changed since the one before::

    {"step", "time",
     "pages": {"changed": [page ids], "state": [...], "ref_count": [...], "owner": [...]},
     "lru", "tree", "requests", "counters", "hits", "evicted"}

``pages`` gives the new values of the changed pages only (``state[i]`` is page
``changed[i]``'s); the other keys are whole, as in the snapshot. Applying each
update to the snapshot in order gives the cache's state at that update.

What many readers cost: one snapshot, encoded once, serves every stream that opens
and every ``GET /v1/cache`` until the next update goes out (and for at most the
update interval, 0.1 s), so a crowd arriving at once, or polling, costs one
snapshot per interval; each update is encoded once for all streams. The server
also caps the streams open at once (``--max-cache-streams``).

How the changes are found without scanning the arena: while anyone watches,
:class:`CacheView` is a listener of the cache (:meth:`PagedKVCache.add_listener`)
and collects the pages each event names; it also walks the live sequences'
block tables (pages in use only) to catch a reference dropped from a page that
stays in use (which logs no event). With nobody watching it is no listener and
does nothing.
"""

from __future__ import annotations

import asyncio
import json
import time

#: The schema's version (``"version"`` in the snapshot).
SCHEMA_VERSION = 1
#: At most this many updates a second go to each stream.
MAX_UPDATES_PER_S = 10


def _dumps(obj) -> str:
    return json.dumps(obj, separators=(",", ":"))


class Subscriber:
    """One stream's mailbox, on its event loop: a bounded queue of ``(event, data)``.

    A reader that falls behind by ``maxsize`` events loses them all (the
    engine never waits for it) and is marked ``resync``: the engine's next
    publish sends it a fresh snapshot instead of an update it could not apply.
    ``(None, None)`` tells the reader the stream is over.
    """

    def __init__(self, aloop, maxsize: int = 32):
        self.aloop = aloop
        self.queue: asyncio.Queue = asyncio.Queue()
        self.maxsize = maxsize
        self.resync = False                  # read by the engine thread, written here

    def offer(self, event, data) -> None:
        """Called on the event loop (never blocks)."""
        if event in ("snapshot", None):
            while not self.queue.empty():    # a snapshot replaces whatever is queued
                self.queue.get_nowait()
            self.resync = False
        elif self.resync:
            return                           # an update for a state the reader lost
        elif self.queue.qsize() >= self.maxsize:
            while not self.queue.empty():
                self.queue.get_nowait()
            self.resync = True
            return
        self.queue.put_nowait((event, data))


def _offer_all(items) -> None:
    """On the event loop: hand each stream its event."""
    for sub, event, data in items:
        sub.offer(event, data)


class CacheView:
    """The engine loop's watcher of the cache: snapshots, updates and their subscribers.

    Parameters
    ----------
    llm : paged_np.LLM
        The served LLM; its engine and cache are read, never written.
    show_text : bool
        Put each request's prompt and answer text into ``requests``.
    max_updates_per_s : float
        At most this many updates a second (the issue's bar: 10).
    """

    def __init__(self, llm, show_text: bool = False,
                 max_updates_per_s: float = MAX_UPDATES_PER_S):
        self.llm = llm
        self.engine = llm.engine
        self.cache = llm.engine.cache
        self.show_text = show_text
        self.interval = 1.0 / max_updates_per_s
        self.subscribers: list[Subscriber] = []
        self.num_updates = 0                 # updates published (for tests and benchmarks)
        self.busy_s = 0.0                    # engine-thread seconds spent here (/metrics)
        self._last_publish = 0.0
        self._dirty = False
        self._changed: set = set()           # pages events named since the last update
        self._hits: dict = {}                # page -> None, in order (an ordered set)
        self._evicted: dict = {}
        self._refs: dict = {}                # page -> ref count, as of the last update
        self._owners: dict = {}              # page -> owner, as of the last update
        self._prompt_text: dict = {}         # request id -> its prompt's text (show_text)
        self._epoch = 0                      # +1 at each update sent and listener change
        self._shared: tuple | None = None    # (epoch, monotonic time, encoded snapshot)

    # ------------------------------------------------ subscribers (engine thread)
    def watch(self, sub: Subscriber) -> None:
        """Start a stream: its first event is a snapshot of now."""
        if not self.subscribers:             # the first watcher: start listening
            self.cache.add_listener(self._on_event)
            self._changed.clear()
            self._hits.clear()
            self._evicted.clear()
            self._refs, self._owners = self._walk()
            self._epoch += 1                 # a snapshot from before would miss changes
        self.subscribers.append(sub)
        t0 = time.perf_counter()
        self._send([(sub, "snapshot", self.snapshot_json())])
        self.busy_s += time.perf_counter() - t0

    def unwatch(self, sub: Subscriber) -> None:
        if sub in self.subscribers:
            self.subscribers.remove(sub)
            if not self.subscribers:         # nobody watches: cost nothing
                self.cache.remove_listener(self._on_event)
                self._epoch += 1

    def close_all(self) -> None:
        """End every stream (the server is stopping)."""
        self._send([(s, None, None) for s in self.subscribers])
        for s in list(self.subscribers):
            self.unwatch(s)

    def mark_dirty(self) -> None:
        """Something may have changed (a step ran, a request came or went)."""
        self._dirty = True

    def wait_s(self, idle_s: float) -> float:
        """How long an idle engine loop may sleep before :meth:`publish` is due."""
        if self.subscribers and self._dirty:
            return max(0.0, min(idle_s, self._last_publish + self.interval - time.monotonic()))
        return idle_s

    def publish(self) -> bool:
        """Send an update if anyone watches, something changed and the rate allows."""
        if not self.subscribers or not self._dirty:
            return False
        now = time.monotonic()
        if now - self._last_publish < self.interval:
            return False
        self._last_publish = now
        self._dirty = False
        t0 = time.perf_counter()
        data = _dumps(self.update())
        self._epoch += 1                     # snapshots from before this update are stale
        items = []
        for sub in self.subscribers:
            if sub.resync:                   # it fell behind: start it again
                items.append((sub, "snapshot", self.snapshot_json()))
            else:
                items.append((sub, "update", data))
        self._send(items)
        self.num_updates += 1
        self.busy_s += time.perf_counter() - t0
        return True

    def _send(self, items) -> None:
        by_loop: dict = {}
        for item in items:
            by_loop.setdefault(item[0].aloop, []).append(item)
        for aloop, group in by_loop.items():   # one hand-over per event loop
            try:
                aloop.call_soon_threadsafe(_offer_all, group)
            except RuntimeError:               # its event loop is closed: nobody reads
                pass

    def _on_event(self, event) -> None:
        """The cache's listener: note the page (inside the cache's own call, so O(1))."""
        self._changed.add(event.page_id)
        self._dirty = True
        if event.kind == "hit":
            self._hits[event.page_id] = None
        elif event.kind == "evict":
            self._evicted[event.page_id] = None

    # ------------------------------------------------------------ building
    def snapshot_json(self) -> str:
        """:meth:`snapshot`, encoded, shared: built at most once per update sent (and per
        update interval), however many streams open or clients poll meanwhile.

        A shared snapshot is as good as a fresh one to a new stream: the next update
        carries every page changed since the last update, so since the snapshot too.
        """
        now = time.monotonic()
        shared = self._shared
        if shared is not None and shared[0] == self._epoch and now - shared[1] < self.interval:
            return shared[2]
        data = _dumps(self.snapshot())
        self._shared = (self._epoch, now, data)
        return data

    def snapshot(self) -> dict:
        """The whole view now (schema above)."""
        pool = self.cache.pool
        n = self.cache.cfg.num_pages
        refs, owners = self._walk()
        if self.subscribers:
            # Pages that differ from the last update's values: the next update must
            # carry them even if they change back, or this snapshot's readers miss it.
            self._changed.update(_diff(refs, self._refs), _diff(owners, self._owners))
        return {
            "version": SCHEMA_VERSION, **self._now(), "config": self.config(),
            "pages": {"state": [pool.state(p) for p in range(n)],
                      "ref_count": [refs.get(p, 0) for p in range(n)],
                      "owner": [owners.get(p) for p in range(n)]},
            **self._whole(), "hits": list(self._hits), "evicted": list(self._evicted)}

    def update(self) -> dict:
        """What changed since the last update (the pages, and the rest whole). Resets the hits."""
        refs, owners = self._walk()
        changed = self._changed | _diff(refs, self._refs) | _diff(owners, self._owners)
        self._refs, self._owners = refs, owners
        pool = self.cache.pool
        ids = sorted(changed)
        out = {**self._now(),
               "pages": {"changed": ids, "state": [pool.state(p) for p in ids],
                         "ref_count": [refs.get(p, 0) for p in ids],
                         "owner": [owners.get(p) for p in ids]},
               **self._whole(), "hits": list(self._hits), "evicted": list(self._evicted)}
        self._changed, self._hits, self._evicted = set(), {}, {}
        return out

    def config(self) -> dict:
        cfg, ecfg = self.cache.cfg, self.engine.config
        return {"num_pages": cfg.num_pages, "page_size": cfg.page_size,
                "prefix_cache": cfg.prefix_cache,
                "eviction_policy": self.cache.pool.eviction_policy,
                "schedule": ecfg.schedule, "kv_cache_dtype": cfg.kv_cache_dtype,
                "bytes_per_page": cfg.bytes_per_page, "max_num_seqs": ecfg.max_num_seqs,
                "speculative": ecfg.speculative_config is not None}

    def _now(self) -> dict:
        return {"step": self.cache.clock, "time": time.time()}

    def _whole(self) -> dict:
        """The keys every update sends whole: LRU, tree, requests, counters."""
        return {"lru": self.cache.pool.eviction_order(), "tree": self.tree(),
                "requests": self.requests(), "counters": self.engine.stats()}

    def tree(self) -> dict | None:
        """The index's tree (:meth:`PrefixIndex.walk`), or None for an index with none."""
        nodes = self.cache.prefix_index.walk()
        if nodes is None:
            return None
        return {"nodes": [{"id": n.id, "parent": n.parent, "num_tokens": len(n.tokens),
                           "pages": list(n.pages), "lock_ref": n.lock_ref} for n in nodes]}

    def requests(self) -> dict:
        sched = self.engine.scheduler
        live = set()
        out = {}
        for name, reqs in (("running", sched.running), ("waiting", sched.waiting)):
            out[name] = [self._request(r) for r in reqs]
            live.update(r.parent.request_id for r in reqs)
        for rid in [r for r in self._prompt_text if r not in live]:
            del self._prompt_text[rid]           # finished: forget its text
        return out

    def _request(self, req) -> dict:
        rid, j = req.parent.request_id, req.sample.index
        sid, cache = req.seq_id, self.cache
        num_pages = (len(cache.block_table(sid)) - cache.num_released_pages(sid)
                     if sid in cache else 0)
        r = {"id": _owner_id(req), "request_id": rid, "sample": j, "status": req.status,
             "num_tokens": req.num_tokens, "num_computed_tokens": req.num_computed_tokens,
             "num_pages": num_pages,
             "cached_prompt_tokens": req.parent.output.num_cached_prompt_tokens}
        if self.show_text:
            prompt = self._prompt_text.get(rid)
            if prompt is None:                   # decoded once per request
                prompt = self._prompt_text[rid] = self.llm.tokenizer.decode(req.parent.prompt)
            r["text"] = {"prompt": prompt, "answer": req.sample.text}
        return r

    def _walk(self) -> tuple[dict, dict]:
        """``({page: ref count}, {page: owner})`` over the pages live sequences hold.

        A page's reference count is the number of block tables holding it (the
        cache's invariant 2), and its owner the first live request (in the
        cache's admission order) that holds it. O(pages in use).
        """
        by_seq = {r.seq_id: r for p in self.engine.requests.values() for r in p.seqs}
        refs: dict = {}
        owners: dict = {}
        for sid in self.cache.seq_ids:
            req = by_seq.get(sid)
            owner = _owner_id(req) if req is not None else str(sid)
            for p in self.cache.block_table(sid).tolist():
                if p >= 0:
                    refs[p] = refs.get(p, 0) + 1
                    owners.setdefault(p, owner)
        return refs, owners


def _owner_id(req) -> str:
    rid, j = req.parent.request_id, req.sample.index
    return str(rid) if j == 0 else f"{rid}#{j}"


def _diff(new: dict, old: dict) -> set:
    """Keys whose value differs between two sparse maps (a missing key is a default)."""
    return {k for k in new.keys() | old.keys() if new.get(k) != old.get(k)}
