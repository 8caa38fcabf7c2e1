"""Container set-up: compose services, healthchecks, a Redis that never evicts, non-root image."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"


def _compose_cli_missing() -> str | None:
    """Why `docker compose` cannot run here, or None when it can."""
    if shutil.which("docker") is None:
        return "the docker CLI is not installed"
    try:
        probe = subprocess.run(
            ["docker", "compose", "version"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`docker compose version` failed: {exc}"
    if probe.returncode != 0:
        return "the docker compose plugin is not installed (`docker compose version` failed)"
    return None


def _redis_args(redis: dict[str, Any]) -> list[str]:
    command = redis["command"]
    return command.split() if isinstance(command, str) else [str(a) for a in command]


def _check_services(services: dict[str, Any]) -> None:
    assert {"redis", "api", "worker"} <= set(services)
    args = _redis_args(services["redis"])
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
    assert args[args.index("--appendonly") + 1] == "yes"
    assert "redis-cli" in services["redis"]["healthcheck"]["test"]
    assert "ping" in services["redis"]["healthcheck"]["test"]
    api_probe = " ".join(services["api"]["healthcheck"]["test"])
    assert "urllib" in api_probe and "/healthz" in api_probe
    assert "replicas" in services["api"]["deploy"]
    worker = services["worker"]
    assert "container_name" not in worker and "ports" not in worker  # --scale worker=N works
    for name in ("api", "worker"):
        env = services[name]["environment"]
        assert env["REDIS_URL"].startswith("redis://redis:")
        assert services[name]["depends_on"]["redis"]["condition"] == "service_healthy"
        assert "tiktoken" in services[name]["build"]["additional_contexts"]


def test_compose_file_declares_the_service_set() -> None:
    """The compose file as written: services, healthchecks, noeviction, scalable workers."""
    yaml = pytest.importorskip("yaml", reason="PyYAML is needed to read the compose file")
    _check_services(yaml.safe_load(COMPOSE.read_text())["services"])


def test_docker_compose_config_accepts_the_file() -> None:
    """`docker compose config` validates and normalizes the file with the same properties."""
    missing = _compose_cli_missing()
    if missing:
        pytest.skip(f"{missing}: compose validation skipped")
    env = {**os.environ, "PREFIT_API_KEYS": "tenant:key"}
    run = subprocess.run(
        ["docker", "compose", "-f", str(COMPOSE), "config", "--format", "json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr
    config = json.loads(run.stdout)
    _check_services(config["services"])
    assert config["services"]["api"]["deploy"]["replicas"] == 2


def test_docker_compose_config_requires_api_keys() -> None:
    """Without PREFIT_API_KEYS the stack refuses to start rather than run open."""
    missing = _compose_cli_missing()
    if missing:
        pytest.skip(f"{missing}: compose validation skipped")
    env = {k: v for k, v in os.environ.items() if k != "PREFIT_API_KEYS"}
    run = subprocess.run(
        ["docker", "compose", "-f", str(COMPOSE), "config"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=ROOT,
    )
    assert run.returncode != 0
    assert "PREFIT_API_KEYS" in run.stderr


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_runs_as_a_non_root_user() -> None:
    """The final USER is neither root nor uid 0."""
    users = [args for word, args in _instructions() if word == "USER"]
    assert users, "the Dockerfile never switches user"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")


def test_dockerfile_builds_from_the_lock_with_offline_encodings() -> None:
    """python:3.11-slim, uv sync --frozen --no-dev, tiktoken files from a named context."""
    steps = _instructions()
    froms = [args for word, args in steps if word == "FROM"]
    assert froms[-1].startswith("python:3.11-slim")
    runs = " ".join(args for word, args in steps if word == "RUN")
    assert "uv sync --frozen --no-dev" in runs
    copies = [args for word, args in steps if word == "COPY"]
    assert any(c.startswith("--from=tiktoken") for c in copies)
    envs = " ".join(args for word, args in steps if word == "ENV")
    assert "PREFIT_TIKTOKEN_DIR=" in envs


def test_dockerignore_keeps_local_state_out_of_the_image() -> None:
    """The virtualenv, git history and caches never enter the build context."""
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".venv", ".git", "**/__pycache__"} <= ignored


def test_the_image_declares_where_the_api_listens() -> None:
    """PREFIT_HOST matches the uvicorn bind, so open mode is refused at start-up in the image."""
    steps = _instructions()
    envs = " ".join(args for word, args in steps if word == "ENV")
    assert "PREFIT_HOST=0.0.0.0" in envs
    [cmd] = [args for word, args in steps if word == "CMD"]
    assert '"--host", "0.0.0.0"' in cmd
