"""Benchmark: simulated seconds per wall second, per policy and concurrency, and replay peak memory.

Run on demand (never as a test):  python benchmarks/sim_speed.py [--quick]
Prints one table; ratios in one run are comparable, absolute figures depend on the machine's load.
"""
from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time

from dsparksim.config import EngineConfig, RunConfig
from dsparksim.frontier import DEFAULT_POLICIES
from dsparksim.simulate import simulate
from dsparksim.traffic import TrafficConfig


K = 7
PROFILE_MAX_TOKENS = 4096  # largest breakpoint of h100-llama2-7b-tp1


def speed(policy: str, conc: int, duration: float) -> tuple[float, float, int]:
    """Closed loop with exactly ``conc`` requests running: KV capacity is lifted (a 7B model on one H100 holds
    ~80 such requests; this measures the simulator, not the GPU), and above 4096 batch tokens the profile is
    extrapolated (reported by the run)."""
    t = TrafficConfig(mode="closed", concurrency=conc, duration_s=duration, pool_size=conc * (8 + int(10 * duration)) + 64)
    need = conc * (1 + K) + 2048
    eng = EngineConfig(block_size=K, max_num_seqs=max(1024, conc), kv_capacity_tokens=10**9,
                       max_batched_tokens=PROFILE_MAX_TOKENS if need <= PROFILE_MAX_TOKENS else need,
                       extrapolate=need > PROFILE_MAX_TOKENS)
    cfg = RunConfig(policy=policy, profile="h100-llama2-7b-tp1", acceptance="dspark", engine=eng, traffic=t, seed=1)
    t0 = time.perf_counter()
    out = simulate(cfg)
    wall = time.perf_counter() - t0
    return out.result.sim_time_s / wall, wall, len(out.result.steps["dt"])


def replay_memory(trace: str) -> None:
    code = (
        "import resource,time;from dsparksim.config import RunConfig,EngineConfig;"
        "from dsparksim.traffic import TrafficConfig;from dsparksim.simulate import simulate;"
        f"t=TrafficConfig(mode='trace',trace={trace!r},duration_s=3600.0);"
        "c=RunConfig(policy='confidence',traffic=t,engine=EngineConfig(block_size=7));t0=time.perf_counter();"
        "o=simulate(c);w=time.perf_counter()-t0;"
        "print(f'azure conv 1h replay: {o.summary[\"num_requests_completed\"]} requests, {w:.1f} s wall, '"
        "f'{o.result.sim_time_s/w:.0f}x real time, peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/1024:.0f} MiB')"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter runs (noisier)")
    ap.add_argument("--concurrency", default="64,256,1024")
    ap.add_argument("--trace", default="../shared/data/traces/AzureLLMInferenceTrace_conv.csv")
    args = ap.parse_args()
    dur = 20.0 if args.quick else 60.0
    levels = [int(x) for x in args.concurrency.split(",")]
    print(f"profile h100-llama2-7b-tp1, acceptance dspark, K={K}, closed loop, {dur:g} simulated s per cell, one core;"
          f" x-real = simulated s / wall s")
    print(f"{'policy':22s}" + "".join(f"{f'N={c} x-real':>16s}{'steps/s':>10s}" for c in levels))
    for pol in DEFAULT_POLICIES:
        row = f"{pol:22s}"
        for c in levels:
            x, wall, steps = speed(pol, c, dur)
            row += f"{x:16.0f}{steps / wall:10.0f}"
        print(row, flush=True)
    replay_memory(args.trace)


if __name__ == "__main__":
    main()
