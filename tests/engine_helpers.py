"""Helpers shared by the model and engine tests: a tiny model, prompts, backends."""

from __future__ import annotations

import numpy as np

import paged_np as pnp

TINY = dict(vocab_size=128, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
            head_dim=16, intermediate_size=128)


def tiny_model(seed=0, **overrides) -> pnp.LlamaModel:
    return pnp.LlamaModel.random(pnp.ModelConfig(**{**TINY, **overrides}), seed=seed)


def prompts(n, seed=0, system=None, low=3, high=30, vocab=128):
    """``n`` random prompts; every other one starts with ``system`` if given."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        body = rng.integers(0, vocab, int(rng.integers(low, high))).tolist()
        out.append((list(system) if system is not None and i % 2 == 0 else []) + body)
    return out


# numba is a dependency: its backend failing to load is a failure, not a skip.
BACKENDS = ["numpy", "numba"]
