"""Helpers of the tier tests: an engine whose small arena evicts a shared prompt, and
asking for it again."""

from __future__ import annotations

import numpy as np
from engine_helpers import tiny_model

import paged_np as pnp

PAGE = 8
#: A shared "system prompt" of 6 pages, and fillers that push it out of a 12-page arena.
SYSTEM = np.random.default_rng(7).integers(0, 128, 6 * PAGE).tolist()
FILLERS = [np.random.default_rng(100 + i).integers(0, 128, 7 * PAGE).tolist()
           for i in range(3)]
GREEDY = pnp.SamplingParams(max_tokens=6, temperature=0)


def question(i: int) -> list:
    return SYSTEM + np.random.default_rng(i).integers(0, 128, 5).tolist()


def make_engine(model=None, **options) -> pnp.Engine:
    """A 12-page arena (96 tokens): the system prompt and one filler do not fit together."""
    model = tiny_model() if model is None else model
    opts = dict(num_pages=12, page_size=PAGE, max_num_seqs=2, max_num_batched_tokens=64)
    return pnp.Engine(model, **{**opts, **options})


def evict_and_ask(engine, salts=(None, None)) -> tuple:
    """Serve question 0, push the system prompt out of the arena with the fillers, ask
    question 1. Returns (output of question 1, its dense tokens, the engine's tiers stats)."""
    _serve(engine, question(0), salts[0])
    for f in FILLERS:
        _serve(engine, f, None)
    out = _serve(engine, question(1), salts[1])
    return out, engine.model.dense_generate(question(1), max_tokens=GREEDY.max_tokens)


def _serve(engine, prompt, salt):
    rid = engine.add_request(prompt, GREEDY, cache_salt=salt)
    while True:
        for out in engine.step():
            if out.request_id == rid:
                return out


def check_clean(engine) -> None:
    """Invariants of the cache and of each tier; no page left in use (no leak)."""
    cache = engine.cache
    cache.check_invariants()
    if cache.tiers is not None:
        cache.tiers.check_invariants()
    assert cache.pool.num_in_use == 0, "pages leaked: in use with no request left"
