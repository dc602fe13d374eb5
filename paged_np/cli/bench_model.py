"""Batch-1 decode speed of a real model, against the weight-streaming bound.

At batch 1, every generated token multiplies one vector by every weight
matrix: the whole model (513 MiB of float32 for SmolLM2-135M) is read from
memory once per token, and the arithmetic is 2 flops per weight. The speed
limit is therefore the memory bus::

    bound (tokens/s) = read bandwidth (bytes/s) / weight bytes read per token

:func:`measure_decode` measures both in the same run, alternating, with the
BLAS and Numba thread counts pinned (see :mod:`paged_np.models.blas`), and
returns tokens/s and its fraction of the bound. The read bandwidth is the
faster of two streaming reads at the same thread count: a Numba sum over
512 MiB and a BLAS matrix-vector product over a 256 MiB matrix (the
operation decode is made of). The decode is a request served by the
:class:`~paged_np.Engine` (``add_request``, then one ``step`` per token), so
a step's time is what the engine delivers, not a hand-built forward pass.
With ``peer=True`` it times
transformers' ``LlamaForCausalLM`` on the same weights (float32, KV cache,
same threads) in alternation, when torch is installed.

Usage (``benchmarks/model_decode.py`` wraps it and writes the table)::

    python -m paged_np.cli.bench_model --threads 1 2 --out benchmarks
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ..hardware import stream_bandwidth
from ..models.blas import pinned_threads


def weight_bytes_per_token(model) -> int:
    """Bytes of weights one decode step reads: every matrix once (the tied LM head
    counted once, as the head; the embedding lookup reads one row)."""
    return model.nbytes


def gemv_bandwidth(repeat: int = 5, mib: int = 256) -> float:
    """GB/s of a float32 matrix-vector product over a ``mib`` MiB matrix (BLAS)."""
    w = np.ones((mib * 2**20 // 4 // 1024, 1024), np.float32)
    x = np.ones((1, w.shape[0]), np.float32)
    best = float("inf")
    for _ in range(repeat + 1):
        t0 = time.perf_counter()
        x @ w
        best = min(best, time.perf_counter() - t0)
    return w.nbytes / best / 1e9


def read_bandwidth(repeat: int = 5) -> float:
    """Streaming read bandwidth (GB/s) at the current thread count: the faster of a
    Numba sum over 512 MiB and a BLAS matrix-vector product over 256 MiB."""
    return max(stream_bandwidth(repeat), gemv_bandwidth(repeat))


def decode_step_times(model, prompt_ids, n_tokens: int, backend: str,
                      page_size: int = 16) -> list[float]:
    """Seconds of each of ``n_tokens`` greedy decode steps after ``prompt_ids``.

    The request goes through the engine's own step API, as a served request
    does: :meth:`Engine.add_request`, then :meth:`Engine.step` once for the
    prefill (not timed: it also samples the first token) and once per timed
    decode step. So each time is one whole engine step at batch 1 (schedule,
    the model's forward over the paged cache, sample), the latency a user of
    the engine sees per token; the model dominates it (the engine's own
    share is ``benchmarks/engine_overhead.py``'s business).
    """
    from ..engine.engine import Engine
    from ..engine.sampling import SamplingParams

    total = len(prompt_ids) + n_tokens + 1
    engine = Engine(model, num_pages=total // page_size + 2, page_size=page_size,
                    max_num_seqs=1, max_num_batched_tokens=max(len(prompt_ids), 1),
                    backend=backend)
    engine.add_request(list(prompt_ids), SamplingParams(max_tokens=n_tokens + 1,
                                                        temperature=0.0))
    engine.step()                                                 # the prefill
    times = []
    for _ in range(n_tokens):
        t0 = time.perf_counter()
        engine.step()                                             # one decode step
        times.append(time.perf_counter() - t0)
    if engine.has_unfinished_requests():                          # max_tokens ends it
        from ..errors import PagedNPError

        raise PagedNPError("bench_model: the request outlived its max_tokens")
    return times


def hf_peer(model):
    """transformers' ``LlamaForCausalLM`` on ``model``'s weights (float32, eager
    attention), or None when torch or transformers is not installed."""
    try:
        import torch
        from transformers import LlamaForCausalLM
    except ImportError:
        return None
    from ..models.hf import save_hf

    if getattr(model, "quantized", False):
        from ..errors import InvalidArgument

        raise InvalidArgument("hf_peer: pass the float32 model (load_model(..., "
                              "quantization=None)); transformers reads float32 weights")
    with tempfile.TemporaryDirectory() as tmp:
        save_hf(tmp, model.cfg, model.w)
        return LlamaForCausalLM.from_pretrained(tmp, torch_dtype=torch.float32,
                                                attn_implementation="eager").eval()


def _hf_decode_steps(hf, prompt_ids, n_tokens: int):
    """The same greedy decode with transformers and its KV cache; seconds per step."""
    import torch

    with torch.inference_mode():
        out = hf(torch.tensor([list(prompt_ids)]), use_cache=True)
        past, tok, times = out.past_key_values, out.logits[:, -1:].argmax(-1), []
        for _ in range(n_tokens):
            t0 = time.perf_counter()
            out = hf(tok, past_key_values=past, use_cache=True)
            past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
            times.append(time.perf_counter() - t0)
    return times


def measure_decode(model, prompt_len: int = 64, n_tokens: int = 16, threads: int = 1,
                   rounds: int = 3, backend: str = "auto", bandwidth: bool = True,
                   peer: bool = False, seed: int = 0) -> dict:
    """Batch-1 greedy decode through the paged cache, with ``threads`` BLAS/Numba threads.

    Each of ``rounds`` rounds runs, one after the other, a paged_np decode (a
    ``prompt_len``-token random prompt, then ``n_tokens`` timed steps), the
    same decode in transformers (``peer=True`` and transformers installed,
    ``torch.set_num_threads(threads)``), and a bandwidth measurement. Each
    keeps its best (the least disturbed moment of a shared machine: every
    contender meets the same quiet moments, so the ratios hold); medians are
    reported too. Returns ``tokens_per_s``, ``ms_per_token``,
    ``median_ms_per_token``, ``weight_bytes``, ``bandwidth_gbs``,
    ``bound_tokens_per_s``, ``fraction_of_bound``, ``threads`` and, with a
    peer, ``transformers_tokens_per_s``, ``transformers_ms_per_token``,
    ``speedup_vs_transformers``.
    """
    rng = np.random.default_rng(seed)
    prompt = rng.integers(3, model.cfg.vocab_size, prompt_len).tolist()
    hf = hf_peer(model) if peer else None
    ours, theirs, best_bw = [], [], 0.0
    with pinned_threads(threads):
        decode_step_times(model, prompt[:8], 2, backend)          # compile, warm the caches
        if hf is not None:
            import torch

            old_torch = torch.get_num_threads()
            torch.set_num_threads(threads)
            _hf_decode_steps(hf, prompt[:8], 2)
        try:
            for _ in range(rounds):
                ours.append(decode_step_times(model, prompt, n_tokens, backend))
                if hf is not None:
                    theirs.append(_hf_decode_steps(hf, prompt, n_tokens))
                if bandwidth:
                    best_bw = max(best_bw, read_bandwidth(3))
        finally:
            if hf is not None:
                torch.set_num_threads(old_torch)
    nbytes = weight_bytes_per_token(model)
    best = min(min(r) for r in ours)
    out = dict(threads=threads, prompt_len=prompt_len, n_tokens=n_tokens,
               ms_per_token=best * 1e3, tokens_per_s=1.0 / best,
               median_ms_per_token=float(np.median(ours)) * 1e3, weight_bytes=nbytes)
    if bandwidth:
        bound = best_bw * 1e9 / nbytes
        out.update(bandwidth_gbs=best_bw, bound_tokens_per_s=bound,
                   fraction_of_bound=out["tokens_per_s"] / bound)
    if theirs:
        t_best = min(min(r) for r in theirs)
        out.update(transformers_ms_per_token=t_best * 1e3,
                   transformers_median_ms_per_token=float(np.median(theirs)) * 1e3,
                   transformers_tokens_per_s=1.0 / t_best,
                   speedup_vs_transformers=t_best / best)
    return out


def write_table(rows: list[dict], model_name: str) -> str:
    """The markdown table of :func:`main`'s results (rows from :func:`measure_decode`)."""
    lines = [
        f"# Batch-1 decode: {model_name}",
        "",
        "Written by `python benchmarks/model_decode.py` (`paged_np/cli/bench_model.py`). "
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, NumPy {np.__version__}. Greedy decode through the paged "
        "cache after a 64-token prompt, 16 timed steps per round, paged_np, transformers "
        "(float32, eager attention, its KV cache, same thread count) and the bandwidth read "
        "alternating; best step of all rounds (median in brackets). Bound = read bandwidth "
        "measured in the same run / weight bytes per token.",
        "",
        "| threads | paged_np ms/token | tokens/s | weights MiB/token | read GB/s | "
        "bound tokens/s | % of bound | transformers ms/token | tokens/s | paged_np vs "
        "transformers |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        peer = ("", "", "")
        if "transformers_tokens_per_s" in r:
            peer = (f"{r['transformers_ms_per_token']:.1f} "
                    f"({r['transformers_median_ms_per_token']:.1f})",
                    f"{r['transformers_tokens_per_s']:.1f}",
                    f"{r['speedup_vs_transformers']:.2f}x")
        bw = (f"{r['bandwidth_gbs']:.1f}", f"{r['bound_tokens_per_s']:.1f}",
              f"{100 * r['fraction_of_bound']:.0f}%") if "bandwidth_gbs" in r else ("", "", "")
        lines.append(f"| {r['threads']} | {r['ms_per_token']:.1f} "
                     f"({r['median_ms_per_token']:.1f}) | {r['tokens_per_s']:.1f} | "
                     f"{r['weight_bytes'] / 2**20:.0f} | {bw[0]} | {bw[1]} | {bw[2]} | "
                     f"{peer[0]} | {peer[1]} | {peer[2]} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from ..models import load_model

    ap = argparse.ArgumentParser(prog="python -m paged_np.cli.bench_model",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-peer", action="store_true", help="skip transformers")
    ap.add_argument("--out", default=None, help="folder for model_decode.md")
    args = ap.parse_args(argv)
    model, _ = load_model(args.model, quantization=None)         # the float32 path
    rows = []
    for t in args.threads:
        r = measure_decode(model, threads=t, rounds=args.rounds, peer=not args.no_peer)
        rows.append(r)
        line = (f"threads={t}: paged_np {r['tokens_per_s']:.1f} tokens/s, "
                f"{100 * r['fraction_of_bound']:.0f}% of {r['bound_tokens_per_s']:.1f} "
                f"({r['bandwidth_gbs']:.1f} GB/s)")
        if "transformers_tokens_per_s" in r:
            line += f"; transformers {r['transformers_tokens_per_s']:.1f} tokens/s"
        elif not args.no_peer:
            line += "; transformers not installed (pip install torch==2.13.0 transformers)"
        print(line, flush=True)
        if args.out:                                             # after each row: a slow
            Path(args.out).mkdir(parents=True, exist_ok=True)    # machine keeps what it got
            (Path(args.out) / "model_decode.md").write_text(write_table(rows, args.model))
    print(write_table(rows, args.model))
    return 0


if __name__ == "__main__":
    sys.exit(main())
