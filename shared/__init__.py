"""prefit's core library: fit long LLM conversations into a model's input window."""

from shared.client import AsyncPrefitClient, PrefitClient
from shared.counting.calibration import CalibratedCounter, MemoryRatios, RatioStore
from shared.counting.counters import HeuristicCounter, TiktokenCounter
from shared.counting.protocol import TokenCounter
from shared.errors import (
    ConfigError,
    ContextLengthExceeded,
    DoesNotFit,
    InvalidId,
    InvalidRequest,
    InvalidTranscript,
    LeaseLost,
    LengthMismatch,
    LLMError,
    NotFound,
    NotReplicated,
    PrefitError,
    RetryableLLMError,
    ServiceUnavailable,
    StoreFormatUnknown,
    StoreUnavailable,
    TooLarge,
    Unauthorized,
    UnknownModel,
)
from shared.hashing import prefix_hash, prefix_hashes
from shared.messages import Message, ToolSpec, groups, validate
from shared.policy import ContextPolicy, Prepared, SummaryPlan
from shared.strategies import (
    ClearToolResults,
    DropOldest,
    Strategy,
    Summarize,
    TruncateToolResults,
    Work,
)
from shared.summaries.book import SummaryBook, SummaryRecord
from shared.summaries.llm import Completion, LLMClient
from shared.summaries.summarizers import Summarizer

__all__ = [
    "AsyncPrefitClient",
    "CalibratedCounter",
    "ClearToolResults",
    "Completion",
    "ConfigError",
    "ContextLengthExceeded",
    "ContextPolicy",
    "DoesNotFit",
    "DropOldest",
    "HeuristicCounter",
    "InvalidId",
    "InvalidRequest",
    "InvalidTranscript",
    "LLMClient",
    "LLMError",
    "LeaseLost",
    "LengthMismatch",
    "MemoryRatios",
    "Message",
    "NotFound",
    "NotReplicated",
    "PrefitClient",
    "PrefitError",
    "Prepared",
    "RatioStore",
    "RetryableLLMError",
    "ServiceUnavailable",
    "StoreFormatUnknown",
    "StoreUnavailable",
    "Strategy",
    "Summarize",
    "Summarizer",
    "SummaryBook",
    "SummaryPlan",
    "SummaryRecord",
    "TiktokenCounter",
    "TokenCounter",
    "TooLarge",
    "ToolSpec",
    "TruncateToolResults",
    "Unauthorized",
    "UnknownModel",
    "Work",
    "groups",
    "prefix_hash",
    "prefix_hashes",
    "validate",
]
