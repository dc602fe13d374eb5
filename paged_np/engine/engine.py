"""The serving engine: requests in, tokens out, the paged KV cache in between.

::

    engine = pnp.Engine(model, num_pages=32, page_size=16, max_num_seqs=8,
                        max_num_batched_tokens=256)
    outs = engine.generate(prompts, pnp.SamplingParams(max_tokens=16, temperature=0))

Every option is a field of :class:`~paged_np.engine.config.EngineConfig`
(vLLM's ``EngineArgs``): pass them as keywords, or pass ``config=``.

One :meth:`Engine.step` is one forward pass of the model, the unit of
*continuous batching* (Orca, vLLM): requests join and leave the batch at any
step, so the batch never waits for its longest member.
:func:`continuous_batching_step` is a step, in four parts:

1. **schedule** (:mod:`.scheduler`): pick each sequence's tokens under the
   seat and token budgets, allocate their slots (asking the cache first,
   preempting when pages run out, admitting waiting requests);
2. **build the batch** (:mod:`.batching`): the scheduled tokens, positions,
   slots, ``query_start_loc``, block tables and seq_lens;
3. **run the model** (:meth:`~paged_np.models.llama.LlamaModel.forward`) over the whole batch;
4. **post-process** (:meth:`Engine.postprocess`): record the written tokens
   (``append_tokens`` hashes full pages for prefix reuse), release pages a
   sliding window left behind, sample the next token of every sequence at
   the end of what it knows, fork ``n > 1`` requests after their prompt,
   finish sequences at a stop token or ``max_tokens``.

The pieces are seams (``docs/design.md``, "Seams"): the cache class, the
scheduler, the sampler and the step itself are the registry entries that
``EngineConfig.kv_cache``, ``scheduler``, ``sampler`` and ``engine_step``
name, so a learner's own class or function replaces the package's. Plug-ins
load only when chosen: speculative decoding (:mod:`.speculation`), swap
(:mod:`.swap`), logprobs (:mod:`.logprobs`), the tiers below the arena (:mod:`.tiering`).

Who owns what (:mod:`.request`): the engine keeps one :class:`ParentRequest`
per user request and is the only writer of its ``output``; the scheduler
runs one :class:`Request` per sample and reports what it did; the cache owns
the computed tokens. ``engine.metrics`` reports what happened (:mod:`.stats`).

Compared with vLLM: one process, no tokenizer or detokenizer, no async
front end, no CUDA graphs; the scheduler and the model share a thread.
"""

from __future__ import annotations

import itertools
import time
import types

import numpy as np

from ..checks import as_extra_key, as_token_ids, check_int
from ..errors import DTypeError, InvalidArgument, UnknownRequest
from ..registry import ENGINE_STEPS, KV_CACHES, SAMPLERS, SCHEDULERS
from .batching import build_batch
from .config import EngineConfig
from .outputs import RequestOutput, SampleOutput
from .request import ParentRequest, Request
from .sampling import SamplingParams, make_rng
from .stats import EngineStats

__all__ = ["Engine", "continuous_batching_step"]


class Engine:
    """Continuous batching over a paged KV cache.

    ``model``: a :class:`~paged_np.models.llama.LlamaModel` (or any object with its ``cfg`` and
    ``forward(batch, cache, backend=)``); ``config``: an EngineConfig, whose
    fields ``**options`` replace (the defaults' when it is None).

    Attributes: ``config``; the seams ``cache`` (a PagedKVCache), ``scheduler``
    (its ``running`` and ``waiting`` lists can be read) and ``sampler``;
    ``requests``, the unfinished requests by id (a read-only view).
    """

    def __init__(self, model, config: EngineConfig | None = None, **options):
        if not (hasattr(model, "cfg") and callable(getattr(model, "forward", None))):
            raise DTypeError(f"Engine: model must be a LlamaModel, got {type(model).__name__}")
        self.config = cfg = EngineConfig.from_options(config, **options)
        self.model = model
        # The seams (docs/design.md): each is the registry entry its option names.
        self.cache = KV_CACHES.load(cfg.kv_cache)(cfg.cache_config(model.cfg),
                                                  record_events=cfg.record_events)
        # The attention's mask: the option's window (else the model's) and its sinks.
        self.sliding_window, self.attention_sinks = cfg.attention_window(model.cfg)
        if cfg.tiers:                   # the tiers below the arena (host, disk): a plug-in
            from .tiering import attach_tiers
            attach_tiers(self.cache, cfg, model)
        refusal = self.cache.prefix_index.no_sliding_window
        if self.sliding_window is not None and refusal:
            raise InvalidArgument(f"Engine: prefix_cache={cfg.prefix_cache!r} cannot serve a "
                                  f"sliding-window model or option: {refusal}")
        self.scheduler = SCHEDULERS.load(cfg.scheduler)(self.cache, cfg, self.sliding_window)
        self.sampler = SAMPLERS.load(cfg.sampler)        # (logits, params, rngs) -> ids
        self._step = ENGINE_STEPS.load(cfg.engine_step)  # (engine) -> finished outputs
        self._requests: dict = {}                      # unfinished, by request id
        self.requests = types.MappingProxyType(self._requests)
        self._done: list[RequestOutput] = []           # finished outside a step (errors)
        self._seq_ids = itertools.count()
        self._num_requests = 0
        self._stats = EngineStats()
        self._logits_listeners: list = []              # add_logits_listener

    # ------------------------------------------------------------ requests
    def add_request(self, prompt, params: SamplingParams | None = None, request_id=None,
                    request_index: int | None = None, cache_salt: str | None = None):
        """Queue one prompt; returns its request id.

        ``request_index`` keys the random generators of its samples (with the
        params' seed); by default it counts the requests added to this engine.
        ``cache_salt`` (vLLM's) enters its pages' hashes: only the same salt shares pages.
        A prompt that can never fit in the cache finishes at the next step with
        ``finish_reason == "error"``.
        """
        prompt, params = self._check_request(prompt, params)
        if request_id is None:
            request_id = f"req-{self._num_requests}"
        if request_id in self._requests:
            raise InvalidArgument(f"request_id {request_id!r} is already in the engine")
        index = self._num_requests if request_index is None else request_index
        want = params.logprobs is not None               # vLLM: None unless asked for
        out = RequestOutput(request_id, list(prompt),     # the user's copy
                            [SampleOutput(j, logprobs=[] if want else None,
                                          cumulative_logprob=0.0 if want else None)
                             for j in range(params.n)],
                            prompt_logprobs=None if params.prompt_logprobs is None else [None])
        parent = ParentRequest(request_id, index, prompt, params, out, as_extra_key(cache_salt))
        self._num_requests += 1                          # a refused salt changed nothing
        reason = self.scheduler.never_fits(len(prompt))
        if reason:
            self._finish_request(parent, "error", reason)
            return request_id
        req = Request(next(self._seq_ids), parent, out.samples[0],
                      make_rng(params.seed, index, 0), pending_fork=params.n - 1)
        parent.seqs.append(req)
        self._requests[request_id] = parent
        self.scheduler.add(req)
        return request_id

    def _check_request(self, prompt, params):
        """``(prompt, params)`` validated (a list of ints, a SamplingParams)."""
        prompt = list(as_token_ids(prompt, "prompt"))
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise DTypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        if max(prompt) >= self.model.cfg.vocab_size:
            raise InvalidArgument(f"prompt: token id {max(prompt)} is outside the vocabulary "
                                  f"[0, {self.model.cfg.vocab_size})")
        if params.n > self.config.max_num_seqs:
            raise InvalidArgument(f"SamplingParams.n={params.n} exceeds the engine's "
                                  f"max_num_seqs={self.config.max_num_seqs}")
        return prompt, params

    def abort(self, request_id) -> None:
        """Stop a request now; its pages go back to the pool."""
        parent = self._requests.get(request_id)
        if parent is None:
            raise UnknownRequest(f"request_id {request_id!r} is not running or waiting")
        for req in parent.seqs:
            self.scheduler.remove(req)
        self._finish_request(parent, "abort")

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests) or bool(self._done)

    def request_output(self, request_id) -> RequestOutput:
        """A queued or running request's output, updated in place at every step."""
        parent = self._requests.get(request_id)
        if parent is not None:
            return parent.output
        for out in self._done:                   # finished, not yet handed back by step()
            if out.request_id == request_id:
                return out
        raise UnknownRequest(f"request_id {request_id!r} is not running or waiting")

    def finish_sample(self, request_id, index: int, reason: str = "stop",
                      stop_reason=None, num_tokens: int | None = None) -> None:
        """End one sample of a request now (a stop string seen by the caller).

        Its pages go back to the pool; the request finishes (and the next
        :meth:`step` returns it) when its last sample does. ``stop_reason``
        (the stop string, say) is recorded in its output. ``num_tokens`` keeps
        only that many generated tokens: a step with speculation may have
        emitted a few past the one that completed the stop string.
        """
        parent = self._requests.get(request_id)
        if parent is None:
            raise UnknownRequest(f"request_id {request_id!r} is not running or waiting")
        for req in list(parent.seqs):
            if req.sample.index == index and not req.sample.finished:
                if num_tokens is not None:
                    req.sample.truncate(check_int("num_tokens", num_tokens, 0))
                req.sample.stop_reason = stop_reason
                self._finish_seq(req, reason)
                return
        raise InvalidArgument(f"index: request {request_id!r} has no unfinished sample {index}")

    def generate(self, prompts, params=None, progress=None) -> list[RequestOutput]:
        """Serve every prompt to completion; outputs in the order of ``prompts``.

        ``params`` is one SamplingParams for all or a list, one per prompt.
        ``progress``, if given, is called with each finished RequestOutput.
        Requests queued earlier with :meth:`add_request` are served too; their
        outputs (and, if a step raises, the ones finished so far) are handed
        back by the next :meth:`step`, never dropped.
        """
        prompts = list(prompts)
        if params is None or isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise InvalidArgument(f"params: {len(params)} SamplingParams for "
                                  f"{len(prompts)} prompts")
        for p, sp in zip(prompts, params):      # check them all first: a refused call
            self._check_request(p, sp)          # must not leave half the prompts queued
        ids = [self.add_request(p, sp, request_index=i)
               for i, (p, sp) in enumerate(zip(prompts, params))]
        mine, results, others = set(ids), {}, []
        try:
            while len(results) < len(ids):
                for out in self.step():
                    if out.request_id not in mine:
                        others.append(out)
                        continue
                    results[out.request_id] = out
                    if progress is not None:
                        progress(out)
        except BaseException:
            others.extend(results.values())
            raise
        finally:
            self._done.extend(others)             # the next step() returns them
        return [results[i] for i in ids]

    # ---------------------------------------------------------------- step
    def step(self) -> list[RequestOutput]:
        """One scheduling round and one forward pass; returns requests finished now.

        The step itself is a seam: ``EngineConfig.engine_step`` names a function
        ``fn(engine) -> list[RequestOutput]`` (:func:`continuous_batching_step`).
        """
        return self._step(self)

    def take_finished(self) -> list[RequestOutput]:
        """The requests finished since the last call (each handed back once)."""
        done, self._done = self._done, []
        return done

    def record_step(self, schedule_s: float, model_s: float, sample_s: float,
                    num_tokens: int) -> None:
        """Count one step's tokens and times (for :attr:`metrics`) and tick the cache."""
        self._stats.record_step(schedule_s, model_s, sample_s, num_tokens,
                                self.scheduler, self.cache)
        self.cache.tick()

    def record_admissions(self, admitted) -> None:
        """Turn the scheduler's report of prefix hits into outputs and hit rates.

        A request's first admission serves its prompt (counted in the prefix
        hit rate, and in its output's ``num_cached_prompt_tokens``); a request
        preempted by recompute comes back with its prompt *and* its generated
        tokens and finds many of its own pages still cached: that is the cache
        saving recomputation, not prompts sharing a prefix, so it is kept apart.
        """
        for req, n_known, n_hit in admitted:
            if req.num_preemptions:
                self._stats.count_readmission(n_known, n_hit)
            elif req.sample.index == 0:                  # the prompt, seen for the first time
                req.parent.output.num_cached_prompt_tokens = n_hit
                self._stats.count_prompt(n_known, n_hit)

    def postprocess(self, scheduled, logits, prompt=()) -> None:
        """Record written tokens, release window pages, sample or verify, fork, finish.

        ``logits`` float32 [S, V] from the model; its first rows are the
        prompt-logprob rows that ``prompt`` (from :func:`build_batch`) lists.
        """
        if prompt:                 # prompt logprobs: a plug-in, loaded when asked for
            from .logprobs import record_prompt_logprobs

            logits = logits[record_prompt_logprobs(prompt, logits, self._logits_listeners):]
        cache, sched = self.cache, self.scheduler
        rows, row_seqs, verify = [], [], []                      # logits row per sampler
        row = 0
        for req, n, _ in scheduled:
            if req.spec_token_ids:                               # 1 + k rows, verified below
                verify.append((req, row))
                row += n
                continue
            c = req.num_computed_tokens                          # the cache's count, until
            cache.append_tokens(req.seq_id, req.tokens(c, c + n))  # ... it grows by n here
            sched.release_outside_window(req)
            if req.num_computed_tokens < req.num_tokens:         # a prefill chunk: no sample
                continue
            rows.append(row)
            row_seqs.append(req)
            for child in self._fork(req):                        # n > 1: after the prompt
                rows.append(row)
                row_seqs.append(child)
            row += 1
        for req, first in verify:                                # speculation's plug-in
            rows_k = logits[first:first + 1 + len(req.spec_token_ids)]  # [1 + k, V]
            self._emit(req, sched.speculator.verify(self, req, rows_k), rows_k)
        if not row_seqs:
            return
        tokens = self.sampler(logits[rows], [s.parent.params for s in row_seqs],
                              [s.rng for s in row_seqs])         # [S'] int64
        for req, row, tok in zip(row_seqs, rows, tokens.tolist()):
            self._emit(req, [tok], logits[row:row + 1])

    def count_drafts(self, num_drafted: int, num_accepted: int) -> None:
        """Speculation's verdict on one request's drafts, for :attr:`metrics`."""
        self._stats.count_drafts(num_drafted, num_accepted)

    def _emit(self, req: Request, tokens: list, rows: np.ndarray) -> None:
        """Append a step's tokens to the sample, up to a stop token or ``max_tokens``.

        ``rows`` float32 [len(tokens), V]: the logits each token was chosen from
        (for the logits listeners and ``SamplingParams.logprobs``).
        """
        params, sample = req.parent.params, req.sample
        kept, reason = [], None
        for tok in tokens:
            kept.append(tok)
            if tok in params.stop_token_ids:
                reason = "stop"
                break
            if len(sample.token_ids) + len(kept) >= params.max_tokens:
                reason = "length"
                break
        pos = req.num_tokens - 1                                 # the row of kept[0]
        for i, fn in itertools.product(range(len(kept)), self._logits_listeners):
            fn(req.parent.request_id, sample.index, pos + i, rows[i])
        if params.logprobs is not None:
            from .logprobs import append_sample_logprobs

            append_sample_logprobs(sample, rows[:len(kept)], kept, params.logprobs)
        sample.token_ids += kept                                 # the one list of its tokens
        self._stats.generated_tokens += len(kept)
        if reason == "stop":
            sample.stop_reason = kept[-1]
        if reason is not None:
            self._finish_seq(req, reason)

    def add_logits_listener(self, fn) -> None:
        """Call ``fn(request_id, sample_index, position, logits)`` for each row the model scores.

        ``logits`` is the float32 ``[V]`` row at ``position`` of a sample (the
        model's raw output, predicting the token at ``position + 1``; a view:
        copy it to keep it): the row each generated token was chosen from,
        and, for a request with ``prompt_logprobs``, every prompt position
        (sample 0), each once. For drawings and comparisons (KL divergence);
        the logprobs a user reads are ``SamplingParams.logprobs``.
        """
        if not callable(fn):
            raise DTypeError(f"add_logits_listener: fn must be callable, got {type(fn).__name__}")
        self._logits_listeners.append(fn)

    def _fork(self, req: Request) -> list[Request]:
        """After the prompt of an ``n > 1`` request: n - 1 siblings share its pages."""
        if not req.pending_fork:
            return []
        parent, children = req.parent, []
        for j in range(1, req.pending_fork + 1):
            child = Request(next(self._seq_ids), parent, parent.output.samples[j],
                            make_rng(parent.params.seed, parent.index, j))
            self.scheduler.fork(req, child)                      # copy-on-write later
            parent.seqs.append(child)
            children.append(child)
        req.pending_fork = 0
        return children

    # ------------------------------------------------------------ finishing
    def fail(self, req: Request, reason: str) -> None:
        """End a sequence the scheduler found can never run (its error says why)."""
        self._finish_seq(req, "error", reason)

    def _finish_seq(self, req: Request, reason: str, error: str | None = None) -> None:
        self.scheduler.remove(req)
        req.sample.finish_reason = reason
        parent = req.parent
        if error is not None:
            parent.output.error = error
        if reason == "error" and req.pending_fork:               # its siblings never started
            for s in parent.output.samples[1:]:
                s.finish_reason = "error"
        if parent.output.finished:
            self._finish_request(parent, None)

    def _finish_request(self, parent: ParentRequest, reason: str | None,
                        error: str | None = None):
        for s in parent.output.samples:
            if s.finish_reason is None:
                s.finish_reason = reason
        if error is not None:
            parent.output.error = error
        self._requests.pop(parent.request_id, None)
        self._done.append(parent.output)

    # -------------------------------------------------------------- metrics
    @property
    def metrics(self) -> dict:
        """Counters and timings so far, and the per-step ``series`` (lists, one entry a step)."""
        return self._stats.metrics(self.scheduler, self.cache)

    def stats(self) -> dict:
        """What a server exports after each step (vLLM's ``SchedulerStats``): see
        :meth:`EngineStats.snapshot <paged_np.engine.stats.EngineStats.snapshot>`."""
        return self._stats.snapshot(self.scheduler, self.cache)


def continuous_batching_step(engine: Engine) -> list[RequestOutput]:
    """The engine step (the default of ``EngineConfig.engine_step``), in four parts.

    1. schedule: each sequence's tokens and slots (admitting, preempting);
    2. build the batch: the scheduled tokens as one varlen batch;
    3. run the model over it: logits where a token is sampled;
    4. post-process: append written tokens, sample, fork, finish.
    """
    t0 = time.perf_counter()
    sched = engine.scheduler.schedule()                             # 1
    engine.record_admissions(sched.admitted)
    for req, reason in sched.failed:
        engine.fail(req, reason)
    num_tokens = sum(n for _, n, _ in sched.scheduled)
    if sched.scheduled:
        batch, prompt = build_batch(sched.scheduled, engine.cache,   # 2
                                    engine.sliding_window, engine.attention_sinks)
        t1 = time.perf_counter()
        logits = engine.model.forward(batch, engine.cache,
                                      backend=engine.config.backend)  # 3: [S, V]
        t2 = time.perf_counter()
        engine.postprocess(sched.scheduled, logits, prompt)         # 4
    else:
        t1 = t2 = time.perf_counter()
    engine.record_step(t1 - t0, t2 - t1, time.perf_counter() - t2, num_tokens)
    return engine.take_finished()
