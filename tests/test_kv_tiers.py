"""The tiers below the arena give back the pages the arena evicted, never wrong ones.

- Greedy tokens equal ``dense_generate`` (int8 pages: the same engine without tiers)
  with the shared prompt served from the host tier, from the disk tier, and from disk
  after the host tier demoted it, on both prefix indexes.
- A restart (two processes in sequence, one directory) finds the first one's pages.
- A different model never loads them; ``cache_salt`` keeps tenants apart in every tier.
- The reuse gate keeps a page once more prompts than the gate asked for it.
- Invariants hold and no page leaks after each test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from engine_helpers import tiny_model
from tier_helpers import GREEDY, PAGE, SYSTEM, check_clean, evict_and_ask, make_engine, question

import paged_np as pnp

ROOT = Path(__file__).resolve().parents[1]

TIER_OPTIONS = {
    "host": lambda tmp: dict(host_cache_memory="1MiB"),
    "disk": lambda tmp: dict(disk_cache_dir=str(tmp)),
    # a host pool of one page, writing back to disk: the prompt reaches disk by demotion
    "host_then_disk": lambda tmp: dict(host_cache_memory=1, disk_cache_dir=str(tmp),
                                       disk_write_policy="write_back"),
}


def _one_page(engine) -> int:
    return engine.cache.cfg.bytes_per_page


@pytest.mark.parametrize("prefix_cache", ["hash", "radix"])
@pytest.mark.parametrize("where", list(TIER_OPTIONS))
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8"])
def test_greedy_tokens_equal_with_pages_from_each_tier(tmp_path, prefix_cache, where,
                                                       kv_cache_dtype):
    opts = TIER_OPTIONS[where](tmp_path)
    if where == "host_then_disk":            # exactly one page of host memory
        opts["host_cache_memory"] = _one_page(make_engine(kv_cache_dtype=kv_cache_dtype))
    engine = make_engine(prefix_cache=prefix_cache, kv_cache_dtype=kv_cache_dtype, **opts)
    out, dense = evict_and_ask(engine)
    if kv_cache_dtype == "auto":
        assert out.token_ids == dense
    else:                                    # 8-bit pages: the same pages recomputed
        plain, _ = evict_and_ask(make_engine(prefix_cache=prefix_cache,
                                             kv_cache_dtype=kv_cache_dtype))
        assert out.token_ids == plain.token_ids
        assert plain.num_cached_prompt_tokens == 0
    tiers = engine.stats()["tiers"]
    served = "disk" if where == "host_then_disk" else where
    assert out.num_cached_prompt_tokens == len(SYSTEM)           # every page came back
    assert tiers[served]["loaded_tokens"] == len(SYSTEM), tiers
    assert tiers[served]["hits"] == len(SYSTEM) // PAGE
    if where == "host_then_disk":
        assert tiers["host"]["evictions"] > 0 and tiers["host"]["pages"] <= 1
    check_clean(engine)


def test_a_host_hit_is_counted_once_and_the_tiers_stats_reach_every_reader(tmp_path):
    engine = make_engine(host_cache_memory="1MiB", disk_cache_dir=str(tmp_path))
    evict_and_ask(engine)
    tiers = engine.stats()["tiers"]
    assert set(tiers) == {"host", "disk"}
    assert tiers["host"]["loaded_tokens"] == len(SYSTEM) and tiers["disk"]["loaded_tokens"] == 0
    assert tiers["disk"]["stores"] > 0        # write_through: every full page as computed
    assert engine.metrics["tiers"] == tiers
    for t in tiers.values():
        assert t["bytes"] <= t["capacity_bytes"]
    check_clean(engine)


def test_cache_salt_separates_tenants_in_every_tier(tmp_path):
    for opts in (dict(host_cache_memory="1MiB"), dict(disk_cache_dir=str(tmp_path / "d"))):
        engine = make_engine(**opts)
        other, dense = evict_and_ask(engine, salts=("tenant-a", "tenant-b"))
        assert other.token_ids == dense
        assert other.num_cached_prompt_tokens == 0, opts   # nothing of tenant a's
        same, dense = evict_and_ask(engine, salts=("tenant-a", "tenant-a"))
        assert same.token_ids == dense
        assert same.num_cached_prompt_tokens == len(SYSTEM), opts
        check_clean(engine)


def test_cache_salt_in_the_arena_and_through_llm():
    engine = make_engine(num_pages=40)
    a = engine.generate([question(0)], GREEDY)[0]
    rid = engine.add_request(question(1), GREEDY, cache_salt="b")
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.cache.stats()["hits"] == 0 and a.num_cached_prompt_tokens == 0
    llm = pnp.LLM(tiny_model(vocab_size=320), tokenizer=pnp.Tokenizer.tiny(), num_pages=40,
                  verbose=False)
    outs = [llm.generate({"prompt_token_ids": question(i), "cache_salt": salt}, GREEDY)[0]
            for i, salt in enumerate("xxy")]           # one after the other
    assert [o.num_cached_prompt_tokens for o in outs] == [0, len(SYSTEM), 0]
    with pytest.raises(pnp.DTypeError, match="cache_salt"):
        llm.generate({"prompt_token_ids": question(0), "cache_salt": 3})
    with pytest.raises(pnp.InvalidArgument, match="prompt_token_ids"):
        llm.generate({"prompt": "hi", "prompt_token_ids": [1]})
    assert rid not in engine.requests


def test_a_different_model_never_loads_the_pages(tmp_path):
    first = make_engine(disk_cache_dir=str(tmp_path))
    evict_and_ask(first)
    other = make_engine(tiny_model(seed=1), disk_cache_dir=str(tmp_path))
    assert other.stats()["tiers"]["disk"]["pages"] == 0              # sees none of them
    out, dense = evict_and_ask(other)
    assert out.token_ids == dense                  # from its own pages, stored meanwhile
    assert other.stats()["tiers"]["disk"]["faults"] == 0
    assert len([p for p in tmp_path.iterdir() if p.is_dir()]) == 2   # a folder each
    int8 = make_engine(disk_cache_dir=str(tmp_path), kv_cache_dtype="int8")
    assert int8.stats()["tiers"]["disk"]["pages"] == 0                # another format too
    check_clean(other)


def test_the_reuse_gate_keeps_a_page_once_a_second_prompt_asked_for_it():
    engine = make_engine(host_cache_memory="1MiB", tier_reuse_gate=1)
    out, dense = evict_and_ask(engine)        # question 0 asked once: not kept
    assert out.token_ids == dense and out.num_cached_prompt_tokens == 0
    out, dense = evict_and_ask(engine)        # asked by questions 0 and 1: kept now
    assert out.token_ids == dense and out.num_cached_prompt_tokens == len(SYSTEM)
    check_clean(engine)


def test_the_tier_eviction_policy_is_its_own(tmp_path):
    engine = make_engine(host_cache_memory="1MiB", tier_eviction_policy="fifo")
    assert engine.cache.tiers.host.index.policy.name == "fifo"
    assert engine.cache.prefix_index.policy.name == "lru"
    with pytest.raises(pnp.InvalidArgument, match="tier_eviction_policy"):
        pnp.EngineConfig(tier_eviction_policy="newest")
    with pytest.raises(pnp.InvalidArgument, match="host_cache_memory"):
        pnp.EngineConfig(host_cache_memory="lots")
    with pytest.raises(pnp.InvalidArgument, match="disk_write_policy"):
        pnp.EngineConfig(disk_write_policy="sometimes")


def test_a_default_engine_attaches_no_tier():
    engine = make_engine()
    assert engine.cache.tiers is None and engine.stats()["tiers"] == {}
    assert not engine.config.tiers


RESTART = r"""
import json, sys
sys.path.insert(0, "tests")
from tier_helpers import evict_and_ask, make_engine, check_clean
engine = make_engine(disk_cache_dir=sys.argv[1], prefix_cache=sys.argv[2])
out, dense = evict_and_ask(engine)
check_clean(engine)
print(json.dumps({"same": out.token_ids == dense, "cached": out.num_cached_prompt_tokens,
                  "disk": engine.stats()["tiers"]["disk"]}))
"""


@pytest.mark.parametrize("prefix_cache", ["hash", "radix"])
def test_a_restarted_engine_finds_the_pages_on_disk(tmp_path, prefix_cache):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    runs = []
    for _ in range(2):                         # two processes in sequence, one directory
        done = subprocess.run([sys.executable, "-c", RESTART, str(tmp_path), prefix_cache],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["same"] and second["same"]
    # The first process served question 1 from its own disk tier too (write-through);
    # the second starts with the first's files and loads them with question 0.
    assert second["disk"]["pages"] >= first["disk"]["pages"] > 0
    assert second["disk"]["hits"] > first["disk"]["hits"]
    assert second["disk"]["faults"] == 0


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_writing_whole_pages_equals_writing_their_slots_one_by_one(dtype):
    """write_slots takes whole pages page by page (the tiers' loads): same bytes as the
    scatter it replaces, for pages in any order, codes and scales alike."""
    import numpy as np

    cfg = pnp.CacheConfig(num_pages=8, page_size=4, num_layers=2, num_kv_heads=2,
                          head_dim=8, dtype=dtype)
    whole, one_by_one = pnp.PagedKVCache(cfg), pnp.PagedKVCache(cfg)
    rng = np.random.default_rng(0)
    slots = np.concatenate([np.arange(p * 4, p * 4 + 4) for p in (5, 2, 7)])   # [12]
    rows = rng.integers(-100, 100, (12, 2, 2, 2, 8)).astype(cfg.dtype)
    scales = rng.random((12, 2, 2, 2)).astype(np.float32) if cfg.quantized else None
    whole.write_slots(slots, rows, scales)
    for i, s in enumerate(slots):
        one_by_one.write_slots([s], rows[i:i + 1], None if scales is None else scales[i:i + 1])
    a, sa = whole.read_pages(range(8))
    b, sb = one_by_one.read_pages(range(8))
    assert np.array_equal(a, b) and (sa is None or np.array_equal(sa, sb))
