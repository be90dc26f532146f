"""Acceptance sources."""
