"""The FastAPI app: handlers validate, enqueue, and read their request's queue; ``serve``
runs it, ``ServerThread`` runs it in a thread (tests, notebooks). Each takes one
:class:`~paged_np.server.ServerConfig` (or its fields as keywords). The cache's routes
are in :mod:`.cache_routes`, ``--api-key`` in :mod:`.auth`."""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import threading
import time
import uuid
import webbrowser
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..engine.sampling import SamplingParams
from ..errors import ChatTemplateError, InvalidArgument, PagedNPError
from .auth import APIKeyMiddleware
from .cache_routes import add_cache_routes
from .config import ServerConfig
from .dashboard import router as dashboard_router
from .loop import EngineLoop
from .metrics import ServerMetrics
from .responses import final_body, stream_events
from .schemas import APIError, ChatCompletionRequest, CompletionRequest, validation_error


class Server:
    """The handlers' view of one served model: validation and result reading."""

    def __init__(self, llm, config: ServerConfig | None = None):
        config = ServerConfig.from_options(config)
        self.llm = llm
        self.config = config
        self.tokenizer = llm.tokenizer
        self.model_name = (config.served_model_name or getattr(llm, "model_name", None)
                           or "paged-np")
        self.max_model_len = int(llm.max_model_len)
        max_num_seqs = llm.engine.config.max_num_seqs
        if config.max_n is not None and config.max_n > max_num_seqs:
            raise InvalidArgument(f"ServerConfig.max_n ({config.max_n}) must be <= the "
                                  f"engine's max_num_seqs ({max_num_seqs}): a request's "
                                  "samples run at once")
        self.max_n = config.max_n or max_num_seqs
        self.loop = EngineLoop(llm, show_text=config.show_text)
        self.created = int(time.time())
        self._ids = itertools.count()

    # ---- validation: everything a 400 can be about, before the engine sees it
    def parse(self, cls, body):
        try:
            req = cls.model_validate(body)
        except ValidationError as e:
            raise validation_error(e) from None
        if req.model != self.model_name:
            raise APIError(400, f"model: the model {req.model!r} does not exist here; this "
                           f"server serves {self.model_name!r}", "model", "model_not_found")
        if req.n > self.max_n:
            raise APIError(400, f"n: at most {self.max_n} samples per request (the engine's "
                           f"max_num_seqs), got {req.n}", "n", "invalid_value")
        return req

    def prompt_ids(self, req) -> tuple[list[int], str]:
        """The prompt as token ids, and the field it came from."""
        if isinstance(req, ChatCompletionRequest):
            msgs = [{"role": m.role, "content": m.content} for m in req.messages]
            try:
                text = self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True)
            except ChatTemplateError as e:
                raise APIError(400, f"messages: {e}", "messages", "invalid_value") from None
            return self.tokenizer.encode(text), "messages"
        if isinstance(req.prompt, str):                  # as vLLM: the tokenizer's BOS, if any
            return self.tokenizer.encode(req.prompt, add_special_tokens=True), "prompt"
        vocab = self.tokenizer.vocab_size
        bad = [t for t in req.prompt if not 0 <= t < vocab]
        if bad:
            raise APIError(400, f"prompt: token id {bad[0]} is outside the vocabulary "
                           f"[0, {vocab})", "prompt", "invalid_value")
        return list(req.prompt), "prompt"

    def sampling(self, req, n_prompt: int, field: str) -> SamplingParams:
        limit = self.max_model_len
        if n_prompt == 0:
            raise APIError(400, f"{field}: the prompt is empty", field, "invalid_value")
        if n_prompt >= limit:
            raise APIError(400, f"{field}: the prompt has {n_prompt} tokens; this model's "
                           f"context is {limit} tokens (prompt + output)", field,
                           "context_length_exceeded")
        max_tokens = getattr(req, "max_completion_tokens", None) or req.max_tokens
        if max_tokens is None:                           # as vLLM: up to the context
            max_tokens = limit - n_prompt
        if n_prompt + max_tokens > limit:
            raise APIError(400, f"max_tokens: {max_tokens} tokens after a prompt of "
                           f"{n_prompt} go past the context of {limit} tokens; ask for at "
                           f"most {limit - n_prompt}", "max_tokens", "context_length_exceeded")
        try:
            return SamplingParams(max_tokens=max_tokens, temperature=req.temperature,
                                  top_p=req.top_p, seed=req.seed, n=req.n, stop=req.stop,
                                  ignore_eos=req.ignore_eos, logprobs=self.num_logprobs(req))
        except PagedNPError as e:                        # e.g. an empty stop string
            raise APIError(400, str(e), None, "invalid_value") from None

    @staticmethod
    def num_logprobs(req) -> int | None:
        """The engine's ``logprobs`` (top k) for a request, or None (OpenAI's two spellings)."""
        if isinstance(req, ChatCompletionRequest):
            if req.top_logprobs is not None and not req.logprobs:
                raise APIError(400, "top_logprobs: needs logprobs set to true", "top_logprobs",
                               "invalid_value")
            return (req.top_logprobs or 0) if req.logprobs else None
        return req.logprobs

    def submit(self, req, prompt_ids, params, prefix) -> tuple[str, asyncio.Queue]:
        if self.loop.stopping:
            raise APIError(503, "the server is shutting down", None, "shutting_down",
                           "server_error")
        rid = f"{prefix}-{uuid.uuid4().hex[:16]}"
        q: asyncio.Queue = asyncio.Queue()
        self.loop.submit(rid, prompt_ids, params, asyncio.get_running_loop(), q, req.cache_salt)
        return rid, q


def create_app(llm, config: ServerConfig | None = None, **options):
    """The FastAPI app serving ``llm`` (a :class:`paged_np.LLM`) as ``config`` says.

    ``options`` replace fields of ``config`` (:meth:`ServerConfig.from_options`).
    The engine loop starts with the app and stops with it: at shutdown,
    requests still running get ``drain_s`` seconds to finish, then are aborted.
    ``api_key``: every route but ``/health`` answers 401 without it
    (:mod:`.auth`). ``show_text``: the cache's view (``/v1/cache``) includes
    each request's prompt and answer text; by default only counts and pages.
    """
    config = ServerConfig.from_options(config, **options)
    drain_s = config.drain_s
    srv = Server(llm, config)

    @asynccontextmanager
    async def lifespan(app):
        srv.loop.start()
        yield
        await asyncio.to_thread(srv.loop.stop, drain_s)

    app = FastAPI(title="paged_np", lifespan=lifespan)
    app.state.server = srv
    app.include_router(dashboard_router)                 # GET /dashboard: the page, no data
    add_cache_routes(app, srv)                           # GET /v1/cache and its stream
    if config.api_key is not None:
        app.add_middleware(APIKeyMiddleware, api_key=config.api_key)

    @app.exception_handler(APIError)
    async def api_error(request, e: APIError):
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(Exception)
    async def unexpected(request, e: Exception):
        # A bug of ours: this request fails with the reason; the server goes on.
        return JSONResponse(APIError(500, f"internal error: {e!r}", None, "internal_error",
                                     "server_error").body(), status_code=500)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, e):
        code = "not_found" if e.status_code == 404 else None
        return JSONResponse(APIError(e.status_code, f"{request.method} {request.url.path}: "
                                     f"{e.detail}", None, code).body(), status_code=e.status_code)

    async def read_json(request: Request):
        ctype = request.headers.get("content-type", "")
        if ctype.split(";")[0].strip().lower() != "application/json":
            raise APIError(400, f"Content-Type must be application/json, got {ctype!r}",
                           None, "invalid_content_type")
        try:
            return json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise APIError(400, f"the body is not valid JSON: {e}", None, "invalid_json") from None

    async def results(request: Request, rid: str, q: asyncio.Queue):
        """Yield the request's updates until it finishes; abort it if the client leaves."""

        async def watch_disconnect():
            # The body has been read: the next message the server sends us is the
            # client hanging up. (uvicorn drops writes to a closed socket silently,
            # so writing alone would never tell us.)
            while (await request.receive())["type"] != "http.disconnect":
                pass
            q.put_nowait(None)

        watcher = asyncio.create_task(watch_disconnect())
        done = False
        try:
            while True:
                u = await q.get()
                # Updates are whole snapshots: when several wait (a busy server, a slow
                # client), the newest says it all, and one event carries their tokens.
                while u is not None and not u.finished and not q.empty():
                    u = q.get_nowait()
                if u is None:                           # the client went away
                    return
                done = u.finished
                yield u
                if done:
                    return
        finally:
            watcher.cancel()
            if not done:                                # the client left (or we stopped)
                srv.loop.abort(rid)

    @app.get("/health")
    async def health():
        if not srv.loop.alive:
            raise APIError(503, "the engine loop is not running", None, "engine_dead",
                           "server_error")
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        # the text format generate_latest writes (Prometheus's classic 0.0.4)
        return PlainTextResponse(srv.loop.metrics.render(),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": srv.model_name, "object": "model", "created": srv.created,
            "owned_by": "paged_np", "max_model_len": srv.max_model_len}]}

    async def handle(request: Request, cls, prefix: str, chat: bool):
        req = srv.parse(cls, await read_json(request))
        prompt_ids, field = srv.prompt_ids(req)
        params = srv.sampling(req, len(prompt_ids), field)
        rid, q = srv.submit(req, prompt_ids, params, prefix)
        created = int(time.time())
        base = {"id": rid, "created": created, "model": srv.model_name}
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            gen = stream_events(results(request, rid, q), base, chat, req.n, include_usage,
                          params.logprobs)
            return StreamingResponse(gen, media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        last = None
        async for u in results(request, rid, q):
            last = u
        if last is None:                                 # the client left: nobody to answer
            return PlainTextResponse("", status_code=499)
        if last.error is not None:
            raise APIError(last.status, last.error, None, "engine_error",
                           "invalid_request_error" if last.status == 400 else "server_error")
        return {**base, **final_body(last, chat, req.n, params.logprobs)}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await handle(request, ChatCompletionRequest, "chatcmpl", chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await handle(request, CompletionRequest, "cmpl", chat=False)

    return app


def serve(llm, config: ServerConfig | None = None, **options) -> None:
    """Run the server as ``config`` says (``options`` replace its fields) until Ctrl-C
    or SIGTERM.

    On the signal uvicorn stops accepting connections and gives in-flight
    requests ``drain_s`` seconds to finish; the engine loop then aborts what
    is left (their streams end with ``finish_reason="abort"``) and exits.
    ``open_browser``: open ``/dashboard`` in the user's browser once the
    server listens. ``api_key`` and ``show_text``: see :func:`create_app`.
    """
    import uvicorn

    config = ServerConfig.from_options(config, **options)
    drain_s = config.drain_s
    app = create_app(llm, config)
    engine_loop = app.state.server.loop

    class _Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            # First the engine: in-flight requests get drain_s seconds, then end
            # with finish_reason "abort". uvicorn meanwhile stops accepting
            # connections and waits for the responses to complete.
            engine_loop.begin_stop(drain_s)
            # uvicorn's own handler also re-raises the signal once shut down (the
            # process then dies *by* it); we have shut down cleanly: exit with 0.
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True                   # a second Ctrl-C: stop waiting
            self.should_exit = True

    server = _Server(uvicorn.Config(app, host=config.host, port=config.port,
                                    log_level=config.log_level,
                                    timeout_graceful_shutdown=drain_s + 5.0))
    if config.open_browser:
        open_when_started(server, dashboard_url(config.host, config.port))
    server.run()


def dashboard_url(host: str, port: int) -> str:
    """Where a browser on this machine finds the dashboard (a wildcard host is loopback)."""
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"                               # an IPv6 literal
    return f"http://{host}:{port}/dashboard"


def open_when_started(server, url: str, timeout: float = 120.0) -> threading.Thread:
    """Open ``url`` in the user's browser (:func:`webbrowser.open`) once the uvicorn
    ``server`` listens; gives up silently if it has not started within ``timeout`` s."""

    def wait_then_open():
        deadline = time.monotonic() + timeout
        while not server.started:
            if time.monotonic() > deadline or server.should_exit:
                return
            time.sleep(0.05)
        webbrowser.open(url)

    t = threading.Thread(target=wait_then_open, name="paged_np-open", daemon=True)
    t.start()
    return t


class ServerThread:
    """The server in a background thread, on a free loopback port (tests, notebooks).

    ::

        with ServerThread(llm) as srv:
            client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none")

    Leaving the ``with`` block shuts it down as Ctrl-C would. Without ``config`` it
    starts from :attr:`DEFAULTS` (a free port, a short drain, quiet logs); ``options``
    replace fields (``ServerThread(llm, api_key="k")``).
    """

    #: A test's server: port 0 (the OS picks a free one), 1 s of drain, warnings only.
    DEFAULTS = ServerConfig(port=0, drain_s=1.0, log_level="warning")

    def __init__(self, llm, config: ServerConfig | None = None, **options):
        import socket

        import uvicorn

        config = ServerConfig.from_options(config or self.DEFAULTS, **options)
        self.config = config
        self.app = create_app(llm, config)
        self.drain_s = config.drain_s
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind((config.host, config.port))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://{config.host}:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(
            self.app, log_level=config.log_level,
            timeout_graceful_shutdown=config.drain_s + 5.0))
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]},
                                        name="paged_np-http", daemon=True)

    @property
    def metrics(self) -> ServerMetrics:
        return self.app.state.server.loop.metrics

    def start(self, timeout: float = 30.0) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise PagedNPError(f"the server on {self.url} did not start within {timeout} s")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self.app.state.server.loop.begin_stop(self.drain_s)
        self.server.should_exit = True
        self._thread.join(timeout)
        self._sock.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
