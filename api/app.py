"""The prefit HTTP API: `create_app(settings)` builds it; `app` is the process's instance.

Building the app reads settings and API keys but connects to nothing: Redis and the broker
are reached on the first request. With no API keys configured the service runs in open
mode (one tenant, `local`) and serves loopback only, unless `PREFIT_ALLOW_OPEN=true`: the
app itself refuses (403) requests that arrive on any other address, start-up fails when
`PREFIT_HOST` is not loopback, and `requires_loopback(settings)` tells the CLI.

Middleware, outermost first: the request logger (sees every answer), the open-mode guard,
the key before the body (api/auth.py, `KeyFirst`), the request deadline (api/deadline.py),
the body-size limit, `HEAD` served as `GET` (api/head.py).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import structlog
from fastapi import FastAPI
from fastapi_offline import FastAPIOffline
from starlette.concurrency import run_in_threadpool

from api import errors, routes
from api.auth import LOCAL_TENANT, OPEN_MODE_REFUSAL, KeyFirst, LoopbackOnly, is_loopback
from api.deadline import RequestDeadline
from api.deps import Services, get_tenant
from api.head import HeadAsGet
from api.limits import BodyLimit
from api.metrics import ShareCollector
from api.proxy import routes as proxy_routes
from api.proxy.services import ProxyServices
from api.requestlog import RequestLogger
from api.schedule import Enqueue
from shared.errors import ConfigError
from shared.logs import configure_logging, get_logger
from shared.service.watchdog import Watchdog, forget_heartbeat
from shared.settings import Settings, get_settings
from shared.store import Store

log = get_logger(__name__)

DESCRIPTION = (
    "Keeps long LLM conversations inside the model's input window. Summaries are computed "
    "ahead of time by workers; prepare never calls an LLM. See docs/api.md."
)


def requires_loopback(settings: Settings) -> bool:
    """True when no API key is configured and open mode was not opted into: the server must
    then bind to loopback only."""
    return settings.open_access and not settings.allow_open


def create_app(
    settings: Settings | None = None,
    *,
    store: Store | None = None,
    enqueue: Enqueue | None = None,
    configure_logs: bool = False,
) -> FastAPI:
    """The API on `settings` (the process's by default); `store`/`enqueue` replace the real ones.

    `configure_logs` sets up structlog (JSON lines) at start-up: the process's `app` does;
    apps made in tests leave the global logging configuration alone.
    """
    chosen = settings if settings is not None else get_settings()
    if configure_logs:  # the process's own app: this run has not beaten yet
        forget_heartbeat(chosen.heartbeat_file)
    services = Services.build(chosen, store=store, enqueue=enqueue)
    proxy = ProxyServices.build(chosen)
    share = proxy.clients.share
    services.metrics.watch_share(ShareCollector(share.counts, share.cap))
    owns_store = store is None

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if configure_logs and not structlog.is_configured():
            configure_logging(json=chosen.log_json, level=chosen.log_level)
        # a cluster node named without PREFIT_REDIS_CLUSTER: a clear error now, not MOVED later
        await run_in_threadpool(services.store.check_mode, chosen.redis_url)
        if services.keyring.open:
            guarded = not chosen.allow_open
            if guarded and not is_loopback(chosen.host):
                raise ConfigError(OPEN_MODE_REFUSAL.format(address=f"PREFIT_HOST={chosen.host}"))
            log.warning(
                "api.open_mode",
                tenant=LOCAL_TENANT,
                loopback_only=guarded,
                detail="no PREFIT_API_KEYS: one local tenant, "
                + (
                    "served on loopback only" if guarded else "served to anyone (PREFIT_ALLOW_OPEN)"
                ),
            )
        warm = getattr(services.enqueue, "warm", None)
        if callable(warm):  # Celery's imports take ~1 s: not on the first request's time
            threading.Thread(target=warm, name="prefit-warm-celery", daemon=True).start()
        log.info("api.started", tenants=len(services.keyring.tenants), models=sorted(chosen.models))
        watchdog = watch_event_loop(chosen)
        try:
            yield
        finally:
            if watchdog is not None:
                watchdog.stop()
            await services.aclose()
            await proxy.aclose()
            services.close(close_store=owns_store)

    # /docs and /redoc with Swagger UI's and ReDoc's files served by the app itself (under
    # /static-offline-docs), not from a CDN: the docs work on a host without internet
    app = FastAPIOffline(title="prefit", version="1", description=DESCRIPTION, lifespan=lifespan)
    app.state.services = services
    app.state.proxy = proxy
    errors.install(app)
    app.include_router(routes.router)
    app.include_router(proxy_routes.router)
    app.include_router(proxy_routes.fallback)  # last: it answers every route nobody serves
    app.add_middleware(HeadAsGet)  # innermost: the others see the request's own method
    app.add_middleware(BodyLimit, max_bytes=chosen.max_body_bytes)
    app.add_middleware(RequestDeadline, seconds=chosen.request_deadline_s)
    app.add_middleware(
        KeyFirst, keyring=services.keyring, routes=routes.router.routes, needs_tenant=get_tenant
    )
    if requires_loopback(chosen):
        app.add_middleware(LoopbackOnly)
    app.add_middleware(RequestLogger, observe=services.metrics.observe)  # outermost: sees 413s
    return app


def watch_event_loop(settings: Settings) -> Watchdog | None:
    """With a heartbeat file (the image names one): a watchdog on the running event loop, so
    an API process whose loop is blocked for `watchdog_s` exits (shared/service/watchdog.py)."""
    if settings.heartbeat_file is None:
        return None
    watchdog = Watchdog(settings.watchdog_s, settings.heartbeat_file)
    watchdog.watch("event_loop", asyncio.get_running_loop().call_soon_threadsafe)
    watchdog.start()
    return watchdog


app = create_app(configure_logs=True)
