"""The compose profile `monitoring` (deploy/): the alert rules and the Prometheus config pass
promtool, the rules fire as meant (promtool's unit tests), Grafana is provisioned with the
dashboard, and every series a panel or a rule names exists on a real `/metrics` after traffic."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import generate_latest

from api.app import create_app
from shared import PrefitClient
from shared.store import Store
from tests.api.conftest import Recorder, key_of
from tests.api.proxy.conftest import agent_session, proxy_settings
from tests.api.server import serve
from tests.builders import user
from tests.conftest import ROOT
from tests.fakeprovider import FakeProvider
from worker.metrics import WorkerMetrics

DEPLOY = ROOT / "deploy"
RULES = DEPLOY / "prometheus" / "rules" / "prefit.yml"
PROMETHEUS = DEPLOY / "prometheus" / "prometheus.yml"
DASHBOARDS = DEPLOY / "grafana" / "dashboards"
PROVISIONING = DEPLOY / "grafana" / "provisioning"
RULE_TESTS = ROOT / "tests" / "promtool" / "rules_test.yml"

# Series Prometheus makes itself for every target it scrapes: not the app's to expose.
PROMETHEUS_OWN = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
HISTOGRAM_PARTS = ("_bucket", "_sum", "_count")

# PromQL words that are not metric names: aggregations, functions, keywords.
AGGREGATIONS = {
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
    "bottomk", "topk", "quantile", "limitk", "limit_ratio",
}  # fmt: skip
FUNCTIONS = {
    "abs", "absent", "absent_over_time", "ceil", "changes", "clamp", "clamp_max", "clamp_min",
    "day_of_month", "day_of_week", "day_of_year", "days_in_month", "delta", "deriv", "exp",
    "floor", "histogram_avg", "histogram_count", "histogram_fraction", "histogram_quantile",
    "histogram_stddev", "histogram_stdvar", "histogram_sum", "holt_winters", "hour", "idelta",
    "increase", "irate", "label_join", "label_replace", "ln", "log2", "log10", "minute", "month",
    "predict_linear", "rate", "resets", "round", "scalar", "sgn", "sort", "sort_desc",
    "sort_by_label", "sort_by_label_desc", "sqrt", "time", "timestamp", "vector", "year",
    "avg_over_time", "min_over_time", "max_over_time", "sum_over_time", "count_over_time",
    "quantile_over_time", "stddev_over_time", "stdvar_over_time", "last_over_time",
    "present_over_time", "mad_over_time", "acos", "acosh", "asin", "asinh", "atan", "atanh",
    "cos", "cosh", "sin", "sinh", "tan", "tanh", "deg", "rad", "pi",
}  # fmt: skip
KEYWORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "offset", "bool", "atan2", "inf", "nan", "start", "end", "step",
}  # fmt: skip
NOT_METRICS = AGGREGATIONS | FUNCTIONS | KEYWORDS

STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
GROUPINGS = re.compile(
    r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", re.IGNORECASE
)
IDENTIFIER = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: its identifiers once strings, label
    matchers, ranges, groupings, Grafana variables, numbers and PromQL's own words are gone."""
    text = STRINGS.sub('""', expr)
    text = re.sub(r"\$\{?\w+\}?", " ", text)  # Grafana's $__rate_interval and friends
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers (their names are labels)
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges and subqueries' durations
    text = GROUPINGS.sub(" ", text)  # label lists of by/without/on/ignoring/group_*
    names = set()
    for match in IDENTIFIER.finditer(text):
        before = text[match.start() - 1] if match.start() else " "
        if before.isdigit() or before == ".":  # the exponent or unit of a number: 1e-9, 5m
            continue
        if match.group().lower() not in NOT_METRICS:
            names.add(match.group())
    return names


def family(name: str, histograms: set[str]) -> str:
    """A series name as its metric family: a histogram's _bucket/_sum/_count are its base."""
    for part in HISTOGRAM_PARTS:
        base = name.removesuffix(part)
        if base != name and base in histograms:
            return base
    return name


def rule_exprs() -> dict[str, str]:
    """Every alert's (or recording rule's) expression by its name."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {r.get("alert") or r["record"]: r["expr"] for g in groups for r in g["rules"]}


def dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])  # a collapsed row holds its panels


def panel_exprs() -> dict[str, str]:
    """Every panel query's expression, by dashboard, panel title and query ref."""
    return {
        f"{name}: {panel['title']} {target['refId']}": target["expr"]
        for name, dash in dashboards().items()
        for panel in panels(dash)
        for target in panel.get("targets", [])
    }


def exposition(text: str) -> tuple[set[str], set[str]]:
    """The sample names of a Prometheus text exposition, and its histogram families."""
    samples, histograms = set(), set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            if kind.strip() == "histogram":
                histograms.add(name)
        elif line and not line.startswith("#"):
            samples.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return samples, histograms


PROMTOOL_MISSING = (
    "promtool is not installed: no package registry the project's own setup reaches ships it; "
    "`apt-get install prometheus` (Debian, Ubuntu) or `brew install prometheus` does (README)"
)


def promtool() -> str:
    """The promtool on PATH. Absent, its tests skip saying how to install it, except in CI,
    where .ci/run installs it and its absence is a broken run."""
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(PROMTOOL_MISSING)
        pytest.skip(PROMTOOL_MISSING)
    return found


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=60, cwd=ROOT)


def test_the_parser_finds_metric_names_and_nothing_else() -> None:
    """Functions, aggregations, labels, durations, numbers and Grafana variables are not names."""
    expr = (
        "histogram_quantile(0.99, sum by (le, route) (rate(prefit_prepare_seconds_bucket"
        '{route=~"/v1/.*"}[$__rate_interval]))) / on (instance) group_left '
        "max without (job) (prefit_store_up offset 5m) > 1e-9 and absent(up == 1)"
    )
    assert metric_names(expr) == {"prefit_prepare_seconds_bucket", "prefit_store_up", "up"}
    assert metric_names('sum(rate(a_total{status!~"5.."}[5m])) / sum(b:recorded)') == {
        "a_total",
        "b:recorded",
    }


def test_the_rules_pass_promtool_check() -> None:
    """`promtool check rules` accepts every rule (the syntax and the PromQL)."""
    run = run_promtool("check", "rules", str(RULES))
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"SUCCESS: {len(rule_exprs())} rules found" in run.stdout


def test_the_prometheus_config_passes_promtool_check() -> None:
    """`promtool check config` accepts the config and finds the rule file through it; the api
    replicas are discovered by DNS, one target each (never through the load balancer)."""
    run = run_promtool("check", "config", str(PROMETHEUS))
    assert run.returncode == 0, run.stdout + run.stderr
    config = yaml.safe_load(PROMETHEUS.read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    for name, service, port in (("prefit-api", "api", 8000), ("prefit-worker", "worker", 9100)):
        assert jobs[name]["dns_sd_configs"] == [
            {"names": [service], "type": "A", "port": port, "refresh_interval": "15s"}
        ]
        # the replica's own `replica` label (its container's name) becomes the instance
        copy, drop = jobs[name]["metric_relabel_configs"]
        assert (copy["source_labels"], copy["target_label"]) == (["replica"], "instance")
        assert (drop["regex"], drop["action"]) == ("replica", "labeldrop")


def test_the_rules_fire_as_meant() -> None:
    """promtool's unit tests of the rules: each alert fires on its condition and not before."""
    run = run_promtool("test", "rules", str(RULE_TESTS))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SUCCESS" in run.stdout


def test_grafana_is_provisioned_with_the_dashboard() -> None:
    """The data source is the profile's Prometheus, the dashboards folder is the one compose
    mounts, and every panel query names that data source by uid."""
    [source] = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yml").read_text())[
        "datasources"
    ]
    assert (source["type"], source["url"]) == ("prometheus", "http://prometheus:9090")
    [provider] = yaml.safe_load((PROVISIONING / "dashboards" / "prefit.yml").read_text())[
        "providers"
    ]
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"
    [(name, dash)] = dashboards().items()
    assert dash["uid"] and dash["title"]
    queried = [t for p in panels(dash) for t in p.get("targets", [])]
    assert queried and all(t["datasource"]["uid"] == source["uid"] for t in queried)
    titles = " ".join(p["title"].lower() for p in panels(dash))
    for topic in ("request rate", "latency", "fit outcomes", "stale share", "queue depth",
                  "oldest summary job", "dead letters", "breakers", "provider errors",
                  "redis errors", "worker deliveries", "worker summaries written",
                  "worker failed and retried", "worker task duration", "worker llm tokens",
                  "worker replicas"):  # fmt: skip
        assert topic in titles, f"{name} has no panel about {topic}"


@pytest.fixture
def scraped(redis_url: str, tenant: str) -> str:
    """`/metrics` of the API (uvicorn, the suite's Redis, the proxy in front of a fake
    provider) after traffic that makes every labelled series appear."""
    model = f"model-{uuid.uuid4().hex[:10]}"
    fake, recorder = FakeProvider(limit_tokens=20_000), Recorder()
    provider = f"monitoring-test-{uuid.uuid4().hex[:8]}"
    with serve(fake.app) as fake_url:
        settings = proxy_settings(redis_url, model, tenant, fake_url)
        store = Store.from_url(redis_url, settings)
        try:
            with serve(create_app(settings, store=store, enqueue=recorder)) as url:
                _traffic(url, key_of(tenant), model, recorder)
                store.breakers.trip(provider, "openai test-model", "ProviderError")
                return httpx.get(f"{url}/metrics", timeout=10).text
        finally:
            store.breakers.reset(provider)
            store.close()


def _traffic(url: str, key: str, model: str, recorder: Recorder) -> None:
    """A proxied chat, a stored conversation past its trigger (stale, summary enqueued), one
    whose enqueue the broker refuses, and a 404."""
    auth = {"Authorization": f"Bearer {key}"}
    chat = {"model": model, "messages": [{"role": "user", "content": "Hello!"}]}
    assert httpx.post(f"{url}/v1/chat/completions", json=chat, headers=auth).status_code == 200
    prose = [user(f"turn {k}: " + "why is the cache slow " * 150) for k in range(60)]
    with PrefitClient(url, key) as client:
        client.append("monitored", prose, model=model)
        client.prepare("monitored", model=model)
        recorder.fail = True
        client.append("refused", agent_session(60), model=model)
        client.prepare("refused", model=model)
    assert httpx.get(f"{url}/v1/conversations/absent", headers=auth).status_code == 404


def worker_exposition() -> str:
    """A worker's /metrics once each kind of delivery end was counted (tests/worker/
    test_metrics.py reads it after real deliveries)."""
    metrics = WorkerMetrics()
    with metrics.delivery():
        metrics.ended({"status": "written", "records": 1, "input_tokens": 9}, 0.5)
    metrics.retrying("RetryableLLMError")
    metrics.left("retried", 0.1)
    metrics.ended({"status": "dead_letter"}, 0.2)
    return generate_latest(metrics.registry).decode()


def test_every_series_a_panel_or_rule_names_is_on_metrics(scraped: str) -> None:
    """Each metric name in a dashboard query or an alert rule is a series the app exposes (an
    API replica's or a worker's /metrics; histograms by family), or one Prometheus makes
    itself (`up`)."""
    samples, histograms = exposition(scraped + worker_exposition())
    exposed = {family(name, histograms) for name in samples}
    wanted = {**{f"rule {k}": v for k, v in rule_exprs().items()}, **panel_exprs()}
    named: dict[str, set[str]] = {}
    for where, expr in wanted.items():
        found = metric_names(expr)
        assert found, f"{where}: no metric name in {expr!r}"
        for name in found:
            named.setdefault(family(name, histograms), set()).add(where)
    missing = {n: sorted(w) for n, w in named.items() if n not in exposed | PROMETHEUS_OWN}
    assert not missing, f"named but not exposed: {missing}"
    # the list: each one both exposed and used by a panel or a rule
    for series in (
        "prefit_http_requests_total", "prefit_prepare_seconds", "prefit_proxy_fits_total",
        "prefit_stale_prepares_total", "prefit_summary_queue_depth",
        "prefit_summary_queue_oldest_seconds", "prefit_dead_letters",
        "prefit_summarizer_breaker_open", "prefit_upstream_responses_total",
        "prefit_redis_errors_total", "prefit_worker_tasks_taken_total",
        "prefit_worker_summaries_written_total", "prefit_worker_tasks_failed_total",
        "prefit_worker_tasks_retried_total", "prefit_worker_task_seconds",
        "prefit_worker_llm_tokens_total", "prefit_worker_tasks_active",
    ):  # fmt: skip
        assert series in exposed and series in named, series


def test_the_dashboard_file_is_the_one_compose_mounts() -> None:
    """Compose mounts deploy/grafana and deploy/prometheus where the provisioning looks."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    grafana = {v.split(":")[1] for v in compose["grafana"]["volumes"] if v.startswith("./")}
    assert grafana == {"/etc/grafana/provisioning", "/var/lib/grafana/dashboards"}
    prometheus = [v for v in compose["prometheus"]["volumes"] if v.startswith("./")]
    assert prometheus == ["./deploy/prometheus:/etc/prometheus:ro"]
    assert Path(DEPLOY / "prometheus" / "rules").is_dir()
