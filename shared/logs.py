"""structlog set-up: JSON lines when stderr is not a TTY, key/value pairs, never message text."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog


def configure_logging(*, json: bool | None = None, level: str = "INFO") -> None:
    """Configure structlog (and route stdlib logging through it) once per process."""
    as_json = (not sys.stderr.isatty()) if json is None else json
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Any = (
        structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[*processors, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


def get_logger(name: str) -> Any:
    """A bound structlog logger; event names are dotted and past tense (`summary.computed`)."""
    return structlog.get_logger(name)
