"""Lab 8: the engine step itself (schedule, run, append, sample, free).

Run it:  python -m paged_np lab step --solution labs/08_step.py

One ``engine.step()`` is one forward pass of the model over every running
request's new tokens: continuous batching, where requests join and leave the
batch at any step. You write the step from the engine's public pieces:

1. **schedule**: ``out = engine.scheduler.schedule()`` gives ``out.scheduled``,
   ``(req, n, slots)`` triples (req's next n tokens, and the slots their K/V goes
   to), ``out.admitted`` (pass it to ``engine.record_admissions``) and
   ``out.failed``, ``(req, reason)`` pairs that can never run (``engine.fail(req,
   reason)``);
2. **run**: ``batch, _ = build_batch(out.scheduled, engine.cache)``, then
   ``logits = engine.model.forward(batch, engine.cache,
   backend=engine.config.backend)``: one row per request whose computed tokens
   now reach everything it knows (a prefill chunk short of the end gets none), in
   the order scheduled;
3. **append**: those n tokens' K/V is now written: ``engine.cache.append_tokens(
   req.seq_id, req.tokens(c, c + n))`` with ``c = req.num_computed_tokens`` read
   *before* the append (the cache's count, which grows by n);
4. **sample**: ``engine.sampler(rows, [r.parent.params ...], [r.rng ...])``, one
   token per row; append each to ``r.sample.token_ids``;
5. **free**: a sample whose token is one of ``params.stop_token_ids`` (reason
   "stop") or that has ``params.max_tokens`` tokens (reason "length") ends:
   ``engine.finish_sample(r.parent.request_id, r.sample.index, reason)`` takes it
   out of the scheduler and gives its pages back.

Then ``engine.record_step(0.0, 0.0, 0.0, num_tokens)`` (the step's counters; the
times may be 0) and return ``engine.take_finished()``.
"""

import numpy as np  # noqa: F401

from paged_np.engine.batching import build_batch  # noqa: F401  (you will want it)


def step(engine):
    """One engine step; returns the RequestOutputs of the requests that finished in it."""
    raise NotImplementedError        # your code here (about twenty lines)
