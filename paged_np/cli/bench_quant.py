"""Batch-1 decode and prefill of a GGUF model: quantized, float32, llama.cpp, transformers.

One run, the five contenders alternating round by round on the same pinned
thread count (BLAS, Numba, llama.cpp's ``n_threads``, torch):

- **paged_np, quantized**: ``load_model(path)`` (``quantization="gguf"``: the
  file's Q4_1/Q8_0 blocks, :mod:`paged_np.quant`'s kernels), served by the
  :class:`~paged_np.Engine` (one step for the prefill, one per token);
- **paged_np, int8 inputs**: ``load_model(path, quantization="gguf_a8")``: the
  same blocks, each product's input quantized to int8 (:mod:`paged_np.quant.int8`,
  llama.cpp's arithmetic; a measured option, not the default);
- **paged_np, float32**: ``load_model(path, quantization=None)``, BLAS;
- **llama.cpp** (llama-cpp-python, the ``compare`` extra; it builds from
  source, about 10 minutes on 2 cores) on the same file: ``eval`` of the
  prompt, then of one token at a time;
- **transformers**: ``LlamaForCausalLM`` on the float32 weights, its KV cache.

Each reports the prefill of a ``prompt_len``-token chat prompt (~110) and the
best and median decode step. The **bound** is the quantized weight-streaming
bound: the bytes of the file's weight tensors (every one read once per token;
the tied embedding once, as the LM head) over the read bandwidth measured in
the same run at the same thread count.

    python -m paged_np.cli.bench_quant --threads 2 --out benchmarks
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

PROMPT = ("Here is a short story draft about a lighthouse keeper who finds a message in a "
          "bottle that was written forty years earlier by his own grandmother. Read it and "
          "tell me, in a few sentences, what the keeper should do next, what the message "
          "might say, and how the story could end in a way that surprises the reader but "
          "still feels earned. Keep the tone warm and a little mysterious, and suggest a "
          "title that fits the mood of the sea at night.")


def chat_prompt(tokenizer, n: int) -> list[int]:
    """``n`` token ids of a chat prompt (the template around :data:`PROMPT`, cut to ``n``)."""
    ids = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}]))
    while len(ids) < n:
        ids = ids + ids
    return ids[:n]


def engine_times(model, prompt, n_tokens: int, page_size: int = 16):
    """paged_np through the engine: ``(prefill seconds, [seconds of each decode step])``."""
    from ..engine.engine import Engine
    from ..engine.sampling import SamplingParams

    total = len(prompt) + n_tokens + 1
    engine = Engine(model, num_pages=total // page_size + 2, page_size=page_size,
                    max_num_seqs=1, max_num_batched_tokens=len(prompt))
    engine.add_request(list(prompt), SamplingParams(max_tokens=n_tokens + 1, temperature=0.0,
                                                    ignore_eos=True))
    t0 = time.perf_counter()
    engine.step()                                                # prefill + first token
    prefill = time.perf_counter() - t0
    steps = []
    for _ in range(n_tokens):
        t0 = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - t0)
    return prefill, steps


def llama_cpp_peer(path, threads: int):
    """``(Llama, None)`` on the same file, or ``(None, why)`` when llama-cpp-python is missing."""
    try:
        from llama_cpp import Llama
    except ImportError:
        return None, ("llama-cpp-python is not installed: pip install 'paged-np[compare]' "
                      "(it builds llama.cpp from source, about 10 minutes on 2 cores)")
    return Llama(model_path=str(path), n_ctx=512, n_threads=threads, n_threads_batch=threads,
                 n_batch=512, verbose=False), None


def llama_cpp_times(llm, prompt, n_tokens: int):
    """llama.cpp: ``(prefill seconds, [seconds of each greedy decode step])``."""
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(list(prompt))
    prefill = time.perf_counter() - t0
    steps = []
    for _ in range(n_tokens):
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        t0 = time.perf_counter()
        llm.eval([tok])
        steps.append(time.perf_counter() - t0)
    return prefill, steps


def hf_times(hf, prompt, n_tokens: int):
    """transformers with its KV cache: ``(prefill seconds, [seconds of each decode step])``."""
    import torch

    with torch.inference_mode():
        t0 = time.perf_counter()
        out = hf(torch.tensor([list(prompt)]), use_cache=True)
        prefill = time.perf_counter() - t0
        past, tok, steps = out.past_key_values, out.logits[:, -1:].argmax(-1), []
        for _ in range(n_tokens):
            t0 = time.perf_counter()
            out = hf(tok, past_key_values=past, use_cache=True)
            past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
            steps.append(time.perf_counter() - t0)
    return prefill, steps


_COMPILE_PROBE = r"""
import time
import numpy as np
from paged_np.models import fused
from paged_np.quant import QuantMatrix
rng = np.random.default_rng(0)
q = rng.integers(0, 16, (64, 2, 32)).astype(np.uint8)
d, m = (rng.random((2, 64, 2)) * 0.01).astype(np.float32)
mats = [QuantMatrix.from_blocks("Q4_1", q, d, m),
        QuantMatrix.from_float(rng.standard_normal((64, 64)).astype(np.float32))]
t0 = time.perf_counter()
for qm in mats:
    for T in (1, 4):                                    # the rows and the batch kernel
        rng.standard_normal((T, 64)).astype(np.float32) @ qm
    qm[np.array([0, 5])]                                # the embedding rows
x = rng.standard_normal((2, 64)).astype(np.float32)
fused.rms_norm(x, np.ones(64, np.float32), 1e-5)
fused.silu_mul(x, 32)
cos = np.ones((2, 8), np.float32)
fused.rope_qk(rng.standard_normal((2, 64)).astype(np.float32), cos, cos, 2, 1, 16)
print(time.perf_counter() - t0)
"""


def quant_compile_seconds() -> float:
    """Seconds to compile the quantized kernels and the fused layer operations, in a
    fresh process with an empty Numba cache (imports not counted)."""
    import subprocess
    import tempfile

    root = Path(__file__).resolve().parents[2]                    # the folder of paged_np
    with tempfile.TemporaryDirectory() as cache_dir:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir,
                   PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
        r = subprocess.run([sys.executable, "-c", _COMPILE_PROBE], env=env,
                           capture_output=True, text=True, check=True)
    return float(r.stdout.strip().splitlines()[-1])


def file_weight_bytes(path) -> int:
    """Bytes of the weight tensors in a GGUF file: what a decode step reads at least."""
    import gguf

    reader = gguf.GGUFReader(str(path), "r")
    try:
        return int(sum(int(t.n_bytes) for t in reader.tensors))
    finally:
        del reader


def measure(name: str = "smollm2-135m-instruct", threads: int = 2, rounds: int = 3,
            prompt_len: int = 110, n_tokens: int = 16, peers: bool = True) -> dict:
    """Prefill and batch-1 decode of every contender, alternating; returns a dict of rows."""
    from ..models import load_model
    from ..models.blas import pinned_threads
    from ..models.hub import fetch_model
    from .bench_model import hf_peer, read_bandwidth

    path = fetch_model(name) if not str(name).endswith(".gguf") else Path(name)
    quant, tok = load_model(path)
    a8, _ = load_model(path, quantization="gguf_a8")
    f32, _ = load_model(path, quantization=None)
    prompt = chat_prompt(tok, prompt_len)
    runs = {"paged_np quantized": lambda: engine_times(quant, prompt, n_tokens),
            "paged_np int8 inputs": lambda: engine_times(a8, prompt, n_tokens),
            "paged_np float32": lambda: engine_times(f32, prompt, n_tokens)}
    missing = {}
    with pinned_threads(threads):
        if peers:
            llm, why = llama_cpp_peer(path, threads)
            if llm is None:
                missing["llama.cpp"] = why
            else:
                runs["llama.cpp"] = lambda: llama_cpp_times(llm, prompt, n_tokens)
            hf = hf_peer(f32)
            if hf is None:
                missing["transformers"] = "pip install torch transformers"
            else:
                import torch

                torch.set_num_threads(threads)
                runs["transformers"] = lambda: hf_times(hf, prompt, n_tokens)
        for fn in runs.values():                                 # compile, warm the caches
            fn()
        got = {k: ([], []) for k in runs}
        bw = 0.0
        for _ in range(rounds):
            for k, fn in runs.items():
                p, s = fn()
                got[k][0].append(p)
                got[k][1].extend(s)
            bw = max(bw, read_bandwidth(3))
    file_bytes = file_weight_bytes(path)
    rows = {k: dict(prefill_s=min(p), decode_ms=1e3 * min(s),
                    decode_median_ms=1e3 * float(np.median(s))) for k, (p, s) in got.items()}
    return dict(model=str(name), threads=threads, prompt_len=prompt_len, n_tokens=n_tokens,
                rounds=rounds, rows=rows, missing=missing, bandwidth_gbs=bw,
                file_weight_bytes=file_bytes, quant_bytes=quant.nbytes, a8_bytes=a8.nbytes,
                f32_bytes=f32.nbytes,
                bound_tokens_per_s=bw * 1e9 / file_bytes)


def write_table(res: dict) -> str:
    """Markdown: one row per contender, then the ratios the issue's targets name."""
    from ..hardware import cpu_model, isa_info

    info = isa_info()
    isa = f"{info['cpu_isa']} (Numba code: {info['codegen']})"
    rows, bound = res["rows"], res["bound_tokens_per_s"]
    q = rows["paged_np quantized"]
    lines = [f"# {res['model']}: quantized weights, batch-1 decode and prefill", "",
             f"`python -m paged_np bench --model {res['model']} --threads {res['threads']}` "
             "(`paged_np/cli/bench_quant.py`). Machine: "
             f"{cpu_model()}, {os.cpu_count()} cores, {isa}, {res['threads']} thread(s) "
             f"for every contender, Python {platform.python_version()}, NumPy {np.__version__}. "
             f"Prompt {res['prompt_len']} tokens (chat template), {res['n_tokens']} greedy "
             f"decode steps per round, {res['rounds']} rounds, contenders alternating; best "
             "step (median in brackets), best prefill.", "",
             "| weights | bytes held | prefill ms | decode ms/token | tokens/s | vs quantized |",
             "|---|---|---|---|---|---|"]
    held = {"paged_np quantized": res["quant_bytes"], "paged_np float32": res["f32_bytes"],
            "paged_np int8 inputs": res.get("a8_bytes"), "llama.cpp": res["file_weight_bytes"]}
    for k, r in rows.items():
        mib = f"{held[k] / 2**20:.0f} MiB" if held.get(k) else "float32"
        lines.append(f"| {k} | {mib} | {1e3 * r['prefill_s']:.0f} | {r['decode_ms']:.2f} "
                     f"({r['decode_median_ms']:.2f}) | {1e3 / r['decode_ms']:.1f} | "
                     f"{r['decode_ms'] / q['decode_ms']:.2f}x |")
    lines += ["", f"Quantized weight-streaming bound: {res['file_weight_bytes'] / 1e6:.1f} MB "
              f"of file weights per token / {res['bandwidth_gbs']:.1f} GB/s read = "
              f"{bound:.0f} tokens/s; paged_np quantized reaches "
              f"{100 * 1e3 / q['decode_ms'] / bound:.0f}% of it."]
    f = rows["paged_np float32"]
    lines.append(f"Decode, quantized / float32: {f['decode_ms'] / q['decode_ms']:.2f}x.")
    if "llama.cpp" in rows:
        c = rows["llama.cpp"]
        lines.append(f"Decode, quantized / llama.cpp: {c['decode_ms'] / q['decode_ms']:.2f}x; "
                     f"prefill: {c['prefill_s'] / q['prefill_s']:.2f}x.")
        if "paged_np int8 inputs" in rows:                  # the same arithmetic as llama.cpp
            a = rows["paged_np int8 inputs"]
            lines.append(f"Decode, int8 inputs / llama.cpp: {c['decode_ms'] / a['decode_ms']:.2f}x"
                         f"; prefill: {c['prefill_s'] / a['prefill_s']:.2f}x.")
    if "compile_s" in res:
        lines.append(f"Cold compile of the quantized kernels and the fused layer operations "
                     f"(empty Numba cache, imports not counted): {res['compile_s']:.1f} s.")
    for k, why in res["missing"].items():
        lines.append(f"{k}: missing ({why}).")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m paged_np.cli.bench_quant",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-peer", action="store_true", help="skip llama.cpp and transformers")
    ap.add_argument("--out", default=None, help="folder for model_quant.md")
    args = ap.parse_args(argv)
    report(args.model, args.threads, args.rounds, not args.no_peer, args.out)
    return 0


def report(name: str, threads: int, rounds: int, peers: bool, out: str | None) -> str:
    """Measure, add the cold compile, print the table and write ``out/model_quant.md``."""
    res = measure(name, threads=threads, rounds=rounds, peers=peers)
    res["compile_s"] = quant_compile_seconds()
    table = write_table(res)
    print(table, flush=True)
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "model_quant.md").write_text(table)
    return table


if __name__ == "__main__":
    sys.exit(main())
