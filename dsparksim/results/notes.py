"""Notes a run's summary calls for: facts about the result a reader could otherwise miss (printed, never fatal)."""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from dsparksim.config import RunConfig

LOW_VERIFY_PARTS = 10   # a drafting run verifying under 1/10 of K per request is all but plain decoding


def low_verify_note(s: Mapping[str, Any]) -> str | None:
    """The note for a drafting run under load (more than one request running on average) whose mean verify length
    is below 10% of K, else None."""
    K, v, running = s.get("block_size"), s.get("mean_verify_len"), s.get("mean_running")
    if not K or v is None or running is None or running <= 1 or v * LOW_VERIFY_PARTS >= K:
        return None
    tau = s.get("tau")
    return (f"mean verify length {v:.2f} is below 10% of K={K} with {running:.0f} requests running: policy "
            f"{s.get('policy')} verifies a draft token only when its expected acceptance pays for the step time it "
            f"adds, and on this profile at this batch the verify cost of nearly every token outweighs it, so the run "
            f"is close to plain decoding" + (f" (tau {tau:.2f})" if tau is not None else "")
            + "; compare --policy none and fixed:K, or the production variant confidence-async:2")


def request_latency_note(profile_name: str, seconds: float) -> str | None:
    """The note for a profile carrying a client-side request latency (``request_latency_s``, fitted by ``profile
    fit``), which ``run``/``frontier``/``plan`` leave out of their engine-side TTFT and E2E, else None."""
    if not seconds:
        return None
    return (f"profile {profile_name} carries request_latency_s = {seconds * 1000:.1f} ms (the serving stack's "
            "latency outside the engine, as a benchmark client sees it); TTFT and E2E here are engine-side, without "
            "it (bench replay adds it to every request, as the client measured)")


def short_window_count(s: Mapping[str, Any], users: int | None) -> str | None:
    """'N finished for U users' for a closed-loop run of U users that ended on its duration with fewer requests finished in
    the measurement window than users (but at least one), else None. Such a window did not see every user through
    one request: the per-request metrics (TTFT, TPOT, tok/s/user) rest on the requests short enough to arrive
    after the warm-up and finish before the end, and the throughput may still be the start-up burst's (every user
    arrives at t = 0) rather than a steady state's. (No finished request at all has its own warning.)"""
    n = s.get("num_requests_completed")
    if not users or s.get("ended_by") != "duration" or not n or n >= users:
        return None
    return f"{int(n)} finished for {int(users)} users"


def config_users(cfg: RunConfig) -> int | None:
    """The users of a closed-loop run (its concurrency), else None (open loop and trace replay have no users)."""
    return cfg.traffic.concurrency if cfg.traffic.mode == "closed" else None


SHORT_LIST = 12   # cells a short-window warning names before it counts the rest


def short_window_list(named: Sequence[str], more_in: str) -> str:
    """The ``where`` of :func:`short_window_note` for several cells: the first SHORT_LIST of ``named`` (each
    'CELL: N finished for U users'), then how many more and where they are listed (``more_in``)."""
    head = "; ".join(named[:SHORT_LIST])
    rest = len(named) - SHORT_LIST
    return head + (f"; and {rest} more ({more_in})" if rest > 0 else "")


def short_window_note(where: str) -> str:
    """The warning for the runs :func:`short_window_count` names (``where``: one run's count, or a list of cells)."""
    return (f"fewer requests finished in the measurement window than there are users ({where}): the per-request "
            "metrics (TTFT, TPOT, tok/s/user) leave out every request too long to arrive after the warm-up and "
            "finish before the end, and the throughput may still describe the start-up burst (every user arrives at "
            "t = 0) rather than a steady state; lengthen --duration (and --warmup)")


def prefill_chunk_note(chunk: int, budget: int) -> str | None:
    """The note for a prefill chunk above the step's token budget, which caps every step's prefill (the chunk is
    then simulated at the budget), else None."""
    if chunk <= budget:
        return None
    return (f"the prefill chunk {chunk} is above the token budget {budget} (--max-batched-tokens, default the "
            f"profile's largest breakpoint), which caps every step's prefill: chunks of at most {budget} tokens are "
            "simulated")


# SLO latency bounds (seconds) from which the number reads as milliseconds: 1000 s to the first token or to the end
# of a request (TTFT/E2E, from the limit on); TPOT/ITL strictly above a second per token. A bound is cautioned where
# it is implausible in seconds and plausible in milliseconds: `itl_p99_s <= 1` ("no stall over a second") is a real
# bound, and 1 ms per token (1000 tok/s per user) is out of reach of GPU decoding (the fastest shipped GPU profile,
# h100-llama2-7b-tp1, prices one request's verify step at 5.7 ms: 1 ms per token would take 5.7 tokens per step), so
# 1 is read as seconds; above it, seconds allow per-token gaps over a second and milliseconds read as usual targets.
_SLO_SECONDS_ABOVE = {"tpot": 1.0, "itl": 1.0, "ttft": 1000.0, "e2e": 1000.0}
_SLO_LIMIT_STRICT = frozenset({"tpot", "itl"})   # cautioned above the limit, not at it


def slo_unit_notes(terms: Iterable[Any], field: str, output_lens: Iterable[Any] = ()) -> list[str]:
    """One caution per SLO latency bound (a term with ``metric``, ``op``, ``value``, ``spelled``, on a ``*_s``
    metric) that is in seconds as written but reads as milliseconds (``tpot_p99_s <= 50``: 50 s per token, every
    deployment meets it): TTFT/E2E from 1000 s, TPOT/ITL above 1 s (``itl_p99_s <= 1`` is a real stall bound). ``output_lens``: the runs' random_output_len values (None where not set); with one
    known, an E2E bound is cautioned only from the larger of 1000 s and the tpot limit per output token of the
    longest up (an 8k-token reasoning workload's ``e2e_p99_s <= 1200`` is 0.15 s per token, a real bound, not 1.2 s
    in milliseconds; outputs shorter than 1000 tokens keep 1000 s)."""
    lens = [int(n) for n in output_lens if isinstance(n, int) and not isinstance(n, bool) and n > 0]
    out = []
    for i, t in enumerate(terms):
        kind = str(t.metric).split("_")[0]
        limit = _SLO_SECONDS_ABOVE.get(kind)
        if kind == "e2e" and lens:
            limit = max(limit, _SLO_SECONDS_ABOVE["tpot"] * max(lens))
        over = limit is not None and (t.value > limit if kind in _SLO_LIMIT_STRICT else t.value >= limit)
        if over and str(t.metric).endswith("_s") and t.op in ("<=", "<"):
            out.append(f"{field}[{i}] {t.spelled} {t.op} {t.value:g}: {t.value:g} s, as the metric is in seconds "
                       f"(a bound almost every deployment meets); {t.value:g} ms is {t.value / 1000:g}")
    return out


def slo_tail_notes(terms: Iterable[Any], field: str) -> list[str]:
    """One caution per SLO floor on the fast tail of per-user speed (``tps_user_p90 >= X``, ``tps_user_p99 >= X``):
    per-user speed's high percentiles are its fastest users, so the floor holds while most users are slower;
    "p99 tok/s per user" is often meant the other way (InferenceX's p99 interactivity is 1000 / p99 TPOT, the
    slowest users), which is ``tps_user_p10`` or ``tpot_p99_s <= 1/X`` here."""
    out = []
    for i, t in enumerate(terms):
        pct = {"tps_user_p90": 10, "tps_user_p99": 1}.get(str(t.metric))
        if pct is not None and t.op in (">=", ">"):
            out.append(f"{field}[{i}] {t.spelled} {t.op} {t.value:g} floors the fastest {pct}% of users only "
                       f"(per-user speed's p{100 - pct} is its fast tail); for the slowest users bound "
                       "tps_user_p10, or tpot_p99_s (InferenceX's p99 interactivity is 1000 / p99 TPOT)")
    return out


def trace_cover_note(span_s: float, duration_s: float | None, scales: Sequence[float],
                     option: str = "--duration") -> str | None:
    """The note for a trace replay that ``duration_s`` (set by ``option``) ends before the trace does at some time
    scale (a run at scale s replays the trace's first duration x s seconds of its ``span_s``), else None."""
    short = [s for s in scales if duration_s is not None and duration_s * s < span_s]
    if not short:
        return None
    covered = ", ".join(f"{duration_s * s:,.0f} s at time scale {s:g}" for s in short)
    return (f"the trace spans {span_s:,.0f} s and a {duration_s:g} s run replays only its first {covered}: "
            f"{option} ends the replay and the rest of the trace is never served; lengthen {option} to replay "
            "more of it")


def spec_chunk_notes(option_sets: Iterable[Mapping[str, Any]]) -> list[str]:
    """prefill_chunk_note, naming the profile, for each distinct (profile, prefill chunk, token budget) among the
    runs of a sweep or plan spec (flat run options) that set ``prefill_chunk_tokens`` or take it from a fitted
    profile's server (:func:`dsparksim.cost.fitted.profile_fit_server`)."""
    from dsparksim.cost.fitted import profile_fit_server  # heavy: numpy (the profile module)
    from dsparksim.cost.profile import load_profile  # heavy: numpy (only for a spec that sets a prefill chunk)

    default_profile = RunConfig.__dataclass_fields__["profile"].default
    seen, notes = set(), []
    for o in option_sets:
        prof = str(o.get("profile") or default_profile)
        chunk = o.get("prefill_chunk_tokens")
        if chunk is None:
            chunk = profile_fit_server(prof, unreadable_ok=True).get("prefill_chunk_tokens")
        if chunk is None:
            continue
        key = (prof, int(chunk), o.get("max_batched_tokens"))
        if key in seen:
            continue
        seen.add(key)
        note = prefill_chunk_note(key[1], int(key[2] or load_profile(key[0]).max_tokens))
        if note:
            notes.append(f"profile {key[0]}: {note}")
    return notes


FIT_RANGE_FACTOR = 1.5   # "clearly beyond" a fit's runs: 1.5x above the largest seen, or below the smallest / 1.5


def _beyond(what: str, values: Iterable[float | None], seen: Sequence[float], unit: str, low: float = 1.0
            ) -> list[str]:
    """'WHAT up to X (Rx the fit's largest UNIT, S)' and/or '... down to ...' where ``values`` leave
    [min(seen) * low / FIT_RANGE_FACTOR, max(seen) * FIT_RANGE_FACTOR]; ``low`` scales the lower end (a fitted
    workload of nominal length L drew means down to about L/2)."""
    vals = [float(v) for v in values if v is not None and v == v and v > 0]
    if not vals or not seen:
        return []
    out, hi, lo = [], max(vals), min(vals)
    if hi > max(seen) * FIT_RANGE_FACTOR:
        out.append(f"{what} up to {hi:,.0f} ({hi / max(seen):.1f}x the fit's largest {unit}, {max(seen):,})")
    if lo < min(seen) * low / FIT_RANGE_FACTOR:
        out.append(f"{what} down to {lo:,.1f} ({lo / min(seen):.2f}x the fit's smallest {unit}, {min(seen):,})")
    return out


def fit_range_note(profile: str, fr: Any, running: Iterable[float | None], prompts: Iterable[float],
                   outputs: Iterable[float], drafting: Sequence[str]) -> str | None:
    """The caution for runs on a fitted profile (``fr``: its :class:`dsparksim.cost.fitted.FitRange`) that go
    clearly beyond what its runs covered: requests running per step on average (``running``, the summaries'
    mean_running) against the runs' concurrencies, mean prompt and output lengths against their random dataset's
    lengths, and drafting policies (``drafting``) where every fitted run was non-speculative; else None."""
    parts = (_beyond("requests running per step on average", running, fr.concurrencies, "concurrency")
             + _beyond("mean prompt length", prompts, fr.input_lens, "random_input_len", low=0.5)
             + _beyond("mean output length", outputs, fr.output_lens, "random_output_len", low=0.5))
    if drafting:
        parts.append(f"{', '.join(drafting)} draft{'s' if len(drafting) == 1 else ''} and verif"
                     f"{'ies' if len(drafting) == 1 else 'y'} several tokens per request per step, while every "
                     "fitted run was non-speculative (spec_method none)")
    if not parts:
        return None
    return (f"outside what profile {profile} was fitted on (metadata.fit.runs): " + "; ".join(parts) + "; its "
            "prices there are the builder's model scaled by the fit, extrapolated and never checked against a "
            "measurement")


def fit_range_cautions(cfgs: Sequence[RunConfig], summaries: Sequence[Mapping[str, Any] | None]) -> list[str]:
    """:func:`fit_range_note` once per fitted profile among the runs ``cfgs`` (with their ``summaries``; None:
    the run failed), as 'dsparksim: caution: ...' lines."""
    from dsparksim.cost.fitted import fit_range  # heavy: numpy (the profile module), only where the run reports
    from dsparksim.policies import make_policy  # heavy: numpy
    from dsparksim.traffic.build import mean_lengths  # heavy: numpy

    by_profile: dict[str, list[tuple[RunConfig, Mapping[str, Any]]]] = {}
    for c, s in zip(cfgs, summaries):
        if s:
            by_profile.setdefault(str(c.profile), []).append((c, s))
    lines = []
    for prof, runs in by_profile.items():
        fr = fit_range(prof)
        if fr is None:
            continue
        lengths = {mean_lengths(c.traffic) for c in {repr(c.traffic): c for c, _ in runs}.values()}
        drafting = sorted({c.policy for c, _ in runs if make_policy(c.policy).drafts})
        note = fit_range_note(prof, fr, [s.get("mean_running") for _, s in runs], [p for p, _ in lengths],
                              [o for _, o in lengths], drafting)
        if note:
            lines.append(f"dsparksim: caution: {note}")
    return lines
