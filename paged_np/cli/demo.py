"""``python -m paged_np demo --model tiny``: the toy demo, random weights over token ids.

Without ``--model tiny`` the demo serves a real model (:mod:`.demo_model`).

A LlamaModel with seeded random weights serves a stream of requests that do
not all fit in the cache at once. Half of them start with the same system
prompt (prefix caching serves its pages once), requests arrive a few per step
(continuous batching admits them as pages allow), and when the pool runs dry
the newest running request is preempted. At the end:

- first, the JIT compile time on its own line: a small warm-up request
  compiles the kernels before the clock starts, so tokens/s and the time
  split measure serving only;
- a summary table (requests, generated tokens, tokens/s, peak pages, prefix
  hit rate, evictions, preemptions, time split);
- a check of every request against ``LlamaModel.dense_generate`` (greedy, no
  cache): its tokens, its length (``max_tokens``) and its finish reason
  (``"length"``): ``verified: N/N requests identical to the dense
  reference``; the exit status is 1 if any request differs or failed;
- ``paged_np_out/demo.png``: pages over time by state, running/waiting over time.

Options: ``--requests --seed --no-verify --out``, and every engine option
(:class:`~paged_np.EngineConfig`: ``--pages``/``--num-pages``, ``--page-size``,
``--backend``, ``--preemption``/``--preemption-mode``, ``--prefix-cache``,
``--schedule``...). The serving loop, the warm-up and the summary table are
the library's (:mod:`paged_np.engine.replay`); notebooks use the same ones.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from ..config import ModelConfig
from ..engine.engine import Engine
from ..engine.replay import replay, summary, warm_up
from ..models.llama import LlamaModel
from . import DEFAULT_OUT, kv_capacity_line, make_parent
from .options import ALIASES, add_engine_args, engine_config


def build_parser() -> argparse.ArgumentParser:
    """The command's flags: its own, then one per engine option."""
    p = argparse.ArgumentParser(prog="python -m paged_np demo --model tiny",
                                description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=["tiny"], default="tiny", help="the toy model")
    p.add_argument("--requests", type=int, default=32, help="number of requests (default 32)")
    p.add_argument("--seed", type=int, default=0, help="seeds the weights and the workload")
    p.add_argument("--no-verify", action="store_true", help="skip the dense-reference check")
    p.add_argument("--out", default=DEFAULT_OUT["demo"],
                   help=f"where to draw the run (default {DEFAULT_OUT['demo']})")
    add_engine_args(p, "demo --model tiny", aliases=ALIASES)   # a cache too small: 40 pages
    return p


def parse_args(argv):
    """The parsed flags, with ``args.config`` the :class:`~paged_np.EngineConfig` they give."""
    p = build_parser()
    args = p.parse_args(argv)
    if args.requests < 1:
        p.error("--requests must be >= 1")
    args.config = engine_config(args, p)         # --pages 0 and the like exit here
    return args


def make_workload(n: int, vocab: int, seed: int):
    """``n`` (arrival step, prompt, max_tokens): half share a 48-token system prompt."""
    rng = np.random.default_rng(seed)
    system = rng.integers(0, vocab, 48).tolist()
    work = []
    for i in range(n):
        user = rng.integers(0, vocab, int(rng.integers(8, 64))).tolist()
        prompt = (system + user) if i % 2 == 0 else user
        work.append((i // 2, prompt, int(rng.integers(16, 64))))  # two arrive per step
    return work


def verify(model, outs, work) -> list[str]:
    """One line per request that is not exactly the dense reference's answer.

    Greedy, no stop tokens: each request must end with ``finish_reason ==
    "length"`` after exactly ``max_tokens`` tokens, and those tokens must equal
    ``model.dense_generate(prompt, max_tokens)``. A truncated or failed request
    counts as wrong even when the tokens it has are right.
    """
    problems = []
    for o, (_, prompt, max_tokens) in zip(outs, work):
        if o.finish_reason != "length" or len(o.token_ids) != max_tokens:
            why = f" ({o.error})" if o.error else ""
            problems.append(f"request {o.request_id}: {len(o.token_ids)}/{max_tokens} tokens, "
                            f"finish_reason {o.finish_reason!r}{why}")
        elif o.token_ids != model.dense_generate(prompt, max_tokens):
            problems.append(f"request {o.request_id}: tokens differ from the dense reference")
    return problems


def wants_toy(argv) -> bool:
    """``--model tiny`` (or ``--model=tiny``) among the arguments."""
    return any(a == "--model=tiny" or (a == "--model" and argv[i + 1:i + 2] == ["tiny"])
               for i, a in enumerate(argv))


def main(argv: list[str]) -> int:
    from tqdm import tqdm

    if not wants_toy(argv):
        from . import demo_model

        return demo_model.main(argv)
    args = parse_args(argv)
    cfg = args.config
    model = LlamaModel.random(ModelConfig(), seed=args.seed)
    work = make_workload(args.requests, model.cfg.vocab_size, args.seed)
    engine = Engine(model, cfg)
    pages = engine.cache.cfg.num_pages
    compile_s = warm_up(model, cfg.page_size, cfg.backend, cfg.kv_cache_dtype)
    print(f"JIT compile + first calls (warm-up, kept out of tokens/s): {compile_s:.2f} s")
    print(kv_capacity_line(engine.cache.cfg))
    print(f"serving {args.requests} requests on a {pages}-page cache "
          f"(page_size {cfg.page_size}, {cfg.preemption_mode} preemption, "
          f"backend {cfg.backend})")
    t0 = time.perf_counter()
    with tqdm(total=len(work), unit="req", desc="serving") as bar:
        outs = replay(engine, work, on_finish=lambda _: bar.update())
    wall = time.perf_counter() - t0
    m = engine.metrics
    failed = [o for o in outs if o.finish_reason == "error"]
    print(summary(m, len(outs), len(failed)))
    print(f"wall time {wall:.2f} s")
    for o in failed:
        print(f"request {o.request_id} failed: {o.error}")

    status = 1 if failed else 0                  # a failed request fails the run
    if not args.no_verify:
        problems = verify(model, outs, work)
        print(f"verified: {len(outs) - len(problems)}/{len(outs)} requests identical to the "
              f"dense reference (max_tokens long, finish_reason 'length')")
        for line in problems:
            print(line)
        status = 1 if problems else status

    from ..viz.engine import draw_engine_run

    fig = draw_engine_run(m, title=f"{args.requests} requests, {pages} pages of "
                                   f"{cfg.page_size}, {cfg.preemption_mode} preemption")
    fig.savefig(make_parent(args.out), dpi=110)
    print(f"drew {args.out}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
