"""Serving benchmarks as input: the benchmark client simulated as it runs (client), runs tables, replay."""
