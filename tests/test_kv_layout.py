"""``kv_layout="k_transposed"``: K pages ``[head_dim, page_size]``, the same attention.

- The arena: tokens written through ``Arena.write`` (float32, float16, int8, fp8) land
  in both layouts as the same K/V (``layer()``'s K is hnd's transposed, V and the
  scales are equal); ``read_pages`` + ``token_rows``, ``write_slots`` (whole pages and
  a partial page, in any order) and ``copy_page`` round-trip in each layout.
- Attention: the same tokens written through an Arena of each layout give the same out
  and lse, per backend (numpy, numba; the cuda simulator's in tests/cudasim), over page
  sizes, head dims (16x16 included), GQA, windows, sinks, float16 and 8-bit pages,
  decode and prefill, with and without AttentionMetadata; hnd equals the dense
  reference. The BLAS prefill path's own k_transposed gather is checked directly.
- Swap, the host and disk tiers, and the engine end to end: the same greedy tokens in
  both layouts; a disk tier written in one layout is never read in the other.
- A bad kv_layout raises a PagedNPError naming the argument, and changes nothing.
"""

from __future__ import annotations

import numpy as np
import pytest
from attention_cases import TOL, available_backends, make_paged_case, rel_error
from engine_helpers import prompts, tiny_model
from tier_helpers import SYSTEM, check_clean, evict_and_ask, make_engine

import paged_np as pnp
from paged_np.attention import AttentionMetadata, paged_attention
from paged_np.cache.arena import Arena
from paged_np.cache.kv_layouts import KTransposedArena, token_rows

LAYOUTS = tuple(pnp.registry.KV_LAYOUTS)            # ("hnd", "k_transposed")
FORMATS = ("float32", "float16", "int8", "fp8_e4m3")


def _arena(layout, fmt="float32", num_pages=6, page_size=4, num_layers=2, heads=2, dim=8):
    return Arena(pnp.CacheConfig(num_pages=num_pages, page_size=page_size,
                                 num_layers=num_layers, num_kv_heads=heads, head_dim=dim,
                                 dtype=fmt, kv_layout=layout))


def _fill(arenas, slots, seed=0):
    """The same random K/V [n, Hkv, D] into ``slots`` of every layer of every arena."""
    rng = np.random.default_rng(seed)
    cfg = arenas[0].cfg
    for layer in range(cfg.num_layers):
        k, v = rng.standard_normal((2, len(slots), cfg.num_kv_heads, cfg.head_dim),
                                   dtype=np.float32)
        for a in arenas:
            a.write(layer, slots, k, v)


# ---------------------------------------------------------------------------- arena
@pytest.mark.parametrize("fmt", FORMATS)
def test_writes_land_as_the_same_kv_in_both_layouts(fmt):
    hnd, kt = _arena("hnd", fmt), _arena("k_transposed", fmt)
    assert type(hnd) is Arena and type(kt) is KTransposedArena
    slots = np.array([5, 6, 7, 9, 0, 23, 12])                   # pages 1, 2, 0, 5, 3
    _fill([hnd, kt], slots)
    for layer in range(2):
        (kh, vh), (kk, vk) = hnd.layer(layer), kt.layer(layer)
        assert kk.shape == (6, 2, 8, 4) and vk.shape == vh.shape == (6, 2, 4, 8)
        assert np.shares_memory(kk, kt.data) and np.shares_memory(vk, kt.data)
        np.testing.assert_array_equal(kk, kh.transpose(0, 1, 3, 2))
        np.testing.assert_array_equal(vk, vh)
        for s_h, s_k in zip(hnd.layer_scales(layer), kt.layer_scales(layer)):
            assert (s_h is None) == (s_k is None)
            if s_h is not None:
                np.testing.assert_array_equal(s_k, s_h)
    # The bytes differ (a layout is not a no-op) exactly in the K half.
    assert not np.array_equal(hnd.data[:, 0], kt.data[:, 0])
    np.testing.assert_array_equal(hnd.data[:, 1], kt.data[:, 1])


@pytest.mark.parametrize("fmt", ["float32", "int8"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_pages_and_rows_round_trip(layout, fmt):
    src = _arena(layout, fmt)
    _fill([src], np.arange(24))
    page, off = np.arange(24) // 4, np.arange(24) % 4
    data, scales = src.read_pages(range(6))                     # as stored
    rows = token_rows(data, page, off, layout)                  # [24, L, 2, Hkv, D]
    row_scales = None if scales is None else scales[:, :, page, :, off]
    # The rows are the written K/V: hnd's rows of the same tokens.
    hnd = _arena("hnd", fmt)
    _fill([hnd], np.arange(24))
    np.testing.assert_array_equal(rows, hnd.data[:, :, page, :, off])
    # Whole pages in shuffled order, one partial page, and single tokens, back in.
    for slots in (np.concatenate([np.arange(p * 4, p * 4 + 4) for p in (5, 2, 0)]),
                  np.array([13, 14]), np.array([7]), np.array([8, 9, 10, 11, 21])):
        dst = _arena(layout, fmt)
        dst.write_slots(slots, rows[slots], None if scales is None else row_scales[slots])
        back, back_scales = dst.read_pages(range(6))
        got = token_rows(back, slots // 4, slots % 4, layout)
        np.testing.assert_array_equal(got, rows[slots])
        if scales is not None:
            np.testing.assert_array_equal(back_scales[:, :, slots // 4, :, slots % 4],
                                          row_scales[slots])
        untouched = np.setdiff1d(np.arange(24), slots)
        assert not token_rows(back, untouched // 4, untouched % 4, layout).any()
    # copy_page moves a whole page as stored.
    src.copy_page(1, 4)
    a, _ = src.read_pages([1, 4])
    np.testing.assert_array_equal(a[:, :, 0], a[:, :, 1])


def test_whole_pages_equal_the_same_slots_one_by_one_in_k_transposed():
    rng = np.random.default_rng(3)
    slots = np.concatenate([np.arange(p * 4, p * 4 + 4) for p in (4, 1)])
    rows = rng.standard_normal((8, 2, 2, 2, 8)).astype(np.float32)
    whole, single = _arena("k_transposed"), _arena("k_transposed")
    whole.write_slots(slots, rows)
    for i, s in enumerate(slots):
        single.write_slots([s], rows[i:i + 1])
    np.testing.assert_array_equal(whole.data, single.data)


# ------------------------------------------------------------------------ attention
CASES = {   # name: (make_paged_case options, sliding_window, attention_sinks, prefill)
    "decode": (dict(page_size=8, head_dim=32), None, 0, False),
    "page_1": (dict(page_size=1, head_dim=32), None, 0, False),
    "square_16x16": (dict(page_size=16, head_dim=16), None, 0, True),
    "gqa_4": (dict(page_size=16, head_dim=64, num_heads=8, num_kv_heads=2), None, 0, True),
    "mqa_d80": (dict(page_size=32, head_dim=80, num_heads=4, num_kv_heads=1), None, 0, False),
    "window": (dict(page_size=8, head_dim=32), 20, 0, True),
    "window_sinks": (dict(page_size=8, head_dim=32), 20, 4, True),
    "float16": (dict(page_size=8, head_dim=64, kv_dtype=np.float16), None, 0, True),
}


def _case_arenas(case, fmt):
    """The case's dense K/V written through an Arena of each layout, at the slots its
    block tables give: ``{layout: (k_pages, v_pages, k_scales, v_scales)}``."""
    num_pages, heads, ps, dim = case.k_pages.shape
    out = {}
    for layout in LAYOUTS:
        a = _arena(layout, fmt, num_pages=num_pages, page_size=ps, num_layers=1, heads=heads,
                   dim=dim)
        for b, n in enumerate(case.seq_lens):
            pos = np.arange(int(n))
            slots = case.block_tables[b, pos // ps].astype(np.int64) * ps + pos % ps
            a.write(0, slots, case.k_dense[b].astype(np.float32),
                    case.v_dense[b].astype(np.float32))
        out[layout] = (*a.layer(0), *a.layer_scales(0))
    return out


def _run(backend, case, pages, layout, window, sinks, meta):
    k_pages, v_pages, ks, vs = pages
    quant = {} if ks is None else dict(k_scales=ks, v_scales=vs)
    if sinks:
        quant["attention_sinks"] = sinks
    if meta:
        m = AttentionMetadata.build(case.block_tables, case.seq_lens, case.query_start_loc,
                                    window, num_pages=v_pages.shape[0],
                                    page_size=v_pages.shape[2], kv_layout=layout,
                                    attention_sinks=sinks)
        quant.pop("attention_sinks", None)
        return paged_attention(case.q, k_pages, v_pages, metadata=m, backend=backend,
                               return_lse=True, **quant)
    return paged_attention(case.q, k_pages, v_pages, case.block_tables, case.seq_lens,
                           case.query_start_loc, sliding_window=window, backend=backend,
                           return_lse=True, kv_layout=layout, **quant)


@pytest.mark.parametrize("backend", available_backends())
@pytest.mark.parametrize("name", list(CASES))
def test_k_transposed_attention_equals_hnd(backend, name):
    opts, window, sinks, prefill = CASES[name]
    seq_lens = [1, opts["page_size"] + 1, 37, 70]
    n_q = [1, 3, 37, 9] if prefill else None
    case = make_paged_case(seq_lens, n_q, seed=len(name), **opts)
    fmt = "float16" if opts.get("kv_dtype") is np.float16 else "float32"
    pages = _case_arenas(case, fmt)
    ref_out, ref_lse = case.reference(sliding_window=window) if not sinks else (None, None)
    for meta in (False, True):
        out_h, lse_h = _run(backend, case, pages["hnd"], "hnd", window, sinks, meta)
        out_k, lse_k = _run(backend, case, pages["k_transposed"], "k_transposed", window,
                            sinks, meta)
        assert rel_error(out_k, out_h) <= TOL and rel_error(lse_k, lse_h) <= TOL
        if ref_out is not None:         # and hnd is right: the dense reference
            assert rel_error(out_h, ref_out) <= TOL and rel_error(lse_h, ref_lse) <= TOL


@pytest.mark.parametrize("backend", available_backends())
@pytest.mark.parametrize("fmt", ["int8", "fp8_e4m3"])
@pytest.mark.parametrize("prefill", [False, True])
def test_k_transposed_attention_equals_hnd_with_8bit_pages(backend, fmt, prefill):
    seq_lens = [2, 17, 40]
    case = make_paged_case(seq_lens, [2, 5, 40] if prefill else None, page_size=8,
                           head_dim=32, num_heads=4, num_kv_heads=2, seed=11)
    pages = _case_arenas(case, fmt)
    for window, sinks in ((None, 0), (16, 3)):
        out_h, lse_h = _run(backend, case, pages["hnd"], "hnd", window, sinks, False)
        out_k, lse_k = _run(backend, case, pages["k_transposed"], "k_transposed", window,
                            sinks, False)
        assert rel_error(out_k, out_h) <= TOL and rel_error(lse_k, lse_h) <= TOL


@pytest.mark.parametrize("fmt", ["float32", "float16", "int8", "fp8_e4m3"])
@pytest.mark.parametrize("window, sinks", [(0, 0), (24, 4)])
def test_the_blas_prefill_gathers_k_transposed_pages_as_they_are(fmt, window, sinks):
    from paged_np.attention import numba_prefill  # numba is a dependency: no skip
    case = make_paged_case([70], [50], page_size=16, head_dim=32, num_heads=8, num_kv_heads=2,
                           seed=5)
    pages = _case_arenas(case, fmt)
    results = {}
    for layout in LAYOUTS:
        k_pages, v_pages, ks, vs = pages[layout]
        out = np.zeros(case.q.shape, np.float32)
        lse = np.zeros(case.q.shape[:2], np.float32)
        numba_prefill.attend_sequence(case.q, k_pages, v_pages, case.block_tables[0], 70, 0,
                                      50, 32 ** -0.5, window, out, lse, ks, vs, sinks,
                                      kv_layout=layout)
        results[layout] = out, lse
    (out_h, lse_h), (out_k, lse_k) = results["hnd"], results["k_transposed"]
    assert rel_error(out_k, out_h) <= TOL and rel_error(lse_k, lse_h) <= TOL
    if fmt == "float32" and not sinks:
        ref, ref_lse = case.reference(sliding_window=window or None)
        assert rel_error(out_k, ref) <= TOL and rel_error(lse_k, ref_lse) <= TOL


def test_split_k_reads_k_transposed_pages():
    from paged_np.attention import split_k

    case = make_paged_case([9, 40], [2, 40], page_size=8, head_dim=16, seed=2)
    pages = _case_arenas(case, "float32")
    res = {layout: split_k.forward(case.q, pages[layout][0], pages[layout][1],
                                   case.block_tables, case.seq_lens, case.qsl, 0.25, 0, True,
                                   num_splits=3, kv_layout=layout) for layout in LAYOUTS}
    assert rel_error(res["k_transposed"][0], res["hnd"][0]) <= TOL
    assert rel_error(res["hnd"][0], case.reference(scale=0.25)[0]) <= TOL


# --------------------------------------------------------------------- bad values
def test_a_bad_kv_layout_is_refused_by_name_and_changes_nothing():
    with pytest.raises(pnp.InvalidArgument, match="CacheConfig.kv_layout must be one of"):
        pnp.CacheConfig(num_pages=4, kv_layout="nhd")
    with pytest.raises(pnp.InvalidArgument, match="^kv_layout must be one of"):
        pnp.EngineConfig(kv_layout="HND")
    case = make_paged_case([5, 9], page_size=4, head_dim=8)
    with pytest.raises(pnp.InvalidArgument, match="kv_layout must be one of"):
        AttentionMetadata.build(case.block_tables, case.seq_lens, num_pages=6, page_size=4,
                                kv_layout="transposed")
    before = [x.copy() for x in (case.q, case.k_pages, case.v_pages, case.block_tables)]
    for bad in ("transposed", 3):
        with pytest.raises(pnp.PagedNPError, match="kv_layout"):
            paged_attention(*case.args(), backend="numpy", kv_layout=bad)
    meta = AttentionMetadata.build(case.block_tables, case.seq_lens,
                                   num_pages=case.k_pages.shape[0], page_size=4)
    with pytest.raises(pnp.InvalidArgument, match="kv_layout must be None when metadata"):
        paged_attention(case.q, case.k_pages, case.v_pages, metadata=meta, backend="numpy",
                        kv_layout="hnd")
    # hnd pages (page_size 4, head_dim 8) read as k_transposed: a shape error saying so.
    with pytest.raises(pnp.ShapeError, match="kv_layout='k_transposed'"):
        paged_attention(*case.args(), backend="numpy", kv_layout="k_transposed")
    for x, y in zip(before, (case.q, case.k_pages, case.v_pages, case.block_tables)):
        np.testing.assert_array_equal(x, y)


# ------------------------------------------------------------- swap, tiers, engine
@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.mark.parametrize("opts", [dict(backend="numpy"),
                                  dict(backend="numba", kv_cache_dtype="int8"),
                                  dict(backend="numpy", preemption_mode="swap"),
                                  dict(backend="numpy", preemption_mode="swap",
                                       kv_cache_dtype="fp8_e4m3")])
def test_the_engine_gives_the_same_greedy_tokens_in_both_layouts(model, opts):
    ps = prompts(8, seed=3, system=list(range(40, 60)))
    greedy = pnp.SamplingParams(max_tokens=10, temperature=0.0)
    tokens, metrics = {}, {}
    for layout in LAYOUTS:
        engine = pnp.Engine(model, num_pages=18, page_size=4, max_num_seqs=6,
                            max_num_batched_tokens=40, kv_layout=layout, **opts)
        assert engine.cache.cfg.kv_layout == layout
        tokens[layout] = [o.token_ids for o in engine.generate(ps, greedy)]
        metrics[layout] = engine.metrics
        engine.cache.check_invariants()
    assert tokens["k_transposed"] == tokens["hnd"]
    if opts.get("kv_cache_dtype") is None:      # float32 pages: the dense model's tokens
        assert tokens["hnd"] == [model.dense_generate(p, 10) for p in ps]
    if opts.get("preemption_mode") == "swap":   # the pages really went out and back
        assert metrics["k_transposed"]["swapped_in"] > 0
        assert metrics["k_transposed"]["swapped_in"] == metrics["hnd"]["swapped_in"]


@pytest.mark.parametrize("where", ["host", "disk"])
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8"])
def test_tiers_give_back_k_transposed_pages(tmp_path, where, kv_cache_dtype):
    opts = dict(host_cache_memory="1MiB") if where == "host" else dict(
        disk_cache_dir=str(tmp_path))
    got = {}
    for layout in LAYOUTS:
        engine = make_engine(kv_layout=layout, kv_cache_dtype=kv_cache_dtype,
                             **(opts if where == "host" else dict(
                                 disk_cache_dir=str(tmp_path / layout))))
        out, dense = evict_and_ask(engine)
        assert out.num_cached_prompt_tokens == len(SYSTEM)      # every page came back
        assert engine.stats()["tiers"][where]["loaded_tokens"] == len(SYSTEM)
        got[layout] = out.token_ids
        check_clean(engine)
    assert got["k_transposed"] == got["hnd"]
    if kv_cache_dtype == "auto":
        assert got["hnd"] == dense


def test_a_disk_tier_written_in_one_layout_is_not_read_in_the_other(tmp_path):
    first = make_engine(kv_layout="hnd", disk_cache_dir=str(tmp_path))
    evict_and_ask(first)
    assert first.stats()["tiers"]["disk"]["pages"] > 0
    other = make_engine(kv_layout="k_transposed", disk_cache_dir=str(tmp_path))
    assert other.cache.tiers.disk.dir != first.cache.tiers.disk.dir
    assert other.cache.tiers.disk.fingerprint["kv_layout"] == "k_transposed"
    out, dense = evict_and_ask(other)
    assert out.token_ids == dense
    assert other.stats()["tiers"]["disk"]["loaded_tokens"] == len(SYSTEM)  # its own pages
    # ... none of them found in the first engine's folder: question 0 missed on disk.
    again = make_engine(kv_layout="hnd", disk_cache_dir=str(tmp_path))
    assert again.cache.tiers.disk.dir == first.cache.tiers.disk.dir
    assert again.cache.tiers.disk.num_pages == first.stats()["tiers"]["disk"]["pages"]
    check_clean(other)
