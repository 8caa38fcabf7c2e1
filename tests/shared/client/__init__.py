"""Tests of shared/client."""
