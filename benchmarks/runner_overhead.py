"""Runner overhead benchmark.

1. Real engine host overhead per step (acceptance draw + policy + tensor building + sampling + bookkeeping:
   everything but the drafter and target forwards) vs the forward times, at 16 and 64 decoding requests
   (tiny CPU target, confidence policy, K=7, context 64): trace-replay mode (random-weight target + drafter
   proxy) and live mode (the trained pair in models/: drafter propose + state update count as draft; rejection
   sampling as host).
2. The policy's own cost per step (``choose`` + ``observe``) at 256 and 1024 requests x K=7, step_time priced
   on a measured profile's dense table the way the engines do (target: < 1 ms at 1024 x 7 on this CPU).

    python benchmarks/runner_overhead.py [--steps 40] [--out results.json]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def engine_overhead(n: int, steps: int, policy_spec: str = "confidence", K: int = 7, ctx: int = 64,
                    live: bool = False) -> dict:
    from dsparksim.acceptance import load_acceptance
    from dsparksim.policies import make_policy
    from dsparksim.cost.profile import load_profile
    from dsparksim.runner.executor import Executor, ExecutorConfig, build_models
    from dsparksim.runner.timing import profiling_engine
    from dsparksim.runner.models import parse_model

    ex = ExecutorConfig()
    out = steps * (K + 1) + 8
    T = ctx + out + K + 2
    if live:
        from dsparksim.runner.live import LiveExecutor
        from dsparksim.runner.timing import LiveDrafters
        from dsparksim.runner.models import load_target
        cfg, tm, _ = load_target(f"ckpt:{REPO / 'models' / 'target.pt'}", "cpu", "float32")
        target, _ = build_models(cfg, ex, tm)
        ld = LiveDrafters.load(str(REPO / "models"), ["dspark"], target)
        exe = LiveExecutor(target, ld.drafters["dspark"], "dspark", ld.temps["dspark"], ld.prompts, ex, T=T, slots=n)
    else:
        cfg, _ = parse_model("tiny")
        target, proxy = build_models(cfg, ex)
        exe = Executor(target, proxy, ex, T=T, slots=n)
    pol = make_policy(policy_spec)
    pol.reset(K, np.random.default_rng(0))
    prof_path = REPO / "profiles" / "cpu-tiny.json"
    prof = load_profile(str(prof_path) if prof_path.is_file() else "a100-llama3-8b-tp1").with_extrapolation(True)
    acc = load_acceptance(str(REPO / "traces" / "sample_dspark_k7.csv"), K)
    st = profiling_engine(exe, n=n, ctx=ctx, out_len=out, T=T, K=K, drafter="dspark", policy=pol, acceptance=acc,
                          profile=prof, max_batched_tokens=n * (K + 1), prefill_chunk_tokens=1, live=live,
                          rng=np.random.default_rng(0))
    now = 0.0
    for _ in range(steps):
        _, _, now = st.step(now)
    st = {k: np.asarray(v[3:]) for k, v in st.ranks[0].log.items()}   # first 3 steps = warm-up
    med = {k: float(np.median(st[k])) * 1e3 for k in ("dt", "t_target", "t_draft", "t_host")}
    return {"mode": "live" if live else "replay", "n_req": n, "steps": len(st["dt"]), "step_ms": med["dt"], "target_ms": med["t_target"],
            "draft_ms": med["t_draft"], "host_ms": med["t_host"], "host_share": med["t_host"] / med["dt"],
            "mean_M": float(st["M"].mean())}


def policy_cost(n: int, policy_spec: str, reps: int = 50, K: int = 7) -> dict:
    from dsparksim.policies import make_policy
    from dsparksim.policies.base import StepContext
    from dsparksim.cost.profile import load_profile

    prof = load_profile("a100-llama3-8b-tp1")
    maxM = n * (K + 1)
    table = np.full(maxM + 1, np.nan)
    table[1:] = prof.verify_time(np.arange(1, maxM + 1), 0)
    extra = float(prof.nontrimmable_time("dspark", n, K))
    rng = np.random.default_rng(0)
    pol = make_policy(policy_spec)
    pol.reset(K, rng)
    ts = []
    for _ in range(reps + 5):
        conf = rng.beta(8, 2, size=(n, K))
        ctx = StepContext(conf=conf, survival=np.cumprod(conf, 1), request_ids=np.arange(n), base_tokens=n,
                          step_time=lambda M: table[M] + extra, max_tokens=maxM)
        t0 = time.perf_counter()
        L = pol.choose(ctx)
        a = np.minimum(L, rng.integers(0, K + 1, n))
        pol.observe(ctx.request_ids, L, a)
        ts.append(time.perf_counter() - t0)
    return {"policy": policy_spec, "n_req": n, "K": K, "median_ms": float(np.median(ts[5:])) * 1e3,
            "p90_ms": float(np.percentile(ts[5:], 90)) * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    res = {"engine": [engine_overhead(n, a.steps, live=lv) for lv in (False, True) for n in (16, 64)],
           "policy": [policy_cost(n, p) for n in (256, 1024)
                      for p in ("fixed:7", "threshold:0.5", "goodput", "confidence", "confidence-async:2")]}
    for r in res["engine"]:
        print(f"engine {r['mode']:>6} n={r['n_req']:>3}: step {r['step_ms']:.2f} ms = target {r['target_ms']:.2f} + draft "
              f"{r['draft_ms']:.2f} + host {r['host_ms']:.2f} ms (host {100 * r['host_share']:.0f}%, mean M "
              f"{r['mean_M']:.0f})")
    for r in res["policy"]:
        print(f"policy {r['policy']:>20} n={r['n_req']:>5} K=7: median {r['median_ms']:.3f} ms, p90 {r['p90_ms']:.3f} ms")
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
