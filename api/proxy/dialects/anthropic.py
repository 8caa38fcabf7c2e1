"""The Anthropic Messages dialect (`POST /v1/messages`).

`system` and `messages` are converted losslessly to prefit's format
(shared/formats/anthropic.py) and the fitted prompt back; every other field rides along.
The prompt count is `input_tokens + cache_read_input_tokens + cache_creation_input_tokens`,
found in a streamed answer's `message_start` event. The upstream is authenticated with
`x-api-key`, and the client's `anthropic-version` and `anthropic-beta` headers are passed on.

The upstream is `PREFIT_ANTHROPIC_BASE_URL` (its /v1 added) with `PREFIT_ANTHROPIC_API_KEY`;
an overflow is a 400 (or 413) saying "prompt is too long" or "exceed context limit"
(`anthropic_figures`). The conversions of recent transcripts (`Conversions`) are the
dialect's own, bounded by `PREFIT_PROXY_BODY_CACHE_MB` (0: off).
"""

from __future__ import annotations

import operator
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

from api.codec import dumps
from api.proxy.dialects import Asked, asked_in_body, error_fields, tools_of
from api.proxy.overflow import NUMBER, Overflow, number
from api.proxy.streaming import Tap, data_of
from api.proxy.upstream import Upstream, secret
from shared.errors import InvalidTranscript
from shared.formats.anthropic import (
    Sent,
    call_ids,
    converted_message,
    from_anthropic,
    to_anthropic,
    unmarked,
)
from shared.formats.blocks import check_system, user_blocks, validate_message
from shared.messages import Message, ToolSpec
from shared.settings import Settings

ANTHROPIC = "anthropic"
API_VERSION = "2023-06-01"  # sent when the client names none
USAGE_FIELDS = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
ERROR_TYPES = {  # the error `type` Anthropic gives each status
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


# "prompt is too long: 208000 tokens > 200000 maximum"; "input length and `max_tokens`
# exceed context limit: 188240 + 21333 > 200000, decrease input length ..."
_TOO_LONG = re.compile(rf"prompt is too long: {NUMBER} tokens > {NUMBER}")
_SUM = re.compile(rf"exceed context limit: {NUMBER} \+ {NUMBER} > {NUMBER}")


def anthropic_figures(message: str) -> Overflow | None:
    """The figures of an Anthropic "prompt is too long" error; None if it is no overflow."""
    found = _TOO_LONG.search(message)
    if found:
        return Overflow(prompt_tokens=number(found.group(1)), limit=number(found.group(2)))
    found = _SUM.search(message)
    if found:
        prompt, output, limit = (number(g) for g in found.groups())
        return Overflow(prompt_tokens=prompt, limit=limit, output=output)
    if "prompt is too long" in message or "exceed context limit" in message:
        return Overflow()
    return None


def prompt_of(usage: Any) -> int | None:
    """The whole prompt's tokens in an Anthropic `usage` object (cached parts included)."""
    if not isinstance(usage, dict) or not isinstance(usage.get("input_tokens"), int):
        return None
    return sum(v for v in (usage.get(f) for f in USAGE_FIELDS) if isinstance(v, int))


def source_index(system: Any, given: list[Any], index: int | None) -> int | None:
    """The index of the Anthropic message that converted message `index` came from (each
    user turn of tool results becomes a tool message per result, then its other blocks)."""
    left = -1 if index is None else index - (system is not None)
    if left < 0:  # no index, or the system prompt's
        return None
    for i, m in enumerate(given):
        content = m["content"]
        if m["role"] == "assistant" or isinstance(content, str):
            left -= 1
        else:
            results, rest = user_blocks(content)
            left -= len(results) + (1 if rest or not results else 0)
        if left < 0:
            return i
    return None


@dataclass(frozen=True)
class _Converted:
    """One transcript's Anthropic messages (the parsed objects), what each converted to
    (without its `cache_control` markers), the bytes of JSON before each message, and, by
    the id of each conversion's first message, the Anthropic message it came from."""

    given: list[Any]
    groups: list[list[Message]]
    sizes: list[int]  # len(given) + 1 prefix sums
    sources: dict[int, tuple[Any, list[Message]]]


class Conversions:
    """The Anthropic messages of recent transcripts and their conversions, by identity.

    A body that resends an earlier one's messages holds that body's own parsed objects
    for them (`ResentBodies`: equal bytes), so a message object seen before converts to
    the objects it converted to then, and only the new messages are converted: every
    later step (the stored conversation's own objects, the validation and counting memos)
    then meets objects it has seen and compares by identity. Markers are left out of the
    conversion, so the message that held last turn's marker (new bytes, a new object)
    converts to the objects it converted to, found by content; the fitted prompt gets the
    markers back from the client's message objects, as last sent (`sent`).
    Bounded by transcripts and by memory, each weighed twice its messages' JSON (the
    conversions: half that, measured; the parsed objects, mostly the body cache's too,
    1.5x, kept alive here when the body cache has let them go).
    """

    def __init__(self, max_entries: int = 256, max_bytes: int = 256 * 1024 * 1024) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._entries: OrderedDict[int, _Converted] = OrderedDict()  # by id(given[0])
        self._bytes = 0
        self._lock = threading.Lock()

    def convert(self, given: list[Any]) -> list[list[Message]]:
        """What each of `given` converts to (validated, `InvalidTranscript` with its index)."""
        old = self._entry(given)
        k = _shared(old.given, given) if old is not None else 0
        groups = list(old.groups[:k]) if old is not None else []
        pending = call_ids(groups[-1][-1]) if groups else None
        for i in range(k, len(given)):
            validate_message(given[i], i, pending)
            m = unmarked(given[i])
            # a message that lost its marker (new bytes, so a new object): as it converted
            if old is not None and i < len(old.given) and m == unmarked(old.given[i]):
                groups.append(old.groups[i])
            else:
                groups.append(converted_message(m))
            pending = call_ids(groups[-1][-1])
        if given:
            self._keep(given, groups, old, k)
        return groups

    def adopt(self, given: list[Any], messages: Sequence[Message]) -> None:
        """Keep `messages` (equal to the conversions of `given`, in order: the stored
        conversation's own objects) as those conversions, for the next body."""
        entry = self._entry(given)
        if entry is None or entry.given is not given:
            return
        flat = chain.from_iterable(entry.groups)
        if all(map(operator.is_, messages, flat)) and next(flat, None) is None:
            return  # already those objects (in C: the usual case, only new messages passed)
        at, groups, sources = 0, [], None
        for m, old in zip(given, entry.groups, strict=True):
            group = list(messages[at : at + len(old)])
            at += len(old)
            if any(a is not b for a, b in zip(group, old, strict=False)):
                sources = dict(entry.sources) if sources is None else sources
                sources.pop(id(old[0]), None)
                sources[id(group[0])] = (m, group)
                groups.append(group)
            else:
                groups.append(old)
        if at != len(messages) or sources is None:
            return
        with self._lock:
            if self._entries.get(id(given[0])) is entry:
                self._entries[id(given[0])] = _Converted(given, groups, entry.sizes, sources)

    def sent(self, given: Any) -> Sent:
        """For `to_anthropic`: the client's own message (markers included) that the very
        objects at `messages[i:]` were converted from, as last sent in `given`."""
        entry = self._entry(given) if isinstance(given, list) else None

        def known(messages: Sequence[Message], i: int) -> tuple[dict[str, Any], int] | None:
            found = entry.sources.get(id(messages[i])) if entry is not None else None
            if found is None or not all(
                a is b for a, b in zip(messages[i : i + len(found[1])], found[1], strict=False)
            ):
                return None
            return (found[0], len(found[1])) if i + len(found[1]) <= len(messages) else None

        return known

    def _entry(self, given: list[Any]) -> _Converted | None:
        if not given:
            return None
        with self._lock:
            found = self._entries.get(id(given[0]))
        return found if found is not None and found.given[0] is given[0] else None

    def _keep(
        self, given: list[Any], groups: list[list[Message]], old: _Converted | None, k: int
    ) -> None:
        sources = dict(old.sources) if old is not None else {}
        sizes = old.sizes[: k + 1] if old is not None else [0]
        for group in old.groups[k:] if old is not None else ():
            sources.pop(id(group[0]), None)
        for i in range(k, len(given)):
            sources[id(groups[i][0])] = (given[i], groups[i])
            sizes.append(sizes[-1] + len(dumps(given[i])))
        entry = _Converted(given, groups, sizes, sources)
        key = id(given[0])
        with self._lock:
            gone = self._entries.pop(key, None)
            self._bytes += 2 * (sizes[-1] - (gone.sizes[-1] if gone is not None else 0))
            self._entries[key] = entry
            # the newest stays whatever its size: its request puts its markers back from it
            while len(self._entries) > 1 and (
                len(self._entries) > self.max_entries or self._bytes > self.max_bytes
            ):
                self._bytes -= 2 * self._entries.popitem(last=False)[1].sizes[-1]


def _shared(old: list[Any], new: list[Any]) -> int:
    """How many of `new` are, from the start, the very objects of `old`."""
    k, n = 0, min(len(old), len(new))
    while k < n and old[k] is new[k]:
        k += 1
    return k


class StartTap:
    """Reads the prompt count from `message_start`; keeps every event."""

    def __init__(self) -> None:
        self.prompt_tokens: int | None = None

    def keep(self, event: bytes) -> bool:
        if self.prompt_tokens is None and b"message_start" in event:
            data = data_of(event)
            message = data.get("message") if isinstance(data, dict) else None
            if isinstance(message, dict):
                self.prompt_tokens = prompt_of(message.get("usage"))
        return True


class AnthropicDialect:
    """Anthropic Messages."""

    name = ANTHROPIC
    forwarded: tuple[str, ...] = ("anthropic-version", "anthropic-beta")

    def __init__(self, settings: Settings) -> None:
        root = settings.anthropic_base_url.rstrip("/").removesuffix("/v1") + "/v1"
        self.upstream = Upstream(ANTHROPIC, root, secret(settings.anthropic_api_key))
        self.conversions = Conversions(max_bytes=settings.proxy_body_cache_mb * 1024 * 1024)

    def asked(self, path: str, query: str, body: Mapping[str, Any]) -> Asked:
        return asked_in_body(path, body)

    def transcript(
        self, body: Mapping[str, Any], check: Callable[[Any], list[Message]]
    ) -> tuple[list[Message], list[ToolSpec]]:
        given = body.get("messages")
        if not isinstance(given, list):
            raise InvalidTranscript("'messages' must be a list")
        system = body.get("system")
        if self.conversions.max_bytes == 0:  # off: converted whole, markers and all
            converted = from_anthropic(system, given)
            return self._valid(system, given, converted, check), tools_of(body)
        check_system(system)
        groups = self.conversions.convert(given)
        head: list[Message] = [] if system is None else [{"role": "system", "content": system}]
        messages = self._valid(system, given, [*head, *(m for g in groups for m in g)], check)
        self.conversions.adopt(given, messages[len(head) :])
        return messages, tools_of(body)

    def _valid(
        self,
        system: Any,
        given: list[Any],
        messages: list[Message],
        check: Callable[[Any], list[Message]],
    ) -> list[Message]:
        """`check(messages)`; its error names the Anthropic message at fault."""
        try:  # what converts may still break prefit's own rules (a call left unanswered)
            messages = check(messages)
        except InvalidTranscript as exc:
            at = source_index(system, given, exc.index)
            raise InvalidTranscript(exc.reason, at) from None
        return messages

    def with_messages(self, body: Mapping[str, Any], messages: list[Message]) -> dict[str, Any]:
        system, converted = to_anthropic(messages, sent=self.conversions.sent(body.get("messages")))
        out = {**body, "messages": converted}
        if system is None:
            out.pop("system", None)
        else:
            out["system"] = system
        return out

    def auth(self, key: str) -> dict[str, str]:
        return {"x-api-key": key}

    def defaults(self) -> dict[str, str]:
        return {"anthropic-version": API_VERSION}

    def streamed(self, body: Mapping[str, Any]) -> tuple[dict[str, Any] | None, bool]:
        return None, False  # message_start always carries the usage

    def tap(self, strip: bool) -> Tap:
        return StartTap()

    def prompt_tokens(self, answer: Any) -> int | None:
        return prompt_of(answer.get("usage")) if isinstance(answer, dict) else None

    def counted(self, answer: Any) -> int | None:
        return prompt_of(answer)  # `{"input_tokens": N}`

    def overflow(self, status: int, answer: Any) -> Overflow | None:
        if status not in (400, 413):
            return None
        return anthropic_figures(error_fields(answer)[1])  # no message: "", no overflow

    def error(self, status: int, message: str) -> dict[str, Any]:
        kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}
