"""The engine loop: one thread owns the LLM; the HTTP handlers talk to it by messages."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
import threading
import time
from dataclasses import dataclass

from ..errors import InvalidArgument, PagedNPError
from .cache_view import CacheView
from .metrics import ServerMetrics

log = logging.getLogger("paged_np.server")


@dataclass(frozen=True)
class Update:
    """A request's state after a step, copied out of the engine's thread.

    ``texts[j]``, ``num_tokens[j]`` and ``finish_reasons[j]`` describe sample
    ``j``; ``error`` is set when the engine failed this request (HTTP 500).
    With ``SamplingParams.logprobs``, ``token_ids[j]`` and ``logprobs[j]`` hold
    sample ``j``'s tokens and their ``{token_id: Logprob}`` dicts (else empty).
    """

    texts: tuple
    num_tokens: tuple
    finish_reasons: tuple
    prompt_tokens: int
    cached_tokens: int
    error: str | None = None
    status: int = 500
    token_ids: tuple = ()
    logprobs: tuple = ()

    @property
    def finished(self) -> bool:
        return self.error is not None or all(r is not None for r in self.finish_reasons)


class Mailbox:
    """Where one request's updates wait for its handler: the newest only.

    An update is a whole snapshot of the request (its texts and token lists so
    far), so the newest says all the older ones did: a new one replaces the one
    waiting. A reader that stalls (a client that stops reading its stream) thus
    holds one update, never a backlog, and gets the newest state when it reads
    again. Used on the event loop only (the engine loop hands puts over with
    ``call_soon_threadsafe``); :meth:`close` says the client left.
    """

    def __init__(self):
        self._update: Update | None = None
        self._closed = False
        self._ready = asyncio.Event()

    def put_nowait(self, update: Update) -> None:
        self._update = update
        self._ready.set()

    def close(self) -> None:
        self._closed = True
        self._ready.set()

    async def get(self) -> Update | None:
        """The newest update (a finished one even after :meth:`close`), or None: the client left."""
        await self._ready.wait()
        self._ready.clear()
        u, self._update = self._update, None
        if u is not None and (u.finished or not self._closed):
            return u
        return None


class _Stream:
    """Where one request's updates go, and when its tokens came: delivery state only.

    The request itself (its tokens, text, finish reasons) is the engine's one
    record, read through the LLM's snapshots; ``n`` and ``prompt_tokens`` are
    kept to shape a reply for a request the engine refused or lost.
    """

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
    The cache's live view (:attr:`view`, :mod:`.cache_view`) is built here too,
    between steps: :meth:`watch`, :meth:`unwatch` and :meth:`snapshot` post to
    the same inbox.
    """

    def __init__(self, llm, show_text: bool = False):
        self.llm = llm
        self.metrics = ServerMetrics()
        self.view = CacheView(llm, show_text=show_text)
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

    def submit(self, request_id, prompt_ids, params, aloop, q, cache_salt=None) -> None:
        self._inbox.put(("add", request_id, prompt_ids, params, aloop, q, time.perf_counter(),
                         cache_salt))
        self._wake.set()

    def abort(self, request_id) -> None:
        self._inbox.put(("abort", request_id))
        self._wake.set()

    def watch(self, sub) -> None:
        """Start a cache stream (a :class:`~.cache_view.Subscriber`): a snapshot, then updates."""
        self._inbox.put(("watch", sub))
        self._wake.set()

    def unwatch(self, sub) -> None:
        self._inbox.put(("unwatch", sub))
        self._wake.set()

    def snapshot(self, aloop, future) -> None:
        """Set ``future`` (of event loop ``aloop``) to the cache's snapshot as JSON text,
        between steps."""
        self._inbox.put(("snapshot", aloop, future))
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
                self.view.publish()                      # the last changes, when due
                self._wake.wait(self.view.wait_s(0.5))
                self._wake.clear()
                continue
            self._step()
            self.view.publish()                          # at most 10 a second
            # Let the HTTP thread run between steps (the GIL is one lock for both):
            # it turns waiting requests into engine requests, so they join the next
            # step instead of trickling in one step at a time.
            time.sleep(0)
        for rid in list(self._streams):                  # shutting down: abort the rest
            self._abort(rid, "abort")
        self._update_gauges()
        self._apply_inbox()                              # answer snapshots still asked for
        self.view.publish()
        self.view.close_all()

    def _apply_inbox(self) -> None:
        applied = False
        while True:
            try:
                msg = self._inbox.get_nowait()
            except queue.Empty:
                break
            if msg[0] in ("watch", "unwatch", "snapshot"):
                self._view_message(msg)
                continue
            applied = True
            if msg[0] == "abort":
                self._abort(msg[1], None)
                continue
            _, rid, prompt_ids, params, aloop, q, arrival, salt = msg
            stream = _Stream(aloop, q, params.n, len(prompt_ids), arrival)
            prompt = prompt_ids if salt is None else {"prompt_token_ids": prompt_ids,
                                                      "cache_salt": salt}
            try:
                self.llm.add_request(rid, prompt, params)
            except PagedNPError as e:                    # refused: only this request fails
                status = 400 if isinstance(e, InvalidArgument) else 500
                stream.push(_error_update(stream, str(e), status))   # our own words
                continue
            except Exception:                            # noqa: BLE001 -- a bug: log it
                log.exception("the engine could not take request %s", rid)
                stream.push(_error_update(stream, "the engine could not take this request "
                                          "(the server's log says why)", 500))
                continue
            self._streams[rid] = stream
            self.metrics.prompt_tokens.inc(len(prompt_ids))
        if applied:                                      # an abort frees pages: show it now
            self._update_gauges()
            self.view.mark_dirty()

    def _view_message(self, msg) -> None:
        if msg[0] == "watch":
            self.view.watch(msg[1])
        elif msg[0] == "unwatch":
            self.view.unwatch(msg[1])
        else:
            _, aloop, future = msg                       # encoded, shared (CacheView)
            t0 = time.perf_counter()
            snap = self.view.snapshot_json()
            self.view.busy_s += time.perf_counter() - t0
            aloop.call_soon_threadsafe(_set_result, future, snap)

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
        self.metrics.finish("abort")

    def _step(self) -> None:
        t0 = time.perf_counter()
        try:
            outs = self.llm.step()
        except Exception:                                # noqa: BLE001 -- keep serving
            # We cannot tell which request broke the step: fail those in flight, keep the loop.
            # The exception is ours to read, not the client's: its text goes to the log.
            log.exception("an engine step failed; its %d requests fail with it",
                          len(self._streams))
            for rid in list(self._streams):
                stream = self._streams.pop(rid)
                stream.push(_error_update(stream, "the engine failed while running this "
                                          "request (the server's log says why)", 500))
                self.metrics.finish("error")
                try:
                    self.llm.abort(rid)
                except Exception:                        # noqa: BLE001
                    pass
            self._update_gauges()
            return
        now = time.perf_counter()
        m = self.metrics
        deliveries: dict = {}                            # event loop -> [(queue, update)]
        m.engine_steps.inc()
        m.step_time.observe(now - t0)
        stepped = 0
        for out in outs:
            stream = self._streams.get(out.request_id)
            if stream is None:                           # aborted while it stepped
                continue
            update = _snapshot(out)
            new = sum(update.num_tokens) - stream.num_tokens
            if new > 0:
                stepped += 1
                m.generation_tokens.inc(new)
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
                m.cached_tokens.inc(update.cached_tokens)
                m.finish("error" if update.error else update.finish_reasons[0])
        if stepped:
            m.step_requests.observe(stepped)
        # One hand-over per event loop and step, not one per request: every wake-up
        # of the HTTP thread costs a trip through the GIL.
        for aloop, items in deliveries.items():
            aloop.call_soon_threadsafe(_deliver, items)
        self._update_gauges()
        self.view.mark_dirty()

    def _update_gauges(self) -> None:
        """Hand the engine's public snapshot (:meth:`Engine.stats`) to the metrics."""
        self.metrics.set_engine_stats(self.llm.engine.stats(), self.view.busy_s)


def _snapshot(out) -> Update:
    """An immutable copy of a RequestOutput (the engine thread keeps mutating its own)."""
    outs = out.outputs
    scored = all(o.logprobs is not None for o in outs)           # SamplingParams.logprobs
    return Update(tuple(o.text for o in outs), tuple(len(o.token_ids) for o in outs),
                  tuple(o.finish_reason for o in outs), len(out.prompt_token_ids),
                  int(getattr(out, "num_cached_tokens", 0) or 0),
                  getattr(out, "error", None) if any(o.finish_reason == "error" for o in outs)
                  else None,
                  token_ids=tuple(tuple(o.token_ids) for o in outs) if scored else (),
                  logprobs=tuple(tuple(o.logprobs) for o in outs) if scored else ())


def _deliver(items) -> None:
    """On the event loop: put each update on its request's queue."""
    for q, update in items:
        q.put_nowait(update)


def _set_result(future, value) -> None:
    if not future.done():                                # its handler may have gone
        future.set_result(value)


def _error_update(stream: _Stream, message: str, status: int) -> Update:
    return Update(("",) * stream.n, (0,) * stream.n, ("error",) * stream.n,
                  stream.prompt_tokens, 0, message, status)
