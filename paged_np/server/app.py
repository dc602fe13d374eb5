"""The FastAPI app: handlers validate, enqueue, and read their request's mailbox
(:mod:`.run` runs it: ``serve`` in the foreground, ``ServerThread`` in a thread).
:func:`create_app` takes one :class:`~paged_np.server.ServerConfig` (or its fields as
keywords). The cache's routes
are in :mod:`.cache_routes`, ``--api-key`` in :mod:`.auth`, the limits in :mod:`.limits`.

The event loop only moves bytes: a handler reads the body (up to its limit), then
parses, validates and tokenizes it in a worker thread (:meth:`Server.prepare`), and
a whole response with logprobs is encoded there too, so ``/health`` and the other
clients' streams keep being answered while one large request is worked on."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
import uuid
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..engine.sampling import SamplingParams
from ..errors import ChatTemplateError, InvalidArgument, PagedNPError
from .auth import APIKeyMiddleware, redact
from .cache_routes import add_cache_routes
from .config import ServerConfig
from .dashboard import router as dashboard_router
from .limits import (
    ClientGone,
    default_body_bytes,
    default_prompt_chars,
    parse_json,
    read_body,
)
from .loop import EngineLoop, Mailbox
from .responses import final_body, stream_events
from .schemas import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    refuse_unsupported,
    validation_error,
)

log = logging.getLogger("paged_np.server")


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
        # The limits ServerConfig leaves to the model (None): sized from it (.limits).
        self.max_prompt_chars = config.max_prompt_chars or default_prompt_chars(
            self.tokenizer, self.max_model_len)
        self.max_body_bytes = config.max_body_bytes or default_body_bytes(self.max_prompt_chars)
        self.num_cache_streams = 0                       # open /v1/cache/stream readers
        self.loop = EngineLoop(llm, show_text=config.show_text)
        self.created = int(time.time())
        self._ids = itertools.count()

    # ---- validation: everything a 400 can be about, before the engine sees it
    def prepare(self, cls, body: bytes):
        """A body -> ``(request, prompt ids, SamplingParams)``, or an :class:`APIError`.

        Runs in a worker thread: parsing, the chat template and the tokenizer take
        time in proportion to the body, which the event loop must not spend.
        """
        data = parse_json(body)
        refuse_unsupported(data)
        req = self.parse(cls, data)
        prompt_ids, field = self.prompt_ids(req)
        return req, prompt_ids, self.sampling(req, len(prompt_ids), field)

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
        stops = [req.stop] if isinstance(req.stop, str) else req.stop or []
        cfg = self.config
        if len(stops) > cfg.max_stop:                    # each is matched after every token
            raise APIError(400, f"stop: at most {cfg.max_stop} stop strings per request "
                           f"(--max-stop), got {len(stops)}", "stop", "invalid_value")
        for s in stops:
            if len(s) > cfg.max_stop_chars:
                raise APIError(400, f"stop: a stop string is {len(s):,} characters; at most "
                               f"{cfg.max_stop_chars} (--max-stop-chars)", "stop",
                               "invalid_value")
        return req

    def prompt_ids(self, req) -> tuple[list[int], str]:
        """The prompt as token ids, and the field it came from."""
        if isinstance(req, ChatCompletionRequest):
            self.check_chars(sum(len(m.content) for m in req.messages), "messages")
            msgs = [{"role": m.role, "content": m.content} for m in req.messages]
            try:
                text = self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True)
            except ChatTemplateError as e:
                raise APIError(400, f"messages: {e}", "messages", "invalid_value") from None
            self.check_chars(len(text), "messages")      # with the template's own text
            return self.tokenizer.encode(text), "messages"
        if isinstance(req.prompt, str):                  # as vLLM: the tokenizer's BOS, if any
            self.check_chars(len(req.prompt), "prompt")
            return self.tokenizer.encode(req.prompt, add_special_tokens=True), "prompt"
        vocab = self.tokenizer.vocab_size
        bad = [t for t in req.prompt if not 0 <= t < vocab]
        if bad:
            raise APIError(400, f"prompt: token id {bad[0]} is outside the vocabulary "
                           f"[0, {vocab})", "prompt", "invalid_value")
        return list(req.prompt), "prompt"

    def check_chars(self, n: int, field: str) -> None:
        """Refuse a prompt text too long to fit, before the tokenizer spends time on it."""
        if n > self.max_prompt_chars:
            raise APIError(400, f"{field}: the prompt has {n:,} characters; this server "
                           f"takes at most {self.max_prompt_chars:,} (--max-prompt-chars; "
                           f"the context is {self.max_model_len} tokens)", field,
                           "context_length_exceeded")

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
        k = self.num_logprobs(req)
        if k is not None:                                # the response's size, in logprobs
            entries = req.n * max_tokens * (k + 1)
            if entries > self.config.max_logprob_entries:
                name = "top_logprobs" if isinstance(req, ChatCompletionRequest) else "logprobs"
                raise APIError(400, f"{name}: n x max_tokens x ({name} + 1) = {req.n} x "
                               f"{max_tokens} x {k + 1} = {entries:,} logprobs; a response "
                               f"carries at most {self.config.max_logprob_entries:,} "
                               "(--max-logprob-entries): ask for fewer", name,
                               "invalid_value")
        try:
            return SamplingParams(max_tokens=max_tokens, temperature=req.temperature,
                                  top_p=req.top_p, seed=req.seed, n=req.n, stop=req.stop,
                                  ignore_eos=req.ignore_eos, logprobs=k)
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

    def submit(self, req, prompt_ids, params, prefix) -> tuple[str, Mailbox]:
        if self.loop.stopping:
            raise APIError(503, "the server is shutting down", None, "shutting_down",
                           "server_error")
        rid = f"{prefix}-{uuid.uuid4().hex[:16]}"
        q = Mailbox()
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
    app.add_middleware(CatchAll)                         # a bug: a plain 500, logged
    if config.api_key is not None:                       # outermost: checked first
        app.add_middleware(APIKeyMiddleware, api_key=config.api_key,
                           session_s=config.dashboard_session_s,
                           max_sessions=config.max_dashboard_sessions)

    @app.exception_handler(APIError)
    async def api_error(request, e: APIError):
        return error_response(e)

    @app.exception_handler(ClientGone)
    async def client_gone(request, e):
        return PlainTextResponse("", status_code=499)   # nobody reads it (nginx's code)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, e):
        code = "not_found" if e.status_code == 404 else None
        return error_response(APIError(e.status_code, f"{request.method} {request.url.path}: "
                                       f"{e.detail}", None, code))

    async def read_request(request: Request, cls):
        """The body, read up to its limit here; parsed, checked and tokenized in a thread."""
        ctype = request.headers.get("content-type", "")
        if ctype.split(";")[0].strip().lower() != "application/json":
            raise APIError(400, f"Content-Type must be application/json, got {ctype[:80]!r}",
                           None, "invalid_content_type")
        body = await read_body(request, srv.max_body_bytes)
        return await asyncio.to_thread(srv.prepare, cls, body)

    async def results(request: Request, rid: str, q: Mailbox):
        """Yield the request's updates until it finishes; abort it if the client leaves."""

        async def watch_disconnect():
            # The body has been read: the next message the server sends us is the
            # client hanging up. (uvicorn drops writes to a closed socket silently,
            # so writing alone would never tell us.)
            while (await request.receive())["type"] != "http.disconnect":
                pass
            q.close()

        watcher = asyncio.create_task(watch_disconnect())
        done = False
        try:
            while True:
                # The mailbox holds the newest update only (a whole snapshot): when the
                # server is busy or the client slow, one event carries several tokens.
                u = await q.get()
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
        req, prompt_ids, params = await read_request(request, cls)
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
        # n samples x their tokens x their logprobs can be megabytes: built off the loop
        body = await asyncio.to_thread(
            lambda: _json_bytes({**base, **final_body(last, chat, req.n, params.logprobs)}))
        return Response(body, media_type="application/json")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await handle(request, ChatCompletionRequest, "chatcmpl", chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await handle(request, CompletionRequest, "cmpl", chat=False)

    return app


def _json_bytes(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def error_response(e: APIError) -> Response:
    """OpenAI's error body for ``e`` (ASCII JSON: whatever a client sent, it encodes)."""
    headers = {"Retry-After": "1"} if e.status in (429, 503) else None
    return Response(json.dumps(e.body()).encode(), status_code=e.status, headers=headers,
                    media_type="application/json")


class CatchAll:
    """The last net under every route: an exception no handler answered is a bug of
    ours. Its traceback goes to the server's log, the client gets a 500 in OpenAI's
    shape without the exception's text, and the connection stays open for the next
    request. (Starlette's own net answers 500 too, but then re-raises, and uvicorn
    closes the connection.)"""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_started(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_started)
        except Exception:                                # noqa: BLE001 -- the net
            query = scope.get("query_string", b"").decode("latin-1")
            log.exception("%s %s failed", scope.get("method"),
                          redact(scope.get("path", "") + ("?" + query if query else "")))
            if started:                                  # mid-stream: nothing left to say
                return
            response = error_response(APIError(
                500, "internal error: the server failed on this request (its log says why)",
                None, "internal_error", "server_error"))
            await response(scope, receive, send)
