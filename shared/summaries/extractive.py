"""The offline summarizer: deterministic notes picked out of the messages, no LLM.

What an agent needs to go on, in four sections (plus `Earlier:` for a previous summary
that was not written by this summarizer):

- Task/requests: the person's own messages (`is_request`: not a lone `<system-reminder>`,
  not the rest of a tool-result turn), verbatim (whitespace squashed to one line, markup
  tags dropped, each up to `max_request_chars`), not the context a client hands over and has
  acknowledged ("Ok."); a system message's first sentence(s);
- Actions: each assistant message's first line and each tool call as `name(args-abridged)`;
- Files: paths mentioned by the user, the assistant, tool-call arguments and error lines
  (not whole tool outputs: a `find` or `ls -R` lists many files nobody touched);
- Errors/open items: error lines of tool outputs and non-zero return codes;
- Current state/next step: the last line of the range's last assistant text (where it left
  off: agents end a step with what they will do next), only the latest.

The artifact index (shared/summaries/artifacts.py) is kept and shown after these sections by
`build_record`, not here.

Folding: the previous summary's items come first, the new range's after; an item seen
again moves to its latest place. Size: at most `max_tokens x 4` characters (4 characters
per token, the usual English average; the output is an estimate, so the caller's counter
decides). Over budget, the oldest item of the largest section goes first, and a line
`- (N earlier items omitted)` says so. The person's messages are given up last: they lose
items only beyond `REQUESTS_SHARE` of the budget or once every other section is empty, and
never the first and the latest (the marker then stands after the first). Same input, same
output.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Sequence
from typing import Any

from shared.errors import ConfigError
from shared.head import handed_over
from shared.messages import HEAD_ROLES, Message, is_request, text_of
from shared.summaries.llm import Completion

CHARS_PER_TOKEN = 4
EARLIER, TASK, ACTIONS, FILES = "Earlier", "Task/requests", "Actions", "Files"
ERRORS = "Errors/open items"
STATE = "Current state/next step"
ORDER = (EARLIER, TASK, ACTIONS, FILES, ERRORS, STATE)
EMPTY = "(nothing notable in this part of the conversation)"
MAX_PATHS_PER_MESSAGE = 20
MAX_ERRORS_PER_OUTPUT = 3
# the share of the budget the person's messages keep before any other section loses an item
REQUESTS_SHARE = 0.6

_HEADER = re.compile(r"^(" + "|".join(re.escape(s) for s in ORDER) + r"):$")
_OMITTED = re.compile(r"^- \((\d+) earlier items? omitted\)$")
TAG = re.compile(r"<!--.*?-->|</?[A-Za-z_][\w-]{0,40}\s*/?>", re.S)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_PATH = re.compile(
    r"(?<![\w/.:~@+-])(?:(?:~|\.{1,2})?/?[\w.@+-]+(?:/[\w.@+-]+)+"
    # a bare file name only with a common source/config extension ("e.g." is no file)
    r"|[A-Za-z_][\w-]*\.(?:py|pyi|ipynb|js|jsx|ts|tsx|json|ya?ml|toml|md|rst|txt|cfg|ini|c|h"
    r"|cc|cpp|hpp|rs|go|java|kt|rb|php|sh|sql|html|css|lock|csv|xml|proto)\b)"
)
_EXTENSION = re.compile(r"\.[A-Za-z][A-Za-z0-9]{0,7}$")
_EMPTY_ERROR_FIELD = re.compile(r'"errors?"\s*:\s*(?:""|null|\[\]|\{\}|false|0)', re.I)
_ERROR_LINE = re.compile(
    # "(?!\.\w)": errors.py and test_error.py are file names, not failures
    r"(?:\b\w*(?:Error|Exception)|traceback|\b(?:error|errors|failed|failure|fatal|panic|denied"
    r"|not found|no such file|segmentation fault|command not found))\b(?!\.\w)"
    r"|(?:returncode|exit code|exit status)\W{0,3}[1-9]",
    re.I,
)
# Source code shown by cat/grep mentions errors without anything having failed.
_CODE_LINE = re.compile(
    r"^\s*(?:[\w./-]+:)?(?:\d+[:\s-])?\s*(?:(?:raise|except|def|class|import|from|return|if"
    r"|elif|try|assert|with)\b|#|//|\*|@)"
)
_TRACE_FILE = re.compile(r'File "([^"\n]{1,200})", line \d+')


class ExtractiveSummarizer:
    """A `Summarizer` that needs no provider (used when none is configured).

    - max_chars_per_message: the longest note taken from one message (an assistant's first
      line, a tool call, an error line, a system message's first sentences; 240, >= 40);
    - max_request_chars: the longest a person's own message is quoted before it is abridged
      (1200, >= max_chars_per_message).
    """

    name = "extractive"

    def __init__(self, max_chars_per_message: int = 240, max_request_chars: int = 1200) -> None:
        if max_chars_per_message < 40:
            raise ConfigError(f"max_chars_per_message must be >= 40, got {max_chars_per_message}")
        if max_request_chars < max_chars_per_message:
            raise ConfigError(
                f"max_request_chars must be >= max_chars_per_message, got {max_request_chars}"
            )
        self.max_chars = max_chars_per_message
        self.max_request_chars = max_request_chars

    async def summarize(
        self, previous: str | None, messages: Sequence[Message], *, max_tokens: int, index: str = ""
    ) -> Completion:
        """`summarize_now` (`index` unused: the index is kept and shown by `build_record`)."""
        return self.summarize_now(previous, messages, max_tokens=max_tokens)

    def summarize_now(
        self, previous: str | None, messages: Sequence[Message], *, max_tokens: int
    ) -> Completion:
        """The same as `summarize`, without an event loop."""
        if max_tokens < 1:
            raise ConfigError(f"max_tokens must be >= 1, got {max_tokens}")
        notes = _Notes.parse(previous) if previous else _Notes()
        for section, item in self._items(messages):
            notes.add(section, item)
        state = _state(messages, self.max_chars)
        if state:  # only the latest: an earlier state is history, kept under Actions
            notes.items[STATE] = {state: None}
        text = notes.render(max_tokens * CHARS_PER_TOKEN)
        return Completion(text, 0, math.ceil(len(text) / CHARS_PER_TOKEN), 0.0, None)

    def _items(self, messages: Sequence[Message]) -> Iterator[tuple[str, str]]:
        call_names: dict[str, str] = {}
        for i, m in enumerate(messages):
            role, text = m.get("role"), text_of(m)
            if role == "tool":
                name = m.get("name") or call_names.get(str(m.get("tool_call_id")), "tool")
                yield from self._tool_result(str(name), text)
                continue
            yield from ((FILES, p) for p in _paths(text))
            if role == "assistant":
                yield from self._assistant(m, text, call_names)
            elif role in HEAD_ROLES and text.strip():
                prefix = f"{role}: "
                yield TASK, prefix + _first_sentences(text, self.max_chars - len(prefix))
            elif role == "user":  # the person's own words, unless context handed over
                if is_request(m) and not handed_over(messages, i):
                    yield TASK, abridge(squash(TAG.sub(" ", text)), self.max_request_chars)
            elif text.strip():  # a legacy function result: its first sentences, as before
                yield TASK, _first_sentences(text, self.max_chars)

    def _assistant(
        self, m: Message, text: str, call_names: dict[str, str]
    ) -> Iterator[tuple[str, str]]:
        line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
        if line:
            yield ACTIONS, abridge(squash(line), self.max_chars)
        call_names.clear()
        for call in m.get("tool_calls") or []:
            fn = call.get("function") or {}
            name = str(fn.get("name", "?"))
            call_names[str(call.get("id"))] = name
            args = fn.get("arguments", "")
            yield ACTIONS, _call(name, args, self.max_chars)
            yield from (
                (FILES, p) for p in _paths(args if isinstance(args, str) else json.dumps(args))
            )

    def _tool_result(self, name: str, text: str) -> Iterator[tuple[str, str]]:
        found = list(_error_lines(text))
        picked = found if len(found) <= MAX_ERRORS_PER_OUTPUT else [*found[:2], found[-1]]
        for line, start in picked:
            shown = line if len(line) <= self.max_chars else line[max(0, start - 40) :]
            yield ERRORS, abridge(f"{name}: {squash(shown)}", self.max_chars)
            yield from ((FILES, p) for p in _paths(line))
        yield from ((FILES, p) for p in _TRACE_FILE.findall(text)[-MAX_ERRORS_PER_OUTPUT:])


class _Notes:
    """Items per section, oldest first, each at its latest place (a builder, not a value)."""

    def __init__(self) -> None:
        self.items: dict[str, dict[str, None]] = {s: {} for s in ORDER}
        self.omitted: dict[str, int] = dict.fromkeys(ORDER, 0)

    @classmethod
    def parse(cls, previous: str) -> _Notes:
        notes, section = cls(), None
        for raw in previous.splitlines():
            line = raw.strip()
            header = _HEADER.match(line)
            if header:
                section = header.group(1)
            elif line and line != EMPTY:
                omitted = _OMITTED.match(line)
                if omitted and section:
                    notes.omitted[section] += int(omitted.group(1))
                elif section and line.startswith("- "):
                    notes.add(section, line[2:])
                else:  # a summary by another writer: keep its lines, whole
                    notes.add(EARLIER, squash(line.removeprefix("- ")))
        return notes

    def add(self, section: str, item: str) -> None:
        if not item:
            return
        items = self.items[section]
        items.pop(item, None)
        items[item] = None

    def render(self, budget: int) -> str:
        """The notes in at most `budget` characters: the fullest section loses its oldest
        first; the person's messages last, and never their first and latest."""
        kept = {s: list(self.items[s]) for s in ORDER}
        kept[FILES] = _longest_forms(kept[FILES])
        omitted = dict(self.omitted)
        chars = {s: sum(len(i) + 3 for i in kept[s]) for s in ORDER}
        sizes = {s: _section_size(s, chars[s], omitted[s]) for s in ORDER}
        first = dict.fromkeys(ORDER, 0)  # kept[s][first[s]:] survive (the first request aside)
        while sum(sizes.values()) > budget:
            loser = _loser({s: len(kept[s]) - first[s] for s in ORDER}, sizes, budget)
            if loser is None:
                break
            at = first[loser] + (loser == TASK)  # the first request stays
            chars[loser] -= len(kept[loser][at]) + 3
            first[loser] += 1
            omitted[loser] += 1
            sizes[loser] = _section_size(loser, chars[loser], omitted[loser])
        survive = {s: kept[s][first[s] :] for s in ORDER}
        if first[TASK]:
            survive[TASK] = [kept[TASK][0], *kept[TASK][first[TASK] + 1 :]]
        for s in ORDER:  # sections left with a marker alone give way to the person's messages
            if s != TASK and not survive[s] and sum(sizes.values()) > budget and survive[TASK]:
                sizes[s] = 0
        if sum(sizes.values()) > budget and survive[TASK]:  # the first and the latest, abridged
            room = max(8, (budget - sum(sizes.values()) + sizes[TASK] - 60) // len(survive[TASK]))
            survive[TASK] = [abridge(i, room) for i in survive[TASK]]
            chars[TASK] = sum(len(i) + 3 for i in survive[TASK])
            sizes[TASK] = _section_size(TASK, chars[TASK], omitted[TASK])
        blocks = [_render(s, survive[s], omitted[s]) for s in ORDER if sizes[s]]
        return ("\n".join(blocks) if blocks else EMPTY)[:budget]


def _state(messages: Sequence[Message], limit: int) -> str:
    """Where the range leaves off: the last line of its last assistant text (agents end a
    step with what they will do next)."""
    for m in reversed(messages):
        if m.get("role") == "assistant":
            lines = [ln.strip() for ln in text_of(m).splitlines() if ln.strip()]
            if lines:
                return abridge(squash(lines[-1]), limit)
    return ""


def _loser(left: dict[str, int], sizes: dict[str, int], budget: int) -> str | None:
    """The section whose oldest item goes next (`left`: items each still has): the person's
    messages when they exceed their share or nothing else is left, else the fullest other
    section; None: none can lose one."""
    requests = left[TASK] > 2  # more than the first and the latest
    if requests and sizes[TASK] > REQUESTS_SHARE * budget:
        return TASK
    live = [s for s in ORDER if s != TASK and left[s]]
    if live:
        return max(live, key=lambda s: sizes[s])
    return TASK if requests else None


def _longest_forms(paths: list[str]) -> list[str]:
    """Drop `x.py` and `b/x.py` when `a/b/x.py` is there too."""
    tails = {p[i + 1 :] for p in paths for i, c in enumerate(p) if c == "/"}
    return [p for p in paths if p not in tails]


def _render(section: str, items: list[str], omitted: int) -> str:
    lines = [f"- {item}" for item in items]
    if omitted:  # after the first request, which is never omitted; first elsewhere
        lines.insert(1 if section == TASK and items else 0, _marker(omitted))
    return "\n".join([f"{section}:", *lines])


def _marker(omitted: int) -> str:
    return f"- ({omitted} earlier item{'s' if omitted > 1 else ''} omitted)"


def _section_size(section: str, item_chars: int, omitted: int) -> int:
    """Characters the section adds to the output; `item_chars` counts "\\n- " per item."""
    if not item_chars and not omitted:
        return 0
    marker = len(_marker(omitted)) + 1 if omitted else 0
    return len(section) + 2 + marker + item_chars + 1


def squash(text: str) -> str:
    """`text` with every run of white space one space."""
    return " ".join(text.split())


def abridge(text: str, limit: int) -> str:
    """`text`, or its first `limit` characters ending in an ellipsis."""
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _first_sentences(text: str, limit: int) -> str:
    """The first sentence, and the next ones while the result is still short."""
    sentences = _SENTENCE_END.split(squash(TAG.sub(" ", text)))
    out = sentences[0]
    for s in sentences[1:]:
        if len(out) >= 80:
            break
        out = f"{out} {s}"
    return abridge(out, limit)


def _call(name: str, args: Any, limit: int) -> str:
    parsed: Any = args
    if isinstance(args, str):
        try:
            parsed = json.loads(args) if args.strip() else {}
        except ValueError:
            parsed = args
    if isinstance(parsed, dict):
        shown = ", ".join(f"{k}={abridge(_json(v), 80)}" for k, v in parsed.items())
    else:
        shown = abridge(squash(str(parsed)), 80)
    return abridge(f"{name}({shown})", limit)


def _json(value: Any) -> str:
    return squash(json.dumps(value, ensure_ascii=False, sort_keys=True))


def _error_lines(text: str) -> Iterator[tuple[str, int]]:
    """(line, offset of the error word in it) for lines of a tool output that report a failure."""
    for raw in text.splitlines():
        line = _EMPTY_ERROR_FIELD.sub("", raw)
        match = _ERROR_LINE.search(line)
        if match and not _CODE_LINE.match(line):
            yield line.strip(), max(0, match.start() - (len(line) - len(line.lstrip())))


def _paths(text: str) -> Iterator[str]:
    count = 0
    for match in _PATH.finditer(text):
        path = match.group(0).rstrip(".-")
        if _is_path(path):
            yield path
            count += 1
            if count >= MAX_PATHS_PER_MESSAGE:
                return


def _is_path(path: str) -> bool:
    if len(path) > 200 or "//" in path or not re.search(r"[A-Za-z]", path):
        return False
    if "/" not in path:  # the bare-file alternative of _PATH
        return True
    starts_rooted = path.startswith(("/", "./", "../", "~/"))
    # one slash and no extension is mostly prose: "and/or", "I/O", "yes/no"
    return starts_rooted or _EXTENSION.search(path) is not None or path.count("/") >= 2
