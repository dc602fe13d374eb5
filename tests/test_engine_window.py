"""Sliding window: pages outside the window go back to the pool, tokens stay exact."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import BACKENDS

import paged_np as pnp
from paged_np.attention.reference import dense_attention


@pytest.mark.parametrize("backend", BACKENDS)
def test_paged_attention_accepts_holes_outside_the_window(backend):
    """-1 entries for pages wholly before every query's window are allowed and unread.

    tests/cudasim/test_cuda_window.py runs the same check on backend="cuda".
    """
    check_holes_outside_the_window(backend)


def check_holes_outside_the_window(backend):
    rng = np.random.default_rng(0)
    ps, L, n_q, w, hkv, h, d = 4, 23, 3, 6, 2, 4, 8
    k = rng.standard_normal((L, hkv, d)).astype(np.float32)
    v = rng.standard_normal((L, hkv, d)).astype(np.float32)
    q = rng.standard_normal((n_q, h, d)).astype(np.float32)
    n_pages = -(-L // ps)
    k_pages = np.full((n_pages, hkv, ps, d), np.nan, np.float32)
    v_pages = np.full((n_pages, hkv, ps, d), np.nan, np.float32)
    for j in range(L):
        k_pages[j // ps, :, j % ps] = k[j]
        v_pages[j // ps, :, j % ps] = v[j]
    table = np.arange(n_pages, dtype=np.int32)
    # First query at 20 sees keys > 14: pages 0..2 (positions 0..11) are dead.
    dead = (L - n_q - w + 1) // ps
    assert dead == 3
    k_pages[:dead] = np.nan                                     # never read
    table[:dead] = -1
    out = pnp.paged_attention(q, k_pages, v_pages, table[None], np.array([L], np.int32),
                              np.array([0, n_q], np.int32), sliding_window=w, backend=backend)
    ref, _ = dense_attention(q, k, v, sliding_window=w)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    table[dead] = -1                                            # a page the window needs
    with pytest.raises(pnp.InvalidBlockTable):
        pnp.paged_attention(q, k_pages, v_pages, table[None], np.array([L], np.int32),
                            np.array([0, n_q], np.int32), sliding_window=w, backend=backend)


@pytest.fixture(scope="module")
def windowed():
    from engine_helpers import tiny_model
    return tiny_model(seed=1, sliding_window=8)


@pytest.mark.parametrize("backend", BACKENDS)
def test_long_generation_with_a_window_outgrows_the_arena_in_bounded_memory(windowed, backend):
    prompt = list(range(3, 33))                                  # 30 tokens
    want = windowed.dense_generate(prompt, 60)                   # 90 tokens in all
    engine = pnp.Engine(windowed, num_pages=6, page_size=4,      # 24 slots < 90 tokens
                        max_num_batched_tokens=8, backend=backend)
    (out,) = engine.generate([prompt], pnp.SamplingParams(max_tokens=60, temperature=0))
    assert out.token_ids == want and out.finish_reason == "length"
    # The window (8 keys) plus a chunk of 8 queries spans at most 5 pages of 4.
    assert engine.metrics["peak_pages_in_use"] <= 5
    assert max(engine.metrics["series"]["num_in_use"]) <= 5
    engine.cache.check_invariants()


def test_window_is_not_the_dense_unwindowed_answer(windowed):
    from engine_helpers import tiny_model
    plain = tiny_model(seed=1)                                   # same weights, no window
    prompt = list(range(3, 33))
    assert plain.dense_generate(prompt, 20) != windowed.dense_generate(prompt, 20)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_windowed_requests_under_preemption_equal_dense(windowed, mode):
    from engine_helpers import prompts
    ps = prompts(8, seed=6, system=list(range(60, 76)))
    want = [windowed.dense_generate(p, 24) for p in ps]
    engine = pnp.Engine(windowed, num_pages=5, page_size=4, max_num_seqs=4,
                        max_num_batched_tokens=24, preemption_mode=mode, backend="numpy")
    outs = engine.generate(ps, pnp.SamplingParams(max_tokens=24, temperature=0))
    assert [o.token_ids for o in outs] == want
    assert engine.metrics["preemptions"] > 0
    engine.cache.check_invariants()
    assert engine.cache.stats()["num_in_use"] == 0


def test_n4_forks_after_window_release(windowed):
    prompt = list(range(3, 40))
    engine = pnp.Engine(windowed, num_pages=16, page_size=4, max_num_seqs=4,
                        backend="numpy")
    (out,) = engine.generate([prompt], pnp.SamplingParams(max_tokens=20, temperature=0, n=4))
    want = windowed.dense_generate(prompt, 20)
    assert all(s.token_ids == want for s in out.samples)
    engine.cache.check_invariants()
