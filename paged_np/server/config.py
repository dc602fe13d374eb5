"""``ServerConfig``: every option of the HTTP server, in one place (beside ``EngineConfig``).

The engine's options live in :class:`paged_np.engine.config.EngineConfig`; the server's
own (the name it answers to, where it listens, how long it drains, the API key,
what the dashboard may show, and the limits on what one client may make the server do)
live here, once. Both travel the same way:
``python -m paged_np serve`` makes one flag per field of each
(:func:`paged_np.cli.options.add_config_args`), builds one ``EngineConfig`` and
one ``ServerConfig`` from what it parsed, and hands the objects down to
:func:`~paged_np.server.serve`, :func:`~paged_np.server.create_app` and
:class:`~paged_np.server.ServerThread`. A field added here reaches all of them
without another line.

::

    >>> cfg = ServerConfig(port=8080, api_key="sesame")
    >>> cfg.port, cfg.drain_s
    (8080, 5.0)
    >>> ServerConfig.from_options(cfg, show_text=True).show_text
    True

Plain Python: importing it needs neither FastAPI nor uvicorn (the ``serve`` extra).

Compared with vLLM: its server options are argparse flags on one big namespace
(``vllm serve --help``); here they are a frozen dataclass validated once, so a
bad value fails at construction with the field's name, not when uvicorn starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..checks import check_int, check_positive_int, replace_fields
from ..errors import DTypeError, InvalidArgument

#: uvicorn's log levels (``--log-level``).
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


def _option(default, help: str, **cli):
    """A field with the help its flag shows, as :class:`~paged_np.engine.config.EngineConfig`'s
    fields carry theirs (``flags``: the flag's spellings when not ``--field-name``;
    ``type``: what argparse converts the text to)."""
    return field(default=default, metadata=dict(help=help, **cli))


@dataclass(frozen=True)
class ServerConfig:
    """Every option of the OpenAI-compatible server (not the engine's: see EngineConfig).

    Validated once, at construction; each error is a
    :class:`~paged_np.errors.PagedNPError` that names the field.
    """

    served_model_name: str | None = _option(
        None, "the name clients send as 'model' (None: the model's own name, --model)",
        type=str)
    host: str = _option("127.0.0.1", "the address to listen on", type=str)
    port: int = _option(8000, "the port to listen on (0: any free one)", type=int)
    drain_s: float = _option(
        5.0, "seconds in-flight requests get to finish at shutdown", type=float,
        flags=("--drain-timeout",), metavar="SECONDS")
    log_level: str = _option("info", "uvicorn's log level", choices=LOG_LEVELS)
    api_key: str | None = _option(
        None, "every route but /health answers 401 without 'Authorization: Bearer KEY' "
        "(also read from the environment variable PAGED_NP_API_KEY, which keeps it out of the "
        "process list; the dashboard signs in once with it and gets a cookie: the key is "
        "never in a URL)", type=str)
    show_text: bool = _option(
        False, "put prompt and answer text into GET /v1/cache and its stream (the dashboard "
        "page never draws text; off: token counts, pages and states only)",
        flags=("--dashboard-show-text",))
    open_browser: bool = _option(
        False, "open the dashboard (/dashboard) in the browser once the server listens",
        flags=("--open",))
    max_n: int | None = _option(
        None, "most samples one request may ask for (None: the engine's max_num_seqs)",
        type=int)

    # ---- limits: what one client may make the server do (docs/serving-http.md, "Limits")
    max_body_bytes: int | None = _option(
        None, "largest request body, in bytes; a bigger one is answered 413 before it is read "
        "(None: 1 MiB + 6 bytes per character of --max-prompt-chars)", type=int)
    max_prompt_chars: int | None = _option(
        None, "longest prompt text, in characters, refused (400) before it is tokenized "
        "(None: max_model_len x the vocabulary's longest token, so no prompt that fits the "
        "context is refused)", type=int)
    max_stop: int = _option(4, "most stop strings one request may give (OpenAI's limit)",
                            type=int)
    max_stop_chars: int = _option(256, "longest stop string, in characters", type=int)
    max_logprob_entries: int = _option(
        1 << 18, "most logprobs one request may ask for: n x max_tokens x (top_logprobs + 1)",
        type=int)
    max_cache_streams: int = _option(
        32, "most GET /v1/cache/stream readers at once; one more is answered 503 "
        "(its dashboard then reads /v1/cache once a second)", type=int)
    dashboard_session_s: float = _option(
        12 * 3600.0, "how long a dashboard sign-in (its cookie) lasts, in seconds",
        type=float, metavar="SECONDS")
    max_dashboard_sessions: int = _option(
        64, "most dashboard sign-ins kept at once (one more drops the oldest)", type=int)

    def __post_init__(self):
        for name in ("served_model_name", "api_key"):
            value = getattr(self, name)
            if value is not None:
                _check_text(name, value)
        _check_text("host", self.host)
        object.__setattr__(self, "port", check_int("ServerConfig.port", self.port, 0, 65536))
        object.__setattr__(self, "drain_s", _check_seconds("drain_s", self.drain_s))
        if not isinstance(self.log_level, str) or self.log_level not in LOG_LEVELS:
            raise InvalidArgument(f"ServerConfig.log_level must be one of {LOG_LEVELS}, "
                                  f"got {self.log_level!r}")
        for name in ("show_text", "open_browser"):
            value = getattr(self, name)
            if not isinstance(value, (bool, np.bool_)):
                raise DTypeError(f"ServerConfig.{name} must be a bool, got "
                                 f"{type(value).__name__}")
            object.__setattr__(self, name, bool(value))
        for name in ("max_n", "max_body_bytes", "max_prompt_chars"):   # None: sized later
            if getattr(self, name) is not None:
                object.__setattr__(self, name, check_positive_int(f"ServerConfig.{name}",
                                                                  getattr(self, name)))
        for name in ("max_stop_chars", "max_logprob_entries", "max_cache_streams",
                     "max_dashboard_sessions"):
            object.__setattr__(self, name, check_positive_int(f"ServerConfig.{name}",
                                                              getattr(self, name)))
        object.__setattr__(self, "max_stop", check_int("ServerConfig.max_stop", self.max_stop, 0))
        session = _check_seconds("dashboard_session_s", self.dashboard_session_s)
        if session == 0:
            raise InvalidArgument("ServerConfig.dashboard_session_s must be > 0, got 0")
        object.__setattr__(self, "dashboard_session_s", session)

    @classmethod
    def from_options(cls, config: ServerConfig | None = None, /, **options) -> ServerConfig:
        """``config`` with ``options`` replaced (a fresh default one when None).

        Unknown option names are refused with the list of known ones.
        """
        return replace_fields(cls, config, options, "server")


def _check_text(name: str, value) -> None:
    """A non-empty string, or a named error."""
    if not isinstance(value, str):
        raise DTypeError(f"ServerConfig.{name} must be a str, got {type(value).__name__}")
    if not value.strip():
        if name == "api_key":                            # a guard that guards nothing
            raise InvalidArgument("ServerConfig.api_key must not be empty: give a key "
                                  "(--api-key KEY or PAGED_NP_API_KEY=KEY), or none at all "
                                  "to serve without one")
        raise InvalidArgument(f"ServerConfig.{name} must not be empty")


def _check_seconds(name: str, value) -> float:
    """A finite number of seconds >= 0, as a float."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        raise DTypeError(f"ServerConfig.{name} must be a number of seconds, got "
                         f"{type(value).__name__}")
    if not (math.isfinite(value) and value >= 0):
        raise InvalidArgument(f"ServerConfig.{name} must be a finite number >= 0, got {value!r}")
    return float(value)
