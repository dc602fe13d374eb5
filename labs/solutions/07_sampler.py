"""Lab 7, solved: the sampler. Try the lab (labs/07_sampler.py) first."""

import numpy as np


def probabilities(logits, temperature, top_p):
    """float64 [V]: the distribution a token is drawn from (temperature > 0)."""
    x = logits.astype(np.float64) / temperature              # [V]
    p = np.exp(x - x.max())                                  # [V] unnormalised, no overflow
    p /= p.sum()
    if top_p < 1.0:
        order = np.argsort(-p, kind="stable")                # most likely first, ties by id
        keep = int(np.searchsorted(np.cumsum(p[order]), top_p)) + 1   # the crossing one too
        cut = np.zeros_like(p)
        cut[order[:keep]] = p[order[:keep]]
        p = cut / cut.sum()
    return p


def sample(logits, params, rngs):
    """int64 [S]: one token per row of ``logits`` [S, V]."""
    tokens = np.argmax(logits, axis=1).astype(np.int64)      # [S] greedy rows are done
    for i, (p, rng) in enumerate(zip(params, rngs)):
        if p.temperature == 0:
            continue                                         # greedy: nothing drawn
        cdf = np.cumsum(probabilities(logits[i], p.temperature, p.top_p))   # [V]
        u = rng.random()                                     # the one draw of this token
        tokens[i] = min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), len(cdf) - 1)
    return tokens
