"""Every choice is named once (paged_np/registry.py), and a choice added from outside the
package is used by the engine without editing it.

- No second list: no tuple, list, set or dict literal anywhere in ``paged_np/`` holds two
  or more names of one registry (the drift issue 43 found: eviction policies spelled in
  four files, prefix indexes in three, ...).
- Outside registration: a test registers its own eviction policy, prefix index,
  attention backend, cache class, scheduler, sampler and engine step, serves requests
  through :class:`paged_np.LLM` with each, and checks that each was called and that the
  greedy text equals the package's own.
"""

from __future__ import annotations

import ast
import types
from pathlib import Path

import numpy as np
import pytest

import paged_np as pnp
from paged_np import registry
from paged_np.cache.hash_index import HashIndex
from paged_np.cache.kv_cache import PagedKVCache
from paged_np.engine import engine as engine_module
from paged_np.engine.sampling import sample_tokens
from paged_np.engine.scheduler import Scheduler

ROOT = Path(__file__).resolve().parents[1]


def _literal_lists(tree: ast.AST):
    """Every tuple/list/set literal and dict literal's keys: ``(node, [str constants])``."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            elts = node.elts
        elif isinstance(node, ast.Dict):
            elts = [k for k in node.keys if k is not None]
        else:
            continue
        yield node, [e.value for e in elts if isinstance(e, ast.Constant)
                     and isinstance(e.value, str)]


def test_no_choice_list_is_spelled_twice():
    found = []
    for path in sorted((ROOT / "paged_np").rglob("*.py")):
        if path.name == "registry.py":
            continue
        tree = ast.parse(path.read_text())
        for node, strings in _literal_lists(tree):
            for reg in registry.REGISTRIES.values():
                names = set(reg) | ({"auto"} if reg is registry.ATTENTION_BACKENDS else set())
                hits = sorted(set(strings) & names)
                if len(hits) >= 2:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {hits} "
                                 f"(read registry.{reg.option!r})")
    assert not found, "choice lists spelled outside paged_np/registry.py:\n" + "\n".join(found)


def test_the_detector_finds_a_planted_list():
    tree = ast.parse('POLICIES = ("lru", "fifo")\nx = {"hash": 1, "radix": 2}\n')
    lists = [strings for _, strings in _literal_lists(tree)]
    assert ["lru", "fifo"] in lists and ["hash", "radix"] in lists


def test_a_registry_refuses_bad_names_and_reports_its_choices():
    reg = registry.Registry("thing", "things")
    reg.register("a", "paged_np.cache.eviction:LRUPolicy")
    with pytest.raises(pnp.InvalidArgument, match="already"):
        reg.register("a", None)
    with pytest.raises(pnp.InvalidArgument, match="identifier"):
        reg.register("not a name", None)
    with pytest.raises(pnp.InvalidArgument, match=r"thing must be one of \('a',\), got 'b'"):
        reg.load("b")
    assert reg.load("a") is pnp.LRUPolicy
    reg.unregister("a")
    assert tuple(reg) == ()


# --------------------------------------------------------- outside registration
CALLS: dict[str, int] = {}


def _count(name: str) -> None:
    CALLS[name] = CALLS.get(name, 0) + 1


class MRU(pnp.EvictionPolicy):
    """Most recently used first: a deliberately different priority."""

    def priority(self, entry):
        _count("policy")
        return -entry.last_access_time


class CountingIndex(HashIndex):
    def match_prefix(self, prompt, extra_key=None):
        _count("index")
        return super().match_prefix(prompt, extra_key)


class CountingCache(PagedKVCache):
    def allocate_slots(self, seq_id, n):
        _count("cache")
        return super().allocate_slots(seq_id, n)


class CountingScheduler(Scheduler):
    def schedule(self):
        _count("scheduler")
        return super().schedule()


def counting_sampler(logits, params, rngs):
    _count("sampler")
    return sample_tokens(logits, params, rngs)


def counting_step(engine):
    _count("step")
    return engine_module.continuous_batching_step(engine)


def _numpy_backend_counting():
    numpy_paged = registry.ATTENTION_BACKENDS.load("numpy")

    def forward(*args, **kw):
        _count("backend")
        return numpy_paged.forward(*args, **kw)

    return types.SimpleNamespace(forward=forward)


OUTSIDE = [  # (registry, name, target, the option that chooses it)
    (registry.EVICTION_POLICIES, "mru_test", MRU, "eviction_policy"),
    (registry.PREFIX_INDEXES, "counting_test", CountingIndex, "prefix_cache"),
    (registry.ATTENTION_BACKENDS, "counting_test", _numpy_backend_counting(), "backend"),
    (registry.KV_CACHES, "counting_test", CountingCache, "kv_cache"),
    (registry.SCHEDULERS, "counting_test", CountingScheduler, "scheduler"),
    (registry.SAMPLERS, "counting_test", counting_sampler, "sampler"),
    (registry.ENGINE_STEPS, "counting_test", counting_step, "engine_step"),
]


@pytest.fixture
def registered():
    for reg, name, target, _ in OUTSIDE:
        reg.register(name, target, "a test's own", engine=True)
    CALLS.clear()
    try:
        yield {option: name for _, name, _, option in OUTSIDE}
    finally:
        for reg, name, _, _ in OUTSIDE:
            reg.unregister(name)


def test_choices_registered_outside_serve_through_llm(registered):
    tok = pnp.Tokenizer.tiny()
    model = pnp.LlamaModel.random(pnp.ModelConfig(vocab_size=tok.vocab_size), seed=0)
    prompts = ["the cache keeps pages", "the cache keeps pages of keys", "a b c d e f g"]
    params = pnp.SamplingParams(max_tokens=12, temperature=0.0)
    # A small arena so that pages are evicted: the policy's priority is asked for.
    mine = pnp.LLM(model, tokenizer=tok, num_pages=12, page_size=4, verbose=False,
                   **registered)
    got = [o.outputs[0].token_ids for o in mine.generate(prompts, params)]
    ours = pnp.LLM(model, tokenizer=tok, num_pages=12, page_size=4, backend="numpy",
                   verbose=False)
    want = [o.outputs[0].token_ids for o in ours.generate(prompts, params)]
    assert got == want                             # greedy text: the choices change no token
    assert set(CALLS) == {"policy", "index", "backend", "cache", "scheduler", "sampler",
                          "step"}, CALLS
    cfg = mine.engine.config
    assert (cfg.eviction_policy, cfg.prefix_cache, cfg.backend) == (
        "mru_test", "counting_test", "counting_test")
    mine.engine.cache.check_invariants()


def test_an_unregistered_choice_is_refused_by_name():
    with pytest.raises(pnp.InvalidArgument, match="scheduler must be one of"):
        pnp.EngineConfig(scheduler="nope")
    with pytest.raises(pnp.InvalidArgument, match="prefix_cache"):
        pnp.CacheConfig(num_pages=4, prefix_cache="nope")


def test_cache_config_takes_a_policy_object_as_make_policy_does():
    policy = MRU()
    cfg = pnp.CacheConfig(num_pages=8, page_size=4, eviction_policy=policy)
    cache = pnp.PagedKVCache(cfg)
    assert cache.prefix_index.policy is policy
    assert np.dtype(pnp.CacheConfig(num_pages=1, dtype="fp8_e4m3").dtype) == np.uint8
    assert pnp.CacheConfig(num_pages=1, dtype="fp8_e4m3").kv_format == "fp8_e4m3"
