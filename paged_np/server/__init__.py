"""An OpenAI-compatible HTTP server over the engine (``python -m paged_np serve``).

Any OpenAI client can talk to it: the ``openai`` package, ``curl``, a notebook::

    python -m paged_np serve --model smollm2-135m-instruct --port 8000
    curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
        -d '{"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "Hi"}]}'

How it is built (vLLM's shape, in one process):

- **The HTTP layer is thin.** Request bodies are checked against pydantic
  models that mirror OpenAI's schema (:class:`ChatCompletionRequest`,
  :class:`CompletionRequest`). A handler validates, turns the request into
  token ids and :class:`SamplingParams`, hands it to the engine loop and
  reads its results. No model or cache logic lives in a handler.
- **One loop owns the engine** (:class:`EngineLoop`, a thread). It takes new
  requests and aborts from an inbox, runs ``llm.step()``, and hands each
  request's new state to that request's own :class:`Mailbox` (the newest
  only: a reader that stalls holds one update, not a backlog). Requests from
  different clients therefore share engine steps: this is continuous
  batching across clients, and the reason a server beats one client at a time.
- **Results flow back per request.** A streaming handler turns each update
  into a server-sent event (``data: {...}``, then ``data: [DONE]``) as soon as
  the token is sampled. A client that goes away has its request aborted, and
  its pages return to the pool at the loop's next turn.
- **Errors have OpenAI's shape**: ``{"error": {"message", "type", "param",
  "code"}}``, status 400 for a bad request (the server keeps serving), 404
  for an unknown route, 500 when the engine fails one request (only that one).
- ``GET /metrics`` speaks Prometheus text, written by ``prometheus_client``,
  with vLLM's metric names under a ``paged_np:`` prefix (see :class:`ServerMetrics`).
- **The cache, live**: ``GET /v1/cache`` is a JSON snapshot of the pages, the
  eviction order, the radix tree and the queues; ``GET /v1/cache/stream`` sends
  it, then what changed, at most 10 times a second; ``GET /dashboard`` draws
  them. The engine loop builds both between steps (:class:`CacheView`).
- ``--api-key KEY`` (or ``PAGED_NP_API_KEY``) guards every route but ``/health``;
  the dashboard signs in once and reads on with a session cookie, so the key is
  never in a URL or a log (:mod:`.auth`).
- **Limits** on what one client may make everyone pay for (the body's bytes, the
  prompt's characters, stop strings, logprobs per response, cache streams) are
  :class:`ServerConfig` fields, checked before the work they bound
  (:mod:`.limits`); the event loop only moves bytes, and parsing, tokenizing and
  large responses run in a worker thread.

The files, in reading order: :mod:`.config` (:class:`ServerConfig`, every server
option), :mod:`.schemas` (request bodies and errors),
:mod:`.limits` (bounded bodies, strict JSON, the limits sized from the model),
:mod:`.loop` (the engine loop), :mod:`.app` (the handlers, ``serve`` and
``ServerThread``), :mod:`.responses` (the bodies they send) and
:mod:`.logprobs_view` (logprobs in OpenAI's shapes), :mod:`.metrics`
(``/metrics``), :mod:`.cache_view` (the cache's JSON and its schema),
:mod:`.cache_routes` (its two routes),
:mod:`.dashboard` (the page), :mod:`.auth` (``--api-key``).

This package sits above the engine: it reads an :class:`~paged_np.LLM` and its
engine through their public methods, and nothing in :mod:`paged_np.engine` imports it.
:class:`ServerConfig` is plain Python; the rest needs FastAPI and uvicorn (the
``serve`` extra) and is imported when first used, so ``python -m paged_np serve
--help`` and ``ServerConfig`` work without them.

Compared with vLLM: the engine runs in a thread of the server's process
(vLLM runs it in its own process and talks over ZeroMQ); no tools, ``echo``
(nor vLLM's ``prompt_logprobs`` field) or embeddings; one model per server.
"""

from ..lazy import lazy_exports
from .config import ServerConfig

#: Public name -> the module that defines it, imported on first use (FastAPI and uvicorn
#: only when the app is asked for: ServerConfig and `serve --help` need neither).
_WHERE = {
    "APIError": ".schemas",
    "CacheView": ".cache_view",
    "ChatCompletionRequest": ".schemas",
    "ChatMessage": ".schemas",
    "CompletionRequest": ".schemas",
    "EngineLoop": ".loop",
    "ITL_BUCKETS": ".metrics",
    "Mailbox": ".loop",
    "TTFT_BUCKETS": ".metrics",
    "Server": ".app",
    "ServerMetrics": ".metrics",
    "ServerThread": ".run",
    "StreamOptions": ".schemas",
    "Subscriber": ".cache_view",
    "Update": ".loop",
    "create_app": ".app",
    "serve": ".run",
}

__all__ = ["ServerConfig", *_WHERE]

__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
del lazy_exports
