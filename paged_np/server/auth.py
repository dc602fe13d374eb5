"""``serve --api-key KEY``: every route answers 401 without the key (vLLM's flag), and
the key never travels in a URL nor reaches a log.

A client sends ``Authorization: Bearer KEY`` (the ``openai`` package does, from
its ``api_key``). The key may also come from the environment
(``PAGED_NP_API_KEY``, as vLLM reads ``VLLM_API_KEY``), which keeps it out of the
process list; an empty key is refused at start (:class:`~.config.ServerConfig`).

A browser cannot set that header on a page it navigates to or on an
``EventSource``, so the dashboard **signs in once**: a browser asking for
``/dashboard`` without a session gets a small page whose form *posts* the key to
``POST /dashboard/login``; the right key is answered with a redirect to the
dashboard and a cookie holding a random session token (``HttpOnly``,
``SameSite=Strict``: no script reads it, no other site's page sends it). The
session then opens the dashboard's reads (``GET /dashboard``, ``/v1/cache`` and
``/v1/cache/stream``) and nothing else, for ``dashboard_session_s`` seconds; at
most ``max_dashboard_sessions`` are kept (one more drops the oldest). The key
itself is never in a URL, so never in the access log, the browser's history or a
proxy's log; and the access log blanks any ``key=`` or ``token=`` value a client
puts in a query string anyway (:class:`RedactQuery`).

``GET /health`` stays open: it says only whether the engine loop runs, and a
load balancer's probe carries no key (vLLM leaves it open too). An unknown
path answers 401 without the key (the server does not say which paths exist)
and 404 with it.

This is a pure ASGI middleware, not FastAPI's ``@app.middleware("http")``: that
one wraps every response in a second stream, which delays a server-sent
event and hides a client's disconnect from the handler.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import secrets
import time
from urllib.parse import parse_qs

#: The environment variable ``serve`` reads the key from when ``--api-key`` is not given.
API_KEY_ENV = "PAGED_NP_API_KEY"
#: Where the key page posts the key (a form: ``api_key=KEY``).
LOGIN_PATH = "/dashboard/login"
#: The session cookie's name.
SESSION_COOKIE = "paged_np_session"
#: Paths a session opens (GET only): the dashboard's page and its data.
SESSION_PATHS = ("/dashboard", "/v1/cache")
#: Paths anyone may call.
OPEN_PATHS = ("/health",)
#: The largest sign-in form read (a key is a line of text).
MAX_LOGIN_BYTES = 4096

# A plain form that posts (it works without JavaScript); nothing here reads the key back.
_ASK_PAGE = """<!doctype html><meta charset="utf-8"><title>paged_np: API key</title>
<form style="font:16px sans-serif;margin:3em" method="post" action="{login}">
<p>This server was started with <code>--api-key</code>. The dashboard needs the key:</p>
<input name="api_key" type="password" autofocus size="40" autocomplete="off">
<button>Open</button><p style="color:#b00">{error}</p></form>"""


class Sessions:
    """Dashboard sign-ins: random tokens, each good for ``ttl_s`` seconds, at most ``limit``.

    Only a hash of each token is kept, and looked up by hash, so the time a lookup
    takes says nothing about the tokens. Used on the event loop only.
    """

    def __init__(self, ttl_s: float, limit: int):
        self.ttl_s, self.limit = ttl_s, limit
        self._expiry: dict[bytes, float] = {}           # hash -> monotonic deadline, oldest first

    def __len__(self) -> int:
        return len(self._expiry)

    def new(self) -> str:
        now = time.monotonic()
        for h in [h for h, t in self._expiry.items() if t <= now]:
            del self._expiry[h]
        while len(self._expiry) >= self.limit:           # the oldest sign-in goes
            del self._expiry[next(iter(self._expiry))]
        token = secrets.token_urlsafe(32)
        self._expiry[_digest(token)] = now + self.ttl_s
        return token

    def valid(self, token: str) -> bool:
        deadline = self._expiry.get(_digest(token))
        return deadline is not None and time.monotonic() < deadline


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "replace")).digest()


class APIKeyMiddleware:
    """Answer 401 (OpenAI's error body) to any request without the key or a session."""

    def __init__(self, app, api_key: str, session_s: float = 12 * 3600.0,
                 max_sessions: int = 64):
        if not isinstance(api_key, str) or not api_key:
            raise ValueError("api_key must be a non-empty string")
        self.app = app
        self.key = api_key.encode()
        self.sessions = Sessions(session_s, max_sessions)

    def allowed(self, scope) -> bool:
        path = scope.get("path", "")
        if path in OPEN_PATHS:
            return True
        headers = scope.get("headers", ())
        for name, value in headers:
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key):
                    return True
        if path.startswith(SESSION_PATHS) and scope.get("method") == "GET":
            token = _cookie(headers, SESSION_COOKIE)
            return token is not None and self.sessions.valid(token)
        return False

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope.get("path") == LOGIN_PATH and scope.get("method") == "POST":
            await self.login(scope, receive, send)
        elif self.allowed(scope):
            await self.app(scope, receive, send)
        else:
            await self.refuse(scope, send)

    async def login(self, scope, receive, send) -> None:
        """``POST /dashboard/login`` with ``api_key=KEY``: a session cookie, or 401 again."""
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > MAX_LOGIN_BYTES:
                await _send(send, 413, b"text/plain; charset=utf-8", b"the form is too large")
                return
            if not message.get("more_body"):
                break
        form = parse_qs(body.decode("utf-8", "replace"))
        if any(hmac.compare_digest(k.encode(), self.key) for k in form.get("api_key", ())):
            cookie = (f"{SESSION_COOKIE}={self.sessions.new()}; HttpOnly; SameSite=Strict; "
                      f"Path=/; Max-Age={int(self.sessions.ttl_s)}")
            await _send(send, 303, b"text/plain; charset=utf-8", b"",
                        [(b"location", b"/dashboard"), (b"set-cookie", cookie.encode())])
            return
        await self.refuse(scope, send, "That key was refused; try again.")

    async def refuse(self, scope, send, error: str = "") -> None:
        path = scope.get("path", "")
        accept = dict(scope.get("headers", ())).get(b"accept", b"")
        if path.startswith("/dashboard") and b"text/html" in accept:
            body = _ASK_PAGE.format(login=LOGIN_PATH, error=error).encode()
            ctype = b"text/html; charset=utf-8"
        else:
            body = json.dumps({"error": {
                "message": error or "a valid API key is required: send "
                                    "'Authorization: Bearer KEY'",
                "type": "invalid_request_error", "param": None,
                "code": "invalid_api_key"}}).encode()
            ctype = b"application/json"
        await _send(send, 401, ctype, body, [(b"www-authenticate", b"Bearer")])


async def _send(send, status: int, ctype: bytes, body: bytes, headers=()) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", ctype), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


def _cookie(headers, name: str) -> str | None:
    """The value of cookie ``name`` in the request's ``Cookie`` headers, or None."""
    for key, value in headers:
        if key == b"cookie":
            for part in value.decode("latin-1").split(";"):
                k, _, v = part.strip().partition("=")
                if k == name:
                    return v
    return None


_SECRET_PARAM = re.compile(r"((?:^|[?&;])[^=&;]*(?:key|token)[^=&;]*=)[^&;#\s]*", re.IGNORECASE)


def redact(path: str) -> str:
    """``path`` (and its query) with every ``...key=`` or ``...token=`` value blanked."""
    return _SECRET_PARAM.sub(r"\1REDACTED", path) if "=" in path else path


class RedactQuery(logging.Filter):
    """On uvicorn's access log: no key or token from a query string reaches a log line.

    uvicorn logs ``(client, method, path?query, http version, status)`` as the
    record's arguments; the filter rewrites the path before any handler sees it.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 5 and isinstance(args[2], str):
            record.args = (args[0], args[1], redact(args[2]), args[3], args[4])
        return True


def redact_access_log() -> None:
    """Put :class:`RedactQuery` on ``uvicorn.access`` (once; after uvicorn's logging setup)."""
    logger = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, RedactQuery) for f in logger.filters):
        logger.addFilter(RedactQuery())
