"""TrafficConfig: which requests arrive when, with which lengths and domains. Validated on construction."""
from __future__ import annotations

import argparse
import math
import numbers
from dataclasses import dataclass

from dsparksim.io.options import BOOL, DEFAULT_DURATION_S, INT, NUM, nonneg_int, option, pos_float, pos_int
from dsparksim.errors import ConfigError
from dsparksim.traffic.readers import DOMAINS, FORMATS

MODES = ("closed", "poisson", "gamma", "constant", "trace")
OPEN_SYNTHETIC = ("poisson", "gamma", "constant")
DEFAULT_LENGTHS = "azure-conv"
DEFAULT_DOMAIN_OPTION = "mix:math=1,code=1,chat=1"   # the --domain / sweep default (the field's is "chat")
_SRC = "TrafficConfig"


def parse_domain(spec: str) -> dict[str, float] | None:
    """``"math"`` -> {"math": 1.0}; ``"mix:math=0.3,code=0.3,chat=0.4"`` -> normalised weights over DOMAINS;
    ``"trace"`` -> None (take the domain column of the trace / length source)."""
    if not isinstance(spec, str):
        raise ConfigError(_SRC, "domain", f"expected a string, got {spec!r}")
    if spec == "trace":
        return None
    if spec in DOMAINS:
        return {d: float(d == spec) for d in DOMAINS}
    if not spec.startswith("mix:"):
        raise ConfigError(_SRC, "domain", f"expected one of {DOMAINS}, 'trace' or 'mix:math=W,code=W,chat=W', "
                          f"got {spec!r}")
    w = dict.fromkeys(DOMAINS, 0.0)
    seen: set[str] = set()
    for part in spec[4:].split(","):
        name, eq, val = part.partition("=")
        name = name.strip()
        if name not in DOMAINS or not eq:
            raise ConfigError(_SRC, "domain", f"mix term {part!r}: expected NAME=WEIGHT with NAME in {DOMAINS}")
        if name in seen:
            raise ConfigError(_SRC, "domain", f"mix names {name!r} twice in {spec!r}")
        seen.add(name)
        try:
            x = float(val)
        except ValueError:
            raise ConfigError(_SRC, "domain", f"mix weight of {name!r} is not a number: {val!r}") from None
        if not (math.isfinite(x) and x >= 0):
            raise ConfigError(_SRC, "domain", f"mix weight of {name!r} must be finite and >= 0, got {val!r}")
        w[name] = x
    total = sum(w.values())
    if total <= 0:
        raise ConfigError(_SRC, "domain", f"mix weights sum to 0 in {spec!r}")
    return {d: x / total for d, x in w.items()}


def drift_error(domain: str, drift) -> None:
    """ConfigError unless ``drift`` is (mix_b, i0, i1) with a domain spec mix_b and integers 0 <= i0 <= i1, and
    ``domain`` is a domain or mix (not 'trace')."""
    ok = (isinstance(drift, tuple) and len(drift) == 3 and isinstance(drift[0], str)
          and all(isinstance(x, int) and not isinstance(x, bool) for x in drift[1:]) and 0 <= drift[1] <= drift[2])
    if not ok:
        raise ConfigError(_SRC, "domain_drift", f"expected (mix_b, i0, i1) with integers 0 <= i0 <= i1, got {drift!r}")
    if parse_domain(domain) is None or parse_domain(drift[0]) is None:
        raise ConfigError(_SRC, "domain_drift", f"drifts between two domain mixes; 'trace' takes the domains from a "
                          f"file (domain={domain!r}, mix_b={drift[0]!r})")


RANDOM_DEFAULTS = (1024, 128)   # vLLM's --random-input-len / --random-output-len defaults


def rate_or_inf(s: str) -> float:
    """Option parser: a request rate in req/s, a finite number > 0 or ``inf`` (every prompt at once)."""
    if str(s).strip().lower() in ("inf", "infinity", "+inf"):
        return math.inf
    return pos_float(s)


def dataset_name(s: str) -> str:
    """Option parser of --dataset-name: only ``random`` is simulated (other datasets are length files)."""
    if s != "random":
        raise argparse.ArgumentTypeError(f"only 'random' is simulated, got {s!r}; for ShareGPT or other prompt "
                                         "sets give their lengths with --lengths (sharegpt is shipped)")
    return s


def range_ratio(s: str) -> float:
    """Option parser of --random-range-ratio: a fraction in [0, 1]."""
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1], got {s!r}") from None
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1], got {s!r}")
    return v


INT_FIELDS = ("concurrency", "max_concurrency", "num_warmup_prompts", "random_input_len", "random_output_len",
              "num_requests", "max_prompt_tokens", "max_output_tokens", "pool_size")


def _pos_int(name: str, v, required: bool = False) -> None:
    if v is None:
        if required:
            raise ConfigError(_SRC, name, "required for this mode")
        return
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ConfigError(_SRC, name, f"expected an integer >= 1, got {v!r}")


def _pos_float(name: str, v, required: bool = False) -> None:
    if v is None:
        if required:
            raise ConfigError(_SRC, name, "required for this mode")
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ConfigError(_SRC, name, f"expected a finite number > 0, got {v!r}")


# Stated ranges for the load knobs: beyond them a run is meaningless or numerically broken (arrival times past
# 1e15 s, gamma gaps that underflow to NaN), so they are refused up front rather than simulated.
RATE_RANGE = (1e-6, 1e9)          # effective arrival rate (rate x time_scale), req/s
TIME_SCALE_RANGE = (1e-6, 1e6)
BURSTINESS_RANGE = (1e-3, 1e3)    # gamma shape: interarrival CV from 31.6 down to 0.03
# Longest run, simulated seconds (116 days; the longest shipped run is an hour). The clock is float64 seconds: its
# spacing at 1e7 s (1.9e-9 s) is already 2e-5 of a 0.1 ms step and doubles with every doubling of the clock. A
# duration_s of 1e308 was taken, and a closed-loop run (no arrival count to bound it) ran without end.
DURATION_MAX_S = 1e7


def check_duration_s(v, src: str) -> None:
    """A run's ``duration_s`` (None: the run stops on its request count): a finite number of simulated seconds in
    (0, DURATION_MAX_S], else ConfigError naming ``src`` and the field. TrafficConfig and a Simulation built
    directly from Python both check it here."""
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ConfigError(src, "duration_s", f"expected a finite number > 0, got {v!r}")
    if v > DURATION_MAX_S:
        raise ConfigError(src, "duration_s", f"expected at most {DURATION_MAX_S:g} simulated seconds (116 days: "
                          "the simulated clock is float64 seconds, whose spacing there is already 2e-5 of a 0.1 "
                          f"ms step), got {v!r}")


def _in_range(name: str, v: float, lo_hi: tuple[float, float], what: str = "") -> None:
    lo, hi = lo_hi
    if not lo <= v <= hi:
        raise ConfigError(_SRC, name, f"{what or 'expected'} within [{lo:g}, {hi:g}], got {v!r}")


def _unused(mode: str, **fields) -> None:
    for name, v in fields.items():
        if v is not None:
            raise ConfigError(_SRC, name, f"has no meaning in mode {mode!r} (got {v!r}); leave it unset")


def user_steps_error(steps) -> str | None:
    """Why ``steps`` is not a valid closed-loop user schedule ``((t_s, users), ...)``; None when it is."""
    if not isinstance(steps, tuple) or not steps:
        return f"expected a non-empty tuple of (t_s, users) pairs, got {steps!r}"
    last = 0.0
    for i, st in enumerate(steps):
        if not (isinstance(st, tuple) and len(st) == 2):
            return f"step {i}: expected a (t_s, users) pair, got {st!r}"
        t, u = st
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= last:
            return f"step {i}: time {t!r} must be a finite number > {last:g} (times strictly increasing, > 0)"
        if isinstance(u, bool) or not isinstance(u, int) or u < 1:
            return f"step {i}: users {u!r} must be an integer >= 1"
        last = float(t)
    return None


@dataclass(frozen=True)
class TrafficConfig:
    """Load to put on the engine (the modes of ``vllm bench serve`` plus trace replay).

    mode: "closed" (``concurrency`` users, each sends its next request when its last one finishes) |
        "poisson" | "gamma" | "constant" (open loop at ``rate`` req/s) | "trace" (replay ``trace``'s timestamps).
    burstiness: gamma only, as ``vllm bench serve --burstiness``: gaps ~ Gamma(shape=burstiness,
        scale=1/(rate*burstiness)), mean 1/rate, CV = 1/sqrt(burstiness); 1 is Poisson, < 1 burstier.
    trace / trace_format: file to replay and its format ("azure" | "mooncake" | "lengths" needs timestamps, so
        only the first two replay; None = detect from extension/header). A shipped name also works
        ("azure-conv-window", "azure-code-window", "mooncake-window").
    mooncake_spread: Mooncake timestamps come in ~3 s groups. False fires each group at its timestamp; True spreads
        a group's n requests evenly over the gap to the next group (t_g + j*gap/n), the last group over the median
        gap. Only valid for Mooncake traces.
    time_scale: rate multiplier for open loop: arrival times are divided by it (2 = twice the load).
    lengths: where (prompt, output) lengths come from for synthetic arrivals and closed loop, resampled with
        replacement (request i's row from its keyed stream, traffic.base): a shipped name ("azure-conv" default,
        "azure-code", "sharegpt", "arxiv") or a path to any supported file. In trace mode None means the trace's
        own lengths; a value resamples instead.
    domain: "math" | "code" | "chat" | "mix:math=0.3,code=0.3,chat=0.4" (weights normalised, drawn per request
        from its keyed stream) |
        "trace" (the ``domain`` column of the file the lengths come from; an error if it has none).
    num_requests / duration_s: open loop stops at whichever comes first (one is required for synthetic arrivals;
        trace replay uses the whole file when neither is set). Closed loop: num_requests is the number of requests
        (the run ends when all are done); else duration_s (passed on to the engine) ends the run.
    max_prompt_tokens / max_output_tokens: a request over the limit is an InputError naming its source row —
        never clipped or dropped.
    max_concurrency: open loop with num_requests: the benchmark client's cap on requests in flight (an arrival
        that finds it reached waits in the client and is sent when one finishes). A closed loop is the same client
        at request rate inf (RunConfig.from_options maps --max-concurrency N --num-prompts P to it).
    num_warmup_prompts: with num_requests: that many unmeasured requests first (sent at once, capped); the
        measured ones start when they have finished (dsparksim.sim.cluster).
    dataset_name / random_input_len / random_output_len / random_range_ratio: "random": prompt and output lengths
        independent and uniform over the integers [max(1, int(R*L)), L] (SGLang bench_serving; vLLM up to 0.10),
        request i's from keyed block i // CHUNK of the ROW stream; replaces ``lengths``.
    pool_size: closed loop, optional: most requests a duration-bound run may issue (None = unlimited; requests
        are generated lazily as users need them). A run that uses them up before its duration is an error.
    user_steps: closed loop, optional: ``((t_s, users), ...)`` with strictly increasing times > 0: at t_s the
        number of users becomes ``users`` (``concurrency`` is the count from t = 0). A rise sends the new users'
        first requests at t_s; a fall retires users as their current requests finish (nothing is cancelled).
        A ramp is a sequence of small steps. Not a command-line option (the studies use it; see user_steps_error).
    domain_drift: optional ``(mix_b, i0, i1)``: the domain mix drifts with the request index i -- ``domain`` (a
        mix) for i < i0, ``mix_b`` (a domain spec, not 'trace') for i >= i1, the weights linear in i in between
        (i0 == i1: an abrupt change). Each request's domain is the inverse CDF of its keyed uniform under its own
        mix, so requests whose mix is equal get equal domains in every run. Indexed by request, not time, so it
        works in closed loop (where arrival times are not known when requests are drawn). Not a command-line
        option (study calibration-drift uses it).
    """

    # The option that sets the mode is --arrival (open loop); which load option is given picks the rest
    # (RunConfig.from_options).
    mode: str = option("closed", "--arrival", key="arrival", default=None, choices=OPEN_SYNTHETIC,
                       help="open-loop arrival process (needs a rate) [poisson, or gamma when --burstiness != 1]")
    concurrency: int | None = option(None, "--concurrency", parse=pos_int, kinds=INT, load=True,
                                     exclusive="load", help="closed loop with N concurrent users [32 if nothing else]")
    rate: float | None = option(None, "--rate", "--request-rate", parse=rate_or_inf, kinds=NUM, load=True,
                                exclusive="load", help="open loop, mean arrival rate in req/s; inf (with "
                                "--num-prompts) sends every prompt at once, as vllm bench serve")
    max_concurrency: int | None = option(None, "--max-concurrency", parse=pos_int, kinds=INT, metavar="N",
                                         help="vllm bench serve's cap: with --num-prompts, at most N requests in "
                                              "flight (the others wait in the client), at --request-rate [inf]; "
                                              "without --num-prompts, --concurrency N",
                                         frontier_help="with --rates and --num-prompts: at most N requests in flight "
                                                       "at every rate level, as vllm bench serve's cap (each "
                                                       "--concurrency-levels level is already the client's cap)")
    num_warmup_prompts: int = option(0, "--num-warmup-prompts", parse=nonneg_int, kinds=INT, metavar="N",
                                     help="with --num-prompts: N unmeasured warm-up requests first, all at once "
                                          "under the cap; the benchmark starts when they have finished [0]")
    dataset_name: str | None = option(None, "--dataset-name", parse=dataset_name, metavar="random",
                                      help="random: lengths uniform in [int(R*L), L] (--random-input-len, "
                                           "--random-output-len, --random-range-ratio) instead of --lengths")
    random_input_len: int | None = option(None, "--random-input-len", parse=pos_int, kinds=INT, metavar="L",
                                          help=f"random dataset: most prompt tokens [{RANDOM_DEFAULTS[0]}]")
    random_output_len: int | None = option(None, "--random-output-len", parse=pos_int, kinds=INT, metavar="L",
                                           help=f"random dataset: most output tokens [{RANDOM_DEFAULTS[1]}]")
    random_range_ratio: float | None = option(None, "--random-range-ratio", parse=range_ratio, kinds=NUM,
                                              metavar="R", help="random dataset: lengths uniform over the "
                                                                "integers [max(1, int(R*L)), L] [0]")
    burstiness: float = option(1.0, "--burstiness", parse=pos_float, kinds=NUM,
                               help="open loop: gamma shape (1 = Poisson, <1 burstier), as vllm bench serve "
                                    "[%(default)s]")
    trace: str | None = option(None, "--trace", exclusive="load",
                               help="replay an arrival trace: an Azure 2023 CSV or Mooncake JSONL path, or a shipped "
                                    "window (azure-conv-window, azure-code-window, mooncake-window)",
                               frontier_help="replay an arrival trace at each --time-scales level")
    trace_format: str | None = option(None)
    mooncake_spread: bool = option(False, "--mooncake-spread", switch=True, kinds=BOOL,
                                   help="Mooncake replay: spread each ~3 s timestamp group over the gap (default: "
                                        "fire at once)")
    time_scale: float = option(1.0, "--time-scale", default=None, parse=pos_float, kinds=NUM, load=True,
                               help="trace replay rate multiplier (needs --trace) [1]")
    lengths: str | None = option(None, "--lengths",
                                 help="prompt/output length source, resampled: azure-conv (shipped sample), "
                                      "azure-code, sharegpt, arxiv, or a CSV/JSONL path [azure-conv; a replayed "
                                      "trace's own lengths]")
    domain: str = option("chat", "--domain", default=DEFAULT_DOMAIN_OPTION,
                         help="domain of each request: math | code | chat | mix:math=W,code=W,chat=W [%(default)s]")
    num_requests: int | None = option(None, "--num-requests", "--num-prompts", parse=pos_int, kinds=INT,
                                      exclusive="stop", help="serve exactly N requests, then stop")
    duration_s: float | None = option(None, "--duration", parse=pos_float, kinds=NUM, exclusive="stop",
                                      help=f"simulated seconds [{DEFAULT_DURATION_S:g}]")
    max_prompt_tokens: int | None = option(None, kinds=INT)
    max_output_tokens: int | None = option(None, kinds=INT)
    pool_size: int | None = None
    user_steps: tuple[tuple[float, int], ...] | None = None
    domain_drift: tuple[str, int, int] | None = None

    def __post_init__(self) -> None:
        for name in INT_FIELDS:   # a numpy integer (a notebook's np.arange of loads) is stored as int
            v = getattr(self, name)
            if isinstance(v, numbers.Integral) and not isinstance(v, (bool, int)):
                object.__setattr__(self, name, int(v))
        m = self.mode
        if m not in MODES:
            raise ConfigError(_SRC, "mode", f"expected one of {MODES}, got {m!r}")
        _pos_float("burstiness", self.burstiness, required=True)
        _pos_float("time_scale", self.time_scale, required=True)
        _in_range("burstiness", self.burstiness, BURSTINESS_RANGE)
        _in_range("time_scale", self.time_scale, TIME_SCALE_RANGE)
        _pos_int("num_requests", self.num_requests)
        check_duration_s(self.duration_s, _SRC)
        _pos_int("max_prompt_tokens", self.max_prompt_tokens)
        _pos_int("max_output_tokens", self.max_output_tokens)
        if not isinstance(self.mooncake_spread, bool):
            raise ConfigError(_SRC, "mooncake_spread", f"expected True or False, got {self.mooncake_spread!r}")
        if self.lengths is not None and not isinstance(self.lengths, str):
            raise ConfigError(_SRC, "lengths", f"expected a shipped name or a path string, got {self.lengths!r}")
        parse_domain(self.domain)
        if self.domain_drift is not None:
            drift_error(self.domain, self.domain_drift)
        self._check_client()
        if self.burstiness != 1.0 and m != "gamma":
            raise ConfigError(_SRC, "burstiness", f"only applies to mode 'gamma' (got {self.burstiness!r} with mode "
                              f"{m!r}; gamma with burstiness 1 is Poisson)")
        if m != "trace":
            _unused(m, trace=self.trace, trace_format=self.trace_format)
            if self.mooncake_spread:
                raise ConfigError(_SRC, "mooncake_spread", f"only applies to mode 'trace', not {m!r}")
        if self.user_steps is not None:
            if m != "closed":
                raise ConfigError(_SRC, "user_steps", f"only applies to mode 'closed', not {m!r}")
            err = user_steps_error(self.user_steps)
            if err:
                raise ConfigError(_SRC, "user_steps", err)
            if self.num_warmup_prompts:
                raise ConfigError(_SRC, "user_steps", f"cannot be combined with num_warmup_prompts "
                                  f"({self.num_warmup_prompts!r}): the warm-up holds users back at its end")
        if m == "closed":
            _pos_int("concurrency", self.concurrency, required=True)
            _unused(m, rate=self.rate)
            _pos_int("pool_size", self.pool_size)
            if self.time_scale != 1.0:
                raise ConfigError(_SRC, "time_scale", "has no meaning in closed loop (there are no arrival times); "
                                  "change concurrency instead")
            if self.num_requests is None and self.pool_size is None and self.duration_s is None:
                raise ConfigError(_SRC, "num_requests/duration_s", "closed loop needs a stop rule: set "
                                  "num_requests or duration_s")
            if None not in (self.num_requests, self.pool_size) and self.num_requests != self.pool_size:
                raise ConfigError(_SRC, "pool_size", f"conflicts with num_requests ({self.pool_size} vs "
                                  f"{self.num_requests}); set one of them")
            return
        _unused(m, concurrency=self.concurrency, pool_size=self.pool_size)
        if m == "trace":
            _unused(m, rate=self.rate)
            if not isinstance(self.trace, str) or not self.trace:
                raise ConfigError(_SRC, "trace", f"mode 'trace' needs a trace file path or shipped name, got "
                                  f"{self.trace!r}")
            if self.trace_format is not None and self.trace_format not in FORMATS:
                raise ConfigError(_SRC, "trace_format", f"expected one of {FORMATS} or None, got "
                                  f"{self.trace_format!r}")
            return
        _pos_float("rate", self.rate, required=True)
        _in_range("rate", self.rate * self.time_scale, RATE_RANGE,
                  f"effective arrival rate (rate x time_scale = {self.rate!r} x {self.time_scale!r}) must lie")
        if self.num_requests is None and self.duration_s is None:
            raise ConfigError(_SRC, "num_requests/duration_s", f"mode {m!r} needs num_requests, duration_s or both")

    def _check_client(self) -> None:
        """The benchmark client's options: random dataset, cap and warm-up."""
        rnd = (self.random_input_len, self.random_output_len, self.random_range_ratio)
        if self.dataset_name is not None:
            if self.dataset_name != "random":
                raise ConfigError(_SRC, "dataset_name", f"only 'random' is simulated, got {self.dataset_name!r}")
            if self.lengths is not None:
                raise ConfigError(_SRC, "lengths", f"conflicts with dataset_name 'random' (lengths {self.lengths!r}); "
                                  "give one length source")
            if self.mode == "trace":
                raise ConfigError(_SRC, "dataset_name", "the random dataset has no arrival times; replaying a trace "
                                  "takes the trace's lengths or --lengths")
            _pos_int("random_input_len", self.random_input_len)
            _pos_int("random_output_len", self.random_output_len)
            if self.random_range_ratio is not None:
                r = self.random_range_ratio
                if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 <= r <= 1:
                    raise ConfigError(_SRC, "random_range_ratio", f"expected a fraction in [0, 1], got {r!r}")
        elif any(v is not None for v in rnd):
            name = ("random_input_len", "random_output_len", "random_range_ratio")[
                next(i for i, v in enumerate(rnd) if v is not None)]
            if self.lengths is not None:
                raise ConfigError(_SRC, name, f"is a random-dataset length and conflicts with lengths "
                                  f"{self.lengths!r}: give one length source")
            raise ConfigError(_SRC, name, "applies to the random dataset: set dataset_name 'random' (--dataset-name "
                              "random)")
        if self.max_concurrency is not None:
            _pos_int("max_concurrency", self.max_concurrency)
            if self.mode not in OPEN_SYNTHETIC:
                raise ConfigError(_SRC, "max_concurrency", f"caps open-loop arrivals; mode {self.mode!r} has none "
                                  "(a closed loop's users are its cap)")
            if self.num_requests is None:
                raise ConfigError(_SRC, "max_concurrency", "caps a finite benchmark: set num_requests (--num-prompts)")
        w = self.num_warmup_prompts
        if isinstance(w, bool) or not isinstance(w, int) or w < 0:
            raise ConfigError(_SRC, "num_warmup_prompts", f"expected an integer >= 0, got {w!r}")
        if w and (self.num_requests is None or self.mode == "trace"):
            raise ConfigError(_SRC, "num_warmup_prompts", "warm-up prompts precede a finite benchmark: set "
                              "num_requests (--num-prompts)" + (" (not with trace replay)" if self.mode == "trace"
                                                                else ""))

    @property
    def input_len(self) -> int:
        """Random dataset: the most prompt tokens (vLLM's default when not given)."""
        return self.random_input_len or RANDOM_DEFAULTS[0]

    @property
    def output_len(self) -> int:
        """Random dataset: the most output tokens (vLLM's default when not given)."""
        return self.random_output_len or RANDOM_DEFAULTS[1]

    @property
    def range_ratio(self) -> float:
        return float(self.random_range_ratio or 0.0)

    @property
    def total_requests(self) -> int | None:
        """Requests the run issues: the measured ones plus the warm-up."""
        return None if self.num_requests is None else self.num_requests + self.num_warmup_prompts

    @property
    def closed_loop(self) -> bool:
        return self.mode == "closed"
