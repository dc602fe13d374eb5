"""Attention sinks + sliding window through the engine: bounded pages, exact tokens.

The engine's options ``sliding_window`` and ``attention_sinks`` keep the first
tokens' page pinned and give back every page behind the window; the served
tokens equal a dense forward with the same mask and the same positions, and
those positions equal StreamingLLM's (keys before RoPE, rotated at attention
time at their place in the cache), computed here independently.
"""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import BACKENDS, tiny_model

import paged_np as pnp
from paged_np.models.llama import apply_rope


@pytest.fixture(scope="module")
def model():
    # max_position_embeddings=64: the runs below go well past it.
    return tiny_model(seed=2, max_position_embeddings=64)


def streaming_llm_logits(model, ids, window, sinks):
    """StreamingLLM's forward, written out: each query attends to the sinks and its
    window, with keys kept *before* RoPE and rotated at their index in that cache."""
    cfg = model.cfg
    L = len(ids)
    x = model.embed(np.asarray(ids, np.int64))                   # [L, H]
    no_rope = model.rope(np.zeros(L, np.int64))                  # cos 1, sin 0
    group = cfg.num_heads // cfg.num_kv_heads
    for layer in range(cfg.num_layers):
        q, k, v = model.qkv(layer, x, no_rope)                   # un-rotated q, k
        attn = np.zeros_like(q)                                  # [L, Hq, D]
        for p in range(L):
            kept = [j for j in range(p + 1) if j < sinks or j > p - window]  # the cache
            cache_pos = np.arange(len(kept))                     # StreamingLLM's positions
            kr = apply_rope(k[kept], *model.rope(cache_pos))     # [n, Hkv, D]
            qr = apply_rope(q[p:p + 1], *model.rope(cache_pos[-1:]))  # [1, Hq, D]
            kr = np.repeat(kr, group, axis=1)                    # [n, Hq, D]
            s = np.einsum("hd,nhd->hn", qr[0], kr) / np.sqrt(cfg.head_dim)  # [Hq, n]
            w = np.exp(s - s.max(axis=1, keepdims=True))
            w /= w.sum(axis=1, keepdims=True)
            attn[p] = np.einsum("hn,nhd->hd", w, np.repeat(v[kept], group, axis=1))
        x = model.finish_layer(layer, x, attn.astype(np.float32))
    return model.logits(x)                                       # [L, V]


def test_cache_relative_positions_equal_streaming_llm(model):
    ids = list(np.random.default_rng(0).integers(0, 128, 90))   # past 64 positions
    want = streaming_llm_logits(model, ids, window=12, sinks=3)
    got = model.dense_logits(ids, sliding_window=12, attention_sinks=3)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # ... and they differ from keeping the original positions for the sinks.
    plain = model.dense_logits(ids, sliding_window=12)
    assert np.abs(plain - want).max() > 1e-2


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page_size,window,sinks", [(4, 12, 4), (4, 10, 3), (3, 8, 1)])
def test_long_generation_keeps_pages_bounded_and_tokens_exact(model, backend, page_size,
                                                               window, sinks):
    prompt = list(range(5, 35))                                  # 30 tokens
    want = model.dense_generate(prompt, 90, sliding_window=window, attention_sinks=sinks)
    engine = pnp.Engine(model, num_pages=12, page_size=page_size, backend=backend,
                        max_num_batched_tokens=8, sliding_window=window,
                        attention_sinks=sinks)                  # 36-48 slots < 120 tokens
    rid = engine.add_request(prompt, pnp.SamplingParams(max_tokens=90, temperature=0))
    seq = engine.requests[rid].seqs[0]
    out = engine.request_output(rid)
    pinned = None
    while engine.has_unfinished_requests():
        engine.step()
        if seq.seq is not None:
            bt = engine.cache.block_table(seq.seq_id)
            pinned = bt[0] if pinned is None else pinned
            assert bt[0] == pinned                               # the sink page stays put
            engine.cache.check_invariants()
    assert out.samples[0].token_ids == want
    bound = -(-sinks // page_size) + -(-(window + 8) // page_size) + 1  # a chunk of 8 queries
    assert max(engine.metrics["series"]["num_in_use"]) <= bound
    assert engine.cache.stats()["num_in_use"] == 0               # no leak
    engine.cache.check_invariants()


def test_a_window_longer_than_the_text_changes_nothing(model):
    prompts = [list(range(3, 30)), list(range(40, 52))]
    params = pnp.SamplingParams(max_tokens=20, temperature=0)
    plain = pnp.Engine(model, num_pages=32, page_size=4).generate(prompts, params)
    wide = pnp.Engine(model, num_pages=32, page_size=4, sliding_window=64,
                      attention_sinks=4).generate(prompts, params)
    assert [o.token_ids for o in wide] == [o.token_ids for o in plain]


def test_preemption_and_forks_share_the_sink_page(model):
    from engine_helpers import prompts
    ps = prompts(6, seed=3, low=20, high=40)
    mask = dict(sliding_window=10, attention_sinks=4)
    want = [model.dense_generate(p, 30, **mask) for p in ps]
    engine = pnp.Engine(model, num_pages=12, page_size=4, max_num_seqs=4,
                        max_num_batched_tokens=24, backend="numpy", **mask)
    outs = engine.generate(ps, pnp.SamplingParams(max_tokens=30, temperature=0))
    assert [o.token_ids for o in outs] == want
    assert engine.metrics["preemptions"] > 0
    engine.cache.check_invariants()
    assert engine.cache.stats()["num_in_use"] == 0
    # n = 3 forks after the prompt: the children share the parent's sink page.
    fork = pnp.Engine(model, num_pages=24, page_size=4, backend="numpy", **mask)
    rid = fork.add_request(ps[0], pnp.SamplingParams(max_tokens=12, temperature=0, n=3))
    result = fork.request_output(rid)
    fork.step()
    seqs = fork.requests[rid].seqs
    assert len(seqs) == 3
    sink_pages = {int(fork.cache.block_table(s.seq_id)[0]) for s in seqs}
    assert len(sink_pages) == 1 and fork.cache.pool.ref_count(sink_pages.pop()) == 3
    while fork.has_unfinished_requests():
        fork.step()
        fork.cache.check_invariants()
    assert all(s.token_ids == want[0][:12] for s in result.samples)


def test_llm_serves_past_the_models_position_limit():
    tok = pnp.Tokenizer.tiny()
    small = tiny_model(seed=2, vocab_size=tok.vocab_size, max_position_embeddings=64)
    llm = pnp.LLM(small, tokenizer=tok, verbose=False, num_pages=8, page_size=4,
                  sliding_window=12, attention_sinks=2, backend="numpy")
    assert llm.max_model_len > small.cfg.max_position_embeddings
    prompt = tok.encode("the cache " * 8)
    out = llm.generate([prompt], pnp.SamplingParams(max_tokens=100, temperature=0,
                                                    ignore_eos=True))
    got = out[0].outputs[0].token_ids
    assert len(prompt) + len(got) > 64 and len(got) == 100
    assert got == small.dense_generate(prompt, 100, sliding_window=12, attention_sinks=2)


@pytest.mark.parametrize("options,match", [
    (dict(attention_sinks=-1), "attention_sinks"),
    (dict(sliding_window=0), "sliding_window"),
    (dict(sliding_window=8, attention_sinks=9),
     "attention_sinks=9 is larger than sliding_window=8"),
    (dict(sliding_window=8, prefix_cache="radix"), "radix"),
])
def test_bad_values_are_refused_by_name(model, options, match):
    with pytest.raises(pnp.InvalidArgument, match=match):
        pnp.Engine(model, num_pages=8, **options)


def test_sinks_are_checked_against_the_models_own_window():
    windowed = tiny_model(seed=1, sliding_window=8)
    with pytest.raises(pnp.InvalidArgument, match="attention_sinks=9"):
        pnp.Engine(windowed, num_pages=8, attention_sinks=9)
    engine = pnp.Engine(windowed, num_pages=8, attention_sinks=2)
    assert (engine.sliding_window, engine.attention_sinks) == (8, 2)
    # No window at all: every token is kept, sinks change nothing.
    assert pnp.Engine(tiny_model(), num_pages=8, attention_sinks=4).attention_sinks == 0


def test_release_keeps_the_sink_pages_and_forks_share_them():
    cfg = pnp.CacheConfig(num_pages=16, page_size=4, num_kv_heads=1, head_dim=8)
    cache = pnp.PagedKVCache(cfg)
    cache.add_sequence("a", list(range(30)))
    cache.allocate_slots("a", 30)
    cache.append_tokens("a", list(range(30)))
    assert cache.release_pages_before("a", 20, keep_first=5) == 3   # pages 2, 3, 4
    bt = cache.block_table("a")
    assert (bt[:2] >= 0).all() and (bt[2:5] == -1).all() and (bt[5:] >= 0).all()
    assert cache.num_released_pages("a") == 3
    assert cache.release_pages_before("a", 24, keep_first=5) == 1    # page 5 joins the run
    cache.check_invariants()
    cache.fork("a", "b")
    assert cache.pool.ref_count(int(cache.block_table("a")[0])) == 2
    cache.check_invariants()
    cache.free("a")
    cache.free("b")
    cache.check_invariants()
    assert cache.stats()["num_in_use"] == 0


def test_serve_takes_the_window_and_sinks_and_lifts_the_position_limit():
    from paged_np.cli import serve

    args = serve.build_parser().parse_args(["--model", serve.TINY_MODEL, "--num-pages", "16",
                                            "--sliding-window", "64", "--attention-sinks", "4",
                                            "--backend", "numpy"])
    llm = serve.build_llm(args)
    assert (llm.engine.sliding_window, llm.engine.attention_sinks) == (64, 4)
    assert llm.max_model_len > llm.model.cfg.max_position_embeddings
