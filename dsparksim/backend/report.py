"""``dsparksim report``: quality report of the trained models and their real traces (markdown + PNG + JSON).

Per drafter x domain: tau (all K verified, bonus included) with a 95% CI, per-position conditional acceptance
with 95% CIs, confidence AUC per position, ECE of the cumulative survival before (raw confidences) and after STS
calibration; model sizes and training times from ``models/training_log.json``; and the checks the issue asks
for (dspark vs dflash tau and positions 4-7, chat below math and code, ECE <= 2%), each stated with its numbers.
Needs only numpy/matplotlib (no torch). CIs are cluster-robust by request (:mod:`dsparksim.acceptance.summary`);
a difference between two drafters' traces (independent runs) uses se = sqrt(se_a^2 + se_b^2).
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np

from dsparksim.acceptance.confidence import ece_survival
from dsparksim.acceptance.summary import Z95, ratio_se, summarize_blocks
from dsparksim.acceptance.trace_format import read_trace
from dsparksim.backend.artifacts import read_calibration, read_training_log
from dsparksim.errors import InputError
from dsparksim.results.outputs import previous_kept_on_error

ORDER = ("dspark", "dflash", "eagle3", "mtp1")
DOMS = ("math", "code", "chat")
ECE_TARGET = 0.02


def _req_groups(tr, sel):
    _, g = np.unique(tr.request_id[sel], return_inverse=True)
    return g, int(g.max()) + 1


def tau_se(tr, dom):
    sel = tr.domain == dom
    g, m = _req_groups(tr, sel)
    A = tr.accepted[sel]
    return ratio_se(np.bincount(g, weights=A + 1.0, minlength=m), np.bincount(g, minlength=m).astype(float))


def pooled_conditional(tr, dom, ks):
    """sum over k in ks of accepted-at-k / sum of at-risk-at-k, with its cluster-robust se."""
    sel = tr.domain == dom if dom != "all" else np.ones(tr.n_blocks, bool)
    g, m = _req_groups(tr, sel)
    A = tr.accepted[sel]
    y = sum(np.bincount(g, weights=(A >= k).astype(float), minlength=m) for k in ks)
    n = sum(np.bincount(g, weights=(A >= k - 1).astype(float), minlength=m) for k in ks)
    return ratio_se(y, n)


def _diff(a, b):
    d = a[0] - b[0]
    se = math.sqrt(a[1] ** 2 + b[1] ** 2)
    return {"diff": d, "ci95": [d - Z95 * se, d + Z95 * se], "a": a[0], "b": b[0]}


def _f(x, nd=3):
    if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)) or not math.isfinite(x):
        return "-"
    return f"{x:.{nd}f}"


def _diffs(by_domain: dict) -> str:
    """'domain diff [lo, hi] (a vs b); ...' for a per-domain difference table."""
    return "; ".join(f"{d} {_f(x['diff'])} [{_f(x['ci95'][0])}, {_f(x['ci95'][1])}] ({_f(x['a'])} vs {_f(x['b'])})"
                     for d, x in by_domain.items())


def analyse(traces: dict) -> dict:
    res = {"drafters": {}, "checks": {}}
    for kind, tr in traces.items():
        s = summarize_blocks(tr.request_id, tr.domain, tr.accepted, tr.conf)
        per = {}
        for d in [x for x in DOMS if x in s] + ["all"]:
            if d not in s:
                continue
            sel = tr.domain == d if d != "all" else np.ones(tr.n_blocks, bool)
            v = s[d]
            per[d] = {"requests": v["requests"], "blocks": v["blocks"], "tau": v["tau_all_verified"],
                      "tau_ci95": v["tau_ci95"], "positions": v["positions"],
                      "auc_by_position": {int(k): a for k, a in v["auc_by_position"].items()},
                      "ece_calibrated": v["ece"],
                      "ece_raw": ece_survival(tr.raw_conf[sel], tr.accepted[sel]) if tr.raw_conf is not None else None}
        res["drafters"][kind] = {"K": tr.K, "metadata": tr.metadata, "domains": per}
    ch = res["checks"]
    if "dspark" in traces and "dflash" in traces:
        a, b = traces["dspark"], traces["dflash"]
        ch["tau_dspark_minus_dflash"] = {d: _diff(tau_se(a, d), tau_se(b, d)) for d in DOMS}
        ks = [k for k in range(4, 8) if k <= min(a.K, b.K)]
        if ks:
            ch["cond_4_7_dspark_minus_dflash"] = {d: _diff(pooled_conditional(a, d, ks), pooled_conditional(b, d, ks))
                                                  for d in DOMS + ("all",)}
            ch["cond_by_position_dspark_minus_dflash"] = {
                d: {k: _diff(pooled_conditional(a, d, [k]), pooled_conditional(b, d, [k])) for k in ks} for d in DOMS}
        ch["dspark_tau_above_dflash_every_domain"] = all(v["diff"] > 0 for v in ch["tau_dspark_minus_dflash"].values())
        if ks:
            ch["dspark_cond_4_7_above_dflash_every_domain"] = all(
                ch["cond_4_7_dspark_minus_dflash"][d]["diff"] > 0 for d in DOMS)
    ch["chat_tau_below_math_and_code"] = {
        k: bool(v["domains"]["chat"]["tau"] < min(v["domains"]["math"]["tau"], v["domains"]["code"]["tau"]))
        for k, v in res["drafters"].items() if all(d in v["domains"] for d in DOMS)}
    ch["ece_calibrated_pooled"] = {k: v["domains"]["all"]["ece_calibrated"] for k, v in res["drafters"].items()
                                   if "all" in v["domains"]}
    ch["ece_calibrated_le_2pct"] = {k: bool(e <= ECE_TARGET) for k, e in ch["ece_calibrated_pooled"].items()}
    return res


def _plot(res: dict, traces: dict, path: Path) -> None:
    import matplotlib  # lazy: matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib

    fig, axes = plt.subplots(2, 3, figsize=(14, 8.5))
    colors = {"dspark": "C3", "dflash": "C0", "eagle3": "C2", "mtp1": "C7"}
    for j, d in enumerate(DOMS):
        ax = axes[0, j]
        for kind, v in res["drafters"].items():
            if d not in v["domains"]:
                continue
            pos = v["domains"][d]["positions"]
            k = np.array([p["k"] for p in pos]) + (ORDER.index(kind) - 1.5) * 0.06 if kind in ORDER else 0
            c = np.array([p["conditional"] for p in pos], float)
            lo = np.array([p["ci95"][0] for p in pos], float)
            hi = np.array([p["ci95"][1] for p in pos], float)
            ax.errorbar(k, c, yerr=[c - lo, hi - c], marker="o", ms=4, capsize=3, color=colors.get(kind),
                        label=f"{kind} (tau {v['domains'][d]['tau']:.2f})")
        ax.set_title(f"{d}: conditional acceptance per position (95% CI)")
        ax.set_xlabel("draft position k")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax = axes[1, j]
        tr = traces.get("dspark")
        if tr is not None:
            sel = tr.domain == d
            K = tr.K
            real = (tr.accepted[sel][:, None] >= np.arange(1, K + 1)).ravel()
            for name, conf, st in (("raw", tr.raw_conf, "--"), ("STS-calibrated", tr.conf, "-")):
                if conf is None:
                    continue
                s = np.cumprod(conf[sel], 1).ravel()
                bins = np.minimum((s * 15).astype(int), 14)
                cnt = np.bincount(bins, minlength=15)
                ok = cnt >= 20
                mp = np.bincount(bins, weights=s, minlength=15)[ok] / cnt[ok]
                mr = np.bincount(bins, weights=real, minlength=15)[ok] / cnt[ok]
                e = ece_survival(conf[sel], tr.accepted[sel])
                ax.plot(mp, mr, st, marker="o", ms=3, label=f"dspark {name} (ECE {e:.3f})")
            ax.plot([0, 1], [0, 1], color="k", lw=0.8)
            ax.set_title(f"{d}: dspark survival reliability (bins with >= 20)")
            ax.set_xlabel("predicted survival")
            ax.set_ylabel("realised survival")
            ax.legend(fontsize=8)
            ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _markdown(res: dict, log: dict, cal: dict) -> str:
    """REPORT.md of the backend quality report."""
    L = [TITLE, "",
         "Generated by `dsparksim report` from `models/training_log.json`, `models/calibration.json` and "
         "`traces/real_*.csv.gz` (regenerate everything with `scripts/train_all.sh`). Temperature 1, all K "
         "draft tokens verified every step; tau counts the bonus token. CIs: 95%, cluster-robust by request "
         "(normal approximation); differences between two drafters' traces use se = sqrt(se_a^2 + se_b^2).", ""]
    if log:
        L += _models_section(log)
    L += _acceptance_section(res) + _checks_section(res, cal)
    L += ["Confidences: dspark's are its confidence head; the other drafters have no confidence head, so their raw "
          "confidence is the draft probability of the drafted token (then STS-calibrated the same way).", "",
          "![quality](quality.png)", ""]
    return "\n".join(L)




def _models_section(log: dict) -> list[str]:
    """The models: architecture, sizes, training time and loss."""
    m = log.get("config", {}).get("model", {})
    L = [f"## Models (preset `{log.get('preset')}`, torch {log.get('torch')}, {log.get('threads')} CPU threads, "
          f"Python {log.get('python', '?')})", "",
          f"Target: d_model {m.get('d_model')}, {m.get('n_layers')} layers, {m.get('n_heads')} query / "
          f"{m.get('n_kv_heads')} KV heads (GQA), SwiGLU d_ff {m.get('d_ff')}, RoPE, RMSNorm, vocab "
          f"{m.get('vocab_size')} (byte-level BPE), context {m.get('max_seq')}. Training tokens per domain: "
          f"{log.get('train_tokens')}.", "",
          "| model | parameters (own) | file bytes | train seconds | final loss | notes |",
          "|---|---:|---:|---:|---:|---|"]
    t = log.get("target", {})
    sz = log.get("sizes_bytes", {})
    sec = log.get("seconds", {})
    L.append(f"| target | {t.get('params', '-'):,} | {sz.get('target.pt', '-'):,} | {sec.get('target', '-')} | "
             f"{_f(t.get('final_train_loss'))} | held-out loss " +
             ", ".join(f"{d} {_f(x)}" for d, x in t.get("val_loss", {}).items()) + " |")
    for k in ("mtp1", "eagle3", "dflash", "dspark"):
        dd = log.get("drafters", {}).get(k, {})
        note = (f"loss = distillation CE + conf-head BCE ({_f(dd.get('final_conf_bce'))})" if "final_conf_bce" in dd
                else "distillation CE")
        L.append(f"| {k} | {dd.get('params', '-'):,} | {sz.get(k + '.pt', '-'):,} | {sec.get(k, '-')} | "
                 f"{_f(dd.get('final_loss'))} | {note} |")
    L += ["", f"All weights together: {log.get('total_weight_bytes', 0) / 1e6:.2f} MB (float16). Tokenizer "
          f"{sz.get('tokenizer.json', 0) / 1e3:.0f} kB. Stage wall times (s): {sec}; total "
          f"{sum(v for v in sec.values()):.0f} s.", ""]
    return L


def _acceptance_section(res: dict) -> list[str]:
    """Acceptance per drafter x domain, and per position with its confidence AUC."""
    L = ["## Acceptance per drafter x domain", "",
          "| drafter | K | domain | requests | blocks | tau [95% CI] | ECE raw | ECE after STS | mean AUC |",
          "|---|---:|---|---:|---:|---|---:|---:|---:|"]
    for kind, v in res["drafters"].items():
        for d, x in v["domains"].items():
            aucs = [a for a in x["auc_by_position"].values() if a is not None and math.isfinite(a)]
            L.append(f"| {kind} | {v['K']} | {d} | {x['requests']} | {x['blocks']} | {_f(x['tau'])} "
                     f"[{_f(x['tau_ci95'][0])}, {_f(x['tau_ci95'][1])}] | {_f(x['ece_raw'])} | "
                     f"{_f(x['ece_calibrated'])} | {_f(float(np.mean(aucs)) if aucs else None)} |")
    L += ["", "## Conditional acceptance per position (95% CI) and confidence AUC", ""]
    for kind, v in res["drafters"].items():
        L += [f"**{kind}** (K={v['K']})", "", "| domain | " + " | ".join(f"k={k}" for k in range(1, v["K"] + 1)) + " |",
              "|---|" + "---|" * v["K"]]
        for d, x in v["domains"].items():
            L.append(f"| {d} | " + " | ".join(f"{_f(p['conditional'])} [{_f(p['ci95'][0], 2)}, {_f(p['ci95'][1], 2)}]"
                                               f" n={p['at_risk']}" for p in x["positions"]) + " |")
            L.append(f"| {d} AUC | " + " | ".join(_f(x["auc_by_position"].get(k)) for k in range(1, v["K"] + 1)) + " |")
        L.append("")
    return L


def _checks_section(res: dict, cal: dict) -> list[str]:
    """The checks the backend must pass, and the STS temperatures."""
    ch = res["checks"]
    L = ["## Checks", ""]
    if "tau_dspark_minus_dflash" in ch:
        L.append("tau(dspark) - tau(dflash): " + _diffs(ch["tau_dspark_minus_dflash"])
                 + f" -> dspark above dflash in every domain: **{ch['dspark_tau_above_dflash_every_domain']}**")
        L.append("")
    if "cond_4_7_dspark_minus_dflash" in ch:
        L.append("Conditional acceptance pooled over positions 4-7 (accepted / at risk), dspark - dflash: "
                 + _diffs(ch["cond_4_7_dspark_minus_dflash"])
                 + f" -> above in every domain: **{ch['dspark_cond_4_7_above_dflash_every_domain']}**")
        L.append("")
        for d, byk in ch["cond_by_position_dspark_minus_dflash"].items():
            L.append(f"- {d} per position: " + "; ".join(
                f"k={k} {_f(x['diff'])} [{_f(x['ci95'][0])}, {_f(x['ci95'][1])}]" for k, x in byk.items()))
        L.append("")
    L.append("chat tau below both math and code: " + ", ".join(
        f"{k} **{v}**" for k, v in ch["chat_tau_below_math_and_code"].items()))
    L.append("")
    L.append("ECE of the STS-calibrated cumulative survival on the held-out eval blocks (all domains pooled; target "
             "<= 0.02): " + ", ".join(f"{k} {_f(e, 4)} (**{ch['ece_calibrated_le_2pct'][k]}**)"
                                      for k, e in ch["ece_calibrated_pooled"].items()))
    L.append("")
    L.append("Per domain (one STS fit for all domains; the drafter does not know the domain): " + "; ".join(
        f"{k} " + ", ".join(f"{d} {_f(v['domains'][d]['ece_calibrated'], 4)}" for d in DOMS if d in v["domains"])
        for k, v in res["drafters"].items()))
    L.append("")
    if cal:
        L += ["STS temperatures (fitted on separate calib-prompt blocks, pooled domains) and calib-set ECE:", ""]
        for k, v in cal.items():
            L.append(f"- {k}: T = [{', '.join(_f(t, 2) for t in v['temperatures'])}], {v.get('calib_blocks', '-')} "
                     f"blocks, ECE {_f(v.get('ece_raw'))} -> {_f(v.get('ece_calibrated'))}")
        L.append("")
    return L


def _clean(x):
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, (np.floating, np.integer, np.bool_)):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def find_traces(traces_dir: Path) -> dict[str, Path]:
    """The one ``real_<drafter>_k<K>.csv(.gz)`` trace of each drafter in ``traces_dir``; two for one drafter (e.g.
    K=3 and K=7, or .csv beside .csv.gz) is an error naming both: the report would show one and drop the other."""
    found: dict[str, Path] = {}
    for kind in ORDER:
        hits = sorted(traces_dir.glob(f"real_{kind}_k*.csv.gz")) + sorted(traces_dir.glob(f"real_{kind}_k*.csv"))
        if len(hits) > 1:
            raise InputError(traces_dir, "--traces", f"{len(hits)} {kind} traces ({', '.join(h.name for h in hits)}); "
                             "expected one per drafter (move the others to another folder)")
        if hits:
            found[kind] = hits[0]
    if not found:
        raise InputError(traces_dir, None, "no real_<drafter>_k<K>.csv(.gz) traces found (run `dsparksim collect`)")
    return found


REPORT_FILES = ("report.md", "quality.png", "summary.json")
TITLE = "# Backend quality report"


def check_report_out(out: Path) -> None:
    """The report's files in ``out`` are replaced only when an earlier report wrote them (its report.md starts
    with the title): a run's or validation's summary.json in a folder given as --out was overwritten."""
    present = [n for n in REPORT_FILES if (out / n).exists()]
    if not present:
        return
    try:
        ours = (out / "report.md").read_text(encoding="utf-8").startswith(TITLE)
    except (OSError, UnicodeDecodeError):
        ours = False
    if not ours:
        raise InputError(out / present[0], "--out", "exists and no `dsparksim report` wrote it (the folder holds no "
                         "report.md of one); it is never replaced: choose another --out")


def write_report(models: str | Path, traces_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write ``report.md``, ``quality.png`` and ``summary.json`` into ``out`` (default MODELS/report)."""
    models, traces_dir = Path(models), Path(traces_dir)
    if not models.is_dir():
        # the report's target and training sections come from here: without it they would be silently missing
        raise InputError(models, "--models", "models directory not found (run `dsparksim train`, or point --models "
                         "at the committed models/ directory)")
    out = Path(out) if out is not None else models / "report"
    if out.exists() and not out.is_dir():
        raise InputError(out, "--out", "is a file; expected the report directory")
    check_report_out(out)
    found = {kind: read_trace(p) for kind, p in find_traces(traces_dir).items()}
    log_p, cal_p = models / "training_log.json", models / "calibration.json"
    for f in (log_p, cal_p):    # the models and STS sections come from them: never silently left out
        if not f.is_file():
            raise InputError(f, "--models", "not found (`dsparksim train` writes it beside the checkpoints)")
    log, cal = read_training_log(log_p), read_calibration(cal_p)
    res = analyse(found)
    try:
        text = _markdown(res, log, cal)
    except (AttributeError, KeyError, TypeError, ValueError) as e:   # a field of another type than train writes
        raise InputError(log_p, None, f"unexpected content ({type(e).__name__}: {e}); expected the training log "
                         "`dsparksim train` writes") from None
    # the three files are written into a staging folder and renamed into place only once all are whole (report.md
    # last): a failed plot or Ctrl-C left a new quality.png beside an earlier report's summary and text
    with previous_kept_on_error(out, ()) as d:
        stage = d / f".report-{os.getpid()}.tmp"
        stage.mkdir()
        _plot(res, found, stage / "quality.png")
        (stage / "summary.json").write_text(json.dumps(_clean(res), indent=1))
        (stage / "report.md").write_text(text)
        for name in REPORT_FILES[1:] + REPORT_FILES[:1]:
            os.replace(stage / name, d / name)
        stage.rmdir()
    return out / "report.md"
