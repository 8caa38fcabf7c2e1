"""Tests of shared/service."""
