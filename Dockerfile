# syntax=docker/dockerfile:1.7
# The one image of prefit: the API (default command) and the summary worker (`prefit worker`);
# the `flower` target adds Celery Flower to watch the workers.
#
# It builds from a fresh clone: tiktoken downloads its encodings during the build. Air-gapped,
# hand it a folder holding <name>.tiktoken files (../shared/tiktoken beside the repository, or
# a TIKTOKEN_CACHE_DIR) as the optional build context `tiktoken`:
#   docker build -t prefit .
#   docker build --build-context tiktoken=../shared/tiktoken -t prefit .
# Either way `prefit encodings` checks each file against the SHA-256 tiktoken expects.

# The uv that wrote uv.lock (an older uv may not read its lock format).
ARG UV_VERSION=0.13
FROM ghcr.io/astral-sh/uv:${UV_VERSION} AS uv

# Empty: `--build-context tiktoken=DIR` replaces this stage with the folder DIR.
FROM scratch AS tiktoken

FROM python:3.11-slim AS base

ARG TIKTOKEN_DIR=/opt/prefit/tiktoken
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    PATH=/app/.venv/bin:$PATH \
    PREFIT_TIKTOKEN_DIR=${TIKTOKEN_DIR}

COPY --from=uv /uv /usr/local/bin/uv
WORKDIR /app

# Dependencies first, so this layer is rebuilt only when the lock file changes.
COPY pyproject.toml uv.lock README.md ./
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --no-install-project

COPY shared ./shared
COPY api ./api
COPY worker ./worker
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev

# The encodings into PREFIT_TIKTOKEN_DIR: the files of the `tiktoken` context when it has them,
# else downloaded by tiktoken (its cache outlives the build, so a rebuild does not fetch again).
# A file whose SHA-256 is not the one tiktoken expects fails the build.
RUN --mount=type=bind,from=tiktoken,target=/mnt/tiktoken \
    --mount=type=cache,target=/var/cache/tiktoken \
    TIKTOKEN_CACHE_DIR=/var/cache/tiktoken prefit encodings --from /mnt/tiktoken

# Never run as root: a fixed uid so volume permissions are predictable.
RUN useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin prefit
USER prefit:prefit

# Celery Flower (compose profile `flower`): the `flower` group of uv.lock, locked like the rest,
# installed here only, so the API and worker image carries none of it.
FROM base AS flower
USER root
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --group flower
USER prefit:prefit
EXPOSE 5555
CMD ["celery", "-A", "worker.app", "flower", "--port=5555"]

# The default target (last stage): the API, or the worker with `prefit worker`.
FROM base AS app
# The API listens on every interface of the container, so it needs API keys:
#   docker run -p 8000:8000 -e PREFIT_API_KEYS=tenant:secret -e REDIS_URL=redis://... prefit
# Without PREFIT_API_KEYS the app refuses to start (PREFIT_HOST says where it listens): open
# mode would serve one tenant to anyone who can reach the port. PREFIT_ALLOW_OPEN=true says
# that is intended (a private network); the healthcheck's loopback requests always pass.
ENV PREFIT_HOST=0.0.0.0
EXPOSE 8000
CMD ["uvicorn", "api.app:app", "--host", "0.0.0.0", "--port", "8000", "--no-access-log"]
