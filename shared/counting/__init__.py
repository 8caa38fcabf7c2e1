"""Counting tokens: the counter protocol, the counters, their caches, encodings, calibration."""
