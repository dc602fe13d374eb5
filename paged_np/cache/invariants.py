"""The cache's invariants, checked in one place (docs/design.md, "Invariants").

:meth:`PagedKVCache.check_invariants <paged_np.cache.kv_cache.PagedKVCache.check_invariants>`
calls :func:`check_cache_invariants`; the state-machine tests call it after
every operation. It reads the cache through its public methods only.
"""

from __future__ import annotations


def check_cache_invariants(cache) -> None:
    """Raise AssertionError naming the first broken invariant of ``cache``.

    The pool's own (conservation, free list), then per sequence: just enough
    pages for its written and pending tokens (so none past them: a rollback
    gave back what it did not keep), released (-1) entries in one run (at the start,
    or after the attention sinks' pages),
    every full written page shown to the index; then every page's ``ref_count``
    equals the block tables that hold it, and the index agrees with each
    sequence's handle.
    """
    cache.pool.check_invariants()
    ps = cache.page_size
    holders = [0] * cache.cfg.num_pages
    seqs = [cache.sequence(sid) for sid in cache.seq_ids]
    for s in seqs:
        sid = s.seq_id
        assert len(s.block_table) * ps >= s.seq_len, f"sequence {sid!r}: too few pages"
        assert len(s.block_table) <= -(-s.seq_len // ps) or s.seq_len == 0, (
            f"sequence {sid!r} holds pages beyond its tokens")
        assert s.num_indexed_pages == s.num_computed_tokens // ps, (
            f"sequence {sid!r}: full pages not indexed")
        bt, released = s.block_table, cache.num_released_pages(sid)
        first = bt.index(-1) if released else 0
        assert all(p < 0 for p in bt[first:first + released]), (
            f"sequence {sid!r}: released (-1) pages are not one run")
        for p in s.held_pages():
            holders[p] += 1
    for p in range(cache.cfg.num_pages):
        assert holders[p] == cache.pool.ref_count(p), (
            f"ref_count of page {p} is {cache.pool.ref_count(p)} but {holders[p]} "
            "block tables hold it")
    cache.prefix_index.check_sequences(seqs)
