"""One structlog stream per process (JSON in production) with the record's context and trace ids;
secrets are never bound, and ``_redact`` drops any key that looks like one."""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, MutableMapping
from contextvars import ContextVar, Token
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import structlog
from structlog.typing import Processor

from worker.runtime.tracing import add_trace_ids

_SECRET_KEYS = frozenset({"api_key", "x_api_key", "password", "authorization", "secret", "token"})


def _redact(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key in list(event):
        if key.lower() in _SECRET_KEYS:
            event[key] = "[redacted]"
    return event


_NOTHING: Mapping[str, Any] = MappingProxyType({})
_CONTEXT: ContextVar[Mapping[str, Any]] = ContextVar("passkey_log_context", default=_NOTHING)


class log_context:
    """Binds ``fields`` to every line logged inside the block and the tasks it starts, in one
    context variable (structlog's ``bound_contextvars`` costs one per field, per unit of work)."""

    __slots__ = ("_fields", "_token")

    def __init__(self, **fields: Any) -> None:
        self._fields = fields
        self._token: Token[Mapping[str, Any]] | None = None

    def __enter__(self) -> None:
        outer = _CONTEXT.get()
        self._token = _CONTEXT.set({**outer, **self._fields} if outer else self._fields)

    def __exit__(self, *_: object) -> None:
        if self._token is not None:
            _CONTEXT.reset(self._token)
            self._token = None


def log_fields() -> dict[str, Any]:
    """The fields ``log_context`` binds here and now (a copy)."""
    return dict(_CONTEXT.get())


def merge_log_context(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """A line's own fields win over the bound ones."""
    for key, value in _CONTEXT.get().items():
        event.setdefault(key, value)
    return event


class _NamedPrintLogger(structlog.PrintLogger):
    """structlog's ``PrintLogger`` that knows the name it was asked for (``get_logger(name)``)."""

    def __init__(self, name: object = None) -> None:
        super().__init__(sys.stderr)
        self.name = None if name is None else str(name)


def _logger_name(logger: Any, _: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    name = getattr(logger, "name", None)
    if name:
        event.setdefault("logger", name)
    return event


def _service(name: str) -> Processor:
    def add(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        event.setdefault("service", name)
        return event

    return add


@dataclass(frozen=True, slots=True)
class LogConfig:
    """How a process logs (``LOG_LEVEL``, ``LOG_FORMAT``, ``LOG_LIBRARY_LEVEL``,
    ``API_ACCESS_LOG``): the arguments of ``configure``."""

    level: str = "INFO"
    format: str = "json"
    library_level: str = "WARNING"
    access_log: bool = False


def configure(
    level: str = "INFO",
    fmt: str = "json",
    *,
    service: str = "passkey",
    library_level: str = "WARNING",
    access_log: bool = False,
) -> None:
    """Set up structlog and the root ``logging`` handler once per process (called from the
    CLI, never at import). ``library_level`` filters the libraries' records; ``access_log``
    lets uvicorn's access lines (one per HTTP request) through at INFO."""
    renderer: Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    shared: list[Processor] = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _service(service),
        _redact,
    ]
    structlog.configure(
        processors=[
            merge_log_context,
            structlog.contextvars.merge_contextvars,
            _logger_name,
            add_trace_ids,
            *shared,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=_NamedPrintLogger,
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                structlog.stdlib.add_logger_name,
                structlog.stdlib.ExtraAdder(),
                add_trace_ids,
                *shared,
            ],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.getLevelName(library_level))
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        uvicorn_logger = logging.getLogger(name)
        uvicorn_logger.handlers.clear()
        uvicorn_logger.propagate = True
    logging.getLogger("uvicorn.access").setLevel(
        logging.INFO if access_log else logging.getLevelName(library_level)
    )


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    """A logger whose lines name ``name`` (the module) as their ``logger``."""
    return structlog.get_logger(name)  # type: ignore[no-any-return]
