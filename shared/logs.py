"""structlog set-up: JSON lines when stderr is not a TTY, key/value pairs, never message text.

One stream a person can read: the libraries' own stdlib log records (uvicorn's, Celery's,
kombu's) go through the same renderer as prefit's (`route_stdlib`), as do Python warnings,
so a process writes JSON lines only (or, on a terminal, structlog's readable columns). Lines
that repeat one of ours are turned down: uvicorn's access log (`request.completed` is the
canonical request line), Celery's per-task `received`/`succeeded` lines (`summary.
task_finished` is the canonical job line), and httpx's line per upstream call.
"""

from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path
from typing import Any, TextIO

import structlog

HANDLER_NAME = "prefit"
# uvicorn's --log-config: its own loggers through `uvicorn_formatter` (see `api_argv`)
UVICORN_LOG_CONFIG = Path(__file__).with_name("uvicornlog.json")
# stdlib loggers whose INFO lines repeat one of ours: only their warnings and errors show
QUIETED = (
    "uvicorn.access",  # request.completed
    "celery.app.trace",  # "Task ... succeeded in": summary.task_finished
    "celery.worker.strategy",  # "Task ... received"
    "httpx",  # one line per call to a provider or summarizer; failures are logged by us
    "httpcore",
)


def configure_logging(*, json: bool | None = None, level: str = "INFO") -> None:
    """Configure structlog, route stdlib logging and warnings through it; once per process
    (calling it again replaces the previous set-up)."""
    as_json = json_lines(json)
    structlog.configure(
        processors=[*_stamped(), structlog.processors.format_exc_info, _renderer(as_json)],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),  # line and \n: one write
        cache_logger_on_first_use=True,
    )
    route_stdlib(as_json, level)
    warnings.showwarning = _warned


def json_lines(json: bool | None) -> bool:
    """JSON when asked, else when stderr is not a terminal."""
    return (not sys.stderr.isatty()) if json is None else json


def route_stdlib(as_json: bool, level: str = "INFO") -> None:
    """The root logger writes every stdlib record through structlog's renderer, on stderr;
    uvicorn's loggers lose their own handlers and propagate to it."""
    handler = StderrHandler()
    handler.set_name(HANDLER_NAME)
    handler.setFormatter(stdlib_formatter(as_json))
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == HANDLER_NAME]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    for name in QUIETED:
        logging.getLogger(name).setLevel(logging.WARNING)


def stdlib_formatter(json: bool | None = None) -> logging.Formatter:
    """A stdlib formatter rendering records as structlog does (uvicorn's `--log-config` names
    it, so its parent process's lines are rendered so from the start)."""
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.add_logger_name, *_stamped()],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            _renderer(json_lines(json)),
        ],
    )


def uvicorn_formatter() -> logging.Formatter:
    """`stdlib_formatter` in the mode `PREFIT_LOG_JSON` chooses, for uvicorn's `--log-config`
    (UVICORN_LOG_CONFIG): its lines are structured from its first, before the app loads."""
    from shared.settings import get_settings  # read only when uvicorn starts

    return stdlib_formatter(get_settings().log_json)


def get_logger(name: str) -> Any:
    """A bound structlog logger; event names are dotted and past tense (`summary.computed`)."""
    return structlog.get_logger(name)


def _stamped() -> list[Any]:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]


def _renderer(as_json: bool) -> Any:
    return structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer()


class StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A handler on whatever `sys.stderr` is when a record comes (tests swap it)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _: TextIO) -> None:
        pass


def _warned(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """A Python warning as one line (Celery's SecurityWarning of a worker run as root)."""
    first = str(message).strip().splitlines()[0] if str(message).strip() else ""
    get_logger("py.warnings").warning(
        "python.warned", category=category.__name__, where=f"{filename}:{lineno}", text=first
    )
