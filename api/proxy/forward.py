"""The proxy's other provider endpoints: Anthropic's token count and both model lists.

`POST /v1/messages/count_tokens` is fitted as `POST /v1/messages` is, then forwarded: a
client that counts before it sends (to decide whether to compact, or whether the request
fits) gets the provider's count of the prompt prefit would send, not of the transcript it
holds; the count also calibrates prefit's estimates, as a usage does. It is never retried.
`GET /v1/models` (and `/v1/models/{id}`) goes as it came to the provider the SDK speaks to:
Anthropic's when the request carries `anthropic-version` (every Anthropic SDK sends it),
else OpenAI's. Both answer with the provider's own status, body and headers.
"""

from __future__ import annotations

from collections.abc import Mapping

import httpx
from fastapi import Response

from api.deps import Services
from api.proxy.anthropic import prompt_of
from api.proxy.caller import Caller
from api.proxy.codec import dumps
from api.proxy.dialect import Dialect
from api.proxy.headers import passed_back
from api.proxy.relay import Relay, _json
from api.proxy.upstream import ANTHROPIC

COUNT_PATH = "/count_tokens"  # after Anthropic's `/v1/messages`


def endpoint(svc: Services, name: str, path: str) -> str:
    """The URL of `path` (say `/models`) beside upstream `name`'s main endpoint."""
    url = svc.transport.upstreams[name].url
    if name == ANTHROPIC:
        return url.removesuffix("/messages") + path
    return url.removesuffix("/chat/completions") + path


class CountRelay(Relay):
    """One `POST /v1/messages/count_tokens`: fitted, forwarded once, its count observed."""

    async def run(self) -> Response:
        fit = await self._first_fit()
        url = self.svc.transport.upstreams[self.dialect.name].url + COUNT_PATH
        client = self.svc.transport.client(self.dialect.name)
        try:
            upstream = await client.post(
                url, headers=self._upstream_headers(), content=self._body(fit)
            )
        except httpx.TransportError as exc:
            return self._unreachable(exc, fit)
        self.rec.upstream_status = upstream.status_code
        if fit is not None and upstream.status_code < 300:
            tokens = prompt_of(_json(upstream.content))
            if tokens:
                self._observe(fit, tokens)
        self._settle()
        return Response(
            upstream.content,
            status_code=upstream.status_code,
            headers=self._answer_headers(upstream.headers, fit),
            background=self.background,
        )


async def models(
    svc: Services,
    dialect: Dialect,
    caller: Caller,
    path: str,
    headers: Mapping[str, str],
    query: str,
) -> Response:
    """`GET {path}` (`/models...`) forwarded to `dialect`'s provider as it came."""
    name = dialect.name
    out = {**dialect.defaults()}
    out.update({h: headers[h] for h in dialect.forwarded if h in headers})
    key = svc.transport.upstreams[name].key
    if caller.provider_auth:
        out.update(caller.provider_auth)
    elif key:
        out.update(dialect.auth(key))
    url = endpoint(svc, name, path) + (f"?{query}" if query else "")
    try:
        upstream = await svc.transport.client(name).get(url, headers=out)
    except httpx.TransportError as exc:
        timeout = isinstance(exc, httpx.TimeoutException)
        status = 504 if timeout else 502
        message = f"{name} upstream {'timed out' if timeout else 'unreachable'}"
        body = dumps(dialect.error(status, message))
        return Response(body, status, headers={"content-type": "application/json"})
    return Response(upstream.content, upstream.status_code, headers=passed_back(upstream.headers))
