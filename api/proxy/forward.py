"""Anthropic's token count, fitted then forwarded.

`POST /v1/messages/count_tokens` is fitted as `POST /v1/messages` is, then forwarded: a
client that counts before it sends (to decide whether to compact, or whether the request
fits) gets the provider's count of the prompt prefit would send, not of the transcript it
holds; the count also calibrates prefit's estimates, as a usage does. It is never retried,
and it answers with the provider's own status, body and headers.
"""

from __future__ import annotations

from typing import ClassVar

import httpx
from fastapi import Response

from api.proxy.dialects.anthropic import prompt_of
from api.proxy.relay import Relay, _json


class CountRelay(Relay):
    """One `POST /v1/messages/count_tokens`: fitted, forwarded once, its count observed."""

    count_path: ClassVar[str] = "/messages/count_tokens"  # under the upstream's /v1

    async def run(self) -> Response:
        fit = await self._first_fit()
        url = self.svc.transport.upstreams[self.dialect.name].root + self.count_path
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
