"""Time to first token of a long shared prompt the arena evicted: recomputed, or read back
from the host tier or the disk tier, and after a restart from disk.

    python benchmarks/kv_tiers.py                 # writes benchmarks/kv_tiers.md (+ .json)
    python benchmarks/kv_tiers.py --quick         # 1 round, prints the table
    python benchmarks/kv_tiers.py --kv-cache-dtype int8

SmolLM2-135M (the file's Q4_1 blocks), a 2,000-token system prompt and a short
question (2,012 tokens), an arena of 200 pages of 16 tokens. One round, per way:

1. ask question 0 (the system prompt is computed and cached);
2. two 1,600-token prompts push every page of it out of the arena (checked);
3. ask question 1 and time it to its first token (TTFT).

The ways are peers in one run, in turn within each round (median of the rounds):
``recompute`` (no tier), ``host`` (``host_cache_memory``), ``disk``
(``disk_cache_dir``, no host tier), ``restart, disk`` (a fresh engine on the
disk run's directory, asked question 1 first: the files are in the OS's page
cache), and ``restart, disk, cold`` (the same after ``fsync`` and
``posix_fadvise(DONTNEED)`` on every file, so the bytes come from the device).
The load itself (``KVTiers.load_prefix``: lookups, reads, checks, the copy into
the arena) is timed apart, and its bytes over its time are the read bandwidth,
set against the machine's streaming read (:func:`paged_np.hardware.stream_bandwidth`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import paged_np as pnp
from paged_np.hardware import machine_line, stream_bandwidth

HERE = Path(__file__).resolve().parent
SYSTEM_TOKENS, FILLER_TOKENS, QUESTION_TOKENS = 2000, 1600, 12
ARENA = dict(num_pages=200, page_size=16, max_num_batched_tokens=512, max_num_seqs=4)
WAYS = ("recompute", "host", "disk", "restart, disk", "restart, disk, cold")


def text_tokens(tok, n: int, seed: int) -> list[int]:
    """``n`` token ids of real text (docs/design.md, from a seeded offset)."""
    text = (HERE.parent / "docs" / "design.md").read_text()
    start = int(np.random.default_rng(seed).integers(0, len(text) - 8 * n))
    ids = tok.encode(text[start:start + 8 * n], add_special_tokens=False)   # ~4 chars a token
    assert len(ids) >= n, "not enough text"
    return ids[:n]


def ttft(engine, prompt) -> float:
    """Seconds from add_request to the first generated token."""
    t0 = time.perf_counter()
    rid = engine.add_request(prompt, pnp.SamplingParams(max_tokens=1, temperature=0))
    out = engine.request_output(rid)
    while not out.samples[0].token_ids:
        engine.step()
    dt = time.perf_counter() - t0
    while engine.has_unfinished_requests():
        engine.step()
    return dt


def timed_loads(engine) -> dict:
    """Wrap the engine's tier loads: their seconds and tokens, summed."""
    acc = {"s": 0.0, "tokens": 0}
    tiers = engine.cache.tiers
    if tiers is None:
        return acc
    inner = tiers.load_prefix

    def load_prefix(*args):
        t0 = time.perf_counter()
        n = inner(*args)
        acc["s"] += time.perf_counter() - t0
        acc["tokens"] += n
        return n

    tiers.load_prefix = load_prefix
    return acc


def drop_page_cache(directory: Path) -> None:
    """Ask the OS to forget the files' cached pages (written back first)."""
    os.sync()
    for p in directory.rglob("*.kv"):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def one_round(model, prompts, way: str, workdir: Path, kv_dtype: str) -> dict:
    system_q0, fillers, system_q1 = prompts
    opts = dict(ARENA, kv_cache_dtype=kv_dtype)
    disk = workdir / "disk"
    if way.startswith("restart"):                       # the disk run's files, a new engine
        if way.endswith("cold"):
            drop_page_cache(disk)
        engine = pnp.Engine(model, disk_cache_dir=str(disk), **opts)
    else:
        extra = {"recompute": {}, "host": {"host_cache_memory": "512MiB"},
                 "disk": {"disk_cache_dir": str(disk)}}[way]
        engine = pnp.Engine(model, **opts, **extra)
        ttft(engine, system_q0)
        for f in fillers:
            ttft(engine, f)
        left = engine.cache.num_cached_prefix_tokens(system_q1)
        assert left == 0, f"{way}: {left} tokens of the system prompt still in the arena"
    loads = timed_loads(engine)
    t = ttft(engine, system_q1)
    per_token = engine.cache.cfg.bytes_per_page / engine.cache.cfg.page_size
    out = engine.stats()
    return {"ttft_s": t, "load_s": loads["s"], "loaded_tokens": loads["tokens"],
            "bytes_per_token": per_token, "hit_tokens": out["prefix_hit_tokens"] if
            way.startswith("restart") else None}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="one round, print only")
    ap.add_argument("--kv-cache-dtype", default="auto")
    args = ap.parse_args(argv)
    rounds = 1 if args.quick else args.rounds
    model, tok = pnp.load_model("smollm2-135m-instruct")
    system = text_tokens(tok, SYSTEM_TOKENS, 0)
    prompts = (system + text_tokens(tok, QUESTION_TOKENS, 1),
               [text_tokens(tok, FILLER_TOKENS, 2 + i) for i in range(2)],
               system + text_tokens(tok, QUESTION_TOKENS, 9))
    warm = pnp.Engine(model, **ARENA)                       # compile the kernels once
    ttft(warm, prompts[2][:600])
    results = {w: [] for w in WAYS}
    for r in range(rounds):
        with tempfile.TemporaryDirectory(prefix="kv_tiers_") as d:
            for way in WAYS:
                res = one_round(model, prompts, way, Path(d), args.kv_cache_dtype)
                results[way].append(res)
                print(f"round {r}: {way:20s} TTFT {res['ttft_s'] * 1e3:7.1f} ms, load "
                      f"{res['load_s'] * 1e3:6.1f} ms ({res['loaded_tokens']} tokens)",
                      file=sys.stderr)
    bw = stream_bandwidth()
    report = render(results, bw, args.kv_cache_dtype, rounds)
    print(report)
    if not args.quick:
        stem = "kv_tiers" if args.kv_cache_dtype == "auto" else f"kv_tiers_{args.kv_cache_dtype}"
        (HERE / f"{stem}.md").write_text(report)
        (HERE / f"{stem}.json").write_text(json.dumps(
            {"results": results, "stream_bandwidth_gbs": bw}, indent=1) + "\n")


def render(results: dict, bw: float, kv_dtype: str, rounds: int) -> str:
    base = statistics.median(r["ttft_s"] for r in results["recompute"])
    per_token = results["recompute"][0]["bytes_per_token"]
    flag = "" if kv_dtype == "auto" else f" --kv-cache-dtype {kv_dtype}"
    fmt = "float32" if kv_dtype == "auto" else kv_dtype
    what = "" if kv_dtype == "auto" else ", codes and scales"
    lines = [
        "# Time to first token from the tiers below the arena",
        "",
        f"`python benchmarks/kv_tiers.py{flag}` on {machine_line()}.",
        f"SmolLM2-135M (Q4_1 blocks), KV pages {fmt}, a {SYSTEM_TOKENS:,}-token system "
        f"prompt + {QUESTION_TOKENS}-token question, evicted from a {ARENA['num_pages']}-page "
        f"arena by two {FILLER_TOKENS:,}-token prompts, asked again. Median of {rounds} "
        "rounds (the ways in turn within a round; min-max in brackets). Bytes moved per "
        f"token: {per_token:,.0f} (every layer, K and V{what}).",
        "",
        "| way | TTFT ms | vs recompute | tokens read back | load ms | read GB/s | "
        "of the machine's |",
        "|---|---|---|---|---|---|---|",
    ]
    for way in WAYS:
        rs = results[way]
        t = [r["ttft_s"] for r in rs]
        med = statistics.median(t)
        loaded = statistics.median(r["loaded_tokens"] for r in rs)
        load = statistics.median(r["load_s"] for r in rs)
        gbs = loaded * per_token / load / 1e9 if load else 0.0
        lines.append(
            f"| {way} | {med * 1e3:.0f} [{min(t) * 1e3:.0f}-{max(t) * 1e3:.0f}] | "
            f"{base / med:.1f}x | {loaded:,.0f} | {load * 1e3:.1f} | "
            + (f"{gbs:.2f} | {gbs / bw:.0%} |" if load else "- | - |"))
    lines += ["", f"Machine's streaming read (`paged_np.hardware.stream_bandwidth`): "
              f"{bw:.1f} GB/s.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
