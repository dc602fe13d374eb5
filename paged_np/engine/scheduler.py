"""The scheduler: which sequences run this step, with how many tokens each.

It follows vLLM v1's scheduler. There are no separate "prefill" and "decode"
phases: every sequence simply has ``num_computed_tokens`` tokens whose KV is in the
cache out of ``num_tokens`` it knows (prompt + generated), and a step gives it
``min(num_tokens - num_computed_tokens, budget)`` more. A decode is the case where
that is 1; a long prompt is cut into chunks (chunked prefill). One step mixes
both, under two budgets: ``max_num_seqs`` running sequences and
``max_num_batched_tokens`` tokens.

Each step:

1. **Running sequences**, oldest first, get their tokens' slots. When the
   pool runs out of pages, the *most recently admitted* running sequence is
   preempted (vLLM's rule: it has the least work to lose), possibly the one
   asking; then the allocation is retried.
2. **Waiting sequences** are admitted while seats, tokens and pages allow,
   but not in a step that had to preempt (that would just thrash). The order
   is the ``schedule``'s (:mod:`.schedule_policy`): ``"fcfs"``, arrival
   order (preempted sequences go back to the front), or ``"lpm"``, the
   longest cached prefix first, with a bound on how long any one waits.
   Admission starts with ``cache.add_sequence``, whose prefix hit says how
   many prompt tokens need no computing at all.

Preemption comes in two flavours (``preemption_mode``):

- ``"recompute"``: free the victim's pages and put it back at the *front* of
  the waiting queue with ``num_computed_tokens = 0``. When it returns, its prompt and
  the tokens it had generated are prefilled again; pages still cached are hit
  and cost nothing.
- ``"swap"``: copy the victim's pages into a host-side :class:`SwapArena`,
  then free them. Before it runs again its KV is copied back (pages still in
  the cache by prefix hash are not even copied). If the swap arena is full,
  or the model uses a sliding window, the victim is recomputed instead.

Simplifications compared with vLLM: no priorities, no encoder or LoRA
budgets, no speculative tokens; a sequence is one sample (``n > 1`` requests
fork after their prompt, see :mod:`paged_np.engine.engine`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ..errors import OutOfPages
from .schedule_policy import MAX_SKIPS, admission_order

WAITING, RUNNING, SWAPPED, FINISHED = "waiting", "running", "swapped", "finished"


@dataclass(eq=False)
class Request:
    """What the scheduler runs: one stream of tokens, one sample of a user's request.

    vLLM v1 calls it a ``Request`` too (an ``n > 1`` request fans out into
    ``n`` of them under one parent). Two counts drive everything:
    ``num_tokens`` (prompt + generated, what it knows) and
    ``num_computed_tokens`` (those whose K/V is in the cache). The cache's own
    record of the same tokens is :class:`paged_np.cache.sequence.Sequence`,
    keyed by ``seq_id``.
    """

    seq_id: int                   # the cache's id
    parent: object                # the engine's record of the whole request (n samples)
    sample: object                # its SampleOutput (generated ids, finish reason)
    token_ids: list               # prompt + generated so far
    rng: object                   # np.random.Generator of this sample
    num_computed_tokens: int = 0  # tokens whose KV is in the cache
    status: str = WAITING
    pending_fork: int = 0         # siblings still to fork off after the prompt (n - 1)
    num_preemptions: int = 0
    swap_pages: list | None = field(default=None, repr=False)  # host pages while SWAPPED
    queued_at: int = 0            # the scheduler's admission count when it last joined the queue
    prompt_hashes: tuple | None = field(default=None, repr=False)  # (tokens, hash chain): lpm

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens: what the request knows."""
        return len(self.token_ids)

    @property
    def seats(self) -> int:
        """Running seats it takes: itself plus the siblings it will fork."""
        return 1 + self.pending_fork


@dataclass
class SchedulerOutput:
    """What one step runs: ``(req, num_new_tokens, slots)`` triples, plus refusals."""

    scheduled: list = field(default_factory=list)
    failed: list = field(default_factory=list)   # (req, reason): can never run


class SwapArena:
    """Host memory for preempted sequences' pages (vLLM's CPU swap space).

    Same layout as the cache's arena, ``[num_layers, 2, swap_pages, Hkv,
    page_size, D]``, with its own free list.
    """

    def __init__(self, cache, num_pages: int):
        shape = list(cache.arena.shape)
        shape[2] = num_pages
        self.data = np.zeros(shape, dtype=cache.arena.dtype)
        self.page_size = cache.page_size
        self._free = list(range(num_pages - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def swap_out(self, cache, req: Request) -> list | None:
        """Copy the pages of ``req``'s computed tokens to the host; None if no room."""
        n_pages = -(-req.num_computed_tokens // self.page_size)
        pages = cache.block_table(req.seq_id)[:n_pages]             # [n_pages] page ids
        if n_pages > len(self._free) or (pages < 0).any():
            return None
        host = [self._free.pop() for _ in range(n_pages)]
        self.data[:, :, host] = cache.arena[:, :, pages]            # every layer, K and V
        return host

    def swap_in(self, cache, req: Request, start: int) -> None:
        """Write positions ``[start, num_computed_tokens)`` back (slots from allocate_slots).

        Raises OutOfPages (changing nothing) when the pages are not there.
        """
        n = req.num_computed_tokens - start
        slots = cache.allocate_slots(req.seq_id, n)                 # [n] int64
        pos = np.arange(start, req.num_computed_tokens)                    # [n] positions
        host = np.asarray(req.swap_pages)[pos // self.page_size]    # [n] host pages
        off = pos % self.page_size                                  # [n]
        for layer in range(self.data.shape[0]):
            k = self.data[layer, 0][host, :, off]                   # [n, Hkv, D]
            v = self.data[layer, 1][host, :, off]                   # [n, Hkv, D]
            cache.write_kv(layer, slots, k, v)
        cache.append_tokens(req.seq_id, req.token_ids[start:req.num_computed_tokens])

    def release(self, req: Request) -> None:
        self._free.extend(req.swap_pages or ())
        req.swap_pages = None


class Scheduler:
    """Waiting queue, running list, preemption. See the module docstring."""

    def __init__(self, cache, max_num_seqs: int, max_num_batched_tokens: int,
                 preemption_mode: str, swap_pages: int, sliding_window: int | None,
                 schedule: str = "fcfs"):
        self.cache = cache
        self.schedule_policy = schedule
        self.max_skips = MAX_SKIPS      # lpm: admissions a request may be passed over by
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.preemption_mode = preemption_mode
        self.window = sliding_window
        self.swap = SwapArena(cache, swap_pages) if preemption_mode == "swap" else None
        self._arena_tokens = cache.cfg.num_slots
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []     # in admission order: the last is the next victim
        self.num_preemptions = 0
        self.num_swapped_out = 0
        self.num_swapped_in = 0
        self.num_admissions = 0

    # ------------------------------------------------------------------ step
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        preempted = False

        # 1. Running sequences, oldest first.
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            if req.num_computed_tokens == req.num_tokens:       # a failed step: see _recompute_last
                self._recompute_last(self.running.pop(i))
                continue
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            slots = None
            while slots is None:
                if req.num_computed_tokens + n > self._arena_tokens:   # rare: cap to the arena
                    n = min(n, self._max_new_tokens(req))
                if n < 1:
                    break
                try:
                    slots = self.cache.allocate_slots(req.seq_id, n)
                except OutOfPages:
                    if len(self.running) == 1:           # alone: shrink the chunk to fit
                        n = min(n - 1, self._tokens_that_fit(req))
                        continue
                    victim = self.running.pop()          # the newest, maybe req itself
                    self._preempt(victim)
                    preempted = True
                    if victim is req:
                        break
            if slots is not None:
                out.scheduled.append((req, n, slots))
                budget -= n
                i += 1
            elif i < len(self.running) and self.running[i] is req:  # alone, nothing fits
                out.failed.append((req, self._too_big(req)))
                self.remove(req)                         # its pages are free right now
            else:                                        # req preempted itself
                break

        # 2. Waiting sequences, in the schedule's order, if this step preempted nobody.
        seats = sum(s.seats for s in self.running)
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
            n, slots = admitted
            self.waiting.remove(req)
            self.num_admissions += 1
            req.status = RUNNING
            self.running.append(req)
            seats += req.seats
            out.scheduled.append((req, n, slots))
            budget -= n
        return out

    # ------------------------------------------------------------- admission
    def add(self, req: Request) -> None:
        """A new request joins the back of the waiting queue."""
        req.queued_at = self.num_admissions
        self.waiting.append(req)

    def _requeue(self, req: Request) -> None:
        """A preempted request goes back to the front of the queue."""
        req.queued_at = self.num_admissions
        self.waiting.appendleft(req)

    def _admission_order(self, queue: list) -> list:
        """Positions of ``queue`` in the order to try them (see :mod:`.schedule_policy`)."""
        return admission_order(
            len(queue), self.schedule_policy,
            prefix_len=lambda i: self._cached_prefix(queue[i]),
            skipped=lambda i: self.num_admissions - queue[i].queued_at,
            max_skips=self.max_skips)

    def _cached_prefix(self, req: Request) -> int:
        """Tokens of what ``req`` would ask ``add_sequence`` for that are cached now."""
        known = req.token_ids[:req.num_computed_tokens] if req.status == SWAPPED else req.token_ids
        if self.cache.tree is not None:
            return self.cache.num_cached_prefix_tokens(known)
        if req.prompt_hashes is None or req.prompt_hashes[0] != len(known):
            # The hash chain of a prompt is fixed: make it once, as vLLM keeps it on its Request.
            req.prompt_hashes = (len(known), self.cache.prompt_page_hashes(known))
        return self.cache.num_cached_prefix_tokens(known, page_hashes=req.prompt_hashes[1])

    def _admit(self, req: Request, budget: int):
        """Put ``req`` in the cache and give it its first chunk; None (undone) if short."""
        cache = self.cache
        swapped = req.status == SWAPPED
        known = req.token_ids[:req.num_computed_tokens] if swapped else req.token_ids
        n_hit = cache.add_sequence(req.seq_id, known)   # prefix pages: no compute
        if req.num_preemptions == 0 and req.sample.index == 0:
            req.parent.output.num_cached_prompt_tokens = n_hit
        try:
            if swapped:
                if n_hit < req.num_computed_tokens:
                    self.swap.swap_in(cache, req, n_hit)
            else:
                req.num_computed_tokens = n_hit
                self.release_outside_window(req)
            n = min(req.num_tokens - req.num_computed_tokens, budget, self._max_new_tokens(req))
            if n < 1:
                raise OutOfPages("no room for a single token")
            slots = cache.allocate_slots(req.seq_id, n)
        except BaseException as e:                       # OutOfPages, or a fault mid-swap-in
            cache.free(req.seq_id)                       # undo; the swap copy stays
            if not swapped:
                req.num_computed_tokens = 0
            if not isinstance(e, OutOfPages):
                raise                                    # nothing is left half-admitted
            return None
        if swapped:
            self.swap.release(req)
            self.num_swapped_in += 1
        return n, slots

    # ------------------------------------------------------------ preemption
    def _preempt(self, req: Request) -> None:
        """Take ``req`` out of the cache and put it at the front of the queue."""
        self.num_preemptions += 1
        req.num_preemptions += 1
        host = None
        if self.swap is not None and self.window is None and req.num_computed_tokens > 0:
            host = self.swap.swap_out(self.cache, req)
        self.cache.free(req.seq_id)
        if host is not None:
            req.swap_pages = host
            req.status = SWAPPED
            self.num_swapped_out += 1
        else:                                            # recompute from scratch
            req.num_computed_tokens = 0
            req.status = WAITING
        self._requeue(req)

    def _recompute_last(self, req: Request) -> None:
        """Requeue a running sequence whose KV is all written but whose next token was
        never sampled: a step raised after ``append_tokens`` (while sampling, say).

        Its last token's logits are gone, so it is recomputed like a preempted
        sequence; its full pages are still cached, so only the last page's
        tokens are computed again.
        """
        self.cache.free(req.seq_id)
        req.num_computed_tokens = 0
        req.num_preemptions += 1                         # keeps its first prefix-hit count
        req.status = WAITING
        self._requeue(req)

    def remove(self, req: Request) -> None:
        """Drop a sequence from wherever it is (finished or aborted)."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        if req.seq_id in self.cache:
            self.cache.free(req.seq_id)
        if req.swap_pages is not None:
            self.swap.release(req)
        req.status = FINISHED

    # --------------------------------------------------------- sliding window
    def release_outside_window(self, req: Request) -> None:
        """Return pages no future query can see: keys before ``num_computed_tokens - W + 1``."""
        if self.window is not None and req.num_computed_tokens > self.window:
            self.cache.release_pages_before(req.seq_id, req.num_computed_tokens - self.window + 1)

    # ----------------------------------------------------------------- sizes
    def _max_new_tokens(self, req: Request) -> int:
        """Tokens ``req`` could add if it had every page of the arena to itself."""
        released = self.cache.num_released_pages(req.seq_id)  # window: given back already
        total = (released + self.cache.cfg.num_pages) * self.cache.page_size
        return total - req.num_computed_tokens

    def _tokens_that_fit(self, req: Request) -> int:
        """Tokens ``req`` can add with its pages plus every free or cached one."""
        held = len(self.cache.sequence(req.seq_id).block_table)
        total = (held + self.cache.pool.num_available) * self.cache.page_size
        return total - req.num_computed_tokens

    def _too_big(self, req: Request) -> str:
        cfg = self.cache.cfg
        return (f"sequence of {req.num_tokens} tokens cannot fit in the cache "
                f"(num_pages={cfg.num_pages} x page_size={cfg.page_size} = "
                f"{cfg.num_slots} slots) even with every other request preempted")
