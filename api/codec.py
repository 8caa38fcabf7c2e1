"""JSON of the API's bodies and stored messages: orjson, falling back on the stdlib.

Shared by the proxy (its request and answer bodies), the conversation cache (stored
messages) and the prepare payloads. A proxied request carries the whole conversation (half
a megabyte at 128k tokens) and is read, and often written again, on every turn: orjson
does both several times faster than the stdlib. It refuses NaN (the stdlib reads it) and
reads an integer past 64 bits as a float, which would change that field when the body is
written again: a request whose fields outside the transcript hold such a number is read
again by the stdlib. (Inside the messages numbers are block indices and the like, far from
64 bits.) A body that resends an earlier one's messages (an agent's, every turn) is parsed
only from where it differs from it (api/proxy/bodies.py).
"""

from __future__ import annotations

import json
from typing import Any

import orjson

_BIG = float(2**63)
_TRANSCRIPT = frozenset({"messages", "system"})


def loads(raw: bytes) -> Any:
    """The JSON value of `raw` (`ValueError` if it is not JSON)."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        try:
            return json.loads(raw)  # raises ValueError for what is not JSON at all
        except RecursionError:  # orjson stops at 1,024 levels, the stdlib at the stack
            raise ValueError("nested too deeply (over 1,024 levels)") from None
    if isinstance(value, dict) and any(
        _has_big(v) for k, v in value.items() if k not in _TRANSCRIPT
    ):
        return json.loads(raw)
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
