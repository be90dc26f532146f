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
``...?sigma_req=0.5&...``      override parameters: sigma_req, sigma_block, req_load, sigma_tok, noise_sd,
                               noise_sd_end, noise_block, raw_gain, jump, slope, slope_easy, offset, temperature
``...?head_blind=0.5&...``     paper drafters: a head blind to part of the domain shift, head_mix=M:C:H the mix
                               it learned on, sts_mix=M:C:H the mix STS is fitted on (:mod:`.headshift`)
``PATH.csv|.csv.gz|.parquet``  replay an acceptance trace (format: :mod:`.trace_format`)
``vllm:PATH`` ``sglang:PATH``  engine-log importers (:mod:`.importers`); extra params ``drafter=``,
                               ``draft_len=`` (sglang)
``tau:3.2``                    flat curve with that mean tokens per step (bonus included); ``drafter=`` param
=============================  ==========================================================================

Each kind is one module of :mod:`.kinds` (an :class:`~.registry.AcceptanceKind`: how it parses, loads and names its
drafter) and one line in ``REGISTRY`` below; :func:`parse_spec` (:mod:`.registry`) reads every spec string.
"""
from __future__ import annotations

from dsparksim.acceptance.base import DOMAINS, AcceptanceModel, Block
from dsparksim.acceptance.kinds.engine_logs import EngineLog
from dsparksim.acceptance.kinds.mtp_chain import MTPChain
from dsparksim.acceptance.kinds.parametric import MTP1_NAMES, PARAMETRIC_DRAFTERS, Parametric
from dsparksim.acceptance.kinds.tau import Tau
from dsparksim.acceptance.kinds.trace import TRACE_SUFFIXES, Trace, resolve_trace_path
from dsparksim.acceptance.parametric import ParametricAcceptance, ParametricParams
from dsparksim.acceptance.reference import K_MAX
from dsparksim.acceptance.registry import REGISTRY, AcceptanceKind, AcceptanceSpec, parse_spec, spec_text, src
from dsparksim.errors import ConfigError

# One line per kind (the order the error message lists them in; a trace path is recognised first).
REGISTRY.update({
    "parametric": Parametric,
    "mtp": MTPChain,
    "trace": Trace,
    "vllm": EngineLog.of("vllm"),
    "sglang": EngineLog.of("sglang", "draft_len"),
    "tau": Tau,
})

__all__ = ["AcceptanceKind", "AcceptanceModel", "AcceptanceSpec", "Block", "DOMAINS", "MTP1_NAMES",
           "PARAMETRIC_DRAFTERS", "ParametricAcceptance", "ParametricParams", "REGISTRY", "TRACE_SUFFIXES",
           "load_acceptance", "drafter_of", "parse_spec", "resolve_trace_path"]


def _check_K(spec: str, K) -> int:
    if isinstance(K, bool) or not isinstance(K, int) or not 1 <= K <= K_MAX:
        raise ConfigError(src(spec), "K", f"block size must be an integer in 1..{K_MAX}, got {K!r}")
    return K


def load_acceptance(spec: str, K: int, *, domain_default: str = "chat", confidence: str = "sts") -> AcceptanceModel:
    """Build the acceptance source named by ``spec`` for block size ``K`` (see module docstring).

    ``confidence``: "sts" (default: the simulator's sequential temperature scaling of the raw head) or "raw"
    (uncalibrated head) for parametric sources (paper drafters, tau:, vllm:, sglang:); a trace replays the
    confidences it recorded, so only "sts" (as recorded) is accepted there.

    ``domain_default`` is used for requests whose domain is empty/None. Errors: ConfigError naming the spec
    (bad spec / K / parameter), InputError naming the file (malformed trace or log).
    """
    spec = spec_text(spec)
    K = _check_K(spec, K)
    if domain_default not in DOMAINS:
        raise ConfigError(src(spec), "domain_default", f"expected one of {DOMAINS}, got {domain_default!r}")
    if confidence not in ("sts", "raw"):
        raise ConfigError(src(spec), "confidence", f"expected 'sts' or 'raw', got {confidence!r}")
    ps = parse_spec(spec)
    if ps.kind == "trace" and confidence != "sts":
        raise ConfigError(src(spec), "confidence", f"{confidence!r} applies to parametric sources; a trace "
                          "replays the confidences it recorded (use the default 'sts')")
    model = REGISTRY[ps.kind].load(ps, K, domain_default, confidence)
    if isinstance(model, ParametricAcceptance) and model.confidence != confidence:
        model = model.with_confidence(confidence)
    return model


def drafter_of(spec: str) -> str:
    """The drafter (draft-cost class) a spec runs with, without building the model."""
    ps = parse_spec(spec)
    return REGISTRY[ps.kind].drafter(ps)
