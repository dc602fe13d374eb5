"""Which drafts to keep: speculative decoding's acceptance test, exact in distribution.

A request with ``k`` drafts ``d_0 .. d_{k-1}`` was run as ``1 + k`` query rows,
so the forward gives the target model's logits at every position: row ``i``
is the distribution of the token after the input and ``d_0 .. d_{i-1}``. One
call of :func:`rejection_sample` turns those rows into the tokens the step
emits: the accepted drafts, then one more token.

- **Greedy** (``params.greedy``: a temperature below ``1e-5``, as in vLLM): keep
  the longest prefix of drafts equal to the argmax of their rows, then the
  argmax of the first row that disagrees (or of the last row, the bonus, when
  all agree). The tokens are
  exactly the ones greedy decoding without drafts would give.
- **Sampling** (Leviathan et al. 2023, Chen et al. 2023): with ``p_i`` the
  target distribution of row ``i`` (temperature, top-k, top-p applied by
  :func:`~paged_np.engine.sampling.probs`, the very function plain sampling
  uses) and ``q_i`` the draft's, accept ``d_i`` with probability
  ``min(1, p_i(d_i) / q_i(d_i))``; at the first rejection draw from
  ``normalise(max(0, p_i - q_i))`` and stop; if all ``k`` are accepted draw
  a bonus token from ``p_k``. Each emitted token is then distributed exactly
  as ``p`` (the residual makes up what the acceptance test took away), so
  speculation changes the speed, never the distribution.

The n-gram proposer's draft is certain, ``q_i`` a point mass on ``d_i``
(``draft_probs=None``): accept with probability ``p_i(d_i)``, and on rejection
draw from ``p_i`` with ``d_i`` removed. A draft model would pass its own
``[k, V]`` probabilities.

Randomness comes from the request's own generator: one uniform per acceptance
test and one per drawn token (greedy draws none). The draws differ from a run
without drafts, so a seeded sampled request gives other (equally distributed)
tokens with speculation on; greedy tokens are identical.
"""

from __future__ import annotations

import numpy as np

from ..errors import DTypeError, InvalidArgument, ShapeError
from .sampling import SamplingParams, draw, probs

__all__ = ["rejection_sample"]


def rejection_sample(target_logits: np.ndarray, draft_token_ids, draft_probs,
                     params: SamplingParams, rng: np.random.Generator) -> list[int]:
    """Accepted drafts plus one token: ``[k+1, V]`` logits, ``k`` drafts -> ``a + 1`` ids.

    Parameters
    ----------
    target_logits : float [k+1, V], the target model's rows for this request.
    draft_token_ids : k ints in ``[0, V)``.
    draft_probs : None (a point mass on each draft: n-gram drafts) or float [k, V],
        the distribution each draft was drawn from (``q_i(d_i) > 0``).
    params : the request's SamplingParams.
    rng : the request's generator (unused when greedy).

    Returns
    -------
    list of int
        The emitted tokens: ``draft_token_ids[:a]`` then one more, ``0 <= a <= k``.
    """
    drafts = _check(target_logits, draft_token_ids, draft_probs, params)
    k = len(drafts)
    if params.greedy:
        target = np.argmax(target_logits, axis=-1)                  # [k+1]
        a = 0
        while a < k and int(target[a]) == drafts[a]:
            a += 1
        return drafts[:a] + [int(target[a])]
    for i, d in enumerate(drafts):
        p = probs(target_logits[i], params)                         # [V] target
        q_d = 1.0 if draft_probs is None else float(draft_probs[i, d])
        if rng.random() * q_d < p[d]:                               # u < p(d) / q(d)
            continue                                                # accepted
        if draft_probs is None:
            residual = p.copy()                                     # max(0, p - onehot(d))
            residual[d] = 0.0
        else:
            residual = np.maximum(p - draft_probs[i], 0.0)          # [V]
        if residual.sum() <= 0.0:       # only when p == q: a rejection cannot happen then,
            residual = p                # but rounding may; p is the exact fallback
        return drafts[:i] + [draw(residual, rng)]
    return drafts + [draw(probs(target_logits[k], params), rng)]   # all accepted: bonus


def _check(target_logits, draft_token_ids, draft_probs, params) -> list[int]:
    """Validate the arguments; returns the drafts as a list of ints."""
    if not isinstance(params, SamplingParams):
        raise DTypeError(f"params must be a SamplingParams, got {type(params).__name__}")
    if not isinstance(target_logits, np.ndarray) or target_logits.ndim != 2:
        raise ShapeError("target_logits must be a 2-D array [k+1, V]")
    drafts = [int(t) for t in draft_token_ids]
    k, V = len(drafts), target_logits.shape[1]
    if target_logits.shape[0] != k + 1:
        raise ShapeError(f"target_logits: {target_logits.shape[0]} rows for {k} drafts "
                         f"(need k + 1 = {k + 1})")
    if any(not 0 <= t < V for t in drafts):
        raise InvalidArgument(f"draft_token_ids: an id outside [0, {V}): {drafts}")
    if draft_probs is not None:
        if not isinstance(draft_probs, np.ndarray) or draft_probs.shape != (k, V):
            raise ShapeError(f"draft_probs must be None or an array [k, V] = [{k}, {V}]")
        if (draft_probs < 0).any() or any(draft_probs[i, d] <= 0 for i, d in enumerate(drafts)):
            raise InvalidArgument("draft_probs: negative, or zero at a draft it proposed")
    return drafts
