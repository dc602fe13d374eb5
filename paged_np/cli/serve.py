"""``python -m paged_np serve``: an OpenAI-compatible HTTP server over the engine.

::

    python -m paged_np serve --model smollm2-135m-instruct --port 8000
    python -m paged_np serve --model tiny-random          # no download: random weights

Then point any OpenAI client at ``http://127.0.0.1:8000/v1`` (see
:mod:`paged_np.engine.server` for the endpoints). Ctrl-C or SIGTERM lets
in-flight requests finish for ``--drain-timeout`` seconds, aborts the rest
and exits.
"""

from __future__ import annotations

import argparse

# A model that needs no download: random weights and the tiny test tokenizer.
TINY_MODEL = "tiny-random"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m paged_np serve",
                                 description="An OpenAI-compatible server over the paged engine.")
    ap.add_argument("--model", default="smollm2-135m-instruct",
                    help=f"known name, .gguf file, Hugging Face directory, or {TINY_MODEL!r}")
    ap.add_argument("--served-model-name", default=None,
                    help="the name clients send as 'model' (default: --model)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--kv-cache-memory", default=None,
                    help="KV cache budget, e.g. 256MiB (the default) or a number of bytes")
    ap.add_argument("--num-pages", type=int, default=None,
                    help="KV cache size in pages (instead of --kv-cache-memory)")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--max-num-seqs", type=int, default=32)
    ap.add_argument("--max-num-batched-tokens", type=int, default=None)
    ap.add_argument("--backend", default="auto", choices=["auto", "numba", "numpy"])
    ap.add_argument("--eviction-policy", default="lru", choices=["lru", "fifo", "lfu"])
    ap.add_argument("--preemption-mode", default="recompute", choices=["recompute", "swap"])
    ap.add_argument("--seed", type=int, default=0, help="weights seed of --model tiny-random")
    ap.add_argument("--drain-timeout", type=float, default=5.0,
                    help="seconds in-flight requests get to finish at shutdown")
    ap.add_argument("--log-level", default="info")
    return ap


def tiny_model(seed: int = 0):
    """A small random Llama and the tiny tokenizer: a server that starts in a second."""
    from ..config import ModelConfig
    from ..models.llama import LlamaModel
    from ..models.tokenizer import Tokenizer

    tok = Tokenizer.tiny()
    cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=64, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=16, intermediate_size=128,
                      max_position_embeddings=1024)
    return LlamaModel.random(cfg, seed=seed), tok


def build_llm(args):
    """The :class:`paged_np.LLM` the server drives, from the command's options."""
    from ..engine.llm import LLM

    if args.model == TINY_MODEL:
        model, tok = tiny_model(args.seed)
    else:
        from ..models import load_model

        model, tok = load_model(args.model)
    llm = LLM(model, tokenizer=tok, kv_cache_memory=args.kv_cache_memory,
              num_pages=args.num_pages, page_size=args.page_size,
              max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
              backend=args.backend, eviction_policy=args.eviction_policy,
              preemption_mode=args.preemption_mode, verbose=True)
    llm.model_name = args.served_model_name or args.model
    return llm


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from ..engine.server import serve

    llm = build_llm(args)
    print(f"serving {args.served_model_name or args.model} on http://{args.host}:{args.port}/v1 "
          f"({llm.engine.cache.cfg.num_pages} pages of {llm.engine.cache.cfg.page_size} tokens)",
          flush=True)
    serve(llm, host=args.host, port=args.port, served_model_name=args.served_model_name
          or args.model, drain_s=args.drain_timeout, log_level=args.log_level)
    return 0
