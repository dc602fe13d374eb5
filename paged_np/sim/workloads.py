"""Synthetic request traces for the serving simulation (``python -m paged_np simulate``).

Real traces (ShareGPT conversations, Alpaca instructions) are not shipped with
this package, so the simulation draws requests from distributions fitted to
the statistics the vLLM paper publishes (Kwon et al., SOSP 2023, Fig. 11):

============  ==================  ===================
dataset       mean input tokens   mean output tokens
============  ==================  ===================
ShareGPT      161.31              337.99
Alpaca        19.31               58.45
============  ==================  ===================

The paper also says ShareGPT has "8.4x longer input prompts and 5.8x longer
outputs on average than Alpaca, with higher variance", and its histograms are
right-skewed with long tails. We model every length as a **rounded, clipped
log-normal**: ``L = clip(round(exp(N(mu, sigma^2))), 1, max_len)``.

- ``sigma`` (the spread) is our choice, read off the shape of the paper's
  histograms; the paper publishes no variance. ShareGPT: input 1.1, output
  0.8. Alpaca: input 0.6, output 0.9.
- ``mu`` is then solved (bisection on the closed-form mean of a clipped
  log-normal, :func:`clipped_lognormal_mean`) so that the mean of the
  *clipped* distribution equals the published mean exactly. The sample means
  of a drawn trace differ from it by sampling noise only; the simulation
  reports them beside the published ones.
- ``max_len`` is 1024 for inputs and for outputs, so every request fits the
  2048-token context of the paper's OPT models (the vLLM benchmark filters
  ShareGPT the same way).

Beyond plain requests this module builds the shapes of work that make pages
shareable:

- :func:`chat_trace`: multi-turn chats. Every conversation starts with one of
  a few system prompts (popular ones more often) and each turn's prompt is the
  whole history so far plus a new user message: turn ``t+1`` extends turn
  ``t``'s prompt *and reply*, so prefix caching can reuse both.
- :func:`fewshot_trace`: few-shot prompts, a task's shared block of examples
  followed by one question.
- :func:`branching_trace` (tree of thought: each thought's follow-ups extend
  it) and :func:`system_prompt_trace` (a few long system prompts, many short
  questions), the other two workloads of the SGLang paper; with
  :func:`chat_parents`, the request each one must wait for.
- :func:`beam_search_tree`: the token tree of beam search of width ``k`` over
  a random language model: which beam each new beam extends, step by step, so
  the simulation can fork and free sequences exactly as a beam-search server
  does (the tree grows, and branches that fall out of the top ``k`` are pruned).
- Parallel sampling needs no generator of its own: ``n`` samples share one
  request's prompt and each writes its own ``output_len`` tokens.

Every function takes a ``numpy.random.Generator``: the same seed gives the
same trace, on every machine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidArgument

VOCAB_SIZE = 32000  # token ids are drawn from [0, VOCAB_SIZE), like a Llama tokenizer


# --------------------------------------------------------------------------- lengths
@dataclass(frozen=True)
class LengthModel:
    """Input and output length distributions of one dataset (clipped log-normals)."""

    name: str
    input_mean: float  # the published mean the clipped distribution matches
    input_sigma: float
    output_mean: float
    output_sigma: float
    max_input: int = 1024
    max_output: int = 1024


SHAREGPT = LengthModel("sharegpt", 161.31, 1.1, 337.99, 0.8)
ALPACA = LengthModel("alpaca", 19.31, 0.6, 58.45, 0.9)
DATASETS = {"sharegpt": SHAREGPT, "alpaca": ALPACA}


def _normal_cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def clipped_lognormal_mean(mu: float, sigma: float, lo: float, hi: float) -> float:
    """Mean of ``clip(X, lo, hi)`` for ``X = exp(N(mu, sigma^2))``, in closed form.

    Split the line at ``lo`` and ``hi``: below ``lo`` the value is ``lo``,
    above ``hi`` it is ``hi``, in between it is ``X`` itself, whose partial
    expectation is ``exp(mu + sigma^2/2) * [Phi(z_hi - sigma) - Phi(z_lo - sigma)]``
    with ``z = (ln x - mu) / sigma``.
    """
    z_lo = (math.log(lo) - mu) / sigma
    z_hi = (math.log(hi) - mu) / sigma
    body = math.exp(mu + sigma * sigma / 2) * (
        _normal_cdf(z_hi - sigma) - _normal_cdf(z_lo - sigma))
    return lo * _normal_cdf(z_lo) + body + hi * (1.0 - _normal_cdf(z_hi))


def solve_mu(mean: float, sigma: float, lo: float, hi: float) -> float:
    """The ``mu`` whose clipped log-normal has this mean (bisection; the mean grows with mu)."""
    if not lo < mean < hi:
        raise InvalidArgument(f"mean must lie in ({lo}, {hi}), got {mean}")
    a, b = math.log(lo) - 10 * sigma, math.log(hi) + 10 * sigma
    for _ in range(200):
        m = (a + b) / 2
        if clipped_lognormal_mean(m, sigma, lo, hi) < mean:
            a = m
        else:
            b = m
    return (a + b) / 2


def sample_lengths(model: LengthModel, n: int, rng: np.random.Generator):
    """Draw ``n`` (input, output) length pairs: two int64 [n] arrays."""
    out = []
    for mean, sigma, hi in ((model.input_mean, model.input_sigma, model.max_input),
                            (model.output_mean, model.output_sigma, model.max_output)):
        mu = solve_mu(mean, sigma, 1.0, float(hi))
        x = rng.lognormal(mu, sigma, size=n)  # [n] continuous lengths
        out.append(np.clip(np.rint(x), 1, hi).astype(np.int64))  # [n] tokens, in [1, hi]
    return out[0], out[1]


# --------------------------------------------------------------------------- requests
@dataclass(frozen=True)
class Request:
    """One request of a trace: its prompt and the reply it will generate.

    ``output`` is known in advance (a simulation replays it; a real server
    would sample it). ``group`` names what the request shares a prefix with
    (a conversation, a few-shot task), for plots and tests.
    """

    req_id: int
    prompt: np.ndarray  # int64 [input_len]
    output: np.ndarray  # int64 [output_len]
    group: str = ""

    @property
    def input_len(self) -> int:
        return len(self.prompt)

    @property
    def output_len(self) -> int:
        return len(self.output)

    @property
    def total_len(self) -> int:
        return len(self.prompt) + len(self.output)


def random_tokens(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` token ids drawn uniformly from ``[0, VOCAB_SIZE)``: no two draws share a page."""
    return rng.integers(0, VOCAB_SIZE, size=n, dtype=np.int64)  # [n]


def sample_requests(model: LengthModel, n: int, rng: np.random.Generator) -> list[Request]:
    """``n`` independent requests with random tokens (no two share a page of prefix)."""
    ins, outs = sample_lengths(model, n, rng)
    return [Request(i, random_tokens(rng, int(a)), random_tokens(rng, int(b)), model.name)
            for i, (a, b) in enumerate(zip(ins, outs))]


def zipf_weights(n: int, s: float = 1.0) -> np.ndarray:
    """Probabilities of ``n`` items, the ``i``-th (from 0) in proportion to ``1 / (i + 1)^s``."""
    w = 1.0 / np.arange(1, n + 1) ** s  # [n] popularity of item i ~ 1 / (i+1)^s
    return w / w.sum()


def chat_trace(rng: np.random.Generator, num_conversations: int = 60,
               num_system_prompts: int = 4, system_len: tuple = (200, 600),
               mean_turns: float = 5.0, user_mean: float = 60.0, reply_mean: float = 200.0,
               max_context: int = 2048, mean_gap: float = 1.0,
               mean_think: float = 10.0) -> list[Request]:
    """Multi-turn chats, interleaved in arrival order.

    - ``num_system_prompts`` system prompts with lengths uniform in
      ``system_len``; conversation ``c`` uses prompt ``i`` with Zipf(1)
      probability, so one prompt is popular and the others less so.
    - Turns per conversation: geometric with mean ``mean_turns``. User
      messages and replies: log-normal lengths (sigma 0.8) with means
      ``user_mean`` and ``reply_mean``, clipped to [1, 512]. A conversation
      ends early once its context would pass ``max_context`` tokens.
    - Time: conversations start ``Exp(mean_gap)`` apart; a user answers a
      reply after ``Exp(mean_think)``. Requests are returned sorted by arrival
      time, so turns of different conversations interleave (``mean_think /
      mean_gap`` conversations are live at once, roughly): the cache must hold
      many histories to reuse them.

    Turn ``t``'s prompt is system + (user, reply) of every earlier turn + the
    new user message; its ``output`` is the reply.
    """
    systems = [random_tokens(rng, int(rng.integers(system_len[0], system_len[1] + 1)))
               for _ in range(num_system_prompts)]
    pop = zipf_weights(num_system_prompts)
    mu_u, mu_r = (solve_mu(m, 0.8, 1.0, 512.0) for m in (user_mean, reply_mean))
    events = []  # (arrival time, conversation, turn, prompt, reply)
    start = 0.0
    for c in range(num_conversations):
        start += rng.exponential(mean_gap)
        s = int(rng.choice(num_system_prompts, p=pop))
        history = systems[s]
        t = start
        for turn in range(int(rng.geometric(1.0 / mean_turns))):
            user = random_tokens(rng, int(np.clip(np.rint(rng.lognormal(mu_u, 0.8)), 1, 512)))
            reply = random_tokens(rng, int(np.clip(np.rint(rng.lognormal(mu_r, 0.8)), 1, 512)))
            prompt = np.concatenate([history, user])  # [len(history) + len(user)]
            if len(prompt) + len(reply) > max_context:
                break
            events.append((t, c, turn, prompt, reply))
            history = np.concatenate([prompt, reply])  # the next turn extends all of it
            t += rng.exponential(mean_think)
    events.sort(key=lambda e: (e[0], e[1]))
    return [Request(i, p, r, f"chat{c}") for i, (_, c, _, p, r) in enumerate(events)]


def fewshot_trace(rng: np.random.Generator, num_requests: int = 200, num_tasks: int = 8,
                  shots: int = 5, example_mean: float = 60.0, question_mean: float = 30.0,
                  answer_mean: float = 40.0) -> list[Request]:
    """Few-shot prompts: a task's ``shots`` examples (shared prefix) + one question.

    Each task's example block is fixed; requests pick a task with Zipf(1)
    probability. Example, question and answer lengths are log-normal (sigma
    0.6) with the given means, clipped to [1, 512].
    """
    def length(mean):
        return int(np.clip(np.rint(rng.lognormal(solve_mu(mean, 0.6, 1.0, 512.0), 0.6)), 1, 512))

    prefixes = [np.concatenate([random_tokens(rng, length(example_mean)) for _ in range(shots)])
                for _ in range(num_tasks)]
    pop = zipf_weights(num_tasks)
    reqs = []
    for i in range(num_requests):
        task = int(rng.choice(num_tasks, p=pop))
        prompt = np.concatenate([prefixes[task], random_tokens(rng, length(question_mean))])
        reqs.append(Request(i, prompt, random_tokens(rng, length(answer_mean)), f"task{task}"))
    return reqs


# ------------------------------------------------- SGLang-shaped traces (with parents)
def branching_trace(rng: np.random.Generator, num_problems: int = 12, branch: int = 3,
                    problem_len: tuple = (150, 400), thought_mean: float = 60.0,
                    prompt_extra: int = 12) -> tuple[list, list]:
    """Tree of thought: ``branch`` thoughts per problem, ``branch`` follow-ups per thought.

    Returns ``(requests, parent)``: ``parent[i]`` is the request whose output
    request ``i``'s prompt extends (it can start only after that one
    finishes), or -1. Thoughts have log-normal lengths (sigma 0.6).
    """
    mu = solve_mu(thought_mean, 0.6, 1.0, 512.0)

    def thought():
        return random_tokens(rng, int(np.clip(np.rint(rng.lognormal(mu, 0.6)), 1, 512)))

    reqs, parent = [], []
    for p in range(num_problems):
        problem = random_tokens(rng, int(rng.integers(problem_len[0], problem_len[1] + 1)))
        firsts = []
        for _ in range(branch):
            firsts.append(len(reqs))
            reqs.append(Request(len(reqs), problem, thought(), f"problem{p}"))
            parent.append(-1)
        for f in firsts:
            r = reqs[f]
            base = np.concatenate([r.prompt, r.output, random_tokens(rng, prompt_extra)])
            for _ in range(branch):
                reqs.append(Request(len(reqs), base, thought(), f"problem{p}"))
                parent.append(f)
    return reqs, parent


def system_prompt_trace(rng: np.random.Generator, num_requests: int = 160, num_systems: int = 3,
                        system_len: tuple = (600, 1000), question: tuple = (10, 80),
                        answer: tuple = (20, 120)) -> list:
    """Long shared system prompts (Zipf(1) popularity) + a short question each."""
    systems = [random_tokens(rng, int(rng.integers(*system_len))) for _ in range(num_systems)]
    pop = zipf_weights(num_systems)
    out = []
    for i in range(num_requests):
        s = int(rng.choice(num_systems, p=pop))
        prompt = np.concatenate([systems[s], random_tokens(rng, int(rng.integers(*question)))])
        out.append(Request(i, prompt, random_tokens(rng, int(rng.integers(*answer))), f"sys{s}"))
    return out


def chat_parents(trace) -> list:
    """``parent[i]``: the previous turn of request ``i``'s conversation, or -1.

    A chat turn's prompt holds the previous turn's reply, so it can be sent
    only once that turn has finished (:func:`chat_trace`'s order alone does
    not say so).
    """
    last: dict = {}
    parent = []
    for i, r in enumerate(trace):
        parent.append(last.get(r.group, -1))
        last[r.group] = i
    return parent


# --------------------------------------------------------------------------- beam search
#: How often a beam's next token is a near-tie, per dataset: calibrated (see below).
BEAM_AMBIGUITY = {"sharegpt": 0.04, "alpaca": 0.25}


def beam_search_tree(width: int, num_steps: int, rng: np.random.Generator,
                     ambiguity: float = 0.04, vocab: int = 8):
    """The token tree that beam search of ``width`` k grows over a random language model.

    The model is *mostly confident*: at every step each live beam's next-token
    distribution has one clear favourite, and with probability ``ambiguity``
    a near-tie for second place. Concretely the sorted logits of a beam are
    ``0, -g1, -g1-g2, ...`` with gaps ``g_j = 1 + Exp(1)`` except the first:
    ``Exp(0.2)`` (a near-tie) with probability ``ambiguity``, else
    ``3 + Exp(1)``; log-softmax turns them into log-probs. The new beams are
    the top ``k`` of the ``k * vocab`` candidates ``score[i] + logp[i, v]``:
    a near-tie lets one beam place two children, which pushes the weakest
    beam out (pruned), so the beams' histories merge again some steps back.
    Fewer near-ties, longer private histories, less sharing.

    Why this model: with i.i.d. random logits beams re-merge within a few
    steps whatever the temperature, which overstates sharing. The paper
    publishes no beam statistics, so ``ambiguity`` is calibrated per dataset
    (:data:`BEAM_AMBIGUITY`) to land near the paper's width-2 savings; the
    widths 4 and 6 are then predictions.

    The first step expands the prompt alone (there is one live beam).

    Returns
    -------
    parents : int64 [num_steps, k]
        ``parents[t, j]``: which beam of step ``t-1`` new beam ``j`` extends
        (at ``t = 0`` always beam 0, the prompt).
    tokens : int64 [num_steps, k]
        The token new beam ``j`` appends, in ``[0, vocab)``.
    """
    if width < 1 or num_steps < 0 or vocab < width or not 0.0 <= ambiguity <= 1.0:
        raise InvalidArgument(f"need width >= 1, num_steps >= 0, vocab >= width and "
                              f"ambiguity in [0, 1]; got width={width}, num_steps={num_steps}, "
                              f"vocab={vocab}, ambiguity={ambiguity}")
    k = width
    parents = np.zeros((num_steps, k), dtype=np.int64)
    tokens = np.zeros((num_steps, k), dtype=np.int64)
    # Step 0 has a single live beam: the others start far below it (finite, not -inf).
    score = np.full(k, -1e9)  # [k]
    score[0] = 0.0
    for t in range(num_steps):
        gaps = 1.0 + rng.exponential(1.0, size=(k, vocab - 1))  # [k, V-1]
        tie = rng.random(k) < ambiguity  # [k] beams with a near-tie this step
        gaps[:, 0] = np.where(tie, rng.exponential(0.2, size=k), 3.0 + rng.exponential(1.0, size=k))
        z = np.zeros((k, vocab))  # [k, V] logits, best token first
        z[:, 1:] = -np.cumsum(gaps, axis=1)
        logp = z - np.logaddexp.reduce(z, axis=1, keepdims=True)  # [k, V] log-softmax
        cand = (score[:, None] + logp).ravel()  # [k * V] candidate scores
        best = np.argsort(-cand, kind="stable")[:k]  # [k] winners, best first
        parents[t], tokens[t] = best // vocab, best % vocab
        score = cand[best]
    return parents, tokens
