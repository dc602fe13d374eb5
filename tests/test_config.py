"""EngineConfig and the registries: one validated set of options, one table of names."""

import dataclasses

import numpy as np
import pytest

import paged_np as pnp
from paged_np.checks import parse_bytes
from paged_np.engine.config import EngineConfig
from paged_np.registry import ATTENTION_BACKENDS, backend_names, check_backend


def test_every_backend_in_the_registry_is_a_paged_attention_choice():
    rng = np.random.default_rng(0)
    k = rng.standard_normal((2, 1, 4, 8), dtype=np.float32)
    q = rng.standard_normal((1, 1, 8), dtype=np.float32)
    assert set(pnp.attention.BACKENDS) == set(ATTENTION_BACKENDS) | {"auto"}
    with pytest.raises(pnp.InvalidArgument, match="backend must be one of"):
        pnp.paged_attention(q, k, k, np.array([[0]]), np.array([3]), backend="tpu")


def test_the_engine_refuses_cuda_with_the_registry_reason_everywhere():
    reason = ATTENTION_BACKENDS["cuda"].why_not_engine
    assert "cuda" not in backend_names(engine=True)
    with pytest.raises(pnp.InvalidArgument) as a:
        EngineConfig(backend="cuda")
    with pytest.raises(pnp.InvalidArgument) as b:
        check_backend("cuda", "backend", engine=True)
    assert reason in str(a.value) and str(a.value) == str(b.value)


@pytest.mark.parametrize("options, match", [
    (dict(num_pages=0), "num_pages"),
    (dict(num_pages=8, kv_cache_memory="1MiB"), "not both"),
    (dict(kv_cache_memory="lots"), "kv_cache_memory"),
    (dict(schedule="sjf"), "schedule"),
    (dict(prefix_cache="trie"), "prefix_cache"),
    (dict(preemption_mode="kill"), "preemption_mode"),
    (dict(eviction_policy="random"), "eviction_policy"),
    (dict(swap_pages=-1), "swap_pages"),
    (dict(max_num_seqs=0), "max_num_seqs"),
    (dict(record_events="yes"), "record_events"),
    (dict(colour="red"), "unknown engine option"),
])
def test_bad_options_are_refused_naming_the_option(options, match):
    with pytest.raises(pnp.PagedNPError, match=match):
        EngineConfig.from_options(**options)


def test_page_count_comes_from_the_cache_configs_page_bytes():
    mcfg = pnp.ModelConfig()
    per_page = EngineConfig(num_pages=1).cache_config(mcfg).bytes_per_page
    assert per_page == 2 * mcfg.num_layers * mcfg.num_kv_heads * 16 * mcfg.head_dim * 4
    cfg = EngineConfig(kv_cache_memory=10 * per_page + 1).cache_config(mcfg)
    assert cfg.num_pages == 10
    default = EngineConfig().cache_config(mcfg)
    assert default.num_pages == parse_bytes(EngineConfig.DEFAULT_KV_CACHE_MEMORY) // per_page
    with pytest.raises(pnp.InvalidArgument, match="less than one page"):
        EngineConfig(kv_cache_memory=per_page - 1).cache_config(mcfg)


def test_from_options_replaces_and_one_size_replaces_the_other():
    base = EngineConfig(num_pages=64, schedule="lpm")
    cfg = EngineConfig.from_options(base, kv_cache_memory="1MiB", prefix_cache="radix")
    assert (cfg.num_pages, cfg.kv_cache_memory, cfg.schedule, cfg.prefix_cache) == (
        None, "1MiB", "lpm", "radix")
    assert dataclasses.replace(base) == base


def test_radix_refuses_a_sliding_window_model_through_the_index_not_a_branch():
    from paged_np.cache import HashIndex, RadixIndex

    assert RadixIndex.no_sliding_window and not HashIndex.no_sliding_window
    model = pnp.LlamaModel.random(pnp.ModelConfig(sliding_window=8), seed=0)
    with pytest.raises(pnp.InvalidArgument, match="sliding-window"):
        pnp.Engine(model, num_pages=8, prefix_cache="radix")
    pnp.Engine(model, num_pages=8, prefix_cache="hash")


def test_load_model_uses_the_architecture_table():
    from paged_np.registry import ARCHITECTURES, model_class

    assert model_class(pnp.ModelConfig().architecture) is pnp.LlamaModel
    with pytest.raises(pnp.ModelLoadError, match="not supported"):
        model_class("gpt2")
    with pytest.raises(pnp.InvalidArgument, match="architecture"):
        pnp.ModelConfig(architecture="gpt2")
    assert "llama" in ARCHITECTURES
