"""TruncateToolResults: shorten any single huge tool output, keeping its start and end."""

from __future__ import annotations

from typing import Any

from shared.errors import ConfigError
from shared.messages import Message
from shared.strategies.work import Work


def cut_text(text: str, max_chars: int, head: float) -> str:
    """`text` shortened to about `max_chars`, keeping its start and end and saying what was cut
    (`head`: the share of `max_chars` kept from the start)."""
    if len(text) <= max_chars:
        return text
    keep_head = int(max_chars * head)
    keep_tail = max_chars - keep_head
    cut = len(text) - max_chars
    tail = text[len(text) - keep_tail :] if keep_tail else ""
    return f"{text[:keep_head]}\n[... {cut} characters cut to save context ...]\n{tail}"


class TruncateToolResults:
    """Shorten any single tool result longer than `max_chars`, keeping its start and end.

    Lossless in structure, lossy only inside very large outputs (a whole file, a big query
    result). Only `tool` messages' text is shortened (each text part on its own).

    - max_chars: the longest text a tool result keeps (8000); a longer one is cut to that
      many characters plus a line saying how many were cut;
    - head: the share of `max_chars` kept from the start, the rest from the end (0.7,
      within [0, 1]).
    """

    def __init__(self, max_chars: int = 8000, head: float = 0.7) -> None:
        if max_chars <= 0:
            raise ConfigError(f"max_chars must be positive, got {max_chars}")
        if not 0.0 <= head <= 1.0:
            raise ConfigError(f"head must be within [0, 1], got {head}")
        self.max_chars = max_chars
        self.head = head

    def __repr__(self) -> str:
        return f"TruncateToolResults(max_chars={self.max_chars}, head={self.head})"

    def shorten(self, m: Message) -> Message | None:
        """`m` with its huge text shortened, or None when nothing in it is over `max_chars`."""
        content = m.get("content")
        if isinstance(content, str):
            if len(content) <= self.max_chars:
                return None
            return {**m, "content": cut_text(content, self.max_chars, self.head)}
        if isinstance(content, list):
            parts: list[Any] = []
            changed = False
            for p in content:
                if isinstance(p, dict) and p.get("type") == "text":
                    text = p.get("text", "")
                    if len(text) > self.max_chars:
                        p = {**p, "text": cut_text(text, self.max_chars, self.head)}
                        changed = True
                parts.append(p)
            return {**m, "content": parts} if changed else None
        return None

    async def apply(self, work: Work) -> None:
        work.align()
        before = work.tokens()
        out: list[Message] = []
        shortened = 0
        for m in work.messages:
            short = self.shorten(m) if m.get("role") == "tool" else None
            if short is not None:
                shortened += 1
            out.append(short if short is not None else m)
        if shortened:
            work.replace(out, work.origin)
            work.record("TruncateToolResults", before, messages=shortened)
