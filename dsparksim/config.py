"""Frozen configuration of one simulated run, saved next to every result (config.json).

Each field that is a run option carries its whole definition in ``dataclasses.field(metadata={"option": Option})``:
command-line spellings, help, parser, the value types a sweep spec may give, choices and the value when it is not
given. The CLI's shared run options (``dsparksim.cli.main``) and the sweep keys (``dsparksim.sweep.spec``) are generated
from it (:func:`run_options`), and :meth:`RunConfig.from_options` builds a run from flat option values.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Mapping

from dsparksim.errors import ConfigError
from dsparksim.io.options import (  # noqa: F401  (re-exported: the run options' public names)
    BOOL, DEFAULT_CONCURRENCY, DEFAULT_DURATION_S, INT, NUM, STR, UNSET, Option, OptionSpec, nonneg_float,
    nonneg_int, option, pos_float, pos_int)


# ------------------------------------------------------------------------------------------- run options
# which option sections a config error's source checks (the dataclasses' own ConfigError sources)
_SECTIONS_OF_SOURCE = {"config": ("run", "engine"), "TrafficConfig": ("traffic",)}


def _section_classes() -> dict[str, type]:
    from dsparksim.traffic.config import TrafficConfig  # lazy: keeps this module import-light

    return {"run": RunConfig, "engine": EngineConfig, "traffic": TrafficConfig}


@functools.lru_cache(maxsize=1)
def run_options() -> dict[str, OptionSpec]:
    """Every run option, keyed by option key, in definition order (RunConfig; its engine and traffic sections)."""
    classes = _section_classes()
    out: dict[str, OptionSpec] = {}

    def walk(section: str) -> None:
        for f in dataclasses.fields(classes[section]):
            if f.name in classes and f.name != section:
                walk(f.name)
                continue
            o = f.metadata.get("option")
            if o is None:
                continue
            key = o.key or f.name
            default = f.default if o.default is UNSET else o.default
            out[key] = OptionSpec(key=key, section=section, field=f.name, option=o, default=default)

    walk("run")
    return out


def _router_names() -> tuple[str, ...]:
    from dsparksim.sim.routers import ROUTER_NAMES  # lazy: the routers module grows with the replica engine

    return ROUTER_NAMES


def _check_router(spec: str) -> None:
    """ConfigError (listing the registered routers) unless ``spec`` names a registered router."""
    from dsparksim.sim.routers import router_class  # lazy: the routers module grows with the replica engine

    router_class(spec)


# Fields typed from Python (the command line parses them): an integer field takes an int (a numpy integer is stored
# as int); a float such as 6.5 would be truncated and a string fail deep inside a run. A switch takes True or False:
# the string "no" is truthy. None stays None where the field allows it (its default is None).
ENGINE_INTS = ("block_size", "kv_capacity_tokens", "max_num_seqs", "max_batched_tokens", "prefill_chunk_tokens",
               "replicas", "dp_ranks", "dp_balance_timeout_iters", "dp_balance_wait_iters", "batch_wait_timeout_iters",
               "kv_page_tokens", "prefill_replicas", "cuda_graph_max_bs", "tensor_parallel_size")
ENGINE_BOOLS = ("extrapolate", "disaggregated", "mixed_prefill", "pad_verify")


def _check_types(obj: Any, ints: tuple[str, ...], bools: tuple[str, ...]) -> None:
    """ConfigError naming the field unless each of ``ints`` is an integer (numpy integers stored as int) and each of
    ``bools`` True or False; a field whose default is None may be None."""
    for name in ints + bools:
        v = getattr(obj, name)
        if v is None and _field_default(type(obj), name) is None:
            continue
        if name in bools:
            if not isinstance(v, bool):
                raise ConfigError("config", name, f"expected True or False, got {v!r}")
        elif isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise ConfigError("config", name, f"expected an integer, got {v!r}")
        elif type(v) is not int:
            object.__setattr__(obj, name, int(v))


def _count(name: str, v: Any, hi: int | None = None) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1 or (hi is not None and v > hi):
        raise ConfigError("config", name, f"must be an integer in 1..{hi}, got {v!r}" if hi else
                          f"must be an integer >= 1, got {v!r}")


# Engines one run may simulate (replicas x DP ranks): each keeps its own scheduler state, so a typo like
# --replicas 100000 would exhaust memory instead of answering.
MAX_ENGINES = 4096
# Request slots one run may hold (max_num_seqs x engines): each engine pre-allocates its max_num_seqs slots and the
# acceptance models size their per-request state by the largest slot id (MAX_ENGINES engines at the default 1024).
MAX_SLOTS = MAX_ENGINES * 1024


# ------------------------------------------------------------------------------------------------- configs
@dataclass(frozen=True)
class EngineConfig:
    """The serving engine being simulated (DESIGN.md section 6).

    block_size:          K, draft tokens proposed per request per step (mtp1 always runs with 1).
    drafter:             drafting-cost entry of the profile for the block drafter; None = the acceptance
                         source's drafter (mtp1 always uses the profile's "mtp1" entry).
    kv_capacity_tokens:  KV-cache capacity in tokens; None = the profile's metadata value.
    max_num_seqs:        most requests running at once (vLLM's max_num_seqs).
    max_batched_tokens:  token budget of one target forward; None = the profile's largest breakpoint.
    prefill_chunk_tokens: most prefill tokens scheduled in one step (chunked prefill).
    extrapolate:         allow (and report) cost lookups beyond the profile's largest breakpoint.
    replicas:            identical engine replicas behind a router (each with this configuration).
    router:              how requests are spread over the replicas (one of ``dsparksim.sim.routers.ROUTER_NAMES``).
    dp_ranks:            data-parallel attention ranks of one MoE engine, stepped in lockstep.
    dp_balance_timeout_iters, dp_balance_wait_iters: TensorRT-LLM's attention-DP balance (sim/dp_balance.py).
    batch_wait_timeout_iters, batch_wait_max_tokens_ratio: TensorRT-LLM's batch waiting, both or neither
                         (sim/batch_wait.py).
    kv_policy:           KV memory: "paged" (pages taken as tokens are written, preemption by recompute, as vLLM)
                         or "reserve" (prompt + output + K reserved at admission, never preempts).
    kv_page_tokens:      tokens per KV page (paged).
    kv_watermark:        fraction of KV pages admission keeps free (paged; vLLM's 0.01).
    disaggregated:       decode-only engines behind a prefill pool (dsparksim.sim.disagg).
    prefill_replicas:    prefill instances of the pool (disaggregated).
    kv_transfer_gbps:    prefill -> decode link bandwidth in Gbit/s (disaggregated; required there).
    kv_bytes_per_token:  KV bytes per token shipped (disaggregated); None = the profile's metadata value.
    mixed_prefill:       a step mixes prefill chunks with decode (vLLM, TensorRT-LLM); False = a step with a prefill
                         chunk carries no decode (SGLang's default, --enable-mixed-chunk off; sim/scheduler.py doc). A
                         decode-only engine (disaggregated) always mixes (SGLang's decode server runs no prefill step).
    pad_verify:          verify lengths padded to the step's maximum (no variable-length kernels; sim/scheduler.py
                         doc).
    draft_exit:          early-exit survival threshold of the drafter, None = off (sim/early_exit.py).
    """

    block_size: int = option(
        7, "--num-speculative-tokens", "-K", "--block-size", parse=int, kinds=INT, metavar="K", group="inputs",
        deprecated=(("--block-size", "vLLM's --block-size is the KV page size"),),
        help="draft tokens per block, K (--block-size: deprecated alias) [%(default)s]")
    drafter: str | None = option(None)
    kv_capacity_tokens: int | None = option(None, "--kv-capacity", parse=int, kinds=INT,
                                            help="KV capacity in tokens [profile's value]")
    max_num_seqs: int = option(1024, "--max-num-seqs", "--max-running-requests", parse=int, kinds=INT,
                               help="most running requests (SGLang: --max-running-requests) [%(default)s; on a "
                                    "profile-fit profile, the fit's]")
    max_batched_tokens: int | None = option(None, "--max-batched-tokens", "--max-num-batched-tokens", parse=int,
                                            kinds=INT,
                                            help="token budget per target forward [profile's largest breakpoint]")
    prefill_chunk_tokens: int = option(2048, "--prefill-chunk", "--chunked-prefill-size", parse=int, kinds=INT,
                                       help="chunked-prefill tokens per step (SGLang: --chunked-prefill-size) "
                                            "[%(default)s; on a profile-fit profile, the chunk it was fitted at]")
    extrapolate: bool = option(False, "--extrapolate", switch=True, kinds=BOOL,
                               help="allow cost lookups beyond the profile's last breakpoint (reported in the summary)")
    replicas: int = option(1, "--replicas", parse=pos_int, kinds=INT, metavar="N",
                           help="identical engine replicas behind a router [%(default)s]")
    router: str = option("round-robin", "--router", choices=_router_names, metavar="NAME",
                         help="how requests are spread over the replicas (and DP ranks): %(choices)s [%(default)s]")
    dp_ranks: int = option(1, "--dp-ranks", "--data-parallel-size", parse=pos_int, kinds=INT, metavar="R",
                           help="data-parallel attention ranks stepped in lockstep (one MoE engine) [%(default)s]")
    dp_balance_timeout_iters: int | None = option(
        None, "--attention-dp-timeout-iters", parse=nonneg_int, kinds=INT, metavar="N",
        help="with --dp-ranks: TensorRT-LLM's attention-DP balance (attention_dp_config enable_balance, "
             "timeout_iters N): new prefills are held until every rank has one, N steps have passed, or a rank "
             "has nothing to decode, so the ranks prefill together (sim/dp_balance.py) [off: each rank prefills "
             "at once]")
    dp_balance_wait_iters: int = option(
        0, "--attention-dp-batching-wait-iters", parse=nonneg_int, kinds=INT, metavar="N",
        help="with --attention-dp-timeout-iters: attention_dp_config batching_wait_iters, steps the prefills are "
             "held more once every rank has one and every rank decodes [%(default)s]")
    batch_wait_timeout_iters: int | None = option(
        None, "--batch-wait-timeout-iters", parse=pos_int, kinds=INT, metavar="N",
        help="TensorRT-LLM's batch waiting (with --batch-wait-max-tokens-ratio): new prefills that would share a "
             "step with decoding requests are held until their prompts plus the decode tokens reach the ratio of "
             "max_num_tokens (here the smaller of --max-batched-tokens and --prefill-chunk: set both to the "
             "server's max_num_tokens) or N steps have waited, so several prefill together (sim/batch_wait.py) "
             "[off]")
    batch_wait_max_tokens_ratio: float | None = option(
        None, "--batch-wait-max-tokens-ratio", parse=pos_float, kinds=NUM, metavar="FRAC",
        help="with --batch-wait-timeout-iters: TensorRT-LLM's batch_wait_max_tokens_ratio, in (0, 1] [off]")
    kv_policy: str = option("paged", "--kv-policy", choices=("paged", "reserve"), metavar="POLICY",
                            help="KV memory: paged (pages taken as tokens are written; when a step cannot get its "
                                 "pages the most recently admitted request is preempted and recomputed, as vLLM) "
                                 "or reserve (prompt+output+K reserved at admission, never preempts) [%(default)s]")
    kv_page_tokens: int = option(16, "--kv-page-tokens", parse=pos_int, kinds=INT, metavar="N",
                                 help="tokens per KV page with --kv-policy paged (vLLM's --block-size) [%(default)s]")
    kv_watermark: float = option(0.01, "--kv-watermark", parse=nonneg_float, kinds=NUM, metavar="FRAC",
                                 help="fraction of KV pages admission keeps free with --kv-policy paged (vLLM's "
                                      "watermark) [%(default)s]")
    disaggregated: bool = option(False, "--disaggregated", switch=True, kinds=BOOL,
                                 help="decode-only engines: a prefill pool builds each prompt's KV and ships it "
                                      "(TTFT = pool queueing + prefill + KV transfer; needs --kv-transfer-gbps)")
    prefill_replicas: int = option(1, "--prefill-replicas", parse=pos_int, kinds=INT, metavar="N",
                                   help="prefill instances with --disaggregated (FIFO, one request at a time) "
                                        "[%(default)s]")
    kv_transfer_gbps: float | None = option(None, "--kv-transfer-gbps", parse=pos_float, kinds=NUM, metavar="GBIT",
                                            help="prefill -> decode KV link bandwidth in Gbit/s (--disaggregated)")
    kv_bytes_per_token: float | None = option(
        None, "--kv-bytes-per-token", parse=pos_float, kinds=NUM, metavar="B",
        help="KV bytes per token shipped with --disaggregated [the profile's metadata.kv_bytes_per_token]")
    mixed_prefill: bool = option(
        True, "--mixed-prefill", switch=True, kinds=BOOL,
        help="steps mix prefill chunks with decode (vLLM, TensorRT-LLM); --no-mixed-prefill: a step with a prefill "
             "chunk carries no decode and the decoding requests wait it out (SGLang's default, "
             "--enable-mixed-chunk off; a --disaggregated decode-only engine always mixes) [on; on a profile-fit profile, the "
             "fit's when its runs agreed]")
    mem_fraction_static: float | None = option(
        None, "--mem-fraction-static", parse=pos_float, kinds=NUM, metavar="FRAC",
        help="SGLang's static memory fraction (weights + KV pool): sets the KV capacity from the profile's memory "
             "metadata (built profiles); instead of --kv-capacity [on a profile-fit profile, the fit's]")
    cuda_graph_max_bs: int | None = option(
        None, "--cuda-graph-max-bs", parse=pos_int, kinds=INT, metavar="N",
        help="SGLang's largest CUDA-graph batch: recorded; not priced (no profile has an eager-mode term)")
    pad_verify: bool = option(
        False, "--pad-verify", switch=True, kinds=BOOL,
        help="the engine has no variable-length attention kernels: every decoding request of a step runs at the "
             "step's longest verify length, and the target's forward is priced at that padded batch (only the "
             "chosen draft tokens are verified; the policy is not told) [off]")
    draft_exit: float | None = option(
        None, "--draft-exit", parse=nonneg_float, kinds=NUM, metavar="T",
        help="difficulty-aware early exit of drafting: the drafter stops a request's block at the first position "
             "whose running survival (product of its confidences) falls below T in [0, 1]; the positions not "
             "drafted are never verified and their drafting is not paid (autoregressive drafters skip forwards; a "
             "parallel drafter saves only its Markov head's share) [off]")
    tensor_parallel_size: int | None = option(
        None, "--tensor-parallel-size", "--tp", parse=pos_int, kinds=INT, metavar="TP",
        help="the deployment's TP: checked against the profile's metadata.tensor_parallel (a profile prices one TP)")

    def __post_init__(self) -> None:
        _check_types(self, ENGINE_INTS, ENGINE_BOOLS)
        if not 1 <= self.block_size <= 15:
            raise ConfigError("config", "block_size", f"must be in 1..15, got {self.block_size}")
        if self.max_num_seqs < 1:
            raise ConfigError("config", "max_num_seqs", f"must be >= 1, got {self.max_num_seqs}")
        if self.kv_capacity_tokens is not None and self.kv_capacity_tokens < 1:
            raise ConfigError("config", "kv_capacity_tokens", f"must be >= 1, got {self.kv_capacity_tokens}")
        if self.max_batched_tokens is not None and self.max_batched_tokens < 2:
            raise ConfigError("config", "max_batched_tokens", f"must be >= 2, got {self.max_batched_tokens}")
        if self.prefill_chunk_tokens < 1:
            raise ConfigError("config", "prefill_chunk_tokens", f"must be >= 1, got {self.prefill_chunk_tokens}")
        _count("replicas", self.replicas, MAX_ENGINES)
        _check_router(self.router)
        _count("dp_ranks", self.dp_ranks, MAX_ENGINES)
        if self.kv_policy not in ("paged", "reserve"):
            raise ConfigError("config", "kv_policy", f"expected 'paged' or 'reserve', got {self.kv_policy!r}")
        _count("kv_page_tokens", self.kv_page_tokens)
        if isinstance(self.kv_watermark, bool) or not (isinstance(self.kv_watermark, (int, float))
                                                       and 0 <= self.kv_watermark < 1):
            raise ConfigError("config", "kv_watermark", f"must be a fraction in [0, 1), got {self.kv_watermark!r}")
        _count("prefill_replicas", self.prefill_replicas, MAX_ENGINES)
        for name in ("kv_transfer_gbps", "kv_bytes_per_token"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                                  or v <= 0):
                raise ConfigError("config", name, f"must be a finite number > 0, got {v!r}")
        if not self.disaggregated and (self.prefill_replicas != 1 or self.kv_transfer_gbps is not None
                                       or self.kv_bytes_per_token is not None):
            raise ConfigError("config", "disaggregated", "--prefill-replicas, --kv-transfer-gbps and "
                              "--kv-bytes-per-token describe the prefill pool of a --disaggregated run; "
                              "add --disaggregated or drop them")
        if self.kv_policy == "reserve":
            # name only what was set (a value other than the default; `run` and sweeps also refuse the default
            # value given explicitly: reserved_kv_conflict)
            odd = [k for k in PAGED_ONLY if getattr(self, k) != _field_default(type(self), k)]
            if odd:
                raise ConfigError("config", "kv_policy", reserve_message(
                    [f"{PAGED_ONLY[k]} {getattr(self, k)}" for k in odd], flags=True))
        if self.mem_fraction_static is not None:
            f = self.mem_fraction_static
            if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f <= 1:
                raise ConfigError("config", "mem_fraction_static", f"expected a fraction in (0, 1], got {f!r}")
            if self.kv_capacity_tokens is not None:
                raise ConfigError("config", "mem_fraction_static", f"conflicts with kv_capacity_tokens "
                                  f"({self.kv_capacity_tokens}): both set the KV capacity; give one")
        if self.draft_exit is not None:
            from dsparksim.sim.early_exit import check_threshold   # lazy: keeps this module import-light

            check_threshold(self.draft_exit)
        for name in ("cuda_graph_max_bs", "tensor_parallel_size"):
            if getattr(self, name) is not None:
                _count(name, getattr(self, name))
        if self.replicas * self.dp_ranks > MAX_ENGINES:
            raise ConfigError("config", "replicas", f"replicas x dp_ranks = {self.replicas} x {self.dp_ranks} = "
                              f"{self.replicas * self.dp_ranks} engines, above the limit of {MAX_ENGINES}")
        _check_dp_balance(self)
        _check_batch_wait(self)
        n_eng = self.replicas * self.dp_ranks
        if self.max_num_seqs * n_eng > MAX_SLOTS:
            raise ConfigError("config", "max_num_seqs", f"{self.max_num_seqs:,} per engine x {n_eng} engine(s) = "
                              f"{self.max_num_seqs * n_eng:,} request slots, above the limit of {MAX_SLOTS:,}")


def _check_dp_balance(e: "EngineConfig") -> None:
    """The attention-DP balance applies to lockstep DP ranks: refused on one rank, and its batching wait without it."""
    t, w = e.dp_balance_timeout_iters, e.dp_balance_wait_iters
    for name, v in (("dp_balance_timeout_iters", t), ("dp_balance_wait_iters", w)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise ConfigError("config", name, f"expected an integer >= 0, got {v!r}")
    if t is not None and e.dp_ranks == 1:
        raise ConfigError("config", "dp_balance_timeout_iters", f"{t}: the attention-DP balance holds prefills "
                          "across DP ranks; with dp_ranks 1 nothing reads it: set --dp-ranks above 1 or drop it")
    if t is not None and e.disaggregated:
        raise ConfigError("config", "dp_balance_timeout_iters", f"{t}: the attention-DP balance holds the context "
                          "(prefill) requests of ranks that prefill; --disaggregated decode ranks receive their KV "
                          "from the prefill pool (TensorRT-LLM's generation servers schedule no context requests): "
                          "drop it or --disaggregated")
    if w and t is None:
        raise ConfigError("config", "dp_balance_wait_iters", f"{w}: the batching wait is part of the attention-DP "
                          "balance: set --attention-dp-timeout-iters too, or drop it")


def _check_batch_wait(e: "EngineConfig") -> None:
    """TensorRT-LLM's batch waiting needs both of its values (with one the rule never holds), and an engine that
    prefills its own requests without attention DP (TensorRT-LLM skips it with attention DP)."""
    t, r = e.batch_wait_timeout_iters, e.batch_wait_max_tokens_ratio
    if t is not None and (isinstance(t, bool) or not isinstance(t, int) or t < 1):
        raise ConfigError("config", "batch_wait_timeout_iters", f"expected an integer >= 1, got {t!r}")
    if r is not None and (isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 < r <= 1):
        raise ConfigError("config", "batch_wait_max_tokens_ratio", f"expected a fraction in (0, 1], got {r!r}")
    if (t is None) != (r is None):
        name, v = ("batch_wait_timeout_iters", t) if r is None else ("batch_wait_max_tokens_ratio", r)
        other = "--batch-wait-max-tokens-ratio" if r is None else "--batch-wait-timeout-iters"
        raise ConfigError("config", name, f"{v} without {other}: "
                          "TensorRT-LLM holds new prefills only while the wait is below its iteration limit AND the "
                          "scheduled tokens are below the ratio of the budget, so one alone never holds: set both, "
                          "or neither")
    if t is not None and e.dp_ranks > 1:
        raise ConfigError("config", "batch_wait_timeout_iters", f"{t} with dp_ranks {e.dp_ranks}: TensorRT-LLM "
                          "skips batch waiting under attention DP (its balance is --attention-dp-timeout-iters): "
                          "drop it or --dp-ranks")
    if t is not None and e.disaggregated:
        raise ConfigError("config", "batch_wait_timeout_iters", f"{t}: batch waiting holds the prefills of an "
                          "engine that prefills; --disaggregated decode engines receive their KV from the prefill "
                          "pool: drop it or --disaggregated")


# Engine options that only paged KV reads (key -> its flag): under --kv-policy reserve they are refused.
PAGED_ONLY = {"kv_page_tokens": "--kv-page-tokens", "kv_watermark": "--kv-watermark"}


def _field_default(cls: type, name: str) -> Any:
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


def reserve_message(settings: list[str], flags: bool) -> str:
    """Why paged-KV settings (e.g. ``['--kv-page-tokens 32']``) are refused under reserve KV."""
    pol, paged = ("--kv-policy reserve", "--kv-policy paged") if flags else ('kv_policy = "reserve"',
                                                                           'kv_policy = "paged"')
    what, it = ("describes", "it") if len(settings) == 1 else ("describe", "them")
    return f"{' and '.join(settings)} {what} paged KV, which {pol} does not use (nothing reads {it}): drop {it} or " \
           f"use {paged}"


def reserved_kv_conflict(kv_policy: Any, given: Mapping[str, Any], flags: bool) -> tuple[str, str] | None:
    """(field, message) when reserve KV meets a paged-only option that was given (whatever its value), else None.
    ``given``: the options the user set (key -> value); ``flags``: name them as command-line flags."""
    if kv_policy != "reserve":
        return None
    set_ = [k for k in PAGED_ONLY if k in given and given[k] is not None]
    if not set_:
        return None
    names = [f"{PAGED_ONLY[k]} {given[k]}" if flags else f"{k} = {given[k]!r}" for k in set_]
    return (PAGED_ONLY[set_[0]] if flags else set_[0]), reserve_message(names, flags)


@dataclass(frozen=True)
class RunConfig:
    """One simulated run: which inputs, which policy, which load, how long, which seed."""

    # the paper's production variant (Algorithm 1, `confidence`, verifies almost nothing on MoE profiles)
    policy: str = option("confidence-async:2", "--policy", common=False,
                         help="policy spec, e.g. confidence-async:2, fixed:7 [%(default)s]")
    profile: str = option("h100-llama2-7b-tp1", "--profile",
                          help="cost profile: shipped name (see `dsparksim profile list`) or JSON path [%(default)s]")
    acceptance: str = option("dspark", "--acceptance",
                             help="block drafter acceptance: parametric name (dspark, dflash, eagle3), mtp "
                                  "(DeepSeek's MTP module reused for K<=4; mtp?a1=..&tau2=..&decay=..), "
                                  "acceptance-trace file, vllm:PATH, sglang:PATH or tau:X [%(default)s]")
    mtp1_acceptance: str = option("mtp1", "--mtp1-acceptance",
                                  help="acceptance source the mtp1 baseline runs with: mtp1 = mtp1-v3 (0.87, "
                                       "DeepSeek-V3 report), mtp1-v4 (0.775, DeepSeek-V4 MTP position 1 "
                                       "0.76-0.79, the paper's production baseline) or any K=1 source "
                                       "[%(default)s]")
    confidence: str = option("sts", "--confidence", choices=("sts", "raw"), metavar="{sts,raw}",
                             help="confidences the policies see from a parametric acceptance source: sts = the "
                                  "raw head after the simulator's sequential temperature scaling, raw = "
                                  "uncalibrated (ECE ~5%%); acceptance itself is identical [%(default)s]")
    recalibrate: bool = option(False, "--recalibrate", switch=True, kinds=BOOL,
                               help="online recalibration: the confidence-reading policy sees confidences rescaled "
                                    "by per-position temperatures refitted from past verification outcomes "
                                    "(dsparksim/policies/recalibrate.py; lossless, `audit --recalibrate`) [off]")
    engine: EngineConfig = field(default_factory=EngineConfig)
    traffic: Any = None  # dsparksim.traffic.TrafficConfig (kept Any so this module stays import-light)
    # None = 10% of duration for duration-bound runs, 0 for count-bound runs
    warmup_s: float | None = option(None, "--warmup", parse=nonneg_float, kinds=NUM, group="traffic",
                                    help="seconds excluded from the metrics, below --duration [10%% of --duration; "
                                         "0 with --num-requests]")
    seed: int = option(0, "--seed", parse=nonneg_int, kinds=INT, group="", help="random seed [%(default)s]")

    def __post_init__(self) -> None:
        _check_parts(self)
        _check_types(self, (), ("recalibrate",))
        if isinstance(self.seed, numbers.Integral) and not isinstance(self.seed, (bool, int)):
            object.__setattr__(self, "seed", int(self.seed))   # a numpy integer, stored as int
        if self.confidence not in ("sts", "raw"):
            raise ConfigError("config", "confidence", f"expected 'sts' or 'raw', got {self.confidence!r}")
        if self.warmup_s is not None and not (math.isfinite(self.warmup_s) and self.warmup_s >= 0):
            raise ConfigError("config", "warmup_s", f"must be a finite number >= 0, got {self.warmup_s}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**63:
            # numpy's SeedSequence takes non-negative integers only
            raise ConfigError("config", "seed", f"must be an integer in [0, 2^63), got {self.seed!r}")
        t = self.traffic
        dur = t.duration_s if t is not None and t.num_requests is None else None
        if self.warmup_s is not None and t is not None and t.num_warmup_prompts:
            raise ConfigError("config", "warmup_s", f"conflicts with num_warmup_prompts ({t.num_warmup_prompts}): "
                              "the benchmark starts when the warm-up prompts have finished; give one")
        if self.warmup_s is not None and dur is not None and self.warmup_s >= dur:
            raise ConfigError("config", "warmup_s", f"must be below duration_s ({dur:g}) so some time is measured, "
                              f"got {self.warmup_s:g}")

    @classmethod
    def from_options(cls, options: Mapping[str, Any], source: str = "options", *, flags: bool = False,
                     default_concurrency: int = DEFAULT_CONCURRENCY) -> "RunConfig":
        """A RunConfig (with its EngineConfig and TrafficConfig) from flat option values keyed as
        :func:`run_options` (sweep keys, parsed command-line values); an option not given takes its default.

        The load picks the traffic mode: ``trace`` or ``time_scale`` -> trace replay (time scale 1 by default),
        ``rate`` -> open loop (``arrival``, else gamma when ``burstiness`` != 1, else Poisson), otherwise closed
        loop with ``concurrency`` (``default_concurrency`` users when not given). Without ``num_requests`` the run
        lasts ``duration_s`` (60 s by default). Errors are ConfigErrors naming ``source`` and the option (its
        command-line flag when ``flags``); the config dataclasses check every value again.
        """
        from dsparksim.traffic.config import OPEN_SYNTHETIC, TrafficConfig  # lazy: keeps this module import-light (numpy)

        specs = run_options()

        def bad(key: str, message: str) -> ConfigError:
            return ConfigError(source, specs[key].option.flags[0] if flags and specs[key].option.flags else key,
                               message)

        for k in options:
            if k not in specs:
                raise ConfigError(source, k, f"unknown option; known options: {', '.join(specs)}")
        v = {k: options.get(k, s.default) for k, s in specs.items()}
        sect: dict[str, dict[str, Any]] = {"run": {}, "engine": {}, "traffic": {}}
        for k, s in specs.items():
            sect[s.section][s.field] = v[k]
        t = sect["traffic"]
        if v["num_requests"] is not None and v["duration_s"] is not None:
            # one stop rule: a run that names both would silently ignore one of them
            raise bad("duration_s", f"conflicts with num_requests ({v['num_requests']!r}): a run stops after "
                      "num_requests requests or after duration_s seconds; set one")
        if v["num_requests"] is None and v["duration_s"] is None:
            t["duration_s"] = DEFAULT_DURATION_S
        cap, n_req = v["max_concurrency"], v["num_requests"]
        if cap is not None and v["concurrency"] is not None:
            raise bad("max_concurrency", f"conflicts with concurrency ({v['concurrency']!r}): --concurrency N is a "
                      "closed loop of N users, --max-concurrency N caps --num-prompts requests; give one")
        rate_inf = v["rate"] is not None and math.isinf(v["rate"])
        if rate_inf and n_req is None:
            raise bad("rate", "inf sends every prompt at once: set num_requests (--num-prompts)")
        if (v["dataset_name"] is None and v["lengths"] is None
                and any(v[k] is not None for k in ("random_input_len", "random_output_len", "random_range_ratio"))):
            t["dataset_name"] = "random"   # a --random-* length names the random dataset (vLLM's default one)
        if v["trace"] is not None or v["time_scale"] is not None:
            mode = "trace"
            t["time_scale"] = 1.0 if v["time_scale"] is None else v["time_scale"]
        elif v["rate"] is not None and not rate_inf:
            mode = v["arrival"] or ("gamma" if v["burstiness"] != 1.0 else "poisson")
        else:
            # closed loop; the benchmark client at request rate inf over num_requests prompts with a cap of N is
            # a closed loop of N users (the cap; all of them when uncapped), which the cluster serves identically
            mode = "closed"
            t["rate"] = None
            t["max_concurrency"] = None
            if rate_inf or (cap is not None and n_req is not None):
                t["concurrency"] = cap if cap is not None else n_req
            elif cap is not None:
                t["concurrency"] = cap    # without --num-prompts: --max-concurrency N is --concurrency N
            else:
                t["concurrency"] = default_concurrency if v["concurrency"] is None else v["concurrency"]
        if v["arrival"] is not None and mode not in OPEN_SYNTHETIC:
            raise bad("arrival", f"applies to open-loop arrivals only (set a rate); got arrival {v['arrival']!r} "
                      f"with {'trace replay' if mode == 'trace' else 'closed loop'}")
        if mode != "gamma" and v["burstiness"] != 1.0:
            raise bad("burstiness", f"only applies to gamma arrivals (got {'--arrival ' if flags else 'mode '}"
                      f"{mode})")
        t["mode"] = mode
        if t["time_scale"] is None:
            t["time_scale"] = 1.0
        # Closed loop needs no pool: requests are generated lazily as users need them (traffic.base), so a cell
        # never depends on the other load levels of a frontier or sweep.
        try:
            return cls(traffic=TrafficConfig(**t), engine=EngineConfig(**sect["engine"]), **sect["run"])  # traffic checked first
        except ConfigError as e:
            # the dataclasses name their fields (block_size); a command line names its flag (--num-speculative-tokens)
            key = next((k for k, s in specs.items() if s.field == e.field
                        and s.section in _SECTIONS_OF_SOURCE.get(e.source, ())), None)
            if key is None:
                raise
            raise bad(key, e.message) from None

    def to_dict(self) -> dict[str, Any]:
        """The configuration as plain JSON values (config.json's ``config``), engine and traffic nested."""
        return jsonable(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = "config") -> "RunConfig":
        """The RunConfig :meth:`to_dict` wrote (a run's config.json ``config``, a frontier's ``base_config``), every
        part checked as when built; a key this version does not know is a ConfigError naming it and ``source``."""
        from dsparksim.traffic.config import TrafficConfig  # lazy: keeps this module import-light (numpy)

        def known(part: Any, kind: type, where: str) -> dict[str, Any]:
            if not isinstance(part, Mapping):
                raise ConfigError(source, where, f"expected an object, got {part!r}")
            names = {f.name for f in dataclasses.fields(kind)}
            extra = sorted(set(part) - names)
            if extra:
                raise ConfigError(source, where, f"unknown key(s) {extra} for {kind.__name__} (written by another "
                                  "dsparksim version?)")
            return dict(part)

        run = known(d, cls, "config")
        engine = EngineConfig(**known(run.pop("engine", {}), EngineConfig, "config.engine"))
        traffic = run.pop("traffic", None)
        if traffic is not None:
            t = known(traffic, TrafficConfig, "config.traffic")
            # JSON wrote the tuple fields as lists
            if t.get("user_steps") is not None:
                t["user_steps"] = tuple(tuple(step) for step in t["user_steps"])
            if t.get("domain_drift") is not None:
                t["domain_drift"] = tuple(t["domain_drift"])
            traffic = TrafficConfig(**t)
        return cls(engine=engine, traffic=traffic, **run)

    def replace(self, **kw: Any) -> "RunConfig":
        """A copy with the given fields replaced (checked again); the config itself is frozen."""
        return dataclasses.replace(self, **kw)


def _check_parts(cfg: "RunConfig") -> None:
    """ConfigError unless ``engine`` is an EngineConfig and ``traffic`` a TrafficConfig (or None: not set yet; a
    run needs one) -- from Python a dict or None would otherwise fail deep inside the simulation."""
    from dsparksim.traffic.config import TrafficConfig  # lazy: keeps this module import-light (numpy)

    if not isinstance(cfg.engine, EngineConfig):
        raise ConfigError("config", "engine", f"expected an EngineConfig, got {cfg.engine!r}")
    if cfg.traffic is not None and not isinstance(cfg.traffic, TrafficConfig):
        raise ConfigError("config", "traffic", f"expected a TrafficConfig (dsparksim.traffic.config), got "
                          f"{cfg.traffic!r}")


def jsonable(x: Any) -> Any:
    """``x`` as plain JSON values: dict keys as strings, tuples as lists, numpy scalars as Python numbers, any
    other object as its ``str``."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if hasattr(x, "item") and callable(x.item):  # numpy scalars
        return x.item()
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return str(x)
