"""The artifact index: what a run touched, kept exactly and folded in without any model.

A summary says what happened in gist; an agent going on needs some things exactly: the files
it read, wrote and listed, the commands it ran and how they ended, the errors it saw (and
where), the ids, URLs and names the person, the agent or a tool named, and the person's
requests. `ArtifactIndex.fold` records them from a range of messages (tool-call arguments
and tool outputs included); the index travels with the `SummaryRecord` from one record to
the next as the summary does, and `render` serves it after the summary within its own budget.

Shrinking (to `MAX_ENTRIES` when stored, to the budget when rendered) keeps what was
mentioned most recently and most often (`score`), and says how many items it left out. The
person's requests go last: the first and the latest always stay. Same input, same output.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from shared.errors import InvalidTranscript
from shared.head import handed_over
from shared.messages import HEAD_ROLES, Message, text_of
from shared.summaries.extractive import TAG, abridge, squash

FILE, COMMAND, ERROR, ID, URL, NAME, REQUEST = (
    "file", "command", "error", "id", "url", "name", "request",
)  # fmt: skip
KINDS = (REQUEST, FILE, COMMAND, ERROR, ID, URL, NAME)
TITLES = {
    REQUEST: "Requests (verbatim)",
    FILE: "Files",
    COMMAND: "Commands (how they ended)",
    ERROR: "Errors",
    ID: "Ids and numbers",
    URL: "URLs",
    NAME: "Names",
}
HEADER = "Artifact index (exact, kept by prefit):"
# identifiers and paths run shorter per token than prose: 3 characters a token, not 4
INDEX_CHARS_PER_TOKEN = 3
MAX_ENTRIES = 600  # kept in a record: a few times what any window's share renders
MAX_VALUE_CHARS = 160
MAX_REQUEST_CHARS = 1200
MAX_PER_OUTPUT = 60  # names and ids taken from one tool output (a file dump names hundreds)
# the share of the index's budget the person's requests keep before they lose any
REQUESTS_SHARE = 0.5

_URL = re.compile(r"https?://[^\s\"'<>()\[\]{}`\\]+")
_PATH = re.compile(
    # possessive (`++`, `*+`): no class holds the character after it, so nothing is lost by
    # never backtracking, and a long word costs one pass instead of one per character
    r"(?<![\w/.:~@+-])(?:~|\.{1,2})?/?(?:[\w.@+-]++/)+[\w.@+-]++"
    r"|(?<![\w/.-])[A-Za-z_][\w-]*+\.(?:py|pyi|ipynb|js|jsx|ts|tsx|json|ya?ml|toml|md|rst|txt"
    r"|cfg|ini|c|h|cc|cpp|hpp|rs|go|java|kt|rb|php|sh|sql|html|css|lock|csv|xml|proto|log)\b"
)
_ERROR = re.compile(r"\b[A-Z]\w*(?:Error|Exception|Warning|Failure)\b")
_NAME = re.compile(
    r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b"  # snake_case, user ids
    r"|\b[a-z]+(?:[A-Z][a-z0-9]+)+\b|\b[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]+)+\b"  # camel, Pascal
    r"|\b[a-z_]\w*(?:\.[A-Za-z_]\w*)+\b"  # dotted: module.attr
)
_ID = re.compile(
    r"\b\d{4}-\d\d-\d\d(?:[T ]\d\d:\d\d(?::\d\d)?)?\b"  # dates and times
    r"|#?\b(?=[A-Z0-9]*\d)(?=[A-Z0-9]*[A-Z])[A-Z0-9]{5,12}\b"  # booking codes, flight numbers
    r"|#[A-Z]?\d{4,}\b"  # order numbers
    r"|\b[\w.+-]++@[\w-]++\.[\w.]+\b"  # e-mail addresses
    r"|(?<![\w.:-])\d[\d,.:-]{3,}\d(?![\w:-])"  # long numbers, amounts, times
)
_RETURN = re.compile(
    r"<returncode>\s*(-?\d+)|\b(?:returncode|exit code|exit status|exited with)\W{0,3}(-?\d+)", re.I
)
_TRACE = re.compile(r'File "([^"\n]{1,200})", line (\d+)')
_WHERE = re.compile(r"\b([\w./-]+\.\w{1,5}):(\d+)\b")
_READS = re.compile(r"^\s*(?:cat|head|tail|less|more|nl|wc|grep|rg|sed\s+-n|awk|diff|view)\b")
_WRITES = re.compile(
    r"(?:^|\s)(?:sed\s+-i|tee|cp|mv|touch|mkdir|rm|patch|git\s+apply)\b|[^2]>>?\s*[\w./~-]"
)
_LISTS = re.compile(r"^\s*(?:ls|find|tree|git\s+(?:ls-files|status))\b")
_EDIT_COMMANDS = dict.fromkeys(("create", "str_replace", "insert", "write", "edit"), "written")
_EDIT_COMMANDS.update(view="read", read="read")
_SHELL_KEYS = ("command", "cmd", "script", "code")


@dataclass(frozen=True)
class Artifact:
    """One thing the run touched.

    - kind: `file`, `command`, `error`, `id`, `url`, `name` or `request`;
    - value: the thing itself, exactly (a command or error line abridged to 160 characters);
    - note: how: a file's `read`/`written`/`listed`, a command's end, an error's place;
    - count: how many messages mentioned it;
    - first, last: the transcript index of the first and the latest message that did.
    """

    kind: str
    value: str
    note: str = ""
    count: int = 1
    first: int = 0
    last: int = 0


@dataclass(frozen=True)
class ArtifactIndex:
    """The artifacts of `transcript[start:upto]` (a `SummaryRecord`'s range), oldest first.

    - items: the artifacts, in the order they were first seen;
    - upto: the exclusive end of the messages folded in;
    - omitted: how many were left out when the stored index was capped (`MAX_ENTRIES`).
    """

    items: tuple[Artifact, ...] = ()
    upto: int = 0
    omitted: int = 0

    def fold(self, messages: Sequence[Message], offset: int) -> ArtifactIndex:
        """This index with `messages` (the transcript's from index `offset` on) folded in."""
        found: dict[tuple[str, str], Artifact] = {(a.kind, a.value): a for a in self.items}
        for at, kind, value, note in _mentions(messages, offset):
            key = (kind, value)
            old = found.get(key)
            if old is None:
                found[key] = Artifact(kind, value, note, 1, at, at)
            elif old.last != at or note not in old.note:
                count = old.count + (old.last != at)
                found[key] = replace(old, note=_merge(old.note, note), count=count, last=at)
        upto = max(self.upto, offset + len(messages))
        items = list(found.values())
        if len(items) <= MAX_ENTRIES:
            return ArtifactIndex(tuple(items), upto, self.omitted)
        kept = set(map(id, _ranked(items, upto)[:MAX_ENTRIES]))
        survivors = tuple(a for a in items if id(a) in kept)
        return ArtifactIndex(survivors, upto, self.omitted + len(items) - len(survivors))

    def render(self, budget_chars: int, shown: str = "") -> str:
        """The index in at most `budget_chars` characters ("" when empty or no room),
        leaving out what `shown` (the summary it is served with) already says verbatim."""
        items = [a for a in self.items if not (a.value in shown and a.kind != COMMAND)]
        if not items or budget_chars < 40:
            return ""
        requests = [a for a in items if a.kind == REQUEST]
        room = budget_chars - len(HEADER) - 48  # the header and an omission line
        chosen: set[int] = set()
        used = 0

        titled: set[str] = set()

        def take(a: Artifact, limit: float) -> None:
            nonlocal used
            cost = _cost(a) + (len(TITLES[a.kind]) + 4 if a.kind not in titled else 0)
            if id(a) not in chosen and used + cost <= limit:
                chosen.add(id(a))
                titled.add(a.kind)
                used += cost

        for a in requests[:1] + requests[-1:]:
            take(a, room)
        for a in reversed(requests[1:-1]):  # the latest first, within their share
            take(a, REQUESTS_SHARE * room)
        for a in _ranked([a for a in items if a.kind != REQUEST], self.upto):
            take(a, room)
        for a in reversed(requests):  # what room is left
            take(a, room)
        omitted = len(items) - len(chosen) + self.omitted
        return _lines([a for a in items if id(a) in chosen], omitted)

    def to_data(self) -> dict[str, Any]:
        """The index as JSON-able data (a `SummaryRecord`'s `artifacts`)."""
        rows = [[a.kind, a.value, a.note, a.count, a.first, a.last] for a in self.items]
        return {"items": rows, "upto": self.upto, "omitted": self.omitted}

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> ArtifactIndex:
        """The index `to_data` gave (`InvalidTranscript` when it is not one)."""
        try:
            items = tuple(
                Artifact(str(k), str(v), str(n), int(c), int(f), int(la))
                for k, v, n, c, f, la in data.get("items", ())
            )
            return cls(items, int(data.get("upto", 0)), int(data.get("omitted", 0)))
        except (TypeError, ValueError, AttributeError) as exc:
            raise InvalidTranscript(f"bad artifact index: {exc}") from None


def narrative(text: str) -> str:
    """A record's text without the index rendered after it (what the summarizer wrote)."""
    return text.split(f"\n\n{HEADER}\n", 1)[0] if HEADER in text else text


def score(a: Artifact, upto: int) -> float:
    """How much an artifact is worth keeping: mentioned often and lately (higher: kept)."""
    age = max(0, upto - a.last)
    return (1.0 + math.log2(a.count)) / (1.0 + age / 8.0)


def _ranked(items: Sequence[Artifact], upto: int) -> list[Artifact]:
    return sorted(items, key=lambda a: (-score(a, upto), -a.last, a.kind, a.value))


def _cost(a: Artifact) -> int:
    return len(a.value) + (len(a.note) + 3 if a.note else 0) + 2


def _merge(old: str, new: str) -> str:
    if not new or new in old.split(", "):
        return old
    if not old:
        return new
    if new.startswith(("exit", "ok", "error")):  # a command's end: the latest one counts
        return new
    return f"{old}, {new}"


def _lines(items: Sequence[Artifact], omitted: int) -> str:
    lines = [HEADER]
    for kind in KINDS:
        mine = [a for a in items if a.kind == kind]
        if not mine:
            continue
        shown = [f"{a.value} ({a.note})" if a.note else a.value for a in mine]
        if kind in (REQUEST, COMMAND, ERROR):
            lines.append(f"{TITLES[kind]}:")
            lines.extend(f"- {s}" for s in shown)
        else:
            lines.append(f"{TITLES[kind]}: " + "; ".join(shown))
    if omitted:
        lines.append(f"({omitted} less recent or rarer items omitted)")
    return "\n".join(lines)


def _mentions(messages: Sequence[Message], offset: int) -> Iterator[tuple[int, str, str, str]]:
    """(transcript index, kind, value, note) of every artifact the messages name."""
    calls: dict[str, tuple[str, str]] = {}  # tool-call id -> (command, how it touches files)
    last_calls: list[tuple[str, str]] = []
    for i, m in enumerate(messages):
        at, role, text = offset + i, m.get("role"), text_of(m)
        if role == "tool":
            known = calls.get(str(m.get("tool_call_id")))
            call = known or (last_calls[0] if len(last_calls) == 1 else ("", ""))
            yield from _output(at, text, *call)
            continue
        if role == "user" and text.strip() and not handed_over(messages, i):
            yield at, REQUEST, abridge(squash(TAG.sub(" ", text)), MAX_REQUEST_CHARS), ""
        if role in HEAD_ROLES:
            continue
        yield from _named(at, text, "")
        if role == "assistant":
            last_calls = []
            for call in m.get("tool_calls") or []:
                command, how = _call(call)
                calls[str(call.get("id"))] = (command, how)
                last_calls.append((command, how))
                args = (call.get("function") or {}).get("arguments", "")
                args = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
                yield from _named(at, args, how)


def _call(call: Mapping[str, Any]) -> tuple[str, str]:
    """A tool call's command (for shell-like tools; "" otherwise) and how it touches the
    files it names (`read`, `written`, `listed`, "")."""
    fn = call.get("function") or {}
    raw = fn.get("arguments", "")
    args: Any = raw
    if isinstance(raw, str):
        try:
            args = json.loads(raw) if raw.strip() else {}
        except ValueError:
            args = raw
    command = ""
    if isinstance(args, dict):
        sub = args.get("command")
        if isinstance(sub, str) and sub in _EDIT_COMMANDS:
            return "", _EDIT_COMMANDS[sub]
        command = next((args[k] for k in _SHELL_KEYS if isinstance(args.get(k), str)), "")
    elif isinstance(args, str):
        command = args
    how = ""
    if _WRITES.search(command):
        how = "written"
    elif _READS.match(command):
        how = "read"
    elif _LISTS.match(command):
        how = "listed"
    return abridge(squash(command), MAX_VALUE_CHARS), how


def _output(at: int, text: str, command: str, how: str) -> Iterator[tuple[int, str, str, str]]:
    if command:
        yield at, COMMAND, command, _ending(text)
    listed = "listed" if how == "listed" else "seen in output"
    count = 0
    for kind, value, note in _found(text, listed):
        yield at, kind, value, note
        count += kind in (NAME, ID)
        if count >= MAX_PER_OUTPUT:
            break
    yield from _errors(at, text)


def _ending(text: str) -> str:
    """How a command ended, from its output."""
    match = _RETURN.search(text)
    code = (match.group(1) or match.group(2)) if match else None
    error = _ERROR.search(text)
    if code is not None and code != "0":
        return f"exit {code}" + (f", {error.group(0)}" if error else "")
    if "Traceback (most recent call last)" in text and error:
        return f"error, {error.group(0)}"
    return "ok" if code == "0" or not text.strip() else "ok, output"


def _errors(at: int, text: str) -> Iterator[tuple[int, str, str, str]]:
    """Error lines (`AssertionError: 'de' is not None`) and where they were raised."""
    if not _ERROR.search(text):
        return
    where = ""
    for line in text.splitlines():
        trace = _TRACE.search(line)
        if trace:
            where = f"{trace.group(1)}:{trace.group(2)}"
            continue
        error = _ERROR.search(line)
        if error and error.start() <= 4 + len(line) - len(line.lstrip()):
            place = _WHERE.search(line)
            note = f"at {where}" if where else (f"at {place.group(0)}" if place else "")
            yield at, ERROR, abridge(squash(line), MAX_VALUE_CHARS), note


def _named(at: int, text: str, how: str) -> Iterator[tuple[int, str, str, str]]:
    for kind, value, note in _found(text, how):
        yield at, kind, value, note


def _found(text: str, how: str) -> Iterator[tuple[str, str, str]]:
    """(kind, value, note) of the files, URLs, errors, ids and names in `text`."""
    urls = set()
    for m in _URL.finditer(text):
        url = m.group(0).rstrip(".,;:")
        urls.add(url)
        yield URL, url, ""
    for m in _PATH.finditer(text):
        path = m.group(0).rstrip(".,:-")
        if _is_path(path) and not any(path in u for u in urls):
            yield FILE, path, how
    for m in _ERROR.finditer(text):
        yield NAME, m.group(0), ""
    for m in _ID.finditer(text):
        yield ID, m.group(0).rstrip(".,:-"), ""
    for m in _NAME.finditer(text):
        inside = any(m.group(0) in u for u in urls)
        if len(m.group(0)) >= 5 and not inside and not _is_path(m.group(0)):
            yield NAME, m.group(0), ""


def _is_path(path: str) -> bool:
    if len(path) > 200 or "//" in path or not re.search(r"[A-Za-z]", path):
        return False
    if "/" not in path:  # a bare file name with a known extension
        return _PATH.fullmatch(path) is not None
    rooted = path.startswith(("/", "./", "../", "~/"))
    return rooted or re.search(r"\.[A-Za-z]\w{0,7}$", path) is not None or path.count("/") >= 2
