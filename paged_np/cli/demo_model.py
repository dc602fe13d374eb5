"""``python -m paged_np demo``: a real instruct model served on a paged cache that is too small.

SmolLM2-135M-Instruct (fetched once into ``PAGED_NP_HOME``) answers 16
questions at once through :class:`paged_np.LLM`. Every request starts with
the chat template's default system turn, so their first page is computed
once and then found by prefix hash; the cache holds far fewer pages than the
16 requests need together, so requests wait, are preempted and come back.

It prints each question with its answer, the JIT compile time (on its own
line, kept out of tokens/s), the cache summary, and ``verified: N/N``: one
dense forward without any cache over each request's prompt + answer
(teacher forcing) must give, at every position, the greedy token the paged
engine chose, and each request must end the way it says (EOS, or
``max_tokens``). A near-tie (top-2 logit gap below 1e-4) is printed as one.
The exit status is 1 if anything fails, including the fetch (no fallback).

``--model tiny`` runs the toy demo with random weights (:mod:`.demo`, which
dispatches here for every other model). Every engine option is a flag
(``--pages``/``--num-pages``, ``--prefix-cache``, ``--schedule``...: see ``--help``).
"""

from __future__ import annotations

import argparse
import sys
import time

from . import DEFAULT_OUT, kv_capacity_line, make_parent
from .options import ALIASES, add_engine_args, engine_config

QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "What is 12 times 7?",
    "Give me a synonym for happy.",
    "What do bees make?",
    "How many days are in a week?",
    "What is the boiling point of water in Celsius?",
    "Who wrote Romeo and Juliet?",
    "What is the largest planet in our solar system?",
    "Translate 'thank you' into Spanish.",
    "What gas do plants absorb from the air?",
    "Write a one-line poem about the sea.",
    "What is the opposite of cold?",
    "How many legs does a spider have?",
    "What is the freezing point of water in Fahrenheit?",
    "Name a fruit that is yellow.",
]


def build_parser() -> argparse.ArgumentParser:
    """The command's flags: its own, then one per engine option."""
    p = argparse.ArgumentParser(prog="python -m paged_np demo",
                                description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct",
                   help="a known name, a .gguf file or a Hugging Face directory; 'tiny' runs "
                        "the toy demo (default smollm2-135m-instruct)")
    p.add_argument("--requests", type=int, default=16, help="questions to serve (default 16)")
    p.add_argument("--max-tokens", type=int, default=40, help="tokens per answer at most")
    p.add_argument("--no-verify", action="store_true", help="skip the dense check")
    p.add_argument("--threads", type=int, default=1,
                   help="BLAS and Numba threads (default 1: spinning BLAS threads are slow "
                        "on a busy machine, see paged_np.models.blas)")
    p.add_argument("--out", default=DEFAULT_OUT["demo"],
                   help=f"where to draw the run (default {DEFAULT_OUT['demo']})")
    add_engine_args(p, "demo", aliases=ALIASES)     # 24 pages: far fewer than 16 requests need
    return p


def parse_args(argv):
    """The parsed flags, with ``args.config`` the :class:`~paged_np.EngineConfig` they give."""
    p = build_parser()
    args = p.parse_args(argv)
    for name in ("requests", "max_tokens", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    args.config = engine_config(args, p)         # --pages 0 and the like exit here
    return args


def verify(model, outs, stop_token_ids, max_tokens):
    """``(ok, near_ties, problems)``: the teacher-forced dense check of every answer."""
    from ..engine.dense_check import check_against_dense

    ok, ties, problems = 0, [], []
    for o in outs:
        c = o.outputs[0]
        ids = c.token_ids
        ended = ((c.finish_reason == "stop" and ids and ids[-1] in stop_token_ids)
                 or (c.finish_reason == "length" and len(ids) == max_tokens))
        if not ended:
            problems.append(f"request {o.request_id}: {len(ids)} tokens, finish_reason "
                            f"{c.finish_reason!r}" + (f" ({o.error})" if o.error else ""))
            continue
        check = check_against_dense(model, o.prompt_token_ids, ids)
        if not check.ok:
            problems.append(f"request {o.request_id}: token {check.mismatch} differs from the "
                            "dense argmax")
        elif check.near_tie is not None:
            ties.append(f"request {o.request_id}: near-tie at token {check.near_tie} (top-2 gap "
                        f"{check.gap:.1e} < 1e-4); checked up to there")
        else:
            ok += 1
    return ok, ties, problems


def main(argv: list[str]) -> int:
    from ..models.blas import pinned_threads

    args = parse_args(argv)
    with pinned_threads(args.threads):
        return run(args)


def run(args) -> int:
    from tqdm import tqdm

    from ..engine.llm import LLM
    from ..engine.replay import summary, warm_up
    from ..engine.sampling import SamplingParams
    from ..errors import ModelLoadError, PagedNPError

    cfg = args.config
    t_start = time.perf_counter()
    try:
        llm = LLM(args.model, config=cfg)
    except ModelLoadError as e:
        print(f"demo: cannot load {args.model!r}: {e}", file=sys.stderr)
        return 1
    t_loaded = time.perf_counter()
    print(f"loaded {llm.model_name} in {t_loaded - t_start:.1f} s "
          f"({llm.model.nbytes / 2**20:.0f} MiB of "
          f"{'quantized' if llm.model.quantized else 'float32'} weights)")
    compile_s = warm_up(llm.model, cfg.page_size, cfg.backend, cfg.kv_cache_dtype)
    pages = llm.engine.cache.cfg.num_pages
    print(f"JIT compile + first calls (warm-up, kept out of tokens/s): {compile_s:.2f} s")
    print(kv_capacity_line(llm.engine.cache.cfg))

    questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(args.requests)]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0)
    print(f"serving {len(questions)} chat requests (shared default system prompt) on "
          f"{pages} pages of {cfg.page_size} tokens, {cfg.preemption_mode} preemption")
    try:
        for i, q in enumerate(questions):
            llm.add_request(i, llm.tokenizer.apply_chat_template([{"role": "user", "content": q}]),
                            params)
    except PagedNPError as e:                    # e.g. a prompt longer than the whole cache
        print(f"demo: {e} (raise --pages or --page-size)", file=sys.stderr)
        return 1
    results = {}
    t0 = time.perf_counter()
    with tqdm(total=len(questions), unit="req", desc="serving", leave=False) as bar:
        while llm.has_unfinished_requests():
            for out in llm.step():
                if out.finished:
                    results[out.request_id] = out
                    bar.update()
    wall = time.perf_counter() - t0
    outs = [results[i] for i in range(len(questions))]
    for q, o in zip(questions, outs):
        c = o.outputs[0]
        print(f"\nQ{o.request_id}: {q}\nA: {c.text.strip()}  [{len(c.token_ids)} tokens, "
              f"{c.finish_reason}, {o.num_cached_tokens} prompt tokens from the cache]")
    print()
    m = llm.engine.metrics
    failed = [o for o in outs if o.finish_reason == "error"]
    print(summary(m, len(outs), len(failed)))
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outs)
    cached = sum(o.num_cached_tokens for o in outs)
    print(f"prefix hits: {cached} of {prompt_tokens} prompt tokens ({cached / prompt_tokens:.1%})"
          f"; serving wall time {wall:.1f} s, {m['generated_tokens'] / wall:.1f} tokens/s")

    status = 1 if failed else 0
    if not args.no_verify:
        t = time.perf_counter()
        ok, ties, problems = verify(llm.model, outs, llm.tokenizer.stop_token_ids,
                                    args.max_tokens)
        print(f"verified: {ok}/{len(outs)} requests: every greedy token is the argmax of a "
              f"dense forward without cache ({time.perf_counter() - t:.1f} s)")
        for line in ties + problems:
            print(line)
        status = 1 if problems else status

    from ..viz.engine import draw_engine_run

    fig = draw_engine_run(m, title=f"{llm.model_name}: {len(outs)} chat requests, "
                                   f"{pages} pages of {cfg.page_size}")
    fig.savefig(make_parent(args.out), dpi=110)
    print(f"drew {args.out}")
    print(f"total {time.perf_counter() - t_start:.1f} s")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
