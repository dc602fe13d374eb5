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
  requests and aborts from an inbox, runs ``llm.step()``, and pushes each
  request's new text onto that request's own ``asyncio.Queue``. Requests from
  different clients therefore share engine steps: this is continuous
  batching across clients, and the reason a server beats one client at a time.
- **Results flow back per request.** A streaming handler turns each update
  into a server-sent event (``data: {...}``, then ``data: [DONE]``) as soon as
  the token is sampled. A client that goes away has its request aborted, and
  its pages return to the pool at the loop's next turn.
- **Errors have OpenAI's shape**: ``{"error": {"message", "type", "param",
  "code"}}``, status 400 for a bad request (the server keeps serving), 404
  for an unknown route, 500 when the engine fails one request (only that one).
- ``GET /metrics`` speaks Prometheus text with vLLM's metric names under a
  ``paged_np:`` prefix (see :class:`ServerMetrics`).
- **The cache, live**: ``GET /v1/cache`` is a JSON snapshot of the pages, the
  eviction order, the radix tree and the queues; ``GET /v1/cache/stream`` sends
  it, then what changed, at most 10 times a second; ``GET /dashboard`` draws
  them. The engine loop builds both between steps (:class:`CacheView`).
- ``--api-key KEY`` guards every route but ``/health`` (:mod:`.auth`).

The files, in reading order: :mod:`.schemas` (request bodies and errors),
:mod:`.loop` (the engine loop), :mod:`.app` (the handlers, ``serve`` and
``ServerThread``), :mod:`.responses` (the bodies they send) and
:mod:`.logprobs_view` (logprobs in OpenAI's shapes), :mod:`.metrics`
(``/metrics``), :mod:`.cache_view` (the cache's JSON and its schema),
:mod:`.cache_routes` (its two routes),
:mod:`.dashboard` (the page), :mod:`.auth` (``--api-key``).

Compared with vLLM: the engine runs in a thread of the server's process
(vLLM runs it in its own process and talks over ZeroMQ); no tools, ``echo``
(nor vLLM's ``prompt_logprobs`` field) or embeddings; one model per server.
"""

from .app import Server, ServerThread, create_app, serve
from .cache_view import CacheView, Subscriber
from .loop import EngineLoop, Update
from .metrics import ITL_BUCKETS, TTFT_BUCKETS, Histogram, ServerMetrics
from .schemas import APIError, ChatCompletionRequest, ChatMessage, CompletionRequest, StreamOptions

__all__ = [
    "APIError",
    "CacheView",
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "EngineLoop",
    "Histogram",
    "ITL_BUCKETS",
    "Server",
    "ServerMetrics",
    "ServerThread",
    "StreamOptions",
    "Subscriber",
    "TTFT_BUCKETS",
    "Update",
    "create_app",
    "serve",
]
