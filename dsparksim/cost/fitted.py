"""The server a ``profile fit`` profile was fitted under, and the run options that default to it.

``dsparksim profile fit`` simulates the benchmark runs on one server (``metadata.fit.client_model``: prefill chunk,
most running requests, memory fraction for the KV cache, whether prefill chunks shared steps with decode,
TensorRT-LLM's batch waiting) and fits the cost families to the runs on that server. ``run``, ``frontier``,
``sweep``, ``capacity``, ``plan`` and ``study`` have their own defaults for those settings (a 2048-token chunk, 1024
requests, the profile's KV capacity, mixed prefill, no batch waiting); on a fitted profile an option the user (or
the study's regime) did not set takes the fit's value instead
(:func:`fit_defaults`), and the command says so in one line (:meth:`FitDefaults.note`), and says when a value the
user set differs from the fit's (:meth:`FitDefaults.caution`). Any other profile keeps the run's defaults.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from dsparksim.cost.profile import profile_path, read_profile_dict
from dsparksim.errors import ConfigError, InputError

__all__ = ["BATCH_WAIT_KEYS", "FIT_COMMAND", "SERVER_KEYS", "FitDefaults", "FitRange", "fit_defaults", "fit_lines",
           "fit_range", "fit_server", "fit_set_mixed_prefill", "fitted_options", "key_spelling", "profile_fit_server"]

FIT_COMMAND = "dsparksim profile fit"      # metadata.fit.command of a profile `profile fit` wrote
# Run options (dsparksim.config.run_options keys) a fit records under metadata.fit.client_model, in that order.
BATCH_WAIT_KEYS = ("batch_wait_timeout_iters", "batch_wait_max_tokens_ratio")   # one setting: both or neither
SERVER_KEYS = ("prefill_chunk_tokens", "max_num_seqs", "mem_fraction_static", "mixed_prefill", *BATCH_WAIT_KEYS)
_FIELD = "metadata.fit.client_model"
# A set run option that keeps the fit's settings out (they conflict with it) -> those settings: a KV capacity
# replaces the memory fraction; batch waiting is refused on decode-only engines and under attention DP.
_DISPLACES = {"kv_capacity_tokens": ("mem_fraction_static",), "disaggregated": BATCH_WAIT_KEYS,
              "dp_ranks": BATCH_WAIT_KEYS}
REMEDY = "set them to simulate another server"


def _count(source: str, cm: Mapping[str, Any], key: str) -> int:
    v = cm.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ConfigError(source, f"{_FIELD}.{key}", f"expected an integer >= 1, got {v!r}")
    return v


def _fit_record(meta: Mapping[str, Any], source: str) -> Mapping[str, Any] | None:
    """``metadata.fit`` when ``profile fit`` wrote it, else None (no record, or another writer's: ``measure``,
    ``refit``). A record that is not an object (a string, a number, null): ConfigError naming the field, as every
    writer of the field writes an object; read as "not fitted" it silently simulated the run's defaults."""
    if "fit" not in meta:
        return None
    fit = meta["fit"]
    if not isinstance(fit, Mapping):
        raise ConfigError(source, "metadata.fit", f"expected an object (the record of the fit that made the "
                          f"profile: `profile fit`, `measure`), got {fit!r}")
    return fit if fit.get("command") == FIT_COMMAND else None


def fit_server(meta: Mapping[str, Any], source: str, budget: int | None = None) -> dict[str, Any]:
    """The run options of the server a profile's metadata says it was fitted under ({} unless ``profile fit``
    wrote it). ``mixed_prefill`` is left out when the fitted runs differed in it (their engines' defaults) or the
    fit predates its record (every step then mixed, the run's default); ``mem_fraction_static`` when the fit used
    the profile's KV capacity; the batch waiting pair unless every fitted run waited with one setting
    (:func:`_batch_wait`). A recorded value that is not as ``profile fit`` writes it (``budget``: the
    profile's token budget, which the fit's prefill chunk cannot exceed; a ``metadata.fit.runs`` of the wrong
    shape; a ``metadata.fit`` that is not an object): ConfigError naming the field."""
    fit = _fit_record(meta, source)
    if fit is None:
        return {}
    cm = fit.get("client_model")
    if not isinstance(cm, Mapping):
        raise ConfigError(source, _FIELD, f"expected an object (the server the fit simulated), got {cm!r}")
    out: dict[str, Any] = {"prefill_chunk_tokens": _count(source, cm, "prefill_chunk_tokens"),
                           "max_num_seqs": _count(source, cm, "max_num_seqs")}
    if budget is not None and out["prefill_chunk_tokens"] > budget:   # profile fit refuses such a chunk
        raise ConfigError(source, f"{_FIELD}.prefill_chunk_tokens", f"{out['prefill_chunk_tokens']} is above the "
                          f"profile's token budget {budget} (verify.M's largest breakpoint), which `profile fit` "
                          "never records")
    _fit_runs(fit, source)     # checked here, before any run: the fit-range caution reads it after the runs
    f = cm.get("mem_fraction_static")
    if f is not None:
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f <= 1:
            raise ConfigError(source, f"{_FIELD}.mem_fraction_static", f"expected a fraction in (0, 1] or null, "
                              f"got {f!r}")
        out["mem_fraction_static"] = float(f)
    mixed = cm.get("mixed_prefill")    # absent: a fit older than the option, whose engine always mixed (the default)
    value = mixed.get("value") if isinstance(mixed, Mapping) else None
    if isinstance(value, bool):
        out["mixed_prefill"] = value
    elif mixed is not None and not (isinstance(value, list) and all(isinstance(x, bool) for x in value)):
        raise ConfigError(source, f"{_FIELD}.mixed_prefill", f"expected {{\"value\": true|false|[...]}}, got "
                          f"{mixed!r}")
    return out | _batch_wait(source, cm)


def _batch_wait(source: str, cm: Mapping[str, Any]) -> dict[str, Any]:
    """TensorRT-LLM's batch waiting of the fitted runs (``client_model.batch_wait``, as ``profile fit`` writes it)
    as the two run options; {} when the fit has no record (off in every run), and, as for mixed prefill, when the
    runs differed in it (``run_ids`` names only some of them, or several values). A record of another shape:
    ConfigError naming the field and the value."""
    bw = cm.get("batch_wait")
    if bw is None:
        return {}
    where = f"{_FIELD}.batch_wait"
    if not isinstance(bw, Mapping):
        raise ConfigError(source, where, f"expected an object (timeout_iters, max_tokens_ratio, run_ids), got {bw!r}")
    t, r, ids = bw.get("timeout_iters"), bw.get("max_tokens_ratio"), bw.get("run_ids")
    if not isinstance(t, list) or not t or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1
                                                   for x in t):
        raise ConfigError(source, f"{where}.timeout_iters", f"expected a list of integers >= 1, got {t!r}")
    if not isinstance(r, list) or not r or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                   and 0 < x <= 1 for x in r):
        raise ConfigError(source, f"{where}.max_tokens_ratio", f"expected a list of fractions in (0, 1], got {r!r}")
    if ids != "all" and not (isinstance(ids, list) and ids and all(isinstance(x, str) for x in ids)):
        raise ConfigError(source, f"{where}.run_ids", f"expected \"all\" or a list of run ids, got {ids!r}")
    if ids != "all" or len(t) > 1 or len(r) > 1:
        return {}
    return {"batch_wait_timeout_iters": t[0], "batch_wait_max_tokens_ratio": float(r[0])}


def fit_set_mixed_prefill(meta: Mapping[str, Any]) -> bool | None:
    """The mixed-prefill setting ``profile fit`` was given (--mixed-prefill / --no-mixed-prefill), else None (it
    used each run's engine default, as ``bench replay`` does without the option)."""
    fit = meta.get("fit")
    cm = fit.get("client_model") if isinstance(fit, Mapping) and fit.get("command") == FIT_COMMAND else None
    mixed = cm.get("mixed_prefill") if isinstance(cm, Mapping) else None
    if (isinstance(mixed, Mapping) and str(mixed.get("source", "")).startswith("--mixed-prefill")
            and isinstance(mixed.get("value"), bool)):
        return mixed["value"]
    return None


@functools.lru_cache(maxsize=64)
def _read_meta(path: str, size: int, mtime_ns: int) -> tuple[Mapping[str, Any] | None, int | None]:
    """(the profile's metadata, its token budget: verify.M's last breakpoint; None where the file lacks one, which
    loading the profile reports)."""
    d, _ = read_profile_dict(path)
    meta = d.get("metadata") if isinstance(d, dict) else None
    v = d.get("verify") if isinstance(d, dict) else None
    m = v.get("M") if isinstance(v, dict) else None
    last = m[-1] if isinstance(m, list) and m else None
    budget = last if isinstance(last, int) and not isinstance(last, bool) else None
    return (meta if isinstance(meta, Mapping) else None), budget


def profile_fit_server(profile: str | Path, unreadable_ok: bool = False) -> dict[str, Any]:
    """:func:`fit_server` of a profile file or shipped name (read once per file version: sweeps and plans ask for
    every cell). ``unreadable_ok``: a profile that cannot be found or read gives {} (the run that loads it reports
    why); a fit record that is not as ``profile fit`` writes it is a ConfigError all the same."""
    try:
        path = profile_path(profile)
        st = path.stat()
        meta, budget = _read_meta(str(path.resolve()), st.st_size, st.st_mtime_ns)
    except (InputError, OSError):
        if unreadable_ok:
            return {}
        raise
    return fit_server(meta, str(path), budget) if meta is not None else {}


@dataclass(frozen=True)
class FitRange:
    """What a ``profile fit`` profile's runs covered (``metadata.fit.runs``): their client concurrencies and the
    random dataset's prompt and output lengths (``workloads``: "IN/OUT"); the fit takes non-speculative runs only
    (spec_method none)."""

    concurrencies: tuple[int, ...]
    input_lens: tuple[int, ...]
    output_lens: tuple[int, ...]


def _fit_runs(fit: Mapping[str, Any], source: str) -> FitRange | None:
    """The :class:`FitRange` of a ``profile fit`` record ``fit`` (None where it has no ``runs``; a field ``runs``
    lacks is an empty tuple). ``runs`` not an object, ``concurrencies`` not a list of integers >= 1, or
    ``workloads`` not a list of "IN/OUT" integer pairs: ConfigError naming the field and the value."""
    runs = fit.get("runs")
    if runs is None:
        return None
    if not isinstance(runs, Mapping):
        raise ConfigError(source, "metadata.fit.runs", f"expected an object (the runs the fit took), got {runs!r}")
    conc, work = runs.get("concurrencies", []), runs.get("workloads", [])
    if not isinstance(conc, list) or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 1
                                             for c in conc):
        raise ConfigError(source, "metadata.fit.runs.concurrencies", f"expected a list of integers >= 1, got "
                          f"{conc!r}")
    pairs = [str(w).split("/") for w in work] if isinstance(work, list) else None
    if (pairs is None or not all(isinstance(w, str) for w in work)
            or not all(len(p) == 2 and p[0].isdigit() and p[1].isdigit() for p in pairs)):
        raise ConfigError(source, "metadata.fit.runs.workloads", f"expected a list of \"IN/OUT\" token lengths "
                          f"(\"1024/1024\"), got {work!r}")
    ins, outs = {int(a) for a, _ in pairs}, {int(b) for _, b in pairs}
    return FitRange(tuple(conc), tuple(sorted(ins)), tuple(sorted(outs)))


def fit_range(profile: str | Path) -> FitRange | None:
    """The :class:`FitRange` of a profile file or shipped name that ``profile fit`` wrote, else None (another
    profile, one without ``metadata.fit.runs``, or one that cannot be read: the run that loads it says why). A
    field it lacks is an empty tuple; a ``runs`` of the wrong shape, or a ``metadata.fit`` that is not an object,
    is a ConfigError naming the field."""
    try:
        path = profile_path(profile)
        st = path.stat()
        meta, _ = _read_meta(str(path.resolve()), st.st_size, st.st_mtime_ns)
    except (InputError, OSError):
        return None
    fit = _fit_record(meta or {}, str(path))
    return None if fit is None else _fit_runs(fit, str(path))


def key_spelling(key: str, value: Any) -> str:
    """A run option as a sweep or plan spec writes it: ``prefill_chunk_tokens = 16384``, ``mixed_prefill = false``."""
    return f"{key} = {str(value).lower() if isinstance(value, bool) else value}"


@dataclass(frozen=True)
class FitDefaults:
    """What a run took from its profile's fit: ``fitted`` (the fit's server, :func:`fit_server`), ``used`` (the
    options filled in from it, the user having set none of them) and ``differs`` (options the user set to another
    value than the fit's; ``kv_capacity_tokens`` when it replaces the fit's memory fraction)."""

    profile: str
    fitted: Mapping[str, Any] = field(default_factory=dict)
    used: Mapping[str, Any] = field(default_factory=dict)
    differs: Mapping[str, Any] = field(default_factory=dict)
    decode_only: bool = False    # the run is disaggregated: its engines always mix (sim/scheduler.py)

    def note(self, spell: Any, remedy: str = REMEDY) -> str | None:
        """One line: which settings were used and why (None when none was filled in). ``spell(key, value)`` writes
        one setting (a command-line flag, or a spec key); ``remedy`` ends the line (how to simulate another). A
        fitted ``mixed_prefill`` false beside ``disaggregated`` is said to change nothing: a decode-only engine
        always mixes, so the line never claims a prefill-only step the run does not take."""
        if not self.used:
            return None
        moot = ""
        if self.decode_only and self.used.get("mixed_prefill") is False:
            moot = (f" ({spell('mixed_prefill', False)} changes nothing here: a decode-only engine "
                    f"({spell('disaggregated', True)}) always mixes its requests' first steps with decoding)")
        return (f"{', '.join(spell(k, v) for k, v in self.used.items())}: the server profile {self.profile} was "
                f"fitted under ({_FIELD}: `profile fit` simulated the benchmark runs on it), used as none of these "
                f"was set{moot}; {remedy}")

    def caution(self, spell: Any) -> str | None:
        """One line naming every set value that differs from the fit's (None when none does)."""
        if not self.differs:
            return None
        keys = dict.fromkeys(f for k in self.differs for f in _DISPLACES.get(k, (k,)))
        fit = ", ".join(spell(k, self.fitted[k]) for k in keys)
        return (f"{', '.join(spell(k, v) for k, v in self.differs.items())} "
                f"{'differs' if len(self.differs) == 1 else 'differ'} from the server profile "
                f"{self.profile} was fitted under ({fit}): its fitted scales were judged on that server, so "
                "figures on this one carry an error the fit never measured")


def fit_defaults(profile: str | Path, given: Mapping[str, Any], unreadable_ok: bool = True) -> FitDefaults:
    """The fit's settings of ``profile`` that ``given`` (the run options the user set: key -> value) leaves unset,
    and the ones it sets otherwise. A setting a given option conflicts with is not used beside it, and counts as
    differing (:data:`_DISPLACES`: a ``kv_capacity_tokens`` sets the KV capacity the memory fraction would; batch
    waiting is refused with ``disaggregated`` or ``dp_ranks`` above 1). The batch waiting pair is one setting:
    with either half given, neither is filled in. A given ``mixed_prefill`` beside ``disaggregated`` differs from
    nothing: a decode-only engine always mixes, so the run is the one the fit's value gives. Empty for a profile
    ``profile fit`` did not write, and (with ``unreadable_ok``) for one that cannot be read: loading it for the run
    says why."""
    fitted = profile_fit_server(profile, unreadable_ok)
    used, differs = {}, {}
    pair_given = any(given.get(b) is not None for b in BATCH_WAIT_KEYS)
    decode_only = bool(given.get("disaggregated"))
    for k, v in fitted.items():
        blocker = _displacing(k, given)
        if given.get(k) is not None:
            if given[k] != v and not (k == "mixed_prefill" and decode_only):
                differs[k] = given[k]
        elif k in BATCH_WAIT_KEYS and pair_given:
            continue   # the other half given alone: the run refuses it, naming it
        elif blocker is not None:
            differs[blocker] = given[blocker]
        else:
            used[k] = v
    return FitDefaults(profile=str(profile), fitted=fitted, used=used, differs=differs, decode_only=decode_only)


def _displacing(key: str, given: Mapping[str, Any]) -> str | None:
    """The given option that keeps the fit's ``key`` out (:data:`_DISPLACES`), else None."""
    for opt, keys in _DISPLACES.items():
        v = given.get(opt)
        if key in keys and v is not None and v is not False and not (opt == "dp_ranks" and v == 1):
            return opt
    return None


def fitted_options(values: Mapping[str, Any], profile: str | Path) -> dict[str, Any]:
    """``values`` (run options, as :meth:`dsparksim.config.RunConfig.from_options` takes them) with the settings of
    ``profile``'s fitted server they leave unset filled in (:func:`fit_defaults`): what ``run`` simulates when
    those are its options; sweep cells and study cells are built from it."""
    return {**fit_defaults(profile, values).used, **values}


def fit_lines(fds: Iterable[FitDefaults], remedy: str = REMEDY) -> list[str]:
    """The 'dsparksim: note:' lines of the runs' :class:`FitDefaults` (``key = value`` spellings, as a spec
    writes them; each ends with ``remedy``), each line once, then one 'dsparksim: caution:' line per fitted profile
    naming every set value that differs from the fit's (``prefill_chunk_tokens = 1024 / 2048``): a sweep axis or a
    plan candidate list over server settings gave one caution per cell."""
    lines: dict[str, None] = {}
    differs: dict[str, tuple[FitDefaults, dict[str, dict[Any, None]]]] = {}   # profile -> (one fd, key -> values)
    for fd in fds:
        line = fd.note(key_spelling, remedy)
        if line:
            lines[f"dsparksim: note: {line}"] = None
        if fd.differs:
            seen = differs.setdefault(fd.profile, (fd, {}))[1]
            for k, v in fd.differs.items():
                seen.setdefault(k, {})[v] = None
    for fd, seen in differs.values():
        merged = dataclasses.replace(fd, differs={k: tuple(vs) for k, vs in seen.items()})
        lines[f"dsparksim: caution: {merged.caution(_spell_values)}"] = None
    return list(lines)


def _spell_values(key: str, value: Any) -> str:
    """key_spelling of one value, or of several set values (a tuple) as ``key = 1024 / 2048``."""
    if not isinstance(value, tuple):
        return key_spelling(key, value)
    return f"{key} = " + " / ".join(key_spelling(key, v).split(" = ", 1)[1] for v in value)
