"""Python client of the prefit HTTP API: `PrefitClient` (sync) and `AsyncPrefitClient` (async).

Both speak the contract of docs/design.md, return frozen dataclasses, and raise the typed
errors of shared/errors.py from the service's `{"error": {"type", "message", ...}}` bodies.
A 503 or a refused connection is retried with exponential backoff (honouring `Retry-After`);
a request that may have reached the service (read timeout, dropped connection, or a 503 from
the request deadline, whose body says `"outcome": "unknown"`) is retried only when repeating
it is harmless: reads, prepare, replace, delete, and appends that state `expected_length`
(a repeat then fails with `LengthMismatch` instead of appending twice).
"""

from shared.client.aio import AsyncPrefitClient
from shared.client.calls import (
    AppendResult,
    ConversationInfo,
    Health,
    PreparedPrompt,
    SummaryInfo,
    error_from_response,
)
from shared.client.sync import PrefitClient

__all__ = [
    "AppendResult",
    "AsyncPrefitClient",
    "ConversationInfo",
    "Health",
    "PrefitClient",
    "PreparedPrompt",
    "SummaryInfo",
    "error_from_response",
]
