"""Where speculation stops paying: the load at which plain decoding (`none`) out-serves every speculative policy.

Run on demand (never as a test):
    python benchmarks/none_crossover.py [--profiles P,..] [--loads 1,8,..] [--duration S] [--seeds N] [--out CSV]

For each shipped profile (or those given) and each closed-loop concurrency, runs ``none`` and the speculative
policies (default: mtp1, fixed:7, goodput, confidence, confidence-async:2; dspark acceptance, K = 7) on the same
paired request streams, and prints per load: none's throughput, the best speculative policy and its throughput,
and their ratio. The crossover is the smallest load from which none's mean throughput exceeds the best
speculative policy's at every larger load tried ("never" if it does not happen in the range). Throughputs are means
over ``--seeds`` paired seeds. A cell that leaves the profile's measured range (the cpu-tiny profiles measured
batches of up to 64 requests; none runs more at once than K = 7 policies) stops that profile's load list, printed.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", default=None, help="comma-separated profile names [every shipped profile]")
    ap.add_argument("--loads", default="1,8,32,64,128,256,512", help="concurrency levels [%(default)s]")
    ap.add_argument("--policies", default="mtp1,fixed:7,goodput,confidence,confidence-async:2",
                    help="speculative policies [%(default)s]")
    ap.add_argument("--duration", type=float, default=10.0, help="simulated seconds per cell [%(default)s]")
    ap.add_argument("--seeds", type=int, default=1, help="paired seeds per cell [%(default)s]")
    ap.add_argument("--kv-capacity", type=int, default=None,
                    help="KV capacity in tokens for every profile [each profile's own]; lift it to see the "
                         "compute-bound regime the shipped capacities never reach")
    ap.add_argument("--out", default=None, help="also write the table as CSV here")
    a = ap.parse_args(argv)

    from dsparksim.config import EngineConfig, RunConfig
    from dsparksim.errors import ConfigError, InputError
    from dsparksim.cost.profile import list_profiles
    from dsparksim.sim.simulate import simulate
    from dsparksim.traffic import TrafficConfig

    profiles = a.profiles.split(",") if a.profiles else list_profiles()
    loads = [int(x) for x in a.loads.split(",")]
    spec = a.policies.split(",")
    rows = []
    for prof in profiles:
        cross: int | None = None
        per_load = []
        for users in loads:
            thr = {}
            try:
                for pol in ["none", *spec]:
                    vals = [simulate(RunConfig(
                        policy=pol, profile=prof, seed=s, engine=EngineConfig(kv_capacity_tokens=a.kv_capacity),
                        traffic=TrafficConfig(mode="closed", concurrency=users, duration_s=a.duration),
                    )).summary["output_throughput_tok_s"] for s in range(a.seeds)]
                    thr[pol] = float(np.mean(vals))
            except (ConfigError, InputError) as e:   # e.g. none runs more requests than the profile measured
                print(f"{prof:22s} {users:5d} users  stopped: {pol}: {e}", flush=True)
                break
            best = max(spec, key=lambda p: thr[p])
            row = {"profile": prof, "users": users, "none_tok_s": thr["none"], "best_policy": best,
                   "best_tok_s": thr[best], "none_over_best": thr["none"] / thr[best],
                   **{f"{p}_tok_s": thr[p] for p in spec}}
            rows.append(row)
            per_load.append(row)
            print(f"{prof:22s} {users:5d} users  none {thr['none']:9.1f} tok/s   best {best:20s} {thr[best]:9.1f}"
                  f"   none/best {row['none_over_best']:.3f}", flush=True)
        for i in range(len(per_load)):
            if all(r["none_over_best"] > 1 for r in per_load[i:]):
                cross = per_load[i]["users"]
                break
        top = per_load[-1]["users"] if per_load else 0
        print(f"{prof}: crossover {f'never (up to {top} users)' if cross is None else f'{cross} users'}", flush=True)
    if a.out:
        import pandas as pd
        pd.DataFrame(rows).to_csv(a.out, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
