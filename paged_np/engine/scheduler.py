"""The scheduler: which sequences run this step, with how many tokens each.

It follows vLLM v1's scheduler. There are no separate "prefill" and "decode"
phases: every sequence simply has ``num_computed_tokens`` tokens whose KV is in the
cache out of ``num_tokens`` it knows (prompt + generated), and a step gives it
``min(num_tokens - num_computed_tokens, budget)`` more. A decode is the case where
that is 1; a long prompt is cut into chunks (chunked prefill). One step mixes
both, under two budgets: ``max_num_seqs`` running sequences and
``max_num_batched_tokens`` tokens.

Each step:

1. **Running sequences**, oldest first, get their tokens' slots. The
   scheduler *asks first* (``cache.can_allocate``, as vLLM and nano-vllm
   do): while the pages are not there, the *most recently admitted* running
   sequence is preempted (vLLM's rule: it has the least work to lose),
   possibly the one asking. A sequence running alone shrinks its chunk to
   what fits instead. ``allocate_slots`` is called only once the answer is
   yes, so running out of pages is a question here, never an exception.
2. **Waiting sequences** are admitted while seats, tokens and pages allow,
   but not in a step that had to preempt (that would just thrash). The order
   is the ``schedule``'s (:mod:`.admission`): ``"fcfs"``, arrival
   order (preempted sequences go back to the front), or ``"lpm"``, the
   longest cached prefix first, with a bound on how long any one waits.
   Admission starts with ``cache.add_sequence``, whose prefix hit says how
   many prompt tokens need no computing at all; if the pages for the first
   chunk are then not there, the sequence is freed again and waits. Each
   admission is reported in :attr:`SchedulerOutput.admitted` with its hit;
   the engine turns that into the request's output and the hit rates.

Preemption comes in two flavours (``preemption_mode``):

- ``"recompute"``: free the victim's pages and put it back at the *front* of
  the waiting queue with ``num_computed_tokens = 0``. When it returns, its prompt and
  the tokens it had generated are prefilled again; pages still cached are hit
  and cost nothing.
- ``"swap"``: copy the victim's pages into a host-side :class:`SwapArena`,
  then free them. Before it runs again its KV is copied back (pages still in
  the cache by prefix hash are not even copied). If the swap arena is full,
  or the model uses a sliding window, the victim is recomputed instead.

**Speculative decoding** (``speculative_config``): a running request about
to decode one token first gets n-gram drafts (:mod:`.speculation`) and is
scheduled as ``1 + len(drafts)`` tokens, with slots for all of them, in the
same budget; the drafts are cut or dropped where the budget, ``max_tokens`` or
the pages leave no room, and drafting pauses for a request whose drafts keep
failing. The engine verifies them (:mod:`.rejection`) and rolls the cache back
to what it kept (``cache.discard_pending``).

Simplifications compared with vLLM: no priorities, no encoder or LoRA
budgets; a sequence is one sample (``n > 1`` requests
fork after their prompt, see :mod:`paged_np.engine.engine`). The records it
runs are :class:`~paged_np.engine.request.Request` objects; host swap space
is :class:`~paged_np.engine.swap.SwapArena`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ..registry import PREEMPTION_MODES, SCHEDULES
from .admission import MAX_SKIPS
from .request import FINISHED, RUNNING, SWAPPED, WAITING, Request

__all__ = ["FINISHED", "RUNNING", "SWAPPED", "WAITING", "Request", "Scheduler",
           "SchedulerOutput"]


@dataclass
class SchedulerOutput:
    """What one step runs, and what the scheduler did to get there.

    - ``scheduled``: ``(req, num_new_tokens, slots)`` triples, the batch;
    - ``failed``: ``(req, reason)`` for sequences that can never run (removed);
    - ``admitted``: ``(req, num_known, num_hit)`` for each admission: of the
      ``num_known`` tokens it brought, the prefix cache served ``num_hit``.
    """

    scheduled: list = field(default_factory=list)
    failed: list = field(default_factory=list)
    admitted: list = field(default_factory=list)


class Scheduler:
    """Waiting queue, running list, preemption. See the module docstring.

    ``config`` is the engine's :class:`~paged_np.engine.config.EngineConfig` (budgets,
    preemption mode, swap space, schedule); ``sliding_window`` the model's.
    """

    def __init__(self, cache, config, sliding_window: int | None = None):
        self.cache = cache
        self.config = config
        self.admission_order = SCHEDULES.load(config.schedule)   # queue positions, in order
        self.max_skips = MAX_SKIPS      # lpm: admissions a request may be passed over by
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.preemption_mode = config.preemption_mode
        self.window = sliding_window
        self.sinks = config.attention_sinks if sliding_window is not None else 0
        # Host swap space (a SwapArena) when the preemption mode names one, else None.
        swap_pages = cache.cfg.num_pages if config.swap_pages is None else config.swap_pages
        mode = PREEMPTION_MODES[config.preemption_mode]
        self.swap = mode.load()(cache, swap_pages) if mode.target else None
        self._arena_tokens = cache.cfg.num_slots
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []     # in admission order: the last is the next victim
        self.num_preemptions = 0
        self.num_swapped_out = 0
        self.num_swapped_in = 0
        self.num_admissions = 0
        #: Speculative decoding's drafting (:mod:`.speculation`), loaded only when configured.
        self.speculator = None
        if config.speculative_config is not None:
            from .speculation import Speculator

            self.speculator = Speculator(config.speculative_config)

    # ------------------------------------------------------------------ step
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        preemptions_before = self.num_preemptions

        # 1. Running sequences, oldest first.
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            left = req.num_tokens - req.num_computed_tokens   # known, KV not yet written
            if left == 0:                                     # a failed step: see _recompute_last
                self._recompute_last(self.running.pop(i))
                continue
            n = (self.speculator.draft(req, budget, self._max_new_tokens(req), self.cache)
                 if left == 1 and self.speculator else 0)
            n = n or self._make_room(req, min(left, budget))
            if n > 0:
                out.scheduled.append((req, n, self.cache.allocate_slots(req.seq_id, n)))
                budget -= n
                i += 1
            elif req.status == RUNNING:                  # alone, and not one token fits
                out.failed.append((req, self._too_big(req)))
                self.remove(req)                         # its pages are free right now
            else:                                        # req preempted itself
                break

        # 2. Waiting sequences, in the schedule's order, if this step preempted nobody.
        seats = sum(s.seats for s in self.running)
        preempted = self.num_preemptions > preemptions_before
        queue = list(self.waiting) if self.waiting and budget > 0 and not preempted else []
        for pos in self._admission_order(queue):
            req = queue[pos]
            if budget <= 0 or seats + req.seats > self.max_num_seqs:
                break
            admitted = self._admit(req, budget)
            if admitted is None:
                if not self.running:                     # nothing will ever free pages
                    out.failed.append((req, self._too_big(req)))
                    self.remove(req)
                    continue
                break
            n, slots, n_known, n_hit = admitted
            self.waiting.remove(req)
            self.num_admissions += 1
            self.running.append(req)
            seats += req.seats
            out.scheduled.append((req, n, slots))
            out.admitted.append((req, n_known, n_hit))
            budget -= n
        return out

    def _make_room(self, req: Request, n: int) -> int:
        """Tokens of running ``req`` (at most ``n``) whose pages are there now; 0 if none.

        Asks the cache, and while the answer is no preempts the newest running
        sequence (maybe ``req`` itself: then 0, and ``req`` is no longer
        running) or, when ``req`` runs alone, shrinks its chunk.
        """
        while True:
            if req.num_computed_tokens + n > self._arena_tokens:   # rare: cap to the arena
                n = min(n, self._max_new_tokens(req))
            if n < 1:
                return 0
            if self.cache.can_allocate(req.seq_id, n):
                return n
            if len(self.running) == 1:                   # alone: shrink the chunk to fit
                n = min(n - 1, self._tokens_that_fit(req))
                continue
            victim = self.running.pop()                  # the newest, maybe req itself
            self._preempt(victim)
            if victim is req:
                return 0

    # ------------------------------------------------------------- admission
    def add(self, req: Request) -> None:
        """A new request joins the back of the waiting queue."""
        req.queued_at = self.num_admissions
        self.waiting.append(req)

    def fork(self, req: Request, child: Request) -> None:
        """``child`` shares ``req``'s pages (copy-on-write later) and runs beside it."""
        self.cache.fork(req.seq_id, child.seq_id)
        child.seq = self.cache.sequence(child.seq_id)
        child.status = RUNNING
        self.running.append(child)

    def _requeue(self, req: Request) -> None:
        """A preempted request goes back to the front of the queue."""
        req.queued_at = self.num_admissions
        self.waiting.appendleft(req)

    def _admission_order(self, queue: list) -> list:
        """Positions of ``queue`` in the order to try them (see :mod:`.admission`)."""
        return self.admission_order(
            len(queue), prefix_len=lambda i: self._cached_prefix(queue[i]),
            skipped=lambda i: self.num_admissions - queue[i].queued_at,
            max_skips=self.max_skips)

    def _cached_prefix(self, req: Request) -> int:
        """Tokens of what ``req`` would ask ``add_sequence`` for that are cached now."""
        # The index may keep what it derives from the tokens (a hash chain) in the
        # request's memo, as vLLM keeps block hashes on its Request: the tokens only grow.
        return self.cache.num_cached_prefix_tokens(self._lookup_tokens(req),
                                                   req.parent.cache_salt, req.prefix_memo)

    @staticmethod
    def _num_known(req: Request) -> int:
        """Tokens admission hands the cache: those swapped out, or all it knows."""
        return req.num_swapped_tokens if req.status == SWAPPED else req.num_tokens

    def _lookup_tokens(self, req: Request) -> list:
        """The tokens admission looks up in the prefix cache.

        The cache never serves the last token it is given (it must be computed, to
        give logits). A new or recomputed request gives all it knows. A swapped
        request gives one token past what it swapped out, so that every token
        whose K/V it had may be served: the one left to compute is the next one
        anyway. Had its last swapped page been recomputed instead, the radix tree
        (which still holds that run) would pin its cached copy under the request,
        a page no ``can_allocate`` before the swap-in could have counted. A
        request still scoring its prompt (``prompt_logprobs``) gives only the
        prefix it has scored.
        """
        n = self._num_known(req)
        n = min(n + 1, req.num_tokens) if req.status == SWAPPED else n
        # prompt_logprobs: the cache may serve only positions already scored (a new
        # request: none, as vLLM skips the prefix cache for it; a recomputed one:
        # what it scored before), so that every prompt token is scored once.
        return req.tokens(0, min(n, req.servable_prefix()))

    def _admit(self, req: Request, budget: int):
        """Put ``req`` in the cache and size its first chunk.

        Returns ``(n, slots, num_known, num_hit)``, or None, with ``req`` out
        of the cache again, when the pages are not there.
        """
        cache = self.cache
        swapped = req.status == SWAPPED
        n_known = self._num_known(req)
        n_hit = cache.add_sequence(req.seq_id, self._lookup_tokens(req),  # prefix: no compute
                                   req.parent.cache_salt)
        req.seq = cache.sequence(req.seq_id)
        if not swapped:
            self.release_outside_window(req)
        n = min(req.num_tokens - req.num_computed_tokens, budget, self._max_new_tokens(req))
        # A swapped request first gets back the tokens the prefix cache did not serve.
        n_copy = n_known - n_hit if swapped else 0
        if n < 1 or not cache.can_allocate(req.seq_id, n_copy + n):
            self._free(req)
            return None
        try:
            if n_copy:
                self.swap.swap_in(cache, req, n_hit)
            slots = cache.allocate_slots(req.seq_id, n)
        except BaseException:                            # a fault mid-swap-in
            self._free(req)                              # nothing is left half-admitted;
            raise                                        # the swap copy stays
        req.status = RUNNING
        if swapped:
            self.swap.release(req)
            self.num_swapped_in += 1
        return n, slots, n_known, n_hit

    # ------------------------------------------------------------ preemption
    def _preempt(self, req: Request) -> None:
        """Take ``req`` out of the cache and put it at the front of the queue."""
        req.spec_token_ids = []                          # its drafts go with its slots
        self.num_preemptions += 1
        req.num_preemptions += 1
        n_computed = req.num_computed_tokens
        host = None
        if self.swap is not None and self.window is None and n_computed > 0:
            host = self.swap.swap_out(self.cache, req)
        self._free(req)
        if host is not None:
            req.swap_pages, req.num_swapped_tokens = host, n_computed
            req.status = SWAPPED
            self.num_swapped_out += 1
        else:                                            # recompute from scratch
            req.status = WAITING
        self._requeue(req)

    def _recompute_last(self, req: Request) -> None:
        """Requeue a running sequence whose KV is all written but whose next token was
        never sampled: a step raised after ``append_tokens`` (while sampling, say).

        Its last token's logits are gone, so it is recomputed like a preempted
        sequence; its full pages are still cached, so only the last page's
        tokens are computed again.
        """
        self._free(req)
        req.num_preemptions += 1                         # keeps its first prefix-hit count
        req.status = WAITING
        self._requeue(req)

    def remove(self, req: Request) -> None:
        """Drop a sequence from wherever it is (finished or aborted)."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        if req.seq is not None:
            self._free(req)
        if req.swap_pages is not None:
            self.swap.release(req)
        req.spec_token_ids = []
        req.status = FINISHED

    def _free(self, req: Request) -> None:
        """Take ``req`` out of the cache (its pages go back to the pool)."""
        self.cache.free(req.seq_id)
        req.seq = None

    # --------------------------------------------------------- sliding window
    def release_outside_window(self, req: Request) -> None:
        """Return pages no future query can see: keys before ``num_computed_tokens - W + 1``,
        bar the attention sinks' pages (``config.attention_sinks``), which every query reads."""
        if self.window is not None and req.num_computed_tokens > self.window:
            self.cache.release_pages_before(req.seq_id, req.num_computed_tokens - self.window + 1,
                                            self.sinks)

    # ----------------------------------------------------------------- sizes
    def never_fits(self, prompt_len: int) -> str | None:
        """Why a prompt of ``prompt_len`` tokens can never be served here, or None."""
        cfg, window = self.cache.cfg, self.window
        if window is None:
            need = -(-prompt_len // cfg.page_size)
            what = f"a prompt of {prompt_len} tokens needs {need} pages"
        else:  # chunked prefill keeps only the sinks' pages, the window and one of slack
            need = -(-self.sinks // cfg.page_size) + -(-window // cfg.page_size) + 1
            what = f"a sliding window of {window} tokens needs {need} pages"
        if need > cfg.num_pages:
            return (f"{what} but the cache has num_pages={cfg.num_pages} "
                    f"(page_size={cfg.page_size}): it can never fit")
        return None

    def _max_new_tokens(self, req: Request) -> int:
        """Tokens ``req`` could add if it had every page of the arena to itself."""
        released = self.cache.num_released_pages(req.seq_id)  # window: given back already
        total = (released + self.cache.cfg.num_pages) * self.cache.page_size
        return total - req.num_computed_tokens

    def _tokens_that_fit(self, req: Request) -> int:
        """Tokens ``req`` can add with its pages plus every free or cached one."""
        held = len(self.cache.block_table(req.seq_id))
        total = (held + self.cache.num_available_pages) * self.cache.page_size
        return total - req.num_computed_tokens

    def _too_big(self, req: Request) -> str:
        cfg = self.cache.cfg
        return (f"sequence of {req.num_tokens} tokens cannot fit in the cache "
                f"(num_pages={cfg.num_pages} x page_size={cfg.page_size} = "
                f"{cfg.num_slots} slots) even with every other request preempted")
