"""Cost layer: cost profiles, their importers, the analytic builder and fitting."""
