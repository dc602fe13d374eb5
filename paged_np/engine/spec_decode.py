"""Speculative decoding's drafts: the n-gram proposer and when to stop drafting.

Prompt-lookup decoding (vLLM's ``speculative_config={"method": "ngram"}``)
needs no second model. A request whose context ends in tokens it has seen
before probably continues the way it did then: a summary copies a phrase of
its document, an edit keeps most of the code it edits. So the proposer looks
for an earlier occurrence of the context's last ``n`` tokens (the longest ``n``
first; of its occurrences, the latest) and proposes the tokens that followed
it::

    context  ... the cat sat on the mat . the cat  ?
    n = 2          ^^^^^^^ earlier occurrence        -> drafts: sat on the mat

A request that departs from the text it copies (it fixes a typo, renames a
variable) has its drafts rejected there, and for the next ``prompt_lookup_min``
tokens no n-gram recurs: its last tokens are its own. Often it has already taken
up the text again a token or two later, so after a rejected draft the proposer
also looks, for :data:`REJOIN_TOKENS` tokens, for the model's last token just
past the point where it left the text, and drafts what follows it there
(:meth:`NgramProposer.rejoin`; the scheduler keeps where the request left,
``Request.spec_rejoin``)::

    text     ... the council agred to run a trial
    output   ... the council agreed        (draft "agred" rejected: "agreed" instead)
             ... the council agreed to     "to" stands just past "agred": -> run a trial

On the benchmark's input-grounded chats this lifted the steps saved from 2.90x to
3.09x (``benchmarks/spec_decode.py``); open-ended chats, which rarely draft, are
unchanged. vLLM has no such rule.

The engine then checks all the drafts in one forward pass (1 + k query rows
for this request, :mod:`paged_np.engine.rejection` decides which to keep),
so a step can yield up to k + 1 tokens for the price of reading the weights
once. Where the drafts keep failing (open-ended chat, where little is
copied) every verify step is a wasted (1 + k)-row forward, so each request
tracks its recent acceptance and pauses drafting when it is low
(:class:`DraftBackoff`).

Compared with vLLM: the same keys and the same "longest n first" rule, but not
the same occurrence: vLLM takes the longest match at its *earliest* occurrence,
this proposer at its *latest* (the most recent copy is the likelier one to be
continued), so the two can draft differently on one context. Found with NumPy
instead of a KMP scan in Numba, plus the rejoin; drafts are
proposed by the scheduler when it schedules a request (vLLM proposes right
after sampling, for the next step); no draft models, EAGLE or Medusa, but the
acceptance function takes a general draft distribution so a draft model can
plug in.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from ..errors import DTypeError
from .config import SpeculativeConfig

__all__ = ["BACKOFF_STEPS", "MAX_BACKOFF_STEPS", "BREAK_EVEN_TOKENS", "REJOIN_TOKENS", "WINDOW",
           "DraftBackoff", "NgramProposer", "propose_reference", "rejoin_reference"]


class NgramProposer:
    """Drafts from the context itself: ``NgramProposer(spec).propose(token_ids)``.

    Pure: the same tokens give the same drafts; nothing is kept between calls.
    """

    def __init__(self, spec: SpeculativeConfig):
        if not isinstance(spec, SpeculativeConfig):
            raise DTypeError(f"spec must be a SpeculativeConfig, got {type(spec).__name__}")
        self.k = spec.num_speculative_tokens
        self.n_max = spec.prompt_lookup_max
        self.n_min = spec.prompt_lookup_min

    def propose(self, token_ids, k: int | None = None) -> list[int]:
        """At most ``k`` (default: ``num_speculative_tokens``) drafts; [] when no n-gram recurs.

        ``token_ids`` is the whole context, prompt then output. For ``n`` from
        ``prompt_lookup_max`` down to ``prompt_lookup_min``: find the latest
        start ``i < len - n`` with ``tokens[i:i+n] == tokens[-n:]``; the drafts
        are ``tokens[i+n : i+n+k]`` (at least one: ``i + n < len``).
        """
        return self.lookup(token_ids, k)[0]

    def lookup(self, token_ids, k: int | None = None) -> tuple[list[int], int]:
        """:meth:`propose`'s drafts and where they were copied from: the index in
        ``token_ids`` of the first one's original (-1 with no drafts)."""
        k = self.k if k is None else k
        tokens = np.asarray(token_ids, dtype=np.int64)             # [L]
        L = tokens.shape[0]
        if k < 1:
            return [], -1
        for n in range(min(self.n_max, L - 1), self.n_min - 1, -1):
            # Every window of n tokens that starts before the suffix itself: [L - n, n].
            windows = np.lib.stride_tricks.sliding_window_view(tokens[:L - 1], n)
            hits = np.flatnonzero((windows == tokens[L - n:]).all(axis=1))  # starts, ascending
            if hits.size:
                i = int(hits[-1])                                    # the latest occurrence
                return tokens[i + n:i + n + k].tolist(), i + n
        return [], -1

    def rejoin(self, token_ids, left_at: int, source_at: int,
               k: int | None = None) -> tuple[list[int], int]:
        """Drafts for a request whose drafts were just rejected, where it rejoins the text.

        The model wrote its own token at ``left_at`` where the text it was copying
        had ``token_ids[source_at]`` (a corrected typo, a renamed variable). Until
        ``prompt_lookup_min`` tokens of its own are behind it no n-gram recurs, so
        :meth:`lookup` finds nothing. Here, for the ``j = len - left_at`` tokens it has
        written since (at most :data:`REJOIN_TOKENS`): if its last token stands in the
        text near where it left (from ``source_at - 1`` to ``source_at + j + 2``, the
        nearest to ``source_at + j - 1``, where ``j`` tokens replacing ``j`` would put
        it), the drafts are what follows it there. ``([], -1)`` otherwise. Like
        :meth:`lookup`, returns the drafts and the index of the first one's original.
        """
        k = self.k if k is None else k
        tokens = np.asarray(token_ids, dtype=np.int64)             # [L]
        L = tokens.shape[0]
        j = L - left_at
        if k < 1 or not 1 <= j <= REJOIN_TOKENS or not 0 <= source_at < left_at:
            return [], -1
        near = np.arange(max(0, source_at - 1), min(L - 1, source_at + j + 3))
        near = near[tokens[near] == tokens[L - 1]]
        if not near.size:
            return [], -1
        q = int(near[np.argmin(np.abs(near - (source_at + j - 1)))])  # the first if a tie
        return tokens[q + 1:q + 1 + k].tolist(), q + 1


def propose_reference(token_ids: list, k: int, n_max: int, n_min: int) -> list[int]:
    """The same rule as :meth:`NgramProposer.propose`, as plain loops (for tests)."""
    L = len(token_ids)
    for n in range(n_max, n_min - 1, -1):
        if n >= L:
            continue
        suffix = token_ids[L - n:]
        for i in range(L - n - 1, -1, -1):                           # latest first
            if token_ids[i:i + n] == suffix:
                return list(token_ids[i + n:i + n + k])
    return []


def rejoin_reference(token_ids: list, left_at: int, source_at: int, k: int) -> list[int]:
    """The rule of :meth:`NgramProposer.rejoin`, as plain loops (for tests)."""
    L, j = len(token_ids), len(token_ids) - left_at
    if k < 1 or not 1 <= j <= REJOIN_TOKENS or not 0 <= source_at < left_at:
        return []
    best = None
    for q in range(max(0, source_at - 1), min(L - 1, source_at + j + 3)):
        if token_ids[q] == token_ids[-1] and (
                best is None or abs(q - (source_at + j - 1)) < abs(best - (source_at + j - 1))):
            best = q
    return [] if best is None else list(token_ids[best + 1:best + 1 + k])


#: How many tokens of its own a request may have written since its drafts were rejected
#: for :meth:`NgramProposer.rejoin` to look for where it rejoins the text it was copying.
REJOIN_TOKENS = 3
#: A drafting step costs a forward over 1 + k rows and yields 1 + (accepted
#: drafts) tokens. In principle the weights are read once either way and the
#: wider step costs about one decode; measured on SmolLM2 at batch 1
#: (benchmarks/spec_decode.md, an AVX-512 machine) a 1 + 8 row step costs 3.7x a
#: one-row one on the file's blocks with float32 inputs (each row does its own
#: multiply-adds, and on 2 cores that is as slow as the weights' read) and 2.0x
#: with int8 inputs (``quantization="gguf_a8"``); on an AVX2-only machine, whose
#: one-row step waits longer on memory, 2.4-2.8x and 1.9-2.3x
#: (benchmarks/spec_decode_avx2.md, three runs). So a request keeps drafting only while its
#: drafting steps emit at least this many tokens on average (between the two
#: break-evens): a rule on tokens per step, not on the acceptance rate, since one
#: draft proposed and accepted is a rate of 1.0 and still a loss.
BREAK_EVEN_TOKENS = 2.5
#: Drafting steps the acceptance rate is measured over: enough drafts (4k) that
#: one lucky or unlucky step does not decide, few enough to react within a sentence.
WINDOW = 4
#: Steps a request decodes without drafts after a low-acceptance window. Each
#: further low window doubles the pause (up to MAX_BACKOFF_STEPS), so a request
#: that never copies wastes ever fewer steps on drafts (4 of 12, then 4 of 20,
#: ... under 4% once the cap is reached), while one that drifts back into
#: copying (a quoted passage) is retried within a few dozen tokens.
BACKOFF_STEPS = 8
MAX_BACKOFF_STEPS = 128


class DraftBackoff:
    """One request's recent acceptance, and whether it drafts this step.

    The scheduler asks :meth:`should_draft` once per decode step it schedules
    and tells :meth:`record` what each drafting step drafted and kept.
    """

    def __init__(self):
        self.recent: deque = deque(maxlen=WINDOW)    # (drafted, accepted) per drafting step
        self.pause = 0                               # decode steps left without drafts
        self.next_pause = BACKOFF_STEPS
        self.num_pauses = 0

    def should_draft(self) -> bool:
        """False while paused (and counts the paused step down)."""
        if self.pause > 0:
            self.pause -= 1
            return False
        return True

    def record(self, num_drafted: int, num_accepted: int) -> None:
        """One drafting step's outcome; a full window below break-even starts a pause."""
        self.recent.append((num_drafted, num_accepted))
        if len(self.recent) < WINDOW:
            return
        emitted = sum(1 + a for _, a in self.recent)     # tokens the window's steps gave
        if emitted < BREAK_EVEN_TOKENS * len(self.recent):
            self.pause = self.next_pause
            self.next_pause = min(2 * self.next_pause, MAX_BACKOFF_STEPS)
            self.num_pauses += 1
            self.recent.clear()                      # judge afresh after the pause
        else:
            self.next_pause = BACKOFF_STEPS          # copying again: forgive the past

    @property
    def acceptance_rate(self) -> float:
        """Accepted over drafted in the current window (0.0 when nothing is drafted)."""
        drafted = sum(d for d, _ in self.recent)
        return sum(a for _, a in self.recent) / drafted if drafted else 0.0
