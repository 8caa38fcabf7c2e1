"""The four strategies, applied in order until a conversation fits."""

from shared.strategies.clear import ClearToolResults
from shared.strategies.drop import DropOldest
from shared.strategies.summarize import Summarize
from shared.strategies.truncate import TruncateToolResults
from shared.strategies.work import Limits, Strategy, Work

__all__ = [
    "ClearToolResults",
    "DropOldest",
    "Limits",
    "Strategy",
    "Summarize",
    "TruncateToolResults",
    "Work",
]
