"""Acceptance sources: what the simulator samples per request per step (confidences + true accepted prefix).

``load_acceptance(spec, K)`` builds one from a spec string:

=============================  ==========================================================================
``dspark`` ``dflash``          paper-calibrated parametric model (K <= 15; positions 8..15 use the paper's
``eagle3``                     flat tail, eagle3 repeats its position-7 value — stated in the metadata)
``mtp1`` ``mtp1-v3``           parametric, K must be 1, acceptance 0.87 in every domain (DeepSeek-V3 report)
``mtp1-v4``                    the same with 0.775 (DeepSeek-V4 MTP position 1, 0.76-0.79: the paper's baseline)
``mtp`` ``mtp?a1=..&tau2=..``  DeepSeek's MTP module reused for K = 1..4 positions (:mod:`.mtp`: a1 measured, a2
                               derived from SGLang's 2.49, decay assumed; params a1, a2|tau2, decay); no
                               confidence head (confidence-reading policies are refused)
``...?sigma_req=0.5&...``      override parameters: sigma_req, sigma_block, sigma_tok, noise_sd, noise_sd_end,
                               noise_block, raw_gain, jump, slope, slope_easy, offset, temperature
``...?head_blind=0.5&...``     paper drafters: a head blind to part of the domain shift, head_mix=M:C:H the mix
                               it learned on, sts_mix=M:C:H the mix STS is fitted on (:mod:`.headshift`)
``PATH.csv|.csv.gz|.parquet``  replay an acceptance trace (format: :mod:`.trace_format`)
``vllm:PATH`` ``sglang:PATH``  engine-log importers (:mod:`.importers`); extra params ``drafter=``,
                               ``draft_len=`` (sglang)
``tau:3.2``                    flat curve with that mean tokens per step (bonus included); ``drafter=`` param
=============================  ==========================================================================
"""
from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Mapping

from dsparksim.errors import ConfigError
from dsparksim.io.textio import is_file
from dsparksim.acceptance.base import DOMAINS, AcceptanceModel, Block
from dsparksim.acceptance.parametric import ParametricAcceptance, ParametricParams
from dsparksim.acceptance.reference import K_MAX

PARAMETRIC_DRAFTERS = ("dspark", "dflash", "eagle3", "mtp1")
TRACE_SUFFIXES = (".csv", ".csv.gz", ".parquet")
IMPORTERS = ("vllm", "sglang", "tau")
MTP_CHAIN = "mtp"   # DeepSeek's MTP module reused for K positions (:mod:`.mtp`)
# Named MTP-1 acceptance sources -> the reference source they read (:func:`.reference.mtp1_alpha`; "" = default v3)
MTP1_NAMES = {"mtp1": "", "mtp1-v3": "v3", "mtp1-v4": "v4"}

__all__ = ["AcceptanceModel", "AcceptanceSpec", "Block", "DOMAINS", "PARAMETRIC_DRAFTERS", "ParametricAcceptance",
           "ParametricParams", "load_acceptance", "drafter_of", "parse_spec", "resolve_trace_path"]


def _src(spec: str) -> str:
    return f"acceptance spec {spec!r}"


@dataclass(frozen=True)
class AcceptanceSpec:
    """A parsed acceptance spec string (the one registry of spec syntax; see the module docstring).

    kind:   "parametric" | "mtp" | "trace" | "vllm" | "sglang" | "tau".
    name:   the parametric drafter (dspark, dflash, eagle3, mtp1); else the kind.
    arg:    the path (trace, vllm, sglang) or number (tau) as written; for mtp1-v3 / mtp1-v4 the named source
            (v3, v4); "" for a plain parametric name (mtp1 = the default source, v3).
    params: the ``?name=value&...`` parameters (a trace path takes none), still strings.
    """

    text: str
    kind: str
    name: str
    arg: str = ""
    params: Mapping[str, str] = field(default_factory=dict)

    @property
    def path(self) -> Path | None:
        """The file the source reads (a shipped ``traces/NAME`` resolved), or None for a model without one."""
        if self.kind == "trace":
            return resolve_trace_path(self.arg)
        if self.kind in ("vllm", "sglang"):
            return Path(self.arg)
        return None


def _text(spec) -> str:
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError("acceptance spec", None, f"expected a non-empty string, got {spec!r}")
    return spec.strip()


def _split_query(spec: str) -> tuple[str, dict[str, str]]:
    if "?" not in spec:
        return spec, {}
    base, query = spec.rsplit("?", 1)
    params: dict[str, str] = {}
    for part in query.split("&"):
        if not part:
            continue
        if "=" not in part:
            raise ConfigError(_src(spec), part, "expected name=value parameters after '?'")
        k, v = part.split("=", 1)
        if k in params:
            raise ConfigError(_src(spec), k, "parameter given twice")
        params[k] = v
    return base, params


def parse_spec(spec: str) -> AcceptanceSpec:
    """Parse an acceptance spec string (no file is read): ConfigError naming the spec when it is malformed."""
    text = _text(spec)
    # a trace file by its suffix, unless an importer prefix says it is an engine log ('vllm:x.csv')
    if text.lower().endswith(TRACE_SUFFIXES) and text.partition(":")[0] not in IMPORTERS:
        return AcceptanceSpec(text, "trace", "trace", text)
    base, params = _split_query(text)
    kind, colon, arg = base.partition(":")
    if kind in MTP1_NAMES and not colon:
        return AcceptanceSpec(text, "parametric", "mtp1", MTP1_NAMES[kind], params)
    if kind in PARAMETRIC_DRAFTERS and not colon:     # 'dspark:' is a typo, not 'dspark'
        return AcceptanceSpec(text, "parametric", kind, "", params)
    if kind == MTP_CHAIN and not colon:
        return AcceptanceSpec(text, "mtp", "mtp", "", params)
    if kind in IMPORTERS and arg:
        return AcceptanceSpec(text, kind, kind, arg, params)
    raise ConfigError(_src(text), None, f"unknown acceptance source; expected one of {PARAMETRIC_DRAFTERS}, "
                      f"{', '.join(n for n in MTP1_NAMES if n != 'mtp1')}, 'mtp' (?a1=..&tau2=..&decay=..), a trace "
                      f"file ({', '.join(TRACE_SUFFIXES)}), 'vllm:PATH', 'sglang:PATH' or 'tau:X'")


def resolve_trace_path(path: str) -> Path:
    """A trace path as given, or (for ``traces/NAME``) the copy shipped inside the installed package."""
    p = Path(path)
    if is_file(p):
        return p
    parts = p.parts
    if len(parts) == 2 and parts[0] == "traces":
        try:
            res = resources.files("dsparksim._traces").joinpath(parts[1])
            if res.is_file():
                return Path(str(res))
        except ModuleNotFoundError:
            pass
    return p


def _check_K(spec: str, K) -> int:
    if isinstance(K, bool) or not isinstance(K, int) or not 1 <= K <= K_MAX:
        raise ConfigError(_src(spec), "K", f"block size must be an integer in 1..{K_MAX}, got {K!r}")
    return K


def _pop_str(params: dict[str, str], name: str, default: str) -> str:
    return params.pop(name, default)


def _pop_int(spec: str, params: dict[str, str], name: str) -> int | None:
    if name not in params:
        return None
    v = params.pop(name)
    try:
        return int(v)
    except ValueError:
        raise ConfigError(_src(spec), name, f"expected an integer, got {v!r}") from None


def load_acceptance(spec: str, K: int, *, domain_default: str = "chat", confidence: str = "sts") -> AcceptanceModel:
    """Build the acceptance source named by ``spec`` for block size ``K`` (see module docstring).

    ``confidence``: "sts" (default: the simulator's sequential temperature scaling of the raw head) or "raw"
    (uncalibrated head) for parametric sources (paper drafters, tau:, vllm:, sglang:); a trace replays the
    confidences it recorded, so only "sts" (as recorded) is accepted there.

    ``domain_default`` is used for requests whose domain is empty/None. Errors: ConfigError naming the spec
    (bad spec / K / parameter), InputError naming the file (malformed trace or log).
    """
    spec = _text(spec)
    K = _check_K(spec, K)
    if domain_default not in DOMAINS:
        raise ConfigError(_src(spec), "domain_default", f"expected one of {DOMAINS}, got {domain_default!r}")
    if confidence not in ("sts", "raw"):
        raise ConfigError(_src(spec), "confidence", f"expected 'sts' or 'raw', got {confidence!r}")
    ps = parse_spec(spec)
    if ps.kind == "trace" and confidence != "sts":
        raise ConfigError(_src(spec), "confidence", f"{confidence!r} applies to parametric sources; a trace "
                          "replays the confidences it recorded (use the default 'sts')")
    model = _load(spec, ps, K, domain_default, confidence)
    if isinstance(model, ParametricAcceptance) and model.confidence != confidence:
        model = model.with_confidence(confidence)
    return model


def _load(spec: str, ps: AcceptanceSpec, K: int, domain_default: str, confidence: str) -> AcceptanceModel:
    if ps.kind == "trace":
        from dsparksim.acceptance.trace_model import TraceAcceptance
        path = ps.path
        if not is_file(path):
            raise ConfigError(_src(spec), "path", f"acceptance trace file not found: {spec}")
        return TraceAcceptance(path, K, domain_default=domain_default, source=spec)
    params = dict(ps.params)
    if ps.kind == "mtp":
        from dsparksim.acceptance.mtp import load_mtp
        return load_mtp(spec, K, params, domain_default=domain_default, confidence=confidence)
    if ps.kind == "parametric":
        if ps.name == "mtp1" and K != 1:
            raise ConfigError(_src(spec), "K", f"mtp1 drafts exactly one token: K must be 1, got {K}")
        from dsparksim.acceptance.headshift import HeadShift
        shift = HeadShift.pop_from(params, _src(spec))
        p = ParametricParams.from_strings(params, _src(spec))
        kw = {"mtp1_source": ps.arg} if ps.name == "mtp1" and ps.arg else {}
        return ParametricAcceptance.from_paper(ps.name, K, p, domain_default=domain_default, source=spec,
                                              confidence=confidence, shift=shift, **kw)
    from dsparksim.acceptance import importers
    drafter = _pop_str(params, "drafter", "dspark")
    draft_len = _pop_int(spec, params, "draft_len") if ps.kind == "sglang" else None
    p = ParametricParams.from_strings(params, _src(spec))
    kw = dict(params=p, drafter=drafter, domain_default=domain_default)
    if ps.kind == "tau":
        try:
            tau = float(ps.arg)
        except ValueError:
            raise ConfigError(_src(spec), "tau", f"expected a number after 'tau:', got {ps.arg!r}") from None
        return importers.from_tau(tau, K, source=spec, **kw)
    if ps.kind == "vllm":
        return importers.import_vllm(ps.arg, K, **kw)
    return importers.import_sglang(ps.arg, K, draft_len=draft_len, **kw)


def drafter_of(spec: str) -> str:
    """The drafter (draft-cost class) a spec runs with, without building the model."""
    ps = parse_spec(spec)
    if ps.kind == "trace":
        from dsparksim.acceptance.trace_format import read_trace_metadata
        return str(read_trace_metadata(ps.path).get("drafter", "unknown"))
    if ps.kind in ("parametric", "mtp"):
        return ps.name
    return ps.params.get("drafter", "dspark")
