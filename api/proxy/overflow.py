"""The overflow rule: after a context-length error, prepare again at a lower pressure.

`pressure` in (0, 1] makes prepare treat its estimate as 1/pressure times too small. When
the provider's error states its figures (its count of the prompt we sent and its maximum),
the pressure is derived from them: our estimate E of that prompt stood for N provider
tokens, so a prompt the provider accepts (at most `allowed` of its tokens) is one our
estimate puts at allowed x E / N, and prepare fits under pressure x budget. A safety margin
covers the estimate's own noise. Without figures the pressure drops by a fixed step. It
always drops, so each retry sends a smaller prompt; the proxy retries at most `MAX_RETRIES`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_RETRIES = 2
SAFETY = 0.9  # aim under what the figures allow
STEP = 0.7  # pressure x STEP when the error states no figures
SHRINK = 0.9  # a retry's pressure is at most this much of the last one
FLOOR = 0.05

_INT = r"(\d[\d,]*)"
# OpenAI: "This model's maximum context length is 128000 tokens. However, your messages
# resulted in 130000 tokens" / "... you requested 131000 tokens (130000 in the messages,
# 1000 in the completion)"; newer models: "Input tokens exceed the configured limit of
# 272000 tokens. Your messages resulted in 300000 tokens."; compatible servers (Mistral):
# "Prompt contains 40000 tokens and 0 draft tokens, too large for model with 32768 maximum
# context length"
_OPENAI_LIMIT = re.compile(
    rf"(?:maximum context length is|limit of) {_INT}|{_INT} maximum context length"
)
_OPENAI_PROMPT = re.compile(
    rf"(?:resulted in {_INT} tokens|\({_INT} in the messages|[Pp]rompt contains {_INT} tokens)"
)
_OPENAI_OUTPUT = re.compile(rf"{_INT} in the completion")
# Anthropic: "prompt is too long: 208000 tokens > 200000 maximum"; "input length and
# `max_tokens` exceed context limit: 188240 + 21333 > 200000, decrease input length ..."
_ANTHROPIC_TOO_LONG = re.compile(rf"prompt is too long: {_INT} tokens > {_INT}")
_ANTHROPIC_SUM = re.compile(rf"exceed context limit: {_INT} \+ {_INT} > {_INT}")


@dataclass(frozen=True)
class Overflow:
    """A context-length error's figures, each None when the error does not state it."""

    prompt_tokens: int | None = None  # the provider's count of the prompt sent
    limit: int | None = None  # its maximum context
    output: int | None = None  # what it counted for the answer, when it says


def _num(text: str | None) -> int | None:
    return int(text.replace(",", "")) if text else None


def openai_figures(message: str) -> Overflow:
    """The figures of an OpenAI `context_length_exceeded` message (or of an Anthropic
    wording, which Anthropic-backed OpenAI-compatible endpoints pass on)."""
    limit = _OPENAI_LIMIT.search(message)
    prompt = _OPENAI_PROMPT.search(message)
    output = _OPENAI_OUTPUT.search(message)
    if limit is None and prompt is None:
        return anthropic_figures(message) or Overflow()
    return Overflow(
        prompt_tokens=_num(_first(prompt)),
        limit=_num(_first(limit)),
        output=_num(output.group(1)) if output else None,
    )


def _first(found: re.Match[str] | None) -> str | None:
    """The first group a match filled (None without a match)."""
    return next((g for g in found.groups() if g), None) if found else None


def anthropic_figures(message: str) -> Overflow | None:
    """The figures of an Anthropic "prompt is too long" error; None if it is no overflow."""
    found = _ANTHROPIC_TOO_LONG.search(message)
    if found:
        return Overflow(prompt_tokens=_num(found.group(1)), limit=_num(found.group(2)))
    found = _ANTHROPIC_SUM.search(message)
    if found:
        prompt, output, limit = (_num(g) for g in found.groups())
        return Overflow(prompt_tokens=prompt, limit=limit, output=output)
    if "prompt is too long" in message or "exceed context limit" in message:
        return Overflow()
    return None


def next_pressure(
    current: float, overflow: Overflow, *, estimated: int, budget: int, reserve: int
) -> float:
    """The pressure of the retry after `overflow`, for a prompt we had estimated at
    `estimated` tokens (at pressure 1) in a window whose budget is `budget`."""
    ceiling = current * SHRINK
    stepped = max(FLOOR, current * STEP)
    n, limit = overflow.prompt_tokens, overflow.limit
    if not n or not limit or estimated <= 0 or budget <= 0:
        return stepped
    allowed = limit - (overflow.output if overflow.output is not None else reserve)
    if allowed <= 0:
        return stepped
    wanted = SAFETY * allowed * estimated / (n * budget)
    return max(FLOOR, min(wanted, ceiling))
