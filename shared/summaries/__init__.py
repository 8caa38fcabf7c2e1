"""Summaries: records and the book, the incremental fold, the summarizers, the LLM protocol."""
