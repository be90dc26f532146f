"""Importers: acceptance logs that serving engines already write -> conditional curves -> parametric model.

Every importer estimates the conditional acceptance ``c_j = P(A >= j) / P(A >= j-1)`` (exact ratios of counts)
and returns a :class:`~dsparksim.acceptance.parametric.ParametricAcceptance` on that custom curve, with
``metadata["lost"]`` listing what the log cannot tell us and what was assumed instead.

Estimation from histograms with variable draft length (right-censoring): a step that drafted d tokens and
accepted j of them says "positions 1..j accepted, position j+1 rejected" when j < d, and only "positions 1..d
accepted" when j = d. So for position k: at_risk_k = steps with d >= k and j >= k-1, successes_k = steps with
d >= k and j >= k, c_k = successes_k / at_risk_k. With a fixed draft length D this is exactly
``c_k = P(A>=k)/P(A>=k-1)`` of the histogram.

Accepted input shapes
---------------------
``vllm:PATH`` — PATH is ``.json`` or ``.jsonl``:

* per-request records (vLLM >= 0.29, server flag ``--per-request-spec-decode-metrics summary|detailed``): a JSON
  list / JSONL of OpenAI responses carrying ``metrics.speculative_decoding``, or of the bare
  ``speculative_decoding`` objects, or ``{"responses": [...]}``. Used fields: ``acceptance_histogram_by_draft_length``
  (``{"k": [k+1 counts]}``, preferred) else ``acceptance_histogram`` (dense, length ``num_spec_tokens + 1``; then
  every step is taken to have drafted ``num_spec_tokens`` tokens, checked against ``num_draft_tokens`` when
  present). ``speculative_decoding: null`` (n > 1 requests) records are skipped and counted in the metadata.
* server counters (Prometheus deltas over a run): ``{"num_drafts": N, "num_accepted_tokens_per_pos": [a_1, ...]}``
  from ``vllm:spec_decode_num_drafts_total`` and ``vllm:spec_decode_num_accepted_tokens_per_pos_total``. These
  per-position rates a_k / N are UNCONDITIONAL (P(A >= k)); the importer divides consecutive ones.

``sglang:PATH`` — a JSON list / JSONL of ``/generate`` responses (``{"meta_info": {...}}``) or bare ``meta_info``
objects, or ``{"draft_len": D, "responses": [...]}``. Used fields: ``spec_accept_histogram`` (index j = number of
verify steps that accepted exactly j draft tokens, bonus token excluded; alias ``spec_correct_drafts_histogram``)
and ``spec_verify_ct`` (must equal the histogram's sum). The draft length D is SGLang's
``speculative_num_steps`` (chain depth, NOT ``speculative_num_draft_tokens``); give it as ``draft_len`` in the
file or the spec (``sglang:PATH?draft_len=7``), otherwise it is inferred as the largest accepted count observed
(conservative: those steps are treated as censored, never as rejections).

Optional ``"domain"`` on each record (a dsparksim extension; engines do not log it): when every record has one,
one curve per domain; otherwise a single pooled curve.

``tau:X`` — only the mean tokens per step (including the bonus token) is known: a flat curve alpha with
``1 + sum_{k=1..K} alpha^k = X``.
"""
from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from dsparksim.errors import ConfigError, InputError
from dsparksim.io.textio import MAX_EXACT_INT, loads_json, read_text
from dsparksim.acceptance.base import DOMAINS
from dsparksim.acceptance.calibration import flat_alpha_for_tau
from dsparksim.acceptance.parametric import POOLED, ParametricAcceptance, ParametricParams

LOW_SUPPORT = 50   # positions estimated from fewer steps are flagged in the metadata
MAX_COUNT = MAX_EXACT_INT   # larger counts would not survive int64 sums / float ratios exactly
MAX_DRAFT_LEN = 4096        # a draft length beyond this is a corrupt field, not a drafter


@dataclass(frozen=True)
class CurveEstimate:
    """Conditional acceptance per position with the counts behind it (NaN where no step reached a position)."""

    conditional: np.ndarray
    successes: np.ndarray
    at_risk: np.ndarray
    n_steps: int


def conditional_from_histograms(hists: Mapping[int, Sequence[int]]) -> CurveEstimate:
    """hists[d][j] = steps that drafted d tokens and accepted exactly j of them (0 <= j <= d)."""
    D = max([d for d, h in hists.items() if np.sum(h) > 0], default=0)
    succ = np.zeros(D, dtype=np.int64)
    risk = np.zeros(D, dtype=np.int64)
    n = 0
    for d, h in hists.items():
        h = np.asarray(h, dtype=np.int64)
        n += int(h.sum())
        if d == 0 or h.sum() == 0:
            continue
        tail = np.cumsum(h[::-1])[::-1]          # tail[j] = steps with accepted >= j
        tail = np.r_[tail, 0]
        risk[:d] += tail[:d]                     # k = 1..d: accepted >= k-1
        succ[:d] += tail[1:d + 1]                # accepted >= k
    with np.errstate(invalid="ignore", divide="ignore"):
        c = np.where(risk > 0, succ / np.maximum(risk, 1), np.nan)
    return CurveEstimate(conditional=c, successes=succ, at_risk=risk, n_steps=n)


def conditional_from_unconditional(num_drafts: int, accepted_per_pos: Sequence[int]) -> CurveEstimate:
    """vLLM counters: accepted_per_pos[k-1] = drafts whose position k was accepted (so P(A>=k) = a_k / N)."""
    a = np.asarray(accepted_per_pos, dtype=np.int64)
    risk = np.r_[num_drafts, a[:-1]].astype(np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        c = np.where(risk > 0, a / np.maximum(risk, 1), np.nan)
    return CurveEstimate(conditional=c, successes=a, at_risk=risk, n_steps=int(num_drafts))


# ---- file reading -------------------------------------------------------------------------------------------
def _load_json(path: Path) -> Any:
    text = read_text(path, "acceptance log")
    if not text.strip():
        raise InputError(path, None, "empty file: expected JSON (a list of records or an object)")
    if path.suffix.lower() == ".jsonl":
        return [loads_json(line, path, line=i)
                for i, line in enumerate(io.StringIO(text, newline=None), start=1) if line.strip()]
    return loads_json(text, path)


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 80 else r[:77] + "..."


def _int_list(path: Path, field: str, v: Any) -> np.ndarray:
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= MAX_COUNT
                                          for x in v):
        raise InputError(path, field, f"expected a list of integers in 0..{MAX_COUNT} (2^53-1), got {_short(v)}")
    return np.asarray(v, dtype=np.int64)


def _obj(path: Path, field: str, v: Any) -> dict:
    if not isinstance(v, dict):
        raise InputError(path, field, f"expected a JSON object, got {_short(v)}")
    return v


def _records(path: Path, data: Any) -> list:
    if isinstance(data, dict) and "responses" in data:
        data = data["responses"]
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not data:
        raise InputError(path, None, "expected a non-empty list of records (or {\"responses\": [...]})")
    return data


def _domains_of(path: Path, recs: list) -> list[str | None]:
    doms = [r.get("domain") if isinstance(r, dict) else None for r in recs]
    have = [d is not None for d in doms]
    if any(have) and not all(have):
        i = have.index(False)
        raise InputError(path, f"[{i}].domain", "some records carry 'domain' and some do not; give it on every "
                         "record (per-domain curves) or on none (one pooled curve)")
    for i, d in enumerate(doms):
        if d is not None and d not in DOMAINS:
            raise InputError(path, f"[{i}].domain", f"unknown domain {_short(d)}; expected one of {DOMAINS}")
    return doms


def _add(hists: dict, d: int, h: np.ndarray) -> None:
    cur = hists.setdefault(d, np.zeros(d + 1, dtype=np.int64))
    cur[: h.size] += h


def read_vllm(path: str | Path) -> tuple[dict[str, CurveEstimate], dict[str, Any]]:
    """Parse a vLLM acceptance log (see module docstring); returns estimates per domain (or "all") and info."""
    path = Path(path)
    data = _load_json(path)
    if isinstance(data, dict) and "num_accepted_tokens_per_pos" in data:
        return _vllm_counters(path, data)
    recs = _records(path, data)
    doms = _domains_of(path, recs)
    hists: dict[str, dict[int, np.ndarray]] = {}
    skipped, used_by_len = 0, False
    for i, rec in enumerate(recs):
        if not isinstance(rec, dict):
            raise InputError(path, f"[{i}]", f"expected an object, got {type(rec).__name__}")
        if "metrics" in rec:
            m = rec["metrics"]
            sd = None if m is None else _obj(path, f"[{i}].metrics", m).get("speculative_decoding")
            where = f"[{i}].metrics.speculative_decoding"
        elif "acceptance_histogram" in rec or "acceptance_histogram_by_draft_length" in rec:
            sd, where = rec, f"[{i}]"
        elif "speculative_decoding" in rec:
            sd, where = rec["speculative_decoding"], f"[{i}].speculative_decoding"
        else:
            raise InputError(path, f"[{i}]", "no metrics.speculative_decoding (start vLLM with "
                             "--per-request-spec-decode-metrics summary) and no acceptance_histogram")
        if sd is None:
            skipped += 1
            continue
        _obj(path, where, sd)
        h = hists.setdefault(doms[i] or POOLED, {})
        if sd.get("acceptance_histogram_by_draft_length") is not None:
            used_by_len = True
            _add_by_length(path, where, sd["acceptance_histogram_by_draft_length"], h)
            continue
        _add_histogram(path, where, sd, h)
    if not hists:
        raise InputError(path, None, f"all {len(recs)} records have speculative_decoding = null (n > 1 requests or "
                         "metrics disabled); nothing to import")
    est = {d: conditional_from_histograms(h) for d, h in hists.items()}
    info = {"form": "vLLM per-request metrics.speculative_decoding", "records": len(recs),
            "skipped_null_records": skipped,
            "draft_length": ("per-step draft length from acceptance_histogram_by_draft_length; shorter drafts are "
                             "right-censored (assumes the drafted length does not depend on how well the block "
                             "would have been accepted - not true of adaptive drafters)") if used_by_len else
                            "every step drafted num_spec_tokens tokens (checked against num_draft_tokens)"}
    return est, info


def _vllm_counters(path: Path, data: dict) -> tuple[dict[str, CurveEstimate], dict[str, Any]]:
    """vLLM's server counters: unconditional per-position accepted counts over num_drafts drafts."""
    nd = data.get("num_drafts")
    if not isinstance(nd, int) or isinstance(nd, bool) or not 0 < nd <= MAX_COUNT:
        raise InputError(path, "num_drafts", f"expected an integer in 1..{MAX_COUNT}, got {_short(nd)}")
    a = _int_list(path, "num_accepted_tokens_per_pos", data["num_accepted_tokens_per_pos"])
    if a.size == 0:
        raise InputError(path, "num_accepted_tokens_per_pos", "empty list")
    if a[0] > nd or (np.diff(a) > 0).any():
        raise InputError(path, "num_accepted_tokens_per_pos", f"per-position accepted counts must be "
                         f"non-increasing and <= num_drafts={nd} (they are unconditional), got {a.tolist()}")
    info = {"form": "vLLM server counters (unconditional per-position accepted counts)", "num_drafts": nd,
            "draft_length": "every draft assumed to have the full length (the counters do not say)"}
    return {POOLED: conditional_from_unconditional(nd, a)}, info


def _add_by_length(path: Path, where: str, by_len: Any, h: dict[int, np.ndarray]) -> None:
    """acceptance_histogram_by_draft_length: one histogram per drafted length, added to ``h``."""
    if not isinstance(by_len, dict):
        raise InputError(path, f"{where}.acceptance_histogram_by_draft_length", "expected an object")
    for key, counts in by_len.items():
        try:
            d = int(key)
        except ValueError:
            raise InputError(path, f"{where}.acceptance_histogram_by_draft_length",
                             f"draft-length key {_short(key)} is not an integer") from None
        c = _int_list(path, f"{where}.acceptance_histogram_by_draft_length.{d}", counts)
        if d < 0 or c.size != d + 1:
            raise InputError(path, f"{where}.acceptance_histogram_by_draft_length.{d}",
                             f"draft length {d} needs {d + 1} buckets, got {c.size}")
        _add(h, d, c)


def _add_histogram(path: Path, where: str, sd: dict, h: dict[int, np.ndarray]) -> None:
    """acceptance_histogram of a run whose every step drafted num_spec_tokens (checked), added to ``h``."""
    hist = _int_list(path, f"{where}.acceptance_histogram", sd.get("acceptance_histogram"))
    K = sd.get("num_spec_tokens", hist.size - 1)
    if not isinstance(K, int) or isinstance(K, bool) or hist.size != K + 1:
        raise InputError(path, f"{where}.acceptance_histogram", f"expected num_spec_tokens+1 = {_short(K)}+1 "
                         f"buckets, got {hist.size}")
    steps = int(hist.sum())
    if "num_spec_steps" in sd and sd["num_spec_steps"] != steps:
        raise InputError(path, f"{where}.num_spec_steps", f"{_short(sd['num_spec_steps'])} != histogram sum "
                         f"{steps}")
    nd = sd.get("num_draft_tokens")
    if nd is not None and nd != steps * K:
        raise InputError(path, f"{where}.num_draft_tokens", f"{_short(nd)} != num_spec_steps*num_spec_tokens = "
                         f"{steps * K}: drafts had variable length, which acceptance_histogram alone cannot "
                         "convert exactly; log acceptance_histogram_by_draft_length (vLLM >= 0.29)")
    _add(h, K, hist)


def read_sglang(path: str | Path, draft_len: int | None = None) -> tuple[dict[str, CurveEstimate], dict[str, Any]]:
    """Parse SGLang meta_info acceptance histograms (see module docstring)."""
    path = Path(path)
    data = _load_json(path)
    if isinstance(data, dict) and "draft_len" in data and draft_len is None:
        draft_len = data["draft_len"]
    if draft_len is not None and (not isinstance(draft_len, int) or isinstance(draft_len, bool)
                                  or not 1 <= draft_len <= MAX_DRAFT_LEN):
        raise InputError(path, "draft_len", f"expected an integer draft length in 1..{MAX_DRAFT_LEN}, got "
                         f"{_short(draft_len)}")
    recs = _records(path, data)
    doms = _domains_of(path, recs)
    per: dict[str, list[np.ndarray]] = {}
    for i, rec in enumerate(recs):
        if not isinstance(rec, dict):
            raise InputError(path, f"[{i}]", f"expected an object, got {type(rec).__name__}")
        mi, where = (rec["meta_info"], f"[{i}].meta_info") if "meta_info" in rec else (rec, f"[{i}]")
        if not isinstance(mi, dict):
            raise InputError(path, where, "expected an object")
        key = "spec_accept_histogram" if "spec_accept_histogram" in mi else "spec_correct_drafts_histogram"
        if key not in mi:
            raise InputError(path, f"{where}.spec_accept_histogram", "missing (needs an SGLang version whose "
                             "meta_info returns spec_accept_histogram, with speculative decoding on)")
        hist = _int_list(path, f"{where}.{key}", mi[key])
        vc = mi.get("spec_verify_ct")
        if not isinstance(vc, int) or isinstance(vc, bool):
            raise InputError(path, f"{where}.spec_verify_ct", f"expected an integer, got {_short(vc)}")
        if int(hist.sum()) != vc:
            raise InputError(path, f"{where}.{key}", f"histogram sums to {int(hist.sum())} but spec_verify_ct = {vc}")
        if draft_len is not None and hist.size > draft_len + 1 and hist[draft_len + 1:].any():
            raise InputError(path, f"{where}.{key}", f"has steps accepting more than draft_len={draft_len} tokens")
        per.setdefault(doms[i] or POOLED, []).append(hist)
    inferred = draft_len is None
    if inferred:
        nz = [int(np.flatnonzero(h).max()) for hs in per.values() for h in hs if h.any()]
        draft_len = max(nz, default=0)
        if draft_len == 0:
            raise InputError(path, "spec_accept_histogram", "no step accepted any draft token and draft_len was "
                             "not given: the draft length cannot be inferred")
    est = {}
    for d, hs in per.items():
        tot = np.zeros(draft_len + 1, dtype=np.int64)
        for h in hs:
            tot[: min(h.size, draft_len + 1)] += h[: draft_len + 1]
        est[d] = conditional_from_histograms({draft_len: tot})
    info = {"form": "SGLang meta_info.spec_accept_histogram", "records": len(recs), "draft_len": draft_len,
            "draft_length": (f"draft length inferred as {draft_len} (largest accepted count observed; steps that "
                             "accepted that many are treated as censored)") if inferred else
                            f"draft length {draft_len} given"}
    return est, info


# ---- building models ---------------------------------------------------------------------------------------
def _common_lost(params: ParametricParams, pooled: bool) -> list[str]:
    lost = [f"heterogeneity: not identifiable from acceptance histograms (each one pools many blocks); ASSUMED the "
            f"paper-calibrated default sigma_req={params.sigma_req}, sigma_block={params.sigma_block}, "
            f"sigma_tok={params.sigma_tok} (logit units) and the easy/hard link offset={params.offset}, "
            f"slope={params.slope}, jump={params.jump}, slope_easy={params.slope_easy}",
            f"confidences: engine logs carry none; ASSUMED the confidence model fitted to the DSpark paper (noise_sd="
            f"{params.noise_sd} to noise_sd_end={params.noise_sd_end}, raw_gain={params.raw_gain}, simulator-applied "
            f"STS unless --confidence raw, T={params.temperature}; dsparksim/data/acceptance_fit.json)",
            "the last step of a response can be cut short by EOS / max_tokens, which slightly lowers measured "
            "acceptance at late positions"]
    if pooled:
        lost.append("domain mix pooled: one curve for every request domain (records carried no 'domain')")
    return lost


def model_from_estimates(est: Mapping[str, CurveEstimate], K: int, *, source: str, importer: str,
                         info: Mapping[str, Any], params: ParametricParams | None = None, drafter: str = "dspark",
                         domain_default: str = "chat") -> ParametricAcceptance:
    """Parametric model on imported curves; errors if a position 1..K was never reached in the log."""
    params = params or ParametricParams()
    curves, low = {}, {}
    for d, e in est.items():
        D = e.conditional.size
        if K > D or (e.at_risk[:K] == 0).any():
            k = D + 1 if K > D else int(np.flatnonzero(e.at_risk[:K] == 0)[0]) + 1
            raise ConfigError(f"acceptance spec {source!r}", "K",
                              f"K mismatch: no logged step reached draft position {k} ({d}; the log supports "
                              f"positions 1..{k - 1}), so K={K} cannot be estimated; use K <= {k - 1}")
        curves[d] = e.conditional[:K]
        small = [k + 1 for k in range(K) if e.at_risk[k] < LOW_SUPPORT]
        if small:
            low[d] = small
    lost = _common_lost(params, POOLED in est)
    lost.append(f"drafter: engine logs do not name a draft-cost class; drafter={drafter!r} assumed "
                "(override with ?drafter=)")
    meta = {"importer": importer, "import_info": dict(info), "lost": lost,
            "counts": {d: {"at_risk": e.at_risk[:K].tolist(), "successes": e.successes[:K].tolist(),
                           "steps": e.n_steps} for d, e in est.items()}}
    if low:
        meta["low_support_positions"] = {d: v for d, v in low.items()}
    return ParametricAcceptance(curves, K, drafter=drafter, params=params, source=source,
                                domain_default=domain_default, extra_metadata=meta)


def import_vllm(path: str | Path, K: int, **kw) -> ParametricAcceptance:
    """``vllm:PATH`` -> parametric model on the logged conditional curve(s)."""
    est, info = read_vllm(path)
    return model_from_estimates(est, K, source=f"vllm:{path}", importer="vllm", info=info, **kw)


def import_sglang(path: str | Path, K: int, *, draft_len: int | None = None, **kw) -> ParametricAcceptance:
    """``sglang:PATH`` -> parametric model on the logged conditional curve(s)."""
    est, info = read_sglang(path, draft_len)
    return model_from_estimates(est, K, source=f"sglang:{path}", importer="sglang", info=info, **kw)


def from_tau(tau: float, K: int, *, params: ParametricParams | None = None, drafter: str = "dspark",
             domain_default: str = "chat", source: str | None = None) -> ParametricAcceptance:
    """``tau:X`` -> flat conditional curve with 1 + sum_k alpha^k = X over k = 1..K."""
    src = source or f"tau:{tau}"
    params = params or ParametricParams()
    a = flat_alpha_for_tau(tau, K, f"acceptance spec {src!r}")
    lost = [f"only the mean tau={tau} is known: ASSUMED a flat conditional acceptance alpha={a:.6f} at every "
            "position (the real per-position shape, e.g. decay along the block, is lost)"]
    lost += _common_lost(params, True)[:2]
    lost.append("domain: one curve for every request domain")
    lost.append(f"drafter: a bare tau names no draft-cost class; drafter={drafter!r} assumed (override with ?drafter=)")
    return ParametricAcceptance({POOLED: np.full(K, a)}, K, drafter=drafter, params=params, source=src,
                                domain_default=domain_default,
                                extra_metadata={"importer": "tau", "tau": tau, "flat_alpha": a, "lost": lost})
