"""Running the app: ``serve`` in the foreground until a signal, ``ServerThread`` on a
thread (tests, notebooks), and the dashboard opened in the user's browser.

Both take one :class:`~paged_np.server.ServerConfig` (``options`` replace its
fields) and build the app with :func:`~paged_np.server.app.create_app`. On a stop,
the engine loop first gives in-flight requests ``drain_s`` seconds, then aborts
what is left, while uvicorn stops accepting connections.
"""

from __future__ import annotations

import signal
import threading
import time
import webbrowser

from ..errors import PagedNPError
from .app import create_app
from .auth import redact_access_log
from .config import ServerConfig
from .metrics import ServerMetrics


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
    redact_access_log()                                  # after uvicorn set up its loggers
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
        redact_access_log()
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
