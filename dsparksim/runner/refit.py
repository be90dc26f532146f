"""Refit a validation's profile from its kept raw cells and price the same real steps with it.

`validate` keeps the profile's raw cell records (``profile_raw.json``) and every real run's steps and paired cells
(``runs/*/real/steps.csv``, ``paired_N.csv``). A fit variant can then be compared with the one the validation used
on the *same* cells and the *same* real steps, free of this machine's run-to-run noise (at ~1k-4k contexts one
command moved up to 9 points between runs, more than any fit choice tried).

A real step's measured time at the profile's speed is ``dt = dt_raw / factor`` with ``factor = t(cell now) /
price(cell)`` (:mod:`.paired`, baseline "fit"). Under another fit the paired factor changes with the cell's
price, so each step's ``dt`` is rescaled by f_used / f_new, both smoothed over neighbouring pairs as validate does
(:func:`~.paired.smooth_factors`), median over the repeats (the step times themselves are already combined over
the repeats, so this is an approximation of re-running validate's normalisation). ``price_runs`` returns per run the priced over
measured step time - 1, overall and for steps with / without prefill chunks; with the profile the validation used
it equals ``step_residuals.csv``'s ``sum(dt_model) / sum(dt) - 1`` (a test checks this).

    python -m dsparksim.runner.refit VALIDATE_DIR       # the used fit, its refit, and the variants side by side
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from dsparksim.cost.profile import CostProfile, profile_from_dict
from dsparksim.runner.grid import MeasureConfig
from dsparksim.runner.fitting import fit_prefill, fit_profile, prefill_section
from dsparksim.runner.paired import cell_prices, prefill_cell_prices, smooth_factors
from dsparksim.runner.residuals import model_terms


def _grid_config(prof: dict) -> MeasureConfig:
    g = prof["metadata"]["grid"]
    return MeasureConfig(K=int(g["K"]), n_reqs=tuple(g["n_req"]),
                         contexts=tuple(g.get("requested_contexts") or g["contexts"]))


def refit(out_dir: str | Path, *, v0_at_shortest: bool = False, drop_anchor: bool = False,
          drop_prefill_only: bool = False, absolute_prefill: bool = False) -> CostProfile:
    """The profile refitted from ``profile_raw.json`` (as `measure` fits it; the prefill terms refitted against the
    new staircase). ``v0_at_shortest``: V0 from the shortest context's cells alone (``decompose_target``);
    ``drop_anchor``: leave the shortest context's cells out (what the fit would be without the anchor);
    ``drop_prefill_only``: leave the prefill-only cells (no decoding request beside the chunks) out of the prefill
    fit (what it was before they were measured); ``absolute_prefill``: the prefill terms fitted in absolute seconds
    (as before 2026-12-02's fourth session) instead of relative errors."""
    out = Path(out_dir)
    base = json.loads((out / "profile.json").read_text())
    raw_path = out / "profile_raw.json"
    if not raw_path.is_file():
        raise FileNotFoundError(f"{raw_path}: no raw cell records (validate keeps them since 2026-12-02; a run with "
                                "--profile has none)")
    raw = json.loads(raw_path.read_text())
    blk, mtp = raw["block"], raw["mtp1"]
    if drop_anchor:
        a = min(x["ctx"] for x in blk)
        blk, mtp = [x for x in blk if x["ctx"] != a], [x for x in mtp if x["ctx"] != a]
    prof = fit_profile(blk, mtp, _grid_config(base), v0_at_shortest=v0_at_shortest)
    fit = prof.pop("_fit")
    pre = [r for r in raw.get("prefill") or [] if not (drop_prefill_only and r.get("n_dec", 4) == 0)]
    if pre:
        prof["prefill"] = prefill_section(fit_prefill(pre, prof, relative=not absolute_prefill),
                                          "refitted from profile_raw.json")
        for d, spec in prof["drafters"].items():     # the drafters' own prefill rate (live profiles) as measured
            dpf = base.get("drafters", {}).get(d, {}).get("prefill_s_per_token")
            if dpf is not None:
                spec["prefill_s_per_token"] = dpf
    prof["name"] = f"{base.get('name', 'profile')}-refit"
    prof["metadata"] = {**base["metadata"], "fit": fit}
    return profile_from_dict(prof, source=f"refit:{out}")


def _rows(table: np.ndarray, pairs: pd.DataFrame, cols: tuple[str, ...], real: Path, what: str) -> np.ndarray:
    """Index into ``table`` (stored cell rows, keyed by their first len(cols) columns) of every pair's cell."""
    keys = pairs[list(cols)].to_numpy(float)
    hit = (table[None, :, :len(cols)] == keys[:, None, :]).all(axis=2)
    if not hit.any(axis=1).all():
        bad = keys[~hit.any(axis=1)][0]
        raise ValueError(f"{real}: paired cell ({', '.join(cols)}) = {tuple(int(v) for v in bad)} is not among the "
                         f"profile's {what}")
    return hit.argmax(axis=1)


def price_runs(out_dir: str | Path, profile: CostProfile, span: int = 4) -> pd.DataFrame:
    """Per real run of a validation: the profile's price of its steps over their measured time at the profile's
    speed, minus 1 (overall, prefill steps, decode-only steps); see the module doc. ``span``: validate's
    ``pair_span`` (the factor's running median over 2 * span + 1 paired steps)."""
    out = Path(out_dir)
    base_d = json.loads((out / "profile.json").read_text())
    used = profile_from_dict(base_d, source=f"validate:{out}")
    rows = []
    for run in sorted(p for p in (out / "runs").iterdir() if (p / "real" / "steps.csv").is_file()):
        real = run / "real"
        pol = json.loads((real / "config.json").read_text())["inputs"]["policy"]
        drafter, K = pol["drafter"], int(pol["block_size"])
        st = pd.read_csv(real / "steps.csv")
        price = model_terms({k: st[k].to_numpy() for k in st.columns}, profile, K, drafter).to_numpy().sum(axis=1)
        scale = np.ones(len(st))
        cells = (base_d["metadata"].get("cells") or {}).get(drafter)
        # {repeat number: its decode pairs} (paired_N.csv; the prefill-only and mixed pairs of repeat N are
        # paired_prefill_N.csv / paired_mixed_N.csv)
        pairs = {int(f.stem.split("_")[-1]): pd.read_csv(f) for f in real.glob("paired_[0-9]*.csv")}
        pairs = {k: pr for k, pr in sorted(pairs.items()) if not pr.empty}
        pf_cells = (base_d["metadata"].get("prefill_cells") or {}).get(drafter)
        if cells and pairs and profile is not used:
            # each stored cell's price under both fits, once; a pair's factor is its cell's time now over that price
            stored = np.asarray(cells["rows"], float)
            p_used, p_new = cell_prices(used, stored, K, drafter), cell_prices(profile, stored, K, drafter)
            per_rep = {}
            for rep, pr in pairs.items():
                j = _rows(stored, pr, ("n_req", "ctx", "L"), real, "metadata.cells")
                idx, t = pr["step"].to_numpy(int), pr["cell_s"].to_numpy(float)
                # validate's own smoothing (paired.smooth_factors): the step's time at the new fit's speed is
                # dt_raw / f_new = dt * f_used / f_new
                per_rep[rep] = (smooth_factors(idx, t / p_used[j], len(st), span)
                                / smooth_factors(idx, t / p_new[j], len(st), span))
            if pf_cells is not None:
                # prefill-only steps took the factors of their own prefill-only pairs (paired_prefill_N.csv), mixed
                # steps the blend of their decode + prefill pair (paired_mixed_N.csv)
                rows_pf = np.asarray(pf_cells["rows"], float)
                q_used, q_new = prefill_cell_prices(used, rows_pf, drafter), prefill_cell_prices(profile, rows_pf,
                                                                                                  drafter)
                n_dec, n_pf = st["n_decode"].to_numpy(), st["n_prefill_tokens"].to_numpy()
                for kind, steps in (("prefill", (n_dec == 0) & (n_pf > 0)), ("mixed", (n_dec > 0) & (n_pf > 0))):
                    for f in real.glob(f"paired_{kind}_*.csv"):
                        rep, pr = int(f.stem.split("_")[-1]), pd.read_csv(f)
                        if pr.empty or rep not in per_rep:
                            continue
                        idx, tp = pr["step"].to_numpy(int), pr["cell_s" if kind == "prefill" else "prefill_s"]
                        jp = _rows(rows_pf, pr, ("chunk", "k", "prefix"), real, "metadata.prefill_cells")
                        tp = tp.to_numpy(float)
                        if kind == "prefill":
                            f_used, f_new = tp / q_used[jp], tp / q_new[jp]
                        else:
                            jd = _rows(stored, pr, ("n_req", "ctx", "L"), real, "metadata.cells")
                            td = pr["cell_s"].to_numpy(float)
                            if "w_prefill" in pr:
                                # the blend's weights as validate recorded them (not re-derived for the new fit)
                                w = pr["w_prefill"].to_numpy(float)
                                f_used = (1 - w) * td / p_used[jd] + w * tp / q_used[jp]
                                f_new = (1 - w) * td / p_new[jd] + w * tp / q_new[jp]
                            else:       # pairs written before the blend: summed times over summed references
                                f_used = (td + tp) / (p_used[jd] + q_used[jp])
                                f_new = (td + tp) / (p_new[jd] + q_new[jp])
                        ratio = smooth_factors(idx, f_used, len(st), span) / smooth_factors(idx, f_new, len(st), span)
                        per_rep[rep] = np.where(steps, ratio, per_rep[rep])
            scale = np.median(np.array(list(per_rep.values())), axis=0)
        meas = st["dt"].to_numpy() * scale
        pf = st["n_prefill_tokens"].to_numpy() > 0

        def over(m):
            return float(price[m].sum() / meas[m].sum() - 1) if m.any() else float("nan")
        rows.append({"run": run.name, "priced_over_measured": over(np.ones(len(st), bool)),
                     "prefill_steps": over(pf), "decode_steps": over(~pf), "steps": int(len(st))})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dsparksim.runner.refit", description=__doc__.split("\n\n")[0])
    ap.add_argument("validate_dir", help="a `dsparksim validate --out` folder made without --profile")
    a = ap.parse_args(argv)
    out = Path(a.validate_dir)
    used = profile_from_dict(json.loads((out / "profile.json").read_text()), source=str(out))
    variants = {"used by the validation": used, "refit (measure's current fit)": refit(out),
                "V0 from the shortest context": refit(out, v0_at_shortest=True),
                "shortest context dropped": refit(out, drop_anchor=True),
                "prefill terms fitted in absolute seconds": refit(out, absolute_prefill=True)}
    raw = json.loads((out / "profile_raw.json").read_text())
    if any(r.get("n_dec") == 0 for r in raw.get("prefill") or []):
        variants["prefill-only cells dropped"] = refit(out, drop_prefill_only=True)
    for name, p in variants.items():
        df = price_runs(out, p)
        x = df["priced_over_measured"]
        print(f"{name}: median |priced/measured - 1| {100 * x.abs().median():.1f}%, mean {100 * x.mean():+.1f}%")
        print(df.to_string(index=False, float_format=lambda v: f"{v:+.3f}"))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
