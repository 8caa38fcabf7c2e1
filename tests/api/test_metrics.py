"""The request-level series an operator's dashboard reads: fit outcomes, the providers'
answers to the drop-in proxy, and requests that met a Redis error."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from api.metrics import Metrics
from api.requestlog import RequestLog

CHAT = "/v1/chat/completions"
PREPARE = "/v1/conversations/{conversation_id}/prepare"


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = metrics.render().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.endswith("_created")
    }


def test_provider_answers_are_counted_by_class_or_failure() -> None:
    """2xx/4xx/5xx classes, 429 on its own, and a call with no answer by how it failed; a
    request the proxy never forwarded counts nothing."""
    metrics = Metrics()
    for status, error in [(200, None), (201, None), (429, None), (404, None), (503, None),
                          (None, "UpstreamTimeout"), (None, "UpstreamUnreachable"),
                          (200, "UpstreamBroke")]:  # fmt: skip
        metrics.observe(RequestLog(route=CHAT, status=200, upstream_status=status, error=error))
    metrics.observe(RequestLog(route=CHAT, status=422, error="InvalidRequest"))
    found = {
        dict(labels)["status"]: value
        for (name, labels), value in samples(metrics).items()
        if name == "prefit_upstream_responses_total"
    }
    assert found == {
        "2xx": 2.0, "429": 1.0, "4xx": 1.0, "5xx": 1.0,
        "timeout": 1.0, "unreachable": 1.0, "broke": 1.0,
    }  # fmt: skip


def test_fit_outcomes_and_redis_errors() -> None:
    """x-prefit-fit as the outcome label; a 503 StoreUnavailable and a degraded prepare are
    both Redis errors, other errors are not."""
    metrics = Metrics()
    for fit in ("applied", "applied", "skipped (unknown model)"):
        metrics.observe(RequestLog(route=CHAT, status=200, fit=fit, upstream_status=200))
    metrics.observe(RequestLog(route=PREPARE, status=503, error="StoreUnavailable"))
    metrics.observe(RequestLog(route=PREPARE, status=200, degraded=True))
    metrics.observe(RequestLog(route=PREPARE, status=404, error="NotFound"))
    found = samples(metrics)
    assert found[("prefit_proxy_fits_total", (("outcome", "applied"),))] == 2.0
    assert found[("prefit_proxy_fits_total", (("outcome", "skipped (unknown model)"),))] == 1.0
    assert found[("prefit_redis_errors_total", ())] == 2.0
