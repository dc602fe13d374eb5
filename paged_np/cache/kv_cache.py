"""PagedKVCache: the facade over the arena, the page pool and the sequences.

The life of a sequence is four calls (see docs/design.md)::

    n_hit = cache.add_sequence("a", prompt)   # reuse cached prefix pages
    slots = cache.allocate_slots("a", n)      # slots for the next n tokens
    cache.write_kv(layer, slots, k, v)        # once per layer
    cache.append_tokens("a", new_ids)         # now written; full pages hashed

Every public method validates its arguments first and only then changes
state, so a refused call (a bad argument, ``OutOfPages``) leaves the pool, the
block tables, the stats and the arena exactly as they were.

Compared with vLLM: one ``PagedKVCache`` plays the parts of ``KVCacheManager``
(+ ``BlockPool``) and the attention backend's ``reshape_and_cache``. There is
no scheduler here (see :mod:`paged_np.engine.engine`), no GPU/CPU split and no
multi-group (hybrid) cache.

``CacheConfig(prefix_cache="radix")`` swaps the hash chain for SGLang's radix
tree (:mod:`.radix`) behind the same methods: ``add_sequence`` matches and
locks a path, ``append_tokens`` inserts full pages below it, ``fork`` shares
the lock, ``free`` releases it. One difference: pages a sliding window
releases (``release_pages_before``) stay in the tree, pinned under the live
sequence's path, until the sequence ends.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import namedtuple
from dataclasses import dataclass

import numpy as np

from ..checks import as_extra_key, as_token_ids, check_int, check_positive_int
from ..config import CacheConfig
from ..errors import (
    DTypeError,
    DuplicateSequence,
    InvalidArgument,
    OutOfPages,
    UnknownSequence,
)
from .arena import Arena
from .page_pool import PagePool
from .sequence import Sequence, hash_page

#: One entry of ``cache.events``: ``kind`` is one of allocate, evict, hit, cache,
#: free, cow, fork, hash (a page joined the hash index), insert (a page joined
#: the radix tree).
Event = namedtuple("Event", "step kind page_id seq_id")


@dataclass
class BatchMetadata:
    """What a kernel needs for a batch of sequences.

    ``block_tables`` is int32 [B, max_pages], padded with -1; ``seq_lens`` is
    int32 [B] (written tokens plus any pending ``allocate_slots``).
    """

    seq_ids: list
    block_tables: np.ndarray
    seq_lens: np.ndarray
    page_size: int

    def to_csr(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """FlashInfer's layout: ``kv_indptr`` int32 [B+1], ``kv_indices`` int32 [nnz],
        ``kv_last_page_len`` int32 [B].

        Sequence ``b``'s pages are ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]``
        (only the pages its ``seq_len`` reaches); its last page holds
        ``kv_last_page_len[b]`` tokens (0 for an empty sequence).
        """
        ps = self.page_size
        n_pages = (self.seq_lens.astype(np.int64) + ps - 1) // ps  # [B]
        indptr = np.zeros(len(self.seq_lens) + 1, dtype=np.int32)
        np.cumsum(n_pages, out=indptr[1:])
        cols = np.arange(self.block_tables.shape[1])  # [max_pages]
        indices = self.block_tables[cols[None, :] < n_pages[:, None]]  # row-major: in order
        last = np.where(self.seq_lens > 0, (self.seq_lens - 1) % ps + 1, 0).astype(np.int32)
        return indptr, indices.astype(np.int32), last


class PagedKVCache:
    """A paged KV cache over one preallocated arena.

    Parameters
    ----------
    cfg : CacheConfig
        Shapes, dtype and eviction policy.
    record_events : bool
        Keep the ``events`` log (for drawings). Turn it off for long runs.
    device : str
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
        if device not in ("cpu", "cuda"):
            raise InvalidArgument(f"device must be 'cpu' or 'cuda', got {device!r}")
        self.cfg = cfg
        self.page_size = cfg.page_size
        self.device = device
        if device == "cuda":  # the arena as a device array; raises CudaUnavailable without one
            from ..attention.numba_cuda import DeviceArena
            self._arena = DeviceArena(cfg)
        else:
            self._arena = Arena(cfg)
        self.pool = PagePool(cfg.num_pages, cfg.page_size, cfg.eviction_policy,
                             cfg.prefix_cache)
        self.tree = self.pool.tree  # the radix tree, or None with the hash chain
        self.pool.listener = self._on_pool_event
        self._seqs: dict[object, Sequence] = {}
        self.events: list[Event] = []
        self.record_events = record_events
        self.clock = 0
        self._actor = None  # seq id named in events the pool emits
        self._hits = 0
        self._queries = 0
        self._cow_copies = 0

    # ----------------------------------------------------------------- arena
    @property
    def arena(self) -> np.ndarray:
        """The one ndarray holding every page (a numba device array when device="cuda")."""
        return self._arena.data

    def layer(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """``(k_pages, v_pages)`` views of one layer, each [num_pages, Hkv, page_size, D]."""
        return self._arena.layer(layer)

    def write_kv(self, layer: int, slots, k: np.ndarray, v: np.ndarray) -> None:
        """Write ``k, v`` ([n, num_kv_heads, head_dim]) into ``slots`` (int64 [n])."""
        self._arena.write(layer, slots, k, v)

    # ------------------------------------------------------------- sequences
    def add_sequence(self, seq_id, prompt, extra_key=None) -> int:
        """Start a sequence; reuse cached pages of its prompt's prefix.

        Returns the number of prompt tokens reused (a multiple of page_size, at
        most ``len(prompt) - 1`` so the last prompt token is always computed).
        Those tokens count as written; nothing else is allocated.
        """
        self._check_new_id(seq_id, "seq_id")
        prompt = as_token_ids(prompt, "prompt")
        key = as_extra_key(extra_key)
        seq = Sequence(seq_id, key)
        ps = self.page_size
        if self.tree is not None:
            return self._add_sequence_radix(seq, prompt)
        hits = []
        parent = seq.last_hash()
        for i in range((len(prompt) - 1) // ps):  # full pages below the len - 1 cap
            page_tokens = prompt[i * ps:(i + 1) * ps]
            h = hash_page(parent, page_tokens, key)
            p = self.pool.lookup(h, page_tokens)
            if p is None:
                break
            hits.append((p, h))
            parent = h
        # Nothing below can fail: commit.
        self._actor = seq_id
        for p, h in hits:
            self.pool.acquire(p)
            seq.block_table.append(p)
            seq.page_hashes.append(h)
        n_hit = len(hits) * ps
        seq.token_ids = prompt[:n_hit]
        self._seqs[seq_id] = seq
        self._hits += n_hit
        self._queries += len(prompt)
        return n_hit

    def _add_sequence_radix(self, seq: Sequence, prompt: list) -> int:
        ps = self.page_size
        cap = (len(prompt) - 1) // ps * ps          # keep the last prompt token to compute
        pages, node = self.tree.match_prefix(prompt[:cap], seq.extra_key)
        self._actor = seq.seq_id
        self.tree.inc_lock_ref(node)                 # pinned while this sequence lives
        for p in pages:
            self.pool.acquire(p)
        seq.block_table.extend(pages)
        seq.radix_node, seq.radix_pages = node, len(pages)
        n_hit = len(pages) * ps
        seq.token_ids = prompt[:n_hit]
        self._seqs[seq.seq_id] = seq
        self._hits += n_hit
        self._queries += len(prompt)
        return n_hit

    def num_cached_prefix_tokens(self, prompt, extra_key=None, page_hashes=None) -> int:
        """Prompt tokens :meth:`add_sequence` would reuse now, changing nothing.

        For a scheduler that ranks waiting requests by cached prefix. With the
        hash chain, pass ``page_hashes`` from :meth:`prompt_page_hashes` to skip
        re-hashing a prompt that is asked about every step (vLLM keeps them
        on its ``Request`` for the same reason).
        """
        prompt = as_token_ids(prompt, "prompt")
        key = as_extra_key(extra_key)
        ps = self.page_size
        cap = (len(prompt) - 1) // ps * ps
        if self.tree is not None:
            return self.tree.prefix_length(prompt[:cap], key)
        if page_hashes is None:
            page_hashes = self.prompt_page_hashes(prompt, key)
        n = 0
        for h in page_hashes[:cap // ps]:
            if self.pool.lookup(h, prompt[n:n + ps]) is None:
                break
            n += ps
        return n

    def prompt_page_hashes(self, prompt, extra_key=None) -> list:
        """The hash chain of a prompt's full pages (below the ``len - 1`` cap)."""
        prompt = as_token_ids(prompt, "prompt")
        key = as_extra_key(extra_key)
        ps = self.page_size
        out, parent = [], Sequence(None).last_hash()
        for i in range((len(prompt) - 1) // ps):
            parent = hash_page(parent, prompt[i * ps:(i + 1) * ps], key)
            out.append(parent)
        return out

    def allocate_slots(self, seq_id, n: int) -> np.ndarray:
        """Slots (int64 [n]) for positions ``[num_computed_tokens, num_computed_tokens + n)``.

        Allocates pages as needed (evicting cached pages under the policy) and
        copies any shared page that would be written (copy-on-write). Calling
        it again before ``append_tokens`` returns the same positions' slots.
        Raises ``OutOfPages`` and changes nothing when the pages are not there.
        """
        seq = self._get(seq_id)
        n = check_positive_int("n", n)
        ps = self.page_size
        start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
        bt = seq.block_table
        last = len(bt) - 1
        if n == 1 and start // ps == last and bt[last] >= 0 and self.pool._ref[bt[last]] == 1:
            # Decode's common case: one token into a last page only we hold. Nothing
            # to allocate or copy; the general path below would return the same slot.
            seq.num_pending = 1
            return np.array([bt[last] * ps + start % ps], dtype=np.int64)
        pages_needed = -(-end // ps)
        released = _num_released(bt)  # pages given back by release_pages_before
        if pages_needed - released > self.cfg.num_pages:
            raise InvalidArgument(
                f"n={n}: the sequence would need {pages_needed - released} pages, more than "
                f"the arena's num_pages={self.cfg.num_pages}"
            )
        # Pages this step writes into that someone else also holds: copy them first.
        ref = self.pool._ref  # read-only peek; the pool validated these ids when they came
        cow = [i for i in range(start // ps, min(len(bt), pages_needed)) if ref[bt[i]] > 1]
        n_new = max(0, pages_needed - len(bt)) + len(cow)
        if n_new and n_new > self.pool.num_available:
            raise OutOfPages(
                f"sequence {seq_id!r} needs {n_new} more pages for n={n} tokens, only "
                f"{self.pool.num_available} free or cached"
            )
        # Commit: nothing below can fail.
        self._actor = seq_id
        fresh = self.pool.allocate_many(n_new) if n_new else ()
        for i, dst in zip(cow, fresh):
            src = bt[i]
            self._arena.copy_page(src, dst)
            bt[i] = dst
            self.pool.free(src)  # drop our reference to the shared page
            self._cow_copies += 1
            self._log("cow", dst)
        bt.extend(fresh[len(cow):])
        while len(bt) > pages_needed:  # an earlier, larger pending call left spare pages
            self.pool.free(bt.pop())
        seq.num_pending = n
        return self._slots(bt, start, n)

    def append_tokens(self, seq_id, token_ids) -> None:
        """Record tokens whose KV is now written; hash and index newly full pages."""
        seq = self._get(seq_id)
        ids = as_token_ids(token_ids, "token_ids", allow_empty=True)
        if len(ids) > seq.num_pending:
            raise InvalidArgument(
                f"token_ids: {len(ids)} tokens appended but only {seq.num_pending} slots "
                f"allocated for sequence {seq_id!r} (call allocate_slots first)"
            )
        self._actor = seq_id
        seq.token_ids.extend(ids)
        seq.num_pending -= len(ids)
        ps = self.page_size
        if self.tree is not None:
            self._insert_full_pages(seq)
            return
        for i in range(len(seq.page_hashes), seq.num_computed_tokens // ps):  # newly full pages
            page_tokens = seq.token_ids[i * ps:(i + 1) * ps]
            h = hash_page(seq.last_hash(), page_tokens, seq.extra_key)
            seq.page_hashes.append(h)
            if self.pool.register(seq.block_table[i], h, page_tokens):
                self._log("hash", seq.block_table[i])

    def _insert_full_pages(self, seq: Sequence) -> None:
        """Radix: put newly full pages in the tree below the sequence's node; move its lock."""
        ps = self.page_size
        full = seq.num_computed_tokens // ps
        if full == seq.radix_pages:
            return
        key = seq.token_ids[seq.radix_pages * ps:full * ps]
        value = seq.block_table[seq.radix_pages:full]
        old = seq.radix_node
        node, added = self.tree.insert(key, value, old, seq.extra_key)
        if node is not old:
            self.tree.inc_lock_ref(node)             # lock the longer path before
            self.tree.dec_lock_ref(old)              # letting go of its prefix
        seq.radix_node, seq.radix_pages = node, full
        for p in added:
            self._log("insert", p)

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
        for p in child.block_table[_num_released(child.block_table):]:
            self.pool.share(p)
            self._log("fork", p, child_id)
        if self.tree is not None:
            self.tree.inc_lock_ref(child.radix_node)  # the child uses the parent's path
        self._seqs[child_id] = child

    def free(self, seq_id) -> None:
        """Release a sequence. Its full, indexed pages become CACHED, the rest FREE.

        Pages are released tail-first so that, under LRU, a sequence's later
        pages are evicted before its prefix pages (a prefix is more likely to
        be shared by the next request).
        """
        seq = self._get(seq_id)
        self._actor = seq_id
        for p in reversed(seq.block_table[_num_released(seq.block_table):]):
            self.pool.free(p)
        if self.tree is not None:
            self.tree.dec_lock_ref(seq.radix_node)   # its path may now be evicted, leaves first
        del self._seqs[seq_id]

    def release_pages_before(self, seq_id, num_tokens: int) -> int:
        """Give back the pages that hold only positions ``< num_tokens`` (sliding window).

        With a sliding window of ``w`` tokens, a query at position ``p`` never
        reads keys before ``p - w + 1``, so once a sequence's next query is at
        ``p`` the pages wholly before that are dead weight. They are released
        like in :meth:`free` (full, indexed pages become CACHED, so a later
        prompt can still hit them) and their block-table entries become -1;
        the sequence keeps its tokens and its hash chain. Released pages are
        always a prefix of the block table. Returns how many pages were released.
        """
        seq = self._get(seq_id)
        num_tokens = check_int("num_tokens", num_tokens)
        bt = seq.block_table
        first = _num_released(bt)
        ps = self.page_size
        # Whole pages below num_tokens, and only pages whose tokens are all written.
        last = min(max(num_tokens, 0) // ps, len(bt), seq.num_computed_tokens // ps)
        self._actor = seq_id
        for i in range(last - 1, first - 1, -1):  # tail-first, as in free()
            self.pool.free(bt[i])
            bt[i] = -1
        return max(0, last - first)

    # --------------------------------------------------------------- queries
    def batch(self, seq_ids) -> BatchMetadata:
        """Block tables (int32 [B, max_pages], -1 padded) and seq_lens (int32 [B])."""
        try:
            seqs = [self._seqs[s] for s in seq_ids]
        except (KeyError, TypeError):  # name the unknown id
            seqs = [self._get(s) for s in seq_ids]
        width = max((len(s.block_table) for s in seqs), default=0)
        tables = np.full((len(seqs), width), -1, dtype=np.int32)
        for b, s in enumerate(seqs):
            tables[b, :len(s.block_table)] = s.block_table
        lens = np.array([s.seq_len for s in seqs], dtype=np.int32)
        return BatchMetadata(list(seq_ids), tables, lens, self.page_size)

    def block_table(self, seq_id) -> np.ndarray:
        """int32 [num_pages_of_seq]: logical page -> page id."""
        return np.array(self._get(seq_id).block_table, dtype=np.int32)

    def sequence(self, seq_id) -> Sequence:
        """The bookkeeping object of one sequence (read it, do not change it)."""
        return self._get(seq_id)

    def num_released_pages(self, seq_id) -> int:
        """Leading block-table entries given back by :meth:`release_pages_before` (-1 now)."""
        return _num_released(self._get(seq_id).block_table)

    def num_computed_tokens(self, seq_id) -> int:
        """Tokens of the sequence whose KV is written."""
        return self._get(seq_id).num_computed_tokens

    def __contains__(self, seq_id) -> bool:
        return seq_id in self._seqs

    @property
    def seq_ids(self) -> list:
        return list(self._seqs)

    def stats(self) -> dict:
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
            "prefix_cache": self.cfg.prefix_cache,
        }
        if self.tree is not None:
            out["radix_nodes"] = self.tree.num_nodes
            out["radix_depth"] = self.tree.depth
            out["radix_locked_nodes"] = self.tree.num_locked_nodes
        return out

    def tick(self) -> int:
        """Advance the event clock by one step (the engine ticks once per step)."""
        self.clock += 1
        return self.clock

    def touch(self, page_id: int) -> None:
        """Mark a cached page as just used (see :meth:`PagePool.touch`)."""
        self.pool.touch(page_id)

    def check_invariants(self) -> None:
        """Raise AssertionError naming the first broken invariant."""
        self.pool.check_invariants()
        ps = self.page_size
        holders = [0] * self.cfg.num_pages
        for sid, s in self._seqs.items():
            assert len(s.block_table) * ps >= s.seq_len, f"sequence {sid!r}: too few pages"
            assert len(s.block_table) <= -(-s.seq_len // ps) or s.seq_len == 0, (
                f"sequence {sid!r} holds pages beyond its tokens"
            )
            if self.tree is None:
                assert len(s.page_hashes) == s.num_computed_tokens // ps, (
                    f"sequence {sid!r}: hash chain length")
            released = _num_released(s.block_table)
            assert all(p >= 0 for p in s.block_table[released:]), (
                f"sequence {sid!r}: a released (-1) page after a held one"
            )
            for i, p in enumerate(s.block_table):
                if i < released:
                    continue
                holders[p] += 1
                if self.tree is not None:
                    continue
                h = self.pool.page_hash(p)
                if h is not None:
                    assert i < len(s.page_hashes) and h == s.page_hashes[i], (
                        f"sequence {sid!r}: indexed page {p} has another prefix's hash"
                    )
        for p in range(self.cfg.num_pages):
            assert holders[p] == self.pool.ref_count(p), (
                f"ref_count of page {p} is {self.pool.ref_count(p)} but {holders[p]} "
                "block tables hold it"
            )
        if self.tree is not None:
            self._check_radix()

    def _check_radix(self) -> None:
        """Every sequence's path spells its full pages, holds its tree pages, and is locked."""
        ps = self.page_size
        tree = self.tree
        locks: dict[int, int] = {}
        for sid, s in self._seqs.items():
            path = tree.path(s.radix_node)
            top = path[0].parent if path else s.radix_node
            assert top is tree.root(s.extra_key), f"sequence {sid!r}: its node left the tree"
            assert s.radix_pages == s.num_computed_tokens // ps, (
                f"sequence {sid!r}: full pages not inserted")
            assert list(tree.tokens_to(s.radix_node)) == s.token_ids[:s.radix_pages * ps], (
                f"sequence {sid!r}: its tree path spells other tokens")
            path_pages = [p for n in path for p in n.value]
            for i, p in enumerate(s.block_table):
                if p >= 0 and tree.holds(p):
                    assert i < len(path_pages) and path_pages[i] == p, (
                        f"sequence {sid!r}: holds tree page {p} off its own path")
            for n in path:
                locks[n.id] = locks.get(n.id, 0) + 1
        for n in tree.nodes():
            assert n.lock_ref == locks.get(n.id, 0), (
                f"node {n.id}: lock_ref {n.lock_ref}, but {locks.get(n.id, 0)} live "
                "sequences pass through it")

    # --------------------------------------------------------------- helpers
    def _slots(self, bt: list, start: int, n: int) -> np.ndarray:
        ps = self.page_size
        if n <= 8:  # decode: a few tokens, where plain Python beats NumPy's call overhead
            return np.array([bt[t // ps] * ps + t % ps for t in range(start, start + n)],
                            dtype=np.int64)
        pos = np.arange(start, start + n, dtype=np.int64)  # [n] token positions
        pages = np.asarray(bt, dtype=np.int64)[pos // self.page_size]  # [n] page ids
        return pages * self.page_size + pos % self.page_size  # [n] slots

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

    def _on_pool_event(self, kind: str, page_id: int) -> None:
        self._log(kind, page_id)

    def _log(self, kind: str, page_id: int, seq_id=None) -> None:
        if self.record_events:
            self.events.append(Event(self.clock, kind, page_id,
                                     self._actor if seq_id is None else seq_id))


def _num_released(block_table: list) -> int:
    """Leading -1 entries of a block table (pages given back by release_pages_before)."""
    if not block_table or block_table[0] >= 0:  # the common case: nothing released
        return 0
    return bisect_left(block_table, True, key=lambda p: p >= 0)
