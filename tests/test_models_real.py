"""SmolLM2-135M-Instruct, the real model, against golden outputs recorded from transformers.

The model is fetched once per test run into ``PAGED_NP_HOME`` (default
``~/.cache/paged_np``) and reused. If it cannot be fetched these tests FAIL
with the fix in the message: they never skip. Golden data:
``tests/data/smollm2_golden.json``, written by ``tests/data/make_golden.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import paged_np as pnp
from paged_np.models.hub import fetch_model
from paged_np.models.llama import ForwardBatch

GOLDEN = json.loads((Path(__file__).parent / "data" / "smollm2_golden.json").read_text())
RECORDS = GOLDEN["records"]


@pytest.fixture(scope="session")
def smollm2_path():
    try:
        return fetch_model("smollm2-135m-instruct")
    except pnp.ModelFetchError as e:
        pytest.fail(f"the real-model tests need SmolLM2-135M-Instruct and could not fetch it: {e}")


@pytest.fixture(scope="session")
def smollm2(smollm2_path):
    return pnp.load_model(smollm2_path)


def paged_greedy(model, prompt_ids, max_tokens, stop_token_ids, page_size=16):
    """Greedy decoding through the paged cache: one prefill step, then one token a step."""
    cfg = model.cfg
    num_pages = (len(prompt_ids) + max_tokens) // page_size + 2
    cache = pnp.PagedKVCache(pnp.CacheConfig(num_pages=num_pages, page_size=page_size,
                                             num_layers=cfg.num_layers,
                                             num_kv_heads=cfg.num_kv_heads,
                                             head_dim=cfg.head_dim))
    cache.add_sequence(0, list(prompt_ids))
    out, new, start = [], list(prompt_ids), 0                   # start: tokens in the cache
    while len(out) < max_tokens:
        slots = cache.allocate_slots(0, len(new))
        meta = cache.batch([0])
        batch = ForwardBatch(np.asarray(new, dtype=np.int64),
                             np.arange(start, start + len(new), dtype=np.int64), slots,
                             np.array([0, len(new)], dtype=np.int32), meta.block_tables,
                             meta.seq_lens, np.array([len(new) - 1], dtype=np.int64))
        logits = model.forward(batch, cache)                     # [1, V]
        cache.append_tokens(0, new)
        start += len(new)
        tok = int(np.argmax(logits[0]))
        out.append(tok)
        if tok in stop_token_ids:
            break
        new = [tok]
    return out


def test_config_is_read_from_the_checkpoint(smollm2):
    model, tok = smollm2
    cfg = model.cfg
    assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (30, 9, 3, 64)
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size) == (576, 1536, 49152)
    assert cfg.tie_word_embeddings and cfg.rope_theta == 100000.0 and cfg.rms_norm_eps == 1e-5
    assert cfg.max_position_embeddings == 8192
    assert (tok.bos_token_id, tok.eos_token_id, tok.vocab_size) == (1, 2, 49152)
    assert model.num_parameters == 134_515_008


@pytest.mark.parametrize("rec", RECORDS, ids=lambda r: r["messages"][0]["content"][:20])
def test_chat_template_and_tokens_equal_transformers(smollm2, rec):
    _, tok = smollm2
    prompt = tok.apply_chat_template(rec["messages"])
    assert prompt == rec["prompt"]
    assert tok.encode(prompt) == rec["prompt_ids"]


@pytest.mark.parametrize("rec", RECORDS, ids=lambda r: r["messages"][0]["content"][:20])
def test_last_position_logits_match_transformers(smollm2, rec):
    model, _ = smollm2
    logits = model.dense_logits(rec["prompt_ids"])[-1]           # [V]
    np.testing.assert_allclose(logits[rec["logit_ids"]], rec["logits"], rtol=0, atol=2e-4)


@pytest.mark.parametrize("rec", RECORDS, ids=lambda r: r["messages"][0]["content"][:20])
def test_greedy_through_the_paged_cache_equals_transformers(smollm2, rec):
    model, tok = smollm2
    out = paged_greedy(model, rec["prompt_ids"], GOLDEN["max_new_tokens"], tok.stop_token_ids)
    assert out == rec["greedy_ids"]
    assert tok.decode(out) == rec["greedy_text"]


def test_resident_memory_after_load_is_at_most_600_mib(smollm2_path):
    # In a fresh process: this one holds the test session's own model too.
    code = ("import paged_np as pnp, sys; m, t = pnp.load_model(sys.argv[1]); "
            "print(int(open('/proc/self/status').read().split('VmRSS:')[1].split()[0]))")
    out = subprocess.run([sys.executable, "-c", code, str(smollm2_path)], capture_output=True,
                         text=True, check=True, cwd=Path(__file__).parents[1])
    rss_mib = int(out.stdout.split()[-1]) / 1024
    assert rss_mib <= 600, f"resident memory after load: {rss_mib:.0f} MiB"
