"""The tiers below the arena: where a cached page goes when the arena evicts it.

A page's life, with both tiers configured (``docs/design.md``, "Tiers")::

    arena (CACHED) --evicted--> host pool --evicted--> disk files --evicted--> gone
         ^                          |                      |
         +------ prefix lookup: missed the arena, found below: copied back -------+

:class:`KVTiers` is a plug-in of :class:`~paged_np.PagedKVCache`, attached as
``cache.tiers`` only when a tier is configured (the engine does it from
``EngineConfig``, :mod:`paged_np.engine.tiering`); the core never imports it.
It acts at two moments, through the cache's public seams only:

1. **store**: it listens to the cache's events (:meth:`~PagedKVCache.add_listener`).
   On ``evict`` the page is still indexed and its K/V still in the arena: it
   asks the index for the page's name (:meth:`~PrefixIndex.page_key`, the
   process-stable SHA-256 chain of its prefix and its tokens), copies it out
   (:meth:`~PagedKVCache.read_pages`, codes and scales of 8-bit pages as they
   are) and keeps it in the host pool (:mod:`.host_tier`); what the host pool
   evicts goes to disk (:mod:`.disk_tier`). With ``write_through`` every page
   is also written to disk as it joins the index, so a restart finds it.
2. **load**: :meth:`~PagedKVCache.add_sequence` calls :meth:`load_prefix` after
   its arena match. The prompt's next pages, looked up by hash in the host
   pool then on disk, are copied into fresh arena pages as a swap-in is
   (``allocate_slots``, ``write_slots``, ``append_tokens``; one copy, from the
   tier straight into the arena), so they join the index and count as
   computed; the rest of the prompt is prefilled.

**The reuse gate** (vLLM's): with ``reuse_gate = g > 0`` a page is stored only
once more than ``g`` prompts have asked for it, so a one-off prompt's pages do
not push out shared ones. ``0`` stores every page.

**Faults are misses**: a page a tier cannot give back intact is recomputed
(:mod:`.disk_tier` counts and warns). Nothing here raises into a step: a
page is loaded only after every check, and only when the arena has a page
for it and one more for the token the sequence still computes.

Compared with vLLM's ``OffloadingConnector`` and SGLang's HiCache: loads and
stores are synchronous on the engine's thread (no transfer overlapped with
compute), one page at a time.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from .hash_index import ROOT_HASH, hash_page
from .kv_layouts import token_rows

#: Page hashes whose prompt counts the reuse gate remembers (oldest forgotten first).
SEEN_CAP = 1 << 16


class KVTiers:
    """The host pool and the disk store below one cache's arena (either may be None)."""

    def __init__(self, cache, host=None, disk=None, reuse_gate: int = 0,
                 write_through: bool = False):
        self.cache = cache
        self.host, self.disk = host, disk
        self.reuse_gate = reuse_gate
        self.write_through = write_through and disk is not None
        self._seen: OrderedDict[bytes, int] = OrderedDict()   # hash -> prompts that asked
        self.loaded_tokens = {t.name: 0 for t in self.tiers}  # tokens served, per tier
        self.lookups = 0
        cache.add_listener(self._on_event)

    @property
    def tiers(self) -> list:
        """The configured tiers, top down."""
        return [t for t in (self.host, self.disk) if t is not None]

    # ------------------------------------------------------------- storing
    def _on_event(self, event) -> None:
        kind = event.kind
        if kind == "evict":
            self._save(event.page_id, to_host=True)
        elif self.write_through and kind in ("hash", "insert"):
            self._save(event.page_id, to_host=False)

    def _save(self, page: int, to_host: bool) -> None:
        """Copy an indexed arena page into the host pool (else, or also, the disk)."""
        key = self.cache.prefix_index.page_key(page)
        if key is None or not self._passes_gate(key[0]):
            return
        h, tokens = key
        host = self.host if to_host else None
        if (host is None or h in host) and (self.disk is None or h in self.disk):
            return                                         # nowhere new to put it
        data, scales = self.cache.read_pages([page])       # [L, 2, 1, Hkv, ps, D] copies
        data = data[:, :, 0]                               # [L, 2, Hkv, ps, D]
        scales = None if scales is None else scales[:, :, 0]
        if host is not None:
            host.store(h, tokens, data, scales, on_evict=self._demote)
        elif self.disk is not None:
            self.disk.store(h, tokens, data, scales)

    def _demote(self, page_hash: bytes, tokens, data, scales) -> None:
        """The host pool's victim goes to disk (if it is not there already)."""
        if self.disk is not None:
            self.disk.store(page_hash, tokens, data, scales)

    def _passes_gate(self, page_hash: bytes) -> bool:
        return self.reuse_gate == 0 or self._seen.get(page_hash, 0) > self.reuse_gate

    def _count_seen(self, hashes) -> None:
        seen = self._seen
        for h in hashes:
            seen[h] = seen.get(h, 0) + 1
            seen.move_to_end(h)
        while len(seen) > SEEN_CAP:
            seen.popitem(last=False)

    # ------------------------------------------------------------- loading
    def load_prefix(self, cache, seq_id, tokens, n_hit: int) -> int:
        """After an arena match of ``n_hit`` tokens of ``tokens`` (whole pages, the most
        the sequence may reuse), copy the next pages found below the arena into
        fresh pages of ``seq_id``; returns the tokens added (whole pages, maybe 0)."""
        ps = cache.page_size
        key = cache.sequence(seq_id).extra_key
        hashes, parent = [], ROOT_HASH
        for i in range(len(tokens) // ps):                 # the prompt's hash chain
            parent = hash_page(parent, tokens[i * ps:(i + 1) * ps], key)
            hashes.append(parent)
        self._count_seen(hashes)
        self.lookups += 1
        room = cache.num_available_pages - 1               # keep one for the next token
        plan = []                                          # the next pages found below
        for i in range(n_hit // ps, len(hashes)):
            if len(plan) >= room or not any(hashes[i] in t for t in self.tiers):
                break                                      # a miss ends the run
            plan.append(i)
        if not plan:
            return 0
        # Pages first (evictions this causes are saved above), then each page is copied
        # straight from its tier into its arena page: one copy, nothing staged.
        slots = cache.allocate_slots(seq_id, len(plan) * ps)      # [k * ps] int64
        done = 0
        for j, i in enumerate(plan):
            found = self._load(hashes[i], tokens[i * ps:(i + 1) * ps])
            if found is None:                              # a fault, or evicted meanwhile
                break
            name, data, scales = found                     # [L, 2, Hkv, ps, D], [.., ps]
            rows = token_rows(data[:, :, None], 0, np.arange(ps), cache.cfg.kv_layout)
            cache.write_slots(slots[j * ps:(j + 1) * ps], rows,          # [ps, L, 2, Hkv, D]
                              None if scales is None else scales.transpose(3, 0, 1, 2))
            self.loaded_tokens[name] += ps
            done += 1
        n = done * ps
        if n:
            cache.append_tokens(seq_id, tokens[n_hit:n_hit + n])
        if done < len(plan):
            cache.discard_pending(seq_id)                  # the pages not filled go back
        return n

    def _load(self, page_hash: bytes, tokens) -> tuple | None:
        """``(tier name, data, scales)`` of the first tier that gives the page back intact."""
        for tier in self.tiers:
            page = tier.load(page_hash, tokens)            # a view (host) or a fresh read
            if page is not None:
                return (tier.name, *page)
        return None

    # ----------------------------------------------------------- reporting
    def stats(self) -> dict:
        """Per tier: pages, bytes, capacity, hits, stores, evictions, faults, and the
        tokens it served (``loaded_tokens``)."""
        out = {}
        for t in self.tiers:
            out[t.name] = {**t.stats(), "loaded_tokens": self.loaded_tokens[t.name]}
        return out

    def check_invariants(self) -> None:
        for t in self.tiers:
            t.check_invariants()

