"""JSON of the API's bodies and stored messages: orjson, falling back on the stdlib.

Shared by the proxy (its request and answer bodies), the conversation cache (stored
messages) and the prepare payloads. A proxied request carries the whole conversation (half
a megabyte at 128k tokens) and is read, and often written again, on every turn: orjson
does both several times faster than the stdlib. It reads an integer past 64 bits as a
float, which would change that field when the body is written again: a request whose
fields outside the transcript hold such a number is read again by the stdlib. (Inside the
messages, input items or contents numbers are block indices and the like, far from 64 bits;
walking them costs 15-60 ms a turn for a 0.5-2 MB Responses body.) A body that resends an
earlier one's messages (an agent's, every turn) is parsed only from where it differs from
it (api/proxy/bodies.py, with `STRICT`, the decoder `loads` falls back on).

Strict JSON in (RFC 8259): `NaN`, `Infinity`, a number too large for a double (`1e400`)
and an integer of more than `MAX_INT_DIGITS` digits are refused (`NotStrictJSON`, naming
where in the body: `messages[3].content[0].weight`), on the explicit API and the proxy
alike, so nothing stored or forwarded holds what strict parsers reject (and no integer is
big enough to cost quadratic time to read). Strict JSON out follows: what comes in is
what is served.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import Request, Response
from fastapi.routing import APIRoute

_BIG = float(2**63)
# the transcript's fields: Chat and Messages, the Responses API's items, Gemini's contents
_TRANSCRIPT = frozenset({"messages", "system", "input", "contents"})
# past 128 bits (39 digits) a number is neither an id nor a count; reading a 5,000-digit
# one costs quadratic time, and the stdlib refuses 4,300 digits with a bare ValueError
MAX_INT_DIGITS = 40
# where an integer past the bound may be: a run of more digits, found in C on the body with
# every digit made "0" and the rest " " (~1.4 ms for 0.5 MB; the regex `\d{41}` took 40-70 ms
# on agents' digit-rich transcripts); the stdlib then says
_DIGITS = bytes(48 if 48 <= i <= 57 else 32 for i in range(256))
_LONG_RUN = b"0" * (MAX_INT_DIGITS + 1)


class NotStrictJSON(ValueError):
    """A JSON number strict parsers reject (NaN, Infinity, out of range), and where it is."""

    def __init__(self, what: str, where: str) -> None:
        self.what = what
        self.where = where
        super().__init__(f"{what} at {where}")


@dataclass(frozen=True)
class _Rejected:
    """Stands for a rejected number while the body is walked for where it is."""

    what: str


class _Refused(ValueError):
    """A rejected number met by the strict decoder (its place is found afterwards)."""


def _refuse_constant(name: str) -> Any:
    raise _Refused(name)


def _strict_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _Refused(text)
    return int(text)


def _strict_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(text)
    return value


def _marked_int(text: str) -> Any:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        return _Rejected(f"an integer of {digits} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _marked_float(text: str) -> Any:
    value = float(text)
    return value if math.isfinite(value) else _Rejected(f"{text[:20]} (out of a double's range)")


def _marked_constant(name: str) -> Any:
    return _Rejected(f"{name} (JSON has no NaN or Infinity)")


STRICT = json.JSONDecoder(
    parse_constant=_refuse_constant, parse_int=_strict_int, parse_float=_strict_float
)
_MARKED = json.JSONDecoder(
    parse_constant=_marked_constant, parse_int=_marked_int, parse_float=_marked_float
)


def _strict_stdlib(raw: bytes | str) -> Any:
    """`raw` parsed by the stdlib, strictly (`NotStrictJSON` naming where)."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    try:
        return STRICT.decode(text)
    except _Refused:
        pass
    except RecursionError:  # orjson stops at 1,024 levels, the stdlib at the stack
        raise ValueError("it is nested too deeply (over 1,024 levels)") from None
    raise _located(_MARKED.decode(text))


def _located(value: Any) -> NotStrictJSON:
    """The first rejected number in `value` (document order), with its JSON path."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, _Rejected):
            return NotStrictJSON(item.what, path or "the top level")
        if isinstance(item, dict):
            stack.extend((f"{path}.{k}" if path else str(k), v) for k, v in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", v) for i, v in reversed(list(enumerate(item))))
    return NotStrictJSON("a number strict JSON refuses", "an unknown place")


def loads(raw: bytes | str, *, strict: bool = True) -> Any:
    """The JSON value of `raw` (`ValueError` if it is not JSON; `NotStrictJSON`, a
    `ValueError`, for what strict JSON refuses). `strict=False` reads what was stored
    before the rule (NaN as the stdlib reads it)."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        if not strict:
            return json.loads(raw)
        return _strict_stdlib(raw)  # raises ValueError for what is not JSON at all
    if strict and _LONG_RUN in (raw if isinstance(raw, bytes) else raw.encode()).translate(_DIGITS):
        return _strict_stdlib(raw)  # orjson read it as a double; maybe only a string's digits
    if isinstance(value, dict) and any(
        _has_big(v) for k, v in value.items() if k not in _TRANSCRIPT
    ):
        return _strict_stdlib(raw) if strict else json.loads(raw)
    return value


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON of `value`, keys in their order."""
    try:
        return orjson.dumps(value)
    except TypeError:  # an integer past 64 bits
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def _has_big(value: Any) -> bool:
    """Whether `value` holds a float as large as an integer orjson would not keep exact."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and abs(item) >= _BIG:
            return True
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


# --- the explicit API's bodies ------------------------------------------------------------


class StrictRequest(Request):
    """A request whose JSON body is read by `loads`: strict, and orjson's speed."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = loads(await self.body())
        return self._json


class StrictRoute(APIRoute):
    """A route whose body is parsed by `StrictRequest` (FastAPI's own reader takes NaN)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(StrictRequest(request.scope, request.receive))

        return strict
