"""The headers of a proxied answer: the provider's own, and prefit's `x-prefit-*`.

`x-prefit-fit` says what was done (`applied`, `unchanged`, `skipped (<reason>)`), then the
conversation id, prepare's figures, the summary used, whether one is due and not ready,
the overflow retries, and whether Redis was unreachable (docs/api.md, "Response headers").
"""

from __future__ import annotations

from collections.abc import Mapping

from api.proxy.dialects import Dialect
from api.proxy.identity import Caller

# Not passed back from the upstream's answer: they describe its connection and encoding.
HOP = frozenset(
    {"content-length", "content-encoding", "transfer-encoding", "connection", "keep-alive"}
    | {"date", "server"}
)


# Who the client's own key bills (`organization=`, `project=` of the SDK): forwarded with
# that key only, since the deployment's key belongs to an account of its own.
ACCOUNT = ("openai-organization", "openai-project")


def upstream_headers(
    dialect: Dialect, caller: Caller, key: str | None, client: Mapping[str, str]
) -> dict[str, str]:
    """The headers of a request to `dialect`'s upstream: its defaults, the client's headers
    it passes on, and the client's own provider auth when forwarded, else the deployment's
    `key`, else (open mode, no deployment key) the SDK's; the client's account headers go
    with its own key only."""
    out = {"content-type": "application/json", **dialect.defaults()}
    out.update({h: client[h] for h in dialect.forwarded if h in client})
    if caller.provider_auth:
        out.update(caller.provider_auth)
        out.update({h: client[h] for h in ACCOUNT if h in client})
    elif key:
        out.update(dialect.auth(key))
    elif caller.fallback_auth:
        out.update(caller.fallback_auth)
        out.update({h: client[h] for h in ACCOUNT if h in client})
    return out


def passed_back(upstream: Mapping[str, str]) -> dict[str, str]:
    """The upstream answer's headers the client gets (rate limits, request ids, ...)."""
    return {k: v for k, v in upstream.items() if k.lower() not in HOP}
