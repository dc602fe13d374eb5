"""``GET /dashboard``: a live view of the KV cache, one HTML page the server ships.

The page is plain HTML, CSS and JavaScript (``static/dashboard.{html,css,js}``): no
build step, no CDN, nothing fetched from outside, so it works offline and in a
classroom. It reads the cache's own endpoints (``GET /v1/cache`` for a snapshot,
``GET /v1/cache/stream`` for server-sent updates, polling the snapshot once a
second when a stream cannot open) and draws the arena, the LRU order, the radix
tree, the queues and a few counters over time. It shows token counts, pages and
states, never prompt or answer text.

The shell itself holds no data: with ``--api-key`` the page asks for the key when
``/v1/cache`` answers 401, posts it once to ``/dashboard/login`` and reads on with
the session cookie that answers (:mod:`.auth`); the key is kept nowhere.

Served as one response (the stylesheet and the script inlined), so the page is a
single request however the server guards its other paths; opened from disk, the
same HTML loads its two siblings instead.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

router = APIRouter()

_CSS_TAG = '<link rel="stylesheet" href="dashboard.css">'
_JS_TAG = '<script src="dashboard.js"></script>'


def _static(name: str) -> str:
    return resources.files(__package__).joinpath("static", name).read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def dashboard_html() -> str:
    """The page with its stylesheet and script inlined (read once from the package)."""
    html = _static("dashboard.html")
    if _CSS_TAG not in html or _JS_TAG not in html:       # a broken edit: say so at once
        raise RuntimeError("static/dashboard.html must link dashboard.css and dashboard.js")
    # "</" cannot occur inside an inlined script's text as "</script"; ours has none.
    html = html.replace(_CSS_TAG, "<style>\n" + _static("dashboard.css") + "</style>")
    return html.replace(_JS_TAG, "<script>\n" + _static("dashboard.js") + "</script>")


@router.get("/dashboard", response_class=HTMLResponse, include_in_schema=False)
async def dashboard() -> HTMLResponse:
    return HTMLResponse(dashboard_html(), headers={"Cache-Control": "no-cache"})
