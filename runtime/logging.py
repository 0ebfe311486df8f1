"""structlog set-up shared by every service: JSON lines in production, a console for `make run`.

Secrets registered with `register_secret` are replaced by `[REDACTED]` in every log event,
whatever key or nested value they hide in: a last line of defence, not a licence to log keys.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

_SECRETS: set[str] = set()
REDACTED = "[REDACTED]"


def register_secret(value: str) -> None:
    """Never let `value` (and its 0x-less / lower-case forms) reach a log line."""
    if not value:
        return
    bare = value.removeprefix("0x")
    for form in {value, bare, bare.lower(), bare.upper()}:
        if len(form) >= 8:
            _SECRETS.add(form)


def redact(text: str) -> str:
    """Replace every registered secret in `text`."""
    for secret in _SECRETS:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


def _scrub(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _scrub(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_scrub(v) for v in value)
    if isinstance(value, BaseException):
        return redact(repr(value))
    return value


def _redact_processor(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    if not _SECRETS:
        return event_dict
    return {k: _scrub(v) for k, v in event_dict.items()}


def configure_logging(*, json: bool = True, level: str = "INFO") -> None:
    """Configure structlog and the standard library logging for one process."""
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            _redact_processor,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
