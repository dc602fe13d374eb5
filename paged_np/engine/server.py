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

Compared with vLLM: the engine runs in a thread of the server's process
(vLLM runs it in its own process and talks over ZeroMQ); no tools, logprobs,
``echo`` or embeddings; one model per server.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import queue
import signal
import threading
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import ChatTemplateError, InvalidArgument, PagedNPError
from .sampling import SamplingParams

# ---------------------------------------------------------------------------
# Request models: OpenAI's field names, types and ranges. Fields we do not
# implement are refused by name rather than silently ignored.
# ---------------------------------------------------------------------------


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant"]
    content: StrictStr


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


class _SamplingFields(BaseModel):
    """The sampling knobs both endpoints share (OpenAI's ranges)."""

    model_config = ConfigDict(extra="ignore")
    model: StrictStr
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: StrictInt | None = Field(default=None, ge=0)
    stop: StrictStr | list[StrictStr] | None = None
    n: StrictInt = Field(default=1, ge=1)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    logprobs: None = None                   # not implemented: anything but null is refused
    ignore_eos: StrictBool = False          # vLLM's extra: generate max_tokens whatever comes


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)  # OpenAI's newer name


class CompletionRequest(_SamplingFields):
    prompt: StrictStr | list[StrictInt]
    max_tokens: StrictInt | None = Field(default=16, ge=1)      # OpenAI's default here
    echo: Literal[False] = False


class APIError(Exception):
    """A request the server refuses; becomes OpenAI's error body."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, type_: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = (
            status, message, param, code, type_)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


def _validation_error(e: ValidationError) -> APIError:
    """pydantic's first complaint, as a 400 naming the field (``messages.0.role``)."""
    err = e.errors()[0]
    # The field's path (``messages.0.role``), without pydantic's union-member tags
    # (``stop.str``, ``stop.list[str].0``): they name types, not fields.
    path = []
    for p in err["loc"]:
        if isinstance(p, str) and (p in _TYPE_TAGS or "[" in p):
            break
        path.append(str(p))
    param = ".".join(path) or None
    value = f" (got {err['input']!r})" if "input" in err and err["type"] != "missing" else ""
    return APIError(400, f"{param}: {err['msg']}{value}", param, "invalid_value")


# ---------------------------------------------------------------------------
# Metrics: Prometheus text, written by hand (counters, gauges, histograms).
# ---------------------------------------------------------------------------

TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class Histogram:
    """Cumulative buckets, a sum and a count: what Prometheus calls a histogram."""

    def __init__(self, buckets):
        self.buckets = tuple(buckets)
        self.counts = [0] * len(self.buckets)     # observations <= bucket (cumulative later)
        self.sum = 0.0
        self.count = 0

    def observe(self, x: float) -> None:
        for i, b in enumerate(self.buckets):
            if x <= b:
                self.counts[i] += 1
                break
        self.sum += x
        self.count += 1

    def lines(self, name: str) -> list[str]:
        out, cum = [], 0
        for b, c in zip(self.buckets, self.counts):
            cum += c
            out.append(f'{name}_bucket{{le="{b}"}} {cum}')
        out += [f'{name}_bucket{{le="+Inf"}} {self.count}', f"{name}_sum {self.sum}",
                f"{name}_count {self.count}"]
        return out


class ServerMetrics:
    """What ``GET /metrics`` reports; updated by the engine loop only.

    Names are vLLM's (``vllm:num_requests_running`` ->
    ``paged_np:num_requests_running``), plus a few that show the paged cache
    and the batching directly (pages in use, requests per step).
    """

    def __init__(self):
        self.lock = threading.Lock()
        self.gauges = dict(num_requests_running=0, num_requests_waiting=0, kv_pages_in_use=0,
                           kv_pages_total=0, kv_cache_usage_perc=0.0, prefix_cache_hit_rate=0.0)
        self.counters = dict(prompt_tokens_total=0, generation_tokens_total=0,
                             num_preemptions_total=0, kv_cache_evictions_total=0,
                             prefix_cache_cached_tokens_total=0, engine_steps_total=0)
        self.finished: dict[str, int] = {}        # finish reason -> requests
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(TTFT_BUCKETS)
        self.step_requests = Histogram(BATCH_BUCKETS)
        self.step_time = Histogram(ITL_BUCKETS)

    HELP = {
        "num_requests_running": ("gauge", "Requests in the running batch."),
        "num_requests_waiting": ("gauge", "Requests waiting to be admitted."),
        "kv_pages_in_use": ("gauge", "KV cache pages held by running requests."),
        "kv_pages_total": ("gauge", "KV cache pages in the arena."),
        "kv_cache_usage_perc": ("gauge", "Fraction of KV pages in use (1 = full)."),
        "prefix_cache_hit_rate": ("gauge", "Prefix cache hits / lookups, full pages."),
        "prompt_tokens_total": ("counter", "Prompt tokens of admitted requests."),
        "generation_tokens_total": ("counter", "Tokens generated."),
        "num_preemptions_total": ("counter", "Requests preempted to free pages."),
        "kv_cache_evictions_total": ("counter", "Cached pages evicted for reuse."),
        "prefix_cache_cached_tokens_total": ("counter", "Prompt tokens served from the cache."),
        "engine_steps_total": ("counter", "Engine steps run."),
    }

    def render(self) -> str:
        p = "paged_np:"
        with self.lock:
            lines = []
            for name, value in {**self.gauges, **self.counters}.items():
                kind, help_ = self.HELP[name]
                lines += [f"# HELP {p}{name} {help_}", f"# TYPE {p}{name} {kind}",
                          f"{p}{name} {value}"]
            lines += [f"# HELP {p}request_success_total Finished requests by reason.",
                      f"# TYPE {p}request_success_total counter"]
            lines += [f'{p}request_success_total{{finished_reason="{r}"}} {n}'
                      for r, n in sorted(self.finished.items())]
            for name, h, help_ in (
                    ("time_to_first_token_seconds", self.ttft, "Arrival to first token."),
                    ("inter_token_latency_seconds", self.itl, "Time between two tokens."),
                    ("e2e_request_latency_seconds", self.e2e, "Arrival to last token."),
                    ("step_num_requests", self.step_requests,
                     "Requests that got new tokens in one engine step."),
                    ("engine_step_seconds", self.step_time, "Time inside one llm.step().")):
                lines += [f"# HELP {p}{name} {help_}", f"# TYPE {p}{name} histogram"]
                lines += h.lines(p + name)
        return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------
# The engine loop: one thread owns the LLM; handlers talk to it by messages.
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Update:
    """A request's state after a step, copied out of the engine's thread.

    ``texts[j]``, ``num_tokens[j]`` and ``finish_reasons[j]`` describe sample
    ``j``; ``error`` is set when the engine failed this request (HTTP 500).
    """

    texts: tuple
    num_tokens: tuple
    finish_reasons: tuple
    prompt_tokens: int
    cached_tokens: int
    error: str | None = None
    status: int = 500

    @property
    def finished(self) -> bool:
        return self.error is not None or all(r is not None for r in self.finish_reasons)


class _Stream:
    """The loop's record of one request: where its updates go, and its timings."""

    def __init__(self, aloop, q, n, prompt_tokens, arrival):
        self.aloop, self.queue = aloop, q
        self.arrival = arrival                       # when the handler submitted it
        self.last_token = None
        self.num_tokens = 0
        self.last: Update | None = None              # the latest update sent
        self.n, self.prompt_tokens = n, prompt_tokens

    def push(self, update: Update) -> None:
        self.last = update
        # asyncio queues are not thread safe: hand the put to the event loop.
        self.aloop.call_soon_threadsafe(self.queue.put_nowait, update)


class EngineLoop:
    """The one thread that drives ``llm.step()``.

    Handlers call :meth:`submit` and :meth:`abort` (thread safe: they only
    post to an inbox); the loop applies them between steps, steps while any
    request is unfinished, and sleeps on an event when there is nothing to do.
    """

    def __init__(self, llm):
        self.llm = llm
        self.metrics = ServerMetrics()
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, _Stream] = {}
        self._stopping = False
        self._drain_deadline = 0.0
        self._thread = threading.Thread(target=self._run, name="paged_np-engine", daemon=True)
        self._update_gauges()

    # ---- called from the HTTP side
    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, request_id, prompt_ids, params, aloop, q) -> None:
        self._inbox.put(("add", request_id, prompt_ids, params, aloop, q, time.perf_counter()))
        self._wake.set()

    def abort(self, request_id) -> None:
        self._inbox.put(("abort", request_id))
        self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._stopping

    def begin_stop(self, drain_s: float = 0.0) -> None:
        """Give in-flight requests ``drain_s`` seconds to finish; then abort the rest.

        Aborted requests get a last update with ``finish_reason="abort"``, so
        their streams end properly (``data: [DONE]``) instead of being cut.
        """
        if not self._stopping:
            self._drain_deadline = time.monotonic() + drain_s
            self._stopping = True
        self._wake.set()

    def stop(self, drain_s: float = 0.0) -> None:
        """:meth:`begin_stop`, then wait for the loop to end."""
        self.begin_stop(drain_s)
        if self._thread.is_alive():
            self._thread.join()

    # ---- the loop itself
    def _run(self) -> None:
        while True:
            self._apply_inbox()
            if self._stopping and (not self._streams or time.monotonic() >= self._drain_deadline):
                break
            if not self.llm.has_unfinished_requests():
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            self._step()
            # Let the HTTP thread run between steps (the GIL is one lock for both):
            # it turns waiting requests into engine requests, so they join the next
            # step instead of trickling in one step at a time.
            time.sleep(0)
        for rid in list(self._streams):                  # shutting down: abort the rest
            self._abort(rid, "abort")
        self._update_gauges()

    def _apply_inbox(self) -> None:
        applied = False
        while True:
            try:
                msg = self._inbox.get_nowait()
            except queue.Empty:
                break
            applied = True
            if msg[0] == "abort":
                self._abort(msg[1], None)
                continue
            _, rid, prompt_ids, params, aloop, q, arrival = msg
            stream = _Stream(aloop, q, params.n, len(prompt_ids), arrival)
            try:
                self.llm.add_request(rid, prompt_ids, params)
            except PagedNPError as e:                    # refused: only this request fails
                status = 400 if isinstance(e, InvalidArgument) else 500
                stream.push(_error_update(stream, str(e), status))
                continue
            self._streams[rid] = stream
            with self.metrics.lock:
                self.metrics.counters["prompt_tokens_total"] += len(prompt_ids)
        if applied:                                      # an abort frees pages: show it now
            self._update_gauges()

    def _abort(self, rid, reason) -> None:
        """Drop a request (client gone, or shutdown); its pages go back to the pool."""
        stream = self._streams.pop(rid, None)
        if stream is None:
            return
        try:
            self.llm.abort(rid)
        except PagedNPError:
            pass                                         # it had finished already
        if reason is not None:                           # tell a client that is still there
            u = stream.last or Update(("",) * stream.n, (0,) * stream.n, (None,) * stream.n,
                                      stream.prompt_tokens, 0)
            stream.push(dataclasses.replace(
                u, finish_reasons=tuple(r or reason for r in u.finish_reasons)))
        with self.metrics.lock:
            self.metrics.finished["abort"] = self.metrics.finished.get("abort", 0) + 1

    def _step(self) -> None:
        t0 = time.perf_counter()
        try:
            outs = self.llm.step()
        except Exception as e:                           # noqa: BLE001 -- keep serving
            # We cannot tell which request broke the step: fail those in flight, keep the loop.
            for rid in list(self._streams):
                stream = self._streams.pop(rid)
                stream.push(_error_update(stream, f"engine error: {e!r}", 500))
                with self.metrics.lock:
                    self.metrics.finished["error"] = self.metrics.finished.get("error", 0) + 1
                try:
                    self.llm.abort(rid)
                except Exception:                        # noqa: BLE001
                    pass
            self._update_gauges()
            return
        now = time.perf_counter()
        m = self.metrics
        deliveries: dict = {}                            # event loop -> [(queue, update)]
        with m.lock:
            m.counters["engine_steps_total"] += 1
            m.step_time.observe(now - t0)
            stepped = 0
            for out in outs:
                stream = self._streams.get(out.request_id)
                if stream is None:                       # aborted while it stepped
                    continue
                update = _snapshot(out)
                new = sum(update.num_tokens) - stream.num_tokens
                if new > 0:
                    stepped += 1
                    m.counters["generation_tokens_total"] += new
                    if stream.last_token is None:
                        m.ttft.observe(now - stream.arrival)
                    else:
                        m.itl.observe(now - stream.last_token)
                    stream.last_token, stream.num_tokens = now, sum(update.num_tokens)
                stream.last = update
                deliveries.setdefault(stream.aloop, []).append((stream.queue, update))
                if update.finished:
                    del self._streams[out.request_id]
                    m.e2e.observe(now - stream.arrival)
                    m.counters["prefix_cache_cached_tokens_total"] += update.cached_tokens
                    reason = "error" if update.error else update.finish_reasons[0]
                    m.finished[reason] = m.finished.get(reason, 0) + 1
            if stepped:
                m.step_requests.observe(stepped)
        # One hand-over per event loop and step, not one per request: every wake-up
        # of the HTTP thread costs a trip through the GIL.
        for aloop, items in deliveries.items():
            aloop.call_soon_threadsafe(_deliver, items)
        self._update_gauges()

    def _update_gauges(self) -> None:
        eng = self.llm.engine
        sched, cache = eng.scheduler, eng.cache
        pool, stats = cache.pool, cache.stats()
        m = self.metrics
        with m.lock:
            g, c = m.gauges, m.counters
            g["num_requests_running"] = len({id(r.parent) for r in sched.running})
            g["num_requests_waiting"] = len({id(r.parent) for r in sched.waiting})
            g["kv_pages_in_use"] = pool.num_in_use
            g["kv_pages_total"] = cache.cfg.num_pages
            g["kv_cache_usage_perc"] = pool.num_in_use / cache.cfg.num_pages
            g["prefix_cache_hit_rate"] = stats["hit_rate"]
            c["num_preemptions_total"] = sched.num_preemptions
            c["kv_cache_evictions_total"] = stats["evictions"]


def _snapshot(out) -> Update:
    """An immutable copy of a RequestOutput (the engine thread keeps mutating its own)."""
    outs = out.outputs
    return Update(tuple(o.text for o in outs), tuple(len(o.token_ids) for o in outs),
                  tuple(o.finish_reason for o in outs), len(out.prompt_token_ids),
                  int(getattr(out, "num_cached_tokens", 0) or 0),
                  getattr(out, "error", None) if any(o.finish_reason == "error" for o in outs)
                  else None)


def _deliver(items) -> None:
    """On the event loop: put each update on its request's queue."""
    for q, update in items:
        q.put_nowait(update)


def _error_update(stream: _Stream, message: str, status: int) -> Update:
    return Update(("",) * stream.n, (0,) * stream.n, ("error",) * stream.n,
                  stream.prompt_tokens, 0, message, status)


# ---------------------------------------------------------------------------
# The app: handlers validate, enqueue, and read their request's queue.
# ---------------------------------------------------------------------------


class Server:
    """The handlers' view of one served model: validation and result reading."""

    def __init__(self, llm, served_model_name: str | None = None, max_n: int | None = None):
        self.llm = llm
        self.tokenizer = llm.tokenizer
        self.model_name = served_model_name or getattr(llm, "model_name", None) or "paged-np"
        self.max_model_len = int(llm.max_model_len)
        self.max_n = int(max_n or llm.engine.max_num_seqs)
        self.loop = EngineLoop(llm)
        self.created = int(time.time())
        self._ids = itertools.count()

    # ---- validation: everything a 400 can be about, before the engine sees it
    def parse(self, cls, body):
        try:
            req = cls.model_validate(body)
        except ValidationError as e:
            raise _validation_error(e) from None
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
                                  ignore_eos=req.ignore_eos)
        except PagedNPError as e:                        # e.g. an empty stop string
            raise APIError(400, str(e), None, "invalid_value") from None

    def submit(self, req, prompt_ids, params, prefix) -> tuple[str, asyncio.Queue]:
        if self.loop.stopping:
            raise APIError(503, "the server is shutting down", None, "shutting_down",
                           "server_error")
        rid = f"{prefix}-{uuid.uuid4().hex[:16]}"
        q: asyncio.Queue = asyncio.Queue()
        self.loop.submit(rid, prompt_ids, params, asyncio.get_running_loop(), q)
        return rid, q


def _usage(u: Update) -> dict:
    completion = sum(u.num_tokens)
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": completion,
            "total_tokens": u.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens}}


def create_app(llm, served_model_name: str | None = None, max_n: int | None = None,
               drain_s: float = 0.0):
    """The FastAPI app serving ``llm`` (a :class:`paged_np.LLM`).

    The engine loop starts with the app and stops with it: at shutdown,
    requests still running get ``drain_s`` seconds to finish, then are aborted.
    """
    srv = Server(llm, served_model_name, max_n)

    @asynccontextmanager
    async def lifespan(app):
        srv.loop.start()
        yield
        await asyncio.to_thread(srv.loop.stop, drain_s)

    app = FastAPI(title="paged_np", lifespan=lifespan)
    app.state.server = srv

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
        return PlainTextResponse(srv.loop.metrics.render(),
                                 media_type="text/plain; version=0.0.4")

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
            gen = _stream(results(request, rid, q), base, chat, req.n, include_usage)
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
        if chat:
            choices = [{"index": j, "message": {"role": "assistant", "content": t},
                        "logprobs": None, "finish_reason": r}
                       for j, (t, r) in enumerate(zip(last.texts, last.finish_reasons))]
            obj = "chat.completion"
        else:
            choices = [{"index": j, "text": t, "logprobs": None, "finish_reason": r}
                       for j, (t, r) in enumerate(zip(last.texts, last.finish_reasons))]
            obj = "text_completion"
        return {**base, "object": obj, "choices": choices, "usage": _usage(last)}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await handle(request, ChatCompletionRequest, "chatcmpl", chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await handle(request, CompletionRequest, "cmpl", chat=False)

    return app


async def _stream(updates, base, chat, n, include_usage):
    """Server-sent events: one chunk per sample per update, then ``data: [DONE]``."""
    obj = "chat.completion.chunk" if chat else "text_completion"
    sent = [0] * n                                       # characters sent, per sample
    finished = [False] * n

    def chunk(choices, usage=None):
        body = {**base, "object": obj, "choices": choices}
        if include_usage:
            body["usage"] = usage
        return f"data: {json.dumps(body)}\n\n"

    last = None
    try:
        if chat:                                         # OpenAI opens with the role
            yield chunk([{"index": j, "delta": {"role": "assistant", "content": ""},
                          "logprobs": None, "finish_reason": None} for j in range(n)])
        async for u in updates:
            last = u
            if u.error is not None:
                err = APIError(u.status, u.error, None, "engine_error", "server_error")
                yield f"data: {json.dumps(err.body())}\n\n"
                break
            choices = []
            for j in range(n):
                if finished[j]:
                    continue
                # The LLM's text never takes back what it showed: it holds back the
                # start of a possible stop string until it knows.
                text, reason = u.texts[j], u.finish_reasons[j]
                delta = text[sent[j]:]
                sent[j] = max(sent[j], len(text))
                if not delta and reason is None:
                    continue
                finished[j] = reason is not None
                if chat:
                    choices.append({"index": j, "delta": {"content": delta} if delta else {},
                                    "logprobs": None, "finish_reason": reason})
                else:
                    choices.append({"index": j, "text": delta, "logprobs": None,
                                    "finish_reason": reason})
            if choices:
                yield chunk(choices)
        if include_usage and last is not None and last.error is None:
            yield chunk([], _usage(last))
        yield "data: [DONE]\n\n"
    finally:
        # A client gone mid-stream closes this generator: close the inner one
        # now (not at garbage collection), so its request is aborted at once.
        await updates.aclose()


def serve(llm, host: str = "127.0.0.1", port: int = 8000, served_model_name: str | None = None,
          drain_s: float = 5.0, log_level: str = "info") -> None:
    """Run the server until Ctrl-C or SIGTERM.

    On the signal uvicorn stops accepting connections and gives in-flight
    requests ``drain_s`` seconds to finish; the engine loop then aborts what
    is left (their streams end with ``finish_reason="abort"``) and exits.
    """
    import uvicorn

    app = create_app(llm, served_model_name, drain_s=drain_s)
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

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=drain_s + 5.0)
    _Server(config).run()


class ServerThread:
    """The server in a background thread, on a free loopback port (tests, notebooks).

    ::

        with ServerThread(llm) as srv:
            client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none")

    Leaving the ``with`` block shuts it down as Ctrl-C would.
    """

    def __init__(self, llm, served_model_name: str | None = None, drain_s: float = 1.0,
                 host: str = "127.0.0.1"):
        import socket

        import uvicorn

        self.app = create_app(llm, served_model_name, drain_s=drain_s)
        self.drain_s = drain_s
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind((host, 0))                       # port 0: the OS picks a free one
        self.port = self._sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        config = uvicorn.Config(self.app, log_level="warning",
                                timeout_graceful_shutdown=drain_s + 5.0)
        self.server = uvicorn.Server(config)
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
