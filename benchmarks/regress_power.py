"""Benchmark (run on demand, not a test): what `dsparksim regress` detects, on the sweep CI runs.

    python benchmarks/regress_power.py [--trials 5] [--workers 2] [--spec sweeps/regress.toml] [--out FILE.json]

The spec (default: sweeps/regress.toml, 8 policies x 4 loads x 3 seeds of 6 s) is rerun ``--trials`` times, each
trial on its own seed triple (11.., 21.., 31.., ...). Per trial, the baseline is made on unchanged code, then the
check is run on code with an injected verify-step slowdown (tests/regress_inject.py: the profile's verify table and
attention term x (1 + s)) of s = 2%, 5% and 10%:

- into the profile: every policy is slowed; detection = share of the 8 policies flagged;
- into one policy (mtp1, fixed:7, confidence, goodput, confidence-async:2 in turn, one per trial): detection = the
  trials where that policy is flagged; misattribution = another policy flagged.

False alarms: (a) unchanged code on the same seeds (the CI situation): policies flagged; (b) seed noise alone --
each trial's baseline checked against another trial's unchanged run (different seeds, labelled as the same): the
rule then sees pure seed-to-seed noise, unpaired, the worst case for it. Rates are shares of policy checks.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from regress_inject import slowdown  # noqa: E402

from dsparksim.sweep.regress import compare, compute, make_baseline  # noqa: E402
from dsparksim.sweep.spec import load_spec  # noqa: E402

SIZES = (0.02, 0.05, 0.10)
ONE_POLICY = ("mtp1", "fixed:7", "confidence", "goodput", "confidence-async:2")


def run_doc(spec, bl: Path, workers: int) -> dict:
    return make_baseline(spec, compute(spec, "local", workers), bl)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", default=str(REPO / "sweeps" / "regress.toml"))
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default=None, help="also write the raw results as JSON")
    ap.add_argument("--sizes", default=",".join(str(x) for x in SIZES),
                    help="slowdowns to inject, comma-separated fractions [%(default)s]; 0.001 = a near-null change "
                         "that moves trajectories but hardly performance")
    ap.add_argument("--profile-only", action="store_true", help="inject into the profile only (not one policy)")
    a = ap.parse_args()
    sizes = tuple(float(x) for x in a.sizes.split(","))
    t0 = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="regress-power-"))
    text = Path(a.spec).read_text()
    base_docs, rows = [], []
    for t in range(a.trials):
        seed = 11 + 10 * t
        sp = tmp / f"trial{t}.toml"
        sp.write_text(text.replace("seed = 11", f"seed = {seed}"))
        spec = load_spec(sp)
        bl = tmp / f"trial{t}.json"
        base = run_doc(spec, bl, a.workers)
        base_docs.append(base)
        policies = sorted({r["policy"] for r in base["frontier"]})
        same = compare(base, run_doc(spec, bl, a.workers))
        rows.append({"trial": t, "kind": "unchanged", "size": 0.0, "target": None, "flagged": sorted(same),
                     "n_policies": len(policies)})
        target = ONE_POLICY[t % len(ONE_POLICY)]
        for s in sizes:
            for kind, pol in (("profile", None),) + ((("one policy", target),) if not a.profile_only else ()):
                with slowdown(1 + s, policy=pol):
                    d = compare(base, run_doc(spec, bl, a.workers))
                rows.append({"trial": t, "kind": kind, "size": s, "target": pol, "flagged": sorted(d),
                             "n_policies": len(policies), "flags": d})
                print(f"trial {t} seeds {seed}.. {kind:10s} {100 * s:4g}% {pol or '':20s} flagged: "
                      f"{', '.join(sorted(d)) or '-'}", flush=True)
    # (b) seed noise: trial i's baseline vs trial i+1's unchanged run, seeds relabelled
    noise = []
    for i in range(a.trials):
        j = (i + 1) % a.trials
        if i == j:
            break
        cur = json.loads(json.dumps(base_docs[j]))
        cur["seeds"], cur["spec_sha256"] = base_docs[i]["seeds"], base_docs[i]["spec_sha256"]
        d = compare(base_docs[i], cur)
        noise.append({"pair": [i, j], "flagged": sorted(d), "flags": d, "n_policies": len({r["policy"] for r in cur["frontier"]}),
                      "n_flags": sum(len(v) for v in d.values())})
    wall = time.perf_counter() - t0
    print(f"\n{a.trials} trials of {a.spec} in {wall / 60:.1f} min")
    print("| injected | into | detection | misattributed / false alarms |")
    print("|---|---|---|---|")
    un = [r for r in rows if r["kind"] == "unchanged"]
    fa = sum(len(r["flagged"]) for r in un)
    print(f"| none (same seeds) | - | - | {fa} of {sum(r['n_policies'] for r in un)} policy checks |")
    for s in sizes:
        pr = [r for r in rows if r["kind"] == "profile" and r["size"] == s]
        hit = sum(len([p for p in r["flagged"] if p != "(spec)"]) for r in pr)
        tot = sum(r["n_policies"] for r in pr)
        print(f"| {100 * s:g}% | profile | {hit}/{tot} policies ({100 * hit / tot:.0f}%) | - |")
    for s in sizes if not a.profile_only else ():
        op = [r for r in rows if r["kind"] == "one policy" and r["size"] == s]
        hit = sum(r["target"] in r["flagged"] for r in op)
        other = sum(len([p for p in r["flagged"] if p != r["target"]]) for r in op)
        print(f"| {100 * s:g}% | one policy | {hit}/{len(op)} trials ({100 * hit / len(op):.0f}%) | "
              f"{other} other policies flagged in {len(op)} trials |")
    if noise:
        nf = sum(len(n["flagged"]) for n in noise)
        nt = sum(n["n_policies"] for n in noise)
        print(f"| none (other seeds, unpaired noise) | - | - | {nf} of {nt} policy checks "
              f"({100 * nf / nt:.0f}%), {sum(n['n_flags'] for n in noise)} metric flags |")
    if a.out:
        Path(a.out).write_text(json.dumps({"spec": a.spec, "trials": a.trials, "rows": rows, "noise": noise,
                                           "wall_s": wall}, indent=1))


if __name__ == "__main__":
    main()
