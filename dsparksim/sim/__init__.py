"""Simulation layer: the scheduler/engine, KV memory, cluster, disaggregation, routers, request table, streams."""
