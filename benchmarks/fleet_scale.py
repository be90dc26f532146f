"""Benchmark: a fleet run sharded across worker processes (issue 28 part 7): wall time on 1 and 2 workers and the
projection to 16.

Run on demand (never as a test):  python benchmarks/fleet_scale.py [--replicas 64] [--duration 3600]
                                  [--users 64] [--workers 1 2] [--project 16]

A closed loop of ``--users`` users per replica (router ``pinned``: users pinned to replicas, so the replicas never
interact), policy confidence, K=7, profile h100-llama2-7b-tp1, acceptance dspark, seed 1. 1 worker = the plain
one-process ``simulate()``; N workers = ``run_fleet`` on the local process pool (N shards, merged). Each time is the
wall time in this process around the call (inputs resolved, simulated, merged, summarised; no files written), and
the merged result is checked equal to the one-process result. The projection fits wall(N) = a + b / N to the
measured points (a: the serial part: set-up, merge, summary, process start; b: the shardable simulation) and
assumes N free cores. Figures depend on the machine and its load: compare figures from one run.
"""
from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np

K = 7
PROFILE = "h100-llama2-7b-tp1"
SEED = 1


def config(replicas: int, users: int, duration: float):
    from dsparksim.config import EngineConfig, RunConfig
    from dsparksim.traffic import TrafficConfig

    eng = EngineConfig(block_size=K, replicas=replicas, router="pinned", max_num_seqs=max(1024, users))
    return RunConfig(policy="confidence", profile=PROFILE, acceptance="dspark", engine=eng,
                     traffic=TrafficConfig(mode="closed", concurrency=users * replicas, duration_s=duration),
                     seed=SEED)


def timed(workers: int, cfg):
    """(wall s, this process's CPU s, the shards' CPU s, the output)."""
    from dsparksim.sim.simulate import simulate
    from dsparksim.sweep.fleet import run_fleet

    shards: list[float] = []
    t0, c0 = time.perf_counter(), time.process_time()
    out = simulate(cfg) if workers == 1 else run_fleet(cfg, backend="local", workers=workers,
                                                       on_shard=lambda r: shards.append(r["cpu_s"]))
    return time.perf_counter() - t0, time.process_time() - c0, shards, out


def digest(out) -> str:
    """sha256 of a run's summary, step log and finish times: the runs compared by it need not be held in memory at
    once (a 64-replica hour holds ~6 GB; keeping the first while the pool forks ran a 24 GiB machine out of
    memory)."""
    import hashlib
    import json

    h = hashlib.sha256(json.dumps(out.summary, sort_keys=True, default=str).encode())
    for k in sorted(out.result.steps):
        a = np.asarray(out.result.steps[k])
        h.update(k.encode() + str(a.dtype).encode() + np.ascontiguousarray(a).tobytes())
    h.update(np.ascontiguousarray(out.result.finish_s).tobytes())
    return h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", type=int, default=64)
    ap.add_argument("--duration", type=float, default=3600.0, help="simulated seconds [%(default)s]")
    ap.add_argument("--users", type=int, default=64, help="closed-loop users per replica [%(default)s]")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker counts to time [1 2]")
    ap.add_argument("--project", type=int, default=16, help="worker count to project to [%(default)s]")
    args = ap.parse_args()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"dsparksim fleet scale | python {platform.python_version()} | {os.cpu_count()} CPUs, load average "
          f"{load:.2f} | {args.replicas} replicas x {args.users} users (closed loop, router pinned), "
          f"{args.duration:g} simulated s, confidence, K={K}, {PROFILE}, seed {SEED}")
    cfg = config(args.replicas, args.users, args.duration)
    from dsparksim.sim.simulate import simulate
    simulate(config(1, args.users, 1.0))   # warm-up: the one-time loads (profile, acceptance fit) out of the timing
    walls: dict[int, float] = {}
    ref = None
    cpu_1 = parent = shard_total = None
    for w in args.workers:
        wall, cpu, shards, out = timed(w, cfg)
        walls[w] = wall
        if w == 1:
            cpu_1 = cpu
        else:
            parent, shard_total = cpu, sum(shards)
        cpus = f"CPU: {cpu:.1f} s this process" + (f", shards {' + '.join(f'{c:.1f}' for c in shards)} s"
                                                   if shards else "")
        steps = len(out.result.steps["dt"])
        check, d = "", digest(out)
        if ref is None:
            ref = d
        else:
            check = " | merged result equals the first run's (sha256 of summary, steps, finish times): " + (
                "yes" if d == ref else "NO")
        print(f"{w:3d} worker(s): {wall:8.1f} s wall, {args.duration / wall:7.1f}x real time, {steps} steps, "
              f"{out.summary['num_requests_completed']} requests completed ({cpus}){check}", flush=True)
        del out   # before the next run forks its pool
    if len(walls) >= 2:
        n = np.array(sorted(walls), float)
        t = np.array([walls[int(x)] for x in n])
        b, a = np.polyfit(1.0 / n, t, 1)
        p = args.project
        if a < 0 or b <= 0:
            print(f"wall times {walls} do not fit a + b / N with a >= 0, b > 0 (a loaded machine?): no wall projection")
        else:
                print(f"fit wall(N) = {a:.1f} s + {b:.1f} s / N over N = {', '.join(str(int(x)) for x in n)}; "
                  f"projected on {p} workers (assumes {p} free cores): {a + b / p:.1f} s wall, "
                  f"{args.duration / (a + b / p):.1f}x real time")
    if parent is not None and shard_total is not None:
        # CPU-time projection (robust on a loaded machine): the parent's serial work (set-up, merge, summary) plus
        # the largest of p shards, each ceil(replicas / p) replicas of the shards' per-replica CPU
        p = args.project
        per_rep = shard_total / args.replicas
        proj = parent + per_rep * -(-args.replicas // p)
        one = f" (1 worker: {cpu_1:.1f} s CPU, {args.duration / cpu_1:.1f}x)" if cpu_1 else ""
        print(f"CPU-time projection on {p} workers: {parent:.1f} s serial (set-up, merge, summary) + "
              f"{per_rep * -(-args.replicas // p):.1f} s for the largest shard = {proj:.1f} s, "
              f"{args.duration / proj:.1f}x real time{one}")


if __name__ == "__main__":
    main()
