"""Speculative decoding, the plug-in: draft in the scheduler's step, verify in the engine's.

Loaded only when ``EngineConfig.speculative_config`` is set: the core step
never imports it. A decoding request first gets drafts from the proposer that
``speculative_config.method`` names (:data:`paged_np.registry.SPEC_METHODS`;
n-gram prompt lookup, :mod:`.spec_decode`) and is scheduled as
``1 + len(drafts)`` tokens; the engine scores them all in one forward pass and
keeps the prefix the target model agrees with (:func:`verify`, the rule in
:mod:`.rejection`), rolling the cache back past the rest
(``cache.discard_pending``).
"""

from __future__ import annotations

import numpy as np

from ..registry import SPEC_METHODS
from .rejection import rejection_sample
from .spec_decode import DraftBackoff


class Speculator:
    """The scheduler's drafting and the engine's verification for one engine."""

    def __init__(self, spec):
        self.proposer = SPEC_METHODS.load(spec.method)(spec)

    def draft(self, req, budget: int, max_new_tokens: int, cache) -> int:
        """Propose drafts for decoding ``req``; returns ``1 + len(drafts)``, or 0 for none.

        Drafts never cost anyone else anything: they are cut to the token
        budget and to ``max_tokens`` (a step emits at most ``1 + len(drafts)``
        tokens, so at most ``max_tokens - generated - 1`` drafts), and dropped
        unless their pages are there now (they never cause a preemption).
        A request still to fork (``n > 1``) does not draft: its prompt's last
        token comes first. One whose drafts keep failing pauses (:class:`DraftBackoff`).
        Where no n-gram recurs just after a rejected draft, the drafts may come from
        where the request rejoins the text it was copying (``NgramProposer.rejoin``).
        """
        req.spec_token_ids = []
        if req.spec_backoff is None:
            req.spec_backoff = DraftBackoff()
        params = req.parent.params
        room = min(self.proposer.k, budget - 1,
                   params.max_tokens - len(req.sample.token_ids) - 1)
        if room < 1 or req.pending_fork or not req.spec_backoff.should_draft():
            return 0
        tokens = req.token_ids
        drafts, source = self.proposer.lookup(tokens, room)
        rejoined = False
        if not drafts and req.spec_rejoin is not None:
            drafts, source = self.proposer.rejoin(tokens, *req.spec_rejoin, room)
            rejoined = bool(drafts)
        n = 1 + len(drafts)
        if not drafts or n > max_new_tokens or not cache.can_allocate(req.seq_id, n):
            return 0
        req.spec_token_ids = drafts
        req.spec_source = (len(tokens), source, rejoined)
        return n

    @staticmethod
    def record(req, num_drafted: int, num_accepted: int) -> None:
        """The verdict on ``req``'s drafts this step (for its backoff, and for a rejoin
        after an n-gram draft was rejected: once only, a rejoin's own rejection is not
        followed up)."""
        req.spec_backoff.record(num_drafted, num_accepted)
        req.spec_token_ids = []
        first, source, rejoined = req.spec_source
        req.spec_rejoin = None
        if num_accepted < num_drafted and not rejoined and source >= 0:
            req.spec_rejoin = (first + num_accepted, source + num_accepted)

    def verify(self, engine, req, rows: np.ndarray) -> list:
        """Keep the drafts the target model agrees with, roll the cache back to them.

        ``rows`` float32 [1 + k, V]. Only verified tokens reach the cache: the
        input token and the accepted drafts are appended (so only they are
        ever hashed or inserted into the prefix index), then the slots of the
        rejected drafts are dropped and pages wholly past them freed. Returns
        the tokens to emit (the accepted drafts and one more).
        """
        drafts = req.spec_token_ids
        out = rejection_sample(rows, drafts, None, req.parent.params, req.rng)
        accepted = len(out) - 1
        c = req.num_computed_tokens
        engine.cache.append_tokens(req.seq_id, req.tokens(c, c + 1) + drafts[:accepted])
        engine.cache.discard_pending(req.seq_id)
        engine.scheduler.release_outside_window(req)
        self.record(req, len(drafts), accepted)
        engine.count_drafts(len(drafts), accepted)
        return out
