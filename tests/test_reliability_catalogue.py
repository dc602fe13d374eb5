"""The catalogue of refused calls: one table across the whole public API.

Each row is a malformed call, the exact error class it must raise (always a
:class:`paged_np.PagedNPError`, never a bare ``IndexError``/``KeyError``), and a
word the message must contain (the argument's name). Every call runs against
a small world (a cache with a written sequence and a pending one, an engine
that has run a step) and the whole state of both is compared before and after:
a refused call changes nothing.

Read the table top to bottom: configs, pool, cache, paged_attention,
merge_attention_states, model, Engine, SamplingParams, engine requests.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest
from cache_helpers import add_and_fill, assert_same_state, small_cache, snapshot
from engine_helpers import tiny_model

import paged_np as pnp
from paged_np.errors import (
    DTypeError,
    DuplicateSequence,
    IndexOutOfRange,
    InvalidArgument,
    InvalidBlockTable,
    OutOfPages,
    SequenceTooLong,
    ShapeError,
    StalePage,
    UnknownRequest,
    UnknownSequence,
)

F32 = np.float32
GREEDY = pnp.SamplingParams(max_tokens=4, temperature=0.0)


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture
def w(model):
    """The world every row runs in (fresh for each row)."""
    cache = small_cache(num_pages=6, page_size=4, num_layers=2, num_kv_heads=2, head_dim=8)
    add_and_fill(cache, "a", [1, 2, 3, 4, 5])   # pages 0 (full, hashed) and 1
    cache.add_sequence("p", [1, 2])
    cache.allocate_slots("p", 2)                # page 2, pending
    engine = pnp.Engine(model, num_pages=8, page_size=4, max_num_seqs=2, backend="numpy")
    engine.add_request([1, 2, 3], GREEDY, request_id="r0")
    engine.step()
    return SimpleNamespace(cache=cache, engine=engine, model=model)


def attn(w, **change):
    """paged_attention over sequence "a" of the world's cache, with one argument changed."""
    k_pages, v_pages = w.cache.layer(0)                       # [6, 2, 4, 8] each
    meta = w.cache.batch(["a"])
    args = dict(q=np.zeros((1, 4, 8), F32), k_pages=k_pages, v_pages=v_pages,
                block_tables=meta.block_tables, seq_lens=meta.seq_lens,
                query_start_loc=np.array([0, 1], np.int32), backend="numpy")
    return pnp.paged_attention(**{**args, **change})


def merge(**change):
    """merge_attention_states on valid [2, 4, 8] parts, with one argument changed."""
    args = dict(out_a=np.zeros((2, 4, 8), F32), lse_a=np.zeros((2, 4), F32),
                out_b=np.ones((2, 4, 8), F32), lse_b=np.zeros((2, 4), F32))
    return pnp.merge_attention_states(**{**args, **change})


def kv(n=1, d=8, dtype=F32):
    return np.zeros((n, 2, d), dtype), np.zeros((n, 2, d), dtype)


def engine_with(w, **change):
    args = dict(num_pages=8, page_size=4)
    return pnp.Engine(w.model, **{**args, **change})


CATALOGUE = [
    # ---- configs ------------------------------------------------------ (call, error, word)
    ("CacheConfig num_pages=0", lambda w: pnp.CacheConfig(num_pages=0),
     InvalidArgument, "num_pages"),
    ("CacheConfig page_size float", lambda w: pnp.CacheConfig(num_pages=4, page_size=1.5),
     DTypeError, "page_size"),
    ("CacheConfig dtype int16", lambda w: pnp.CacheConfig(num_pages=4, dtype=np.int16),
     DTypeError, "dtype"),
    ("CacheConfig eviction_policy", lambda w: pnp.CacheConfig(num_pages=4,
                                                              eviction_policy="mru"),
     InvalidArgument, "eviction_policy"),
    ("ModelConfig heads not a multiple", lambda w: pnp.ModelConfig(num_heads=3, num_kv_heads=2),
     InvalidArgument, "num_heads"),
    ("ModelConfig odd head_dim", lambda w: pnp.ModelConfig(head_dim=15),
     InvalidArgument, "head_dim"),
    ("ModelConfig rope_theta <= 0", lambda w: pnp.ModelConfig(rope_theta=-1.0),
     InvalidArgument, "rope_theta"),
    ("ModelConfig sliding_window 0", lambda w: pnp.ModelConfig(sliding_window=0),
     InvalidArgument, "sliding_window"),
    ("ModelConfig vocab_size str", lambda w: pnp.ModelConfig(vocab_size="256"),
     DTypeError, "vocab_size"),
    ("PagedKVCache cfg dict", lambda w: pnp.PagedKVCache({"num_pages": 4}),
     DTypeError, "cfg"),
    ("PagedKVCache device", lambda w: pnp.PagedKVCache(w.cache.cfg, device="tpu"),
     InvalidArgument, "device"),
    # ---- page pool ----------------------------------------------------------------------
    ("PagePool num_pages=0", lambda w: pnp.PagePool(0, 16), InvalidArgument, "num_pages"),
    ("HashIndex eviction_policy", lambda w: pnp.PagePool(4, 16, pnp.HashIndex(16, "mru")),
     InvalidArgument, "eviction_policy"),
    ("pool.free of a FREE page", lambda w: w.cache.pool.free(5), StalePage, "page_id"),
    ("pool.free past the arena", lambda w: w.cache.pool.free(6), IndexOutOfRange, "page_id"),
    ("pool.share of a FREE page", lambda w: w.cache.pool.share(5), StalePage, "page_id"),
    ("pool.touch unindexed page", lambda w: w.cache.pool.touch(1), StalePage, "page_id"),
    ("pool.ref_count float id", lambda w: w.cache.pool.ref_count(1.0), DTypeError, "page_id"),
    ("pool.state bool id", lambda w: w.cache.pool.state(True), DTypeError, "page_id"),
    ("index.register str hash", lambda w: w.cache.prefix_index.register(1, "h", [1]),
     DTypeError, "page_hash"),
    # ---- cache ----------------------------------------------------------------------------
    ("add_sequence duplicate id", lambda w: w.cache.add_sequence("a", [1]),
     DuplicateSequence, "seq_id"),
    ("add_sequence id None", lambda w: w.cache.add_sequence(None, [1]), DTypeError, "seq_id"),
    ("add_sequence empty prompt", lambda w: w.cache.add_sequence("n", []),
     InvalidArgument, "prompt"),
    ("add_sequence negative id", lambda w: w.cache.add_sequence("n", [3, -1]),
     InvalidArgument, "prompt"),
    ("add_sequence float prompt", lambda w: w.cache.add_sequence("n", [1.0, 2.0]),
     DTypeError, "prompt"),
    ("add_sequence 2-D prompt", lambda w: w.cache.add_sequence("n", [[1, 2]]),
     ShapeError, "prompt"),
    ("add_sequence extra_key list", lambda w: w.cache.add_sequence("n", [1], extra_key=[1]),
     DTypeError, "extra_key"),
    ("allocate_slots unknown seq", lambda w: w.cache.allocate_slots("zz", 1),
     UnknownSequence, "seq_id"),
    ("allocate_slots n=0", lambda w: w.cache.allocate_slots("a", 0), InvalidArgument, "n"),
    ("allocate_slots n float", lambda w: w.cache.allocate_slots("a", 2.0), DTypeError, "n"),
    ("allocate_slots past the arena", lambda w: w.cache.allocate_slots("a", 10**6),
     SequenceTooLong, "num_pages"),
    ("allocate_slots out of pages", lambda w: w.cache.allocate_slots("a", 16),
     OutOfPages, "pages"),
    ("append_tokens without slots", lambda w: w.cache.append_tokens("a", [9]),
     InvalidArgument, "token_ids"),
    ("append_tokens too many", lambda w: w.cache.append_tokens("p", [1, 2, 3]),
     InvalidArgument, "token_ids"),
    ("write_kv layer past the arena", lambda w: w.cache.write_kv(2, [0], *kv()),
     IndexOutOfRange, "layer"),
    ("write_kv layer str", lambda w: w.cache.write_kv("0", [0], *kv()), DTypeError, "layer"),
    ("write_kv slot past the arena", lambda w: w.cache.write_kv(0, [24], *kv()),
     IndexOutOfRange, "slot"),
    ("write_kv slot int64 huge", lambda w: w.cache.write_kv(0, np.array([2**40]), *kv()),
     IndexOutOfRange, "slot"),
    ("write_kv slots float", lambda w: w.cache.write_kv(0, [0.0], *kv()), DTypeError, "slots"),
    ("write_kv k wrong head_dim", lambda w: w.cache.write_kv(0, [0], *kv(d=7)),
     ShapeError, "k"),
    ("write_kv v int dtype", lambda w: w.cache.write_kv(0, [0], kv()[0],
                                                        np.zeros((1, 2, 8), np.int32)),
     DTypeError, "v"),
    ("fork of a pending parent", lambda w: w.cache.fork("p", "q"), InvalidArgument,
     "parent_id"),
    ("fork onto an existing child", lambda w: w.cache.fork("a", "p"), DuplicateSequence,
     "child_id"),
    ("fork unknown parent", lambda w: w.cache.fork("zz", "q"), UnknownSequence, "seq_id"),
    ("free unknown seq", lambda w: w.cache.free("zz"), UnknownSequence, "seq_id"),
    ("batch with an unknown seq", lambda w: w.cache.batch(["a", "zz"]), UnknownSequence,
     "seq_id"),
    ("release_pages_before float", lambda w: w.cache.release_pages_before("a", 1.5),
     DTypeError, "num_tokens"),
    ("mark_used an IN_USE page", lambda w: w.cache.mark_used(0), StalePage, "page_id"),
    ("layer str", lambda w: w.cache.layer("0"), DTypeError, "layer"),
    # ---- paged_attention (on the cache's own pages) ------------------------------------
    ("attn q int", lambda w: attn(w, q=np.zeros((1, 4, 8), np.int32)), DTypeError, "q"),
    ("attn q 2-D", lambda w: attn(w, q=np.zeros((1, 32), F32)), ShapeError, "q"),
    ("attn v_pages dtype", lambda w: attn(w, v_pages=w.cache.layer(0)[1].astype(np.float16)),
     DTypeError, "v_pages"),
    ("attn head_dim mismatch", lambda w: attn(w, q=np.zeros((1, 4, 6), F32)),
     ShapeError, "head_dim"),
    ("attn GQA not divisible", lambda w: attn(w, q=np.zeros((1, 3, 8), F32)),
     ShapeError, "num_heads"),
    ("attn block_tables float", lambda w: attn(w, block_tables=np.zeros((1, 2))),
     DTypeError, "block_tables"),
    ("attn page id past the arena", lambda w: attn(w, block_tables=np.array([[0, 6]])),
     InvalidBlockTable, "block_tables"),
    ("attn page id near int32 max", lambda w: attn(w, block_tables=np.array([[0, 2**31 - 1]])),
     InvalidBlockTable, "block_tables"),
    ("attn page id beyond int32", lambda w: attn(w, block_tables=np.array([[0, 2**32 + 1]])),
     InvalidBlockTable, "block_tables"),
    ("attn hole in the table", lambda w: attn(w, block_tables=np.array([[-1, 1]])),
     InvalidBlockTable, "block_tables"),
    ("attn table too narrow", lambda w: attn(w, block_tables=np.array([[0]])),
     InvalidBlockTable, "block_tables"),
    ("attn seq_lens negative", lambda w: attn(w, seq_lens=np.array([-1])),
     InvalidArgument, "seq_lens"),
    ("attn seq_lens beyond int32", lambda w: attn(w, seq_lens=np.array([2**31])),
     InvalidArgument, "seq_lens"),
    ("attn seq_lens count", lambda w: attn(w, seq_lens=np.array([5, 5])), ShapeError,
     "seq_lens"),
    ("attn query_start_loc[0]", lambda w: attn(w, query_start_loc=np.array([1, 1])),
     InvalidArgument, "query_start_loc"),
    ("attn more queries than tokens", lambda w: attn(w, q=np.zeros((6, 4, 8), F32),
                                                     query_start_loc=np.array([0, 6])),
     InvalidArgument, "query_start_loc"),
    ("attn decode on empty sequence", lambda w: attn(w, seq_lens=np.array([0])),
     InvalidArgument, "seq_lens == 0"),
    ("attn scale 0", lambda w: attn(w, scale=0.0), InvalidArgument, "scale"),
    ("attn sliding_window 0", lambda w: attn(w, sliding_window=0), InvalidArgument,
     "sliding_window"),
    ("attn sliding_window float", lambda w: attn(w, sliding_window=2.0), DTypeError,
     "sliding_window"),
    ("attn backend", lambda w: attn(w, backend="tpu"), InvalidArgument, "backend"),
    ("attn return_lse str", lambda w: attn(w, return_lse="yes"), DTypeError, "return_lse"),
    # ---- merge_attention_states -----------------------------------------------------------
    ("merge out_a list", lambda w: merge(out_a=[[[0.0]]]), DTypeError, "out_a"),
    ("merge out_b shape", lambda w: merge(out_b=np.zeros((2, 4, 7), F32)), ShapeError, "out_b"),
    ("merge lse_b shape", lambda w: merge(lse_b=np.zeros((2, 5), F32)), ShapeError, "lse_b"),
    ("merge lse_a NaN", lambda w: merge(lse_a=np.full((2, 4), np.nan, F32)),
     InvalidArgument, "lse_a"),
    ("merge lse_b +inf", lambda w: merge(lse_b=np.full((2, 4), np.inf, F32)),
     InvalidArgument, "lse_b"),
    ("merge lse_a int", lambda w: merge(lse_a=np.zeros((2, 4), np.int64)), DTypeError, "lse_a"),
    # ---- model ----------------------------------------------------------------------------
    ("LlamaModel.random cfg dict", lambda w: pnp.LlamaModel.random({"vocab_size": 8}),
     DTypeError, "cfg"),
    ("LlamaModel missing weights", lambda w: pnp.LlamaModel(w.model.cfg, {}),
     InvalidArgument, "weights"),
    ("dense_generate max_tokens 0", lambda w: w.model.dense_generate([1, 2], 0),
     InvalidArgument, "max_tokens"),
    ("dense_generate empty prompt", lambda w: w.model.dense_generate([], 2),
     InvalidArgument, "prompt_ids"),
    # ---- Engine arguments -------------------------------------------------------------------
    ("Engine model str", lambda w: pnp.Engine("llama", num_pages=8), DTypeError, "model"),
    ("Engine num_pages 0", lambda w: engine_with(w, num_pages=0), InvalidArgument,
     "num_pages"),
    ("Engine page_size float", lambda w: engine_with(w, page_size=4.0), DTypeError,
     "page_size"),
    ("Engine max_num_seqs 0", lambda w: engine_with(w, max_num_seqs=0), InvalidArgument,
     "max_num_seqs"),
    ("Engine max_num_batched_tokens bool", lambda w: engine_with(w, max_num_batched_tokens=True),
     DTypeError, "max_num_batched_tokens"),
    ("Engine preemption_mode", lambda w: engine_with(w, preemption_mode="drop"),
     InvalidArgument, "preemption_mode"),
    ("Engine backend cuda", lambda w: engine_with(w, backend="cuda"), InvalidArgument,
     "backend"),
    ("Engine eviction_policy", lambda w: engine_with(w, eviction_policy="mru"),
     InvalidArgument, "eviction_policy"),
    ("Engine swap_pages -1", lambda w: engine_with(w, swap_pages=-1), InvalidArgument,
     "swap_pages"),
    # ---- SamplingParams -----------------------------------------------------------------
    ("SamplingParams max_tokens 0", lambda w: pnp.SamplingParams(max_tokens=0),
     InvalidArgument, "max_tokens"),
    ("SamplingParams temperature < 0", lambda w: pnp.SamplingParams(temperature=-0.5),
     InvalidArgument, "temperature"),
    ("SamplingParams temperature inf", lambda w: pnp.SamplingParams(temperature=np.inf),
     InvalidArgument, "temperature"),
    ("SamplingParams top_p 0", lambda w: pnp.SamplingParams(top_p=0.0), InvalidArgument,
     "top_p"),
    ("SamplingParams top_k -2", lambda w: pnp.SamplingParams(top_k=-2), InvalidArgument,
     "top_k"),
    ("SamplingParams seed -1", lambda w: pnp.SamplingParams(seed=-1), InvalidArgument, "seed"),
    ("SamplingParams n str", lambda w: pnp.SamplingParams(n="2"), DTypeError, "n"),
    ("SamplingParams stop_token_ids int", lambda w: pnp.SamplingParams(stop_token_ids=5),
     DTypeError, "stop_token_ids"),
    ("SamplingParams stop id negative", lambda w: pnp.SamplingParams(stop_token_ids=[-3]),
     InvalidArgument, "stop_token_ids"),
    # ---- engine requests ------------------------------------------------------------------
    ("add_request empty prompt", lambda w: w.engine.add_request([]), InvalidArgument,
     "prompt"),
    ("add_request token past vocab", lambda w: w.engine.add_request([1, 1000]),
     InvalidArgument, "prompt"),
    ("add_request params dict", lambda w: w.engine.add_request([1], {"max_tokens": 2}),
     DTypeError, "params"),
    ("add_request n > max_num_seqs", lambda w: w.engine.add_request(
        [1], pnp.SamplingParams(n=3)), InvalidArgument, "SamplingParams.n"),
    ("add_request duplicate id", lambda w: w.engine.add_request([1], request_id="r0"),
     InvalidArgument, "request_id"),
    ("abort unknown request", lambda w: w.engine.abort("nope"), UnknownRequest,
     "request_id"),
    ("generate params count", lambda w: w.engine.generate([[1], [2]], [GREEDY]),
     InvalidArgument, "params"),
    ("generate a bad prompt after a good one", lambda w: w.engine.generate([[1, 2], []]),
     InvalidArgument, "prompt"),
    ("generate a bad params after a good one", lambda w: w.engine.generate(
        [[1, 2], [3]], [GREEDY, "greedy"]), DTypeError, "params"),
]


def engine_state(engine) -> dict:
    """Everything observable about an engine except timings."""
    sched = engine.scheduler
    m = engine.metrics
    return {
        "running": [(s.seq_id, s.num_computed_tokens, list(s.token_ids), s.status)
                    for s in sched.running],
        "waiting": [(s.seq_id, s.num_computed_tokens, list(s.token_ids), s.status)
                    for s in sched.waiting],
        "requests": list(engine._requests),
        "done": len(engine._done),
        "num_requests": engine._num_requests,
        "metrics": {k: m[k] for k in ("steps", "generated_tokens", "scheduled_tokens",
                                      "preemptions")},
    }


def test_the_catalogue_is_big_enough():
    assert len(CATALOGUE) >= 40
    assert len({row[0] for row in CATALOGUE}) == len(CATALOGUE), "row names must be unique"


@pytest.mark.parametrize("name, call, error, word", CATALOGUE, ids=[r[0] for r in CATALOGUE])
def test_refused_call(w, name, call, error, word):
    cache_before, engine_cache_before = snapshot(w.cache), snapshot(w.engine.cache)
    engine_before = engine_state(w.engine)
    with pytest.raises(pnp.PagedNPError) as info:
        call(w)
    assert type(info.value) is error, f"{name}: raised {type(info.value).__name__}: {info.value}"
    assert re.search(re.escape(word), str(info.value)), (
        f"{name}: message does not name {word!r}: {info.value}")
    assert not isinstance(info.value, (IndexError, KeyError))
    assert_same_state(cache_before, snapshot(w.cache))
    assert_same_state(engine_cache_before, snapshot(w.engine.cache))
    assert engine_state(w.engine) == engine_before
    w.cache.check_invariants()
    w.engine.cache.check_invariants()


def test_the_world_still_works_after_every_refusal(w):
    """After all the refusals, the same objects serve normally (nothing half-done)."""
    for _, call, error, _ in CATALOGUE:
        with pytest.raises(error):
            call(w)
    out = attn(w, return_lse=True)
    assert np.isfinite(out[0]).all()
    outs = w.engine.generate([[1, 2, 3, 4]], GREEDY)
    assert outs[0].token_ids == w.model.dense_generate([1, 2, 3, 4], 4)
    while w.engine.has_unfinished_requests():
        w.engine.step()
    assert w.engine.cache.stats()["num_in_use"] == 0
