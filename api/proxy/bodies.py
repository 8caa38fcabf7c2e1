"""Request bodies that resend an earlier one's messages, parsed from where they differ.

The proxy's (api/proxy/services.py holds one per app, bounded by
`PREFIT_PROXY_BODY_CACHE_MB`): an agent resends its whole conversation every turn, and
parsing 2 MB of JSON on each is most of what the proxy would add to it (docs/benchmarks.md).
"""

from __future__ import annotations

import bisect
import dataclasses
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from api.codec import STRICT, loads

# what a kept body holds per byte of it: the bytes and its parsed messages (orjson objects:
# 1.5-1.65x the JSON, measured with tracemalloc on a 1.9 MB body), with room to spare
WEIGHT = 3
KEY_BYTES = 512  # of a body's beginning (model, opening messages): which earlier one it may resend
MIN_BODY = 64 * 1024  # smaller bodies parse in well under a millisecond: not worth keeping
_STEP = 1 << 16
_DECODER = STRICT  # a resent body's new messages: refused as `loads` refuses them
_WHITESPACE = frozenset(" \t\n\r")


@dataclass(frozen=True)
class _Known:
    """A body parsed before: its bytes, its top-level fields before `messages`, its messages,
    and where each message ends in the bytes."""

    raw: bytes
    before: dict[str, Any]
    messages: list[Any]
    ends: list[int]


class ResentBodies:
    """Parses a request body that resends an earlier one's messages from where it differs.

    Agents resend the whole conversation every turn (2 MB at 512k tokens), as the same bytes
    up to its last turn or two. The bodies parsed last are kept per tenant and opening, with
    where each message ends in their bytes; a new body is compared with them byte for byte
    (memcmp, stops at the first difference), and only what follows the last whole message
    they share is parsed: the earlier messages are the earlier body's own objects, equal by
    the bytes they were parsed from. A body that is not JSON, or differs before its first
    message, is parsed whole (`loads`); its message ends are found after the answer
    (`remember`, on the threadpool), so the next turn is parsed from its new messages.

    Bounded by bodies and by memory (`max_bytes`, each body weighed `WEIGHT` times its
    length: its bytes and its parsed objects); one tenant holds at most `tenant_share` of
    it, its own oldest bodies going first, so that it cannot push the others out.
    """

    def __init__(
        self,
        max_bodies: int = 256,
        max_bytes: int = 256 * 1024 * 1024,
        tenant_share: float = 0.5,
    ) -> None:
        self.max_bodies = max_bodies
        self.max_bytes = max_bytes
        self.tenant_share = tenant_share
        self._known: OrderedDict[tuple[str, bytes], _Known] = OrderedDict()
        self._bytes = 0
        self._by_tenant: dict[str, int] = {}
        self._lock = threading.Lock()

    def loads(self, tenant: str, raw: bytes) -> tuple[Any, bool]:
        """The JSON value of `raw` (as `loads`), and whether `remember` should learn it."""
        if len(raw) < MIN_BODY:
            return loads(raw), False
        key = (tenant, raw[:KEY_BYTES])
        with self._lock:
            known = self._known.get(key)
        if known is not None:
            value = _resent(known, raw)
            if value is not None:
                self._keep(key, value[1])
                return value[0], False
        return loads(raw), True

    def remember(self, tenant: str, raw: bytes, value: Any) -> None:
        """Learn where `raw`'s messages end, for the bodies that will resend them (sync);
        `value` is what `loads` made of `raw`, to check the scan against."""
        known = _scanned(raw, value)
        if known is not None:
            self._keep((tenant, raw[:KEY_BYTES]), known)

    def adopt(self, tenant: str, raw: bytes, messages: list[Any]) -> None:
        """Keep `messages`, equal by content to those parsed from `raw` (the stored
        conversation's own objects, `ConversationCache.shared`), in their place: the next
        body then hands the store its own objects back, compared by identity."""
        key = (tenant, raw[:KEY_BYTES])
        with self._lock:
            known = self._known.get(key)
        if known is not None and known.raw is raw and len(known.messages) == len(messages):
            self._keep(key, dataclasses.replace(known, messages=list(messages)))

    def _keep(self, key: tuple[str, bytes], known: _Known) -> None:
        tenant = key[0]
        with self._lock:
            old = self._known.pop(key, None)
            if old is not None:
                self._weigh(tenant, -len(old.raw))
            if len(known.raw) * WEIGHT > self.max_bytes * self.tenant_share:
                return
            self._known[key] = known
            self._weigh(tenant, len(known.raw))
            while self._by_tenant[tenant] > self.max_bytes * self.tenant_share:
                self._drop(next(k for k in self._known if k[0] == tenant))
            while len(self._known) > self.max_bodies or self._bytes > self.max_bytes:
                self._drop(next(iter(self._known)))

    def _drop(self, key: tuple[str, bytes]) -> None:
        self._weigh(key[0], -len(self._known.pop(key).raw))

    def _weigh(self, tenant: str, length: int) -> None:
        self._bytes += length * WEIGHT
        held = self._by_tenant.get(tenant, 0) + length * WEIGHT
        if held:
            self._by_tenant[tenant] = held
        else:
            self._by_tenant.pop(tenant, None)


def _common(a: bytes, b: bytes) -> int:
    """The length of the bytes `a` and `b` begin with alike (memcmp by 64 kB, then halving)."""
    n, lo = min(len(a), len(b)), 0
    while lo + _STEP <= n and a[lo : lo + _STEP] == b[lo : lo + _STEP]:
        lo += _STEP
    hi = min(n, lo + _STEP)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _resent(known: _Known, raw: bytes) -> tuple[dict[str, Any], _Known] | None:
    """`raw`'s value when it begins with whole messages of `known` (None: parse it whole)."""
    k = bisect.bisect_right(known.ends, _common(known.raw, raw))
    if k == 0:
        return None
    start = known.ends[k - 1]  # past a message inside the top-level `messages`, as in `raw`
    try:
        tail = _scanned_from(raw[start:].decode(), 0, start)
    except (ValueError, IndexError, RecursionError):  # not JSON: `loads` says precisely why
        return None
    if tail is None:
        return None
    messages, ends, after = tail
    value = {**known.before, "messages": [*known.messages[:k], *messages], **after}
    return value, _Known(raw, known.before, value["messages"], [*known.ends[:k], *ends])


def _scanned(raw: bytes, value: Any) -> _Known | None:
    """`raw` parsed message by message, with where each ends; None unless it is a JSON object
    whose `messages` is a non-empty list of objects and the scan gives `value`, what `loads`
    made of it."""
    try:
        text = raw.decode()
        at = text.index('"messages"')
        bracket = _skip(text, text.index(":", at) + 1)
        if text[bracket] != "[":
            return None
        before = _DECODER.decode(text[:at].rstrip().rstrip(",") + "}")
        found = _scanned_from(text, bracket + 1, 0, first=True)
    except (ValueError, IndexError, RecursionError):
        return None
    if found is None or not found[0] or not isinstance(before, dict):
        return None
    messages, ends, after = found
    if {**before, "messages": messages, **after} != value:  # `"messages"` inside a string
        return None
    return _Known(raw, before, messages, ends)


def _scanned_from(
    text: str, at: int, base: int, *, first: bool = False
) -> tuple[list[Any], list[int], dict[str, Any]] | None:
    """The messages from `at` in `text` (the body's text from its byte `base`): just past a
    message, or past the list's `[` when `first`; with the byte offset past each, and the
    top-level fields after the list."""
    ascii = text.isascii()
    messages: list[Any] = []
    ends: list[int] = []
    i, chars, size = at, at, base + (at if ascii else len(text[:at].encode()))
    while True:
        i = _skip(text, i)
        if text[i] == "]":
            break
        if messages or not first:
            if text[i] != ",":
                raise ValueError("expected ',' between messages")
            i = _skip(text, i + 1)
        value, i = _DECODER.raw_decode(text, i)
        if not isinstance(value, dict):
            return None
        size += i - chars if ascii else len(text[chars:i].encode())
        chars = i
        messages.append(value)
        ends.append(size)
    rest = text[_skip(text, i + 1) :]
    if rest[:1] not in (",", "}"):
        raise ValueError("expected ',' or '}' after the messages")
    after = _DECODER.decode("{" + rest[1:] if rest[0] == "," else "{" + rest)
    return messages, ends, after


def _skip(text: str, i: int) -> int:
    """The first offset from `i` that is not JSON whitespace."""
    while text[i] in _WHITESPACE:
        i += 1
    return i
