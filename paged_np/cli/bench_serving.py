"""``python -m paged_np bench --model NAME``: a real model's decode speed and serving throughput.

Two measurements, two tables (``benchmarks/model_quant.md`` and
``benchmarks/model.md`` with ``--out benchmarks``):

1. **batch-1 decode and prefill**: :func:`paged_np.cli.bench_quant.measure`:
   the GGUF file's quantized weights, the same model dequantized to float32,
   llama.cpp on the same file and transformers, alternating, with the
   quantized weight-streaming bound (file bytes per token over the read
   bandwidth measured in the same run);
2. **serving**: ``--requests`` chat requests (default 64) sharing one system
   prompt, with varied questions and varied ``max_tokens``, served by
   :class:`paged_np.LLM` (continuous batching, prefix cache), against
   transformers' ``generate`` on the same token ids in static batches of
   ``--batch`` (left-padded; each batch runs until its longest request is
   done, the waste continuous batching removes). Both sides ignore EOS so
   they generate the same number of tokens; throughput counts the requested
   tokens only.

paged_np serves twice, on the quantized weights (the default for a
``.gguf`` file) and on float32 ones; all run on the same pinned thread count.
transformers builds the model from the very same float32 weights (written as
a Hugging Face directory).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

SYSTEM = ("You are a patient teacher. Answer in plain words, in a few sentences, and give one "
          "concrete example when it helps the reader.")
TOPICS = ["the moon", "rain", "bread", "a bicycle", "memory in a computer", "volcanoes",
          "the alphabet", "music", "bees", "a library", "electricity", "the ocean tides"]
ASKS = ["What is {}?", "Explain {} to a child.", "Give me three facts about {}.",
        "Why does {} matter, and how would you describe it to a friend who has never heard "
        "of it before?"]


def make_workload(tokenizer, n: int, seed: int = 0):
    """``n`` (prompt token ids, max_tokens): shared system turn, varied questions and lengths."""
    rng = np.random.default_rng(seed)
    work = []
    for i in range(n):
        q = ASKS[i % len(ASKS)].format(TOPICS[int(rng.integers(len(TOPICS)))])
        text = tokenizer.apply_chat_template([{"role": "system", "content": SYSTEM},
                                              {"role": "user", "content": q}])
        work.append((tokenizer.encode(text), int(rng.integers(8, 65))))
    return work


def serve_paged(llm, work) -> float:
    """Seconds for :class:`LLM` to serve the whole workload (all submitted at once)."""
    from ..engine.sampling import SamplingParams

    params = [SamplingParams(max_tokens=m, temperature=0, ignore_eos=True) for _, m in work]
    t0 = time.perf_counter()
    outs = llm.generate([p for p, _ in work], params)
    dt = time.perf_counter() - t0
    if [len(o.outputs[0].token_ids) for o in outs] != [m for _, m in work]:
        from ..errors import PagedNPError

        raise PagedNPError("bench: a request did not generate its max_tokens")
    return dt


def serve_transformers(hf, work, batch: int, pad_id: int) -> float:
    """Seconds for transformers' ``generate`` on static batches of ``batch`` requests."""
    import torch

    t0 = time.perf_counter()
    with torch.inference_mode():
        for s in range(0, len(work), batch):
            chunk = work[s:s + batch]
            width = max(len(p) for p, _ in chunk)
            ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for r, (p, _) in enumerate(chunk):                   # left padding
                ids[r, width - len(p):] = torch.tensor(p)
                mask[r, width - len(p):] = 1
            longest = max(m for _, m in chunk)
            hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=longest,
                        min_new_tokens=longest, do_sample=False, pad_token_id=pad_id)
    return time.perf_counter() - t0


def main(argv: list[str]) -> int:
    from ..engine.llm import LLM
    from ..models import load_model
    from ..models.blas import pinned_threads
    from .bench_model import hf_peer
    from .bench_quant import report

    ap = argparse.ArgumentParser(prog="python -m paged_np bench --model NAME",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16, help="transformers' static batch size")
    ap.add_argument("--max-num-seqs", type=int, default=16,
                    help="paged_np's running requests at most (default 16, as --batch)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--kv-cache-memory", default="256MiB")
    ap.add_argument("--no-peer", action="store_true", help="skip transformers")
    ap.add_argument("--rounds", type=int, default=2, help="serving rounds; the best counts")
    ap.add_argument("--skip-decode", action="store_true", help="serving only")
    ap.add_argument("--out", default=None, help="folder for model.md (e.g. benchmarks)")
    args = ap.parse_args(argv)

    if not args.skip_decode:
        report(args.model, args.threads, 3, not args.no_peer, args.out)
    quant, tok = load_model(args.model)
    f32, _ = load_model(args.model, quantization=None)
    rows = [f"# {args.model}: serving", "",
            f"`python -m paged_np bench {' '.join(argv)}`, {args.threads} thread(s).", ""]
    work = make_workload(tok, args.requests)
    tokens = sum(m for _, m in work)
    models = (("quantized (Q4_1/Q8_0)", quant), ("float32", f32))

    def fresh(model):
        """An LLM with an empty prefix cache (no hits from a past round) whose arena the OS
        has already mapped, as a running server's has: a fresh arena's first writes fault
        its pages in, a cost a running server paid long before."""
        llm = LLM(model, tokenizer=tok, kv_cache_memory=args.kv_cache_memory,
                  max_num_seqs=args.max_num_seqs, max_num_batched_tokens=512, verbose=False)
        llm.engine.cache.arena.fill(0)
        return llm

    ours, theirs, llms = {name: [] for name, _ in models}, [], {}
    with pinned_threads(args.threads):
        for _, model in models:
            fresh(model).generate(work[0][0], None)            # compile the kernels
        hf = None
        if not args.no_peer:
            import torch

            torch.set_num_threads(args.threads)
            hf = hf_peer(f32)
        for _ in range(args.rounds):                           # contenders alternate
            for name, model in models:
                llms[name] = fresh(model)
                ours[name].append(serve_paged(llms[name], work))
            if hf is not None:
                theirs.append(serve_transformers(hf, work, args.batch, tok.eos_token_id))
    ours = {name: min(ts) for name, ts in ours.items()}
    theirs = min(theirs) if theirs else None
    rows[2] = (f"`python -m paged_np bench {' '.join(argv)}`, {args.threads} thread(s); "
               f"best of {args.rounds} rounds, contenders alternating, each paged_np round "
               "on an empty prefix cache in an arena already mapped (as a running server's).")
    rows += [f"| serving {len(work)} requests ({tokens} tokens) | seconds | tokens/s |",
             "|---|---|---|"]
    for name, t in ours.items():
        rows.append(f"| paged_np LLM, {name} (continuous batching, max_num_seqs "
                    f"{args.max_num_seqs}) | {t:.1f} | {tokens / t:.1f} |")
    q, f = ours["quantized (Q4_1/Q8_0)"], ours["float32"]
    if theirs is not None:
        rows += [f"| transformers generate, static batches of {args.batch} | {theirs:.1f} | "
                 f"{tokens / theirs:.1f} |", "",
                 f"paged_np quantized / transformers: {theirs / q:.2f}x; float32 / "
                 f"transformers: {theirs / f:.2f}x"]
    rows.append(f"paged_np quantized / float32: {f / q:.2f}x")
    for name, llm in llms.items():
        m = llm.engine.metrics
        rows += ["", f"paged_np {name} time split (last round): model {m['model_s']:.1f} s, "
                     f"schedule {m['schedule_s']:.1f} s, sample {m['sample_s']:.1f} s; "
                     f"prefix hit rate {m['prefix_hit_rate']:.0%}; preemptions "
                     f"{m['preemptions']}"]
    table = "\n".join(rows) + "\n"
    print(table)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "model.md").write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
