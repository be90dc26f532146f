#!/usr/bin/env python
"""Fit the parametric acceptance model's confidence parameters to the DSpark paper and write them as data.

    python scripts/fit_acceptance.py [--out dsparksim/data/acceptance_fit.json] [--maxfev 100] [--check-only]
                                     [--fit-share] [--fit-load]

1. Fits sigma_req = sigma_block, sigma_tok, the easy/hard link (offset, slope, jump, slope_easy), noise_sd,
   noise_sd_end
   (Nelder-Mead from the shipped parameters, common random numbers) to the Fig. 5 static-threshold ratios (t = 0.9
   of math and chat weighted as issue 29's criteria, the rest lightly) and the Fig. 6 survival AUC by position
   together, then raw_gain so the raw confidences' mean per-position ECE is 5.5% (the paper: 3-8%); see
   :mod:`dsparksim.acceptance.fit`. Writes the parameters with the residual table to ``--out``.
2. Prints the residual table (model minus paper) and the step-weighted tau check: long outputs simulated with
   fixed:K straight on the model (engine's keyed draws per step, request shifts on stratified quantiles) against 1 + sum prod alpha for every drafter x domain at
   K = 1 (mtp1), 4, 5, 7, 8, 12, 15 (Fig. 4's draft lengths 4/8/12/16 -> 16 is above K_MAX = 15).
``--check-only`` skips the fit and checks the shipped parameters. ``--fit-share`` also fits the request share
sigma_req / sigma_shared (default: sigma_req = sigma_block); ``--fit-load`` also fits req_load, the request shift's
loading at position 1 (default: 1, one shift for all positions). Both relieve Fig. 5's chat ratios (a hard request
takes many steps at t = 0.9, so request-level spread pulls the step-pooled ratio down) and both run to a weak
request effect. Measured 2026-12-03 (seed 0 fits, 150 evaluations, re-measured on seed 5): --fit-share: share
0.08 (sigma_req 0.32), AUC 0.813 / 0.857 / 0.884 / 0.912, STS ECE 1.62%, chat verified at t = 0.9 -4.9%;
--fit-load: req_load 3e-5, AUC 0.829 / 0.858 / 0.887 / 0.911, ECE 1.56%, chat -3.1%. Position 3 is then inside
Fig. 6's 0.05 by 0.002-0.003 only, and the request effect of tests/test_acceptance_parametric.py's F-test (chat,
300 requests x 20 blocks, p < 1e-6) is lost (p = 0.74 / 6e-4; shipped 8e-173), so the shipped fit uses neither.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dsparksim.acceptance.base import DOMAINS  # noqa: E402
from dsparksim.acceptance.fit import (RAW_ECE_TARGET, evaluate, fig5_ratio_targets, fig6_auc_targets,  # noqa: E402
                                      fit, relative_residuals, residuals)
from dsparksim.acceptance.longrun import simulate_long  # noqa: E402
from dsparksim.acceptance.parametric import ParametricAcceptance, ParametricParams  # noqa: E402

TAU_KS = {"dspark": (4, 5, 7, 8, 12, 15), "dflash": (4, 5, 7, 8, 12, 15), "eagle3": (4, 5, 7, 8, 12, 15),
          "mtp1": (1,)}


def residual_table(ev: dict) -> list[str]:
    rows = ["| figure | domain | threshold / position | quantity | paper | model | residual | relative |",
            "|---|---|---|---|---|---|---|---|"]
    tg = fig5_ratio_targets()
    for d in DOMAINS:
        for kind in ("accepted", "verified"):
            for i, t in enumerate((0.5, 0.7, 0.9)):
                p, m = tg[d][kind][i], ev["ratios"][d][kind][i]
                rows.append(f"| Fig. 5 | {d} | t={t:g} | {kind} / t=0 | {p:.3f} | {m:.3f} | {m - p:+.3f} | "
                            f"{m / p - 1:+.1%} |")
    for k, a in fig6_auc_targets().items():
        m = ev["auc_by_position"][k]
        rows.append(f"| Fig. 6 | pooled | pos {k} | survival AUC | {a:.3f} | {m:.3f} | {m - a:+.3f} | |")
    rows.append(f"| Fig. 6 | pooled | mean over 1..7 | ECE (STS) | 0.010 | {ev['ece_mean']:.3f} | "
                f"{ev['ece_mean'] - 0.01:+.3f} | |")
    if "raw" in ev:
        rows.append(f"| Fig. 6 | pooled | mean over 1..7 | ECE (raw) | 0.03-0.08 (target {RAW_ECE_TARGET}) | "
                    f"{ev['raw']['ece_mean']:.3f} | {ev['raw']['ece_mean'] - RAW_ECE_TARGET:+.3f} | |")
    return rows


def tau_table(n_requests: int, tokens: int, seed: int) -> tuple[list[str], float]:
    rows = ["| drafter | K | domain | 1 + sum prod alpha | long-output tau (unclipped) | rel. error |",
            "|---|---|---|---|---|---|"]
    worst = 0.0
    for drafter, ks in TAU_KS.items():
        for K in ks:
            m = ParametricAcceptance.from_paper(drafter, K, confidence="raw")    # truth is the same for sts
            for d in DOMAINS:
                r = simulate_long(m, d, n_requests=n_requests, tokens=tokens, seed=seed, stratified=True)
                exp = m.expected_tau(d)
                e = r["tau_unclipped"] / exp - 1
                worst = max(worst, abs(e))
                rows.append(f"| {drafter} | {K} | {d} | {exp:.3f} | {r['tau_unclipped']:.3f} | {e:+.2%} |")
    return rows, worst


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "dsparksim" / "data" / "acceptance_fit.json"))
    ap.add_argument("--maxfev", type=int, default=200, help="Nelder-Mead evaluations [%(default)s]")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--auc-weight", type=float, default=1.0,
                    help="weight of the tolerance-scaled Fig. 6 AUC terms relative to the Fig. 5 t=0.9 ones "
                         "[%(default)s]")
    ap.add_argument("--nodes", type=int, default=10, help="Gauss-Hermite nodes over the request shift [%(default)s]")
    ap.add_argument("--blocks", type=int, default=800, help="blocks per node and domain [%(default)s]")
    ap.add_argument("--check-only", action="store_true", help="no fit: check the shipped parameters")
    ap.add_argument("--fit-share", action="store_true",
                    help="fit the request share sigma_req / sigma_shared too (default: sigma_req = sigma_block)")
    ap.add_argument("--fit-load", action="store_true",
                    help="fit req_load, the request shift's loading at position 1, too (default: kept as shipped, 1)")
    ap.add_argument("--tau-requests", type=int, default=3000, help="requests per tau check [%(default)s]")
    ap.add_argument("--tau-tokens", type=int, default=150, help="output tokens per request [%(default)s]")
    args = ap.parse_args(argv)
    t0 = time.time()
    if args.check_only:
        params = ParametricParams()
        ev = evaluate(params, n_u=args.nodes, blocks=args.blocks, seed=args.seed)
        ev["raw"] = evaluate(params, n_u=args.nodes, blocks=args.blocks, seed=args.seed, confidence="raw")
    else:
        params, ev = fit(maxfev=args.maxfev, seed=args.seed, auc_weight=args.auc_weight, n_u=args.nodes,
                         blocks=args.blocks, fit_share=args.fit_share, fit_load=args.fit_load)
    table = residual_table(ev)
    print(f"parameters: {json.dumps(asdict(params))}")
    print("\n".join(table))
    res = residuals(ev)
    print(f"max |residual| Fig. 5: {max(abs(v) for k, v in res.items() if not k.startswith('AUC')):.3f}; "
          f"Fig. 6 AUC: {max(abs(v) for k, v in res.items() if k.startswith('AUC')):.3f}")
    if not args.check_only:
        out = {"_about": "Parametric acceptance parameters fitted by scripts/fit_acceptance.py (do not hand-edit): "
                         + ("sigma_req and sigma_block (total and request share)" if args.fit_share else
                            "sigma_req = sigma_block")
                         + (", req_load (the request shift's loading at position 1, linear to 1 at position 7)"
                            if args.fit_load else "")
                         + ", sigma_tok, the easy/hard link (offset + slope * x for a hard token, x <= 0; "
                         "offset + jump + slope_easy * x for an easy one), "
                         "noise_sd (position 1), noise_sd_end (position 7+) fitted to the DSpark paper's Fig. 5 "
                         "static-threshold ratios and Fig. 6 survival AUC by position, step-weighted (issue 29 "
                         "criteria: t=0.9 ratios of math and chat within 10%, AUC within 0.05, STS ECE <= 0.02); "
                         "noise_block kept at its starting value; raw_gain so the raw confidences' mean "
                         f"per-position ECE is {RAW_ECE_TARGET}. Residuals: model minus paper; relative: model / "
                         "paper - 1.",
               "params": {k: round(float(v), 4) for k, v in asdict(params).items() if k != "temperature"},
               "fit": {"seed": args.seed, "auc_weight": args.auc_weight, "fit_share": args.fit_share,
                       "fit_load": args.fit_load,
                       "nodes": args.nodes, "blocks": args.blocks, "objective": ev.get("objective"), "evaluations": ev.get("evaluations"),
                       "residuals": {k: round(v, 4) for k, v in res.items()},
                       "relative_residuals": {k: round(v, 4) for k, v in relative_residuals(ev).items()},
                       "ece_mean_sts": ev["ece_mean"], "ece_mean_raw": ev["raw"]["ece_mean"],
                       "sts_temperatures_dspark_K7": ev["sts_temperatures"]}}
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {args.out}")
    rows, worst = tau_table(args.tau_requests, args.tau_tokens, args.seed)
    print("\n".join(rows))
    print(f"worst relative tau error: {worst:.2%} ({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
