"""Property-based: whatever schemathesis sends that the OpenAPI schema allows, never a 5xx.

The schema is read from the app when this module is imported (schemathesis's lazy fixture
loader does not run on this pytest), before the suite's Redis exists: the app is built on a
placeholder, and each test swaps in services on the suite's Redis and the test's tenant.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from api.app import create_app
from api.deps import Services
from shared.settings import Settings
from shared.store import Store
from tests.api.conftest import Recorder, key_of

pytestmark = pytest.mark.slow  # a property run over every operation of the schema: about 7 s

MAX_EXAMPLES = 30  # per operation; the whole file stays well under a minute

APP = create_app(Settings(redis_url="redis://127.0.0.1:1/0", api_keys="placeholder:unused"))
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)


@pytest.fixture
def live(settings: Settings, store: Store) -> Iterator[None]:
    """Point the module's app at the suite's Redis, with the test tenant's key."""
    placeholder = APP.state.services
    APP.state.services = Services.build(settings, store=store, enqueue=Recorder())
    try:
        yield
    finally:
        APP.state.services.close(close_store=False)
        APP.state.services = placeholder


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.function_scoped_fixture,
    ],
)
def test_no_input_makes_a_server_error(case: Any, live: None, tenant: str) -> None:
    """Every generated request is answered without a 5xx."""
    response = case.call(headers={"Authorization": f"Bearer {key_of(tenant)}"})
    case.validate_response(response, checks=[not_a_server_error])
