"""Step 2 of an engine step: the scheduled tokens as one varlen batch for the model.

:func:`build_batch` concatenates every scheduled sequence's new tokens, their
positions and slots, fetches the block tables, and says which rows of the
model's output need logits (``logits_indices``): the last row of each
sequence that samples now (``1 + k`` rows when it verifies ``k`` drafts),
and, first, one row per prompt position of a request that asked for
``prompt_logprobs`` (:mod:`.logprobs`). The model computes the LM head only
at those rows, so a plain step pays for one row per sampling sequence.
"""

from __future__ import annotations

import numpy as np

from ..models.llama import ForwardBatch


def build_batch(scheduled, cache, sliding_window=None, attention_sinks=0
                ) -> tuple[ForwardBatch, list]:
    """``(batch, prompt)`` for ``scheduled`` ``(req, n, slots)`` triples.

    ``sliding_window``, ``attention_sinks``: the engine's mask (None: the model's own).

    ``prompt`` lists ``(req, m)``: ``req`` gets prompt-logprob rows for ``m``
    positions; those rows come first in the logits, in this order, before
    the sampling rows the engine reads as before.
    """
    # One pass in Python over the scheduled sequences, then NumPy on whole arrays.
    counts, starts, ends, tokens, n_logits = [], [], [], [], []
    prompt, prompt_idx = [], []                                  # prompt-logprob rows
    offset = 0                                                   # the sequence's first token
    for s, n, _ in scheduled:
        c = s.num_computed_tokens
        counts.append(n)                                         # new tokens this step
        starts.append(c)                                         # first new position
        drafts = s.spec_token_ids                                # speculation: after the
        ends.append(s.num_tokens + len(drafts))                  # ... input, k drafts
        tokens += s.tokens(c, c + n - len(drafts)) + drafts
        n_logits.append(1 + len(drafts))                         # rows if it samples
        m = s.prompt_logprob_rows(c, n)                          # positions to score
        if m:
            first = max(c, len(s.parent.output.prompt_logprobs) - 1)  # the first unrecorded
            prompt.append((s, m))
            prompt_idx.append(offset + first - c + np.arange(m))
        offset += n
    counts = np.array(counts, np.int64)                          # [B]
    starts = np.array(starts, np.int64)                          # [B]
    qsl = np.zeros(len(scheduled) + 1, dtype=np.int32)           # [B+1]
    np.cumsum(counts, out=qsl[1:])
    T = int(qsl[-1])
    # Position of token t of sequence b: starts[b] + (t - qsl[b]).
    positions = np.repeat(starts - qsl[:-1], counts) + np.arange(T)  # [T]
    slots = np.concatenate([slots for _, _, slots in scheduled])     # [T] int64
    meta = cache.batch([s.seq_id for s, _, _ in scheduled])
    # Sequences that reach the end of what they know sample a token now: from
    # their last row, or (drafting) from all 1 + k rows, to verify the drafts.
    samples = (starts + counts) == np.array(ends, np.int64)      # [B] bool
    n_logits = np.array(n_logits, np.int64)[samples]             # [B'] rows each
    logits_indices = (np.repeat(qsl[1:][samples] - n_logits, n_logits)
                      + _ranges(n_logits))                       # [S] int64
    if prompt_idx:                                               # prompt rows first
        logits_indices = np.concatenate(prompt_idx + [logits_indices]).astype(np.int64)
    return ForwardBatch(np.array(tokens, np.int64), positions, slots, qsl,
                        meta.block_tables, meta.seq_lens, logits_indices, sliding_window,
                        attention_sinks), prompt


def _ranges(counts: np.ndarray) -> np.ndarray:
    """``[0..counts[0]), [0..counts[1]), ...`` concatenated: int64 [sum(counts)]."""
    ends = np.cumsum(counts)                                     # [B']
    return np.arange(int(ends[-1]) if len(ends) else 0) - np.repeat(ends - counts, counts)
