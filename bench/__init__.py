"""Benchmarks: each module a runnable `python -m bench.<name>`; figures in docs/benchmarks.md."""
