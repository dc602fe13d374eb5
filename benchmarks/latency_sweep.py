"""The latency side of serving, on the real model: TTFT, time per output token,
inter-token latency and throughput, swept over the engine's two budgets.

    python benchmarks/latency_sweep.py            # writes latency_sweep.json and .md

What it runs. SmolLM2-135M-Instruct (``pnp.load_model``) in a ``pnp.Engine``
with pages of 16 and a roomy arena. A batch of ``N_REQUESTS`` chat prompts
(one system prompt, different questions: 60 to 80 tokens each) all arrive at
time 0 and each generates ``MAX_TOKENS`` tokens greedily. For each pair of
``max_num_seqs`` (how many run at once) and ``max_num_batched_tokens`` (tokens
per step) the engine is stepped by hand and, after every step, each request's
output (``engine.request_output``) is read: the time its first token appeared
is its **TTFT** (time to first token, queueing included: everyone arrived at
0), the gaps between its later tokens are its **inter-token latencies** (ITL),
and ``(t_last - t_first) / (n - 1)`` is its **time per output token** (TPOT).
Throughput is generated tokens over the run's wall time. The engine's own
``metrics`` give the step count and the model's share of the time.

A second part times one prefill step of ``T`` prompt tokens (one request, the
whole prompt in one step) for T from 1 to 512: time per token falls while
the step is limited by reading the weights (memory-bound: the same bytes for
1 token or 64) and levels off once the arithmetic is the limit
(compute-bound).

Each configuration is run ``ROUNDS`` times, interleaved (every configuration
once, then again), and the median of each figure is kept. The machine, its
ISA, the thread count and the load average at the start are recorded: on a
shared machine the absolute times move a lot, the shapes (who wins which
latency) much less. Notebook 8 draws ``latency_sweep.json``.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import paged_np as pnp
from paged_np import hardware

HERE = Path(__file__).resolve().parent
N_REQUESTS, MAX_TOKENS, ROUNDS = 12, 16, 2
SEQS = (1, 2, 4, 8, 12)
BUDGETS = (64, 512)
PREFILL_T = (1, 4, 16, 64, 128, 256, 512)
QUESTIONS = ["What is the capital of France?", "Why is the sky blue?", "What do bees make?",
             "How many legs does a spider have?", "Why do leaves fall in autumn?",
             "What is rain made of?", "Why does the moon change shape?",
             "What do plants need to grow?", "Why is the sea salty?",
             "How do birds fly?", "What makes a rainbow?", "Why do we sleep?"]
SYSTEM = ("You are a friendly teacher. You answer every question in one short, clear "
          "sentence that a ten year old child can understand, and you never use jargon.")


def prompts(tok) -> list[list[int]]:
    chats = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]
             for q in QUESTIONS[:N_REQUESTS]]
    return [tok.encode(tok.apply_chat_template(c)) for c in chats]


def serve_timed(model, ids, max_num_seqs: int, budget: int) -> dict:
    """One run: every request at time 0, stepped by hand; per-token times recorded."""
    eng = pnp.Engine(model, num_pages=512, page_size=16, max_num_seqs=max_num_seqs,
                     max_num_batched_tokens=budget)
    params = pnp.SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
    rids = [eng.add_request(p, params, request_id=i) for i, p in enumerate(ids)]
    seen = {r: 0 for r in rids}
    stamps = {r: [] for r in rids}                      # time of each generated token
    texts = {}
    t0 = time.perf_counter()
    while eng.has_unfinished_requests():
        done = eng.step()
        now = time.perf_counter() - t0
        finished = {o.request_id: o for o in done}
        for r in rids:
            if r in texts:
                continue
            out = finished.get(r) or eng.request_output(r)
            n = len(out.outputs[0].token_ids)
            stamps[r] += [now] * (n - seen[r])          # tokens of one step share a time
            seen[r] = n
            if r in finished:
                texts[r] = list(out.outputs[0].token_ids)
    wall = time.perf_counter() - t0
    ttft = [s[0] for s in stamps.values()]
    tpot = [(s[-1] - s[0]) / (len(s) - 1) for s in stamps.values()]
    itl = [b - a for s in stamps.values() for a, b in zip(s, s[1:])]
    m = eng.metrics
    return {"max_num_seqs": max_num_seqs, "max_num_batched_tokens": budget,
            "throughput_tok_s": m["generated_tokens"] / wall, "wall_s": wall,
            "ttft_mean_s": float(np.mean(ttft)), "ttft_p90_s": float(np.percentile(ttft, 90)),
            "tpot_mean_s": float(np.mean(tpot)), "itl_median_s": float(np.median(itl)),
            "itl_p90_s": float(np.percentile(itl, 90)), "itl_max_s": float(np.max(itl)),
            "steps": m["steps"], "model_fraction": m["model_s"] / m["time_s"],
            "texts": [texts[r] for r in rids]}


def prefill_step(model, T: int) -> float:
    """Seconds of the model's forward for one prompt of T tokens in one step."""
    eng = pnp.Engine(model, num_pages=64, page_size=16, max_num_seqs=1,
                     max_num_batched_tokens=max(T, 16))
    rng = np.random.default_rng(T)
    eng.add_request(rng.integers(0, 40000, T).tolist(),
                    pnp.SamplingParams(max_tokens=1, temperature=0.0), request_id=0)
    eng.step()
    return eng.metrics["model_s"]


def median_rows(rows: list[dict]) -> dict:
    out = dict(rows[0])
    for k, v in rows[0].items():
        if isinstance(v, float):
            out[k] = statistics.median(r[k] for r in rows)
    out["same_text_across_rounds"] = all(r["texts"] == rows[0]["texts"] for r in rows)
    return out


def main() -> int:
    load = os.getloadavg()[0]
    model, tok = pnp.load_model("smollm2-135m-instruct")
    ids = prompts(tok)
    serve_timed(model, ids[:2], 2, 512)                 # warm-up: compile, caches
    configs = [(s, b) for b in BUDGETS for s in SEQS]
    runs = {c: [] for c in configs}
    pre = {T: [] for T in PREFILL_T}
    for rnd in range(ROUNDS):
        for c in configs:
            runs[c].append(serve_timed(model, ids, *c))
            r = runs[c][-1]
            print(f"round {rnd} seqs={c[0]:2d} budget={c[1]:4d}: "
                  f"{r['throughput_tok_s']:6.1f} tok/s  TTFT {r['ttft_mean_s']:.2f} s  "
                  f"TPOT {r['tpot_mean_s'] * 1e3:.0f} ms", flush=True)
        for T in PREFILL_T:
            pre[T].append(prefill_step(model, T))
    rows = [median_rows(runs[c]) for c in configs]
    reference = rows[0]["texts"]
    for r in rows:                                      # greedy text across configurations
        r["same_text_as_first_config"] = r.pop("texts") == reference
    prefill = [{"tokens": T, "step_s": statistics.median(v),
                "s_per_token": statistics.median(v) / T} for T, v in pre.items()]
    isa = hardware.isa_key(hardware.isa_info())
    result = {"machine": {"cpu": hardware.cpu_model(), "isa": isa,
                          "threads": os.cpu_count(), "loadavg_at_start": load,
                          "note": "shared machine: other jobs ran meanwhile"},
              "setup": {"model": "smollm2-135m-instruct", "requests": N_REQUESTS,
                        "max_tokens": MAX_TOKENS, "rounds": ROUNDS, "page_size": 16,
                        "prompt_tokens": [len(p) for p in ids]},
              "sweep": rows, "prefill": prefill}
    (HERE / "latency_sweep.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = ["# Latency sweep (benchmarks/latency_sweep.py)", "",
             f"SmolLM2-135M, {N_REQUESTS} chat prompts at time 0, {MAX_TOKENS} greedy tokens "
             f"each, median of {ROUNDS} interleaved rounds; {os.cpu_count()} threads, load "
             f"average {load:.1f} at the start (a shared machine: other jobs slowed the "
             "steps by a factor that changed during the run, so only large differences in "
             "the times mean anything; the step counts do not depend on the machine).", "",
             "| max_num_seqs | max_num_batched_tokens | tok/s | TTFT mean (s) | TTFT p90 (s) "
             "| TPOT mean (ms) | ITL median (ms) | ITL p90 (ms) | steps | same text |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['max_num_seqs']} | {r['max_num_batched_tokens']} | "
                     f"{r['throughput_tok_s']:.1f} | {r['ttft_mean_s']:.2f} | "
                     f"{r['ttft_p90_s']:.2f} | {r['tpot_mean_s'] * 1e3:.0f} | "
                     f"{r['itl_median_s'] * 1e3:.0f} | {r['itl_p90_s'] * 1e3:.0f} | "
                     f"{r['steps']} | {r['same_text_as_first_config']} |")
    lines += ["", "| prefill tokens | step (ms) | ms per token |", "|---|---|---|"]
    lines += [f"| {p['tokens']} | {p['step_s'] * 1e3:.1f} | {p['s_per_token'] * 1e3:.2f} |"
              for p in prefill]
    (HERE / "latency_sweep.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
