"""LlamaModel: the varlen paged forward equals the dense, cache-free truth."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import tiny_model

import paged_np as pnp
from paged_np.models.llama import ForwardBatch, apply_rope


def _run_step(model, cache, seqs, backend="numpy"):
    """One varlen forward over ``seqs``: list of (seq_id, new_token_ids)."""
    starts = [cache.num_computed_tokens(s) for s, _ in seqs]
    slots = [cache.allocate_slots(s, len(t)) for s, t in seqs]
    counts = np.array([len(t) for _, t in seqs])
    qsl = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    positions = np.concatenate([np.arange(a, a + len(t)) for a, (_, t) in zip(starts, seqs)])
    meta = cache.batch([s for s, _ in seqs])
    batch = ForwardBatch(np.concatenate([t for _, t in seqs]).astype(np.int64), positions,
                         np.concatenate(slots), qsl, meta.block_tables, meta.seq_lens,
                         np.arange(qsl[-1], dtype=np.int64))
    logits = model.forward(batch, cache, backend=backend)
    for s, t in seqs:
        cache.append_tokens(s, t)
    return [logits[qsl[b]:qsl[b + 1]] for b in range(len(seqs))]


def _cache_for(model, num_pages=32, page_size=4):
    c = model.cfg
    return pnp.PagedKVCache(pnp.CacheConfig(num_pages=num_pages, page_size=page_size,
                                            num_layers=c.num_layers,
                                            num_kv_heads=c.num_kv_heads, head_dim=c.head_dim))


@pytest.mark.parametrize("window", [None, 5])
def test_varlen_chunked_forward_equals_dense(window):
    model = tiny_model(sliding_window=window)
    rng = np.random.default_rng(0)
    full = [rng.integers(0, 128, n).tolist() for n in (13, 1, 22)]
    cache = _cache_for(model)
    for i, toks in enumerate(full):
        cache.add_sequence(i, toks)
    # Step 1: a chunk of each sequence; step 2: the rest (a mix of lengths).
    cut = [5, 1, 17]
    first = _run_step(model, cache, [(i, t[:c]) for i, (t, c) in enumerate(zip(full, cut))])
    rest = [(i, t[c:]) for i, (t, c) in enumerate(zip(full, cut)) if len(t) > c]
    second = _run_step(model, cache, rest)
    for i, toks in enumerate(full):
        dense = model.dense_logits(toks)                        # [L, V]
        got = [first[i]] + [g for (j, _), g in zip(rest, second) if j == i]
        np.testing.assert_allclose(np.concatenate(got), dense, rtol=1e-4, atol=1e-4)


def test_dense_generate_is_greedy_over_dense_logits():
    model = tiny_model()
    prompt = [3, 1, 4, 1, 5]
    out = model.dense_generate(prompt, max_tokens=6)
    assert len(out) == 6
    for k, tok in enumerate(out):
        assert tok == int(np.argmax(model.dense_logits(prompt + out[:k])[-1]))
    assert model.dense_generate(prompt, 6, stop_token_ids=[out[2]])[-1] == out[2]


def test_random_is_seeded_and_save_load_round_trips(tmp_path):
    a, b, c = tiny_model(seed=1), tiny_model(seed=1), tiny_model(seed=2)
    assert all(np.array_equal(a.w[k], b.w[k]) for k in a.w)
    assert not np.array_equal(a.w["wq"], c.w["wq"])
    path = tmp_path / "tiny.npz"
    a.save(path)
    d = pnp.LlamaModel.load(path)
    assert d.cfg == a.cfg
    assert all(np.array_equal(a.w[k], d.w[k]) for k in a.w)
    assert d.dense_generate([1, 2, 3], 4) == a.dense_generate([1, 2, 3], 4)


def test_rope_scores_depend_only_on_relative_position():
    model = tiny_model()
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 1, 16)).astype(np.float32)
    k = rng.standard_normal((1, 1, 16)).astype(np.float32)

    def score(pq, pk):
        cq, sq = model.rope(np.array([pq]))
        ck, sk = model.rope(np.array([pk]))
        return float((apply_rope(q, cq, sq) * apply_rope(k, ck, sk)).sum())

    assert score(7, 3) == pytest.approx(score(104, 100), rel=1e-4)
    assert score(7, 3) != pytest.approx(score(7, 5), rel=1e-3)


def test_bad_inputs_name_the_argument():
    model = tiny_model()
    with pytest.raises(pnp.InvalidArgument, match="max_tokens"):
        model.dense_generate([1, 2], 0)
    with pytest.raises(pnp.InvalidArgument, match="prompt_ids"):
        model.dense_generate([], 3)
    with pytest.raises(pnp.InvalidArgument, match="vocabulary"):
        model.dense_generate([1, 500], 3)
    with pytest.raises(pnp.ShapeError, match="wq"):
        w = dict(model.w, wq=model.w["wq"][:, :, :4])
        pnp.LlamaModel(model.cfg, w)
    with pytest.raises(pnp.DTypeError, match="cfg"):
        pnp.LlamaModel.random({"vocab_size": 3})
