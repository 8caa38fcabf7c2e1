"""Tests of shared/formats."""
