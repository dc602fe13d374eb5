"""Does watching the cache slow the server? Throughput with 0, 1 and 5 dashboard streams.

    python benchmarks/dashboard_load.py                                  # tiny random model
    python benchmarks/dashboard_load.py --model smollm2-135m-instruct --max-tokens 16
    python benchmarks/dashboard_load.py --out benchmarks/dashboard_load.md [--append]

Issue 28's bar: with the dashboard open, serving throughput is no more than 5%
lower than with it closed. The server runs as its own process
(``python -m paged_np serve``). A trial is one batch of ``--chats`` concurrent
chats sent by the ``openai`` client (threads in this process, over loopback),
every chat sharing a system prompt and asking for exactly ``--max-tokens``
tokens (``ignore_eos``); its throughput is output tokens over the batch's wall
time. During a trial with k watchers, a separate process (standing in for k
browser tabs) holds k ``GET /v1/cache/stream`` streams open and parses every
event as JSON, as the page does. The three settings are alternated in every
round, so a slow minute of the shared machine hurts them alike; the table
reports each setting's median over the rounds and its ratio to no watcher.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
from serve_load import free_port, start_server  # this folder's serving benchmark

SYSTEM = ("You are a helpful assistant running on a paged KV cache. Answer in a few short, "
          "plain sentences.")
HERE = os.path.abspath(__file__)
ROOT = os.path.dirname(os.path.dirname(HERE))


# ---------------------------------------------------------------- the watchers
def watch(url: str, k: int) -> None:
    """The watcher process: hold ``k`` streams, parse every event; on stdin's end,
    print ``events bytes`` and exit."""
    counts = [0, 0]
    lock = threading.Lock()

    def one():
        with httpx.stream("GET", url + "/v1/cache/stream", timeout=None) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    json.loads(line[6:])
                    with lock:
                        counts[0] += 1
                        counts[1] += len(line)

    for _ in range(k):
        threading.Thread(target=one, daemon=True).start()
    while counts[0] < k:                              # every stream has its snapshot
        time.sleep(0.01)
    print("ready", flush=True)
    t0, cpu0 = time.perf_counter(), time.process_time()
    sys.stdin.read()                                  # until the benchmark closes it
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    print(counts[0] - k, counts[1], wall, cpu, flush=True)   # updates, bytes, s, CPU s


def start_watchers(url, k):
    proc = subprocess.Popen([sys.executable, HERE, "--watch", url, str(k)], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def stop_watchers(proc) -> tuple[float, float, float]:
    """(updates a second, bytes a second, CPU share) of the watcher process, all streams."""
    out, _ = proc.communicate("", timeout=30)
    updates, nbytes, seconds, cpu = (float(x) for x in out.split())
    return updates / seconds, nbytes / seconds, cpu / seconds


def engine_seconds(url) -> tuple[float, float]:
    """(seconds inside engine steps, seconds building the cache's view) from /metrics."""
    out = {}
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("paged_np:engine_step_seconds_sum", "paged_np:cache_view_seconds_total"):
            out[name] = float(value)
    return out["paged_np:engine_step_seconds_sum"], out["paged_np:cache_view_seconds_total"]


# ------------------------------------------------------------------ the load
def batch(client, model, chats, max_tokens, round_, batches=1) -> tuple[int, float]:
    """``batches`` times ``chats`` concurrent chats; returns (output tokens, wall seconds)."""

    def one(i):
        r = client.chat.completions.create(
            model=model, max_tokens=max_tokens, temperature=0, extra_body={"ignore_eos": True},
            messages=[{"role": "system", "content": SYSTEM},
                      {"role": "user", "content": f"Question {round_}.{i}: tell me a fact."}])
        return r.usage.completion_tokens

    t0 = time.perf_counter()
    tokens = 0
    with ThreadPoolExecutor(chats) as pool:
        for b in range(batches):
            tokens += sum(pool.map(one, range(b * chats, (b + 1) * chats)))
    return tokens, time.perf_counter() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny-random")
    ap.add_argument("--backend", default="numba")
    ap.add_argument("--num-pages", type=int, default=512)
    ap.add_argument("--chats", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--batches", type=int, default=4, help="batches in one trial")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--watchers", default="0,1,5")
    ap.add_argument("--out", default=None)
    ap.add_argument("--append", action="store_true")
    ap.add_argument("--watch", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.watch:
        return watch(args.watch[0], int(args.watch[1]))
    import openai

    settings = [int(k) for k in args.watchers.split(",")]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_server(args, port)
    try:
        model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0,
                               timeout=600)
        batch(client, model, args.chats, args.max_tokens, -1)      # warm up: JIT, caches
        rates = {k: [] for k in settings}
        updates = {k: [] for k in settings}
        shares = {k: [] for k in settings}            # view seconds / step seconds
        watcher_cpu = {k: [] for k in settings}       # the watcher process's CPU share
        kib_s = {k: [] for k in settings}             # KiB/s of events, all streams
        for r in range(args.rounds):
            order = settings if r % 2 == 0 else settings[::-1]      # alternate, both ways
            for k in order:
                watchers = start_watchers(url, k) if k else None
                step0, view0 = engine_seconds(url)
                tokens, wall = batch(client, model, args.chats, args.max_tokens, r,
                                     args.batches)
                step1, view1 = engine_seconds(url)
                per_s, bytes_s, cpu = stop_watchers(watchers) if watchers else (0.0, 0.0, 0.0)
                per_s /= max(k, 1)
                rates[k].append(tokens / wall)
                updates[k].append(per_s)
                watcher_cpu[k].append(cpu)
                kib_s[k].append(bytes_s / 1024)
                shares[k].append((view1 - view0) / (step1 - step0))
                print(f"round {r} watchers {k}: {tokens / wall:7.1f} tok/s in {wall:.1f} s, "
                      f"{per_s:4.1f} updates/s a stream, view {shares[k][-1]:.2%} of step "
                      "time", flush=True)
    finally:
        server.terminate()
        server.wait(30)
    base = np.array(rates[settings[0]])
    cmd = "python benchmarks/dashboard_load.py " + " ".join(
        argv if argv is not None else sys.argv[1:])
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [f"## `{args.model}`", "",
             f"`{cmd.strip()}` on {platform.machine()} ({os.cpu_count()} cores, shared; load "
             f"average {load:.2f} at the end), CPython {platform.python_version()}; backend "
             f"`{args.backend}`, {args.num_pages} pages; a batch of {args.chats} concurrent "
             f"chats x {args.max_tokens} output tokens (`ignore_eos`, greedy, one shared system "
             f"prompt), {args.batches} batches a trial, {args.rounds} rounds, settings "
             "alternated. *vs none*: the median over rounds of the round's ratio to its own "
             "trial without a stream (paired, so a slow minute cancels out).", "",
             "| dashboard streams | output tok/s (median) | min | max | vs none (median) "
             "| vs none (worst round) | updates/s a stream | KiB/s, all streams "
             "| view / step time | watcher CPU |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for k in settings:
        ratio = np.array(rates[k]) / base
        lines.append(f"| {k} | {np.median(rates[k]):.1f} | {min(rates[k]):.1f} | "
                     f"{max(rates[k]):.1f} | {np.median(ratio):.3f}x | {ratio.min():.3f}x | "
                     f"{np.median(updates[k]) if k else 0:.1f} | {np.median(kib_s[k]):.0f} | "
                     f"{np.median(shares[k]):.2%} | {np.median(watcher_cpu[k]):.0%} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        header = "" if args.append else HEADER
        with open(args.out, "a" if args.append else "w") as f:
            f.write(header + "\n" + text)


HEADER = """# Serving throughput with the dashboard open

Written by `benchmarks/dashboard_load.py` (see its docstring): the server in its own
process; a batch of concurrent chats from the `openai` client over loopback; during a
trial with k streams, a separate process holds k `GET /v1/cache/stream` streams open and
parses every event (what k open dashboard tabs cost the server). Settings alternate
within each round. Issue 28's bar: with the dashboard open, no more than 5% lower than
closed (ratio >= 0.95). *view / step time* is the engine loop's own account
(`/metrics`: `cache_view_seconds_total` over `engine_step_seconds_sum`): the time it
spent building snapshots and updates, as a share of the time it spent stepping;
*watcher CPU* is the CPU the watcher process (the stand-in for the tabs) used, as a
share of one core: on a 2-core machine that is CPU the server does not get.
"""


if __name__ == "__main__":
    main()
