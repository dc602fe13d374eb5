"""The serving engine: requests in, tokens out, the paged KV cache in between.

::

    engine = pnp.Engine(model, num_pages=32, page_size=16, max_num_seqs=8,
                        max_num_batched_tokens=256)
    outs = engine.generate(prompts, pnp.SamplingParams(max_tokens=16, temperature=0))

One :meth:`Engine.step` is one forward pass of the model, the unit of
*continuous batching* (Orca, vLLM): requests join and leave the batch at any
step, so the batch never waits for its longest member. A step is

1. **schedule** (:mod:`paged_np.engine.scheduler`): pick each sequence's tokens under
   the seat and token budgets, allocate their slots (preempting when pages
   run out, admitting waiting requests when they are there);
2. **build the batch**: concatenate the scheduled tokens, their positions and
   slots, ``query_start_loc``, and ask the cache for block tables and seq_lens;
3. **run the model** (:meth:`LlamaModel.forward`) over the whole batch;
4. **post-process**: record the written tokens (``append_tokens``, which
   hashes full pages for prefix reuse), release pages a sliding window has
   left behind, sample the next token of every sequence that reached the end
   of what it knows, fork ``n > 1`` requests after their prompt, finish
   sequences that hit a stop token or ``max_tokens``.

``engine.metrics`` reports what happened, including how the step time
splits between scheduling (steps 1, 2), the model (3) and sampling (4), and a
per-step series for drawings (``metrics["series"]``).

Compared with vLLM: one process, no tokenizer or detokenizer, no async
front end, no CUDA graphs; the scheduler and the model share a thread.
"""

from __future__ import annotations

import itertools
import time

import numpy as np

from ..cache.kv_cache import PagedKVCache
from ..checks import as_token_ids, check_int, check_positive_int
from ..config import CacheConfig
from ..errors import DTypeError, InvalidArgument, UnknownRequest
from ..models.llama import ForwardBatch, LlamaModel
from .outputs import RequestOutput, SampleOutput
from .sampling import SamplingParams, make_rng, sample_tokens
from .schedule_policy import SCHEDULES
from .scheduler import RUNNING, Request, Scheduler

PREEMPTION_MODES = ("recompute", "swap")
ENGINE_BACKENDS = ("numpy", "numba", "auto")


class _ParentRequest:
    """The engine's record of one request: its output and its sequences."""

    def __init__(self, request_id, index, prompt, params, output):
        self.request_id = request_id
        self.index = index            # keys the samples' random generators
        self.prompt = prompt
        self.params = params
        self.output = output
        self.reqs: list[Request] = []


def _ratio(num: int, den: int) -> float:
    return num / den if den else 0.0


class Engine:
    """Continuous batching over a paged KV cache.

    Parameters
    ----------
    model : LlamaModel
    num_pages, page_size : the cache's size (the arena is allocated here, once).
    max_num_seqs : most sequences running at once.
    max_num_batched_tokens : most tokens in one step (prefill chunks + decodes).
    preemption_mode : "recompute" or "swap" (see :mod:`paged_np.engine.scheduler`).
    eviction_policy : "lru" (default), "fifo", "lfu" or an EvictionPolicy subclass: which
        cached page goes first.
    backend : paged attention backend, "numba", "numpy" or "auto".
    swap_pages : pages of host swap space (swap mode); default ``num_pages``.
    record_events : keep ``cache.events`` (for drawings; off for long runs).
    schedule : "fcfs" (default) or "lpm": the order waiting requests are admitted in,
        arrival or longest cached prefix first (see :mod:`paged_np.engine.schedule_policy`).
    prefix_cache : "hash" (default, vLLM's page-hash chain) or "radix" (SGLang's
        radix tree). The radix tree cannot free a prefix under a live sequence,
        so it is refused for models with a sliding window.
    """

    def __init__(self, model, num_pages: int, page_size: int = 16, max_num_seqs: int = 8,
                 max_num_batched_tokens: int = 256, preemption_mode: str = "recompute",
                 eviction_policy: str = "lru", backend: str = "auto",
                 swap_pages: int | None = None, record_events: bool = False,
                 prefix_cache: str = "hash", schedule: str = "fcfs"):
        if not isinstance(model, LlamaModel):
            raise DTypeError(f"Engine: model must be a LlamaModel, got {type(model).__name__}")
        num_pages = check_positive_int("Engine: num_pages", num_pages)
        page_size = check_positive_int("Engine: page_size", page_size)
        self.max_num_seqs = check_positive_int("Engine: max_num_seqs", max_num_seqs)
        self.max_num_batched_tokens = check_positive_int(
            "Engine: max_num_batched_tokens", max_num_batched_tokens)
        if preemption_mode not in PREEMPTION_MODES:
            raise InvalidArgument(f"Engine: preemption_mode must be one of {PREEMPTION_MODES}, "
                                  f"got {preemption_mode!r}")
        if backend not in ENGINE_BACKENDS:
            raise InvalidArgument(
                f"Engine: backend must be one of {ENGINE_BACKENDS}, got {backend!r}")
        swap_pages = (num_pages if swap_pages is None
                      else check_int("Engine: swap_pages", swap_pages, 0))
        if schedule not in SCHEDULES:
            raise InvalidArgument(f"Engine: schedule must be one of {SCHEDULES}, got {schedule!r}")
        mcfg = model.cfg
        if prefix_cache == "radix" and mcfg.sliding_window is not None:
            raise InvalidArgument(
                "Engine: prefix_cache='radix' with a sliding-window model is not supported: "
                "pages the window releases would stay pinned under the live path; use 'hash'")
        self.model = model
        self.backend = backend
        self.cache = PagedKVCache(
            CacheConfig(num_pages=num_pages, page_size=page_size, num_layers=mcfg.num_layers,
                        num_kv_heads=mcfg.num_kv_heads, head_dim=mcfg.head_dim,
                        dtype=np.float32, eviction_policy=eviction_policy,
                        prefix_cache=prefix_cache),
            record_events=record_events)
        self.scheduler = Scheduler(self.cache, self.max_num_seqs, self.max_num_batched_tokens,
                                   preemption_mode, swap_pages, mcfg.sliding_window,
                                   schedule)
        self._requests: dict = {}                      # unfinished, by request id
        self._done: list[RequestOutput] = []           # finished outside a step (errors)
        self._seq_ids = itertools.count()
        self._num_requests = 0
        self._stats = dict(steps=0, generated_tokens=0, scheduled_tokens=0, peak_pages_in_use=0,
                           schedule_s=0.0, model_s=0.0, sample_s=0.0)
        self._series = {k: [] for k in ("step", "running", "waiting", "num_free", "num_cached",
                                        "num_in_use", "scheduled_tokens", "preemptions")}

    # ------------------------------------------------------------ requests
    def add_request(self, prompt, params: SamplingParams | None = None, request_id=None,
                    request_index: int | None = None):
        """Queue one prompt; returns its request id.

        ``request_index`` keys the random generators of its samples (with the
        params' seed); by default it counts the requests added to this engine.
        A prompt that can never fit in the cache is not refused here: the
        request finishes at the next step with ``finish_reason == "error"``.
        """
        prompt, params = self._check_request(prompt, params)
        if request_id is None:
            request_id = f"req-{self._num_requests}"
        if request_id in self._requests:
            raise InvalidArgument(f"request_id {request_id!r} is already in the engine")
        index = self._num_requests if request_index is None else request_index
        self._num_requests += 1
        out = RequestOutput(request_id, list(prompt),
                            [SampleOutput(j) for j in range(params.n)])
        parent = _ParentRequest(request_id, index, prompt, params, out)
        reason = self._never_fits(len(prompt))
        if reason:
            self._finish_request(parent, "error", reason)
            return request_id
        req = Request(next(self._seq_ids), parent, out.samples[0], list(prompt),
                  make_rng(params.seed, index, 0), pending_fork=params.n - 1)
        parent.reqs.append(req)
        self._requests[request_id] = parent
        self.scheduler.add(req)
        return request_id

    def _check_request(self, prompt, params):
        """``(prompt, params)`` validated (a list of ints, a SamplingParams)."""
        prompt = as_token_ids(prompt, "prompt")
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise DTypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        if max(prompt) >= self.model.cfg.vocab_size:
            raise InvalidArgument(f"prompt: token id {max(prompt)} is outside the vocabulary "
                                  f"[0, {self.model.cfg.vocab_size})")
        if params.n > self.max_num_seqs:
            raise InvalidArgument(f"SamplingParams.n={params.n} exceeds the engine's "
                                  f"max_num_seqs={self.max_num_seqs}")
        return prompt, params

    def abort(self, request_id) -> None:
        """Stop a request now; its pages go back to the pool."""
        parent = self._requests.get(request_id)
        if parent is None:
            raise UnknownRequest(f"request_id {request_id!r} is not running or waiting")
        for req in parent.reqs:
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

    def finish_sample(self, request_id, index: int, reason: str = "stop") -> None:
        """End one sample of a request now (a stop string seen by the caller).

        Its pages go back to the pool; the request finishes (and the next
        :meth:`step` returns it) when its last sample does.
        """
        parent = self._requests.get(request_id)
        if parent is None:
            raise UnknownRequest(f"request_id {request_id!r} is not running or waiting")
        for req in list(parent.reqs):
            if req.sample.index == index and not req.sample.finished:
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
        """One scheduling round and one forward pass; returns requests finished now."""
        t0 = time.perf_counter()
        sched = self.scheduler.schedule()
        for req, reason in sched.failed:
            self._finish_seq(req, "error", reason)
        batch = self._build_batch(sched.scheduled) if sched.scheduled else None
        t1 = time.perf_counter()
        if batch is not None:
            logits = self.model.forward(batch, self.cache, backend=self.backend)  # [S, V]
        t2 = time.perf_counter()
        if batch is not None:
            self._postprocess(sched.scheduled, logits)
        t3 = time.perf_counter()
        st = self._stats
        st["schedule_s"] += t1 - t0
        st["model_s"] += t2 - t1
        st["sample_s"] += t3 - t2
        st["steps"] += 1
        st["scheduled_tokens"] += sum(n for _, n, _ in sched.scheduled)
        self._record_step()
        self.cache.tick()
        done, self._done = self._done, []
        return done

    def _build_batch(self, scheduled) -> ForwardBatch:
        """Concatenate the step's tokens (varlen layout) and fetch the block tables."""
        # One pass in Python over the scheduled sequences, then NumPy on whole arrays.
        counts, starts, ends, tokens = [], [], [], []
        for s, n, _ in scheduled:
            c = s.num_computed_tokens
            counts.append(n)                                     # new tokens this step
            starts.append(c)                                     # first new position
            ends.append(s.num_tokens)                            # tokens it knows
            tokens += s.token_ids[c:c + n]
        counts = np.array(counts, np.int64)                      # [B]
        starts = np.array(starts, np.int64)                      # [B]
        qsl = np.zeros(len(scheduled) + 1, dtype=np.int32)       # [B+1]
        np.cumsum(counts, out=qsl[1:])
        T = int(qsl[-1])
        # Position of token t of sequence b: starts[b] + (t - qsl[b]).
        positions = np.repeat(starts - qsl[:-1], counts) + np.arange(T)  # [T]
        slots = np.concatenate([slots for _, _, slots in scheduled])     # [T] int64
        meta = self.cache.batch([s.seq_id for s, _, _ in scheduled])
        # Sequences that reach the end of what they know sample a token now.
        samples = (starts + counts) == np.array(ends, np.int64)  # [B] bool
        logits_indices = qsl[1:][samples].astype(np.int64) - 1   # [S] last token of each
        return ForwardBatch(np.array(tokens, np.int64), positions, slots, qsl,
                            meta.block_tables, meta.seq_lens, logits_indices)

    def _postprocess(self, scheduled, logits) -> None:
        """Record written tokens, release window pages, sample, fork, finish."""
        cache, sched = self.cache, self.scheduler
        rows, row_seqs = [], []                                  # logits row per sampler
        row = 0
        for req, n, _ in scheduled:
            c = req.num_computed_tokens
            cache.append_tokens(req.seq_id, req.token_ids[c:c + n])
            req.num_computed_tokens = c + n
            sched.release_outside_window(req)
            if req.num_computed_tokens < req.num_tokens:                # a prefill chunk: no sample
                continue
            rows.append(row)
            row_seqs.append(req)
            for child in self._fork(req):                        # n > 1: after the prompt
                rows.append(row)
                row_seqs.append(child)
            row += 1
        if not row_seqs:
            return
        tokens = sample_tokens(logits[rows], [s.parent.params for s in row_seqs],
                               [s.rng for s in row_seqs])        # [S'] int64
        for req, tok in zip(row_seqs, tokens.tolist()):
            req.token_ids.append(tok)
            req.sample.token_ids.append(tok)
            params = req.parent.params
            if tok in params.stop_token_ids:
                self._finish_seq(req, "stop")
            elif len(req.sample.token_ids) >= params.max_tokens:
                self._finish_seq(req, "length")
        self._stats["generated_tokens"] += len(row_seqs)

    def _fork(self, req: Request) -> list[Request]:
        """After the prompt of an ``n > 1`` request: n - 1 siblings share its pages."""
        if not req.pending_fork:
            return []
        parent, children = req.parent, []
        for j in range(1, req.pending_fork + 1):
            child = Request(next(self._seq_ids), parent, parent.output.samples[j],
                            list(req.token_ids), make_rng(parent.params.seed, parent.index, j),
                            num_computed_tokens=req.num_computed_tokens, status=RUNNING)
            self.cache.fork(req.seq_id, child.seq_id)          # copy-on-write later
            self.scheduler.running.append(child)
            parent.reqs.append(child)
            children.append(child)
        req.pending_fork = 0
        return children

    # ------------------------------------------------------------ finishing
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

    def _finish_request(self, parent: _ParentRequest, reason: str | None, error: str | None = None):
        for s in parent.output.samples:
            if s.finish_reason is None:
                s.finish_reason = reason
        if error is not None:
            parent.output.error = error
        self._requests.pop(parent.request_id, None)
        self._done.append(parent.output)

    def _never_fits(self, prompt_len: int) -> str | None:
        """Why a prompt can never be served, or None."""
        cfg, window = self.cache.cfg, self.model.cfg.sliding_window
        if window is None:
            need = -(-prompt_len // cfg.page_size)
            what = f"a prompt of {prompt_len} tokens needs {need} pages"
        else:  # chunked prefill keeps only the window (and one page of slack)
            need = -(-window // cfg.page_size) + 1
            what = f"a sliding window of {window} tokens needs {need} pages"
        if need > cfg.num_pages:
            return (f"{what} but the cache has num_pages={cfg.num_pages} "
                    f"(page_size={cfg.page_size}): it can never fit")
        return None

    # -------------------------------------------------------------- metrics
    def _record_step(self) -> None:
        pool, sched, ser = self.cache.pool, self.scheduler, self._series
        st = self._stats
        st["peak_pages_in_use"] = max(st["peak_pages_in_use"], pool.num_in_use)
        ser["step"].append(st["steps"])
        ser["running"].append(len(sched.running))
        ser["waiting"].append(len(sched.waiting))
        ser["num_free"].append(pool.num_free)
        ser["num_cached"].append(pool.num_cached)
        ser["num_in_use"].append(pool.num_in_use)
        ser["scheduled_tokens"].append(st["scheduled_tokens"])
        ser["preemptions"].append(sched.num_preemptions)

    @property
    def metrics(self) -> dict:
        """Counters and timings so far, and the per-step ``series`` (lists, one entry a step)."""
        st, cs, sched = self._stats, self.cache.stats(), self.scheduler
        total = st["schedule_s"] + st["model_s"] + st["sample_s"]
        return {
            "steps": st["steps"],
            "generated_tokens": st["generated_tokens"],
            "scheduled_tokens": st["scheduled_tokens"],
            "preemptions": sched.num_preemptions,
            "swapped_out": sched.num_swapped_out,
            "swapped_in": sched.num_swapped_in,
            "evictions": cs["evictions"],
            "cow_copies": cs["cow_copies"],
            # Prompt tokens served by the prefix cache at their first admission...
            "prefix_hit_rate": _ratio(sched.num_prompt_hit_tokens, sched.num_prompt_tokens),
            "prompt_tokens": sched.num_prompt_tokens,
            "prefix_hit_tokens": sched.num_prompt_hit_tokens,
            # ...and, apart, tokens found in the cache again when a preempted request
            # came back (cache.stats()["hit_rate"] counts both together).
            "readmitted_tokens": sched.num_readmitted_tokens,
            "readmitted_hit_tokens": sched.num_readmitted_hit_tokens,
            "peak_pages_in_use": st["peak_pages_in_use"],
            "num_pages": cs["num_pages"],
            "tokens_per_s": st["generated_tokens"] / total if total else 0.0,
            "time_s": total,
            "schedule_s": st["schedule_s"],
            "model_s": st["model_s"],
            "sample_s": st["sample_s"],
            "overhead_fraction": (total - st["model_s"]) / total if total else 0.0,
            "series": {k: list(v) for k, v in self._series.items()},
        }
