"""Summarizers: what folds a range of messages into the previous summary.

`LLMSummarizer` asks a provider; `FnSummarizer` wraps the reference's `summarize=` hook; the
offline `ExtractiveSummarizer` lives in `shared.summaries.extractive`. All share the prompt
below, which keeps what an agent needs to go on (task, decisions, files, open items) and
folds the previous summary in rather than summarizing summaries blindly. The person's own
messages are what it gives up last: quoted verbatim, the first and the latest always, the
others while they fit in half the summary; context a client hands over (a file listing
answered "Ok.") is labelled as such, so it is not taken for the person's words.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Protocol

from shared.head import handed_over
from shared.messages import Message, text_of
from shared.summaries.llm import Completion, LLMClient, SummarizeFn

INSTRUCTIONS = (
    "You maintain the running summary of a long conversation between a user and an AI "
    "assistant that uses tools. Another model will continue the conversation from your summary "
    "plus the most recent messages, without seeing the messages you summarize. Write terse "
    "plain text in these sections, in this order:\n"
    "Task and instructions: the user's task and every later instruction, requirement or "
    "constraint they stated, in their words where short.\n"
    "Done and found: what was done, what was found, decisions and why, what was tried and "
    "failed (with the error), which files and values the findings are about.\n"
    "Current state: where the work stands now.\n"
    "Next step: what the assistant was about to do, and the open items.\n"
    "Drop pleasantries, repeated output and anything superseded. Fold the previous summary into "
    "the new one: the result must replace both. The user's own messages (labelled `user:`, not "
    "tool results and not `user (context handed over):`) are the last thing to give up: under "
    "Task and instructions, quote them verbatim, oldest first, one per line; always the first "
    "and the latest, the others while they fit in half the summary, the oldest after the first "
    "going first, with `(N earlier messages omitted)` in their place. An artifact index, when "
    "given, is kept exactly by the system and is shown after your summary: do not copy it; "
    "refer to its files, commands, errors and ids by name where the narrative needs them."
)
TOOL_OUTPUT_CHARS = 2000
MESSAGE_CHARS = 6000


class Summarizer(Protocol):
    """Folds `messages` into `previous` (None for the first range) and says what it cost.

    `name` is what the records it writes say wrote them (`SummaryRecord.summarizer`).
    """

    name: str

    async def summarize(
        self, previous: str | None, messages: Sequence[Message], *, max_tokens: int, index: str = ""
    ) -> Completion:
        """The summary that replaces `previous` and `messages` both, in at most `max_tokens`
        tokens (a `Summarize` step's `max_summary_tokens`); `index`: the artifact index of
        everything so far, rendered (shown with the summary after it: not to be repeated)."""
        ...


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    omitted = len(text) - limit
    return f"{text[:head]}\n[... {omitted} characters omitted ...]\n{text[-(limit - head) :]}"


def _render_message(m: Message, context: bool = False) -> str:
    role = "user (context handed over)" if context else m.get("role", "?")
    if role == "tool":
        label = f"tool result ({m['name']})" if m.get("name") else "tool result"
        return f"{label}:\n{_clip(text_of(m), TOOL_OUTPUT_CHARS)}"
    lines = [f"{role}:\n{_clip(text_of(m), MESSAGE_CHARS)}"] if text_of(m) else [f"{role}:"]
    calls = [call.get("function", {}) for call in m.get("tool_calls") or []]
    if isinstance(m.get("function_call"), dict):  # legacy OpenAI function calling
        calls.append(m["function_call"])
    for fn in calls:
        args = fn.get("arguments", "")
        args = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        lines.append(f"[calls {fn.get('name')}({_clip(args, TOOL_OUTPUT_CHARS)})]")
    return "\n".join(lines)


def render(messages: Sequence[Message]) -> str:
    """A range of messages as plain text for a summarizer, huge outputs clipped, context a
    client handed over labelled as such."""
    return "\n\n".join(
        _render_message(m, handed_over(messages, i) and m.get("role") == "user")
        for i, m in enumerate(messages)
    )


def build_prompt(
    previous: str | None, messages: Sequence[Message], max_tokens: int, index: str = ""
) -> str:
    """The full text prompt (also what the reference's `summarize=` hook receives); `index`
    the artifact index rendered (shown in `<artifact_index>` when there is one)."""
    prior = previous if previous else "(none yet: this is the start of the conversation)"
    shown = f"<artifact_index>\n{index}\n</artifact_index>\n\n" if index else ""
    return (
        f"{INSTRUCTIONS}\nKeep the summary under {max_tokens} tokens.\n\n"
        f"<previous_summary>\n{prior}\n</previous_summary>\n\n{shown}"
        f"<new_messages>\n{render(messages)}\n</new_messages>\n\n"
        "Write the updated summary now."
    )


class LLMSummarizer:
    """Summaries written by a chat-completions provider.

    - client: the `LLMClient` asked, with the summary prompt as one user message;
    - model: the model it is asked for (None: the client's default);
    - name: what its records say wrote them (default `"llm:<model>"`).
    """

    def __init__(self, client: LLMClient, model: str | None, name: str | None = None) -> None:
        self.client = client
        self.model = model
        self.name = name or f"llm:{model or 'default'}"

    async def summarize(
        self, previous: str | None, messages: Sequence[Message], *, max_tokens: int, index: str = ""
    ) -> Completion:
        prompt = build_prompt(previous, messages, max_tokens, index)
        return await self.client.complete(
            [{"role": "user", "content": prompt}], model=self.model, max_tokens=max_tokens
        )


class FnSummarizer:
    """The reference's `summarize=` hook: an async (prompt, model) -> text callable.

    - fn: the hook; it gets the whole summary prompt (`build_prompt`) and `model`;
    - model: passed to `fn` as it is;
    - name: what its records say wrote them (`"custom"`).
    """

    def __init__(self, fn: SummarizeFn, model: str | None, name: str = "custom") -> None:
        self.fn = fn
        self.model = model
        self.name = name

    async def summarize(
        self, previous: str | None, messages: Sequence[Message], *, max_tokens: int, index: str = ""
    ) -> Completion:
        text = await self.fn(build_prompt(previous, messages, max_tokens, index), self.model)
        return Completion(text=text, model=self.model)


def as_summarizer(
    summarizer: LLMClient | Summarizer | None, model: str | None
) -> Summarizer | None:
    """A `Summarizer` from what a policy was given: one already, or an `LLMClient` to call."""
    if summarizer is None:
        return None
    if hasattr(summarizer, "summarize"):
        return summarizer  # type: ignore[return-value]
    return LLMSummarizer(summarizer, model)
