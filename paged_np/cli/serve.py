"""``python -m paged_np serve``: an OpenAI-compatible HTTP server over the engine.

::

    python -m paged_np serve --model smollm2-135m-instruct --port 8000
    python -m paged_np serve --model tiny-random          # no download: random weights
    python -m paged_np serve --prefix-cache radix --schedule lpm   # multi-turn chat's best
    python -m paged_np serve --model tiny-random --open  # and watch the cache: /dashboard

Then point any OpenAI client at ``http://127.0.0.1:8000/v1`` (see
:mod:`paged_np.server` for the endpoints). Ctrl-C or SIGTERM lets
in-flight requests finish for ``--drain-timeout`` seconds, aborts the rest
and exits.

``--open`` opens ``/dashboard`` (the cache, live) in your browser once the server
listens. ``--api-key KEY`` (vLLM's flag) makes every route but ``/health`` answer
401 without ``Authorization: Bearer KEY`` (the dashboard's routes also take
``?api_key=KEY``). The dashboard shows token counts, pages and states; only
``--dashboard-show-text`` adds the prompts' and answers' text to ``/v1/cache``.

Every :class:`~paged_np.EngineConfig` field is a flag (``--help`` lists them,
:mod:`paged_np.cli.options` makes them), so an engine option reaches the
server without a line here.
"""

from __future__ import annotations

import argparse

from . import kv_capacity_line
from .options import (
    add_engine_args,
    add_quantization_arg,
    engine_config,
    engine_options,
    quantization_of,
)

# A model that needs no download: random weights and the tiny test tokenizer.
TINY_MODEL = "tiny-random"

#: The server's own defaults for engine options (the rest are EngineConfig's).
SERVE_DEFAULTS = {"max_num_seqs": 32, "max_num_batched_tokens": 512}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m paged_np serve",
                                 description="An OpenAI-compatible server over the paged engine.")
    ap.add_argument("--model", default="smollm2-135m-instruct",
                    help=f"known name, .gguf file, Hugging Face directory, or {TINY_MODEL!r}")
    ap.add_argument("--served-model-name", default=None,
                    help="the name clients send as 'model' (default: --model)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--seed", type=int, default=0, help="weights seed of --model tiny-random")
    ap.add_argument("--drain-timeout", type=float, default=5.0,
                    help="seconds in-flight requests get to finish at shutdown")
    ap.add_argument("--log-level", default="info")
    ap.add_argument("--api-key", default=None,
                    help="every route but /health answers 401 without 'Authorization: Bearer "
                         "KEY' (the dashboard's routes also take ?api_key=KEY)")
    ap.add_argument("--open", action="store_true",
                    help="open the dashboard (/dashboard) in the browser once the server listens")
    ap.add_argument("--dashboard-show-text", action="store_true",
                    help="let /v1/cache and the dashboard show prompt and answer text "
                         "(default: token counts, pages and states only)")
    # every EngineConfig field is a flag (--prefix-cache radix --schedule lpm ...);
    # a server seats more sequences, and batches more tokens, than the library's defaults
    add_quantization_arg(ap)
    add_engine_args(ap, defaults=SERVE_DEFAULTS)
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

        model, tok = load_model(args.model, quantization=quantization_of(args))
    llm = LLM(model, tokenizer=tok, verbose=True, **engine_options(args))
    llm.model_name = args.served_model_name or args.model
    return llm


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    engine_config(args, parser)                  # a refused option exits here, before loading
    quantization_of(args, parser, random_model=args.model == TINY_MODEL)
    from ..server import serve

    llm = build_llm(args)
    print(f"serving {args.served_model_name or args.model} on http://{args.host}:{args.port}/v1 "
          f"({llm.engine.cache.cfg.num_pages} pages of {llm.engine.cache.cfg.page_size} tokens)",
          flush=True)
    print(kv_capacity_line(llm.engine.cache.cfg), flush=True)
    print(f"the cache, live: http://{args.host}:{args.port}/dashboard", flush=True)
    serve(llm, host=args.host, port=args.port, served_model_name=args.served_model_name
          or args.model, drain_s=args.drain_timeout, log_level=args.log_level,
          api_key=args.api_key, show_text=args.dashboard_show_text, open_browser=args.open)
    return 0
