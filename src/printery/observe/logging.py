"""Structured logging for every printery process, with secrets scrubbed before rendering.

Logs go to **stderr**, always: stdout belongs to ``printery … --json`` documents and to
the outcome tables of ``printery demo``, so a log line can never corrupt them. When
stderr is not a terminal (systemd, containers, pipes) each line is one JSON object;
on a terminal it is the human console format. Timestamps are ISO 8601 in UTC.

Records of the standard ``logging`` module (aiohttp, redis-py, asyncio) go through the
same processors, so they are JSON and redacted as well.

Redaction happens in one processor (:class:`printery.observe.redact.Redactor`, the project's one
rule set) placed after exceptions are formatted and before the renderer, so tracebacks
are scrubbed too: every configured secret string and every URL password
(``redis://:***@host``) in any string value, nested or not, becomes ``***``; values of
keys named like ``password`` or ``token`` are masked whole.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Collection, MutableMapping
from typing import Any, TextIO, cast

import orjson
import structlog
from structlog.typing import EventDict, FilteringBoundLogger, Processor

from printery.observe.redact import Redactor

__all__ = ["configure_logging", "get_logger"]

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


class _NamedWriteLogger(structlog.WriteLogger):
    def __init__(self, file: TextIO, name: str) -> None:
        super().__init__(file)
        self.name = name


class _NamedLoggerFactory:
    """Like ``structlog.WriteLoggerFactory`` but keeps ``get_logger``'s name argument."""

    def __init__(self, file: TextIO) -> None:
        self._file = file

    def __call__(self, *args: Any) -> _NamedWriteLogger:
        return _NamedWriteLogger(self._file, str(args[0]) if args else "")


def _add_logger_name(logger: object, method_name: str, event_dict: EventDict) -> EventDict:
    name = getattr(logger, "name", "")
    if name:
        event_dict["logger"] = name
    return event_dict


def _json_dumps(obj: MutableMapping[str, Any], **_: Any) -> str:
    return orjson.dumps(obj, default=str, option=orjson.OPT_NON_STR_KEYS).decode()


class _CurrentStderr:
    """Writes to whatever ``sys.stderr`` is at write time, not at configure time.

    Loggers are cached on first use; binding them to the stderr object of that moment
    would leave them writing to a replaced (e.g. test-captured, then closed) stream.
    """

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return _isatty(sys.stderr)


def _isatty(stream: TextIO | _CurrentStderr) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # detached or closed streams
        return False


#: Libraries that log each request at INFO (see :func:`configure_logging`).
_CHATTY_CLIENTS = ("httpx", "httpcore")

# Marks the root handler we installed, so reconfiguring replaces it instead of stacking.
_HANDLER_NAME = "printery"


def configure_logging(
    level: str = "info",
    *,
    json: bool | None = None,
    secrets: Collection[str] = (),
    stream: TextIO | None = None,
) -> None:
    """Set up structlog and the standard ``logging`` root for this process.

    ``level`` is ``debug``, ``info``, ``warn`` or ``error``. ``json`` forces the format;
    ``None`` picks JSON unless ``stream`` (default: stderr) is a terminal. ``secrets``
    are strings never to print (Redis password, webhook secret). Loggers are cached on
    first use for speed, so configure before the first log call; loggers obtained
    earlier keep the old configuration.
    """
    try:
        levelno = _LEVELS[level.strip().lower()]
    except KeyError:
        raise ValueError(f"unknown log level {level!r}: debug, info, warn or error") from None
    out: Any = stream if stream is not None else _CurrentStderr()
    use_json = json if json is not None else not _isatty(out)
    redactor = Redactor(secrets)
    renderer: Processor = (
        structlog.processors.JSONRenderer(serializer=_json_dumps)
        if use_json
        else structlog.dev.ConsoleRenderer(colors=_isatty(out), pad_event_to=0)
    )
    timestamper = structlog.processors.TimeStamper(fmt="iso", utc=True)
    # Exceptions become text before redaction: a traceback may quote a URL or secret.
    tail: list[Processor] = [structlog.processors.format_exc_info, redactor, renderer]

    structlog.reset_defaults()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            _add_logger_name,
            structlog.processors.add_log_level,
            timestamper,
            structlog.processors.StackInfoRenderer(),
            *tail,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(levelno),
        logger_factory=_NamedLoggerFactory(out),
        cache_logger_on_first_use=True,
    )

    handler = logging.StreamHandler(out)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                structlog.stdlib.add_log_level,
                structlog.stdlib.add_logger_name,
                timestamper,
            ],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *tail],
        )
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(levelno)
    # The HTTP clients log every request at INFO: the parent of --processes polls its
    # children each second, which would be two lines a second forever. Below debug,
    # internal HTTP calls are silent; their failures are still logged by their callers.
    quiet = levelno if levelno <= logging.DEBUG else max(levelno, logging.WARNING)
    for name in _CHATTY_CLIENTS:
        logging.getLogger(name).setLevel(quiet)


def get_logger(name: str | None = None, **initial_values: Any) -> FilteringBoundLogger:
    """A structlog logger; ``name`` lands in each line's ``logger`` field."""
    # A lazy proxy: safe at import time, it picks up `configure_logging` on first use.
    # The name travels as a logger-factory argument (see `_NamedLoggerFactory`).
    args = (name,) if name is not None else ()
    return cast(FilteringBoundLogger, structlog.get_logger(*args, **initial_values))

