"""The image, read statically (no Docker engine here): stages, the optional `tiktoken` build
context, the encodings checked at build time, a non-root user, Flower kept out of the app."""

from __future__ import annotations

import shlex
import tomllib
from dataclasses import dataclass, field

import pytest

from shared.commands import cli
from tests.conftest import ROOT

DOCKERFILE = ROOT / "Dockerfile"


@dataclass
class Stage:
    """One FROM ... AS name block: its base and its instructions."""

    name: str
    base: str
    steps: list[tuple[str, str]] = field(default_factory=list)

    def args(self, word: str) -> list[str]:
        return [args for w, args in self.steps if w == word]


def stages() -> dict[str, Stage]:
    """The Dockerfile's stages by name, in order (continuation lines joined)."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    out: dict[str, Stage] = {}
    current: Stage | None = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        word, rest = word.upper(), rest.strip()
        if word == "FROM":
            base, _, name = rest.partition(" AS ")
            current = Stage(name.strip() or f"stage{len(out)}", base.strip())
            out[current.name] = current
        elif current is not None:
            current.steps.append((word, rest))
    return out


def effective(stage: str, word: str) -> list[str]:
    """`word`'s arguments in `stage`, its own after those of the stages it is built FROM."""
    all_stages = stages()
    chain: list[Stage] = []
    name: str | None = stage
    while name in all_stages:
        chain.insert(0, all_stages[name])
        name = all_stages[name].base
    return [args for s in chain for args in s.args(word)]


def test_stages_and_the_default_target() -> None:
    """uv, an empty `tiktoken`, base on python:3.11-slim, flower, and `app` last (the default)."""
    found = stages()
    assert list(found) == ["uv", "tiktoken", "base", "flower", "app"]
    assert found["tiktoken"].base == "scratch" and found["tiktoken"].steps == []
    assert found["base"].base.startswith("python:3.11-slim")
    assert found["flower"].base == found["app"].base == "base"


def test_the_tiktoken_context_is_optional() -> None:
    """The files are read through a bind mount of the `tiktoken` stage (empty unless the build
    context replaces it), never copied from it: a build without the context still works."""
    base = stages()["base"]
    assert not any(c.startswith("--from=tiktoken") for c in base.args("COPY"))
    [step] = [r for r in base.args("RUN") if "--mount=type=bind,from=tiktoken" in r]
    mount = next(t for t in shlex.split(step) if t.startswith("--mount=type=bind,from=tiktoken"))
    target = dict(kv.split("=", 1) for kv in mount.removeprefix("--mount=").split(","))["target"]
    assert f"prefit encodings --from {target}" in step


def test_the_encodings_step_is_the_checked_command() -> None:
    """The build runs `prefit encodings` (SHA-256 checked, into PREFIT_TIKTOKEN_DIR) with
    tiktoken's cache on a build cache mount; its options parse with the real CLI."""
    [step] = [r for r in stages()["base"].args("RUN") if "prefit encodings" in r]
    words = shlex.split(step)
    assert any(w.startswith("--mount=type=cache,target=/var/cache/tiktoken") for w in words)
    assert "TIKTOKEN_CACHE_DIR=/var/cache/tiktoken" in words
    argv = words[words.index("prefit") + 1 :]
    ns = cli.build_parser().parse_args(argv)
    assert ns.command is cli._encodings and ns.into is None  # None: PREFIT_TIKTOKEN_DIR
    assert "PREFIT_TIKTOKEN_DIR=${TIKTOKEN_DIR}" in " ".join(effective("app", "ENV"))


@pytest.mark.parametrize("stage", ["app", "flower"])
def test_every_runnable_stage_runs_as_a_non_root_user(stage: str) -> None:
    """The user in force at the end of the stage (its own or inherited) is neither root nor 0."""
    users = effective(stage, "USER")
    assert users, f"{stage} never switches user"
    assert users[-1].split(":")[0] not in ("root", "0")


def test_the_app_builds_from_the_lock_without_dev_or_flower() -> None:
    """`uv sync --frozen --no-dev`; Flower's group only in the flower stage."""
    app_runs = " ".join(effective("app", "RUN"))
    assert "uv sync --frozen --no-dev" in app_runs
    assert "--group flower" not in app_runs
    flower_runs = " ".join(stages()["flower"].args("RUN"))
    assert "uv sync --frozen --no-dev --group flower" in flower_runs


def test_flower_is_a_locked_group_not_an_app_dependency() -> None:
    """flower is in the `flower` dependency group (locked in uv.lock), not in the app's deps."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert not any(d.startswith("flower") for d in project["project"]["dependencies"])
    assert any(d.startswith("flower") for d in project["dependency-groups"]["flower"])
    assert 'name = "flower"' in (ROOT / "uv.lock").read_text()


def test_the_flower_stage_watches_the_worker_app() -> None:
    """Flower loads the same Celery app (so the same broker and queue) on port 5555."""
    [cmd] = stages()["flower"].args("CMD")
    assert cmd == '["celery", "-A", "worker.app", "flower", "--port=5555"]'
    assert (ROOT / "worker" / "app.py").is_file()


def test_dockerignore_keeps_local_state_out_of_the_image() -> None:
    """The virtualenv, git history and caches never enter the build context."""
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".venv", ".git", "**/__pycache__"} <= ignored


def test_the_image_declares_where_the_api_listens() -> None:
    """PREFIT_HOST matches the uvicorn bind, so open mode is refused at start-up in the image."""
    app = stages()["app"]
    assert "PREFIT_HOST=0.0.0.0" in " ".join(app.args("ENV"))
    [cmd] = app.args("CMD")
    assert '"--host", "0.0.0.0"' in cmd
