"""The serving benchmark client (``vllm bench serve``, SGLang's ``bench_serving``), simulated as it runs.

:func:`run_client` serves a :class:`ClientWorkload` (the client's flags, vLLM's names) on a cost profile with the
server settings of :class:`ServerSettings`, and computes the metrics as the clients do:

* **Random dataset**: each request's input and output lengths are drawn independently and uniformly from the
  integers ``[max(1, int(R·L)), L]`` (SGLang ``bench_serving.sample_random_requests`` and vLLM's
  ``benchmark_serving.py`` up to v0.10 draw ``np.random.randint(int(L * R), L + 1)``; newer vLLM ``RandomDataset``
  draws ``[L·(1−R), L·(1+R)]`` instead -- see docs/benchmarks.md). ``ignore_eos``: every request emits exactly its length.
* **Load**: requests arrive at ``request_rate`` (inf: all at t = 0; else Poisson, or gamma with ``burstiness``,
  the first at t = 0) and a semaphore of ``max_concurrency`` caps those in flight; a request's clock starts when it
  is sent. The run ends when the prompts run out (:class:`dsparksim.sim.cluster.Simulation` ``client_cap``).
* **Warm-up**: ``num_warmup_prompts`` requests (same length distribution, own draws) run first, under the same
  cap; the benchmark's clock starts when the last of them finished, and none of them is measured.
* **Metrics** (:func:`client_metrics`): TTFT = first token − sent; E2E = finish − sent (both plus the profile's
  ``request_latency_s``, the stack's latency outside the engine's step loop, 0 when absent); TPOT of a request =
  (E2E − TTFT) / (output tokens − 1) over requests with more than one output token; mean / median / p99
  (``np.percentile``, linear) over requests; duration = the last measured request's finish − the benchmark's
  start; throughput = output tokens / duration; per GPU = / ``server.gpus``. ``failed`` = requests the server
  refused (longer than ``max_model_len`` or the KV capacity), never those still running (a client run always
  finishes its prompts).
"""
from __future__ import annotations

from dataclasses import replace
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from dsparksim.errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["ClientWorkload", "ServerSettings", "ClientRun", "run_client", "client_metrics", "random_lengths",
           "client_arrivals", "server_kv_capacity"]

from dsparksim.cost.memory import kv_capacity_at_fraction as server_kv_capacity  # noqa: E402
from dsparksim.config import RunConfig
from dsparksim.cost.profile import load_profile
from dsparksim.traffic.arrivals import interarrivals

_SRC = "client"
STATS = ("mean", "median", "p99")


def _int(name: str, v: Any, lo: int, src: str = _SRC) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
        raise ConfigError(src, name, f"expected an integer >= {lo}, got {v!r}")


def _num(name: str, v: Any, lo: float, hi: float = math.inf, src: str = _SRC, lo_open: bool = False) -> None:
    ok = not isinstance(v, bool) and isinstance(v, (int, float, np.floating)) and not math.isnan(v)
    if not ok or v < lo or (lo_open and v == lo) or v > hi:
        rng = f"({lo:g}, {hi:g}]" if lo_open else f"[{lo:g}, {hi:g}]"
        raise ConfigError(src, name, f"expected a number in {rng}, got {v!r}")


@dataclass(frozen=True)
class ClientWorkload:
    """What the benchmark client sends (``vllm bench serve`` flag names; see the module doc)."""

    random_input_len: int
    random_output_len: int
    random_range_ratio: float = 0.0       # lengths ~ U{[max(1, int(R*L)), L]} integers
    num_prompts: int = 1000
    max_concurrency: int | None = None    # None = no cap
    request_rate: float = math.inf        # req/s; inf = all at once
    burstiness: float = 1.0               # gamma shape (1 = Poisson), with a finite rate only
    num_warmup_prompts: int = 0
    ignore_eos: bool = True
    dataset_name: str = "random"

    def __post_init__(self) -> None:
        if self.dataset_name != "random":
            raise ConfigError(_SRC, "dataset_name", f"only 'random' is simulated, got {self.dataset_name!r}")
        _int("random_input_len", self.random_input_len, 1)
        _int("random_output_len", self.random_output_len, 1)
        _num("random_range_ratio", self.random_range_ratio, 0.0, 1.0)
        _int("num_prompts", self.num_prompts, 1)
        if self.max_concurrency is not None:
            _int("max_concurrency", self.max_concurrency, 1)
        _num("request_rate", self.request_rate, 0.0, math.inf, lo_open=True)
        _num("burstiness", self.burstiness, 1e-3, 1e3)
        if self.burstiness != 1.0 and math.isinf(self.request_rate):
            raise ConfigError(_SRC, "burstiness", f"shapes the gaps of a finite request rate; with request_rate inf "
                              f"every request arrives at once (got {self.burstiness!r})")
        _int("num_warmup_prompts", self.num_warmup_prompts, 0)
        if self.ignore_eos is not True:
            raise ConfigError(_SRC, "ignore_eos", "only ignore_eos=True is simulated (every request emits exactly "
                              "its drawn output length); the simulator has no model of when a model stops")


@dataclass(frozen=True)
class ServerSettings:
    """The server flags that shape the cost (None = the profile's / EngineConfig's default).

    chunked_prefill_size: prefill tokens per step (SGLang --chunked-prefill-size, vLLM --max-num-batched-tokens
                          with chunked prefill) -> the engine's prefill chunk.
    max_running_requests: SGLang --max-running-requests, vLLM --max-num-seqs -> max_num_seqs.
    cuda_graph_max_bs:    SGLang --cuda-graph-max-bs: recorded; no profile prices eager-mode steps, so it is not
                          priced (ClientRun.notes says so).
    mem_fraction_static:  SGLang --mem-fraction-static -> the KV capacity, derived from the profile's
                          metadata.build.memory (weights per GPU) and GPU memory; refused if the profile lacks them.
    gpus:                 GPUs of the deployment (throughput per GPU).
    dp_ranks:             attention data-parallel ranks of the engine (SGLang --enable-dp-attention, TensorRT-LLM
                          enable_attention_dp) -> the engine's dp_ranks: R ranks stepped in lockstep, each batching
                          its own requests on the profile (which must price one of R ranks); 1 = one TP engine.
    router:               how the engine spreads requests over its DP ranks (a router name: round-robin,
                          least-outstanding, ...) -> the engine's router; None = the simulator's default. Read only
                          with dp_ranks > 1.
    mixed_chunk:          prefill chunks share a step with decode (vLLM, TensorRT-LLM; SGLang --enable-mixed-chunk);
                          False = a step with a prefill chunk carries no decode (SGLang's default) -> the engine's
                          mixed_prefill.
    attention_dp_timeout_iters, attention_dp_batching_wait_iters: TensorRT-LLM's attention_dp_config
                          (enable_balance true, timeout_iters, batching_wait_iters) -> the engine's DP balance
                          (sim/dp_balance.py); None = no balance (TensorRT-LLM's default). Read only with dp_ranks > 1.
    batch_wait_timeout_iters, batch_wait_max_tokens_ratio: TensorRT-LLM's batch waiting, both or neither -> the
                          engine's (sim/batch_wait.py); None = off (TensorRT-LLM's default). Refused with dp_ranks > 1
                          (TensorRT-LLM skips it under attention DP).
    """

    chunked_prefill_size: int | None = None
    max_running_requests: int | None = None
    cuda_graph_max_bs: int | None = None
    mem_fraction_static: float | None = None
    gpus: int = 1
    mixed_chunk: bool = True
    dp_ranks: int = 1
    router: str | None = None
    attention_dp_timeout_iters: int | None = None
    attention_dp_batching_wait_iters: int = 0
    batch_wait_timeout_iters: int | None = None
    batch_wait_max_tokens_ratio: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.mixed_chunk, bool):
            raise ConfigError("server", "mixed_chunk", f"expected true or false, got {self.mixed_chunk!r}")
        for name in ("chunked_prefill_size", "max_running_requests", "cuda_graph_max_bs"):
            if getattr(self, name) is not None:
                _int(name, getattr(self, name), 1, "server")
        if self.mem_fraction_static is not None:
            _num("mem_fraction_static", self.mem_fraction_static, 0.0, 1.0, "server", lo_open=True)
        _int("gpus", self.gpus, 1, "server")
        _int("dp_ranks", self.dp_ranks, 1, "server")
        if self.attention_dp_timeout_iters is not None:
            _int("attention_dp_timeout_iters", self.attention_dp_timeout_iters, 0, "server")
        _int("attention_dp_batching_wait_iters", self.attention_dp_batching_wait_iters, 0, "server")
        if self.attention_dp_batching_wait_iters and self.attention_dp_timeout_iters is None:
            raise ConfigError("server", "attention_dp_batching_wait_iters", f"{self.attention_dp_batching_wait_iters}"
                              ": the batching wait is part of the attention-DP balance; set "
                              "attention_dp_timeout_iters (--attention-dp-timeout-iters) too, or drop it")
        if self.batch_wait_timeout_iters is not None:
            _int("batch_wait_timeout_iters", self.batch_wait_timeout_iters, 1, "server")
        if self.batch_wait_max_tokens_ratio is not None:
            _num("batch_wait_max_tokens_ratio", self.batch_wait_max_tokens_ratio, 0.0, 1.0, "server", lo_open=True)
        if (self.batch_wait_timeout_iters is None) != (self.batch_wait_max_tokens_ratio is None):
            raise ConfigError("server", "batch_wait_timeout_iters" if self.batch_wait_max_tokens_ratio is None
                              else "batch_wait_max_tokens_ratio", "TensorRT-LLM's batch waiting holds prefills only "
                              "with both batch_wait_timeout_iters (--batch-wait-timeout-iters) and "
                              "batch_wait_max_tokens_ratio (--batch-wait-max-tokens-ratio) set: give both, or neither")
        if self.router is not None and self.dp_ranks == 1:
            raise ConfigError("server", "router", f"{self.router!r} given for one engine rank (dp_ranks 1): a "
                              "router spreads requests over DP ranks only; drop it or set dp_ranks above 1")


def engine_mixes_prefill(engine: Any) -> bool:
    """Whether an engine's default scheduler mixes prefill chunks with decode in one step: False for SGLang
    (``--enable-mixed-chunk`` off by default: sgl-project/sglang python/sglang/srt/server_args.py
    ``enable_mixed_chunk: bool = False``; python/sglang/srt/managers/scheduler.py, commit
    d51c1c21d1ac07cd5d1de9ead6c99087d8428e79, mixes the running batch into a prefill batch only
    ``if self.is_mixed_chunk``, and a new prefill batch runs before the decode batch), True otherwise (vLLM V1's
    chunked prefill, TensorRT-LLM's in-flight batching)."""
    return str(engine or "").strip().lower() != "sglang"


def is_trtllm(engine: Any) -> bool:
    """Whether a runs-table ``engine`` value names TensorRT-LLM (whose server settings the DP balance and batch
    waiting are)."""
    return str(engine or "").strip().lower() == "trtllm"


@dataclass
class ClientRun:
    """One simulated benchmark run.

    metrics:  the client's summary (see :func:`client_metrics`; keys as ``vllm bench serve``'s result JSON where
              it has one: completed, failed, duration_s, total_input_tokens, total_output_tokens,
              request_throughput, output_throughput, output_throughput_per_gpu, total_token_throughput,
              {mean,median,p99}_{ttft,tpot,e2el}_ms).
    requests: the measured requests, in send order: prompt_len, output_len, arrival_s (sent), first_token_s,
              finish_s (seconds from the benchmark's start; NaN = refused), arrival_step (last step that started
              before the request was sent; -1 = none), first_token_step, finish_step (the step whose end emitted
              the first / last token; -1 = refused), tpot_ms, ttft_ms, e2el_ms, failed.
    steps:    the engine's step log over the whole run (warm-up included, ``warmup`` column), one row per step
              with its full priced shape (dsparksim.sim.scheduler.PRICE_KEYS; reprice_steps recomputes dt),
              t_start / t_end in seconds from the benchmark's start (negative: warm-up).
    notes:    the resolved server settings and what was not priced.
    """

    metrics: dict[str, Any]
    requests: "pd.DataFrame"
    steps: "pd.DataFrame"
    notes: dict[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------------------------------- the workload
def random_lengths(L: int, R: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` lengths uniform over the integers [max(1, int(R*L)), L] (SGLang / vLLM <= 0.10 random dataset)."""
    lo = max(1, int(L * R))
    return rng.integers(lo, L + 1, size=n).astype(np.int64)


def client_arrivals(w: ClientWorkload, n: int, rng: np.random.Generator) -> np.ndarray:
    """Arrival times of ``n`` requests from the benchmark's start: all 0 at rate inf, else the first at 0 and
    exponential (burstiness 1) or gamma(shape=burstiness, scale=1/(rate*burstiness)) gaps, as vLLM's get_request."""
    if math.isinf(w.request_rate):
        return np.zeros(n)
    process = "poisson" if w.burstiness == 1.0 else "gamma"
    gaps = interarrivals(process, float(w.request_rate), max(n - 1, 0), rng, float(w.burstiness))
    return np.concatenate(([0.0], np.cumsum(gaps)))[:n]


# ------------------------------------------------------------------------------------------------ the server
# ---------------------------------------------------------------------------------------------------- metrics
def client_metrics(requests: "pd.DataFrame", duration_s: float, gpus: int = 1) -> dict[str, Any]:
    """The client's summary of its measured requests (columns of :class:`ClientRun` ``requests``)."""
    ok = ~requests["failed"].to_numpy(bool)
    out_tok = requests["output_len"].to_numpy(np.int64)[ok]
    in_tok = requests["prompt_len"].to_numpy(np.int64)[ok]
    m: dict[str, Any] = {"completed": int(ok.sum()), "failed": int((~ok).sum()), "duration_s": float(duration_s),
                         "total_input_tokens": int(in_tok.sum()), "total_output_tokens": int(out_tok.sum())}
    d = duration_s if duration_s > 0 else math.nan
    m["request_throughput"] = m["completed"] / d
    m["output_throughput"] = m["total_output_tokens"] / d
    m["output_throughput_per_gpu"] = m["output_throughput"] / gpus
    m["total_token_throughput"] = (m["total_input_tokens"] + m["total_output_tokens"]) / d
    for name in ("ttft", "tpot", "e2el"):
        x = requests[f"{name}_ms"].to_numpy(float)[ok]
        x = x[np.isfinite(x)]    # tpot: requests with one output token have none
        m[f"mean_{name}_ms"] = float(x.mean()) if x.size else math.nan
        m[f"median_{name}_ms"] = float(np.median(x)) if x.size else math.nan
        m[f"p99_{name}_ms"] = float(np.percentile(x, 99)) if x.size else math.nan
    return m


# ------------------------------------------------------------------------------------------------------ run
_CACHE: dict = {}   # acceptance sources by (spec, K, confidence): profile fits call run_client many times


def client_config(profile_name: str, workload: ClientWorkload, server: ServerSettings = ServerSettings(),
                  policy: str = "none", block_size: int | None = None, acceptance: str | None = None,
                  drafter: str | None = None, seed: int = 0):
    """The RunConfig of one benchmark run: the very configuration ``dsparksim run`` builds from the client's flags
    (RunConfig.from_options), so the CLI and :func:`run_client` simulate the same thing."""

    opts: dict[str, Any] = {"profile": profile_name, "policy": policy, "seed": int(seed),
                            "dataset_name": "random", "random_input_len": workload.random_input_len,
                            "random_output_len": workload.random_output_len,
                            "random_range_ratio": float(workload.random_range_ratio),
                            "num_requests": workload.num_prompts, "max_concurrency": workload.max_concurrency,
                            "rate": float(workload.request_rate), "num_warmup_prompts": workload.num_warmup_prompts,
                            "domain": "chat"}
    if workload.burstiness != 1.0:
        opts["burstiness"] = float(workload.burstiness)
    if not server.mixed_chunk:
        opts["mixed_prefill"] = False
    if server.dp_ranks > 1:
        opts["dp_ranks"] = int(server.dp_ranks)
        if server.router is not None:
            opts["router"] = server.router
        if server.attention_dp_timeout_iters is not None:
            opts["dp_balance_timeout_iters"] = int(server.attention_dp_timeout_iters)
            opts["dp_balance_wait_iters"] = int(server.attention_dp_batching_wait_iters)
    if server.batch_wait_timeout_iters is not None:
        opts["batch_wait_timeout_iters"] = int(server.batch_wait_timeout_iters)
        opts["batch_wait_max_tokens_ratio"] = float(server.batch_wait_max_tokens_ratio)
    for key, v in (("block_size", block_size), ("acceptance", acceptance),
                   ("prefill_chunk_tokens", server.chunked_prefill_size),
                   ("max_num_seqs", server.max_running_requests), ("cuda_graph_max_bs", server.cuda_graph_max_bs),
                   ("mem_fraction_static", server.mem_fraction_static)):
        if v is not None:
            opts[key] = v
    cfg = RunConfig.from_options(opts, _SRC)
    if drafter is not None:
        cfg = cfg.replace(engine=replace(cfg.engine, drafter=drafter))
    return cfg


def run_client(profile: Any, workload: ClientWorkload, server: ServerSettings = ServerSettings(),
               policy: str = "none", block_size: int | None = None, acceptance: str | None = None,
               drafter: str | None = None, seed: int = 0) -> ClientRun:
    """Simulate one benchmark run (see the module doc). ``profile``: a loaded CostProfile, a shipped name or a
    path. ``policy`` / ``block_size`` / ``acceptance`` / ``drafter``: as ``dsparksim run``'s --policy, -K,
    --acceptance (None = its default) and the profile's drafter entry. Deterministic in ``seed``; the same
    simulation as ``dsparksim run --dataset-name random ... --num-prompts ... --max-concurrency ...``."""
    from dsparksim.sim.simulate import simulate  # lazy: pulls in scipy

    if not isinstance(workload, ClientWorkload):
        raise ConfigError(_SRC, "workload", f"expected a ClientWorkload, got {type(workload).__name__}")
    if not isinstance(server, ServerSettings):
        raise ConfigError(_SRC, "server", f"expected ServerSettings, got {type(server).__name__}")
    prof = load_profile(profile) if isinstance(profile, (str, bytes)) or hasattr(profile, "__fspath__") else profile
    cfg = client_config(str(getattr(prof, "name", "profile")), workload, server, policy, block_size, acceptance,
                        drafter, seed)
    out = simulate(cfg, profile=prof, cache=_CACHE)
    return client_run(out, server.gpus, float(getattr(prof, "request_latency_s", 0.0) or 0.0))


def client_run(out: Any, gpus: int = 1, request_latency_s: float = 0.0) -> ClientRun:
    """The client's view of a finished count-bound run (a :class:`dsparksim.sim.simulate.RunOutput`).
    ``request_latency_s`` (the profile's): the stack's latency outside the engine's step loop, added to every
    request's TTFT and E2E and to the duration (the last response reaches the client that much later); the
    ``first_token_s`` / ``finish_s`` columns and the step indices stay the engine's."""
    import pandas as pd  # lazy: pandas

    res, cfg = out.result, out.config
    t = cfg.traffic
    if t.num_requests is None:
        raise ConfigError(_SRC, "num_requests", "the client's view needs a count-bound run (--num-prompts)")
    n_w, n = t.num_warmup_prompts, t.num_requests
    t0 = float(res.notes.get("benchmark_start_s", 0.0))
    steps = pd.DataFrame(res.steps)
    steps["t_end"] = steps["t_start"] + steps["dt"]
    steps["warmup"] = (steps["t_start"] < t0) if n_w else False
    steps["t_start"] -= t0
    steps["t_end"] -= t0
    t_start, t_end = steps["t_start"].to_numpy(), steps["t_end"].to_numpy()

    sl = slice(n_w, n_w + n)
    arr = res.arrival_s[sl] - t0
    ft = res.first_token_s[sl] - t0
    fin = res.finish_s[sl] - t0
    failed = np.asarray(res.rejected[sl], bool)
    outl = res.output_tokens[sl].astype(np.int64)

    def step_of_end(x: np.ndarray) -> np.ndarray:
        i = np.searchsorted(t_end, x, side="left")
        ok = np.isfinite(x) & (i < len(t_end))
        return np.where(ok, np.minimum(i, max(len(t_end) - 1, 0)), -1).astype(np.int64)

    lat = float(request_latency_s)
    if not math.isfinite(lat) or lat < 0:
        raise ConfigError(_SRC, "request_latency_s", f"expected a finite number >= 0, got {request_latency_s!r}")
    ttft = (ft - arr + lat) * 1e3
    e2el = (fin - arr + lat) * 1e3
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(outl > 1, (e2el - ttft) / (outl - 1), np.nan)
    reqs = pd.DataFrame({
        "prompt_len": res.prompt_tokens[sl].astype(np.int64), "output_len": outl, "arrival_s": arr,
        "first_token_s": ft, "finish_s": fin,
        "arrival_step": (np.searchsorted(t_start, arr, side="left") - 1).astype(np.int64),
        "first_token_step": step_of_end(ft), "finish_step": step_of_end(fin),
        "tpot_ms": tpot, "ttft_ms": ttft, "e2el_ms": e2el, "failed": failed})
    done = np.isfinite(fin)
    duration = float(fin[done].max()) + lat if done.any() else 0.0
    metrics = client_metrics(reqs, duration, gpus)
    eng = out.inputs["engine"]
    notes: dict[str, Any] = {
        "benchmark_start_s": t0, "kv_capacity_tokens": int(eng["kv_capacity_tokens"]),
        "max_num_seqs": int(cfg.engine.max_num_seqs), "prefill_chunk_tokens": int(cfg.engine.prefill_chunk_tokens),
        "max_batched_tokens": int(eng["max_batched_tokens"]), "block_size": int(res.block_size),
        "mixed_prefill": bool(cfg.engine.mixed_prefill),
        "drafter": res.drafter, "policy": cfg.policy, "acceptance": out.inputs["acceptance"],
        "ended_by": res.ended_by, "gpus": int(gpus), "request_latency_s": lat, "config": cfg,
        "dp_ranks": int(cfg.engine.dp_ranks), "router": cfg.engine.router if cfg.engine.dp_ranks > 1 else None}
    if cfg.engine.mem_fraction_static is not None:
        notes["kv_capacity"] = (f"mem_fraction_static {cfg.engine.mem_fraction_static}: (GPU memory x fraction - "
                                "weights per GPU) / KV bytes per token per GPU (dsparksim.cost.memory)")
    if cfg.engine.cuda_graph_max_bs is not None:
        notes["cuda_graph_max_bs"] = (f"{cfg.engine.cuda_graph_max_bs}: recorded, not priced (the profile prices "
                                      "every step as a captured graph; no eager-mode term)")
    return ClientRun(metrics=metrics, requests=reqs, steps=steps, notes=notes)
