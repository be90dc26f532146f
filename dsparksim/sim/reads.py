"""Which run options a run reads, so the same deployment is run once and an option nothing reads is refused.

A run's result depends only on the options it reads (dsparksim.sim.inputs resolves them):

- plain decoding (``none``, ``drafts = False``) reads no draft option: K, acceptance, mtp1_acceptance,
  confidence, drafter, draft_exit;
- a policy with its own drafter (``mtp1``) runs that drafter's source (``mtp1_acceptance``) and its own K: it reads
  no ``block_size``, ``acceptance``, ``drafter`` or ``draft_exit`` (one drafted token: nothing to stop early); a
  policy with the run's block drafter reads no ``mtp1_acceptance``; a policy that never looks at the confidences reads no ``confidence``;
- one engine (replicas x dp_ranks = 1) reads no ``router``.

:func:`identity` resets every unread option to its default: two configurations with the same identity are the
same run (same result, bit for bit). `run`, `frontier`, `sweep` and `plan` all use this module: an option that no
policy of the command reads is refused (:func:`unread_by_all`), and cells that differ only in unread options are
run once and reported as such (:func:`same_as`).
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

from dsparksim.config import RunConfig, run_options

DRAFT_OPTIONS = ("block_size", "acceptance", "mtp1_acceptance", "confidence", "recalibrate", "drafter", "draft_exit")
ENGINE_OPTIONS = ("router",)


def policy_reads(spec: str) -> frozenset[str]:
    """The draft options (of :data:`DRAFT_OPTIONS`) a policy spec reads."""
    from dsparksim.policies import make_policy

    pol = make_policy(spec)
    if not getattr(pol, "drafts", True):
        return frozenset()
    if pol.drafter is None:
        r = {"acceptance", "drafter", "draft_exit"}   # early exit stops the run's block drafter (not MTP-1's K=1)
    elif pol.drafter == "mtp1":
        r = {"mtp1_acceptance"}
    else:
        r = set()
    if pol.block_size is None:
        r.add("block_size")
    if pol.reads_confidence:
        r |= {"confidence", "recalibrate"}
    return frozenset(r)


def why_unread(spec: str, key: str) -> str:
    """Why policy ``spec`` does not read draft option ``key`` (a short phrase)."""
    from dsparksim.policies import confidence_readers, make_policy

    pol = make_policy(spec)
    if not getattr(pol, "drafts", True):
        return {"block_size": "plain decoding: K is 0"}.get(key, "plain decoding: nothing is drafted")
    if key in ("confidence", "recalibrate"):
        return f"it never reads the confidences; the policies that do: {', '.join(confidence_readers())}"
    if key == "mtp1_acceptance":
        return "only the mtp1 policy reads it"
    if pol.drafter == "mtp1":
        return {"block_size": "MTP-1 drafts K=1", "drafter": "MTP-1 drafts with its own drafter",
                "draft_exit": "MTP-1 drafts one token: nothing to stop early"}.get(
            key, "the MTP-1 drafter runs with --mtp1-acceptance")
    if key == "block_size":
        return f"it drafts K={pol.block_size}"
    return f"it drafts with its own drafter {pol.drafter}"


def engine_reads_router(replicas: int, dp_ranks: int = 1) -> bool:
    """A router spreads requests over several engines; one engine (replicas x dp_ranks = 1) reads none."""
    return int(replicas) * int(dp_ranks) > 1


def unread(cfg: RunConfig) -> frozenset[str]:
    """The options of ``cfg`` its run never reads."""
    out = set(DRAFT_OPTIONS) - policy_reads(cfg.policy)
    if not engine_reads_router(cfg.engine.replicas, cfg.engine.dp_ranks):
        out.add("router")
    return frozenset(out)


def identity(cfg: RunConfig) -> RunConfig:
    """``cfg`` with every option its run never reads at the option's default: equal identities, equal runs."""
    specs = run_options()
    run_kw, eng_kw = {}, {}
    for key in unread(cfg):
        s = specs[key]
        (run_kw if s.section == "run" else eng_kw)[s.field] = s.default
    out = cfg
    if eng_kw:
        out = out.replace(engine=dataclasses.replace(out.engine, **eng_kw))
    return out.replace(**run_kw) if run_kw else out


def same_as(cfgs: Sequence[RunConfig]) -> list[int | None]:
    """For each config the index of the first earlier one that is the same run (None for the first of its kind)."""
    first: dict[str, int] = {}
    out: list[int | None] = []
    for i, c in enumerate(cfgs):
        key = repr(identity(c).to_dict())
        out.append(first.get(key))
        first.setdefault(key, i)
    return out


def unread_by_all(policies: Iterable[str], keys: Iterable[str]) -> tuple[str, str] | None:
    """The first of ``keys`` (draft options) that none of ``policies`` reads, with the reason; None if each is read
    by some policy."""
    pols = list(dict.fromkeys(policies))
    for key in keys:
        if key in DRAFT_OPTIONS and not any(key in policy_reads(p) for p in pols):
            why = "; ".join(f"{p}: {why_unread(p, key)}" for p in pols)
            return key, why
    return None


def collapsed_reason(cfgs: Sequence[RunConfig], same: Sequence[int | None]) -> str:
    """'mtp1 reads no acceptance, block_size; one engine reads no router': why the repeated cells repeat."""
    parts: dict[str, set[str]] = {}
    for c, s in zip(cfgs, same):
        if s is None:
            continue
        other = cfgs[s]
        diff = [k for k in sorted(unread(c)) if _value(c, k) != _value(other, k)]
        who = "one engine" if diff == ["router"] else c.policy
        parts.setdefault(who, set()).update(diff)
    return "; ".join(f"{who} reads no {', '.join(sorted(keys))}" for who, keys in parts.items())


def _value(cfg: RunConfig, key: str):
    s = run_options()[key]
    return getattr(cfg.engine if s.section == "engine" else cfg, s.field)
