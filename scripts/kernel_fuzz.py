"""Fuzz the compiled step kernel (dsparksim/sim/kernel.py) against the numpy engine: random closed-loop
configurations, each simulated with DSPARKSIM_KERNEL=0 and =1, must give the same steps columns (values and
dtypes), per-request arrays, summary, ended_by, progress calls, or the same error (type and message).

    python scripts/kernel_fuzz.py [--n 300] [--seed 1] [--mode random|exact|streak|preempt] [--out-dir DIR]

Modes: ``random`` draws every profile in profiles/ and hand-made ones, KV paged/reserve (small to huge), K 1..8,
small slot and token budgets, chunks, 1..5 replicas behind least-outstanding/round-robin, lengths/datasets,
request pools that run out, acceptance and confidence options; ``exact``: hand-made profiles whose step times are
dyadic, so step ends land exactly on the duration and replicas tie; ``streak``: a lengths file in which one row of
10,000 fits (the 10,000-in-a-row stop) or 10 do (long rejection streaks); ``preempt``: paged KV that preempts. The
hand-made profiles and the lengths file are written to --out-dir (a temporary folder by default). Prints every
mismatch with its configuration (JSON: RunConfig/EngineConfig/TrafficConfig fields) and a count; exit status 1 if
any. tests/test_kernel_agreement.py holds the configurations it found."""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import random
import sys
import tempfile
from pathlib import Path

import numpy as np

from dsparksim.config import EngineConfig, RunConfig
from dsparksim.sim import fastpath
from dsparksim.sim.simulate import simulate
from dsparksim.traffic import TrafficConfig

ROOT = Path(__file__).resolve().parents[1]
RESULT_ARRAYS = ("arrival_s", "admitted_s", "first_token_s", "finish_s", "prompt_tokens", "output_tokens",
                 "emitted_tokens", "decode_steps", "verify_tokens", "accepted_tokens", "reject_reason", "preemptions",
                 "recomputed_tokens", "decode_emitted_tokens", "step_accepted_per_pos", "gap_request", "gap_steps",
                 "replica")
DYADIC = ("dy-flat", "dy-stair", "dy-kv", "dy-longctx")


def write_inputs(d: Path) -> None:
    """The hand-made profiles (every time a multiple of a power of two: sums are exact) and the streak lengths."""
    tiny = json.loads((ROOT / "profiles" / "cpu-tiny.json").read_text())
    fitted = json.loads((ROOT / "profiles" / "fitted-h200x8-deepseek-r1-trtllm-1.3.0rc14-ep8.json").read_text())
    specs = {  # verify(M), drafter(tokens), fixed, batch(n), s per KV token, s per chunk, s per prompt token, sq
        "dy-flat": (lambda M: 2**-5, lambda t: 0.0, 0.0, lambda n: 0.0, 0.0, 0.0, 0.0, None, tiny),
        "dy-stair": (lambda M: (16 + M // 8) / 1024, lambda t: 2**-7, 2**-8, lambda n: n / 4096, 0.0, 2**-8, 0.0,
                     None, tiny),
        "dy-kv": (lambda M: (8 + M // 4) / 512, lambda t: 0.0, 2**-6, lambda n: 0.0, 2**-20, 2**-7, 2**-16, None,
                  tiny),
        "dy-longctx": (lambda M: (32 + M // 16) / 1024, lambda t: 2**-8, 2**-9, lambda n: 0.0, 2**-24, 0.0, 0.0,
                       2**-26, fitted),
    }
    for name, (verify, draft, fixed, batch, spk, chunk, tok, sq, src) in specs.items():
        p = copy.deepcopy(src)
        p["name"] = name
        p["verify"] = {"M": list(range(1, 513)), "time_s": [verify(M) for M in range(1, 513)]}
        for dr in p["drafters"].values():
            dr["tokens"] = list(range(1, 4097))
            dr["time_s"] = [draft(t) for t in dr["tokens"]]
        p["fixed_overhead_s"] = fixed
        if "batch_overhead" in p:
            p["batch_overhead"] = {"n_req": list(range(1, 1025)), "time_s": [batch(n) for n in range(1, 1025)]}
        p["attention"]["seconds_per_kv_token"] = spk
        if sq is not None:
            p["attention"]["seconds_per_query_kv"] = p["prefill"]["seconds_per_query_key"] = sq
        p["prefill"]["seconds_per_chunk"], p["prefill"]["seconds_per_token"] = chunk, tok
        p["metadata"]["kv_capacity_tokens"] = 200_000
        (d / f"{name}.json").write_text(json.dumps(p))
    (d / "streak.csv").write_text("ContextTokens,GeneratedTokens\n200,50\n" + "50000,100\n" * 9999)
    (d / "streak10.csv").write_text("ContextTokens,GeneratedTokens\n" + "200,50\n" * 10 + "50000,100\n" * 9990)


def draw_random(rng: random.Random, d: Path) -> dict:
    """A configuration of the ``random`` mode."""
    profiles = sorted(p.stem for p in (ROOT / "profiles").glob("*.json"))
    eng: dict = {"block_size": rng.randint(1, 8)}
    if rng.random() < 0.3:
        eng["kv_policy"] = "reserve"
    r = rng.random()
    if r < 0.25:
        eng["kv_capacity_tokens"] = rng.choice([64, 500, 2000, 3000, 8000, 20000])
    elif r < 0.6:
        eng["kv_capacity_tokens"] = rng.choice([30_000, 60_000, 120_000, 400_000, 10**9])
    if "kv_policy" not in eng and rng.random() < 0.4:
        eng["kv_page_tokens"] = rng.choice([1, 4, 16, 32, 64, 128])
    if "kv_policy" not in eng and rng.random() < 0.3:
        eng["kv_watermark"] = rng.choice([0.0, 0.01, 0.05, 0.2, 0.5])
    if rng.random() < 0.4:
        eng["max_num_seqs"] = rng.choice([1, 2, 3, 5, 8, 16, 64])
    if rng.random() < 0.4:
        eng["max_batched_tokens"] = rng.choice([16, 32, 64, 100, 256, 512, 2048])
    if rng.random() < 0.4:
        eng["prefill_chunk_tokens"] = rng.choice([1, 7, 64, 256, 1000])
    if rng.random() < 0.3:
        eng.update(replicas=rng.randint(2, 5), router=rng.choice(fastpath.ROUTERS))
    if rng.random() < 0.3:
        eng["extrapolate"] = True
    tr: dict = dict(mode="closed", concurrency=rng.choice([1, 2, 3, 8, 32, 100, 256, 600, rng.randint(1, 600)]),
                    duration_s=rng.choice([0.5, 1.0, 3.0, 7.5, 10.0, 20.0, 40.0]))
    r = rng.random()
    if r < 0.25:
        tr["lengths"] = rng.choice(["azure-conv", "azure-code", "sharegpt", "arxiv", "mooncake-long"])
    elif r < 0.4:
        tr.update(dataset_name="random", random_input_len=rng.choice([1, 16, 128, 1024, 5000]),
                  random_output_len=rng.choice([1, 2, 16, 128, 600]))
    if rng.random() < 0.15:
        tr["pool_size"] = rng.choice([5, 50, 300, 2000])
    if rng.random() < 0.2:
        tr["domain"] = rng.choice(["math", "code", "chat", "mix:math=0.3,code=0.3,chat=0.4"])
    c = dict(profile=rng.choice(profiles + ["h100-llama2-7b-tp1"] * 4), engine=eng, traffic=tr,
             seed=rng.randint(0, 10**6))
    if rng.random() < 0.25:
        c["profile"] = str(d / f"{rng.choice(DYADIC)}.json")
        tr["duration_s"] = rng.choice([0.25, 0.5, 1.0, 2.0, 3.0])
    if rng.random() < 0.2:
        c["acceptance"] = rng.choice(["dflash", "eagle3", "tau:1.5"])
    if rng.random() < 0.15:
        c["confidence"] = "raw"
    return c


def draw(mode: str, rng: random.Random, d: Path) -> dict:
    """A configuration of ``mode`` (see the module doc)."""
    if mode == "random":
        return draw_random(rng, d)
    eng: dict = {"block_size": rng.randint(1, 8)}
    if rng.random() < 0.4:
        eng.update(replicas=rng.randint(2, 5), router=rng.choice(fastpath.ROUTERS))
    if mode == "exact":
        tr = dict(mode="closed", concurrency=rng.choice([1, 2, 3, 5, 16, 64]),
                  duration_s=rng.choice([0.125, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0]))
        if rng.random() < 0.3:
            eng["max_num_seqs"] = rng.choice([1, 2, 4, 8])
        if rng.random() < 0.3:
            eng["kv_policy"] = "reserve"
        profile = str(d / f"{rng.choice(DYADIC)}.json")
    elif mode == "streak":
        eng["kv_capacity_tokens"] = 20_000
        tr = dict(mode="closed", concurrency=rng.choice([1, 2, 5]), duration_s=30.0,
                  lengths=str(d / rng.choice(["streak.csv", "streak10.csv"])))
        profile = rng.choice(["h100-llama2-7b-tp1", str(d / "dy-flat.json")])
    else:
        eng["kv_capacity_tokens"] = rng.choice([4000, 8000, 16000, 30000, 60000])
        if rng.random() < 0.5:
            eng["kv_page_tokens"] = rng.choice([1, 8, 16, 64])
        tr = dict(mode="closed", concurrency=rng.choice([16, 64, 200, 600]), duration_s=rng.choice([5.0, 20.0]),
                  lengths=rng.choice(["sharegpt", "arxiv", "azure-code"]))
        profile = rng.choice(["h100-llama2-7b-tp1", str(d / "dy-longctx.json"), "built-h100-llama2-7b-tp1"])
    return dict(profile=profile, engine=eng, traffic=tr, seed=rng.randint(0, 10**6))


def run_one(c: dict, kernel: bool) -> tuple[tuple, bool]:
    """simulate(c) on one engine: (("ok", output, progress calls) or ("err", type, message, progress calls),
    whether the kernel ran)."""
    os.environ[fastpath.ENV] = "1" if kernel else "0"
    ran: list[int] = []
    real = fastpath.run_kernel

    def spy(*a, **k):
        ran.append(1)
        return real(*a, **k)

    fastpath.run_kernel = spy
    calls: list[float] = []
    try:
        cfg = RunConfig(policy="confidence", profile=c["profile"], acceptance=c.get("acceptance", "dspark"),
                        confidence=c.get("confidence", "sts"), engine=EngineConfig(**c["engine"]),
                        traffic=TrafficConfig(**c["traffic"]), seed=c["seed"])
        return ("ok", simulate(cfg, progress=calls.append), calls), bool(ran)
    except Exception as e:   # noqa: BLE001 - compared between the engines
        return ("err", type(e).__name__, str(e), calls), bool(ran)
    finally:
        fastpath.run_kernel = real


def _same(x, y) -> bool:
    x, y = np.asarray(x), np.asarray(y)
    if x.dtype != y.dtype or x.shape != y.shape:
        return False
    return np.array_equal(x.view(np.uint64), y.view(np.uint64)) if x.dtype.kind == "f" else np.array_equal(x, y)


def difference(a: tuple, b: tuple) -> str | None:
    """The first difference between two run_one outcomes, None if they are identical."""
    if a[0] != b[0] or (a[0] == "err" and a[1:] != b[1:]):
        return f"outcome {a[:3] if a[0] == 'err' else 'ok'} vs {b[:3] if b[0] == 'err' else 'ok'}"
    if a[0] == "err":
        return None
    ra, rb = a[1].result, b[1].result
    if list(ra.steps) != list(rb.steps):
        return f"steps columns {list(ra.steps)} vs {list(rb.steps)}"
    for k in ra.steps:
        if not _same(ra.steps[k], rb.steps[k]):
            return f"steps[{k}]"
    for k in RESULT_ARRAYS:
        if not _same(getattr(ra, k), getattr(rb, k)):
            return f"result.{k}"
    if (ra.ended_by, ra.sim_time_s) != (rb.ended_by, rb.sim_time_s):
        return f"ended {ra.ended_by} {ra.sim_time_s} vs {rb.ended_by} {rb.sim_time_s}"
    sa, sb = a[1].summary, b[1].summary
    for k in sa.keys() | sb.keys():
        v, w = sa.get(k), sb.get(k)
        if not (repr(v) == repr(w) or (isinstance(v, float) and isinstance(w, float) and math.isnan(v)
                                        and math.isnan(w))):
            return f"summary[{k}] {v!r} vs {w!r}"
    return None if a[2] == b[2] else f"progress calls {a[2][-3:]} vs {b[2][-3:]}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--mode", choices=("random", "exact", "streak", "preempt"), default="random")
    ap.add_argument("--out-dir", type=Path, default=None)
    args = ap.parse_args(argv)
    d = args.out_dir or Path(tempfile.mkdtemp(prefix="kernel_fuzz_"))
    d.mkdir(parents=True, exist_ok=True)
    write_inputs(d)
    rng = random.Random(args.seed)
    counts = dict(configs=0, kernel_ran=0, errors=0, mismatches=0)
    for i in range(args.n):
        c = draw(args.mode, rng, d)
        a, _ = run_one(c, kernel=False)
        b, ran = run_one(c, kernel=True)
        why = difference(a, b)
        counts["configs"] += 1
        counts["kernel_ran"] += ran
        counts["errors"] += a[0] == "err"
        if why:
            counts["mismatches"] += 1
            print(f"MISMATCH {why}: {json.dumps(c)}", flush=True)
        if i % 50 == 49:
            print(i + 1, counts, file=sys.stderr, flush=True)
    print(counts)
    return 1 if counts["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
