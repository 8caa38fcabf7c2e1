"""The provider endpoints the proxy passes through, by allow-list: each route names one.

A pass-through route (`Passage`) names the one provider endpoint it reaches: a path template
under the API's /v1 whose parameters are ids of the provider's own form, and the query
parameters the provider documents for it. The upstream URL is rebuilt from those parts and
nothing else: the path parameters are read from the request's raw path
(`scope["raw_path"]`, as sent on the wire: the server decodes `%2F` into `/` and routing
sees the decoded path) and must each be a whole id (`PROVIDER_ID`: letters, digits and
`._:-`, starting with a letter or digit, so no `/`, no `.` or `..` segment, no
percent-encoding at all, no `?`, `#`, space or control character); the query is parsed and
only the documented names are kept, each value re-encoded (`urlencode`). A request that does
not fit its passage exactly is answered the 404 an unknown route gets, and never reaches the
provider: `..%2Ffiles` after `/v1/models/` cannot become the provider's `/v1/files`, nor
`../../admin` its `/admin`.

The documented query parameters, from the SDKs (openai-python's `ResponseRetrieveParams`,
`InputItemListParams`; anthropic-sdk-python's `ModelListParams`): list parameters are sent
as `include[]=...` (the SDKs' "brackets" array format) or `include=...`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlencode

from starlette.types import Scope

# an id of the provider's own form: `gpt-4o-2024-08-06`, `ft:gpt-4o-mini:org::abc`,
# `claude-sonnet-4-5-20250929`, `resp_68af...`
PROVIDER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,255}")
MAX_QUERY_VALUE = 256
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class Passage:
    """One pass-through route: prefit's path template (under /v1, `{name}` for an id), the
    provider endpoint it reaches (the same template under the upstream's root), and the
    query parameters the provider documents for it."""

    template: str
    query: frozenset[str] = field(default_factory=frozenset)

    def upstream(self, scope: Scope) -> tuple[str, dict[str, str]] | None:
        """The upstream path (under its /v1, with the query rebuilt) and the ids in it, or
        None when the request's raw path is not exactly this passage's."""
        ids = self.ids(scope)
        if ids is None:
            return None
        path = self.template.removeprefix("/v1")
        for name, value in ids.items():
            path = path.replace("{" + name + "}", value)
        query = self.rebuilt_query(scope.get("query_string", b""))
        return (f"{path}?{query}" if query else path), ids

    def ids(self, scope: Scope) -> dict[str, str] | None:
        """The path parameters of the raw path, each a whole provider id; None otherwise."""
        raw = scope.get("raw_path") or scope.get("path", "").encode()
        try:
            path = raw.decode("ascii")
        except UnicodeDecodeError:
            return None
        given, wanted = path.split("/"), self.template.split("/")
        if len(given) != len(wanted):
            return None
        ids: dict[str, str] = {}
        for got, part in zip(given, wanted, strict=True):
            if part.startswith("{"):
                if not PROVIDER_ID.fullmatch(got):
                    return None
                ids[part.strip("{}")] = got
            elif got != part:
                return None
        return ids

    def rebuilt_query(self, raw: bytes) -> str:
        """The documented parameters of the raw query string, re-encoded; the rest dropped."""
        if not raw or not self.query:
            return ""
        try:
            pairs = parse_qsl(raw.decode("ascii"), keep_blank_values=True, max_num_fields=64)
        except (UnicodeDecodeError, ValueError):
            return ""
        kept = [
            (name, value)
            for name, value in pairs
            if name.removesuffix("[]") in self.query
            and len(value) <= MAX_QUERY_VALUE
            and not _CONTROL.search(value)
        ]
        return urlencode(kept)


MODELS = Passage("/v1/models", frozenset({"after_id", "before_id", "limit"}))  # Anthropic's
MODEL = Passage("/v1/models/{model_id}")
EMBEDDINGS = Passage("/v1/embeddings")
RESPONSE = Passage(
    "/v1/responses/{response_id}",
    frozenset({"include", "include_obfuscation", "starting_after", "stream"}),
)
INPUT_ITEMS = Passage(
    "/v1/responses/{response_id}/input_items", frozenset({"after", "include", "limit", "order"})
)
CANCEL = Passage("/v1/responses/{response_id}/cancel")
