"""Start-up: the API refuses a Redis whose cluster mode is not PREFIT_REDIS_CLUSTER's."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from shared.errors import ConfigError
from tests.api.conftest import Recorder, make_settings


@pytest.mark.slow
def test_a_cluster_node_without_the_setting_stops_the_start(cluster_url: str) -> None:
    """REDIS_URL on a cluster node and no PREFIT_REDIS_CLUSTER: the app does not start, and
    the error names both settings."""
    settings = make_settings(cluster_url, "m", redis_cluster=False)
    app = create_app(settings, enqueue=Recorder())
    with (
        pytest.raises(ConfigError, match=r"REDIS_URL .* PREFIT_REDIS_CLUSTER is not set"),
        TestClient(app),
    ):
        pass


def test_the_setting_on_a_standalone_redis_stops_the_start(standalone_url: str) -> None:
    """PREFIT_REDIS_CLUSTER=true and a standalone Redis in REDIS_URL: no app, the error names
    both settings."""
    settings = make_settings(standalone_url, "m", redis_cluster=True, broker_url=standalone_url)
    with pytest.raises(ConfigError, match=r"PREFIT_REDIS_CLUSTER=true but REDIS_URL .* not a"):
        create_app(settings, enqueue=Recorder())


def test_a_matching_mode_starts(redis_url: str) -> None:
    """The suite's own Redis, in the suite's mode, passes the check and serves."""
    app = create_app(make_settings(redis_url, "m"), enqueue=Recorder())
    with TestClient(app) as client:
        assert client.get("/healthz").status_code == 200
