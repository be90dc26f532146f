"""A real run of one configuration: the same RunConfig, workload, policy and acceptance (keyed per-request draws)
as ``simulate``, served by the simulator's Simulation with the real executor on the measured clock
(:class:`~.engine.MeasuredClock`; one engine on one device: replicas and DP ranks are refused); returns the simulator's :class:`RunOutput`, so ``write_run``, the frontier table and the plots work
unchanged."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from dsparksim.config import RunConfig
from dsparksim.errors import ConfigError, InputError
from dsparksim.sim.inputs import load_run_profile, resolve_inputs
from dsparksim.policies import make_policy
from dsparksim.sim.cluster import Simulation
from dsparksim.sim.simulate import RunOutput, run_streams, run_summary
from dsparksim.traffic import build_workload
from dsparksim.runner.engine import MeasuredClock, real_result
from dsparksim.runner.executor import Executor, ExecutorConfig, build_models, torch_dtype
from dsparksim.runner.live import LiveAcceptance, LiveExecutor, PromptSource
from dsparksim.runner.models import device_key, kv_capacity_tokens, load_target, model_key
from dsparksim.backend.checkpoint import load_drafter


@dataclass(frozen=True)
class RunnerConfig:
    """The real side of a run: which target (see :func:`~dsparksim.runner.models.parse_model`) on which device.

    mode: "replay" (acceptance replayed from the run's acceptance source, any target shape) or "live" (the trained
    pair in ``models`` drafts and verifies for real; the target is ``models/target.pt`` and ``model`` is ignored).
    live_drafter: the drafter of the K-token policies in live mode (mtp1 policies always use ``mtp1``).
    """

    model: str = "tiny"
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)
    check_profile: bool = True   # the profile must have been measured for this model on this device
    mode: str = "replay"
    models: str = "models"
    live_drafter: str = "dspark"
    prompts_dir: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("replay", "live"):
            raise ConfigError("runner", "mode", f"expected replay or live, got {self.mode!r}")


def _check_profile(profile, mkey: str, dkey: str) -> None:
    meta = profile.metadata
    for k, want in (("runner_model", mkey), ("runner_device", dkey)):
        got = meta.get(k)
        if got is None:
            raise ConfigError(f"profile '{profile.name}' ({profile.source})", f"metadata.{k}",
                              "the profile has no runner metadata: it was not measured by `dsparksim measure` on the "
                              "real engine (a simulator-only profile describes another engine); measure one for "
                              f"this model/device ({want!r}) or pass --no-profile-check")
        if got != want:
            raise ConfigError(f"profile '{profile.name}' ({profile.source})", f"metadata.{k}",
                              f"the profile was measured for {got!r} but this run is {want!r}; measure a profile "
                              f"for this model/device (`dsparksim measure`) or pass --no-profile-check")


def simulator_only_refused(cfg: RunConfig) -> RunConfig:
    """Options that exist only in the simulator refused before any model is loaded; the config a real run saves
    (its KV reserved at admission: one fixed slot per request, no pages to preempt)."""
    for k in ("replicas", "dp_ranks"):    # before any model is loaded
        if getattr(cfg.engine, k) != 1:
            raise ConfigError("config", k, f"the real runner serves one engine on one device, got {k}="
                              f"{getattr(cfg.engine, k)}; replicas and DP ranks exist only in the simulator")
    if cfg.engine.disaggregated:
        raise ConfigError("config", "disaggregated", "the real runner serves one engine that prefills its own "
                          "requests; --disaggregated exists only in the simulator")
    for k, flag in (("pad_verify", "--pad-verify"), ("draft_exit", "--draft-exit")):
        if getattr(cfg.engine, k) not in (None, False):
            raise ConfigError("config", k, f"{flag} is priced by the simulator only (the real runner's executors "
                              "neither pad verification nor stop drafting early); drop it for a real run")
    t = cfg.traffic
    for name, flag in (("max_concurrency", "--max-concurrency"), ("num_warmup_prompts", "--num-warmup-prompts")):
        if getattr(t, name):   # the benchmark client's cap and warm-up are simulated only (run)
            raise ConfigError("cli", flag, f"is not supported by the real runner ({getattr(t, name)!r}); use "
                              "`dsparksim run`, or --concurrency / no warm-up here")
    if cfg.engine.kv_policy != "reserve":
        # The real runner's KV is one fixed slot per request (no pages to preempt): it always reserves at
        # admission. The saved config says so (kv_policy "reserve"), whatever the run default is.
        cfg = cfg.replace(engine=replace(cfg.engine, kv_policy="reserve"))
    return cfg


def add_real_records(summary: dict[str, Any], inputs: dict[str, Any], res: Any, mkey: str, dkey: str, T: int,
                     live: bool, profile: Any) -> None:
    """What a real run adds to summary.json and config.json's inputs: the measured vs modelled step time split,
    the model and device keys, the KV slot size and how acceptance was decided."""
    summary["engine"] = "real"
    st = res.steps
    summary["step_time_model_vs_real"] = {
        "sum_dt_s": float(np.sum(st["dt"])), "sum_dt_model_s": float(np.sum(st["dt_model"])),
        "sum_t_target_s": float(np.sum(st["t_target"])), "sum_t_draft_s": float(np.sum(st["t_draft"])),
        "sum_t_host_s": float(np.sum(st["t_host"]))}
    inputs["engine"] = {"kind": "real", "model": mkey, "device": dkey, **inputs["engine"], "kv_slot_tokens": T,
                        "acceptance_mode": (
                            "live: trained drafter + exact rejection sampling of the first L drafts; drafting "
                            f"priced from the profile ({profile.metadata.get('drafting', 'proxy')})" if live else
                            "trace-replay: a = min(L, A) with A from the acceptance source")}


def kv_slots(cfg: RunConfig, workload: Any, K: int, kv_cap: int, mcfg: Any, ex: ExecutorConfig) -> tuple[int, int]:
    """(tokens per KV slot, slots): one fixed slot per request of the longest request plus a block, refused when
    the KV asked for or the slots exceed what the device holds for this model."""
    bits = torch_dtype(ex.dtype).itemsize * 8
    dev_cap = kv_capacity_tokens(mcfg, ex.device, bits)
    if kv_cap > dev_cap:
        raise ConfigError("config", "kv_capacity_tokens", f"{kv_cap} KV tokens requested but {ex.device} can hold "
                          f"about {dev_cap} for this model ({bits}-bit KV); lower --kv-capacity")
    T = workload.max_request_tokens() + K + 2
    conc = workload.concurrency or cfg.engine.max_num_seqs
    slots = min(cfg.engine.max_num_seqs, conc)
    if slots * T > dev_cap:
        raise ConfigError("config", "max_num_seqs", f"{slots} KV slots of {T} tokens exceed the device's "
                          f"{dev_cap}-token KV capacity")
    return T, slots


def real_run(cfg: RunConfig, rcfg: RunnerConfig = RunnerConfig(), *, target=None, proxy=None,
             progress: Callable[[float], None] | None = None, record_outputs: bool = False,
             prompt_source=None, checkpoint: Callable[[int], None] | None = None,
             checkpoint_every_s: float = 0.5, after_step=None) -> RunOutput:
    """Serve ``cfg`` for real (``rcfg.mode``: trace replay or live drafters). ``target``/``proxy`` reuse already
    built models; ``record_outputs`` keeps each request's prompt and generated tokens (live mode) on the result;
    ``prompt_source`` overrides the live prompts (the audit gives every request the same prompt); ``checkpoint``
    (next step index) is called between steps every ``checkpoint_every_s`` of measured time (drift windows,
    :class:`~.drift.RunWindows`); ``after_step(step index, plan)`` after every step, off the measured clock too
    (paired reference cells, :class:`~.paired.RunPairs`)."""
    cfg = simulator_only_refused(cfg)
    ex = rcfg.executor
    rngs = run_streams(cfg.seed)
    profile = load_run_profile(cfg)
    live = rcfg.mode == "live"
    if live:
        rcfg = replace(rcfg, model=f"ckpt:{Path(rcfg.models) / 'target.pt'}")
    mcfg, tmodel, ck = load_target(rcfg.model, ex.device, ex.dtype)
    mkey = model_key(mcfg, ck, ex.drafter_layers, ex.dtype, live=live)
    dkey = device_key(ex.device, ex.threads, ex.clock_name())
    if rcfg.check_profile:
        _check_profile(profile, mkey, dkey)
        if live and not str(profile.metadata.get("drafting", "")).startswith("live:"):
            raise ConfigError(f"profile '{profile.name}' ({profile.source})", "metadata.drafting",
                              "live mode needs drafting costs measured on the trained drafters, but this profile's "
                              f"come from {profile.metadata.get('drafting', 'the drafter proxy')!r}; measure with "
                              "`dsparksim measure --live --models MODELS` or pass --no-profile-check")
    probe = make_policy(cfg.policy)
    _check_real_policy(probe, rcfg, live)
    kind = "mtp1" if probe.drafter == "mtp1" else rcfg.live_drafter
    live_parts = None

    def live_acceptance(policy, K):  # live mode: the trained drafter of this policy replaces the spec string
        nonlocal live_parts
        acc, live_parts = _live_parts(rcfg, kind, K, ex)
        return acc

    # profile, policy, K, acceptance, drafter and engine limits, resolved as the simulator does (dsparksim.sim.inputs)
    ri = resolve_inputs(cfg, profile=profile, acceptance=live_acceptance if live else None)
    policy, K, acceptance, drafter = ri.policy, ri.K, ri.acceptance, ri.drafter
    kv_cap, max_tok = ri.kv_cap, ri.max_tokens
    spec = f"live:{kind}" if live else ri.acceptance_spec
    tK = acceptance.describe().get("trace_K")
    if tK is not None and tK != K:
        raise ConfigError(spec, "K", f"K mismatch: the run uses K={K} but the acceptance trace was recorded with "
                          f"K={tK}; a validation must replay blocks of the same size (record a K={K} trace)")
    policy.reset(K, rngs["policy"])
    workload = build_workload(cfg.traffic, rngs["workload"])
    T, slots = kv_slots(cfg, workload, K, kv_cap, mcfg, ex)
    if live:
        tgt = target if target is not None else build_models(mcfg, ex, tmodel)[0]
        drafter_m, temps, prompts = live_parts
        prompts = prompt_source or prompts
        executor = LiveExecutor(tgt, drafter_m.to(device=tgt.embed.weight.device, dtype=torch_dtype(ex.dtype)),
                                acceptance.drafter, temps, prompts, ex, T=T, slots=slots,
                                record_outputs=record_outputs)
        describe = (f"real (torch), live drafter '{executor.kind}' (acceptance by rejection sampling); "
                    f"step time = measured {ex.clock_name()} clock")
    else:
        if target is None or proxy is None:
            target, proxy = build_models(mcfg, ex, tmodel)
        executor = Executor(target, proxy, ex, T=T, slots=slots)
        describe = f"real (torch), trace-replay acceptance; step time = measured {ex.clock_name()} clock"
    duration = cfg.traffic.duration_s if cfg.traffic.num_requests is None else None
    clock = MeasuredClock(executor, live=live, checkpoint=checkpoint, every_s=checkpoint_every_s,
                          after_step=after_step)
    sim = Simulation(cfg.engine, ri, workload, rngs["acceptance"], executor=executor, clock=clock,
                     duration_s=duration, num_requests=cfg.traffic.num_requests, progress=progress)
    res = real_result(sim.run(), describe)
    summary, inputs = run_summary(cfg, res, profile, acceptance, policy, workload, K, drafter, kv_cap, max_tok,
                                  duration)
    add_real_records(summary, inputs, res, mkey, dkey, T, live, profile)
    out = RunOutput(config=cfg, summary=summary, result=res, inputs=inputs)
    if record_outputs:
        out.outputs = executor.outputs            # row -> generated token ids (live mode; tests)
        out.prompts = executor.prompt_log
    return out


def _check_real_policy(probe, rcfg: RunnerConfig, live: bool) -> None:
    """Policies the real engine cannot serve, refused before any drafter is loaded."""
    if probe.needs_oracle:
        raise ConfigError("config", "policy", f"{probe.spec} reads the true accepted length: it exists only in the "
                          "simulator")
    if live and not probe.drafts:   # LiveExecutor drafts with a trained drafter; `none` loads none (a traceback)
        raise ConfigError("config", "policy", f"{probe.spec} drafts nothing, and --live serves the trained drafters; "
                          f"plain decoding of the trained target is --model ckpt:{Path(rcfg.models) / 'target.pt'} "
                          "without --live")


def _live_parts(rcfg: RunnerConfig, kind: str, K: int, ex: ExecutorConfig):
    """(LiveAcceptance, (drafter module, STS temperatures, PromptSource)) from a models directory, all checked."""
    from dsparksim.backend.collect import load_models  # lazy: pulls in pandas, pyarrow

    models = Path(rcfg.models)
    _, _, target, tmeta, cal = load_models(models)
    path = models / f"{kind}.pt"
    drafter, ck = load_drafter(path, kind, target, tmeta["sha256"])
    dK = int(ck["config"]["K"])
    if dK != K:
        raise ConfigError(path, "K", f"the drafter was trained for K={dK} but the run uses K={K}")
    if kind not in cal:
        raise InputError(models / "calibration.json", kind, "no STS temperatures for this drafter")
    temps = np.asarray(cal[kind]["temperatures"], float)
    if temps.size != K:
        raise InputError(models / "calibration.json", kind, f"{temps.size} temperatures for block size {K}")
    for p in drafter.parameters():
        p.requires_grad_(False)
    prompts = PromptSource.from_models(models, rcfg.prompts_dir)
    meta = {"source": f"live: {path} + {models / 'calibration.json'} (STS), prompts: held-out eval split",
            "drafter": kind, "K": K, "sts_temperatures": temps.tolist(), "target_sha256": tmeta["sha256"]}
    return LiveAcceptance(kind, K, meta), (drafter, temps, prompts)
