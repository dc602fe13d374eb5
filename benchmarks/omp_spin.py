"""How long Numba's OpenMP threads spin, against a quantized model's speed.

    python benchmarks/omp_spin.py [ROUNDS]   # writes benchmarks/omp_spin.md (2 rounds)

Numba's parallel kernels run on GNU OpenMP threads that spin after each
parallel region (``GOMP_SPINCOUNT``, 300,000 by default) while the next NumPy
product wants the same cores for OpenBLAS. Each setting runs in a fresh
process (libgomp reads the variable when it loads), 2 threads pinned:

- a 17-row product of one layer's gate/up matrix through the quantized
  ``batch`` kernel (Numba's threads only), beside float32 BLAS on the same
  matrix dequantized, each timed right after the other;
- batch-1 decode (32 greedy tokens) and 16 chats of 32 tokens through ``LLM``,
  quantized and float32 weights.

``paged_np`` once set ``GOMP_SPINCOUNT=30000`` on import: with the quantized
products dequantizing panels for BLAS, the default spin had made a 17-row
product 7.8 ms instead of 1.7. The quantized model no longer calls BLAS, and
this table (4 rounds) then measured the default faster in every column, so
``import paged_np`` leaves the variable alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from paged_np.hardware import machine_line

CHILD = r'''
import json, time, numpy as np, paged_np as pnp
from paged_np.models.blas import pinned_threads
from paged_np.quant import kernels as K

def best(fn, n=5):
    fn(); b = 1e9
    for _ in range(n):
        s = time.perf_counter(); fn(); b = min(b, time.perf_counter() - s)
    return b * 1e3

out = {}
with pinned_threads(2):
    q, tok = pnp.load_model("smollm2-135m-instruct")
    qm = q.w_gate_up[0]
    tile = qm.dequantize()
    x = np.random.default_rng(0).standard_normal((17, tile.shape[0])).astype(np.float32)
    out["q17_ms"] = best(lambda: qm.matmul(x))
    out["f32_17_ms"] = best(lambda: x @ tile)
    for quant in ("gguf", None):
        m, tok = pnp.load_model("smollm2-135m-instruct", quantization=quant)
        llm = pnp.LLM(m, tokenizer=tok, verbose=False, max_num_seqs=16)
        p = pnp.SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
        one = ["Hello there, tell me about the moon."]
        llm.generate(one, p)
        b1 = min(best(lambda: llm.generate(one, p), n=1) for _ in range(3)) / 32
        words = ["rain", "bread", "music", "bees"] * 4
        qs = [f"Question {i}: what is {w}?" for i, w in enumerate(words)]
        s = time.perf_counter(); llm.generate(qs, p); t16 = time.perf_counter() - s
        name = "quantized" if quant else "float32"
        out[name + "_b1_ms"] = b1
        out[name + "_16_tok_s"] = 16 * 32 / t16
print("RESULT " + json.dumps(out))
'''

SETTINGS = ["300000", "30000"]


def run(spin: str) -> dict:
    env = dict(os.environ, GOMP_SPINCOUNT=spin)
    p = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                       check=True)
    line = next(x for x in p.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[7:])


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    rows = {s: [] for s in SETTINGS}
    for _ in range(rounds):                              # interleaved rounds
        for s in SETTINGS:
            rows[s].append(run(s))
    lines = ["# GOMP_SPINCOUNT against the quantized model's speed", "",
             f"Written by `python benchmarks/omp_spin.py`. Machine: {machine_line()}, "
             f"2 threads pinned; best of {rounds} interleaved rounds per cell "
             "(times: lower is better; tokens/s: higher).", "",
             "| GOMP_SPINCOUNT | 17-row quantized product ms | same product float32 ms | "
             "batch-1 decode ms/token, quantized | float32 | 16 chats tok/s, quantized | float32 |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for s in SETTINGS:
        def lo(k, r=rows[s]):
            return min(x[k] for x in r)

        def hi(k, r=rows[s]):
            return max(x[k] for x in r)

        who = " (libgomp default)" if s == "300000" else " (paged_np former default)"
        lines.append(f"| {s}{who} "
                     f"| {lo('q17_ms'):.2f} | {lo('f32_17_ms'):.2f} | "
                     f"{lo('quantized_b1_ms'):.1f} | {lo('float32_b1_ms'):.1f} | "
                     f"{hi('quantized_16_tok_s'):.0f} | {hi('float32_16_tok_s'):.0f} |")
    text = "\n".join(lines) + "\n"
    Path(__file__).with_name("omp_spin.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
