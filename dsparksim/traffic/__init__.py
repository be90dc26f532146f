"""Traffic: open-loop arrival processes, trace replay and closed-loop request pools.

    from dsparksim.traffic import TrafficConfig, build_workload
    wl = build_workload(TrafficConfig(mode="poisson", rate=4.0, duration_s=600), np.random.default_rng(0))

Lengths default to a 2,000-row sample of the Azure 2023 conv trace shipped in the wheel (traces/README.md).
"""
from dsparksim.traffic.arrivals import arrival_times, interarrival_cv, interarrivals
from dsparksim.traffic.base import Workload
from dsparksim.traffic.build import build_workload, mooncake_groups
from dsparksim.traffic.config import MODES, TrafficConfig, parse_domain
from dsparksim.traffic.readers import TraceTable, detect_format, read_trace
from dsparksim.traffic.sources import SHIPPED, shipped_path

__all__ = ["MODES", "SHIPPED", "TraceTable", "TrafficConfig", "Workload", "arrival_times", "build_workload",
           "detect_format", "interarrival_cv", "interarrivals", "mooncake_groups", "parse_domain", "read_trace",
           "shipped_path"]
