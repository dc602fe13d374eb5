"""``GET /v1/cache`` (a JSON snapshot of the cache) and ``GET /v1/cache/stream``
(server-sent events: a snapshot, then updates), the data of the ``/dashboard`` page.

The schema is in :mod:`.cache_view`. The stream::

    event: snapshot
    data: {"version": 1, "step": ..., "pages": {...}, ...}

    event: update
    data: {"step": ..., "pages": {"changed": [...], ...}, ...}

    : keep-alive

Updates come at most 10 times a second and only when something changed; a
comment line every ``heartbeat_s`` seconds (15) keeps proxies from closing an
idle stream. In a browser: ``new EventSource("/v1/cache/stream?api_key=KEY")``
and ``addEventListener("snapshot" | "update", ...)``.

The handlers only ask: the engine loop builds every snapshot and update on its
own thread between steps and drops them into each stream's bounded mailbox
(:class:`~.cache_view.Subscriber`), so a slow or vanished reader never holds
the engine up; its stream ends and its mailbox goes when the client leaves.

At most ``max_cache_streams`` streams are open at once (``--max-cache-streams``,
32): one more is answered 503 with ``Retry-After``, and the dashboard then reads
``GET /v1/cache`` once a second instead. Snapshots are shared, encoded once for
every stream that opens and every poll within an update interval
(:meth:`~.cache_view.CacheView.snapshot_json`).
"""

from __future__ import annotations

import asyncio

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from .cache_view import Subscriber
from .schemas import APIError

#: Seconds between keep-alive comments on an idle stream.
HEARTBEAT_S = 15.0


def _engine_required(srv) -> None:
    if srv.loop.stopping or not srv.loop.alive:
        raise APIError(503, "the engine loop is not running", None, "engine_dead",
                       "server_error")


def add_cache_routes(app, srv, heartbeat_s: float = HEARTBEAT_S) -> None:
    """Add the two routes to ``app``; ``srv`` is its :class:`~.app.Server`."""

    @app.get("/v1/cache")
    async def cache_snapshot():
        _engine_required(srv)
        aloop = asyncio.get_running_loop()
        future = aloop.create_future()
        srv.loop.snapshot(aloop, future)             # built between two engine steps
        return Response(await asyncio.wait_for(future, 60.0), media_type="application/json")

    @app.get("/v1/cache/stream")
    async def cache_stream(request: Request):
        _engine_required(srv)
        cap = srv.config.max_cache_streams
        if srv.num_cache_streams >= cap:
            raise APIError(503, f"{cap} cache streams are open, this server's most "
                           "(--max-cache-streams); read GET /v1/cache, or retry later",
                           None, "too_many_streams", "server_error")
        srv.num_cache_streams += 1                   # given back when the response ends
        return _CountedStream(srv, _events(request, srv, heartbeat_s),
                              media_type="text/event-stream",
                              headers={"Cache-Control": "no-cache",
                                       "X-Accel-Buffering": "no"})   # nginx: don't buffer


class _CountedStream(StreamingResponse):
    """A cache stream that gives its place back however its response ends (even one
    whose client left before the first byte, when the body never starts)."""

    def __init__(self, srv, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.srv = srv

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.srv.num_cache_streams -= 1


async def _events(request: Request, srv, heartbeat_s: float):
    """The stream's text: subscribe when it starts, unsubscribe however it ends."""
    sub = Subscriber(asyncio.get_running_loop())

    async def watch_disconnect():
        # The client never sends a body: the next message is its hanging up.
        while (await request.receive())["type"] != "http.disconnect":
            pass
        sub.queue.put_nowait((None, None))

    srv.loop.watch(sub)
    watcher = asyncio.create_task(watch_disconnect())
    try:
        while True:
            try:
                event, data = await asyncio.wait_for(sub.queue.get(), heartbeat_s)
            except asyncio.TimeoutError:
                if not srv.loop.alive:                # the engine loop is gone: end it
                    return
                yield ": keep-alive\n\n"
                continue
            if event is None:                         # the client left, or the server stops
                return
            yield f"event: {event}\ndata: {data}\n\n"
    finally:
        watcher.cancel()
        srv.loop.unwatch(sub)
