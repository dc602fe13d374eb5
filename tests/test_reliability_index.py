"""Index arithmetic past 2**31: slots are int64 everywhere, nothing wraps.

A slot is ``page_id * page_size + offset``; with ``num_pages * page_size``
above 2**31 an int32 slot (or position) would wrap to a negative number and
write into the wrong page. These tests use metadata only (no arena of that
size), except one that builds a real cache over a lazily-zeroed arena of
8 GiB *virtual* memory, of which it touches a few kilobytes (skipped where the
OS refuses the reservation).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from attention_cases import TOL, available_backends, make_paged_case, rel_error

import paged_np as pnp
from paged_np.attention.reference import dense_attention
from paged_np.cache.arena import Arena
from paged_np.cache.kv_cache import BatchMetadata
from paged_np.cache.sequence import slots_of

INT32_MAX = 2**31 - 1
BACKENDS = available_backends()


def test_num_slots_is_exact_past_2_pow_31():
    cfg = pnp.CacheConfig(num_pages=2**12, page_size=2**20, head_dim=1)
    assert cfg.num_slots == 2**32 and isinstance(cfg.num_slots, int)
    assert cfg.bytes_per_page == 2 * 2**20 * 4


def test_slot_formula_is_int64_for_huge_page_ids():
    """slots_of (the formula allocate_slots returns) on page ids near 2**25."""
    bt = [5, 2**25 - 1, 2**25 - 2]
    slots = slots_of(bt, 100, 200, 128)                  # positions 100..299, three pages
    assert slots.dtype == np.int64
    want = [bt[p // 128] * 128 + p % 128 for p in range(100, 300)]  # Python ints: exact
    assert slots.tolist() == want
    assert slots.max() == (2**25 - 1) * 128 + 127 > 2**31


def test_arena_slot_check_in_int64():
    """Arena.check_slots against a config of 2**32 slots: no wrap of huge or unsigned slots."""
    fake = SimpleNamespace(cfg=pnp.CacheConfig(num_pages=2**25, page_size=128, head_dim=1))
    ok = Arena.check_slots(fake, np.array([0, 2**31, 2**32 - 1], np.int64))
    assert ok.dtype == np.int64 and ok.tolist() == [0, 2**31, 2**32 - 1]
    assert Arena.check_slots(fake, np.array([2**31 + 7], np.uint64)).tolist() == [2**31 + 7]
    for bad in (np.array([2**32], np.int64), np.array([-1], np.int64),
                np.array([2**63 + 5], np.uint64), np.array([2**64 - 1], np.uint64)):
        with pytest.raises(pnp.IndexOutOfRange, match="slot"):
            Arena.check_slots(fake, bad)


def test_csr_export_with_page_ids_near_int32_max():
    """to_csr on block tables holding ids up to 2**31 - 1 and seq_lens up to 2**31 - 1."""
    ps = 2**20
    lens = [INT32_MAX, 3 * ps + 1, 0]                    # 2048, 4 and 0 pages
    width = -(-INT32_MAX // ps)
    tables = np.full((3, width), -1, np.int32)
    tables[0] = INT32_MAX - np.arange(width)             # ids near the int32 ceiling
    tables[1, :4] = [INT32_MAX - 5000, 7, INT32_MAX, 0]
    meta = BatchMetadata(["x", "y", "z"], tables, np.array(lens, np.int32), ps)
    indptr, indices, last = meta.to_csr()
    assert indptr.tolist() == [0, width, width + 4, width + 4]
    assert indices.tolist() == tables[0].tolist() + [INT32_MAX - 5000, 7, INT32_MAX, 0]
    assert last.tolist() == [(INT32_MAX - 1) % ps + 1, 1, 0]
    assert indices.min() >= 0                             # nothing wrapped negative


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_at_positions_near_2_pow_31(backend):
    """A chunk of queries at positions ~2**31 - 2: the window's two pages are the only
    ones in the cache; every older block-table entry is -1 (given back)."""
    ps, window, seq_len, n_q = 2**16, 70_000, INT32_MAX, 3
    rng = np.random.default_rng(0)
    n_pages = -(-seq_len // ps)                           # 32768 block-table columns
    # [3, KV=1, ps, D]. Keys of the live pages older than the window are real but
    # must be masked: large garbage. Slots past seq_len and page 1 (unused): NaN.
    pages = rng.uniform(-1e3, 1e3, (3, 1, ps, 8)).astype(np.float32)
    pages[1] = np.nan
    pages[0, :, (seq_len - 1) % ps + 1:] = np.nan         # page 0 holds the last tokens
    v_pages = pages * np.float32(0.5)                     # other garbage, same NaNs
    table = np.full((1, n_pages), -1, np.int32)
    table[0, -2:] = [2, 0]                                # the window's pages, out of order
    lo = seq_len - n_q - window + 1                       # first key any query can see
    pos = np.arange(lo, seq_len)                          # [K] positions of those keys
    k = rng.standard_normal((len(pos), 1, 8)).astype(np.float32)   # [K, 1, D]
    v = rng.standard_normal((len(pos), 1, 8)).astype(np.float32)
    page_of = table[0, pos // ps]                         # [K] page ids
    pages[page_of, 0, pos % ps] = k[:, 0]
    v_pages[page_of, 0, pos % ps] = v[:, 0]
    q = rng.standard_normal((n_q, 2, 8)).astype(np.float32)  # GQA: 2 query heads
    out, lse = pnp.paged_attention(q, pages, v_pages, table, np.array([seq_len], np.int32),
                                   np.array([0, n_q], np.int32), sliding_window=window,
                                   backend=backend, return_lse=True)
    # Dense truth over the same keys: query i sits at seq_len - n_q + i, the keys at
    # lo.. are the last len(pos) positions, so dense causal attention lines them up.
    ref_out, ref_lse = dense_attention(q, k, v, sliding_window=window)
    assert rel_error(out, ref_out) <= TOL and rel_error(lse, ref_lse) <= TOL


@pytest.mark.parametrize("backend", BACKENDS)
def test_garbage_past_a_sequence_may_exceed_int32(backend):
    """int64 block tables whose unused entries do not fit in int32 are accepted (never
    read), while a used entry that would wrap to a valid id is refused."""
    case = make_paged_case([20, 9], [3, 9], page_size=8, pad_value=2**40 + 1, seed=2)
    assert case.block_tables.dtype == np.int64
    out = pnp.paged_attention(*case.args(), backend=backend)
    assert rel_error(out, case.reference()[0]) <= TOL
    bt = case.block_tables.copy()
    bt[0, 0] = 2**32 + int(bt[0, 0])                      # int32 cast would give the same id
    with pytest.raises(pnp.InvalidBlockTable, match="block_tables"):
        pnp.paged_attention(case.q, case.k_pages, case.v_pages, bt, case.seq_lens,
                            case.query_start_loc, backend=backend)


def test_a_real_cache_with_more_than_2_pow_31_slots():
    """2049 pages of 2**20 slots (float16, one head of dim 1): 8 GiB of virtual memory that
    np.zeros reserves without touching. Slots above 2**31 are written and read back."""
    ps = 2**20
    cfg = pnp.CacheConfig(num_pages=2049, page_size=ps, num_layers=1, num_kv_heads=1,
                          head_dim=1, dtype=np.float16)
    try:
        cache = pnp.PagedKVCache(cfg, record_events=False)
    except MemoryError:
        pytest.skip("the OS refuses an 8 GiB virtual reservation here")
    held = cache.pool.allocate_many(2047)                 # pages 0..2046 taken elsewhere
    cache.add_sequence("a", [1])
    slots = cache.allocate_slots("a", ps + 10)            # pages 2047, 2048
    assert slots.dtype == np.int64
    assert cache.block_table("a").tolist() == [2047, 2048]
    assert slots[0] == 2047 * ps and slots[-1] == 2048 * ps + 9 > 2**31
    tail = slots[-10:]                                    # [10] slots past 2**31
    kv = np.arange(1, 11, dtype=np.float16).reshape(10, 1, 1)
    cache.write_kv(0, tail, kv, -kv)
    k_pages, v_pages = cache.layer(0)
    assert k_pages[2048, 0, :10, 0].tolist() == list(range(1, 11))
    assert v_pages[2048, 0, :10, 0].tolist() == [-x for x in range(1, 11)]
    meta = cache.batch(["a"])
    assert meta.seq_lens.tolist() == [ps + 10]
    q = np.ones((1, 1, 1), np.float32)
    out = pnp.paged_attention(q, k_pages, v_pages, meta.block_tables, meta.seq_lens,
                              sliding_window=1, backend="numpy")  # sees only the last key
    assert out.ravel().tolist() == [-10.0]
    cache.free("a")
    for p in held:
        cache.pool.free(p)
    cache.check_invariants()
    assert cache.stats()["num_free"] == 2049
