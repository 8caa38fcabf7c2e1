"""Who is calling the proxy, and which provider key goes upstream.

SDKs put their key where their provider wants it: OpenAI's in `Authorization: Bearer`,
Anthropic's in `x-api-key` (newer Anthropic SDKs also use `Authorization: Bearer`). Either
authenticates the prefit tenant, and that key is never sent upstream: the deployment's key
for the provider is (`PREFIT_OPENAI_API_KEY`, `PREFIT_ANTHROPIC_API_KEY`).

Opt-in (`PREFIT_PROXY_FORWARD_CLIENT_KEYS=true`): a client sends its prefit key in
`X-Prefit-Api-Key` and its own provider key where the SDK puts it; that provider header is
then forwarded as it came. In open mode (no prefit keys) the SDK's key is the provider key;
without the opt-in it goes upstream only when the deployment has no key for that provider
(a local `prefit up` in front of the client's own account), never in place of one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from api.auth import KeyRing
from shared.errors import Unauthorized
from shared.settings import Settings

PREFIT_KEY = "x-prefit-api-key"
PROVIDER_AUTH = ("authorization", "x-api-key")


@dataclass(frozen=True)
class Caller:
    """The tenant, and the client's own provider auth headers to forward (maybe none)."""

    tenant: str
    provider_auth: dict[str, str] = field(default_factory=dict)
    # open mode: the SDK's key headers, for an upstream the deployment has no key for
    fallback_auth: dict[str, str] = field(default_factory=dict)


def _bearer(value: str | None) -> str | None:
    if value is None:
        return None
    scheme, _, key = value.strip().partition(" ")
    return key.strip() if scheme.lower() == "bearer" and key.strip() else None


def identify(headers: Mapping[str, str], keyring: KeyRing, settings: Settings) -> Caller:
    """The caller of a proxy request; `Unauthorized` when no valid prefit key is given."""
    own = headers.get("x-api-key") or _bearer(headers.get("authorization"))
    prefit_key = headers.get(PREFIT_KEY)
    if prefit_key is not None:
        tenant = keyring.tenant_for_key(prefit_key)
        provider = own is not None and own.strip() != prefit_key.strip()
    elif keyring.open:
        tenant, provider = keyring.tenant_for_key(""), own is not None
    elif own is None:
        raise Unauthorized(
            "missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'"
        )
    else:
        tenant, provider = keyring.tenant_for_key(own), False
    if not provider:
        return Caller(tenant)
    mine = (prefit_key or "").strip()
    auth = {
        h: v
        for h in PROVIDER_AUTH
        if (v := headers.get(h)) is not None and (_bearer(v) or v).strip() != mine
    }
    if settings.proxy_forward_client_keys:
        return Caller(tenant, auth)
    return Caller(tenant, fallback_auth=auth if keyring.open else {})
