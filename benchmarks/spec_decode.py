"""Speculative decoding with n-gram drafts: batch-1 tokens/s with and without, same run.

    python benchmarks/spec_decode.py            # both weight formats (~7 minutes on 2 cores)
    python benchmarks/spec_decode.py --weights gguf_a8   # one format (~3.5 minutes)
    python benchmarks/spec_decode.py --quick    # one prompt a category, one round (~70 s)
    python benchmarks/spec_decode.py --sweep    # k and lookup settings instead (~8 minutes)

SmolLM2-135M-Instruct answers chats one at a time (batch 1, greedy), once with
``speculative_config={"method": "ngram", ...}`` and once without, alternating
per prompt (the order flips every prompt, so a drift of the shared machine
falls on both), on each weight format of ``--weights`` in turn (default: the
file's blocks times float32 inputs, then times int8 inputs). Five categories:

- input-grounded: *copy* (repeat a paragraph), *correct* (fix its typos),
  *extract* (list the names and dates of a passage), *edit* (rename a
  variable in a function): most of the answer is in the prompt, which is
  what prompt lookup drafts from;
- *open*: questions with no text to copy.

A warm-up runs every prompt on both engines first (JIT, and the prompt's
pages into each engine's prefix cache, so the timed runs are decode: the
prompt's last partial page is all the prefill left). Each prompt is timed
``--rounds`` times per mode; a category's tokens/s is its generated tokens
over the sum of each prompt's best time (median speedup in brackets). The
greedy token ids with and without drafts must be identical (asserted: a
difference is a bug). Acceptance comes from ``llm.engine.metrics``:
``spec_acceptance_rate`` (accepted drafts / drafts) and
``spec_mean_accepted_length`` (tokens a drafting step emits, 1 + accepted).

It also times the model's forward at batch 1 with 1 and with 1 + k query rows
over the paged cache (context 300), the cost a drafting step pays, with its
attention calls and its weight products on their own, and the products' rate
against the machine's fma peak (where a verify step's time goes). Writes
``benchmarks/spec_decode.md`` (``--out``); ``--sweep`` writes
``benchmarks/spec_decode_sweep.md`` instead: each (k, prompt_lookup_max,
prompt_lookup_min) of ``SWEEP`` on two prompts a category, one run each.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # this checkout's paged_np

import numpy as np  # noqa: E402
from numba import njit  # noqa: E402

import paged_np as pnp  # noqa: E402
import paged_np.models.llama as llama  # noqa: E402
from paged_np.hardware import machine_line  # noqa: E402
from paged_np.models.blas import pinned_threads  # noqa: E402
from paged_np.models.llama import ForwardBatch  # noqa: E402
from paged_np.quant import simd  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))       # the chats, beside this file
from spec_decode_prompts import GROUNDED, prompts  # noqa: E402

MODEL = "smollm2-135m-instruct"

# ----------------------------------------------------------------- measuring
def timed_chat(llm, conv, params):
    """(token ids, seconds, metric deltas) of one chat on ``llm``."""
    before = llm.engine.metrics
    t0 = time.perf_counter()
    out = llm.chat(conv, params)[0].outputs[0]
    dt = time.perf_counter() - t0
    after = llm.engine.metrics
    keys = ("steps", "generated_tokens", "model_s", "spec_num_draft_tokens",
            "spec_num_accepted_tokens", "spec_num_drafts")
    assert llm.engine.cache.stats()["num_in_use"] == 0, "pages left in use after a run"
    return list(out.token_ids), dt, {k: after[k] - before[k] for k in keys}


def make_llm(model, tok, spec):
    return pnp.LLM(model, tokenizer=tok, verbose=False, kv_cache_memory="512MiB",
                   speculative_config=spec)


def compare(model, tok, convs: dict, spec: dict, max_tokens: int, rounds: int,
            base=None, log=print) -> dict:
    """Per category: times and counts with and without ``spec``, alternating per prompt.

    ``base`` (an LLM without speculation, already warm) is reused across calls.
    Returns {category: {"plain": [...], "spec": [...], "tokens": [...], "delta": [...]}}
    with one best time per prompt, and the per-round speedups.
    """
    params = pnp.SamplingParams(max_tokens=max_tokens, temperature=0.0)
    warm = pnp.SamplingParams(max_tokens=2, temperature=0.0)
    llms = {"plain": base or make_llm(model, tok, None), "spec": make_llm(model, tok, spec)}
    for cat in convs:                                   # JIT, and each prompt's pages cached
        for conv in convs[cat]:
            for llm in llms.values():
                llm.chat(conv, warm)
    res = {}
    flip = 0
    for cat, cs in convs.items():
        r = res[cat] = {"plain": [], "spec": [], "tokens": [], "delta": [], "ratios": [],
                        "plain_delta": []}
        for conv in cs:
            times = {"plain": [], "spec": []}
            ids = {}
            for _ in range(rounds):
                order = ("plain", "spec") if flip % 2 == 0 else ("spec", "plain")
                flip += 1
                for mode in order:
                    tokens, dt, d = timed_chat(llms[mode], conv, params)
                    if mode in ids and ids[mode] != tokens:
                        raise AssertionError(f"{cat}: {mode} gave other tokens on a rerun")
                    ids[mode] = tokens
                    times[mode].append(dt)
                    r["delta" if mode == "spec" else "plain_delta"].append(d)
                if ids["plain"] != ids["spec"]:
                    n = next((i for i, (a, b) in enumerate(zip(ids["plain"], ids["spec"]))
                              if a != b), min(len(ids["plain"]), len(ids["spec"])))
                    raise AssertionError(
                        f"{cat}: greedy tokens differ with speculation at token {n} "
                        f"(spec={spec}): a bug in speculative decoding")
                r["ratios"].append(times["plain"][-1] / times["spec"][-1])
            r["plain"].append(min(times["plain"]))
            r["spec"].append(min(times["spec"]))
            r["tokens"].append(len(ids["plain"]))
            tp, ts = min(times["plain"]), min(times["spec"])
            log(f"  {cat:8s} {len(ids['plain']):4d} tokens  plain {tp:6.2f} s  "
                f"spec {ts:6.2f} s  x{tp / ts:.2f}")
    return res


def summarise(r: dict) -> dict:
    """A category's (or several categories') row of the table."""
    tokens = sum(r["tokens"])
    plain, spec = sum(r["plain"]), sum(r["spec"])
    d = {k: sum(x[k] for x in r["delta"]) for k in r["delta"][0]}
    p = {k: sum(x[k] for x in r["plain_delta"]) for k in r["plain_delta"][0]}
    return dict(
        prompts=len(r["tokens"]), tokens=tokens,
        plain_tps=tokens / plain, spec_tps=tokens / spec, speedup=plain / spec,
        median_speedup=statistics.median(r["ratios"]),
        acceptance=d["spec_num_accepted_tokens"] / max(d["spec_num_draft_tokens"], 1),
        mean_len=(1 + d["spec_num_accepted_tokens"] / d["spec_num_drafts"]
                  if d["spec_num_drafts"] else 0.0),
        drafting_steps=d["spec_num_drafts"] / max(d["steps"], 1),
        steps_ratio=p["steps"] / max(d["steps"], 1),
        plain_ms_step=1e3 * p["model_s"] / max(p["steps"], 1),
        spec_ms_step=1e3 * d["model_s"] / max(d["steps"], 1),
    )


def merge(res: dict, cats) -> dict:
    return {k: [x for c in cats for x in res[c][k]] for k in res[cats[0]]}


def forward_ms(model, ks=(0, 2, 4, 6, 8), context: int = 300, repeat: int = 20) -> dict:
    """Per k: (best ms of the model's forward at batch 1 with 1 + k query rows, and 1 + k
    logits rows as a verify step computes, after ``context`` tokens in the paged cache;
    the ms its 30 ``paged_attention`` calls took in that best run)."""
    engine = pnp.Engine(model, num_pages=64, page_size=16, max_num_batched_tokens=512)
    cache = engine.cache
    rng = np.random.default_rng(0)
    prompt = rng.integers(3, model.cfg.vocab_size, context).tolist()
    cache.add_sequence("s", prompt)
    out = {}
    attention = [0.0]                                   # seconds in paged_attention, this run
    real = llama.paged_attention

    def timed_attention(*a, **kw):
        t0 = time.perf_counter()
        result = real(*a, **kw)
        attention[0] += time.perf_counter() - t0
        return result

    def run(tokens, start, n_logits):
        slots = cache.allocate_slots("s", len(tokens))                    # int64 [T]
        meta = cache.batch(["s"])
        T = len(tokens)
        batch = ForwardBatch(np.array(tokens, np.int64), np.arange(start, start + T),
                             slots, np.array([0, T], np.int32), meta.block_tables,
                             meta.seq_lens, np.arange(T - n_logits, T, dtype=np.int64))
        attention[0] = 0.0
        t0 = time.perf_counter()
        model.forward(batch, cache)
        return time.perf_counter() - t0, attention[0]

    run(prompt, 0, 1)                                                      # the prefill
    cache.append_tokens("s", prompt)
    llama.paged_attention = timed_attention             # the forward looks it up per call
    try:
        for k in ks:
            best = (float("inf"), 0.0)
            for _ in range(repeat):
                best = min(best, run(prompt[:1 + k], context, 1 + k))
                cache.discard_pending("s")                                # roll back
            out[k] = (best[0] * 1e3, best[1] * 1e3)
    finally:
        llama.paged_attention = real
    cache.free("s")
    return out


def products_flops(model, rows: int) -> float:
    """Floating-point operations of ``products_ms``'s products: 2 per multiply-add."""
    mats = [model.wqkv, model.w["wo"], model.w_gate_up, model.w["w_down"]]
    macs = sum(m[layer].shape[0] * m[layer].shape[1] for m in mats for layer in range(len(m)))
    macs += model.cfg.hidden_size * model.cfg.vocab_size                  # the LM head
    return 2.0 * rows * macs


@njit(fastmath=False)
def _fma_chains(a, n):
    # 6 chains of 16-lane fmas on registers (12 ymm or 6 zmm: more than the fma units'
    # latency x throughput on either), nothing read from memory.
    a0, a1, a2 = simd.load_f32(a, 0), simd.load_f32(a, 16), simd.load_f32(a, 32)
    a3, a4, a5 = simd.load_f32(a, 48), simd.load_f32(a, 64), simd.load_f32(a, 80)
    w = simd.load_f32(a, 96)
    for _ in range(n):
        a0, a1, a2 = simd.fma(w, a0, w), simd.fma(w, a1, w), simd.fma(w, a2, w)
        a3, a4, a5 = simd.fma(w, a3, w), simd.fma(w, a4, w), simd.fma(w, a5, w)
    for i, v in enumerate((a0, a1, a2, a3, a4, a5)):
        simd.store_f32(a, 16 * i, v)


def fma_peak_gflops(threads: int, n: int = 2_000_000) -> float:
    """This machine's float32 fma rate, GFLOP/s: one thread's best of 7 runs (~10 ms each:
    a shared machine's other jobs only slow some) times ``threads``, the ceiling any
    product kernel here works under (each thread its own core: ``lscpu`` says 1 thread
    per core on the machines measured; two threads measured 1.9-2.0x one)."""
    a = np.full(112, 0.5, np.float32)
    _fma_chains(a, 10)                                                    # compile
    best = float("inf")
    for _ in range(7):
        t0 = time.perf_counter()
        _fma_chains(a, n)
        best = min(best, time.perf_counter() - t0)
    return threads * n * 6 * 16 * 2 / best / 1e9


def products_ms(model, rows: int, repeat: int = 5) -> float:
    """Best ms of the forward's weight products alone with ``rows`` rows: every layer's
    ``x @ W`` (fused q/k/v, output, fused gate/up, down) and the tied LM head."""
    mats = [model.wqkv, model.w["wo"], model.w_gate_up, model.w["w_down"]]  # L x [in, out]
    xs = [np.ones((rows, m[0].shape[0]), np.float32) for m in mats]
    h = np.ones((rows, model.cfg.hidden_size), np.float32)
    head = model.w["embed"] if model.cfg.tie_word_embeddings else model.w["lm_head"].T

    def run():
        for m, x in zip(mats, xs):
            for layer in range(len(m)):
                x @ m[layer]                                          # [rows, out]
        if model.quantized:
            h @ model.w["lm_head"]                                    # [rows, V], Q8_0 kernel
        else:
            head @ h.T                                                # [V, rows]

    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


# ----------------------------------------------------------------- the report
def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def targets(rows: list[tuple[str, dict]]) -> list[str]:
    """Whether this run meets issue 27's two targets."""
    by = dict(rows)
    out = []
    g = by.get("input-grounded, all")
    if g:
        out.append(f"- >= 2.0x batch-1 tokens/s on input-grounded chats: {g['speedup']:.2f}x, "
                   f"{'met' if g['speedup'] >= 2.0 else 'missed'} "
                   + "(per category: " + ", ".join(f"{c} {by[c]['speedup']:.2f}x"
                                                   for c in GROUNDED if c in by) + ").")
    if "open" in by:
        o = by["open"]["speedup"]
        out.append(f"- open-ended chats no more than 10% slower: {o:.2f}x "
                   f"({(1 / o - 1) * 100:+.0f}% time), {'met' if o >= 1 / 1.1 else 'missed'}.")
    return out


def table(rows: list[tuple[str, dict]]) -> list[str]:
    lines = ["| chats | prompts | tokens | tokens/s without | tokens/s with | speedup "
             "(median) | acceptance | mean accepted length | drafting steps | steps saved "
             "| model ms/step without / with |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in rows:
        lines.append(
            f"| {name} | {s['prompts']} | {s['tokens']} | {s['plain_tps']:.1f} | "
            f"{s['spec_tps']:.1f} | {s['speedup']:.2f}x ({s['median_speedup']:.2f}x) | "
            f"{s['acceptance']:.2f} | {s['mean_len']:.2f} | {s['drafting_steps']:.0%} | "
            f"{s['steps_ratio']:.2f}x | {s['plain_ms_step']:.1f} / {s['spec_ms_step']:.1f} |")
    return lines


def rows_of(res: dict) -> list[tuple[str, dict]]:
    rows = [(c, summarise(res[c])) for c in res]
    g = [c for c in GROUNDED if c in res]
    if len(g) > 1:
        rows.append(("input-grounded, all", summarise(merge(res, g))))
    return rows


SWEEP = [(3, 4, 1), (4, 4, 1), (6, 4, 1), (8, 4, 1), (4, 4, 2), (6, 4, 2), (8, 4, 2),
         (10, 4, 2), (12, 4, 2), (8, 6, 2), (8, 4, 3)]


def run_sweep(model, tok, convs, max_tokens, base, args) -> None:
    """Each setting of SWEEP against plain decoding; writes ``*_sweep.md`` beside --out."""
    t0, load_start = time.perf_counter(), load()
    convs = {c: cs[:2] for c, cs in convs.items()}
    rows = []
    for k, nmax, nmin in SWEEP:
        sp = {"method": "ngram", "num_speculative_tokens": k,
              "prompt_lookup_max": nmax, "prompt_lookup_min": nmin}
        print(f"sweep {sp}")
        r = compare(model, tok, convs, sp, max_tokens, 1, base=base)
        rows.append((k, nmax, nmin, summarise(merge(r, list(GROUNDED))), summarise(r["open"])))
    lines = [
        "# Speculative decoding: k and the lookup lengths",
        "",
        f"Written by `python benchmarks/spec_decode.py --sweep` in "
        f"{time.perf_counter() - t0:.0f} s. Machine: {machine_line()}, shared; load average "
        f"(1/5/15 min) {load_start} at the start, {load()} at the end; BLAS and Numba "
        f"threads pinned to {args.threads}. SmolLM2-135M-Instruct, batch 1, greedy, "
        f"`max_tokens={max_tokens}`; two prompts a category, one run each, every setting "
        "against plain decoding in the same run, alternating per prompt.",
        "",
        "| k | lookup max | lookup min | grounded tokens/s without / with | grounded speedup | "
        "grounded acceptance | grounded mean length | open speedup | open acceptance |",
        "|---|---|---|---|---|---|---|---|---|",
        *[f"| {k} | {a} | {b} | {g['plain_tps']:.1f} / {g['spec_tps']:.1f} | "
          f"{g['speedup']:.2f}x | {g['acceptance']:.2f} | {g['mean_len']:.2f} | "
          f"{o['speedup']:.2f}x | {o['acceptance']:.2f} |" for k, a, b, g, o in rows],
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        out = Path(args.out)
        out.with_name(out.stem + "_sweep.md").write_text(text)


WEIGHTS = {"gguf": "the file's Q4_1/Q8_0 blocks times float32 inputs (`quantization=\"gguf\"`, "
                   "the default)",
           "gguf_a8": "the same blocks times int8 inputs, integer products "
                      "(`quantization=\"gguf_a8\"`, llama.cpp's arithmetic)",
           "none": "float32 (`quantization=None`, BLAS)"}


def measure(quantization: str, convs, spec, max_tokens, rounds, args) -> dict:
    """One weight format: the chats with and without ``spec``, and a step's cost."""
    model, tok = pnp.load_model(MODEL, quantization=None if quantization == "none"
                                else quantization)
    with pinned_threads(args.threads):
        base = make_llm(model, tok, None)
        if args.sweep:
            run_sweep(model, tok, convs, max_tokens, base, args)
            return {}
        print(f"{MODEL} ({quantization}), {args.threads} threads, spec {spec}, "
              f"max_tokens {max_tokens}, {rounds} round(s); load {load()}")
        res = compare(model, tok, convs, spec, max_tokens, rounds, base=base)
        ks = sorted({0, 1, args.k} if args.quick else {0, 1, 2, 4, 6, 8, 10, 12, args.k})
        fwd = forward_ms(model, ks=ks, repeat=5 if args.quick else 20)
        prods = {k: products_ms(model, 1 + k, repeat=5 if args.quick else 20) for k in ks}
        flops = {k: products_flops(model, 1 + k) for k in ks}
        peak = fma_peak_gflops(args.threads)
    return dict(rows=rows_of(res), fwd=fwd, prods=prods, flops=flops, peak=peak,
                quantized=model.quantized)


def section(quantization: str, r: dict, args) -> list[str]:
    """One weight format's tables and targets."""
    fwd, prods, flops, peak = r["fwd"], r["prods"], r["flops"], r["peak"]
    return [
        f"## Weights: {WEIGHTS[quantization]}",
        "",
        *table(r["rows"]),
        "",
        "The model's forward at batch 1 after 300 tokens in the paged cache, 1 + k query "
        f"rows (all with logits, as a verify step needs), best of {5 if args.quick else 20}; "
        f"the products' rate against this machine's fma peak, {peak:.0f} GFLOP/s on "
        f"{args.threads} threads (`fma_peak_gflops`: one thread's float32 fmas on registers, "
        "times the threads):",
        "",
        "| query rows | forward ms | vs 1 row | weight products alone, ms | vs 1 row "
        "| products GFLOP/s (of fma peak) | attention ms (30 calls) |",
        "|---|---|---|---|---|---|---|",
        *[f"| 1 + {k} | {ms:.1f} | {ms / fwd[0][0]:.2f}x | {prods[k]:.1f} | "
          f"{prods[k] / prods[0]:.2f}x | {flops[k] / prods[k] / 1e6:.0f} "
          f"({flops[k] / prods[k] / 1e6 / peak:.0%}) | {att:.1f} |"
          for k, (ms, att) in fwd.items()],
        "",
        "Targets of issue 27 on these weights:",
        "",
        *targets(r["rows"]),
        "",
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one prompt a category, one round")
    ap.add_argument("--sweep", action="store_true",
                    help="try the k / lookup settings of SWEEP instead (~10 minutes)")
    ap.add_argument("--k", type=int, default=8, help="num_speculative_tokens")
    ap.add_argument("--lookup-max", type=int, default=4)
    ap.add_argument("--lookup-min", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=None, help="default 160 (--quick 96)")
    ap.add_argument("--rounds", type=int, default=None, help="default 2 (--quick 1)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--weights", default="gguf,gguf_a8",
                    help=f"comma list of load_model quantizations, each measured in turn: "
                         f"{', '.join(WEIGHTS)} (--sweep: the first)")
    ap.add_argument("--out", default=str(Path(__file__).with_suffix(".md")))
    args = ap.parse_args(argv)
    formats = [w.strip() for w in args.weights.split(",") if w.strip()]
    if not formats or any(w not in WEIGHTS for w in formats):
        ap.error(f"--weights {args.weights!r}: expected a comma list of {', '.join(WEIGHTS)}")
    max_tokens = args.max_tokens or (96 if args.quick or args.sweep else 160)
    rounds = args.rounds or (1 if args.quick else 2)
    convs = prompts()
    if args.quick:
        convs = {c: cs[:1] for c, cs in convs.items()}
    spec = {"method": "ngram", "num_speculative_tokens": args.k,
            "prompt_lookup_max": args.lookup_max, "prompt_lookup_min": args.lookup_min}
    t_start, load_start = time.perf_counter(), load()
    if args.sweep:
        measure(formats[0], convs, spec, max_tokens, rounds, args)
        return 0
    results = {w: measure(w, convs, spec, max_tokens, rounds, args) for w in formats}
    elapsed, load_end = time.perf_counter() - t_start, load()
    lines = [
        "# Speculative decoding with n-gram drafts: batch-1 tokens/s",
        "",
        f"Written by `python benchmarks/spec_decode.py{' --quick' if args.quick else ''}"
        f"{'' if args.weights == 'gguf,gguf_a8' else ' --weights ' + args.weights}` (see its "
        f"docstring) in {elapsed:.0f} s. Machine: {machine_line()}, shared; load average "
        f"(1/5/15 min) {load_start} at the start, {load_end} at the end. Python "
        f"{platform.python_version()}, NumPy {np.__version__}, BLAS and Numba threads "
        f"pinned to {args.threads}.",
        "",
        f"Model `{MODEL}`, batch 1, greedy, `max_tokens={max_tokens}`; with "
        f"`speculative_config={spec}`; each weight format in turn. Each prompt ran "
        f"{rounds}x per mode, with and without alternating; times are each prompt's best, "
        "the speedup in brackets the median of the per-run ratios. *acceptance*: accepted "
        "drafts / drafts; *mean accepted length*: tokens a drafting step emits (1 + "
        "accepted drafts); *drafting steps*: the share of steps with drafts that checked "
        "any (the rest found no recurring n-gram, or were paused after rejections); "
        "*steps saved*: engine steps without / with; *model ms/step*: "
        "the forward's mean time per engine step. The greedy token ids were identical with "
        "and without drafts for every prompt (asserted). The two weight formats answer "
        "with different texts (int8 inputs round differently), so their categories are "
        "not the same work.",
        "",
        "A drafting step pays off when the tokens it emits (the mean accepted length) "
        "exceed its cost in one-row forwards (the second table of each format). *Weight "
        "products alone*: the forward's matrix products (`x @ W` for every layer's four "
        "weight matrices, and the LM head), nothing else; their *GFLOP/s* count 2 per "
        "multiply-add. At one row the products wait on the weights' bytes; with more rows "
        "the same bytes feed more multiply-adds, until the fma units are the limit. "
        "*Attention*: the time the forward spent in its 30 `paged_attention` calls, in the "
        "same best run.",
        "",
    ]
    for w, r in results.items():
        lines += section(w, r, args)
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
