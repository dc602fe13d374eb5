"""Load on the HTTP server: N concurrent chat clients, throughput and latency.

    python benchmarks/serve_load.py                       # tiny random model, 1/8/32 clients
    python benchmarks/serve_load.py --model smollm2-135m-instruct --max-tokens 16
    python benchmarks/serve_load.py --out benchmarks/serve_load.md

The server runs as its own process (``python -m paged_np serve``), so the
clients do not share its interpreter. Each of N clients is a closed loop: it
sends a streaming chat request, reads every server-sent event, and sends the
next one when the last is done. Every request asks for exactly
``--max-tokens`` tokens (``ignore_eos``), so a request costs the same at
every N. The conversations share a system prompt, as real chat traffic
does, so the prefix cache has something to find.

Reported per N: output tokens per second over the whole run, and the p50
and p99 of time to first token (request sent -> first text chunk) and of
inter-token latency (gaps between text chunks of one stream).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import time

import httpx
import numpy as np

SYSTEM = ("You are a helpful assistant running on a paged KV cache. Answer in a few short, "
          "plain sentences.")
TOPICS = ["the weather", "prime numbers", "paged memory", "a good book", "the ocean",
          "how bread rises", "chess openings", "the moon", "bicycles", "tea",
          "volcanoes", "the number zero"]


HEADER = """# HTTP server under load

Written by `benchmarks/serve_load.py` (see its docstring): the server in its own
process, N closed-loop streaming chat clients, every request asking for the same
number of tokens. Throughput is output tokens per second over the run; TTFT and ITL
are measured by the clients (request sent -> first text chunk; gaps between chunks).
The tables below were measured on a 2-core machine shared with other jobs: the
absolute numbers are noisy; compare the ratios within a table.
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args, port, flags=()) -> subprocess.Popen:
    """``python -m paged_np serve`` in its own process; returns once /health answers.

    Also used by ``dashboard_load.py``; ``flags`` are further ``serve`` flags.
    """
    cmd = [sys.executable, "-m", "paged_np", "serve", "--model", args.model, "--port", str(port),
           "--backend", args.backend, "--num-pages", str(args.num_pages), "--log-level",
           "warning", *flags]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 600
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited: {proc.stderr.read()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise SystemExit("the server did not come up in 10 minutes")
        time.sleep(0.5)


async def one_request(client, url, model, i, max_tokens, record):
    body = {"model": model, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": f"Tell me about {TOPICS[i % len(TOPICS)]} "
                                                     f"(question {i})."}]}
    t0 = time.perf_counter()
    times, tokens = [], 0
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                times.append(time.perf_counter())
    record["ttft"].append(times[0] - t0 if times else float("nan"))
    record["itl"].extend(np.diff(times).tolist())
    record["tokens"] += tokens


async def run_level(url, model, clients, requests_per_client, max_tokens):
    record = {"ttft": [], "itl": [], "tokens": 0}
    counter = iter(range(10**9))
    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        async def closed_loop():
            for _ in range(requests_per_client):
                await one_request(client, url, model, next(counter), max_tokens, record)

        t0 = time.perf_counter()
        await asyncio.gather(*(closed_loop() for _ in range(clients)))
        wall = time.perf_counter() - t0
    return record, wall


def metric(url, name) -> float:
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return float("nan")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-random")
    ap.add_argument("--backend", default="numba")
    ap.add_argument("--clients", default="1,8,32")
    ap.add_argument("--requests-per-client", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-num-seqs", type=int, default=32)
    ap.add_argument("--num-pages", type=int, default=1024)
    ap.add_argument("--out", default=None, help="write the table to this markdown file")
    ap.add_argument("--append", action="store_true",
                    help="add the table to --out instead of replacing the file")
    args = ap.parse_args(argv)
    levels = [int(c) for c in args.clients.split(",")]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_server(args, port, ["--max-num-seqs", str(args.max_num_seqs)])
    rows = []
    try:
        # Warm-up: compile the kernels and fill the shared prefix once.
        asyncio.run(run_level(url, args.model, 2, 1, 4))
        for n in levels:
            steps0 = metric(url, "paged_np:engine_steps_total")
            record, wall = asyncio.run(run_level(url, args.model, n, args.requests_per_client,
                                                 args.max_tokens))
            steps = metric(url, "paged_np:engine_steps_total") - steps0
            ttft, itl = np.array(record["ttft"]) * 1e3, np.array(record["itl"]) * 1e3
            rows.append(dict(clients=n, requests=n * args.requests_per_client,
                             tokens=record["tokens"], wall=wall,
                             tok_s=record["tokens"] / wall, steps=steps,
                             ttft50=np.percentile(ttft, 50), ttft99=np.percentile(ttft, 99),
                             itl50=np.percentile(itl, 50), itl99=np.percentile(itl, 99)))
            r = rows[-1]
            print(f"{n:3d} clients: {r['tok_s']:8.1f} tok/s  TTFT p50 {r['ttft50']:7.1f} ms "
                  f"p99 {r['ttft99']:7.1f} ms  ITL p50 {r['itl50']:6.1f} ms "
                  f"p99 {r['itl99']:6.1f} ms  ({r['requests']} requests, {steps:.0f} steps, "
                  f"{wall:.1f} s)", flush=True)
    finally:
        proc.terminate()
        proc.wait(60)
    base = rows[0]["tok_s"]
    cmd = "python benchmarks/serve_load.py " + " ".join(argv if argv is not None else
                                                        sys.argv[1:])
    lines = [
        f"## `{args.model}`",
        "",
        f"`{cmd.strip()}` on {platform.machine()} ({os.cpu_count()} cores, shared), "
        f"CPython {platform.python_version()}; model `{args.model}`, backend `{args.backend}`, "
        f"{args.max_tokens} output tokens a request (`ignore_eos`), "
        f"{args.requests_per_client} requests per client, streaming chat, greedy.",
        "",
        "| clients | requests | output tok/s | vs 1 client | TTFT p50 | TTFT p99 | ITL p50 "
        "| ITL p99 | engine steps |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['clients']} | {r['requests']} | {r['tok_s']:.1f} | "
                     f"{r['tok_s'] / base:.2f}x | {r['ttft50']:.0f} ms | {r['ttft99']:.0f} ms | "
                     f"{r['itl50']:.1f} ms | {r['itl99']:.1f} ms | {r['steps']:.0f} |")
    table = "\n".join(lines) + "\n"
    print()
    print(table)
    if args.out:
        with open(args.out, "a" if args.append else "w") as f:
            if not args.append:
                f.write(HEADER)
            f.write("\n" + table)


if __name__ == "__main__":
    main()
