"""PagedKVCache: the facade over the arena, the page pool and the sequences.

The life of a sequence is four calls (see docs/design.md)::

    n_hit = cache.add_sequence("a", prompt)   # reuse cached prefix pages
    slots = cache.allocate_slots("a", n)      # slots for the next n tokens
    cache.write_kv(layer, slots, k, v)        # once per layer
    cache.append_tokens("a", new_ids)         # now written; full pages hashed
    cache.discard_pending("a")                # speculation: drop unverified slots

Every public method validates its arguments first and only then changes
state, so a refused call (a bad argument, ``OutOfPages``) leaves the pool, the
block tables, the stats and the arena exactly as they were.

Compared with vLLM: one ``PagedKVCache`` plays ``KVCacheManager`` (+ ``BlockPool``)
and the attention backend's ``reshape_and_cache``; no scheduler here
(:mod:`paged_np.engine.scheduler`), no GPU/CPU split, no hybrid cache.

The prefix cache is a :class:`~paged_np.cache.prefix_index.PrefixIndex`,
built by :func:`~paged_np.cache.prefix_index.make_prefix_index` from
``CacheConfig.prefix_cache``: vLLM's hash chain or SGLang's radix tree, behind
the same calls. ``add_sequence`` matches a prefix and locks it,
``append_tokens`` inserts newly full pages (moving the lock to the longer
prefix), ``fork`` locks it once more, ``free`` unlocks it. With the tree,
pages a sliding window releases (``release_pages_before``, which keeps the
attention sinks' pages) stay pinned under the live sequence's path until the
sequence ends.

A scheduler asks first (:meth:`PagedKVCache.num_pages_needed`, ``can_allocate``,
``num_available_pages``); then ``allocate_slots`` cannot raise ``OutOfPages``.

Two seams (``docs/design.md``, "Seams") are methods a subclass may replace,
registered in :data:`paged_np.registry.KV_CACHES` and chosen by
``EngineConfig.kv_cache``: :meth:`allocate_slots` (slot allocation) and
:meth:`copy_on_write` (what a write into a shared page does).
"""

from __future__ import annotations

import numpy as np

from ..checks import as_extra_key, as_token_ids, check_int, check_positive_int
from ..config import CacheConfig
from ..errors import (
    DTypeError,
    DuplicateSequence,
    InvalidArgument,
    OutOfPages,
    SequenceTooLong,
    StalePage,
    UnknownSequence,
)
from ..registry import DEVICES
from .batch import BatchMetadata
from .events import Event, EventLog
from .invariants import check_cache_invariants
from .page_pool import CACHED, PagePool
from .prefix_index import make_prefix_index
from .sequence import Sequence, slots_of

__all__ = ["BatchMetadata", "Event", "PagedKVCache"]


class PagedKVCache(EventLog):
    """A paged KV cache over one preallocated arena.

    Parameters
    ----------
    cfg : CacheConfig
        Shapes, dtype and eviction policy.
    record_events : bool
        Keep the ``events`` log (for drawings). Turn it off for long runs.
    device : str
        Where the arena lives, a name of :data:`paged_np.registry.DEVICES`:
        ``"cpu"`` (a NumPy arena) or ``"cuda"`` (a numba device arena, see
        :class:`paged_np.attention.numba_cuda.DeviceArena`).

    Example
    -------
    >>> import numpy as np, paged_np as pnp
    >>> cache = pnp.PagedKVCache(pnp.CacheConfig(num_pages=8, page_size=4, head_dim=8))
    >>> cache.add_sequence("a", [1, 2, 3, 4, 5])
    0
    >>> cache.allocate_slots("a", 5)
    array([0, 1, 2, 3, 4])
    """

    def __init__(self, cfg: CacheConfig, record_events: bool = True, device: str = "cpu"):
        if not isinstance(cfg, CacheConfig):
            raise DTypeError(f"cfg must be a CacheConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.page_size = cfg.page_size
        self.device = device
        # The arena (a device arena raises CudaUnavailable where there is no GPU).
        self._arena = DEVICES.load(DEVICES.check(device, "device"))(cfg)
        #: The prefix cache (hash chain or radix tree); the pool asks it for victims.
        self.prefix_index = make_prefix_index(cfg)
        self.pool = PagePool(cfg.num_pages, cfg.page_size, self.prefix_index)
        # The pool and the index record their own events, naming the sequence they act for.
        self.pool.listener = self.prefix_index.listener = self._log
        self._seqs: dict[object, Sequence] = {}
        EventLog.__init__(self, record_events)
        self._hits = 0
        self._queries = 0
        self._cow_copies = 0
        self.tiers = None   # the tiers below the arena (host, disk: cache/tiers.py), or None

    # ----------------------------------------------------------------- arena
    @property
    def arena(self) -> np.ndarray:
        """The one ndarray holding every page (a numba device array when device="cuda")."""
        return self._arena.data

    def layer(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """``(k_pages, v_pages)`` views of one layer: [num_pages, Hkv, page_size, D] (hnd)."""
        return self._arena.layer(layer)

    def layer_scales(self, layer: int) -> tuple:
        """8-bit pages' ``(k_scales, v_scales)``, f32 [num_pages, Hkv, page_size]; else Nones."""
        return self._arena.layer_scales(layer)

    @property
    def kv_scales(self):
        """The scales beside :attr:`arena` (``CacheConfig.scales_shape``), or None."""
        return self._arena.scales

    def write_kv(self, layer: int, slots, k: np.ndarray, v: np.ndarray) -> None:
        """Write ``k, v`` ([n, num_kv_heads, head_dim]) into ``slots`` (int64 [n])."""
        self._arena.write(layer, slots, k, v)

    def read_pages(self, page_ids) -> tuple:
        """Copies of pages as stored, every layer: ``[L, 2, n, Hkv, page_size, D]`` and
        their scales (8-bit pages) or None. With :meth:`write_slots`, how KV moves out
        of the arena and back (swap, tiers) without touching :attr:`arena`."""
        return self._arena.read_pages(page_ids)

    def write_slots(self, slots, rows: np.ndarray, scales=None) -> None:
        """Store token rows exactly as read (``rows`` [n, L, 2, Hkv, D], ``scales``
        [n, L, 2, Hkv] or None): nothing is quantized twice."""
        self._arena.write_slots(slots, rows, scales)

    # ------------------------------------------------------------- sequences
    def add_sequence(self, seq_id, prompt, extra_key=None) -> int:
        """Start a sequence; reuse cached pages of its prompt's prefix.

        Returns the number of prompt tokens reused (a multiple of page_size, at
        most ``len(prompt) - 1`` so the last prompt token is always computed).
        Those tokens count as written; nothing is allocated but the pages
        :attr:`tiers` copy back from below the arena.
        """
        self._check_new_id(seq_id, "seq_id")
        prompt = as_token_ids(prompt, "prompt")
        key = as_extra_key(extra_key)
        cap = (len(prompt) - 1) // self.page_size * self.page_size  # keep one token to compute
        # Nothing below can fail: the match, its lock and its references commit together.
        pages, handle = self.prefix_index.match_prefix(prompt[:cap], key)
        self.prefix_index.lock(handle)               # pinned while this sequence lives
        for p in pages:
            self.pool.touch(p, seq_id)               # a reference on each hit page
        n_hit = len(pages) * self.page_size
        self._seqs[seq_id] = Sequence(seq_id, key, prompt[:n_hit], list(pages),
                                      prefix_handle=handle, num_indexed_pages=len(pages))
        if self.tiers is not None:      # the next pages, from the host pool or the disk
            n_hit += self.tiers.load_prefix(self, seq_id, prompt[:cap], n_hit)
        self._hits += n_hit
        self._queries += len(prompt)
        return n_hit

    def num_cached_prefix_tokens(self, prompt, extra_key=None, memo=None) -> int:
        """Prompt tokens :meth:`add_sequence` would reuse now, changing nothing.

        For a scheduler that ranks waiting requests by cached prefix. ``memo``
        is an optional dict the caller keeps per request (its prompt may only
        grow) in which the index keeps work between calls: the hash chain
        keeps the prompt's page hashes there, as vLLM keeps them on its ``Request``.
        """
        prompt = as_token_ids(prompt, "prompt")
        key = as_extra_key(extra_key)
        if memo is not None and not isinstance(memo, dict):
            raise DTypeError(f"memo must be a dict or None, got {type(memo).__name__}")
        cap = (len(prompt) - 1) // self.page_size * self.page_size
        return self.prefix_index.prefix_length(prompt[:cap], key, memo)

    @property
    def num_available_pages(self) -> int:
        """Pages an allocation can get now: FREE ones plus evictable CACHED ones."""
        return self.pool.num_available

    def num_pages_needed(self, seq_id, n: int) -> int:
        """Pages ``allocate_slots(seq_id, n)`` would take from the pool, copy-on-write
        copies included (0 when the sequence's own pages have room). Changes nothing.

        Raises ``SequenceTooLong`` when the sequence could never fit in the arena.
        """
        seq, n = self._get(seq_id), check_positive_int("n", n)
        if n == 1 and self._last_page_has_room(seq):      # decode's common case
            return 0
        return self._plan(seq, n)[2]

    def can_allocate(self, seq_id, n: int) -> bool:
        """Whether ``allocate_slots(seq_id, n)`` would succeed now (vLLM's ``can_allocate``)."""
        return self.num_pages_needed(seq_id, n) <= self.pool.num_available

    def allocate_slots(self, seq_id, n: int) -> np.ndarray:
        """Slots (int64 [n]) for positions ``[num_computed_tokens, num_computed_tokens + n)``.

        Allocates pages as needed (evicting cached pages under the policy) and
        copies any shared page that would be written (copy-on-write). Calling
        it again before ``append_tokens`` returns the same positions' slots.
        Raises ``OutOfPages`` and changes nothing when the pages are not there
        (ask :meth:`can_allocate` first to avoid it); its subclass
        ``SequenceTooLong`` when they never will be.
        """
        seq = self._get(seq_id)
        n = check_positive_int("n", n)
        ps = self.page_size
        start, bt = seq.num_computed_tokens, seq.block_table
        if n == 1 and self._last_page_has_room(seq):
            # Decode's common case: one token into a last page only we hold. Nothing
            # to allocate or copy; the general path below would return the same slot.
            seq.num_pending = 1
            return np.array([bt[-1] * ps + start % ps], dtype=np.int64)
        pages_needed, cow, n_new = self._plan(seq, n)
        if n_new and n_new > self.pool.num_available:
            raise OutOfPages(
                f"sequence {seq_id!r} needs {n_new} more pages for n={n} tokens, only "
                f"{self.pool.num_available} free or cached"
            )
        # Commit: nothing below can fail.
        fresh = self.pool.allocate_many(n_new, seq_id) if n_new else ()
        for i, dst in zip(cow, fresh):
            self.copy_on_write(seq, i, dst)
        bt.extend(fresh[len(cow):])
        while len(bt) > pages_needed:  # an earlier, larger pending call left spare pages
            self.pool.free(bt.pop(), seq_id)
        seq.num_pending = n
        return slots_of(bt, start, n, ps)

    def copy_on_write(self, seq: Sequence, i: int, dst: int) -> None:
        """Give ``seq`` its own copy of its shared page ``i`` in the fresh page ``dst``.

        The seam of copy-on-write: the page's K/V (every layer, scales too) is
        copied, the block table points at the copy, and ``seq``'s reference to
        the shared page is dropped (its other holders keep it).
        """
        src = seq.block_table[i]
        self._arena.copy_page(src, dst)
        seq.block_table[i] = dst
        self.pool.free(src, seq.seq_id)  # drop our reference to the shared page
        self._cow_copies += 1
        self._log("cow", dst, seq.seq_id)

    def _last_page_has_room(self, seq: Sequence) -> bool:
        """The next token goes into the sequence's last page, which only it holds."""
        bt = seq.block_table
        return (seq.num_computed_tokens // self.page_size == len(bt) - 1 and bt[-1] >= 0
                and self.pool.ref_count(bt[-1]) == 1)

    def _plan(self, seq: Sequence, n: int) -> tuple[int, list, int]:
        """For ``n`` more tokens: ``(pages the table must have, indices to copy, new pages)``."""
        ps = self.page_size
        start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
        bt = seq.block_table
        pages_needed = -(-end // ps)
        released = seq.num_released_pages  # pages given back by release_pages_before
        if pages_needed - released > self.cfg.num_pages:
            raise SequenceTooLong(
                f"n={n}: sequence {seq.seq_id!r} would need {pages_needed - released} pages, "
                f"more than the arena's num_pages={self.cfg.num_pages}: it can never fit"
            )
        # Pages this step writes into that someone else also holds: copy them first.
        ref = self.pool.ref_count
        cow = [i for i in range(start // ps, min(len(bt), pages_needed)) if ref(bt[i]) > 1]
        return pages_needed, cow, max(0, pages_needed - len(bt)) + len(cow)

    def append_tokens(self, seq_id, token_ids) -> None:
        """Record tokens whose KV is now written; newly full pages join the prefix index."""
        seq = self._get(seq_id)
        ids = as_token_ids(token_ids, "token_ids", allow_empty=True)
        if len(ids) > seq.num_pending:
            raise InvalidArgument(
                f"token_ids: {len(ids)} tokens appended but only {seq.num_pending} slots "
                f"allocated for sequence {seq_id!r} (call allocate_slots first)"
            )
        seq.token_ids.extend(ids)
        seq.num_pending -= len(ids)
        ps = self.page_size
        done, full = seq.num_indexed_pages, seq.num_computed_tokens // ps
        if full == done:
            return
        old = seq.prefix_handle
        new, _ = self.prefix_index.insert(seq.token_ids[done * ps:full * ps],
                                          seq.block_table[done:full], old, seq.extra_key, seq_id)
        if new is not old:
            self.prefix_index.lock(new)     # lock the longer prefix before
            self.prefix_index.unlock(old)   # letting go of its start
        seq.prefix_handle, seq.num_indexed_pages = new, full

    def discard_pending(self, seq_id) -> int:
        """Drop the slots allocated but not appended; returns the pages given back.

        Speculative decoding allocates slots for an input token and ``k``
        drafts and appends only the verified tokens; this takes the sequence
        back to its written length. Pages wholly past it (fresh pages of that
        allocation, never indexed: only full written pages are) go FREE, tail
        first; a partly written last page (or its copy-on-write copy) stays.
        """
        seq = self._get(seq_id)
        bt, keep = seq.block_table, -(-seq.num_computed_tokens // self.page_size)
        freed = max(0, len(bt) - keep)                 # pages past the written tokens
        for _ in range(freed):
            self.pool.free(bt.pop(), seq_id)
        seq.num_pending = 0
        return freed

    def fork(self, parent_id, child_id) -> None:
        """The child shares the parent's pages and tokens; writes copy on demand."""
        parent = self._get(parent_id)
        self._check_new_id(child_id, "child_id")
        if parent.num_pending:
            raise InvalidArgument(
                f"parent_id {parent_id!r} has {parent.num_pending} allocated but unwritten "
                "slots: append_tokens before fork"
            )
        child = parent.copy(child_id)
        for p in child.held_pages():  # the sink pages too: forks share them
            self.pool.share(p)
            self._log("fork", p, child_id)
        self.prefix_index.lock(child.prefix_handle)  # the child uses the parent's prefix
        self._seqs[child_id] = child

    def free(self, seq_id) -> None:
        """Release a sequence. Its full, indexed pages become CACHED, the rest FREE.

        Pages are released tail-first so that, under LRU, a sequence's later
        pages are evicted before its prefix pages (a prefix is more likely to
        be shared by the next request).
        """
        seq = self._get(seq_id)
        for p in reversed(seq.held_pages()):
            self.pool.free(p, seq_id)
        self.prefix_index.unlock(seq.prefix_handle)  # its prefix may now be evicted
        del self._seqs[seq_id]

    def release_pages_before(self, seq_id, num_tokens: int, keep_first: int = 0) -> int:
        """Give back the pages that hold only positions in ``[keep_first, num_tokens)``.

        With a sliding window of ``w`` tokens, a query at position ``p`` never
        reads keys before ``p - w + 1``, so once a sequence's next query is at
        ``p`` the pages wholly before that are dead weight, bar those holding
        one of the ``keep_first`` attention sinks, which every query reads (they
        stay pinned). The rest are released like in :meth:`free` (full, indexed
        pages become CACHED, so a later prompt can still hit them) and their
        block-table entries become -1 (one run, right after the sink pages); the
        sequence keeps its tokens and its hash chain. Returns the pages released.
        """
        seq = self._get(seq_id)
        num_tokens = check_int("num_tokens", num_tokens)
        keep = -(-check_int("keep_first", keep_first, low=0) // self.page_size)  # sink pages
        bt, ps = seq.block_table, self.page_size
        run = seq.num_released_pages  # released before: one run, from bt.index(-1)
        first = max(keep, bt.index(-1) + run if run else 0)  # the first page to release
        # Whole pages below num_tokens, and only pages whose tokens are all written.
        last = min(max(num_tokens, 0) // ps, len(bt), seq.num_computed_tokens // ps)
        for i in range(last - 1, first - 1, -1):  # tail-first, as in free()
            self.pool.free(bt[i], seq_id)
            bt[i] = -1
        return max(0, last - first)

    # --------------------------------------------------------------- queries
    def batch(self, seq_ids) -> BatchMetadata:
        """Block tables (int32 [B, max_pages], -1 padded) and seq_lens (int32 [B])."""
        try:
            seqs = [self._seqs[s] for s in seq_ids]
        except (KeyError, TypeError):  # name the unknown id
            seqs = [self._get(s) for s in seq_ids]
        return BatchMetadata.of(list(seq_ids), seqs, self.page_size)

    def block_table(self, seq_id) -> np.ndarray:
        """int32 [num_pages_of_seq]: logical page -> page id."""
        return np.array(self._get(seq_id).block_table, dtype=np.int32)

    def sequence(self, seq_id) -> Sequence:
        """The bookkeeping object of one sequence (read it, do not change it)."""
        return self._get(seq_id)

    def num_released_pages(self, seq_id) -> int:
        """Block-table entries given back by :meth:`release_pages_before` (-1 now)."""
        return self._get(seq_id).num_released_pages

    def num_computed_tokens(self, seq_id) -> int:
        """Tokens of the sequence whose KV is written."""
        return self._get(seq_id).num_computed_tokens

    def __contains__(self, seq_id) -> bool:
        return seq_id in self._seqs

    @property
    def seq_ids(self) -> list:
        return list(self._seqs)

    def stats(self) -> dict:
        """Pool counts and counters. ``hits``/``queries``/``hit_rate``: tokens reused over
        tokens passed to every ``add_sequence`` call, whatever the reason for the call (a
        re-admission after preemption, a retry, a new prompt); the engine's
        ``metrics["prefix_hit_rate"]`` counts prompts at their first admission only."""
        pool = self.pool
        out = {
            "num_pages": self.cfg.num_pages,
            "num_free": pool.num_free,
            "num_cached": pool.num_cached,
            "num_in_use": pool.num_in_use,
            "num_sequences": len(self._seqs),
            "hits": self._hits,
            "queries": self._queries,
            "hit_rate": self._hits / self._queries if self._queries else 0.0,
            "evictions": pool.num_evictions,
            "cow_copies": self._cow_copies,
            "usage": pool.num_in_use / self.cfg.num_pages,
            "prefix_cache": self.prefix_index.kind,
        }
        out.update(self.prefix_index.stats())  # indexed_pages, and radix_* for the tree
        return out

    def mark_used(self, page_id: int) -> None:
        """Mark a CACHED page as just used: under LRU it moves to the young end
        (with the tree, its whole path does). Not vLLM's ``touch``, which takes a
        reference (that is :meth:`PagePool.touch`)."""
        if self.pool.state(page_id) != CACHED:
            raise StalePage(f"page_id {page_id} is not cached: only cached pages can be marked")
        self.prefix_index.mark_used(page_id)

    def check_invariants(self) -> None:
        """Raise AssertionError naming the first broken invariant (:mod:`.invariants`)."""
        check_cache_invariants(self)

    # --------------------------------------------------------------- helpers
    def _get(self, seq_id) -> Sequence:
        try:
            return self._seqs[seq_id]
        except (KeyError, TypeError):
            raise UnknownSequence(f"seq_id {seq_id!r} is not in the cache") from None

    def _check_new_id(self, seq_id, name: str) -> None:
        if isinstance(seq_id, bool) or not isinstance(seq_id, (str, int, np.integer)):
            raise DTypeError(f"{name} must be a str or int, got {type(seq_id).__name__}")
        if seq_id in self._seqs:
            raise DuplicateSequence(f"{name} {seq_id!r} is already in the cache")
