"""Measured serving-benchmark runs as input: the runs table (``runs``) and the importers that fill it."""
