"""Serving-benchmark runs as input (issue 30): importers, the client simulated as it runs, replay, fit."""
