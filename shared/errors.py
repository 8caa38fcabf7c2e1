"""The one error tree: everything prefit raises on purpose derives from `PrefitError`."""

from __future__ import annotations


class PrefitError(Exception):
    """Base class of every error prefit raises on purpose."""


class InvalidTranscript(PrefitError, ValueError):
    """A transcript (or one of its messages) is malformed; names the index and the reason."""

    def __init__(self, reason: str, index: int | None = None) -> None:
        self.reason = reason
        self.index = index
        where = f"message {index}: " if index is not None else ""
        super().__init__(f"{where}{reason}")


class DoesNotFit(PrefitError):
    """What may never be cut (head, task, recent turns, tool specs) exceeds the budget."""

    def __init__(
        self,
        *,
        tokens: int,
        budget: int,
        head_tokens: int,
        tail_tokens: int,
        tools_tokens: int = 0,
        other_tokens: int = 0,
        floor_chars: int | None = None,
    ) -> None:
        self.tokens = tokens
        self.budget = budget
        self.head_tokens = head_tokens
        self.tail_tokens = tail_tokens
        self.tools_tokens = tools_tokens
        self.other_tokens = other_tokens  # what else was kept: a summary, drop markers
        self.floor_chars = floor_chars
        shortened = (
            f", even with every tool output there cut to {floor_chars} characters"
            if floor_chars is not None
            else ""
        )
        super().__init__(
            f"cannot fit: {tokens} tokens after every strategy, budget {budget} (head "
            f"{head_tokens} + recent turns {tail_tokens} + tool specs {tools_tokens} tokens "
            f"cannot be cut{shortened}; summary and markers {other_tokens})"
        )


class ReplyDoesNotFit(DoesNotFit):
    """Even the deepest fit leaves less of the window than the least reply a request may get."""

    def __init__(self, *, tokens: int, window: int, floor: int, asked: int, model: str) -> None:
        self.tokens = tokens
        self.budget = window - floor
        self.head_tokens = self.tail_tokens = self.tools_tokens = self.other_tokens = 0
        self.floor_chars = None
        self.window, self.floor, self.asked = window, floor, asked
        PrefitError.__init__(
            self,
            f"prompt is too long: {tokens} tokens > {window - floor} maximum (prefit: what "
            f"may never be cut, the system prompt, the task and the last turn, leaves less of "
            f"{model}'s {window}-token window than the least reply of {floor} tokens; "
            f"{asked} were asked; nothing was sent)",
        )


class InvalidId(PrefitError, ValueError):
    """A tenant, conversation or marker id is empty, too long or has forbidden characters."""


class InvalidRequest(PrefitError, ValueError):
    """A request's fields (outside its messages) are missing, mistyped or out of range."""


class ConfigError(PrefitError, ValueError):
    """A policy, strategy or setting was given an impossible value."""


class ImplausibleObservation(PrefitError, ValueError):
    """A calibration observation is out of bounds, or too far from a settled ratio; refused."""


class WriteConflict(PrefitError):
    """A write kept meeting a conversation changed under it; nothing was written."""


class UnknownModel(PrefitError, LookupError):
    """A model has no configured window and the request gave none."""


class NotFound(PrefitError, LookupError):
    """A conversation (or other stored object) does not exist for this tenant."""


class LengthMismatch(PrefitError):
    """An append stated an expected length that differs from the stored one."""

    def __init__(self, expected: int, actual: int) -> None:
        self.expected = expected
        self.actual = actual
        super().__init__(f"expected length {expected}, stored length is {actual}")


class StoreUnavailable(PrefitError):
    """Redis (store or broker) cannot be reached right now."""


class NotReplicated(StoreUnavailable):
    """A write reached the primary but not enough replicas in time: it may have landed."""


class StoreFormatUnknown(StoreUnavailable):
    """A stored message is in a format this version cannot read (a newer prefit wrote it)."""


class ServiceUnavailable(PrefitError):
    """The prefit service itself cannot be reached (client side)."""


class Unauthorized(PrefitError):
    """A request carried no API key, or one that matches no tenant."""


class Forbidden(PrefitError):
    """The request may not be served here (open mode reached on a non-loopback address)."""


class TooLarge(PrefitError):
    """A request exceeds a configured size limit."""


class OverShare(PrefitError):
    """A tenant already holds its share of a shared resource (its concurrent upstream
    requests); retry after `retry_after` seconds."""

    def __init__(self, message: str, *, retry_after: int = 1) -> None:
        self.retry_after = retry_after
        super().__init__(message)


class LLMError(PrefitError):
    """A summarizer provider call failed."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        self.status = status
        super().__init__(message)


class RetryableLLMError(LLMError):
    """A provider failure worth retrying (429, 5xx, 529, timeouts); may say how long to wait."""

    def __init__(
        self, message: str, *, status: int | None = None, retry_after: float | None = None
    ) -> None:
        self.retry_after = retry_after
        super().__init__(message, status=status)


class ContextLengthExceeded(LLMError):
    """The provider says the summarizer's own input was too long: retry with smaller chunks."""


class RangeTooLong(ContextLengthExceeded):
    """One turn group, larger than `chunk_tokens`, is too long for the summarizer on its own."""


class LeaseLost(PrefitError):
    """A worker's lease on a conversation expired or was taken; it must not write."""
