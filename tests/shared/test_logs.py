"""One log stream: the libraries' stdlib records and Python warnings rendered as ours."""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Iterator

import pytest
import structlog

from shared.logs import HANDLER_NAME, QUIETED, route_stdlib, stdlib_formatter


@pytest.fixture
def routed() -> Iterator[None]:
    """The root logger routed through structlog for one test, then as it was."""
    root = logging.getLogger()
    names = (*QUIETED, "uvicorn", "uvicorn.error", "celery.apps.worker")
    saved = {n: (logging.getLogger(n).level, logging.getLogger(n).disabled) for n in names}
    level = root.level
    for name in names[len(QUIETED) :]:  # as a fresh process has them (uvicorn servers in
        logging.getLogger(name).setLevel(logging.NOTSET)  # earlier tests set WARNING)
    yield
    for handler in [h for h in root.handlers if h.get_name() == HANDLER_NAME]:
        root.removeHandler(handler)
    root.setLevel(level)
    for name, (old, disabled) in saved.items():
        logging.getLogger(name).setLevel(old)
        logging.getLogger(name).disabled = disabled


def test_uvicorn_and_celery_records_become_json_lines(
    routed: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """A uvicorn or Celery INFO record is one JSON line with event, level, timestamp and
    logger; Celery's per-task lines and uvicorn's access lines are not written at all."""
    route_stdlib(as_json=True)
    logging.getLogger("uvicorn.error").info("Started server process [%d]", 7)
    logging.getLogger("celery.apps.worker").info("celery@host ready.")
    logging.getLogger("celery.app.trace").info("Task prefit.summarize[x] succeeded in 0.1s")
    logging.getLogger("uvicorn.access").info('127.0.0.1 - "GET /healthz" 200')
    lines = [json.loads(x) for x in capsys.readouterr().err.splitlines()]
    assert [(x["event"], x["logger"], x["level"]) for x in lines] == [
        ("Started server process [7]", "uvicorn.error", "info"),
        ("celery@host ready.", "celery.apps.worker", "info"),
    ]
    assert all(x["timestamp"].endswith("Z") for x in lines)


def test_on_a_terminal_the_lines_are_columns_not_json() -> None:
    """The console renderer (a TTY) writes readable columns: level, event, key=value."""
    record = logging.LogRecord("uvicorn.error", logging.INFO, "f", 1, "Shutting down", (), None)
    line = stdlib_formatter(json=False).format(record)
    assert "Shutting down" in line and "info" in line and not line.startswith("{")
    assert json.loads(stdlib_formatter(json=True).format(record))["event"] == "Shutting down"


def test_a_python_warning_is_one_structured_line(
    routed: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """A warning (Celery's SecurityWarning for a worker run as root) is one `python.warned`
    line with its category, where it was raised and its first line, not a multi-line print."""
    from shared.logs import configure_logging

    saved, shown = structlog.get_config(), warnings.showwarning
    try:
        configure_logging(json=True)
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn("running as root: this is\nnot recommended", UserWarning, stacklevel=1)
        (line,) = capsys.readouterr().err.splitlines()
    finally:
        structlog.configure(**saved)
        warnings.showwarning = shown
    record = json.loads(line)
    assert record["event"] == "python.warned" and record["category"] == "UserWarning"
    assert record["text"] == "running as root: this is" and record["level"] == "warning"
