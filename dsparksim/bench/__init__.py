"""Serving-benchmark runs as input (issue 30): the runs table (``runs``), its importers, the client simulated as it
runs, the speculative-config mapping (``spec``), replay."""
