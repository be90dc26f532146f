"""Results layer: metrics, bench JSON, output files, frontiers, plots, statistics."""
