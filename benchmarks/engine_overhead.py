"""Engine overhead with 32 running sequences: scheduler + metadata vs the model.

    python benchmarks/engine_overhead.py [--backend numba] [--size tiny|small]

Warm-up (prefill of 32 prompts and JIT compilation) is excluded: the numbers
cover decode steps with all 32 sequences running. "schedule" is picking the
tokens, allocating slots and building the varlen batch; "sample" is
append_tokens, sampling and finishing; "model" is the forward pass.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import paged_np as pnp

SIZES = {
    "tiny": pnp.ModelConfig(),
    "small": pnp.ModelConfig(vocab_size=4096, hidden_size=512, num_layers=4, num_heads=8,
                             num_kv_heads=4, head_dim=64, intermediate_size=1376),
}


def run(backend: str, size: str, seqs: int = 32, prompt_len: int = 128, decode: int = 64):
    model = pnp.LlamaModel.random(SIZES[size], seed=0)
    rng = np.random.default_rng(0)
    engine = pnp.Engine(model, num_pages=seqs * 16, page_size=16, max_num_seqs=seqs,
                        max_num_batched_tokens=seqs * prompt_len, backend=backend)
    params = pnp.SamplingParams(max_tokens=decode, temperature=0.0)
    for _ in range(seqs):
        engine.add_request(rng.integers(0, model.cfg.vocab_size, prompt_len).tolist(), params)
    engine.step()                                  # every prefill (and the JIT) in one step
    engine.step()
    before = engine.metrics
    t0 = time.perf_counter()
    steps = 0
    while steps < decode - 4:                      # decode steps, all sequences running
        engine.step()
        steps += 1
    wall = time.perf_counter() - t0
    m = engine.metrics
    d = {k: m[k] - before[k] for k in ("schedule_s", "model_s", "sample_s", "generated_tokens")}
    total = d["schedule_s"] + d["model_s"] + d["sample_s"]
    print(f"{size:>5} {backend:>5}: per step schedule {d['schedule_s'] / steps * 1e3:6.2f} ms, "
          f"model {d['model_s'] / steps * 1e3:7.2f} ms, sample {d['sample_s'] / steps * 1e3:5.2f}"
          f" ms; overhead {(d['schedule_s'] + d['sample_s']) / total:5.1%} "
          f"(schedule+metadata {d['schedule_s'] / total:5.1%}); "
          f"{d['generated_tokens'] / wall:7.0f} tokens/s")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default=None)
    p.add_argument("--size", default=None)
    a = p.parse_args()
    for size in [a.size] if a.size else list(SIZES):
        for backend in [a.backend] if a.backend else ["numpy", "numba"]:
            run(backend, size)
