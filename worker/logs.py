"""structlog configuration: JSON lines with per-record context bound through contextvars, and
the current span's ``trace_id``/``span_id`` (``worker.tracing``), so a line joins its trace.

Secrets never reach a log line: API keys and provider credentials are not bound anywhere, and
the ``_redact`` processor drops any key that looks like one, in case a future call site does.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

from worker.tracing import add_trace_ids

_SECRET_KEYS = frozenset({"api_key", "x_api_key", "password", "authorization", "secret", "token"})


def _redact(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key in list(event):
        if key.lower() in _SECRET_KEYS:
            event[key] = "[redacted]"
    return event


def configure(level: str = "INFO", fmt: str = "json") -> None:
    """Set up structlog once per process (called from the CLI, never at import)."""
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            add_trace_ids,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _redact,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    return structlog.get_logger(name)  # type: ignore[no-any-return]
