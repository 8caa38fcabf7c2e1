"""The head of a conversation: what every prompt keeps, whatever else is cut.

The head is the leading system/developer messages, the user's first message and the
person's task, wherever they stand.

- The first user message is kept as the reference library keeps it. Customer-service and
  voice transcripts open with the agent's greeting, so it is often the second message: what
  stands between the leading messages and it (the *gap*) is kept with them when it is small,
  as a greeting is; a large gap (an agent that worked for a while before the user spoke) is
  ordinary conversation, which may be cleared or dropped like any old turn.
- The person's task is the request a person made, not a template the client sends before
  it. It is the first user message unless that opens a template: a fixed few-shot exchange
  closed by a bare acknowledgment (aider's example request and answer, then "I switched to a
  new code base..." / "Ok."), context the client hands over and has acknowledged (a file
  listing answered "Ok, any changes I propose will be to those files."), or a preamble sent
  right before another user message (an environment or instructions message). What stands
  between the first user message and the task (the *template*) is kept when small, like the
  gap. When the task is the first user message, the head is what it always was.
- The person's own requests in a template too large to keep are kept all the same (issue
  19: a person's messages are the last thing any strategy gives up): a person may state the
  request and have it acknowledged ("Understood. Send me the first build log.") before the
  message the rule takes for the task. The user messages of a cut-able template past its
  few-shot examples that are small (`REQUEST_MAX_CHARS`; handed-over file content is larger)
  are `Head.requests`, the `TEMPLATE_MAX_REQUESTS` nearest the task: every strategy keeps
  them as it keeps the task (`cuts` are the template's ranges around them).

Whether a reply is a canned acknowledgment is judged from its text alone: short, no tool
calls, no question, opening with an affirmation ("Ok", "Sure", "Understood"...). A template's
replies are fixed, so a session finds the same task at every turn; a session whose first
request stops before its task (a lone greeting) finds it once the task arrives. A few-shot
exchange looks like real turns followed by a client's note ("I updated the files." / "Ok."),
which is told apart only once the note recurs: until then such a session may see its latest
request taken for the task (its first user message, kept anyway, is the task then). The
head is final once its task has a reply; the recurring note is the one later message that
can still move it (prepare recounts the head every call; only a stored tally's head end,
used for size estimates, may then lag until the transcript is replaced).

A tenant's memory of repeated openings (shared/store/openings.py) adds what one transcript
cannot show: a user message that opened other conversations of the tenant with other tasks
(a fixed instruction block, a greeting every session sends) is a preamble. It reaches the
rule as data, `preambles` (the `task_digest`s of the openings that are preambles for this
transcript): the person's task is then the next user message after the opening. The opening
is the message the rule above takes for the task; it stays kept (it is the first user
message, or a small template).

`Head.end` is where the head's region ends: one past the task (or past the leading messages
when there is no user message yet). Summaries cover `[end, upto)`, so a summary never folds
the task in; a prompt served from a summary keeps `[0, end)` whole, the gap and template
aside when they may be cut.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shared.hashing import canonical
from shared.messages import HEAD_ROLES, Message, is_request, text_of

# A gap before the first user message is kept whole when it is at most this big (a greeting,
# a short introduction), and so is a template before the task (in characters: it may count
# more messages): beyond it, keeping it could cost a small window more than the task itself.
GAP_MAX_CHARS = 2_000
GAP_MAX_MESSAGES = 4

# A canned acknowledgment: a text-only reply this short, asking nothing, that opens with an
# affirmation. A bare one (a few words: "Ok.") closes a few-shot exchange. A template is at
# most this many example exchanges, and at most this many context messages after them.
ACK_MAX_CHARS = 160
BARE_ACK_MAX_WORDS = 3
TEMPLATE_MAX_EXCHANGES = 6
# A user message of a cut-able template is a person's request, kept with the head, when its
# text is at most this long (a request, a pasted error; a file listing or log is longer), and
# at most this many of them, those nearest the task: together they cost less than a gap kept.
REQUEST_MAX_CHARS = 1_500
TEMPLATE_MAX_REQUESTS = 3
MOVED_KEYS = frozenset({"cache_control"})
_BILLING_LINE = re.compile(r"(?m)^x-anthropic-billing-header:.*\n?")
_AFFIRMATION = re.compile(
    r"\W*(?:ok|okay|sure|understood|noted|got it|alright|all right|acknowledged)\b", re.I
)


@dataclass(frozen=True)
class Head:
    """Where the head is: `lead` leading system/developer messages, the first user message at
    `first`, the person's task at `task` (the same unless a template came before it)."""

    lead: int
    first: int | None
    task: int | None
    gap_kept: bool = True
    template_kept: bool = True
    final: bool = False  # True once later messages cannot change the head
    # the task if the acknowledged note that closed a "few-shot exchange" is a running note
    # after real turns (it has not recurred yet: the two readings cannot be told apart)
    note_task: int | None = None
    # the person's requests inside a cut-able template, kept with the head (ascending)
    requests: tuple[int, ...] = ()

    @property
    def end(self) -> int:
        """One past the head's region (the task, else the leading messages)."""
        return self.task + 1 if self.task is not None else self.lead

    @property
    def gap(self) -> tuple[int, int]:
        """The half-open range between the leading messages and the first user message that
        may be cut (empty when the gap is kept or there is none)."""
        if self.first is None or self.gap_kept:
            return (self.lead, self.lead)
        return (self.lead, self.first)

    @property
    def template(self) -> tuple[int, int]:
        """The half-open range between the first user message and the task that may be cut,
        `requests` aside (empty when the template is kept or there is none)."""
        if self.first is None or self.task is None or self.template_kept:
            return (self.end, self.end)
        return (self.first + 1, self.task)

    @property
    def cuts(self) -> tuple[tuple[int, int], ...]:
        """The non-empty ranges of `[0, end)` that may be cut, in order: the gap, and the
        template's ranges around the `requests` it keeps."""
        lo, hi = self.template
        bounds = [self.gap]
        for kept in self.requests:
            bounds.append((lo, kept))
            lo = kept + 1
        bounds.append((lo, hi))
        return tuple((a, b) for a, b in bounds if a < b)

    @property
    def contiguous(self) -> bool:
        """True when the head is all of `[0, end)`."""
        return not self.cuts

    def protects(self, index: int) -> bool:
        """Whether the message at `index` of the transcript belongs to the head."""
        return 0 <= index < self.end and not any(lo <= index < hi for lo, hi in self.cuts)

    def size(self) -> int:
        """How many messages the head keeps."""
        return self.end - sum(hi - lo for lo, hi in self.cuts)

    def describe(self) -> dict[str, Any]:
        """The head as a report states it."""
        late = self.task is not None and self.first is not None and self.task > self.first
        return {
            "end": self.end,
            "first_user": self.first,
            "task": self.task,
            "leading": self.lead,
            "messages": self.size(),
            "gap_kept": self.gap_kept
            if self.first is not None and self.first > self.lead
            else None,
            "template_kept": self.template_kept if late else None,
        }


def head_of(
    msgs: Sequence[Message],
    *,
    keep_first_user: bool = True,
    preambles: frozenset[str] = frozenset(),
) -> Head:
    """The head of `msgs`.

    - msgs: the transcript's messages;
    - keep_first_user: the head keeps the user's first message and the person's task (True);
      False: the head is the leading system/developer messages only;
    - preambles: the `task_digest`s of openings the tenant's memory found to be preambles
      (see the module docstring): when the message taken for the task is one of them, the
      task is the next user message.
    """
    lead = 0
    n = len(msgs)
    while lead < n and msgs[lead].get("role") in HEAD_ROLES:
        lead += 1
    if not keep_first_user:
        return Head(lead, None, None)
    first = next((i for i in range(lead, n) if msgs[i].get("role") == "user"), None)
    if first is None:
        return Head(lead, None, None)
    examples = _past_examples(msgs, first)  # where the messages after them start
    task, final = task_of(msgs, first, examples)
    unsure = not final and examples > first
    if preambles and task_digest(msgs[task]) in preambles:
        after = next_request(msgs, task)
        if after is not None:
            task, final = after, after + 1 < n
    template_kept = _small(msgs[first + 1 : task], 2 * TEMPLATE_MAX_EXCHANGES + 1)
    return Head(
        lead,
        first,
        task,
        gap_kept=_small(msgs[lead:first]),
        template_kept=template_kept,
        final=final,
        note_task=first if unsure and task != first else None,
        requests=() if template_kept else requests_in(msgs, first, task, examples),
    )


def requests_in(msgs: Sequence[Message], first: int, task: int, examples: int) -> tuple[int, ...]:
    """Indices of the person's requests in the template `msgs[first + 1 : task]`: its small
    user messages past the few-shot examples (which end at `examples`), the
    `TEMPLATE_MAX_REQUESTS` nearest the task."""
    start = max(first + 1, examples)
    found = [
        i
        for i in range(start, task)
        if is_request(msgs[i]) and len(text_of(msgs[i])) <= REQUEST_MAX_CHARS
    ]
    return tuple(found[-TEMPLATE_MAX_REQUESTS:])


def opening_pair(msgs: Sequence[Message]) -> tuple[str, str] | None:
    """(`task_digest` of the message the transcript-only rule takes for the task, that of
    the next user message after it): what the tenant's memory of openings records; None
    before there is such a next message."""
    head = head_of(msgs)
    if head.task is None:
        return None
    after = next_request(msgs, head.task)
    if after is None:
        return None
    return task_digest(msgs[head.task]), task_digest(msgs[after])


def next_request(msgs: Sequence[Message], at: int) -> int | None:
    """Index of the first request (`is_request`) after `at`, else None."""
    return next((i for i in range(at + 1, len(msgs)) if is_request(msgs[i])), None)


def task_digest(message: Message) -> str:
    """A user message's hash as every turn resends it (`task_key`): 32 hex digits."""
    return hashlib.blake2b(canonical(task_key(message)), digest_size=16).hexdigest()


def steady(value: Any) -> Any:
    """`value` without what clients move or renew between turns of one session: cache
    markers anywhere, Claude Code's per-request billing line in its system prompt."""
    if isinstance(value, dict):
        return {k: steady(v) for k, v in value.items() if k not in MOVED_KEYS}
    if isinstance(value, list):
        return [steady(v) for v in value]
    if isinstance(value, str) and "x-anthropic-billing-header:" in value:
        return _BILLING_LINE.sub("", value)
    return value


def task_key(message: Message) -> Any:
    """A message as every turn resends it (`steady`), its last text up to the first blank
    line (a client may append a reminder to the latest request only)."""
    task = steady(message)
    content = task.get("content")
    if isinstance(content, str):
        return {**task, "content": _first_paragraph(content)}
    if isinstance(content, list):
        texts = [
            i for i, p in enumerate(content) if isinstance(p, dict) and p.get("type") == "text"
        ]
        if texts:
            last = texts[-1]
            part = content[last]
            cut = {**part, "text": _first_paragraph(str(part.get("text", "")))}
            return {**task, "content": [*content[:last], cut, *content[last + 1 :]]}
    return task


def _first_paragraph(text: str) -> str:
    return text.strip().split("\n\n", 1)[0].rstrip()


def head_end(msgs: Sequence[Message], *, keep_first_user: bool = True) -> int:
    """End of the head's region: one past the person's task, else the leading messages.

    - msgs, keep_first_user: as for `head_of`.
    """
    return head_of(msgs, keep_first_user=keep_first_user).end


def task_of(msgs: Sequence[Message], first: int, examples: int) -> tuple[int, bool]:
    """(index of the person's task, whether later messages can no longer move it), given
    the first user message at `first` and where the messages after any few-shot examples
    start, `examples` (`_past_examples`; see the module docstring)."""
    at = examples
    n, skipped = len(msgs), 0
    while at < n and msgs[at].get("role") == "user" and skipped <= TEMPLATE_MAX_EXCHANGES:
        skipped += 1
        if at + 1 == n:  # the latest message: its reply may still show it was context
            return at, False
        reply = msgs[at + 1]
        if reply.get("role") == "user":  # a preamble sent right before the request
            at += 1
            continue
        if not acknowledges(reply):
            return at, True
        if at + 2 == n:
            return at, False
        if msgs[at + 2].get("role") != "user":
            return at, True
        at += 2  # context the client handed over and had acknowledged
    return first, at < n  # past a template with no request after it yet: it may still come


def _past_examples(msgs: Sequence[Message], first: int) -> int:
    """Where the messages after a few-shot exchange start: past the bare acknowledgment that
    closes it, when one does within `TEMPLATE_MAX_EXCHANGES` text exchanges; else `first`.

    The closing note must not recur: a client's running note ("I updated the files." /
    "Ok." after each applied edit) follows real turns, not examples.
    """
    at = first
    for _ in range(TEMPLATE_MAX_EXCHANGES + 1):
        if at + 1 >= len(msgs) or msgs[at].get("role") != "user":
            return first
        reply = msgs[at + 1]
        if acknowledges(reply) and len(text_of(reply).split()) <= BARE_ACK_MAX_WORDS:
            return first if _recurs(msgs, at) else at + 2
        if _reply_text(reply) is None:
            return first
        at += 2
    return first


def _recurs(msgs: Sequence[Message], at: int) -> bool:
    """Whether the user message at `at` is sent again later in `msgs`."""
    text = text_of(msgs[at])
    return any(m.get("role") == "user" and text_of(m) == text for m in msgs[at + 1 :])


def handed_over(msgs: Sequence[Message], i: int) -> bool:
    """Whether the user message at `i` is context a client handed over: acknowledged by a
    canned reply and followed by another user message."""
    after = msgs[i + 1 : i + 3]
    return len(after) == 2 and acknowledges(after[0]) and after[1].get("role") == "user"


def acknowledges(m: Message) -> bool:
    """Whether `m` is a canned acknowledgment (see `ACK_MAX_CHARS`)."""
    text = _reply_text(m)
    if text is None or len(text) > ACK_MAX_CHARS or "?" in text:  # a question is no ack
        return False
    return bool(_AFFIRMATION.match(text))


def _reply_text(m: Message) -> str | None:
    """The text of an assistant reply that only speaks (no tool or function call)."""
    if m.get("role") != "assistant" or m.get("tool_calls") or m.get("function_call"):
        return None
    return text_of(m).strip()


def _small(gap: Sequence[Message], max_messages: int = GAP_MAX_MESSAGES) -> bool:
    if len(gap) > max_messages:
        return False
    chars = 0
    for m in gap:
        chars += len(text_of(m))
        for call in m.get("tool_calls") or ():
            fn = call.get("function") if isinstance(call, dict) else None
            chars += len(str(fn.get("arguments", ""))) if isinstance(fn, dict) else 0
    return chars <= GAP_MAX_CHARS
