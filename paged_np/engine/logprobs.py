"""Log probabilities: how likely the model found each token (vLLM's ``logprobs``).

A row of logits ``z`` (float32 ``[V]``) becomes log probabilities by the
log-softmax ``z - logsumexp(z)``; the engine computes it in float64 from the
model's *raw* logits, before temperature, top-k or top-p (vLLM's default
``logprobs_mode="raw_logprobs"``), so the numbers describe the model, not
the sampler. Two places ask for them:

- ``SamplingParams(logprobs=k)``: for each **generated** token, its logprob
  and the ``k`` most likely tokens at that step (``-1``: the whole
  vocabulary). ``SampleOutput.logprobs`` gets one dict per token and
  ``cumulative_logprob`` their sum.
- ``SamplingParams(prompt_logprobs=k)``: the same for every **prompt**
  token, read from the logits at the position before it. The first token has
  no position before it, so ``RequestOutput.prompt_logprobs`` starts with
  ``None``. Perplexity is ``exp(-mean)`` of these (``python -m paged_np eval``).

Each position is a dict ``{token_id: Logprob(logprob, rank, decoded_token)}``
holding the token itself first, then the top ``k`` (vLLM's shape: up to
``k + 1`` entries). ``rank`` is 1-based: how many tokens of the vocabulary
are at least as likely as this one (the argmax has rank 1).
``decoded_token`` is filled by :class:`paged_np.LLM`, which has the tokenizer;
the engine works on ids and leaves it ``None``.

Prompt logprobs need logits at every prompt position, where a plain step
computes them only where a token is sampled: the engine asks the model for
those rows too (``ForwardBatch.logits_indices``, see
``Request.prompt_logprob_rows``). A request that wants them computes every prompt token:
it skips the prefix cache until its prompt's logprobs are all recorded (as
vLLM does), and a position computed twice (recomputed after a preemption)
is recorded once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Logprob:
    """One token's log probability at one position (vLLM's ``Logprob``).

    logprob : float, ``log p(token)`` under the model's raw distribution
    rank : int >= 1, 1 + the number of tokens strictly more likely (ties
        counted as more likely, as vLLM counts them)
    decoded_token : str or None, the token's text (filled by :class:`paged_np.LLM`)
    """

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """float32 ``[S, V]`` logits -> float64 ``[S, V]`` log probabilities."""
    x = logits.astype(np.float64)                                # [S, V]
    m = x.max(axis=-1, keepdims=True)                            # [S, 1], for stability
    lse = m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True))  # [S, 1] logsumexp
    return x - lse                                               # [S, V]


def logprob_dicts(logits: np.ndarray, token_ids, k: int) -> list[dict]:
    """One ``{token_id: Logprob}`` per row: the row's token first, then its top ``k``.

    logits float32 ``[S, V]``; token_ids int ``[S]`` (the token each row
    scored); ``k`` >= 0, or -1 for the whole vocabulary.
    """
    lp = log_softmax(logits)                                     # [S, V]
    S, V = lp.shape
    tok = np.asarray(token_ids, dtype=np.int64)                  # [S]
    chosen = lp[np.arange(S), tok]                               # [S]
    ranks = (lp >= chosen[:, None]).sum(axis=-1)                 # [S], 1-based
    k = V if k < 0 else min(k, V)
    if 0 < k < V:
        top = np.argpartition(-lp, k - 1, axis=-1)[:, :k]        # [S, k] unordered
        order = np.argsort(-np.take_along_axis(lp, top, -1), axis=-1, kind="stable")
        top = np.take_along_axis(top, order, -1)                 # [S, k] most likely first
    elif k == V:
        top = np.argsort(-lp, axis=-1, kind="stable")            # [S, V]
    else:
        top = np.zeros((S, 0), dtype=np.int64)
    top_lp = np.take_along_axis(lp, top, -1)                     # [S, k]
    out = []
    for s in range(S):
        d = {int(tok[s]): Logprob(float(chosen[s]), int(ranks[s]))}
        for r, (t, v) in enumerate(zip(top[s].tolist(), top_lp[s].tolist()), start=1):
            if t not in d:                                       # the token keeps its own rank
                d[t] = Logprob(float(v), r)
        out.append(d)
    return out


def record_prompt_logprobs(prompt: list, logits: np.ndarray, listeners=()) -> int:
    """Append the prompt logprobs of a step; returns the number of rows they used.

    ``prompt`` lists ``(req, m)`` (from :func:`~paged_np.engine.batching.build_batch`):
    the first rows of ``logits`` (float32 ``[S, V]``) are ``req``'s next ``m``
    unrecorded positions, request after request. Each of ``listeners`` is
    called as ``fn(request_id, 0, position, row)`` (``Engine.add_logits_listener``).
    """
    row = 0
    for req, m in prompt:
        recorded = req.parent.output.prompt_logprobs
        first = len(recorded)                                    # token index scored first
        targets = req.parent.prompt[first:first + m]             # [m] the tokens they score
        rows = logits[row:row + m]                               # [m, V]
        for i in range(m):
            for fn in listeners:
                fn(req.parent.request_id, 0, first - 1 + i, rows[i])
        recorded += logprob_dicts(rows, targets, req.parent.params.prompt_logprobs)
        row += m
    return row


def append_sample_logprobs(sample, rows: np.ndarray, tokens: list, k: int) -> None:
    """Record the logprobs of the tokens a step emitted: ``rows`` float32 ``[m, V]``."""
    dicts = logprob_dicts(rows, tokens, k)
    sample.logprobs += dicts
    sample.cumulative_logprob += sum(d[t].logprob for d, t in zip(dicts, tokens))


def fill_decoded(entries, tokenizer) -> None:
    """Set ``decoded_token`` on every Logprob of ``entries`` (dicts, or None) that lacks it."""
    for d in entries:
        if d is None:
            continue
        for t, lp in d.items():
            if lp.decoded_token is None:
                lp.decoded_token = tokenizer.decode([t], skip_special_tokens=False)


def perplexity(prompt_logprobs) -> float:
    """``exp(-mean log p)`` over the scored tokens of a ``prompt_logprobs`` list."""
    lps = [next(iter(d.values())).logprob for d in prompt_logprobs if d is not None]
    return float(np.exp(-np.mean(lps)))
