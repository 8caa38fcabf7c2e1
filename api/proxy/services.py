"""The proxy's own long-lived parts, one set per app: `ProxyServices`.

The dialects (each with its provider's upstream), the pooled upstream clients (and each
tenant's share of them), the windows learned from overflows, the bodies resent turn after
turn, and which provider-stored objects each tenant owns. They are the proxy's alone,
so they live here rather than on the app's `Services` (api/deps.py), which the proxy uses
and which knows nothing of it. The tenants' memory of repeated openings stays on `Services`:
`/v1/prepare` learns from it and feeds it as the proxy does. Built with the app
(`create_app` puts it on `app.state.proxy`); `aclose` closes the running loop's clients.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from api.proxy.bodies import ResentBodies
from api.proxy.dialects.anthropic import AnthropicDialect
from api.proxy.dialects.gemini import GeminiDialect
from api.proxy.dialects.openai import OpenAIDialect
from api.proxy.dialects.responses import ResponsesDialect
from api.proxy.overflow import Corrections, LearnedWindows
from api.proxy.upstream import UpstreamClients
from shared.settings import Settings
from shared.store.ownership import Ownership

MB = 1024 * 1024


@dataclass(frozen=True)
class ProxyServices:
    """The proxy's dialects, upstream clients, learned windows and corrections, and resent
    bodies."""

    openai: OpenAIDialect
    anthropic: AnthropicDialect
    responses: ResponsesDialect
    gemini: GeminiDialect
    clients: UpstreamClients
    learned: LearnedWindows  # the windows of unconfigured models, learned from overflows
    corrections: Corrections  # how much denser each conversation is than estimated
    bodies: ResentBodies  # bodies resent turn after turn, parsed from what is new
    owned: Ownership  # the provider-stored objects each tenant created (responses)

    @classmethod
    def build(cls, settings: Settings) -> ProxyServices:
        """The proxy's parts for `settings` (nothing connects until a request)."""
        return cls(
            openai=OpenAIDialect(settings),
            anthropic=AnthropicDialect(settings),
            responses=ResponsesDialect(settings),
            gemini=GeminiDialect(settings),
            clients=UpstreamClients(settings),
            learned=LearnedWindows(),
            corrections=Corrections(),
            bodies=ResentBodies(max_bytes=settings.proxy_body_cache_mb * MB),
            owned=Ownership(max_ids=settings.proxy_owned_ids_max),
        )

    async def aclose(self) -> None:
        """Close the running loop's upstream clients."""
        await self.clients.aclose()


def proxy_services(request: Request) -> ProxyServices:
    """The proxy's parts of the app serving `request`."""
    found: ProxyServices = request.app.state.proxy
    return found
