"""The engine with its model taken out: what both simulations run a trace through.

A simulation knows every token in advance (a trace of token ids,
:mod:`.workloads`), so nothing has to be computed; what it measures is the
bookkeeping: which requests the engine admits, preempts and finishes, which
pages they hold, which prefixes they reuse. So the simulations run the
engine's own parts, not copies of them:

- the memory figures (:func:`paged_np.sim.simulate.serve_paged`) drive the
  engine's :class:`~paged_np.engine.scheduler.Scheduler` over the real
  :class:`~paged_np.PagedKVCache` directly, one :func:`trace_request` per
  trace request, and count the pages between a step's writes and its
  finishes;
- the prefix-cache comparison (:mod:`.prefix`) runs a whole
  :class:`~paged_np.Engine`, stepped by :func:`trace_step`: the engine's
  schedule and post-processing (append, sample, finish), with the model's
  forward pass replaced by the trace's next token.

Either way the arena is :data:`TINY_MODEL`'s (one layer, one head of size
2): its memory is negligible, and no K/V is ever written into it.

What the Scheduler lacks, the memory figures add through the cache seam
(:data:`paged_np.registry.KV_CACHES`: a subclass of the cache):
:class:`WatermarkCache`, vLLM v0's admission watermark.
"""

from __future__ import annotations

import functools
import time

import numpy as np

from ..cache.kv_cache import PagedKVCache
from ..config import ModelConfig
from ..engine.outputs import RequestOutput, SampleOutput
from ..engine.request import ParentRequest, Request
from ..engine.sampling import SamplingParams
from . import workloads as wl

__all__ = ["TINY_MODEL", "WatermarkCache", "stand_in_model", "trace_request", "trace_step"]

#: The shapes the cache needs from a model; nothing is computed, so the least of each:
#: the arena is negligible and the bookkeeping is what is measured.
TINY_MODEL = ModelConfig(vocab_size=wl.VOCAB_SIZE, hidden_size=2, num_layers=1, num_heads=1,
                         num_kv_heads=1, head_dim=2, intermediate_size=1)


class WatermarkCache(PagedKVCache):
    """The real cache, whose admission check keeps ``watermark_pages`` pages free.

    vLLM v0's block manager admits a waiting request only if, after taking its
    pages, ``watermark`` (1%) of all pages are still free, so that the running
    requests have room to grow before anyone must be preempted; growing
    (decode) may use those pages. The engine's Scheduler has no such option:
    it asks the cache ``can_allocate`` both when admitting and when growing.
    So the watermark goes where vLLM v0 keeps it, in the cache's answer, and
    applies to a sequence that :meth:`add_sequence` has just started and that
    has not been given slots yet: one being admitted.
    """

    def __init__(self, cfg, watermark_pages: int = 0):
        super().__init__(cfg, record_events=False)
        self.watermark_pages = watermark_pages
        self._admitting: set = set()         # started, no slots yet: asking to be admitted

    def add_sequence(self, seq_id, prompt, extra_key=None) -> int:
        n_hit = super().add_sequence(seq_id, prompt, extra_key)
        self._admitting.add(seq_id)
        return n_hit

    def can_allocate(self, seq_id, n: int) -> bool:
        keep = self.watermark_pages if seq_id in self._admitting else 0
        return self.num_pages_needed(seq_id, n) + keep <= self.num_available_pages

    def allocate_slots(self, seq_id, n: int) -> np.ndarray:
        slots = super().allocate_slots(seq_id, n)      # int64 [n]
        self._admitting.discard(seq_id)                # admitted: it grows freely now
        return slots

    def free(self, seq_id) -> None:
        super().free(seq_id)
        self._admitting.discard(seq_id)


def trace_request(index: int, prompt: list, num_output: int) -> Request:
    """The Scheduler's record of trace request ``index`` (one greedy sample, ``num_output``
    tokens, no stop token); its cache sequence id is ``index``."""
    params = SamplingParams(max_tokens=num_output, temperature=0.0)
    output = RequestOutput(index, prompt, [SampleOutput(0)])
    parent = ParentRequest(index, index, prompt, params, output)
    return Request(index, parent, output.samples[0], rng=None)


@functools.cache
def stand_in_model():
    """The model an Engine is built around here: a tiny random LlamaModel that never runs.

    The engine reads its config (the vocabulary prompts are checked against,
    no sliding window); :func:`trace_step` never calls its ``forward``.
    """
    from ..models.llama import LlamaModel

    return LlamaModel.random(TINY_MODEL)


def trace_step(engine, outputs: dict) -> tuple[list, int]:
    """One :meth:`Engine.step <paged_np.Engine.step>` whose model is the trace.

    The engine's step (:func:`~paged_np.engine.engine.continuous_batching_step`)
    is 1. schedule, 2. build the batch, 3. run the model, 4. post-process.
    Here 1 and 4 are the engine's own; 2 and 3 become one row of logits per
    sequence that samples now (float32 ``[S, V]``), zero except at that
    request's next token in the trace, so the engine's greedy sampler returns
    it. ``outputs[request_id]`` is the trace's output tokens for each request
    (its ``max_tokens`` ends it after the last one).

    Returns the requests finished in this step (:class:`~paged_np.engine.outputs.RequestOutput`)
    and the prompt tokens it computed (a count the engine does not keep:
    prompts computed again after a preemption count again).
    """
    t0 = time.perf_counter()
    out = engine.scheduler.schedule()                                # 1
    engine.record_admissions(out.admitted)
    for req, reason in out.failed:
        engine.fail(req, reason)
    prompt_tokens = sum(max(0, min(req.num_computed_tokens + n, len(req.parent.prompt))
                            - req.num_computed_tokens) for req, n, _ in out.scheduled)
    # Who samples now: a sequence whose step reaches the end of what it knows.
    nexts = [outputs[req.parent.request_id][len(req.sample.token_ids)]
             for req, n, _ in out.scheduled
             if req.num_computed_tokens + n == req.num_tokens]      # [S]
    logits = np.zeros((len(nexts), engine.model.cfg.vocab_size), np.float32)  # [S, V]
    logits[np.arange(len(nexts)), nexts] = 1.0                      # 2, 3: the trace
    t1 = time.perf_counter()
    if out.scheduled:
        engine.postprocess(out.scheduled, logits)                   # 4
    engine.record_step(t1 - t0, 0.0, time.perf_counter() - t1,
                       sum(n for _, n, _ in out.scheduled))
    return engine.take_finished(), prompt_tokens
