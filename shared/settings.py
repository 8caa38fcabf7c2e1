"""The one place configuration is read: `PREFIT_*` variables plus the conventional `REDIS_URL`."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal
from urllib.parse import quote, urlsplit, urlunsplit

from pydantic import AliasChoices, BaseModel, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class ModelWindow(BaseModel):
    """A model's input window, as the operator states it."""

    max_input_tokens: int = Field(gt=0)
    reserve_output: int | None = Field(default=None, ge=0)


class Price(BaseModel):
    """USD per million tokens."""

    input: float = Field(ge=0)
    output: float = Field(ge=0)


class Settings(BaseSettings):
    """Every knob of the service; read once per process."""

    model_config = SettingsConfigDict(env_prefix="PREFIT_", extra="ignore")

    redis_url: str = Field(
        default="redis://127.0.0.1:6379/0",
        validation_alias=AliasChoices("REDIS_URL", "PREFIT_REDIS_URL"),
    )
    broker_url: str | None = None  # defaults to redis_url (never to a cluster: see below)
    # RabbitMQ: declare the summary queue with x-consumer-timeout (visibility_timeout_s). Honoured
    # by 3.11.15 to 4.2, ignored before; 4.3.2+ refuse it on classic queues: set false there
    rabbitmq_consumer_timeout_arg: bool = True
    # REDIS_URL names a node of a Redis Cluster: the store uses redis-py's cluster client
    # (docs/scaling.md); Celery's Redis transport cannot use a cluster, so the broker is named
    redis_cluster: bool = False

    # summarizer provider; none configured means the offline extractive summarizer
    summarizer_url: str | None = None
    summarizer_api_key: SecretStr | None = None
    summarizer_model: str | None = None
    summarizer_protocol: Literal["openai", "anthropic"] = "openai"
    summarizer_timeout_s: float = 60.0
    summarizer_connect_timeout_s: float = 5.0
    summarizer_max_attempts: int = 4
    summarizer_max_inline_wait_s: float = 10.0  # longer waits become task retries
    prices: dict[str, Price] = Field(default_factory=dict)

    # policy defaults (the reference's)
    models: dict[str, ModelWindow] = Field(default_factory=dict)
    reserve_output: int = 4096
    trigger: float = 0.85
    target: float = 0.6
    keep_recent: int = 3
    precompute_at: float = 0.1  # start summarizing at (trigger - precompute_at) x budget
    chunk_tokens: int = 24000
    max_summary_tokens: int = 1200
    index_share: float = Field(default=0.1, ge=0.0, le=0.5)  # the artifact index's share
    keep_tokens_ratio: float = 0.4

    # store
    retention_s: int = 7 * 24 * 3600
    redis_socket_timeout_s: float = 2.0
    redis_connect_timeout_s: float = 1.0
    dead_letters_max: int = Field(default=1000, ge=1)  # dead letters kept per tenant
    # replicas that must have a write before it is acknowledged; None: 1 where the primary
    # has a healthy replica, else none (shared/store/replication.py, docs/scaling.md)
    redis_min_replicas_ack: int | None = Field(default=None, ge=0)
    redis_max_connections: int = 512
    # a job's lease on its conversation, renewed every ttl/3 while it runs: a worker that dies
    # mid-job gives it up (and the reaper sends the job again) within this (docs/scaling.md)
    lease_ttl_s: float = 5.0

    # calibration per tenant and model (shared/counting/calibration.py)
    calibration_settle_after: int = Field(default=100, ge=1)
    calibration_tolerance: float = Field(default=1.5, gt=1.0)
    calibration_retention_s: int = Field(default=30 * 24 * 3600, gt=0)

    # worker
    summary_queue: str = "summaries"
    worker_concurrency: int = 200
    visibility_timeout_s: int = 3600
    max_redeliveries: int = 5
    # worker faults (docs/workers.md): a job lost with its worker is re-enqueued once its lease
    # has expired, by the reaper every worker runs; a provider failing permanently is paused,
    # and a dead-lettered range blocked, for a backoff doubling from the first to the max
    reaper_interval_s: float = Field(default=1.0, gt=0)
    breaker_backoff_s: float = Field(default=60.0, gt=0)
    breaker_backoff_max_s: float = Field(default=3600.0, gt=0)

    # api
    api_keys: str = ""  # "tenant:key,tenant2:key2"
    host: str = "127.0.0.1"
    port: int = 8000
    # well above a 2,000-turn coding-agent session resent whole (~75 MB; docs/api.md)
    max_body_bytes: int = 128 * 1024 * 1024
    max_messages: int = 20_000
    # memory per API process for the proxy's resent request bodies (their bytes and parsed
    # messages) and, as much again at most, their Anthropic conversions; a tenant holds at
    # most half; 0: off (docs/benchmarks.md 4b: ~4.6 MiB per 1.9 MB body, 1 MiB more converted)
    proxy_body_cache_mb: int = Field(default=256, ge=0)
    max_string_chars: int = 4 * 1024 * 1024
    default_wait_ms: int = 0
    request_deadline_s: float = Field(default=2.0, gt=0, le=60)  # every answer within this
    # the API server's connections (api/connections.py): a request's headers complete within
    # this of the connection's start or its last answer; at most this between two reads of a
    # body; a keep-alive connection idle this long is closed (uvicorn's --timeout-keep-alive)
    server_header_timeout_s: float = Field(default=10.0, gt=0)
    server_body_timeout_s: float = Field(default=30.0, gt=0)
    server_idle_timeout_s: int = Field(default=5, gt=0)
    allow_open: bool = False  # open mode (no API keys) on a non-loopback address
    metrics_token: SecretStr | None = None  # Bearer token for per-tenant series on /metrics
    # several API processes on one port: prometheus_client's own variable names the directory
    # where each keeps its metrics, and /metrics sums them (`prefit up --api-workers N` sets it)
    metrics_dir: Path | None = Field(
        default=None, validation_alias=AliasChoices("PROMETHEUS_MULTIPROC_DIR")
    )

    # drop-in proxy (api/proxy): the providers it forwards to, with the deployment's keys
    openai_base_url: str = "https://api.openai.com/v1"
    openai_api_key: SecretStr | None = None
    anthropic_base_url: str = "https://api.anthropic.com"
    anthropic_api_key: SecretStr | None = None
    # Gemini API (api/proxy/dialects/gemini.py): its root, without a version (paths carry it)
    gemini_base_url: str = "https://generativelanguage.googleapis.com"
    gemini_api_key: SecretStr | None = None
    # the key sealing the compaction items prefit answers /v1/responses/compact with
    # (api/proxy/compaction.py); unset, one derived from the keys above and PREFIT_API_KEYS
    compaction_secret: SecretStr | None = None
    # opt-in: forward each client's own provider key (see docs/api.md, "Provider keys")
    proxy_forward_client_keys: bool = False
    upstream_connect_timeout_s: float = 5.0
    upstream_read_timeout_s: float = 600.0  # between two bytes of an answer, not in total
    upstream_write_timeout_s: float = 60.0
    upstream_pool_timeout_s: float = 30.0
    upstream_max_connections: int = 200
    upstream_keepalive_s: float = 60.0
    # each tenant's share of an upstream, per API process: at most this many of its requests
    # at once (429 past it); each tenant has a pool of its own (upstream_max_connections)
    upstream_tenant_max_requests: int = Field(default=64, gt=0)
    # the ids of provider-stored responses each tenant created through the proxy (only its
    # own are reachable by id), newest kept, for the provider's retention (30 days)
    proxy_owned_ids_max: int = Field(default=1_000_000, gt=0)

    # secrets as files (docker-compose.yml's `secrets`): a folder of files, each named after its
    # setting in lower case (prefit_api_keys, prefit_redis_password, ...); a variable wins over
    # a file. Read by `get_settings` only: a folder of secrets is a deployment's, not a test's
    secrets_dir: Path | None = None
    # a password for REDIS_URL (and a Redis broker URL) that holds none, e.g. from a secret file
    redis_password: SecretStr | None = None
    # a password for an amqp:// PREFIT_BROKER_URL that holds none (a Redis broker takes
    # redis_password: the same Redis unless its URL says otherwise)
    rabbitmq_password: SecretStr | None = None

    # misc
    tiktoken_dir: Path | None = None
    # tiktoken's own convention: a folder of files named by the SHA-1 of their download URL
    tiktoken_cache_dir: Path | None = Field(
        default=None, validation_alias=AliasChoices("TIKTOKEN_CACHE_DIR")
    )
    log_json: bool | None = None  # None: JSON when stderr is not a TTY
    log_level: str = "INFO"

    # operations (docs/deploy.md): an API or worker process whose loops stop this long exits
    # (shared/service/watchdog.py); on only with a heartbeat file, which the image names and
    # the container's healthcheck reads (a process stopped whole is killed from there)
    watchdog_s: float = Field(default=30.0, gt=0)
    heartbeat_file: Path | None = None
    # a worker's /metrics on this port (none: no endpoint); the image's compose sets 9100
    worker_metrics_port: int | None = Field(default=None, ge=1, le=65535)
    # how a process names itself on the dashboards (the `replica` label); unset: the
    # container's name, from Docker's DNS (shared/service/replica.py), else none
    replica_name: str | None = None

    @model_validator(mode="after")
    def _broker_is_not_the_cluster(self) -> Settings:
        if self.redis_cluster and not self.broker_url:
            raise ValueError(
                "PREFIT_REDIS_CLUSTER=true needs PREFIT_BROKER_URL: Celery's Redis transport "
                "cannot use a Redis Cluster, so name a standalone Redis or RabbitMQ as the broker"
            )
        return self

    @model_validator(mode="after")
    def _passwords_into_urls(self) -> Settings:
        redis_password = _plain(self.redis_password)
        if redis_password:
            self.redis_url = with_password(self.redis_url, redis_password)
        if self.broker_url:
            redis = urlsplit(self.broker_url).scheme in REDIS_SCHEMES
            password = redis_password if redis else _plain(self.rabbitmq_password)
            if password:
                self.broker_url = with_password(self.broker_url, password)
        return self

    @property
    def open_access(self) -> bool:
        """No API key configured: one local tenant, and the API must bind to loopback only."""
        return not any(part.strip() for part in self.api_keys.split(","))

    @property
    def broker(self) -> str:
        return self.broker_url or self.redis_url


REDIS_SCHEMES = ("redis", "rediss")
PASSWORD_SCHEMES = (*REDIS_SCHEMES, "amqp", "amqps", "pyamqp")


def with_password(url: str, password: str) -> str:
    """`url` with `password` in it, unless it holds one already (the URL's own wins) or its
    scheme takes none (a unix socket)."""
    parts = urlsplit(url)
    if parts.scheme not in PASSWORD_SCHEMES or parts.password is not None:
        return url
    host = parts.netloc.rpartition("@")[2]
    user = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else ""
    netloc = f"{user}:{quote(password, safe='')}@{host}"
    return urlunsplit(parts._replace(netloc=netloc))


def _plain(secret: SecretStr | None) -> str:
    return secret.get_secret_value() if secret is not None else ""


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings (tests build their own `Settings` instead): the environment, then
    the files of PREFIT_SECRETS_DIR for what it does not set."""
    found = Settings()
    if found.secrets_dir is None:
        return found
    return Settings(_secrets_dir=found.secrets_dir)  # type: ignore[call-arg]
