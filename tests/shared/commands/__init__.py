"""Tests of shared/commands."""
