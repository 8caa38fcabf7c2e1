"""Settings from secret files (PREFIT_SECRETS_DIR) and passwords merged into the Redis and broker
URLs, as docker-compose.yml's secrets give them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from shared.settings import Settings, get_settings, with_password


def secrets(folder: Path, **files: str) -> Path:
    for name, text in files.items():
        (folder / name).write_text(text + "\n")  # as `echo` writes them: the newline is dropped
    return folder


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No PREFIT_* or REDIS_URL from the test's environment; get_settings read anew."""
    for name in (
        "REDIS_URL",
        "PREFIT_REDIS_URL",
        "PREFIT_BROKER_URL",
        "PREFIT_API_KEYS",
        "PREFIT_SECRETS_DIR",
    ):
        monkeypatch.delenv(name, raising=False)
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


@pytest.mark.usefixtures("fresh")
def test_get_settings_reads_the_secrets_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files named after settings fill them; a variable wins over its file."""
    folder = secrets(
        tmp_path,
        prefit_api_keys="tenant-a:key-a",
        prefit_openai_api_key="sk-file",
        prefit_redis_password="p@ss/word",
    )
    monkeypatch.setenv("PREFIT_SECRETS_DIR", str(folder))
    monkeypatch.setenv("PREFIT_OPENAI_API_KEY", "sk-variable")
    monkeypatch.setenv("REDIS_URL", "redis://redis:6379/0")
    found = get_settings()
    assert found.api_keys == "tenant-a:key-a"
    assert found.openai_api_key is not None
    assert found.openai_api_key.get_secret_value() == "sk-variable"
    assert found.redis_url == "redis://:p%40ss%2Fword@redis:6379/0"
    assert redis.connection.parse_url(found.redis_url)["password"] == "p@ss/word"


@pytest.mark.usefixtures("fresh")
def test_without_a_secrets_folder_no_file_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Settings() alone never reads a folder: only PREFIT_SECRETS_DIR names one."""
    secrets(tmp_path, prefit_api_keys="tenant-a:key-a")
    monkeypatch.chdir(tmp_path)
    assert get_settings().api_keys == ""


def test_the_redis_password_goes_into_the_store_and_a_redis_broker() -> None:
    """Both Redis URLs get it; a RabbitMQ broker gets rabbitmq_password instead."""
    same = Settings(redis_url="redis://redis:6379/0", redis_password="pw")
    assert same.redis_url == same.broker == "redis://:pw@redis:6379/0"
    other = Settings(
        redis_url="redis://redis:6379/0",
        broker_url="redis://queue:6379/1",
        redis_password="pw",
        rabbitmq_password="rabbit",
    )
    assert other.broker == "redis://:pw@queue:6379/1"
    amqp = Settings(
        broker_url="amqp://prefit@rabbitmq:5672//", redis_password="pw", rabbitmq_password="r b"
    )
    assert amqp.broker == "amqp://prefit:r%20b@rabbitmq:5672//"
    assert Settings(broker_url="amqp://prefit@rabbitmq:5672//", redis_password="pw").broker == (
        "amqp://prefit@rabbitmq:5672//"
    )


def test_a_password_in_the_url_wins_and_sockets_take_none() -> None:
    """An explicit URL password is kept; a unix socket URL is left as it is."""
    assert with_password("redis://u:own@h:6379/0", "file") == "redis://u:own@h:6379/0"
    assert with_password("rediss://h:6380/2", "x") == "rediss://:x@h:6380/2"
    assert with_password("unix:///run/redis.sock", "x") == "unix:///run/redis.sock"
