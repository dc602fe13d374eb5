"""Lab 8, solved: the engine step. Try the lab (labs/08_step.py) first."""

from paged_np.engine.batching import build_batch


def step(engine):
    """One engine step; returns the RequestOutputs of the requests that finished in it."""
    out = engine.scheduler.schedule()                      # 1. who runs, which slots
    engine.record_admissions(out.admitted)
    for req, reason in out.failed:
        engine.fail(req, reason)
    num_tokens = sum(n for _, n, _ in out.scheduled)
    if out.scheduled:
        batch, _ = build_batch(out.scheduled, engine.cache)             # 2. run
        logits = engine.model.forward(batch, engine.cache,
                                      backend=engine.config.backend)    # [S, V]
        sampling = []
        for req, n, _ in out.scheduled:                                  # 3. append
            c = req.num_computed_tokens
            engine.cache.append_tokens(req.seq_id, req.tokens(c, c + n))
            if req.num_computed_tokens == req.num_tokens:   # caught up: it samples
                sampling.append(req)
        if sampling:
            tokens = engine.sampler(logits, [r.parent.params for r in sampling],
                                    [r.rng for r in sampling])           # 4. sample
            for req, tok in zip(sampling, tokens.tolist()):
                req.sample.token_ids.append(tok)
                params = req.parent.params
                reason = ("stop" if tok in params.stop_token_ids else
                          "length" if len(req.sample.token_ids) >= params.max_tokens
                          else None)
                if reason:                                               # 5. free
                    engine.finish_sample(req.parent.request_id, req.sample.index, reason)
    engine.record_step(0.0, 0.0, 0.0, num_tokens)
    return engine.take_finished()
