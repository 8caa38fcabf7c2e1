"""Small helpers shared by the API tests: conversation ids and request bodies."""

from __future__ import annotations

import uuid
from typing import Any

from shared.messages import Message


def conv_id() -> str:
    return f"c-{uuid.uuid4().hex[:10]}"


def body(messages: list[Message], model: str, **extra: Any) -> dict[str, Any]:
    return {"messages": messages, "model": model, **extra}
