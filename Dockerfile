# syntax=docker/dockerfile:1.7
# The one image of prefit: the API (default command) and the summary worker (`prefit worker`).
#
# tiktoken's encodings are not downloaded at run time (no internet in production either): they
# come from a second build context named `tiktoken` (../shared/tiktoken beside the repository).
#   docker compose build                                   # compose passes the context
#   docker build --build-context tiktoken=../shared/tiktoken -t prefit .

# The uv that wrote uv.lock (an older uv may not read its lock format).
ARG UV_VERSION=0.13
FROM ghcr.io/astral-sh/uv:${UV_VERSION} AS uv

FROM python:3.11-slim

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

# The encodings, checked against the sums tiktoken itself verifies.
COPY --from=tiktoken *.tiktoken SHA256SUMS ${TIKTOKEN_DIR}/
RUN cd "${TIKTOKEN_DIR}" && sha256sum -c SHA256SUMS

# Never run as root: a fixed uid so volume permissions are predictable.
RUN useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin prefit
USER prefit:prefit

# The API listens on every interface of the container, so it needs API keys:
#   docker run -p 8000:8000 -e PREFIT_API_KEYS=tenant:secret -e REDIS_URL=redis://... prefit
# Without PREFIT_API_KEYS the app refuses to start (PREFIT_HOST says where it listens): open
# mode would serve one tenant to anyone who can reach the port. PREFIT_ALLOW_OPEN=true says
# that is intended (a private network); the healthcheck's loopback requests always pass.
ENV PREFIT_HOST=0.0.0.0
EXPOSE 8000
CMD ["uvicorn", "api.app:app", "--host", "0.0.0.0", "--port", "8000", "--no-access-log"]
