"""Input resolution of one run, done once for the simulator, the CLI's preflight and the real runner.

``resolve_inputs(cfg)`` loads the cost profile (with extrapolation when the config allows it), builds the policy,
fixes the block size K, loads the acceptance source the policy runs with (mtp1 policies: ``cfg.mtp1_acceptance``;
a policy that drafts nothing, ``none``: K = 0, no drafter, the no-draft source), picks the drafter (it must have
a drafting cost in the profile) and the engine limits (KV capacity, token budget per step, ``max_model_len``).
Every bad input is a ConfigError/InputError naming it, before anything runs.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable

from dsparksim.config import RunConfig
from dsparksim.errors import ConfigError
from dsparksim.cost.memory import kv_capacity_at_fraction
from dsparksim.cost.profile import load_profile
from dsparksim.policies import make_policy, REGISTRY
from dsparksim.policies.recalibrate import Recalibrating
from dsparksim.sim.disagg import kv_transfer_terms

__all__ = ["ResolvedInputs", "acceptance_spec", "engine_limits", "load_run_profile", "max_model_len",
           "resolve_inputs"]


@dataclass(frozen=True)
class ResolvedInputs:
    """Everything a run reads besides its traffic and its engine options (``EngineConfig``), resolved: what a
    :class:`~dsparksim.sim.cluster.Simulation` is built from. ``policy`` is a fresh policy object (reset it with the
    run's random stream before use); ``acceptance_spec`` names the source ``acceptance`` was loaded from
    ("given": built by the caller)."""

    profile: Any
    policy: Any
    K: int
    acceptance: Any
    drafter: str | None     # None: the policy drafts nothing (``none``): no drafting cost
    kv_cap: int
    max_tokens: int
    max_model_len: int | None = None
    acceptance_spec: str = "given"


def load_run_profile(cfg: RunConfig, cache: dict | None = None):
    """The run's cost profile, allowing extrapolation when ``cfg.engine.extrapolate`` is set."""

    key = ("profile", cfg.profile, bool(cfg.engine.extrapolate))
    if cache is not None and key in cache:
        return cache[key]
    prof = load_profile(cfg.profile)
    if cfg.engine.extrapolate:
        prof = prof.with_extrapolation(True)
    if cache is not None:
        cache[key] = prof
    return prof


def acceptance_spec(cfg: RunConfig, policy) -> str:
    """The acceptance source a policy runs with: its own drafter's (mtp1: ``cfg.mtp1_acceptance``), else the
    run's block drafter ``cfg.acceptance``."""
    if policy.drafter is None:
        return cfg.acceptance
    return cfg.mtp1_acceptance if policy.drafter == "mtp1" else policy.drafter


BUILT_MAX_MODEL_LEN = "min(max_position_embeddings, kv_capacity_tokens)"   # profile build's rule (its metadata)


def max_model_len(profile, kv_cap: int | None = None) -> int | None:
    """The longest prompt + output the server accepts: the profile's ``metadata.max_model_len``, if it states one.
    A built (or fitted) profile derives it from its KV capacity (``metadata.build.memory.max_model_len``:
    min(max_position_embeddings, kv_capacity_tokens)); a run at another KV capacity ``kv_cap`` (--kv-capacity,
    --mem-fraction-static, a fitted server's memory fraction) gets it by the same rule at ``kv_cap``."""
    v = profile.metadata.get("max_model_len")
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ConfigError(profile.source, "metadata.max_model_len", f"expected an integer >= 1, got {v!r}")
    build = profile.metadata.get("build")
    if kv_cap is None or kv_cap == profile.metadata.get("kv_capacity_tokens") or not isinstance(build, dict):
        return v
    pos = (build.get("architecture") or {}).get("max_position")
    if (build.get("memory") or {}).get("max_model_len") != BUILT_MAX_MODEL_LEN or isinstance(pos, bool) \
            or not isinstance(pos, int) or pos < 1:
        return v
    return min(pos, int(kv_cap))


def engine_limits(cfg: RunConfig, profile) -> tuple[int, int]:
    """(KV capacity in tokens, token budget per step) of a run: the config's values, else the profile's."""
    kv_cap = cfg.engine.kv_capacity_tokens or profile.metadata.get("kv_capacity_tokens")
    if cfg.engine.mem_fraction_static is not None:
        kv_cap = kv_capacity_at_fraction(profile, cfg.engine.mem_fraction_static)[0]
    if not kv_cap:
        raise ConfigError(profile.source, "metadata.kv_capacity_tokens",
                          "profile states no KV capacity: pass --kv-capacity TOKENS")
    max_tok = cfg.engine.max_batched_tokens or profile.max_tokens
    if max_tok > profile.max_tokens and not cfg.engine.extrapolate:
        raise ConfigError("config", "max_batched_tokens",
                          f"{max_tok} exceeds the profile's largest breakpoint {profile.max_tokens}; "
                          f"lower it or allow extrapolation (--extrapolate)")
    return int(kv_cap), int(max_tok)


_DP_WARNED: set[tuple[str, int]] = set()


def check_deployment(cfg: RunConfig, prof: Any) -> None:
    """Checks of a run's deployment options against its profile, before anything runs: a disaggregated run needs
    its KV transfer terms (ConfigError otherwise); a profile that prices one of D > 1 data-parallel ranks
    (metadata.data_parallel, e.g. a built DP8+EP8 profile) run with another number of --dp-ranks is warned about
    (its EP all-to-all assumes D ranks)."""
    eng = cfg.engine
    tp = eng.tensor_parallel_size
    if tp is not None:
        have = prof.metadata.get("tensor_parallel") if isinstance(getattr(prof, "metadata", None), dict) else None
        if have is None:
            raise ConfigError(str(prof.source), "metadata.tensor_parallel", f"--tensor-parallel-size {tp}: profile "
                              f"'{prof.name}' does not state the TP it prices; drop the option or use a profile "
                              "that states it (profile build --tp)")
        if int(have) != tp:
            raise ConfigError("cli", "--tensor-parallel-size", f"{tp}, but profile '{prof.name}' prices TP {have} "
                              f"(a profile prices one deployment): build one with `profile build --tp {tp}`")
    if eng.disaggregated:
        kv_transfer_terms(prof, eng.kv_transfer_gbps, eng.kv_bytes_per_token)
    d = prof.metadata.get("data_parallel") if isinstance(getattr(prof, "metadata", None), dict) else None
    if isinstance(d, int) and d > 1 and eng.dp_ranks != d and (prof.name, eng.dp_ranks) not in _DP_WARNED:
        _DP_WARNED.add((prof.name, eng.dp_ranks))   # once per process, not per resolve
        print(f"dsparksim: warning: profile '{prof.name}' prices one of {d} data-parallel ranks "
              f"(metadata.data_parallel) but this run simulates --dp-ranks {eng.dp_ranks}: its "
              f"per-rank costs assume {d} ranks; pass --dp-ranks {d}", file=sys.stderr)


def resolve_inputs(cfg: RunConfig, *, profile=None, acceptance: Callable[[Any, int], Any] | None = None,
                   cache: dict | None = None) -> ResolvedInputs:
    """Resolve the inputs of ``cfg`` (see the module docstring).

    profile:    an already loaded (and checked) profile to use instead of loading ``cfg.profile``.
    acceptance: ``(policy, K) -> AcceptanceModel`` replacing the spec-string source (the real runner's live
                drafters); the spec then reads ``live``.
    cache:      a dict shared across calls (e.g. one per policy of a frontier) so each profile and each
                (acceptance spec, K) is loaded once.
    """
    from dsparksim.acceptance import load_acceptance  # lazy: pulls in scipy

    prof = profile if profile is not None else load_run_profile(cfg, cache)
    check_deployment(cfg, prof)
    policy = make_policy(cfg.policy)
    if not getattr(policy, "drafts", True):
        # plain decoding: K = 0 (no draft KV slots, M = anchors + prefill), no drafter (draft_time(None) = 0)
        from dsparksim.acceptance.nodraft import NoDraftAcceptance
        kv_cap, max_tok = engine_limits(cfg, prof)
        return ResolvedInputs(profile=prof, policy=policy, K=0, acceptance=NoDraftAcceptance(), acceptance_spec="none",
                              drafter=None, kv_cap=kv_cap, max_tokens=max_tok, max_model_len=max_model_len(prof, kv_cap))
    K = int(policy.block_size or cfg.engine.block_size)
    if getattr(cfg, "recalibrate", False) and policy.reads_confidence:
        policy = Recalibrating(policy)       # online STS from past outcomes; the unread-option rule of
        # dsparksim.sim.reads refuses --recalibrate typed for a policy that reads no confidence
    if acceptance is not None:
        acc, spec = acceptance(policy, K), "live"
    else:
        spec = acceptance_spec(cfg, policy)
        key = ("acceptance", spec, K, cfg.confidence)
        if cache is not None and key in cache:
            acc = cache[key]
        else:
            acc = load_acceptance(spec, K, confidence=cfg.confidence)
            if cache is not None:
                cache[key] = acc
    if policy.reads_confidence and not getattr(acc, "confidence_head", True):
        ok = ", ".join(n for n, c in REGISTRY.items() if not c.reads_confidence)
        raise ConfigError(f"acceptance spec {spec!r}", "policy", f"drafter '{acc.drafter}' has no confidence head, "
                          f"but policy '{policy.spec}' reads confidences; use one of {ok}")
    drafter = policy.drafter or cfg.engine.drafter or acc.drafter
    if drafter not in prof.drafters:
        raise ConfigError(prof.source, "drafters", f"profile '{prof.name}' has no drafting cost for drafter "
                          f"'{drafter}' (policy {policy.spec}; has: {sorted(prof.drafters)})")
    kv_cap, max_tok = engine_limits(cfg, prof)
    return ResolvedInputs(profile=prof, policy=policy, K=K, acceptance=acc, acceptance_spec=spec, drafter=drafter,
                          kv_cap=kv_cap, max_tokens=max_tok, max_model_len=max_model_len(prof, kv_cap))
