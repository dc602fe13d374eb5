"""Check served tokens against the model without a cache (teacher forcing).

Greedy decoding on the paged cache must pick, at every step, the argmax of
the logits the model gives *without* any cache. One dense forward over
``prompt + output`` yields those logits for every position at once (teacher
forcing: the served tokens are fed back as the input), so checking a
request costs one forward, not one per token.

Float32 sums taken in a different order (pages, chunks, batches) differ in
the last bits; when the two best logits are closer than ``tie_gap`` either
token is a correct argmax. Such a position is reported as a near-tie, never
counted as a match or hidden: the check stops there, since the tokens after a
different pick would differ anyway.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class DenseCheck:
    """The result of :func:`check_against_dense` for one request."""

    ok: bool                    # every token checked is the dense argmax
    checked: int                # tokens compared (up to a near-tie or a mismatch)
    mismatch: int | None = None  # index in the output of the first wrong token
    near_tie: int | None = None  # index of a near-tie where the check stopped
    gap: float | None = None     # the top-2 logit gap there


def check_against_dense(model, prompt_ids, token_ids, tie_gap: float = 1e-4) -> DenseCheck:
    """Is every greedy ``token_ids[i]`` the dense argmax after ``prompt + token_ids[:i]``?"""
    prompt_ids, token_ids = list(prompt_ids), list(token_ids)
    if not token_ids:
        return DenseCheck(ok=True, checked=0)
    logits = model.dense_logits(prompt_ids + token_ids[:-1])     # [P + N - 1, V]
    rows = logits[len(prompt_ids) - 1:]                           # [N, V] one per output token
    for i, (row, tok) in enumerate(zip(rows, token_ids)):
        best = int(np.argmax(row))
        top2 = np.partition(row, -2)[-2:]
        gap = float(top2[1] - top2[0])
        if gap < tie_gap:
            ok = tok in np.flatnonzero(row >= row.max() - tie_gap)
            return DenseCheck(ok=bool(ok), checked=i, near_tie=i, gap=gap,
                               mismatch=None if ok else i)
        if best != tok:
            return DenseCheck(ok=False, checked=i, mismatch=i, gap=gap)
    return DenseCheck(ok=True, checked=len(token_ids))
