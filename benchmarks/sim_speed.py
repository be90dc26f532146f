"""Benchmark: how fast the simulator runs, in simulated seconds per wall second (x real time), and its peak memory.

Run on demand (never as a test):  python benchmarks/sim_speed.py [--quick] [--replicas N [N ...]] [--no-table]

Prints
  * the headline: a 1-hour run, policy confidence, K=7, 256 concurrent users, profile h100-llama2-7b-tp1,
    timed as a whole process in a fresh subprocess (interpreter start, imports, simulation, summary and the result
    files `dsparksim run` writes), with its peak RSS; the split import / simulate / write is printed too;
  * with --replicas N [N ...] (only if EngineConfig has a ``replicas`` field): the same for N replicas x 256 users
    each, over --replicas-duration simulated seconds (default: the headline's);
  * a table for 16, 64, 256, 1024, 4096 users x every policy of dsparksim.results.frontier.DEFAULT_POLICIES, timed in
    process around ``simulate()`` (the loop plus workload set-up and summary; no interpreter start, no files),
    over a shorter simulated duration stated in the output.
Closed loop with exactly N users running: the KV capacity is lifted (one H100 holds ~80 such 7B requests; this
measures the simulator, not the GPU) and above 4096 batch tokens the profile is extrapolated. Absolute figures
depend on the machine and its load (they are noisy on shared machines); compare figures from one run.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

K = 7
PROFILE = "h100-llama2-7b-tp1"
PROFILE_MAX_TOKENS = 4096  # largest breakpoint of h100-llama2-7b-tp1
USERS = (16, 64, 256, 1024, 4096)
SEED = 1


def engine_kwargs(users: int) -> dict:
    """EngineConfig arguments for ``users`` concurrent requests (KV lifted, token budget sized to hold them)."""
    need = users * (1 + K) + 2048
    return dict(block_size=K, max_num_seqs=max(1024, users), kv_capacity_tokens=10**9,
                max_batched_tokens=PROFILE_MAX_TOKENS if need <= PROFILE_MAX_TOKENS else need,
                extrapolate=need > PROFILE_MAX_TOKENS)


# The child process: only dsparksim imports are timed as start-up (this file imports pandas via frontier).
CHILD = r"""
import time
t0 = time.perf_counter()
import dataclasses, json, resource, sys, tempfile
import dsparksim
from dsparksim.config import EngineConfig, RunConfig
from dsparksim.sim.simulate import simulate, write_run
from dsparksim.traffic import TrafficConfig
t1 = time.perf_counter()
spec = json.loads(sys.argv[1])
eng = dict(spec["engine"])
if spec["replicas"] is not None:
    eng["replicas"] = spec["replicas"]
    eng["router"] = spec["router"]
cfg = RunConfig(policy=spec["policy"], profile=spec["profile"], acceptance="dspark", engine=EngineConfig(**eng),
                traffic=TrafficConfig(mode="closed", concurrency=spec["users"], duration_s=spec["duration"]),
                seed=spec["seed"])
out = simulate(cfg)
t2 = time.perf_counter()
if spec["write"]:
    with tempfile.TemporaryDirectory() as d:
        write_run(out, d + "/out")
t3 = time.perf_counter()
try:
    steps = len(out.result.steps["dt"])
except Exception:
    steps = None
peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
try:   # which engine stepped it (after the timing): the compiled kernel, or numpy and why
    from dsparksim.sim import fastpath
    from dsparksim.sim.simulate import prepare
    why = fastpath.refusal(prepare(cfg).sim)
    engine = "numpy (numba not installed or DSPARKSIM_KERNEL=0)" if not fastpath.enabled() else (
        "compiled kernel" if why is None else f"numpy ({why})")
except ImportError:
    engine = "numpy"
print(json.dumps({"package": dsparksim.__file__, "engine": engine, "import_s": t1 - t0, "simulate_s": t2 - t1, "write_s": t3 - t2,
                  "steps": steps, "sim_time_s": float(out.summary.get("sim_time_s", spec["duration"])),
                  "completed": out.summary.get("num_requests_completed"),
                  "peak_rss_mib": peak_rss}))
"""


# Replicas line: least-outstanding keeps 256 users on each replica; round-robin in closed loop lets the replicas'
# user counts drift apart (measured 29 vs 366 running after 600 s), which is another workload. pinned (--router)
# pins 256 users to each replica exactly, and such a run can be sharded (benchmarks/fleet_scale.py).
ROUTER = "least-outstanding"


def whole_process(policy: str, users: int, duration: float, replicas: int | None, write: bool,
                  router: str = ROUTER) -> dict:
    """Run one configuration in a fresh interpreter; wall time is measured around the whole process."""
    spec = dict(policy=policy, profile=PROFILE, users=users, duration=duration, seed=SEED, replicas=replicas,
                router=router,
                engine=engine_kwargs(users // (replicas or 1)), write=write)   # per-replica batch limits
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"benchmark child failed ({policy}, {users} users):\n{r.stderr}")
    res = json.loads(r.stdout.strip().splitlines()[-1])
    res["wall_s"] = wall
    res["x_real"] = res["sim_time_s"] / wall
    res["x_real_loop"] = res["sim_time_s"] / res["simulate_s"]
    return res


def headline(label: str, res: dict) -> str:
    steps = res["steps"]
    per_step = f", {1e6 * res['simulate_s'] / steps:.0f} us/step in simulate()" if steps else ""
    return (f"{label}: {res['x_real']:.0f}x real time whole process ({res['wall_s']:.2f} s wall for "
            f"{res['sim_time_s']:.0f} simulated s), peak RSS {res['peak_rss_mib']:.0f} MiB\n"
            f"    split: start-up/imports {res['import_s']:.2f} s, simulate() {res['simulate_s']:.2f} s "
            f"({res['x_real_loop']:.0f}x real time{per_step}, {steps} steps), "
            f"writing results {res['write_s']:.2f} s; {res['completed']} requests completed; stepped by "
            f"{res.get('engine', 'numpy')}")


def in_process(policy: str, users: int, duration: float) -> tuple[float, float, int]:
    from dsparksim.config import EngineConfig, RunConfig
    from dsparksim.sim.simulate import simulate
    from dsparksim.traffic import TrafficConfig

    t = TrafficConfig(mode="closed", concurrency=users, duration_s=duration)
    cfg = RunConfig(policy=policy, profile=PROFILE, acceptance="dspark", engine=EngineConfig(**engine_kwargs(users)),
                    traffic=t, seed=SEED)
    t0 = time.perf_counter()
    out = simulate(cfg)
    wall = time.perf_counter() - t0
    return out.result.sim_time_s / wall, wall, len(out.result.steps["dt"])


def has_replicas_field() -> bool:
    import dataclasses

    from dsparksim.config import EngineConfig
    return "replicas" in {f.name for f in dataclasses.fields(EngineConfig)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter table cells (noisier); the headline stays 1 hour")
    ap.add_argument("--duration", type=float, default=3600.0, help="headline simulated seconds [%(default)s]")
    ap.add_argument("--table-duration", type=float, default=None,
                    help="simulated seconds per table cell [60; 20 with --quick]")
    ap.add_argument("--replicas", type=int, nargs="+", default=None, metavar="N",
                    help="also time N replicas x 256 users each, for each N given (needs EngineConfig.replicas)")
    ap.add_argument("--replicas-duration", type=float, default=None,
                    help="simulated seconds of the replica lines [the headline's]")
    ap.add_argument("--router", default=ROUTER, help="router of the replica lines [%(default)s]")
    ap.add_argument("--no-headline", action="store_true", help="skip the 1-hour headline (replica lines only)")
    ap.add_argument("--no-table", action="store_true", help="headline lines only")
    ap.add_argument("--no-write", action="store_true", help="headline child does not write the result files")
    args = ap.parse_args()
    tdur = args.table_duration or (20.0 if args.quick else 60.0)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"dsparksim speed | python {platform.python_version()} | {os.cpu_count()} CPUs, load average {load:.2f} | "
          f"profile {PROFILE}, acceptance dspark, K={K}, closed loop, KV capacity lifted, seed {SEED}")
    print("x real = simulated seconds / wall seconds; targets (issue 28): 1-hour confidence run at 256 users "
          ">= 400x whole process with numpy alone (>= 1000x with a compiled kernel), <= 300 MiB peak RSS; "
          "4 replicas x 256 users >= 250x")

    if not args.no_headline:
        res = whole_process("confidence", 256, args.duration, None, not args.no_write)
        print(f"code under test: {os.path.dirname(res['package'])} (the child runs in {os.getcwd()}: a dsparksim/ "
              "there wins over PYTHONPATH)")
        print(headline(f"headline, confidence, 256 users, {args.duration:g} s", res), flush=True)

    if args.replicas is not None:
        rdur = args.replicas_duration or args.duration
        if has_replicas_field():
            for n in args.replicas:
                res = whole_process("confidence", 256 * n, rdur, n, not args.no_write, args.router)
                print(headline(f"{n} replicas x 256 users ({args.router}), confidence, {rdur:g} s", res),
                      flush=True)
        else:
            print(f"--replicas {args.replicas}: skipped, EngineConfig has no `replicas` field in this build")

    if args.no_table:
        return
    from dsparksim.results.frontier import DEFAULT_POLICIES

    print(f"\ntable: x real time of simulate() in process (no interpreter start, no files), {tdur:g} simulated s "
          f"per cell; steps/s = engine steps per wall second")
    print(f"{'policy':20s}" + "".join(f"{f'{u} users':>11s}{'steps/s':>9s}" for u in USERS))
    for pol in DEFAULT_POLICIES:
        row = f"{pol:20s}"
        for u in USERS:
            x, wall, steps = in_process(pol, u, tdur)
            row += f"{x:11.0f}{steps / wall:9.0f}"
        print(row, flush=True)


if __name__ == "__main__":
    main()
