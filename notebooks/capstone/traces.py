"""The capstone's two stress traces, drawn afresh from a seed at every check.

``check.py`` judges a policy on the four SGLang-shaped traces of
``paged_np.sim.prefix`` (the ones ``python -m paged_np simulate --prefix-cache``
reports) *and* on these two, whose shapes are known but whose draw is not:
each run of the checker picks a new seed (printed, so a result can be
reproduced with ``--seed``), so a policy tuned to one draw gains nothing.

- :func:`scan_trace`: a few shared system prompts hit over and over, with a
  *scan* between rounds: long one-off documents read once and never again
  (a batch summarization job sharing the server). The scan's pages are the
  youngest when the next round comes, so LRU evicts the popular prompts to
  keep them; a policy that knows a page was never reused keeps the prompts.
- :func:`shift_trace`: eight system prompts in use, then eight new ones
  (the product changed its prompts): a *popularity shift*. A policy that
  ranks by hit count alone keeps the first eight, hit many times and never
  needed again, and starves the new ones.

Each returns ``(requests, parent, num_pages)``: the requests (no request
waits for another, so ``parent`` is all -1) and the cache size the checker
serves them in, tight on purpose: the shared prompts fit with the running
requests' own pages, the scan or the old prompts do not. The checker serves
them with four requests running at once (``MAX_RUNNING``), so that pages
spend time CACHED, where the policy decides.
"""

from __future__ import annotations

import numpy as np

from paged_np.sim import workloads as wl

MAX_RUNNING = 4     # seats: few, so that shared pages are CACHED between their uses
PAGE = 16


def _pages(n_tokens: int) -> int:
    return -(-n_tokens // PAGE)


def _question(rng, system: np.ndarray, group: str, index: int) -> wl.Request:
    """A short question after a shared system prompt, and a short answer."""
    prompt = np.concatenate([system, wl.random_tokens(rng, int(rng.integers(10, 60)))])
    return wl.Request(index, prompt, wl.random_tokens(rng, int(rng.integers(8, 40))), group)


def scan_trace(rng: np.random.Generator, rounds: int = 12, num_systems: int = 4,
               questions: int = 8, documents: int = 6):
    """Rounds of ``questions`` short questions on ``num_systems`` popular system prompts
    (Zipf(0.5)), each round followed by ``documents`` one-off documents of 400-900 tokens."""
    systems = [wl.random_tokens(rng, int(rng.integers(300, 500))) for _ in range(num_systems)]
    pop = wl.zipf_weights(num_systems, 0.5)
    reqs: list = []
    for _ in range(rounds):
        for _ in range(questions):
            s = int(rng.choice(num_systems, p=pop))
            reqs.append(_question(rng, systems[s], f"sys{s}", len(reqs)))
        for _ in range(documents):
            doc = wl.random_tokens(rng, int(rng.integers(400, 900)))
            reqs.append(wl.Request(len(reqs), doc, wl.random_tokens(rng, int(rng.integers(8, 30))),
                                   "scan"))
    biggest = max(r.total_len for r in reqs)
    # The system prompts, and every running request at its biggest: nothing for the scan.
    pages = sum(len(s) for s in systems) // PAGE + MAX_RUNNING * _pages(biggest)
    return reqs, [-1] * len(reqs), pages


def shift_trace(rng: np.random.Generator, per_phase: int = 120, num_systems: int = 8):
    """Two phases of ``per_phase`` questions, each on its own ``num_systems`` system prompts
    of 150-300 tokens (Zipf(0.5)); no prompt of the first phase returns in the second."""
    reqs: list = []
    for phase in range(2):
        systems = [wl.random_tokens(rng, int(rng.integers(150, 300))) for _ in range(num_systems)]
        pop = wl.zipf_weights(num_systems, 0.5)
        for _ in range(per_phase):
            s = int(rng.choice(num_systems, p=pop))
            reqs.append(_question(rng, systems[s], f"phase{phase}-sys{s}", len(reqs)))
    biggest = max(r.total_len for r in reqs)
    # One phase's prompts and two requests' own pages: not both phases' prompts.
    pages = sum(len(s) for s in systems) // PAGE + 2 * _pages(biggest)
    return reqs, [-1] * len(reqs), pages


HIDDEN = {"scan": scan_trace, "shift": shift_trace}


def make_hidden(seed: int) -> dict:
    """``{name: (requests, parent, num_pages)}`` for the two stress traces of this seed."""
    return {name: make(np.random.default_rng([seed, k]))
            for k, (name, make) in enumerate(HIDDEN.items())}
