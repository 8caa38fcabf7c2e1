"""Token counters: what a request will cost in prompt tokens, cheap enough to run on every call.

A message counts `per_message` (the chat format's framing) plus its role, content, `name`,
`tool_call_id` and each tool call's name and arguments, plus `per_tool_call` per call and
`NON_TEXT_PART_TOKENS` per non-text content part (an image, audio, a file). A request counts
its messages, its tool specs (their canonical JSON) and the counter's `priming`:

    count(messages, tools) == sum(count_message(m) for m in messages) + count_tools(tools) + priming

Counts are remembered by content, never by object identity, at two levels: the transcript
counted last is kept as private copies (`RecentTranscript`), so the same transcript, or one
grown by a message, is matched by C-level list equality; any other message is looked up by
its content key (`message_key`) in a bounded `CountCache`. Either way only new content is
tokenized. Calibration (`CalibratedCounter`, `RatioStore`, ...) lives in
shared/counting/calibration.py, which builds on these counters.
"""

from __future__ import annotations

import copy
import json
import math
import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from operator import countOf, itemgetter
from pathlib import Path
from typing import cast

from shared.counting.cache import CountCache, RecentTranscript, missing
from shared.counting.encodings import load_encoding
from shared.counting.messagekeys import Key, KeyFields, checked_key, fields, message_key
from shared.counting.protocol import CountOnly, MessageCounter, TokenCounter, per_message
from shared.errors import ConfigError, InvalidTranscript
from shared.messages import Message, ToolSpec

__all__ = [
    "ASTRAL_TOKENS",
    "DENSE_CHARS_PER_TOKEN",
    "HEX_CHARS_PER_TOKEN",
    "NON_ASCII_BYTE_TOKENS",
    "NON_TEXT_PART_TOKENS",
    "NUMBER_CHARS_PER_TOKEN",
    "CountCache",
    "CountOnly",
    "HeuristicCounter",
    "MessageCounter",
    "TiktokenCounter",
    "TokenCounter",
    "message_key",
    "per_message",
    "tools_json",
]

# Any non-text part (image, audio, file) counts this much: the most one image costs on the
# major providers (Anthropic caps an image near 1,600 tokens; OpenAI's high-detail gpt-4o
# images stay under 1,105). Erring high is the safe direction for a budget.
NON_TEXT_PART_TOKENS = 1600
# HeuristicCounter's tokens for text beyond ASCII, on top of chars / chars_per_token: per
# UTF-8 byte past the first of a character (Cyrillic 2 bytes, CJK 3), and per character
# outside the BMP (emoji; 4 bytes). Fitted on cl100k_base, the hungriest common encoding.
NON_ASCII_BYTE_TOKENS = 0.5
ASTRAL_TOKENS = 2.5
# HeuristicCounter's densities for runs of ASCII that are not words, which BPE splits into
# one- and two-character pieces. A run starts at a digit: of [0-9a-f-] or [0-9A-F-], 16
# characters or more with a letter (hex digests, UUIDs: 1.55-1.7 characters a token in
# o200k_base and cl100k_base); else of [A-Za-z0-9+/=_-], 16 or more with at least three
# groups of digits between other characters (base64, generated ids: 1.4-1.6); else of 5 or
# more digits and [.,:/+-] (numbers, dates, times, versions: digits go by three at most and
# each separator is a token of its own). Measured with bench/counting_density.py.
HEX_CHARS_PER_TOKEN = 1.55
DENSE_CHARS_PER_TOKEN = 1.4
NUMBER_CHARS_PER_TOKEN = 1.8
# One scan finds the three kinds, trying only where a group of digits starts (no position
# is tried twice, and text without digits is skipped at C speed); possessive quantifiers
# keep it linear. Groups: the rest of a hex, a dense and a number run (one is not empty).
_DENSE_RUN = re.compile(
    r"[0-9](?<![0-9]{2})"
    r"(?:(?=[0-9-]*+[a-fA-F])(?=[0-9a-f-]{15}|[0-9A-F-]{15})"
    r"([0-9a-f-]*+|[0-9A-F-]*+)(?![A-Za-z0-9+/=_])"
    r"|(?=[A-Za-z0-9+/=_-]{15})([0-9]*+(?:[A-Za-z+/=_-]++[0-9]++){2}[A-Za-z0-9+/=_-]*+)"
    r"|([0-9.,:/+-]{4,}+))"
)
_SHORTEST_RUN = 5


class CachedCounter(ABC):
    """A counter whose per-message count is a pure function of `message_key(message)`.

    - cache: where the per-message counts are kept (None: a `CountCache()` of its own);
      counts are keyed by content alone, so share one only among counters of the same kind
      and settings.
    """

    priming = 0  # tokens added once per request (the reply's start)

    def __init__(self, cache: CountCache | None) -> None:
        self.cache = cache if cache is not None else CountCache()
        self.recent = RecentTranscript()
        self._last_tools: tuple[list[ToolSpec], int] | None = None

    @abstractmethod
    def _measure(self, parts: KeyFields) -> int:
        """Tokens of one message given its counted fields."""

    @abstractmethod
    def _tools_tokens(self, spec_json: str) -> int:
        """Tokens of the canonical JSON of a request's tool specs."""

    def count(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] = (), model: str | None = None
    ) -> int:
        """Tokens for sending `messages` with `tools`: known messages cost next to nothing.

        `model` is taken for the `TokenCounter` protocol; these counts do not depend on it.
        """
        return sum(self.message_counts(messages)) + self.count_tools(tools, model) + self.priming

    def message_counts(self, messages: Sequence[Message], model: str | None = None) -> list[int]:
        """`[count_message(m) for m in messages]`, at the cost of one count()."""
        msgs = messages if type(messages) is list else list(messages)
        known = self.recent.known(msgs)
        k = len(known)
        counts = known + self._by_key(msgs, k) if k < len(msgs) else known
        self.recent.remember(msgs, k, counts)
        return counts

    def count_message(self, message: Message, model: str | None = None) -> int:
        """Tokens of one message, overheads included (cached by content)."""
        try:
            key = message_key(message)
            found = self.cache.get(key)
            return found if found is not None else self._cached_measure(key)
        except (AttributeError, TypeError, InvalidTranscript):
            fields(checked_key(message))  # raises the precise reason
            raise

    def _by_key(self, messages: list[Message], start: int) -> list[int]:
        """Counts of `messages[start:]` through the content-keyed cache."""
        try:
            keys = list(map(message_key, messages[start:]))
            values = self.cache.get_many(keys)
            if None in values:
                for i in missing(values):
                    values[i] = self._cached_measure(keys[i])
        except (AttributeError, TypeError, InvalidTranscript):  # say which message is at fault
            raise _fault(messages, start) from None
        return cast(list[int], values)

    def count_tools(self, tools: Sequence[ToolSpec], model: str | None = None) -> int:
        """Tokens of the tool specs: their canonical JSON; 0 when there are none.

        The last specs seen are remembered (a deep copy): a request's tools rarely change,
        and comparing them to the copy costs a few microseconds where JSON costs hundreds.
        """
        if not tools:
            return 0
        specs = list(tools)
        last = self._last_tools
        if last is not None and last[0] == specs:
            return last[1]
        tokens = self._tools_tokens(tools_json(specs))
        try:
            self._last_tools = (copy.deepcopy(specs), tokens)
        except RecursionError:  # nested deeper than copy can go (JSON went): not remembered
            self._last_tools = None
        return tokens

    def _cached_measure(self, key: Key) -> int:
        value = self._measure(fields(key))
        self.cache.put(key, value)
        return value


class HeuristicCounter(CachedCounter):
    """chars / chars_per_token (rounded up) plus fixed per-message and per-tool-call overheads.

    3.5 characters per token errs on the high side for English prose and is about right for
    code and JSON: it over-counts a little, the safe direction for a budget. Other scripts
    take far fewer characters per token (Chinese and Japanese about one token a character,
    emoji two or three), so characters beyond ASCII add `NON_ASCII_BYTE_TOKENS` per UTF-8
    byte past their first and `ASTRAL_TOKENS` each outside the BMP: within a few percent of
    cl100k_base for CJK, Cyrillic, Arabic, Devanagari and emoji, and over o200k_base (a
    `CalibratedCounter` settles the rest). ASCII that is no words at all takes fewer too,
    so its runs count at their own density instead of chars_per_token: hex runs (digests,
    UUIDs) at `HEX_CHARS_PER_TOKEN` (1.55), other runs of letters and digits mixed
    (base64, generated ids) at `DENSE_CHARS_PER_TOKEN` (1.4), runs of digits and [.,:/+-]
    (numbers, dates, versions) at `NUMBER_CHARS_PER_TOKEN` (1.8); see those constants for
    what a run is. At 3.5 a token such text was under-counted about 2x against o200k_base
    (24 KB of SHA-256 lines: 6,384 for 12,732 tokens), faster than calibration can follow
    when a session's mix shifts; now it counts at or a little above o200k_base. Prose and
    code (few such runs) count within a few percent of before. A density at or above
    chars_per_token adds nothing. No priming.

    - chars_per_token: characters of ordinary text per token (3.5, a finite number > 0);
    - per_message: tokens each message adds for the chat format's framing (4, an int >= 0);
    - per_tool_call: tokens each tool call adds (8, an int >= 0);
    - cache: as for `CachedCounter`.
    """

    non_ascii_byte_tokens = NON_ASCII_BYTE_TOKENS
    astral_tokens = ASTRAL_TOKENS
    hex_chars_per_token = HEX_CHARS_PER_TOKEN
    dense_chars_per_token = DENSE_CHARS_PER_TOKEN
    number_chars_per_token = NUMBER_CHARS_PER_TOKEN

    def __init__(
        self,
        chars_per_token: float = 3.5,
        per_message: int = 4,
        per_tool_call: int = 8,
        *,
        cache: CountCache | None = None,
    ) -> None:
        if isinstance(chars_per_token, bool) or not isinstance(chars_per_token, int | float):
            raise ConfigError(f"chars_per_token must be a number, got {chars_per_token!r}")
        if not math.isfinite(chars_per_token) or chars_per_token <= 0:
            raise ConfigError(f"chars_per_token must be a finite number > 0, got {chars_per_token}")
        self.chars_per_token = float(chars_per_token)
        self.per_message = _overhead("per_message", per_message)
        self.per_tool_call = _overhead("per_tool_call", per_tool_call)
        # Tokens a hex, dense or number character adds over an ordinary one (never fewer).
        densities = (
            self.hex_chars_per_token,
            self.dense_chars_per_token,
            self.number_chars_per_token,
        )
        self._run_extra = tuple(max(0.0, 1 / d - 1 / self.chars_per_token) for d in densities)
        super().__init__(cache)

    def __repr__(self) -> str:
        return (
            f"HeuristicCounter(chars_per_token={self.chars_per_token}, "
            f"per_message={self.per_message}, per_tool_call={self.per_tool_call}, "
            f"non_ascii={self.non_ascii_byte_tokens}/{self.astral_tokens}, "
            f"runs={self.hex_chars_per_token}/{self.dense_chars_per_token}/"
            f"{self.number_chars_per_token})"
        )

    def _chars(self, texts: Sequence[str]) -> int:
        """Tokens of `texts`: characters / chars_per_token, more for dense runs and for
        characters beyond ASCII."""
        chars = 0
        extra = 0.0
        for text in texts:
            chars += len(text)
            if len(text) >= _SHORTEST_RUN:
                extra += self._runs(text)
            if not text.isascii():
                wide = len(text.encode("utf-8", "surrogatepass")) - len(text)
                astral = len(text.encode("utf-16-le", "surrogatepass")) // 2 - len(text)
                extra += self.non_ascii_byte_tokens * (wide - 3 * astral)
                extra += self.astral_tokens * astral
        return math.ceil(chars / self.chars_per_token + extra)

    def _runs(self, text: str) -> float:
        """Tokens that the hex, dense and number runs of `text` add to chars / chars_per_token."""
        runs = _DENSE_RUN.findall(text)
        if not runs:
            return 0.0
        extra = 0.0
        for kind, per_char in enumerate(self._run_extra):
            found = [*map(itemgetter(kind), runs)]
            # a run's first digit is outside its group; the run's other two groups are empty
            extra += per_char * (sum(map(len, found)) + len(found) - countOf(found, ""))
        return extra

    def _measure(self, parts: KeyFields) -> int:
        return (
            self.per_message
            + self._chars(parts.texts)
            + self.per_tool_call * parts.calls
            + NON_TEXT_PART_TOKENS * parts.non_text
        )

    def _tools_tokens(self, spec_json: str) -> int:
        return self._chars((spec_json,))


class TiktokenCounter(CachedCounter):
    """Exact token counts of the text with a tiktoken encoding, plus the chat format's framing.

    Framing, after OpenAI's cookbook (which uses 3 per message, 1 per `name`, 3 of priming):
    `per_message` per message (4 by default, as the reference: one token of margin), 1 more
    when a message has a `name`, `per_tool_call` per tool call (an estimate: no OpenAI ground
    truth to fit it), and `priming` = 3 per request for the reply's `<|start|>assistant<|message|>`.
    Other providers tokenize differently: wrap it in a `CalibratedCounter` for them.

    - encoding: the tiktoken encoding's name ("o200k_base", "cl100k_base", ...);
    - per_message: tokens each message adds (4, an int >= 0);
    - per_tool_call: tokens each tool call adds (8, an int >= 0);
    - directory: the folder of offline encoding files (None: `PREFIT_TIKTOKEN_DIR`, then
      `TIKTOKEN_CACHE_DIR`); with no file for the encoding there, tiktoken loads it itself;
    - cache: as for `CachedCounter`.
    """

    priming = 3
    name_tokens = 1

    def __init__(
        self,
        encoding: str = "o200k_base",
        per_message: int = 4,
        *,
        per_tool_call: int = 8,
        directory: Path | None = None,
        cache: CountCache | None = None,
    ) -> None:
        self.per_message = _overhead("per_message", per_message)
        self.per_tool_call = _overhead("per_tool_call", per_tool_call)
        self.encoding = load_encoding(encoding, directory)
        super().__init__(cache)

    def __repr__(self) -> str:
        return (
            f"TiktokenCounter(encoding={self.encoding.name!r}, per_message={self.per_message}, "
            f"per_tool_call={self.per_tool_call})"
        )

    def tokens(self, text: str) -> int:
        """Tokens of plain text (special-token markers in it count as ordinary text)."""
        return len(self.encoding.encode_ordinary(text)) if text else 0

    def _measure(self, parts: KeyFields) -> int:
        return (
            self.per_message
            + sum(map(self.tokens, parts.texts))
            + (self.name_tokens if parts.named else 0)
            + self.per_tool_call * parts.calls
            + NON_TEXT_PART_TOKENS * parts.non_text
        )

    def _tools_tokens(self, spec_json: str) -> int:
        key = (spec_json,)  # 1-tuples never collide with message keys (2 or 5 items)
        found = self.cache.get_many([key])[0]
        if found is None:
            found = self.tokens(spec_json)
            self.cache.put(key, found)
        return found


def tools_json(tools: Sequence[ToolSpec]) -> str:
    """The canonical JSON of tool specs that both counters measure."""
    try:
        return json.dumps(list(tools), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise InvalidTranscript(f"tool specs are not JSON: {exc}") from None


def _fault(messages: Sequence[Message], start: int = 0) -> InvalidTranscript:
    """The first malformed message, found the slow way (only once counting has failed)."""
    for i in range(start, len(messages)):
        try:
            fields(checked_key(messages[i]))
        except InvalidTranscript as exc:
            return InvalidTranscript(exc.reason, i)
    return InvalidTranscript("a message changed while it was being counted")


def _overhead(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{name} must be an integer >= 0, got {value!r}")
    return value
