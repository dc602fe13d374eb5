"""``serve --api-key KEY``: every route answers 401 without the key (vLLM's flag).

A client sends ``Authorization: Bearer KEY`` (the ``openai`` package does, from
its ``api_key``). A browser cannot set that header on a page it navigates to or
on an ``EventSource``, so the dashboard's routes (``/dashboard...``,
``/v1/cache``, ``/v1/cache/stream``) also take ``?api_key=KEY`` in the URL; and a
browser asking for ``/dashboard`` without it gets a small page that asks for
the key and comes back with it.

``GET /health`` stays open: it says only whether the engine loop runs, and a
load balancer's probe carries no key (vLLM leaves it open too). An unknown
path answers 401 without the key (the server does not say which paths exist)
and 404 with it.

This is a pure ASGI middleware, not FastAPI's ``@app.middleware("http")``: that
one wraps every response in a second stream, which delays a server-sent
event and hides a client's disconnect from the handler.
"""

from __future__ import annotations

import hmac
import json
from urllib.parse import parse_qs

#: Paths that accept the key as ``?api_key=`` (a browser's navigations and EventSource).
QUERY_KEY_PATHS = ("/dashboard", "/v1/cache")
#: Paths anyone may call.
OPEN_PATHS = ("/health",)

# A plain GET form (it works without JavaScript); the script only brings back a key
# the dashboard kept in this tab, once (a URL that already carries a key, right or
# wrong, is never redirected again, so a stale key cannot loop).
_ASK_PAGE = """<!doctype html><meta charset="utf-8"><title>paged_np: API key</title>
<form style="font:16px sans-serif;margin:3em" method="get" action="/dashboard">
<p>This server was started with <code>--api-key</code>. The dashboard needs the key:</p>
<input name="api_key" type="password" autofocus size="40"> <button>Open</button></form>
<script>const k = sessionStorage.getItem("paged_np_api_key");
if (k && !new window.URL(location.href).searchParams.has("api_key")) {
  location.replace("/dashboard?api_key=" + encodeURIComponent(k)); }</script>"""


class APIKeyMiddleware:
    """Answer 401 (OpenAI's error body) to any request without the right key."""

    def __init__(self, app, api_key: str):
        if not isinstance(api_key, str) or not api_key:
            raise ValueError("api_key must be a non-empty string")
        self.app = app
        self.key = api_key.encode()

    def allowed(self, scope) -> bool:
        path = scope.get("path", "")
        if path in OPEN_PATHS:
            return True
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key):
                    return True
        if path.startswith(QUERY_KEY_PATHS) and scope.get("method") == "GET":
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            return any(hmac.compare_digest(k.encode(), self.key)
                       for k in query.get("api_key", ()))
        return False

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or self.allowed(scope):
            await self.app(scope, receive, send)
            return
        accept = dict(scope.get("headers", ())).get(b"accept", b"")
        if scope.get("path", "").startswith("/dashboard") and b"text/html" in accept:
            body, ctype = _ASK_PAGE.encode(), b"text/html; charset=utf-8"
        else:
            body = json.dumps({"error": {
                "message": "a valid API key is required: send 'Authorization: Bearer KEY'"
                           + (" (or ?api_key=KEY)" if scope.get("path", "").startswith(
                               QUERY_KEY_PATHS) else ""),
                "type": "invalid_request_error", "param": None,
                "code": "invalid_api_key"}}).encode()
            ctype = b"application/json"
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", ctype), (b"www-authenticate", b"Bearer"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
