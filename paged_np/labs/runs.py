"""Serve a fixed workload through the real engine and record what a learner must match.

A lab runs the same requests twice: once on the package's own pieces (the
reference, kept for the rest of the process) and once with the learner's
pieces swapped in. Two workloads:

- **SmolLM2 chats**: three short chats (the third repeats the first, so the
  same prefix arrives twice in one step), in an arena too small to hold them
  all: prefix hits, eviction and preemption on a real model;
- **a toy workload**: a tiny random model and a dozen random requests built
  from a few shared openings (duplicates, prompts that end on a page boundary,
  samples that fork when the lab allows it), in a cramped arena. Its seed is
  printed, so a failing run can be replayed with ``--seed``.

While serving, after every step: the cache's invariants hold
(:meth:`~paged_np.PagedKVCache.check_invariants`) and no finished sample
still holds pages. At the end: every page is free or cached (none leaked).
:func:`compare` then holds the learner's run against the reference: every
token of every sample, and, for the labs that decide them, the pages evicted
and who was preempted, step by step.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field

import numpy as np

from .report import LabFailure, NotDoneYet, first_difference

CHATS = ("What is the capital of France?", "Name three colors.",
         "What is the capital of France?")


@dataclass
class Workload:
    """Requests to serve: prompts (token ids), their params and a label each, on a model."""

    name: str
    model: object
    tokenizer: object
    prompts: list
    params: list
    labels: list
    options: dict                    # the engine options of both runs (the seams aside)


@dataclass
class Trace:
    """What one run did: tokens per sample, pages evicted in order, and per step who
    was admitted and who preempted."""

    tokens: dict = field(default_factory=dict)       # (request id, sample) -> [ids]
    evictions: list = field(default_factory=list)
    steps: list = field(default_factory=list)        # [(admitted ids, preempted ids)]


def smollm2_workload(model, tokenizer, max_tokens: int = 8, forks: bool = False) -> Workload:
    """Three chats; with ``forks``, the second is sampled twice (seeded, n=2)."""
    import paged_np as pnp

    prompts = [tokenizer.encode(tokenizer.apply_chat_template([{"role": "user",
                                                                "content": c}]))
               for c in CHATS]
    greedy = pnp.SamplingParams(max_tokens=max_tokens, temperature=0.0)
    params = [greedy] * len(prompts)
    if forks:
        params[1] = pnp.SamplingParams(max_tokens=max_tokens, temperature=0.8, top_p=0.9,
                                       seed=1, n=2)
    labels = [f"chat {i} ({c!r})" for i, c in enumerate(CHATS)]
    options = dict(page_size=8, num_pages=14, max_num_seqs=4, max_num_batched_tokens=256)
    name = "SmolLM2 chats" + (" (chat 1 sampled twice)" if forks else "")
    return Workload(name, model, tokenizer, prompts, params, labels, options)


_TOY: dict = {}


def toy_model():
    """The tiny random model and its tokenizer (made once per process)."""
    if not _TOY:
        import paged_np as pnp

        tok = pnp.Tokenizer.tiny()
        _TOY["pair"] = (pnp.LlamaModel.random(pnp.ModelConfig(vocab_size=tok.vocab_size),
                                              seed=0), tok)
    return _TOY["pair"]


def toy_workload(seed: int, forks: bool = True) -> Workload:
    """A dozen random requests on the tiny model, reproducible from ``seed``."""
    import paged_np as pnp

    model, tok = toy_model()
    r = np.random.default_rng(seed)
    ps = 4
    openings = [r.integers(3, 300, int(r.integers(4, 13))).tolist() for _ in range(3)]
    prompts, params, labels = [], [], []
    for i in range(12):
        if i in (3, 7):                                  # the same prompt twice in a row
            prompt = list(prompts[-1])
        elif i == 10:                                    # ends on a page boundary, all cached
            prompt = list(prompts[0][:max(ps, len(prompts[0]) // ps * ps)])
        else:
            head = openings[int(r.integers(3))][:int(r.integers(0, 13))]
            prompt = head + r.integers(3, 300, int(r.integers(1, 9))).tolist()
        max_tokens = int(r.integers(3, 9))
        if r.random() < 0.5:
            p = pnp.SamplingParams(max_tokens=max_tokens, temperature=0.0)
        else:
            n = int(r.integers(2, 4)) if forks and r.random() < 0.5 else 1
            p = pnp.SamplingParams(max_tokens=max_tokens, temperature=0.9, top_p=0.9,
                                   seed=int(r.integers(100)), n=n)
        prompts.append(prompt)
        params.append(p)
        labels.append(f"request r{i} (a prompt of {len(prompt)} tokens, "
                      f"{'greedy' if p.greedy else f'sampled, n={p.n}'}, "
                      f"max_tokens={max_tokens})")
    options = dict(page_size=ps, num_pages=16, max_num_seqs=4, max_num_batched_tokens=48)
    return Workload(f"toy workload (seed {seed}{'' if forks else ', no forks'})", model, tok,
                    prompts, params, labels, options)


def serve(w: Workload, options: dict, blame: str) -> Trace:
    """Serve ``w`` with ``options`` (the seams) and check the cache as it goes.

    A refusal raised inside the engine (a seam's own check) gets the workload
    and step as its case; a broken invariant, a finished sample that still
    holds pages or a leaked page is blamed on ``blame``.
    """
    import paged_np as pnp

    engine = pnp.Engine(w.model, record_events=True, **{**w.options, **options})
    parents = {}
    for i, (prompt, p) in enumerate(zip(w.prompts, w.params)):
        rid = engine.add_request(prompt, p, request_id=f"r{i}", request_index=i)
        parents[rid] = engine.requests[rid]
    trace = Trace()
    before = {}
    limit = 20 * len(w.prompts) + sum(len(x) + p.max_tokens * p.n
                                      for x, p in zip(w.prompts, w.params))
    step = 0
    while engine.has_unfinished_requests():
        step += 1
        case = f"{w.name}, step {step}"
        if step > limit:
            left = [w.labels[int(r[1:])] for r in engine.requests]
            raise LabFailure(blame, f"the engine did not finish in {limit} steps; "
                                    f"still unfinished: {'; '.join(left)}", case)
        try:
            engine.step()
        except LabFailure as e:
            e.case = f"{case}: {e.case}" if e.case else case
            raise
        except NotDoneYet:
            raise
        except Exception as e:      # the engine tripped over an answer no seam refused
            where = traceback.extract_tb(e.__traceback__)[-1]
            raise LabFailure(blame, [f"the engine raised {type(e).__name__}: {e}",
                                     f"(in {where.filename}, line {where.lineno}: "
                                     f"{where.line})"], case) from e
        try:
            engine.cache.check_invariants()
        except AssertionError as e:
            raise LabFailure(blame, f"the cache's invariants broke: {e}", case) from None
        admitted, preempted = [], []
        for rid, parent in parents.items():
            for req in parent.seqs:
                name, in_cache = f"{rid}/{req.sample.index}", req.seq is not None
                was_in, was_preempted = before.get(name, (False, 0))
                if in_cache and not was_in:
                    admitted.append(name)
                if req.num_preemptions > was_preempted:
                    preempted.append(name)
                before[name] = (in_cache, req.num_preemptions)
                if req.sample.finish_reason is not None and req.seq_id in engine.cache:
                    held = [int(p) for p in engine.cache.block_table(req.seq_id)]
                    raise LabFailure(blame, f"{w.labels[int(rid[1:])]}, sample "
                                            f"{req.sample.index} finished "
                                            f"({req.sample.finish_reason!r}) but still holds "
                                            f"pages {held}: a finished sequence's pages "
                                            "must go back to the pool", case)
        trace.steps.append((admitted, preempted))
    cache = engine.cache
    if cache.pool.num_in_use or cache.seq_ids:
        held = [p for p in range(cache.cfg.num_pages) if cache.pool.ref_count(p) > 0]
        raise LabFailure(blame, f"pages leaked: every request finished but pages {held} "
                                "are still in use (neither free nor cached)",
                         f"{w.name}, the end")
    for rid, parent in parents.items():
        for s in parent.output.samples:
            trace.tokens[(rid, s.index)] = list(s.token_ids)
    trace.evictions = [e.page_id for e in cache.events if e.kind == "evict"]
    return trace


def compare(w: Workload, got: Trace, want: Trace, blame: str, what=("tokens",)) -> None:
    """Refuse (naming ``blame``) the first difference between the learner's run and the
    package's, in the order of ``what``: "tokens", "evictions", "schedule"."""
    for part in what:
        {"tokens": _tokens, "evictions": _evictions, "schedule": _schedule}[part](
            w, got, want, blame)


def _tokens(w, got, want, blame) -> None:
    for key, ids in want.tokens.items():
        mine = got.tokens.get(key, [])
        if mine != ids:
            rid, j = key
            tok = w.tokenizer
            where = first_difference(mine + [-1] * (len(ids) - len(mine)),
                                     ids + [-1] * (len(mine) - len(ids)))
            raise LabFailure(blame, [
                f"{w.labels[int(rid[1:])]}, sample {j}: its tokens differ from the package's",
                f"yours:   {mine}  {tok.decode(mine)!r}",
                f"package: {ids}  {tok.decode(ids)!r}", where], w.name)


def _evictions(w, got, want, blame) -> None:
    if got.evictions != want.evictions:
        n = min(len(got.evictions), len(want.evictions))
        raise LabFailure(blame, ["the pages evicted, in order, differ from the package's",
                                 f"yours:   {got.evictions}", f"package: {want.evictions}",
                                 first_difference(got.evictions[:n], want.evictions[:n])
                                 or "one list stops early"], w.name)


def _schedule(w, got, want, blame) -> None:
    for k, (mine, ref) in enumerate(zip(got.steps, want.steps), 1):
        if mine != ref:
            raise LabFailure(blame, [f"step {k}: admitted {mine[0]}, preempted {mine[1]}",
                                     f"the package: admitted {ref[0]}, preempted {ref[1]}"],
                             w.name)
