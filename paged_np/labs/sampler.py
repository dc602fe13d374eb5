"""Lab 7, the sampler: ``probabilities(logits, temperature, top_p)`` and
``sample(logits, params, rngs)``.

The learner turns a row of logits into the next token the way vLLM does for
the knobs most requests use: greedy (``temperature == 0``: the argmax), else
the logits divided by the temperature, a softmax, the nucleus (the smallest
set of most likely tokens whose probability reaches ``top_p``, renormalised),
and **one** uniform draw from the request's own generator. One draw per
sampled token is what makes a seeded request reproducible whoever shares its
batch and however often it is preempted: its generator advances only when it
samples.

How it enters the engine: a function registered in ``SAMPLERS``
(``fn(logits [S, V], params, rngs) -> int64 [S]``). Each call is checked where
it is made: the package's sampler runs first on copies of the generators, and
the learner's tokens, and where each generator ended up, must be the same.
"""

from __future__ import annotations

import copy

import numpy as np

from ..engine.sampling import SamplingParams, probs, sample_tokens
from .report import LabFailure, expect, show

TITLE = "the sampler (greedy, temperature, top-p)"
FILE = "07_sampler.py"
FUNCTIONS = ("probabilities", "sample")
BLAME = "sample"

HINTS = {
    "probabilities": (
        "Dividing by the temperature sharpens (< 1) or flattens (> 1) the softmax. Top-p "
        "keeps the most likely tokens until their mass reaches top_p (the token that "
        "crosses it stays in), then renormalises. Work in float64; subtract the max "
        "before exp.",
        "x = logits.astype(np.float64) / temperature; p = np.exp(x - x.max()); p /= "
        "p.sum(); order = np.argsort(-p, kind='stable'); keep = np.searchsorted("
        "np.cumsum(p[order]), top_p) + 1; zero the rest, divide by the new sum."),
    "sample": (
        "A greedy row takes the argmax and draws nothing. Any other row draws exactly one "
        "uniform u from its own generator and takes the first token whose cumulative "
        "probability passes u times the total.",
        "tokens = np.argmax(logits, axis=1); for each row i not greedy: p = "
        "probabilities(logits[i], params[i].temperature, params[i].top_p); cdf = "
        "np.cumsum(p); tokens[i] = min(np.searchsorted(cdf, rngs[i].random() * cdf[-1], "
        "side='right'), len(cdf) - 1)."),
}


def call_probabilities(learner, logits, temperature, top_p) -> np.ndarray:
    case = f"logits={show(logits)}, temperature={temperature}, top_p={top_p}"
    got = learner.call("probabilities", logits.copy(), temperature, top_p, case=case)
    want = probs(logits, SamplingParams(temperature=temperature, top_p=top_p))
    expect("probabilities", case, np.asarray(got, dtype=np.float64)
           if np.shape(got) == want.shape else got, want, atol=1e-9, rtol=1e-6)
    return want


def call_sample(learner, logits, params, rngs) -> np.ndarray:
    """The learner's tokens, checked against the package's on copies of the generators."""
    copies = [copy.deepcopy(r) for r in rngs]
    want = sample_tokens(logits, params, copies)
    rows = "; ".join(f"row {i}: " + ("greedy" if p.greedy else
                                     f"temperature={p.temperature}, top_p={p.top_p}")
                     for i, p in enumerate(params))
    case = f"{len(params)} rows of {logits.shape[1]} logits ({rows})"
    got = learner.call("sample", logits.copy(), list(params), list(rngs), case=case)
    arr = np.asarray(got)
    if arr.shape != want.shape or arr.dtype.kind not in "iu":
        raise LabFailure("sample", [f"returned {show(got)}",
                                    f"expected int64 token ids of shape {list(want.shape)}: "
                                    f"{show(want)}"], case)
    for i, (mine, ref) in enumerate(zip(rngs, copies)):
        if mine.bit_generator.state != ref.bit_generator.state:
            raise LabFailure("sample", [
                f"row {i}'s generator did not end where the package's did: draw exactly one "
                "number (rng.random()) per sampled token, none for a greedy row",
                f"returned: {show(got)}", f"expected: {show(want)}"], case)
    expect("sample", case, arr.astype(np.int64), want)
    return arr.astype(np.int64)


def check(learner, rng) -> None:
    """Random rows, then the hidden ones: ties, a tiny top_p, a cold temperature."""
    for _ in range(25):
        v = int(rng.integers(2, 40))
        logits = (rng.normal(size=v) * rng.uniform(0.5, 4)).astype(np.float32)
        call_probabilities(learner, logits, float(rng.choice([0.3, 0.7, 1.0, 1.5])),
                           float(rng.choice([1.0, 0.95, 0.8, 0.5, 0.2])))
    tied = np.array([1.0, 3.0, 3.0, 0.5, 3.0], np.float32)       # equal logits: lowest id
    for top_p in (0.3, 0.5, 0.7, 1.0):
        call_probabilities(learner, tied, 1.0, top_p)
    call_probabilities(learner, np.array([2.0, 1.0, 0.0], np.float32), 0.05, 0.9)
    call_probabilities(learner, np.array([0.1, 0.2, 5.0, 0.3], np.float32), 1.0, 1e-6)
    for _ in range(15):
        s, v = int(rng.integers(1, 6)), int(rng.integers(2, 50))
        logits = (rng.normal(size=(s, v)) * 2).astype(np.float32)
        params = [SamplingParams(temperature=0.0) if rng.random() < 0.3 else
                  SamplingParams(temperature=float(rng.choice([0.5, 1.0, 1.3])),
                                 top_p=float(rng.choice([1.0, 0.9, 0.6])))
                  for _ in range(s)]
        rngs = [np.random.default_rng([int(rng.integers(100)), i]) for i in range(s)]
        call_sample(learner, logits, params, rngs)


def swap(learner):
    from ..registry import SAMPLERS
    from .runner import Swap

    def lab_sampler(logits, params, rngs):
        return call_sample(learner, logits, params, rngs)

    return Swap(entries=[(SAMPLERS, lab_sampler)])
