"""The image, read statically (CI has no Docker engine): a builder stage and a runtime stage,
pinned bases and uv, the optional `tiktoken` build context, the encodings checked at build time,
a fixed non-root uid:gid, Flower kept out of the app."""

from __future__ import annotations

import re
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


def global_args() -> dict[str, str]:
    """The ARGs declared before the first FROM, with their defaults."""
    found: dict[str, str] = {}
    for line in DOCKERFILE.read_text().splitlines():
        if line.upper().startswith("FROM "):
            break
        if line.upper().startswith("ARG "):
            name, _, default = line[4:].strip().partition("=")
            found[name] = default
    return found


def effective(stage: str, word: str) -> list[str]:
    """`word`'s arguments in `stage`, its own after those of the stages it is built FROM."""
    all_stages = stages()
    chain: list[Stage] = []
    name: str | None = stage
    while name in all_stages:
        chain.insert(0, all_stages[name])
        name = all_stages[name].base
    return [args for s in chain for args in s.args(word)]


RUNTIME_STAGES = ("runtime", "flower", "app")


def test_stages_and_the_default_target() -> None:
    """An empty `tiktoken`, the builders, one runtime base, flower, and `app` last (the
    default); builder and runtime start from the same Python image."""
    found = stages()
    assert list(found) == ["tiktoken", "builder", "flower-builder", "runtime", "flower", "app"]
    assert found["tiktoken"].base == "scratch" and found["tiktoken"].steps == []
    assert found["builder"].base == found["runtime"].base == "${PYTHON_IMAGE}"
    assert found["flower-builder"].base == "builder"
    assert found["flower"].base == found["app"].base == "runtime"


def test_no_syntax_directive_pulls_a_frontend() -> None:
    """No `# syntax=` line: it would pull docker/dockerfile from Docker Hub on every build."""
    first = DOCKERFILE.read_text().splitlines()[0]
    assert not re.match(r"#\s*syntax\s*=", first, re.IGNORECASE)
    assert "docker/dockerfile:" not in DOCKERFILE.read_text()


def test_the_base_image_and_uv_are_pinned() -> None:
    """The Python base by tag and sha256 digest; uv by exact version, installed in the builder
    only (no image of its own to pull)."""
    args = global_args()
    assert re.fullmatch(
        r"python:3\.11\.\d+-slim-bookworm@sha256:[0-9a-f]{64}", args["PYTHON_IMAGE"]
    ), args["PYTHON_IMAGE"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", args["UV_VERSION"]), args["UV_VERSION"]
    builder = " ".join(stages()["builder"].args("RUN"))
    assert '"uv==${UV_VERSION}"' in builder


def test_uv_and_the_lock_stay_in_the_builder() -> None:
    """The runtime stages copy the venv (and the encodings) from a builder, nothing else: no
    uv, no lock file, no source tree, no build caches."""
    for name in RUNTIME_STAGES:
        stage = stages()[name]
        assert not any("uv" in shlex.split(r) for r in stage.args("RUN")), name
        for copy in stage.args("COPY"):
            source, target = shlex.split(copy)[-2:]
            assert copy.startswith(("--from=builder", "--from=flower-builder")), copy
            assert source == target and source in {"/app/.venv", "${TIKTOKEN_DIR}"}, copy
    venvs = {c.split()[0] for n in ("app", "flower") for c in stages()[n].args("COPY")}
    assert venvs == {"--from=builder", "--from=flower-builder"}
    builder_copies = " ".join(stages()["builder"].args("COPY"))
    assert "uv.lock" in builder_copies


def test_the_tiktoken_context_is_optional() -> None:
    """The files are read through a bind mount of the `tiktoken` stage (empty unless the build
    context replaces it), never copied from it: a build without the context still works."""
    builder = stages()["builder"]
    assert not any(c.startswith("--from=tiktoken") for c in builder.args("COPY"))
    [step] = [r for r in builder.args("RUN") if "--mount=type=bind,from=tiktoken" in r]
    mount = next(t for t in shlex.split(step) if t.startswith("--mount=type=bind,from=tiktoken"))
    target = dict(kv.split("=", 1) for kv in mount.removeprefix("--mount=").split(","))["target"]
    assert f"prefit encodings --from {target}" in step


def test_the_encodings_step_is_the_checked_command() -> None:
    """The build runs `prefit encodings` (SHA-256 checked, into PREFIT_TIKTOKEN_DIR) with
    tiktoken's cache on a build cache mount; its options parse with the real CLI; the runtime
    reads the same directory."""
    [step] = [r for r in stages()["builder"].args("RUN") if "prefit encodings" in r]
    words = shlex.split(step)
    assert any(w.startswith("--mount=type=cache,target=/var/cache/tiktoken") for w in words)
    assert "TIKTOKEN_CACHE_DIR=/var/cache/tiktoken" in words
    argv = words[words.index("/app/.venv/bin/prefit") + 1 :]
    ns = cli.build_parser().parse_args(argv)
    assert ns.command is cli._encodings and ns.into is None  # None: PREFIT_TIKTOKEN_DIR
    for stage in ("builder", "app"):
        assert "PREFIT_TIKTOKEN_DIR=${TIKTOKEN_DIR}" in " ".join(effective(stage, "ENV"))


@pytest.mark.parametrize("stage", ["app", "flower"])
def test_every_runnable_stage_runs_as_the_fixed_uid_and_gid(stage: str) -> None:
    """The user in force at the end of the stage is 10001:10001, created with that uid AND gid
    (so volume and secret-file permissions are predictable)."""
    users = effective(stage, "USER")
    assert users and users[-1] == "10001:10001"
    created = " ".join(effective(stage, "RUN"))
    assert "groupadd --system --gid 10001 prefit" in created
    assert "useradd --system --uid 10001 --gid 10001" in created


def test_the_app_builds_from_the_lock_without_dev_or_flower() -> None:
    """`uv sync --frozen --no-dev`, not editable (the venv is the whole program); Flower's
    group only in the flower builder."""
    builder = " ".join(stages()["builder"].args("RUN"))
    assert "uv sync --frozen --no-dev --no-editable" in builder
    assert "--group flower" not in builder
    # uv caches a local project's wheel by its pyproject.toml: a rebuild must not reuse it
    for stage in ("builder", "flower-builder"):
        [sync] = [r for r in stages()[stage].args("RUN") if "--no-editable" in r]
        assert "--reinstall-package prefit" in sync, stage
    flower_runs = " ".join(stages()["flower-builder"].args("RUN"))
    assert "uv sync --frozen --no-dev --no-editable --group flower" in flower_runs


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


def test_dockerignore_keeps_local_state_and_secrets_out_of_the_image() -> None:
    """The virtualenv, git history, caches and compose's secret files never enter the build
    context."""
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".venv", ".git", "**/__pycache__", "secrets"} <= ignored


def test_the_image_declares_where_the_api_listens() -> None:
    """PREFIT_HOST matches the uvicorn bind, so open mode is refused at start-up in the image."""
    app = stages()["app"]
    assert "PREFIT_HOST=0.0.0.0" in " ".join(app.args("ENV"))
    [cmd] = app.args("CMD")
    assert '"--host", "0.0.0.0"' in cmd
