"""Lab 8, the engine step itself: ``step(engine)``.

The learner writes one step of continuous batching from the engine's public
pieces: **schedule** (``engine.scheduler.schedule()``: who runs, with how many
tokens and which slots), **run** (``build_batch`` then ``engine.model.forward``:
logits for each sequence that reached the end of what it knows), **append**
(``engine.cache.append_tokens``: those tokens' K/V is written, full pages join
the prefix cache), **sample** (``engine.sampler``) and **free**
(``engine.finish_sample``: a sample that hit a stop token or ``max_tokens``
gives its pages back), then hand back the requests that finished.

How it enters the engine: a function registered in ``ENGINE_STEPS``, called
for every ``engine.step()``. After each step the lab checks that what it
returned had finished and nothing finished was kept back, the cache's
invariants, and that no finished sample still holds pages; the tokens must be
the package's. Samples do not fork in this lab's workloads (``n > 1`` forks
after the prompt inside the package's own post-processing).
"""

from __future__ import annotations

from .report import LabFailure, show

TITLE = "the engine step (schedule, run, append, sample, free)"
FILE = "08_step.py"
FUNCTIONS = ("step",)
BLAME = "step"

HINTS = {
    "step": (
        "A step runs every scheduled sequence's new tokens through the model at once. "
        "Their K/V is written during the forward, so append them to the cache after it. "
        "Only a sequence whose computed tokens now reach everything it knows samples (a "
        "prefill chunk does not), one logits row each, in the order scheduled. A sample "
        "that ends must give its pages back at once: the next step's admissions need them.",
        "out = engine.scheduler.schedule(); engine.record_admissions(out.admitted); fail "
        "out.failed; batch, _ = build_batch(out.scheduled, engine.cache); logits = "
        "engine.model.forward(batch, engine.cache, backend=engine.config.backend); for "
        "req, n, _ in out.scheduled: c = req.num_computed_tokens; "
        "engine.cache.append_tokens(req.seq_id, req.tokens(c, c + n)); keep req if "
        "req.num_computed_tokens == req.num_tokens; tokens = engine.sampler(logits, "
        "[r.parent.params ...], [r.rng ...]); append each to r.sample.token_ids; on a stop "
        "token or max_tokens call engine.finish_sample(r.parent.request_id, "
        "r.sample.index, reason); engine.record_step(0, 0, 0, n_tokens); return "
        "engine.take_finished()."),
}


def call_step(learner, engine) -> list:
    """The learner's step, and what it hands back checked."""
    got = learner.call("step", engine)
    try:
        outs = list(got)
    except TypeError:
        raise LabFailure("step", f"returned {show(got)}: a list of the RequestOutputs "
                                 "finished in this step is due") from None
    for o in outs:
        if not getattr(o, "finished", False):
            raise LabFailure("step", f"returned {getattr(o, 'request_id', o)!r}, which has "
                                     "not finished: return only finished requests "
                                     "(engine.take_finished())")
    kept = engine.take_finished()
    if kept:
        raise LabFailure("step", f"requests finished in this step were not returned: "
                                 f"{[o.request_id for o in kept]} (return "
                                 "engine.take_finished())")
    return outs


def check(learner, rng) -> None:
    """Small toy servers, step by step against the package (pages freed as samples end)."""
    from . import runs
    from .runner import installed

    with installed([swap(learner)]) as options:
        for seed in rng.integers(10**6, size=3):
            w = runs.toy_workload(int(seed), forks=False)
            want = runs.serve(w, {"backend": "numba"}, "the package")
            got = runs.serve(w, {"backend": "numba", **options}, "step")
            runs.compare(w, got, want, "step", ("tokens",))


def swap(learner):
    from ..registry import ENGINE_STEPS
    from .runner import Swap

    def lab_step(engine):
        return call_step(learner, engine)

    return Swap(entries=[(ENGINE_STEPS, lab_step)], forks=False)
