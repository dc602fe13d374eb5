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
401 without ``Authorization: Bearer KEY``; ``PAGED_NP_API_KEY=KEY`` in the
environment does the same and keeps the key out of the process list (the flag
wins when both are given; an empty key is refused). The dashboard signs in once
with the key and reads on with a session cookie. It shows token counts, pages and
states; only ``--dashboard-show-text`` adds the prompts' and answers' text to
``/v1/cache``. The limits on what one request may ask for (``--max-body-bytes``,
``--max-stop`` ...) are ServerConfig fields too (docs/serving-http.md, "Limits").

Every :class:`~paged_np.EngineConfig` field and every
:class:`~paged_np.server.ServerConfig` field is a flag (``--help`` lists them,
:mod:`paged_np.cli.options` makes them). The command builds one config of each
from what it parsed and hands the objects on, so an option added to either
reaches the server without a line here.
"""

from __future__ import annotations

import argparse
import dataclasses
import os

from ..server.auth import API_KEY_ENV
from ..server.config import ServerConfig
from . import kv_capacity_line
from .options import (
    add_config_args,
    add_engine_args,
    add_quantization_arg,
    config_from_args,
    engine_config,
    quantization_of,
)

# A model that needs no download: random weights and the tiny test tokenizer.
TINY_MODEL = "tiny-random"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m paged_np serve",
                                 description="An OpenAI-compatible server over the paged engine.")
    ap.add_argument("--model", default="smollm2-135m-instruct",
                    help=f"known name, .gguf file, Hugging Face directory, or {TINY_MODEL!r}")
    ap.add_argument("--seed", type=int, default=0, help="weights seed of --model tiny-random")
    # every ServerConfig field is a flag (--port, --api-key, --open ...)
    add_config_args(ap, ServerConfig, "server", "the HTTP server (paged_np.server.ServerConfig)")
    # every EngineConfig field is a flag (--prefix-cache radix --schedule lpm ...);
    # a server seats more sequences, and batches more tokens, than the library's defaults
    add_quantization_arg(ap)
    add_engine_args(ap, "serve")          # COMMAND_DEFAULTS["serve"]
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


def build_llm(args, config=None):
    """The :class:`paged_np.LLM` the server drives: ``--model`` run with ``config``
    (an :class:`~paged_np.EngineConfig`; default: the one the flags describe)."""
    from ..engine.llm import LLM

    config = config or engine_config(args)
    if args.model == TINY_MODEL:
        model, tok = tiny_model(args.seed)
    else:
        from ..models import load_model

        model, tok = load_model(args.model, quantization=quantization_of(args))
    llm = LLM(model, tokenizer=tok, verbose=True, config=config)
    llm.model_name = args.served_model_name or args.model
    return llm


def server_config(args, parser=None, environ=None) -> ServerConfig:
    """The :class:`ServerConfig` the flags describe; the model's name is ``--model``'s
    unless ``--served-model-name`` says otherwise, and the API key is
    ``PAGED_NP_API_KEY``'s unless ``--api-key`` gives one (an empty one is refused,
    as an empty flag is)."""
    environ = os.environ if environ is None else environ
    if args.api_key is None and API_KEY_ENV in environ:
        if not environ[API_KEY_ENV].strip():
            message = (f"{API_KEY_ENV} is set but empty: give a key, or unset it to serve "
                       "without one")
            if parser is not None:
                parser.error(message)
            from ..errors import InvalidArgument

            raise InvalidArgument(message)
        args = argparse.Namespace(**{**vars(args), "api_key": environ[API_KEY_ENV]})
    config = config_from_args(ServerConfig, args, parser)
    return dataclasses.replace(config, served_model_name=config.served_model_name or args.model)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # both configs are built, and a refused option exits, here, before loading
    engine_cfg = engine_config(args, parser)
    server_cfg = server_config(args, parser)
    quantization_of(args, parser, random_model=args.model == TINY_MODEL)
    from ..server import serve

    llm = build_llm(args, engine_cfg)
    where = f"http://{server_cfg.host}:{server_cfg.port}"
    print(f"serving {server_cfg.served_model_name} on {where}/v1 "
          f"({llm.engine.cache.cfg.num_pages} pages of {llm.engine.cache.cfg.page_size} tokens)",
          flush=True)
    print(kv_capacity_line(llm.engine.cache.cfg), flush=True)
    print(f"the cache, live: {where}/dashboard", flush=True)
    serve(llm, config=server_cfg)
    return 0
