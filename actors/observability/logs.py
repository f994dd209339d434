"""Logs: structlog (JSON or console) with the actor's name, and secrets redacted."""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

from actors.observability.secrets import MASKER

# --- redaction -----------------------------------------------------------------

# scheme://user:password@host (any scheme: postgresql, nats, tls, http...).
_PASSWORD_IN_URL = re.compile(
    r"(?P<scheme>\b[a-z][a-z0-9+.-]*://)(?P<user>[^:/@\s,]*):(?P<pw>[^@/\s]+)@", re.I
)
# nats://token@host: NATS's token form; the whole user part is the secret. Only
# for NATS's schemes: in postgresql://user@host the user name is not a secret.
_TOKEN_IN_NATS_URL = re.compile(r"(?P<scheme>\b(?:nats|tls|ws|wss)://)(?P<token>[^:/@\s,]+)@", re.I)
# ?password=..., &token=..., and key-value DSNs (password=secret or password='s e')
_SECRET_KEYS = (
    r"password|passwd|pwd|sslpassword|pass|token|auth_token|access_token|"
    r"api_key|apikey|api_token|secret|client_secret|sslkey_password|nkey|jwt"
)
_SECRET_PARAM = re.compile(
    rf"(?P<key>\b(?:{_SECRET_KEYS}))(?P<eq>\s*=\s*)"
    r"(?P<value>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^\s&;,'\"]+)",
    re.I,
)
_BEARER = re.compile(r"(?P<scheme>\b(?:Bearer|Basic|Token)\s+)[A-Za-z0-9._~+/=-]{6,}", re.I)


def redact(text: str) -> str:
    """Remove credentials from URLs, DSNs and headers in ``text``.

    ``postgresql://u:secret@h`` -> ``postgresql://u:***@h``; ``nats://tok@h`` ->
    ``nats://***@h``; ``?password=x`` / ``&token=x`` / ``password='x y'`` (a
    key-value DSN) -> ``password=***``; ``Bearer abc...`` -> ``Bearer ***``.
    """
    text = MASKER.mask(text)  # every secret this replica knows, wherever it stands
    if "@" not in text and "=" not in text:
        # The URL and key=value forms need one of those: most fields (run ids,
        # job names, event names) skip three of the four scans (a per-run
        # line's redaction was most of its cost, 30 us a line).
        return _BEARER.sub(lambda m: f"{m['scheme']}***", text)
    text = _PASSWORD_IN_URL.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)
    text = _TOKEN_IN_NATS_URL.sub(
        lambda m: m[0] if m["token"] == "***" else f"{m['scheme']}***@", text
    )
    text = _SECRET_PARAM.sub(lambda m: f"{m['key']}{m['eq']}***", text)
    return _BEARER.sub(lambda m: f"{m['scheme']}***", text)


def _redact_processor(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key, value in event.items():
        if isinstance(value, str):
            event[key] = redact(value)
    return event


# --- logs ----------------------------------------------------------------------

LOG_FORMATS = ("auto", "json", "console")


def resolve_log_format(log_format: str, stream: Any = None) -> str:
    """``auto`` is ``console`` when ``stream`` (stderr) is a terminal, else ``json``."""
    if log_format != "auto":
        return log_format
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return "console" if isatty is not None and isatty() else "json"


def configure_logging(level: str = "INFO", log_format: str = "json") -> None:
    """One event per line on stderr, ours and the libraries' alike.

    asyncio, aiohttp, asyncpg and nats-py log through the standard library
    (nats-py its reconnect errors, with tracebacks): the root logger's handler
    renders those records through the same processors as structlog's own
    events (structlog's ProcessorFormatter), so a library's traceback is one
    ``exception`` field of one JSON line, never raw lines. ``log_format`` is
    ``json``, ``console`` (human-readable) or ``auto`` (console on a terminal).
    """
    json_logs = resolve_log_format(log_format) == "json"
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if json_logs
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                _redact_processor,
                renderer,
            ],
        )
    )
    global _LEVEL  # the one place the level is decided
    _LEVEL = logging.getLevelName(level)
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level)
    logging.captureWarnings(True)  # warnings.warn() as log records too, not raw stderr
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.format_exc_info,
            _redact_processor,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        # One printer for every event: the factory is called at each event (loggers are
        # not cached, so that configuring again applies everywhere), and structlog's own
        # factory made a PrintLogger and looked up its file's lock every time (about
        # 8% of a replica's time at a herd of 10,000 sync python runs).
        logger_factory=_Printer(structlog.PrintLogger(file=sys.stderr)),
        cache_logger_on_first_use=False,
    )


class _Printer:
    """A logger factory that hands out one logger."""

    def __init__(self, printer: structlog.PrintLogger) -> None:
        self.printer = printer

    def __call__(self, *_: Any) -> structlog.PrintLogger:
        return self.printer


def get_logger(actor: str) -> Any:
    return structlog.get_logger(actor=actor)


_LEVEL = logging.NOTSET  # structlog's events below it are dropped (configure_logging)


def logs_at(level: int) -> bool:
    """Whether an event at ``level`` is written: a per-run path asks before it builds one.

    A call on a logger from :func:`get_logger` binds a new logger first (its
    configuration is looked up on every call), even when the level drops the
    event: about 3 us per run for a bind and two events dropped, against 0.1 us
    for this test (the lines only the per-run paths of the worker write).
    """
    return level >= _LEVEL
