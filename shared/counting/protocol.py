"""What a token counter must offer, and what prefit derives from one that offers only that.

The reference's `TokenCounter` is a protocol with one method, `count(messages, tools=(),
model=None)`. prefit's strategies and planning also size single messages and the tool specs
(`MessageCounter`); a counter written from the reference gets those derived from its own
`count` by `per_message`, cached by content as the built-in counters are:

    count_message(m) = count([m]) - count([])      count_tools(t) = count([], t) - count([])

so whatever framing the counter adds per request is counted once, not per message. The
built-in counters implement `MessageCounter` directly (faster, and exact by construction).
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from shared.counting.cache import CountCache
from shared.counting.messagekeys import message_key
from shared.errors import ConfigError, PrefitError
from shared.messages import Message, ToolSpec

MAX_MODELS = 16  # per-model caches a derived counter keeps (least recently used go first)


@runtime_checkable
class TokenCounter(Protocol):
    """Counts the prompt tokens of messages plus tool specs (the reference's protocol)."""

    def count(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] = (), model: str | None = None
    ) -> int:
        """Tokens for sending `messages` with `tools` to `model`."""
        ...


@runtime_checkable
class MessageCounter(TokenCounter, Protocol):
    """A `TokenCounter` that also sizes one message and the tool specs on their own."""

    def count_message(self, message: Message, model: str | None = None) -> int:
        """Tokens of one message, overheads included (cached by content)."""
        ...

    def count_tools(self, tools: Sequence[ToolSpec], model: str | None = None) -> int:
        """Tokens of the tool specs."""
        ...


def per_message(counter: TokenCounter) -> MessageCounter:
    """`counter` itself when it sizes messages and tools, else `CountOnly(counter)`."""
    if isinstance(counter, MessageCounter):
        return counter
    if not callable(getattr(counter, "count", None)):
        raise ConfigError(f"a token counter needs a count() method, got {type(counter).__name__}")
    return CountOnly(counter)


class CountOnly:
    """`MessageCounter` on top of a counter that only has `count` (see the module docstring)."""

    def __init__(self, inner: TokenCounter) -> None:
        self.inner = inner
        self._caches: OrderedDict[str | None, CountCache] = OrderedDict()
        self._empty: dict[str | None, int] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"CountOnly({self.inner!r})"

    def count(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] = (), model: str | None = None
    ) -> int:
        return self._number(self.inner.count(messages, tools, model))

    def count_message(self, message: Message, model: str | None = None) -> int:
        cache = self._cache(model)
        try:
            key = message_key(message)
            found = cache.get(key)
        except TypeError:  # an unhashable field: count it, cache nothing
            return self._alone([message], (), model)
        if found is None:
            found = self._alone([message], (), model)
            cache.put(key, found)
        return found

    def count_tools(self, tools: Sequence[ToolSpec], model: str | None = None) -> int:
        return self._alone([], tools, model) if tools else 0

    def _alone(self, messages: list[Message], tools: Sequence[ToolSpec], model: str | None) -> int:
        try:
            alone = self.inner.count(messages, tools, model)
        except PrefitError:
            raise
        except Exception as exc:  # e.g. a chat template that wants a user message first
            what = "one message" if messages else "the tool specs"
            raise ConfigError(
                f"token counter {type(self.inner).__name__} failed to count {what} on its own "
                f"({type(exc).__name__}: {exc}); prefit sizes messages one by one"
            ) from exc
        return max(0, self._number(alone) - self._base(model))

    def _base(self, model: str | None) -> int:
        """What the counter adds per request: its count of no messages; 0 when it cannot
        count no messages (a provider's endpoint that wants one), which over-counts."""
        found = self._empty.get(model)
        if found is None:
            try:
                found = self._number(self.inner.count([], (), model))
            except PrefitError:
                raise
            except Exception:
                found = 0
            self._empty[model] = found
        return found

    def _number(self, value: object) -> int:
        """A count as an int (a fractional one rounded up); `ConfigError` if not a count."""
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        if isinstance(value, float) and math.isfinite(value) and value >= 0:
            return math.ceil(value)
        raise ConfigError(
            f"token counter {type(self.inner).__name__}.count() must return a number >= 0, "
            f"got {type(value).__name__}"
        )

    def _cache(self, model: str | None) -> CountCache:
        with self._lock:
            cache = self._caches.get(model)
            if cache is None:
                cache = self._caches[model] = CountCache()
                while len(self._caches) > MAX_MODELS:
                    evicted, _ = self._caches.popitem(last=False)
                    self._empty.pop(evicted, None)
            else:
                self._caches.move_to_end(model)
            return cache
