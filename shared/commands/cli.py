"""The `prefit` console script: `up`, `api`, `worker`, `demo`, `inspect` and `encodings`.

- `prefit up`: the whole service on one machine (embedded Redis unless REDIS_URL is set).
- `prefit api`: become the API's uvicorn server, its own lines structured from the first.
- `prefit worker`: become a Celery summary worker with the project's settings.
- `prefit demo FILE | --generate`: replay a conversation against a running service.
- `prefit inspect ...`: shared/commands/inspect.py, imported only when asked for.
- `prefit encodings [DIR] [--from SRC]`: tiktoken's files, checked
  (shared/commands/encodingfiles.py).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from pydantic import ValidationError

from shared.client import PrefitClient
from shared.commands.demo import DemoOptions, generate_conversation, load_conversation, replay
from shared.commands.up import UpOptions, api_argv, run_up, worker_argv
from shared.errors import PrefitError
from shared.logs import configure_logging
from shared.settings import Settings, get_settings


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `prefit` console script; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "inspect":
        return _inspect(args[1:])
    ns = build_parser().parse_args(args)
    try:
        settings = get_settings()
    except ValueError as exc:  # pydantic's ValidationError and SettingsError are ValueErrors
        print(f"prefit: invalid settings: {settings_problem(exc)}", file=sys.stderr)
        return 2
    configure_logging(json=_log_json(ns, settings), level=settings.log_level)
    command: Callable[[argparse.Namespace, Settings], int] = ns.command
    return command(ns, settings)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prefit", description="Keep long LLM conversations inside the model's window."
    )
    sub = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)

    up = sub.add_parser("up", help="run the API, a worker and (unless REDIS_URL is set) Redis")
    up.add_argument("--host", help="interface of the API (default: PREFIT_HOST or 127.0.0.1)")
    up.add_argument("--port", type=int, help="port of the API (default: PREFIT_PORT or 8000)")
    up.add_argument(
        "--api-workers", type=_positive, help="API processes serving the one port (default 1)"
    )
    up.add_argument(
        "--workers",
        type=_positive,
        default=1,
        help="summary worker processes, each a Celery node of its own (default 1)",
    )
    up.add_argument("--grace", type=float, default=10.0, help="seconds each child gets to stop")
    up.add_argument("--redis-dir", type=Path, help="persist the embedded Redis (AOF) here")
    up.set_defaults(command=_up)

    api = sub.add_parser("api", help="run the API server (uvicorn; replaces this process)")
    api.add_argument("--host", help="interface to listen on (default: PREFIT_HOST or 127.0.0.1)")
    api.add_argument("--port", type=int, help="port to listen on (default: PREFIT_PORT or 8000)")
    api.set_defaults(command=_api)

    worker = sub.add_parser("worker", help="run a Celery summary worker (replaces this process)")
    worker.add_argument(
        "--concurrency", type=_positive, help="threads (default: PREFIT_WORKER_CONCURRENCY)"
    )
    worker.add_argument(
        "-n",
        "--name",
        help="Celery node name, unique per worker (default: prefit-<random>@<host>; %%h is the "
        "host name)",
    )
    worker.set_defaults(command=_worker)

    demo = sub.add_parser("demo", help="replay a conversation against a running service")
    source = demo.add_mutually_exclusive_group(required=True)
    source.add_argument("file", nargs="?", type=Path, help="transcript JSON ({messages, tools?})")
    source.add_argument("--generate", action="store_true", help="a synthetic agent session")
    demo.add_argument("--turns", type=_positive, default=60, help="tool calls to generate")
    demo.add_argument(
        "--url", help="the service's base URL (default: http://127.0.0.1:PREFIT_PORT, as `up`)"
    )
    demo.add_argument("--model", default="gpt-4o")
    demo.add_argument(
        "--window", type=_positive, help="max input tokens (default: the service's, PREFIT_MODELS)"
    )
    demo.add_argument("--api-key", help="bearer key (default: the first of PREFIT_API_KEYS)")
    demo.add_argument("--conversation", default="", help="conversation id (default: random)")
    demo.add_argument("--wait-ms", type=int, default=0, help="prepare may wait for a summary")
    demo.add_argument("--pace", type=float, default=0.0, help="seconds between turns")
    demo.add_argument("--no-color", action="store_true")
    demo.set_defaults(command=_demo)

    encodings = sub.add_parser(
        "encodings", help="install tiktoken's encoding files into a folder, checked by SHA-256"
    )
    encodings.add_argument(
        "into", nargs="?", type=Path, help="the folder (default: PREFIT_TIKTOKEN_DIR)"
    )
    encodings.add_argument(
        "--from",
        dest="source",
        type=Path,
        help="copy the files found here instead of downloading them (air-gapped hosts)",
    )
    encodings.add_argument(
        "--name", action="append", dest="names", help="an encoding (default: every one)"
    )
    encodings.set_defaults(command=_encodings)

    # Listed for --help only: main() hands `inspect` and everything after it to
    # shared.commands.inspect.
    sub.add_parser("inspect", help="show what prepare does to a transcript (see inspect -h)")
    return parser


LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


def _up(ns: argparse.Namespace, settings: Settings) -> int:
    host = ns.host or settings.host
    if settings.open_access and not settings.allow_open and host not in LOOPBACK:
        print(
            f"prefit up: refusing to listen on {host} with no PREFIT_API_KEYS: without keys the "
            "service serves one local tenant to anyone who can reach it; set PREFIT_API_KEYS "
            "(tenant:key,...), bind to 127.0.0.1, or opt in with PREFIT_ALLOW_OPEN=true",
            file=sys.stderr,
        )
        return 2
    opts = UpOptions(
        host=host,
        port=ns.port if ns.port is not None else settings.port,
        workers=ns.api_workers or 1,
        summary_workers=ns.workers,
        grace_s=ns.grace,
        redis_dir=ns.redis_dir,
    )
    # The children inherit this environment (PATH, PREFIT_*), plus the Redis they are given.
    return run_up(opts, settings, dict(os.environ), sys.stdout)


def _api(ns: argparse.Namespace, settings: Settings) -> int:
    port = ns.port if ns.port is not None else settings.port
    _exec(api_argv(ns.host or settings.host, port))


def _worker(ns: argparse.Namespace, settings: Settings) -> int:
    _exec(worker_argv(settings, ns.concurrency, ns.name))


def _exec(argv: list[str]) -> NoReturn:
    sys.stdout.flush()
    os.execv(argv[0], argv)


def _demo(ns: argparse.Namespace, settings: Settings) -> int:
    try:
        if ns.generate:
            messages, tools = generate_conversation(ns.turns)
        else:
            messages, tools = load_conversation(ns.file)
    except (OSError, ValueError) as exc:  # InvalidTranscript and JSON errors are ValueErrors
        print(f"prefit demo: cannot read {ns.file}: {exc}", file=sys.stderr)
        return 2
    opts = DemoOptions(
        model=ns.model,
        window=ns.window,
        conversation_id=ns.conversation,
        wait_ms=ns.wait_ms,
        pace_s=ns.pace,
        color=not ns.no_color and sys.stdout.isatty(),
    )
    key = ns.api_key or _first_key(settings.api_keys)
    try:
        with PrefitClient(ns.url or local_url(settings), key) as client:
            return replay(client, messages, tools, opts, sys.stdout)
    except PrefitError as exc:
        print(f"prefit demo: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


def _encodings(ns: argparse.Namespace, settings: Settings) -> int:
    from shared.commands.encodingfiles import (
        install_encodings,  # tiktoken's loader only when asked for
    )

    into = ns.into or settings.tiktoken_dir
    if into is None:
        print("prefit encodings: name a folder, or set PREFIT_TIKTOKEN_DIR", file=sys.stderr)
        return 2
    try:
        installed = install_encodings(into, ns.source, ns.names or None)
    except (PrefitError, OSError) as exc:  # OSError: a folder it cannot write to
        print(f"prefit encodings: {exc}", file=sys.stderr)
        return 1
    for enc in installed:
        print(f"{enc.path}  {enc.origin}  sha256 {enc.sha256}")
    return 0


def settings_problem(exc: ValueError) -> str:
    """One line naming the setting the environment got wrong, and why."""
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        field = str(first["loc"][0]) if first["loc"] else ""
        env = f" (PREFIT_{field.upper()})" if field in Settings.model_fields else ""
        return f"{where}{env}: {first['msg']}"
    cause = f": {exc.__cause__}" if exc.__cause__ is not None else ""
    return f"{exc}{cause}"


def local_url(settings: Settings) -> str:
    """The URL `prefit up` serves on with these settings (`PREFIT_HOST`, `PREFIT_PORT`)."""
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    return f"http://{host}:{settings.port}"


def _log_json(ns: argparse.Namespace, settings: Settings) -> bool | None:
    """The demo talks to a person: on a terminal its log lines are human ones, always."""
    if ns.command is _demo and sys.stdout.isatty():
        return False
    return settings.log_json


def _first_key(api_keys: str) -> str | None:
    """The key of the first `tenant:key` pair of PREFIT_API_KEYS, for a local demo."""
    first = api_keys.split(",")[0].strip()
    return first.split(":", 1)[1] if ":" in first else None


def _inspect(argv: list[str]) -> int:
    # Hook for `prefit inspect`: imported lazily so the other
    # commands never pay for its imports, and it parses its own options.
    module = importlib.import_module("shared.commands.inspect")
    return int(module.inspect_command(argv))


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value!r}") from None
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return number


if __name__ == "__main__":
    sys.exit(main())
