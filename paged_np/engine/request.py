"""The engine's two records of a request: one per user request, one per sample.

A user's request with ``n`` samples is one :class:`ParentRequest` (the
engine's: the prompt, the sampling params, the output the user reads) and
``n`` :class:`Request` objects (the scheduler's: one stream of tokens each,
what it runs and preempts). vLLM v1 uses the same two names: an ``n > 1``
request fans out into ``n`` requests under a parent.

Every count lives in one place, so nothing has to be kept in step by hand:

======================  =========================================================
what                    kept by
======================  =========================================================
prompt token ids        ``ParentRequest.prompt`` (``output.prompt_token_ids`` is a copy)
generated token ids     ``Request.sample.token_ids``: the user's output, the only list
tokens whose KV exists  the cache's :class:`~paged_np.cache.sequence.Sequence`
                        (``Request.seq`` while the sample is in the cache)
tokens swapped to host  ``Request.num_swapped_tokens`` (the cache cannot know them)
user-facing output      ``ParentRequest.output``: written by the engine alone
======================  =========================================================

so ``Request.num_tokens`` and ``Request.num_computed_tokens`` are read, never
stored: prompt plus generated, and what the cache holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

WAITING, RUNNING, SWAPPED, FINISHED = "waiting", "running", "swapped", "finished"


@dataclass(eq=False)
class ParentRequest:
    """The engine's record of one user request: its params, its output, its samples.

    ``index`` keys the samples' random generators (with ``params.seed``);
    ``seqs`` are the scheduler's records of the samples started so far (the
    first one, then its ``n - 1`` forks once the prompt is computed).
    """

    request_id: object
    index: int
    prompt: list
    params: object                # SamplingParams
    output: object                # RequestOutput: the only one, written by the engine
    #: vLLM's ``cache_salt`` as the cache's ``extra_key`` (bytes), or None: only
    #: requests with the same salt share cached pages.
    cache_salt: bytes | None = None
    seqs: list = field(default_factory=list)


@dataclass(eq=False)
class Request:
    """What the scheduler runs: one sample of a user's request, one stream of tokens.

    Two counts drive scheduling: ``num_tokens`` (prompt + generated, what it
    knows) and ``num_computed_tokens`` (those whose K/V is in the cache).
    Both are read from their owners (see the module docstring).
    """

    seq_id: int                   # the cache's id
    parent: ParentRequest         # the engine's record of the whole request
    sample: object                # its SampleOutput (generated ids, finish reason)
    rng: object                   # np.random.Generator of this sample
    status: str = WAITING
    pending_fork: int = 0         # siblings still to fork off after the prompt (n - 1)
    num_preemptions: int = 0
    #: The cache's record of this sample while it is in the cache, else None.
    seq: object = field(default=None, repr=False)
    swap_pages: list | None = field(default=None, repr=False)  # host pages while SWAPPED
    num_swapped_tokens: int = 0   # tokens whose KV the host holds while SWAPPED
    queued_at: int = 0            # the scheduler's admission count when it last joined the queue
    #: Whatever the prefix index keeps between lookups of this request (its hash chain).
    prefix_memo: dict = field(default_factory=dict, repr=False)
    #: Speculative decoding: the drafts scheduled this step after the next input token
    #: (vLLM's name; written by the scheduler, [] when not drafting). They are not
    #: generated tokens: only those the engine verifies join ``sample.token_ids``.
    spec_token_ids: list = field(default_factory=list)
    #: The scheduler's DraftBackoff for this request (None without speculation).
    spec_backoff: object = field(default=None, repr=False)
    #: Where this step's drafts came from: (index of the first draft in the context,
    #: index of its original, whether ``NgramProposer.rejoin`` found them).
    spec_source: tuple = field(default=(0, -1, False), repr=False)
    #: After an n-gram draft was rejected: (index of the model's own token, index of the
    #: token of the text it replaced), for ``NgramProposer.rejoin``; else None.
    spec_rejoin: tuple | None = field(default=None, repr=False)

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens: what the request knows."""
        return len(self.parent.prompt) + len(self.sample.token_ids)

    @property
    def num_computed_tokens(self) -> int:
        """Tokens whose KV exists: on the host while swapped, else in the cache (0 if out)."""
        if self.status == SWAPPED:
            return self.num_swapped_tokens
        return 0 if self.seq is None else self.seq.num_computed_tokens

    def tokens(self, start: int = 0, stop: int | None = None) -> list:
        """Token ids ``[start, stop)`` of prompt + generated, without joining the two lists."""
        prompt, gen = self.parent.prompt, self.sample.token_ids
        p = len(prompt)
        stop = p + len(gen) if stop is None else stop
        if stop <= p:
            return prompt[start:stop]
        if start >= p:
            return gen[start - p:stop - p]
        return prompt[start:] + gen[:stop - p]

    @property
    def token_ids(self) -> list:
        """Prompt plus generated token ids (a new list)."""
        return self.tokens()

    @property
    def seats(self) -> int:
        """Running seats it takes: itself plus the siblings it will fork."""
        return 1 + self.pending_fork

    # ------------------------------------------------------ prompt logprobs
    def prompt_logprob_rows(self, start: int, count: int) -> int:
        """How many logits rows this sample needs for prompt logprobs in a chunk.

        The chunk computes positions ``[start, start + count)``; position ``i``
        scores prompt token ``i + 1``. Rows are wanted for the positions whose
        token is a prompt token not yet recorded: ``[first, min(start + count,
        P - 1))``, where ``first`` is the first unrecorded position. Returns the
        number of rows; they start at position ``max(start, first)``.
        """
        if self.parent.params.prompt_logprobs is None or self.sample.index != 0:
            return 0
        recorded = self.parent.output.prompt_logprobs                # [None, dict, ...]
        first = max(start, len(recorded) - 1)                        # next position to score
        last = min(start + count, len(self.parent.prompt) - 1)
        return max(0, last - first)

    def servable_prefix(self) -> int:
        """How many first tokens the prefix cache may be asked to serve.

        All of them, unless the request still scores its prompt
        (``prompt_logprobs``): then only the positions it has scored, plus the
        one after (the cache keeps the last token it is given for computing):
        a new request gets no hit, as in vLLM.
        """
        recorded = self.parent.output.prompt_logprobs
        if recorded is None or len(recorded) >= len(self.parent.prompt):
            return self.num_tokens
        return len(recorded)                                         # positions scored + 1
