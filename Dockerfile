# The one image of prefit: the API (default command) and the summary worker (`prefit worker`);
# the `flower` target adds Celery Flower to watch the workers.
#
# No `# syntax=` line: it would pull a frontend image from Docker Hub on every build; the
# BuildKit of Docker 23+ has every feature used here (cache and bind mounts) built in.
#
# It builds from a fresh clone: tiktoken downloads its encodings during the build. Air-gapped,
# hand it a folder holding <name>.tiktoken files (../shared/tiktoken beside the repository, or
# a TIKTOKEN_CACHE_DIR) as the optional build context `tiktoken` (docker-compose.yml does):
#   docker build -t prefit .
#   docker build --build-context tiktoken=../shared/tiktoken -t prefit .
# Either way `prefit encodings` checks each file against the SHA-256 tiktoken expects.
#
# Two stages: the builder holds uv, the lock file and the build caches, and makes /app/.venv with
# prefit installed in it (not editable: the venv is the whole program); the runtime image is the
# same Python base with only that venv and the encodings, run by a fixed uid:gid.

# The base, by tag and by digest (the digest wins; the tag says what it is). A registry mirror
# or a local build of the same Python: --build-arg PYTHON_IMAGE=...
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d
# The uv that wrote uv.lock, from the package index (which the build needs anyway): no image of
# its own to pull.
ARG UV_VERSION=0.13.9

# Empty: `--build-context tiktoken=DIR` replaces this stage with the folder DIR.
FROM scratch AS tiktoken

FROM ${PYTHON_IMAGE} AS builder
ARG UV_VERSION
ARG TIKTOKEN_DIR=/opt/prefit/tiktoken
ENV PYTHONDONTWRITEBYTECODE=1 \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    UV_PROJECT_ENVIRONMENT=/app/.venv \
    PREFIT_TIKTOKEN_DIR=${TIKTOKEN_DIR}
RUN --mount=type=cache,target=/root/.cache/pip \
    python -m venv /opt/uv && /opt/uv/bin/pip install --disable-pip-version-check "uv==${UV_VERSION}"
WORKDIR /app

# Dependencies first, so this layer is rebuilt only when the lock file changes.
COPY pyproject.toml uv.lock README.md ./
RUN --mount=type=cache,target=/root/.cache/uv \
    /opt/uv/bin/uv sync --frozen --no-dev --no-install-project

COPY shared ./shared
COPY api ./api
COPY worker ./worker
# --reinstall-package: uv keys its cached wheel of a local project on pyproject.toml alone, so
# with the cache mount a rebuild after a code change installed the old code (seen on Docker).
RUN --mount=type=cache,target=/root/.cache/uv \
    /opt/uv/bin/uv sync --frozen --no-dev --no-editable --reinstall-package prefit

# The encodings into PREFIT_TIKTOKEN_DIR: the files of the `tiktoken` context when it has them,
# else downloaded by tiktoken (its cache outlives the build, so a rebuild does not fetch again).
# A file whose SHA-256 is not the one tiktoken expects fails the build.
RUN --mount=type=bind,from=tiktoken,target=/mnt/tiktoken \
    --mount=type=cache,target=/var/cache/tiktoken \
    TIKTOKEN_CACHE_DIR=/var/cache/tiktoken /app/.venv/bin/prefit encodings --from /mnt/tiktoken

# Celery Flower (compose profile `flower`): the `flower` group of uv.lock, locked like the rest,
# in a venv of its own, so the API and worker image carries none of it.
FROM builder AS flower-builder
RUN --mount=type=cache,target=/root/.cache/uv \
    /opt/uv/bin/uv sync --frozen --no-dev --no-editable --group flower --reinstall-package prefit

FROM ${PYTHON_IMAGE} AS runtime
ARG TIKTOKEN_DIR=/opt/prefit/tiktoken
# PREFIT_HEARTBEAT_FILE turns the watchdog on (shared/service/watchdog.py): the container's
# liveness check reads it (docker-compose.yml, configs: alive).
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/app/.venv/bin:$PATH \
    PREFIT_TIKTOKEN_DIR=${TIKTOKEN_DIR} \
    PREFIT_HEARTBEAT_FILE=/tmp/prefit.alive
# Never root: a fixed uid AND gid, so volume and secret-file permissions are predictable.
RUN groupadd --system --gid 10001 prefit \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin prefit
WORKDIR /app
COPY --from=builder ${TIKTOKEN_DIR} ${TIKTOKEN_DIR}
USER 10001:10001

FROM runtime AS flower
COPY --from=flower-builder /app/.venv /app/.venv
EXPOSE 5555
CMD ["celery", "-A", "worker.app", "flower", "--port=5555"]

# The default target (last stage): the API, or the worker with `prefit worker`.
FROM runtime AS app
COPY --from=builder /app/.venv /app/.venv
# The API listens on every interface of the container, so it needs API keys:
#   docker run -p 8000:8000 -e PREFIT_API_KEYS=tenant:secret -e REDIS_URL=redis://... prefit
# Without PREFIT_API_KEYS the app refuses to start (PREFIT_HOST says where it listens): open
# mode would serve one tenant to anyone who can reach the port. PREFIT_ALLOW_OPEN=true says
# that is intended (a private network); the healthcheck's loopback requests always pass.
ENV PREFIT_HOST=0.0.0.0
EXPOSE 8000
# `prefit api` is uvicorn with prefit's log config: its start lines are JSON like the rest,
# and its protocol closes connections that do not finish a request (api/connections.py).
CMD ["prefit", "api", "--host", "0.0.0.0", "--port", "8000"]
