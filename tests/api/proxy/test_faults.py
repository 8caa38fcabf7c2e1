"""The proxy without Redis, and with each client's own provider key forwarded (opt-in)."""

from __future__ import annotations

import uuid
from typing import Any

import openai

from api.app import create_app
from tests.api.conftest import Recorder, key_of, make_settings
from tests.api.proxy.conftest import proxy_settings, sent_fits
from tests.api.server import serve
from tests.builders import chat
from tests.fakeprovider import WORDS, FakeProvider

DEAD_REDIS = "redis://127.0.0.1:1/0"  # nothing listens on port 1


def test_without_redis_requests_are_still_fitted_and_answered() -> None:
    """The store is down: the cheap strategies fit the prompt and the answer is marked.

    A standalone Redis: a cluster client reads the topology when the app is built, so an API
    on a cluster that is down does not start at all (docs/scaling.md)."""
    fake = FakeProvider(limit_tokens=20_000)
    tenant, model = f"t-{uuid.uuid4().hex[:8]}", f"m-{uuid.uuid4().hex[:8]}"
    with serve(fake.app) as fake_url:
        settings = proxy_settings(
            DEAD_REDIS, model, tenant, fake_url, redis_socket_timeout_s=0.2, redis_cluster=False
        )
        with serve(create_app(settings, enqueue=Recorder())) as url:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key=key_of(tenant), max_retries=0)
            raw = client.chat.completions.with_raw_response.create(
                model=model,
                messages=chat(100),  # type: ignore[arg-type]
            )
    assert raw.parse().choices[0].message.content == "".join(WORDS)
    assert raw.headers["x-prefit-degraded"] == "true"
    assert raw.headers["x-prefit-fit"] == "applied"
    [got] = fake.received
    assert got.status == 200 and sent_fits(got.body["messages"], [])


def forwarded_twice(redis_url: str, options: dict[str, Any]) -> FakeProvider:
    """The fake behind a proxy forwarding client keys, after one request with the client's
    own key (prefit's in X-Prefit-Api-Key) and one with prefit's key, both OpenAI SDKs
    made with `options`."""
    fake = FakeProvider()
    tenant, model = f"t-{uuid.uuid4().hex[:8]}", f"m-{uuid.uuid4().hex[:8]}"
    with serve(fake.app) as fake_url:
        settings = proxy_settings(
            redis_url, model, tenant, fake_url, proxy_forward_client_keys=True
        )
        with serve(create_app(settings, enqueue=Recorder())) as url:
            own = openai.OpenAI(
                base_url=f"{url}/v1",
                api_key="sk-the-clients-own",
                default_headers={"X-Prefit-Api-Key": key_of(tenant)},
                **options,
            )
            own.chat.completions.create(model=model, messages=chat(1))  # type: ignore[arg-type]
            plain = openai.OpenAI(base_url=f"{url}/v1", api_key=key_of(tenant), **options)
            plain.chat.completions.create(model=model, messages=chat(1))  # type: ignore[arg-type]
    return fake


def test_a_deployment_can_forward_each_clients_own_provider_key(redis_url: str) -> None:
    """Opt-in: the prefit key rides in X-Prefit-Api-Key, the SDK's key goes upstream."""
    fake = forwarded_twice(redis_url, {"max_retries": 0})
    keys = [r.headers["authorization"] for r in fake.received]
    assert keys == ["Bearer sk-the-clients-own", "Bearer sk-upstream-openai"]
    assert all("x-prefit-api-key" not in r.headers for r in fake.received)


def test_the_clients_organization_and_project_go_with_its_own_key_only(redis_url: str) -> None:
    """`OpenAI(organization=, project=)`: forwarded beside the client's own key (they say
    which account it bills), never beside the deployment's key."""
    account = {"organization": "org-client", "project": "proj_client", "max_retries": 0}
    fake = forwarded_twice(redis_url, account)
    first, second = (r.headers for r in fake.received)
    assert (first["openai-organization"], first["openai-project"]) == ("org-client", "proj_client")
    assert "openai-organization" not in second and "openai-project" not in second


def test_open_mode_without_a_deployment_key_sends_the_sdks_own_key(redis_url: str) -> None:
    """`prefit up` with no keys in front of the client's own account: the SDK's key goes
    upstream (it was dropped, and the provider refused the request); a deployment key, once
    configured, is used instead."""
    fake = FakeProvider()
    model = f"m-{uuid.uuid4().hex[:8]}"
    with serve(fake.app) as fake_url:
        bare = make_settings(redis_url, model, openai_base_url=f"{fake_url}/v1")
        keyed = make_settings(
            redis_url, model, openai_base_url=f"{fake_url}/v1", openai_api_key="sk-deploy"
        )
        for settings in (bare, keyed):
            with serve(create_app(settings, enqueue=Recorder())) as url:
                own = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-mine", max_retries=0)
                own.chat.completions.create(model=model, messages=chat(1))  # type: ignore[arg-type]
    keys = [r.headers.get("authorization") for r in fake.received]
    assert keys == ["Bearer sk-mine", "Bearer sk-deploy"]
