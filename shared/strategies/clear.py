"""ClearToolResults: replace old tool outputs with a placeholder, keeping the calls."""

from __future__ import annotations

from shared.errors import ConfigError
from shared.strategies.work import Work

PLACEHOLDER = "[tool result removed to save context]"


class ClearToolResults:
    """Replace the content of all but the most recent `keep_last` tool results.

    The calls stay, so the model still knows what it did and can call the tool again; only
    the bulky output goes. Tool results of the protected recent tail are never cleared,
    whatever `keep_last` says.

    - keep_last: how many of the most recent tool results keep their content (4, >= 0);
    - placeholder: the content that replaces the others'
      (`"[tool result removed to save context]"`).
    """

    def __init__(self, keep_last: int = 4, placeholder: str = PLACEHOLDER) -> None:
        if keep_last < 0:
            raise ConfigError(f"keep_last must be >= 0, got {keep_last}")
        self.keep_last = keep_last
        self.placeholder = placeholder

    def __repr__(self) -> str:
        return f"ClearToolResults(keep_last={self.keep_last})"

    async def apply(self, work: Work) -> None:
        work.align()
        positions = [i for i, m in enumerate(work.messages) if m.get("role") == "tool"]
        old = positions[: max(0, len(positions) - self.keep_last)]
        targets = [
            i
            for i in old
            if not work.protected(i) and work.messages[i].get("content") != self.placeholder
        ]
        if not targets:
            return
        before = work.tokens()
        out = list(work.messages)
        for i in targets:
            out[i] = {**out[i], "content": self.placeholder}
        work.replace(out, work.origin)
        work.record("ClearToolResults", before, messages=len(targets))
