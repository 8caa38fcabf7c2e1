"""Which provider-stored objects a proxied request may name: only its tenant's own.

With the deployment's key the provider sees one account, so any tenant could name any
response it stored. prefit records the id of every response a tenant's `POST /v1/responses`
created (`own_response`: the answer's `id`; in a stream, `response.created`'s, read ahead
before any event is passed on), for OpenAI's retention of 30 days
(shared/store/ownership.py), and answers any other id the provider's own not-found error
without asking it: retrieve, delete, input items and cancel (`owned_response`, api/proxy/
routes.py), and a `previous_response_id` in a body (`check_references`: 400, as OpenAI
answers an unknown one; `POST /v1/responses`, its `input_tokens` and `compact`), and an
`item_reference` input naming an output item of another's response (the items of each
response are recorded with it, `ITEMS`). A
`conversation` names an OpenAI conversation, which only `POST /v1/conversations` makes, and
prefit does not pass that through: with the deployment's key every one is another's, so it is
refused the same way. With the client's own provider key the provider keeps accounts apart
itself, and nothing is checked (`own_key`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from api.deps import Services
from api.proxy.endpoints import PROVIDER_ID
from api.proxy.identity import Caller
from api.proxy.upstream import own_key
from shared.errors import InvalidRequest, NotFound, StoreUnavailable
from shared.logs import get_logger

if TYPE_CHECKING:  # it holds the dialects, whose relays import this module
    from api.proxy.dialects import Dialect
    from api.proxy.services import ProxyServices

log = get_logger(__name__)

RESPONSES = "responses"  # the kinds of owned object (shared/store/keys.py `owned`)
ITEMS = "items"  # a stored response's output items, which `item_reference` inputs name
RETENTION_S = 30 * 86_400  # OpenAI keeps a stored response 30 days


async def owned_response(
    svc: Services, proxy: ProxyServices, tenant: str, response_id: str
) -> None:
    """`NotFound` (OpenAI's words) unless `tenant` created `response_id` through prefit."""
    client = svc.increments().client
    if not await proxy.owned.owns(client, tenant, RESPONSES, response_id, RETENTION_S):
        raise NotFound(f"Response with id '{response_id}' not found.")


async def check_references(
    svc: Services, proxy: ProxyServices, dialect: Dialect, caller: Caller, body: Mapping[str, Any]
) -> None:
    """`InvalidRequest` for a `previous_response_id` the tenant did not create, or any
    `conversation`, when the deployment's key goes upstream."""
    if own_key(dialect, caller):
        return
    previous = body.get("previous_response_id")
    if previous not in (None, ""):
        valid = isinstance(previous, str) and PROVIDER_ID.fullmatch(previous) is not None
        client = svc.increments().client
        if not valid or not await proxy.owned.owns(
            client, caller.tenant, RESPONSES, str(previous), RETENTION_S
        ):
            raise InvalidRequest(f"Previous response with id '{str(previous)[:80]}' not found.")
    references = item_references(body.get("input"))
    if references and not await proxy.owned.owns_all(
        svc.increments().client, caller.tenant, ITEMS, references, RETENTION_S
    ):
        raise InvalidRequest("Item referenced by an item_reference input was not found.")
    if body.get("conversation") not in (None, ""):
        raise InvalidRequest(
            "conversation not found: prefit's proxy serves no OpenAI conversations "
            "(/v1/conversations is prefit's own API), so none belongs to this key"
        )


def item_references(given: Any) -> list[str]:
    """The ids an `input` names by `item_reference` (an id not of the provider's form
    included as it is: it is owned by no one)."""
    if not isinstance(given, list):
        return []
    found = [
        i.get("id") for i in given if isinstance(i, dict) and i.get("type") == "item_reference"
    ]
    return [str(i)[:256] for i in found]


def output_ids(response: Any) -> list[str]:
    """The ids of a Responses `response` object's output items."""
    output = response.get("output") if isinstance(response, dict) else None
    if not isinstance(output, list):
        return []
    return [i["id"] for i in output if isinstance(i, dict) and isinstance(i.get("id"), str)]


async def own_response(
    svc: Services,
    proxy: ProxyServices,
    tenant: str,
    response_id: str | None,
    items: list[str] | None = None,
) -> None:
    """Record `response_id` and its output `items` as `tenant`'s (a Redis fault: logged;
    they stay unreachable)."""
    client = svc.increments().client
    try:
        if response_id is not None and PROVIDER_ID.fullmatch(response_id):
            await proxy.owned.record(client, tenant, RESPONSES, response_id, RETENTION_S)
        kept = [i for i in items or () if PROVIDER_ID.fullmatch(i)]
        if kept:
            await proxy.owned.record(client, tenant, ITEMS, kept, RETENTION_S)
    except StoreUnavailable:
        log.warning("proxy.owner_unrecorded", tenant=tenant, kind=RESPONSES)
