"""bench_result.json: a run in the exact shape of `vllm bench serve --save-result --save-detailed`.

Keys and meanings follow vLLM's benchmark client, vllm/benchmarks/serve.py (vllm-project/vllm, read at commit
009e6d4a1cd6ba3fb2a9fc00f4ec06f5297232a1): `main_async` writes the setup keys (date .. max_concurrency),
`benchmark` the result keys (duration .. rtfx), the `spec_decode_*` keys from the server's Prometheus counter
deltas, and `process_one_metric` the mean/median/std/pNN_<metric>_ms statistics. We write the statistics of
ttft, tpot, itl and e2el at the 99th percentile (as `--percentile-metrics ttft,tpot,itl,e2el
--metric-percentiles 99`), and no goodput (no `--goodput` SLO: `request_goodput` is null, as in vLLM).

Which requests: the benchmark's prompts are the requests issued inside the measurement window (arrival at or
after the warm-up -- with --num-warmup-prompts, after the warm-up requests finished; every request in a
--num-prompts run). Each list has one entry per prompt, in issue order. A prompt is `completed` if it finished
before the run ended; `failed` counts the requests the server refused (prompt + output beyond max_model_len or
the KV capacity: vLLM answers 400, an error in the client). A duration-bounded run also stops with requests still
queued or being served, which vLLM's client (it waits for every prompt) never has: they stay in the lists with
their reason in `errors` ("unfinished ..." / "not admitted ..."), and count as neither completed nor failed, so
completed + failed + those = num_prompts. As in vLLM a request that did not complete has output length 0,
latency 0 and the TTFT / ITLs it had received so far (TTFT 0.0 if none), and every statistic uses completed
requests only. One difference: a statistic with no samples is null, where vLLM writes 0.

`duration` is the benchmark's: from the window's start (0, the warm-up's end, or the warm-up prompts' end) to the
run's end (the last request's finish in a --num-prompts run). `output_throughput` = total_output_tokens /
duration, as vLLM: in a --num-prompts run it equals summary.json's output_throughput_tok_s; in a duration-bounded
run summary.json counts every token emitted in the window (also those of requests that arrived before it or were
still running at its end), this file only the tokens of requests that arrived in it and completed.

Options as `vllm bench serve`'s: ``percentiles`` (--metric-percentiles), ``metrics`` (--percentile-metrics; we
default to ttft,tpot,itl,e2el), ``label`` (--label), ``metadata`` (--metadata KEY=VALUE: added keys) and
``goodput`` (--goodput KEY:VALUE in ms for ttft / tpot / e2el): request_goodput = completed requests within every
SLO / duration, a request with one output token having TPOT 0 (vLLM's rule).
"""
from __future__ import annotations

import bisect
import json
import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from dsparksim.sim.cluster import SimResult
from dsparksim.sim.kv import REJECT_REASONS
from dsparksim.errors import ConfigError
from dsparksim.results.outputs import atomic_write

# The keys vLLM writes (setup, result, spec decode, statistics), in its order.
SETUP_KEYS = ("date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts",
              "request_rate", "burstiness", "max_concurrency")
RESULT_KEYS = ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
               "request_goodput", "output_throughput", "total_token_throughput", "input_lens", "output_lens",
               "ttfts", "itls", "latencies", "start_times", "queue_times", "generated_texts", "errors",
               "max_output_tokens_per_s", "max_concurrent_requests", "rtfx")
SPEC_DECODE_KEYS = ("spec_decode_acceptance_rate", "spec_decode_acceptance_length", "spec_decode_num_drafts",
                    "spec_decode_draft_tokens", "spec_decode_accepted_tokens",
                    "spec_decode_per_position_acceptance_rates")
STAT_METRICS = ("ttft", "tpot", "itl", "e2el")
PERCENTILES = (99,)
STAT_KEYS = tuple(f"{s}_{m}_ms" for m in STAT_METRICS
                  for s in ("mean", "median", "std", *(f"p{p}" for p in PERCENTILES)))
ALL_KEYS = SETUP_KEYS + RESULT_KEYS + SPEC_DECODE_KEYS + STAT_KEYS


class ItlLists(Sequence):
    """``itls``: per prompt, the dt of every step it decoded in, as a lazy sequence of lists.

    A long run has millions of ITL samples; as Python lists they took most of a 1-hour run's memory. Entries are
    built on access, and :func:`write_bench_json` streams them to the file one prompt at a time. ``own``: the
    lists of the few prompts that are not one run of steps (preempted: one gap per preemption), as given.
    """

    def __init__(self, dt: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                 own: dict[int, list[float]] | None = None) -> None:
        self._dt, self._lo, self._hi = dt, np.asarray(lo, np.int64), np.asarray(hi, np.int64)
        self._own = own or {}

    def __len__(self) -> int:
        return len(self._lo)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if self._own and (i + len(self) if i < 0 else i) in self._own:
            return list(self._own[i + len(self) if i < 0 else i])
        return self._dt[self._lo[i]:self._hi[i]].tolist()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and len(other) == len(self) and all(
            list(a) == list(b) for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]

    def n_samples(self) -> int:
        return int((self._hi - self._lo).sum()) + sum(
            len(v) - int(self._hi[i] - self._lo[i]) for i, v in self._own.items())

    def json_items(self):
        """Each prompt's list as JSON text, exactly ``json.dumps(self[i], allow_nan=False)``."""
        if not np.isfinite(self._dt).all():  # json.dumps raises on NaN/inf: let it, with its own message
            for i in range(len(self)):
                yield json.dumps(self[i], allow_nan=False)
            return
        joined, at = self._joined()
        text = joined.decode("ascii")
        for i, (a, b) in enumerate(zip(self._lo.tolist(), self._hi.tolist())):
            if i in self._own:
                yield json.dumps(self._own[i], allow_nan=False)
            else:
                yield "[" + text[at[a]:at[b] - 2] + "]" if b > a else "[]"

    def _joined(self) -> tuple[bytes, list[int]]:
        """Every step's dt as JSON text joined by ", " (ASCII bytes), and where each step's text starts in it.

        A step's dt appears in the list of every request decoding in that step, so each dt is formatted once
        (json formats a float with float.__repr__ and joins a list with ", "); formatting every sample took
        most of the time of writing a long run's results. A prompt's steps are consecutive, so its list is one
        slice of that text."""
        reps = list(map(float.__repr__, self._dt.tolist()))
        at = np.zeros(len(reps) + 1, np.int64)
        np.cumsum(np.fromiter(map(len, reps), np.int64, len(reps)) + 2, out=at[1:])
        return ", ".join(reps).encode("ascii"), at.tolist()

    def write_json(self, f) -> None:
        """Write the lists as one JSON array to the binary file ``f``: the bytes of ``"[" + ", ".join(
        json_items()) + "]"``, each prompt's list a slice of the joined text (no per-prompt string is built)."""
        if not np.isfinite(self._dt).all():
            f.write(("[" + ", ".join(self.json_items()) + "]").encode("ascii"))   # raises json's ValueError
            return
        own = {i: json.dumps(v, allow_nan=False).encode("ascii") for i, v in self._own.items()}
        joined, at = self._joined()
        view = memoryview(joined)
        parts: list[Any] = [b"["]
        sep = b""
        for i, (a, b) in enumerate(zip(self._lo.tolist(), self._hi.tolist())):
            if i in own:
                parts += (sep, own[i])
            elif b > a:
                parts += (sep, b"[", view[at[a]:at[b] - 2], b"]")
            else:
                parts += (sep, b"[]")
            sep = b", "
            if len(parts) > 4096:   # a few MB at a time: one copy into the file's buffer, no big string
                f.write(b"".join(parts))
                parts = []
        parts.append(b"]")
        f.write(b"".join(parts))


def write_bench_json(path, d: dict[str, Any]) -> None:
    """Write a bench_result dict as JSON, one key per line, streaming ``itls`` (vLLM's file has no indent)."""

    def write(p) -> None:
        with open(p, "wb") as f:
            f.write(b"{")
            for n, (k, v) in enumerate(d.items()):
                f.write((("," if n else "") + "\n" + json.dumps(k) + ": ").encode("ascii"))
                if isinstance(v, ItlLists):
                    v.write_json(f)
                else:
                    f.write(json.dumps(v, allow_nan=False).encode("ascii"))
            f.write(b"\n}\n")

    atomic_write(path, write)


def _pkey(p: float) -> str:
    """vLLM's percentile key: p99, p99.9, p50 (``str(int(p)) if int(p) == p else str(p)``)."""
    return f"p{int(p) if float(p).is_integer() else p}"


def _stats(prefix: str, x: list[float] | np.ndarray, percentiles: Sequence[float] = PERCENTILES
           ) -> dict[str, float | None]:
    """vLLM's mean / median / std (population) / percentile (linear) in ms; null without samples."""
    a = np.asarray(x, float)
    if not a.size:
        return {f"{s}_{prefix}_ms": None for s in ("mean", "median", "std", *(_pkey(p) for p in percentiles))}
    out = {f"mean_{prefix}_ms": float(a.mean()) * 1000, f"median_{prefix}_ms": float(np.median(a)) * 1000,
           f"std_{prefix}_ms": float(a.std()) * 1000}
    for p in percentiles:
        out[f"{_pkey(p)}_{prefix}_ms"] = float(np.percentile(a, p)) * 1000
    return out


def _metric_stats(metrics: Sequence[str], percentiles: Sequence[float], ttft: np.ndarray, tpot: np.ndarray,
                  itl: tuple[PooledSamples, np.ndarray, np.ndarray], e2el: np.ndarray) -> dict[str, float | None]:
    """The statistics of ``metrics``, in vLLM's order; ``itl``: (the pooled samples, each step's dt, the samples
    of each step)."""
    d: dict[str, float | None] = {}
    for m, vals in (("ttft", ttft), ("tpot", tpot), ("itl", itl[0]), ("e2el", e2el)):
        if m in metrics:
            d.update(_stats_of_repeats(m, *itl, percentiles) if m == "itl" else _stats(m, vals, percentiles))
    return d


def _gap_itls(res: SimResult, idx: np.ndarray, lo: np.ndarray, hi: np.ndarray, dt: np.ndarray
              ) -> tuple[dict[int, list[float]], list[tuple[int, int, int]]]:
    """The ITL lists of the prompts a preemption paused (paged KV): the steps it missed, up to the one whose
    re-prefill streamed its next token, are one gap -- one chunk, one ITL sample, their summed dt (vLLM's client
    sees nothing in between); a gap still open at the end of the run ends its list. Also each gap's prompt and
    step range [first missed, streaming step] (streaming step -1: open), clipped to the prompt's own steps."""
    own: dict[int, list[float]] = {}
    spans: list[tuple[int, int, int]] = []
    if res.gap_request is None or res.gap_steps is None or not len(res.gap_request):
        return own, spans
    where = {int(k): j for j, k in enumerate(idx.tolist())}
    by_prompt: dict[int, list[tuple[int, int]]] = {}
    for k, (p, q) in zip(res.gap_request.tolist(), res.gap_steps.tolist()):
        if k in where:
            by_prompt.setdefault(where[k], []).append((p, q))
    for j, gaps in sorted(by_prompt.items()):
        a, b = int(lo[j]), int(hi[j])
        out: list[float] = []
        s = a
        for p, q in sorted(gaps):
            if p >= b or p < s:
                continue
            out += dt[s:p].tolist()
            if 0 <= q < b:
                out.append(float(dt[p:q + 1].sum()))
                spans.append((j, p, q))
                s = q + 1
            else:
                spans.append((j, p, -1))
                s = b
                break
        own[j] = out + dt[s:b].tolist()
    return own, spans


def _mean_std(a: np.ndarray) -> tuple[float, float]:
    """``float(a.mean()), float(a.std())`` of a 1-d float64 array, by numpy's own operations in its order (sum / n;
    the sum of the squared deviations from that mean / n; its square root): bitwise the same numbers, with the
    mean summed once."""
    n = a.size
    mean = np.add.reduce(a, axis=None) / n
    x = np.subtract(a, mean)
    np.square(x, out=x)
    return float(mean), float(np.sqrt(np.add.reduce(x, axis=None) / n))


class PooledSamples:
    """``dt[lo[0]:hi[0]], dt[lo[1]:hi[1]], ...`` one after another (the ITL samples of those requests; ``own[j]``
    instead of request j's slice where given), without building that array (:meth:`array` builds it): a long run
    has ~10^7 ITL samples, and allocating and filling them took more time than the arithmetic.

    :meth:`mean_std` sums them as numpy sums the whole array -- pairwise: an array of more than 128 items is the
    sum of its two halves, the first half's length rounded down to a multiple of 8 (numpy's ``pairwise_sum``,
    after an initial 0.0) -- with each part of at most ``CHUNK`` items built in one reused buffer and summed by
    numpy itself, so bitwise the numbers of ``array().mean()`` and ``.std()``
    (tests/test_bench_result.py checks it against numpy)."""

    CHUNK = 1 << 16

    def __init__(self, dt: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                 own: dict[int, list[float]] | None = None) -> None:
        self._segs: list[np.ndarray] = list(map(dt.__getitem__, map(slice, np.asarray(lo).tolist(),
                                                                          np.asarray(hi).tolist())))
        for j, v in (own or {}).items():
            if 0 <= j < len(self._segs):
                self._segs[j] = np.asarray(v, float)
        lens = np.fromiter(map(len, self._segs), np.int64, len(self._segs))
        self._off: list[int] = np.concatenate([[0], np.cumsum(lens)]).tolist()
        self.size: int = self._off[-1]

    def array(self) -> np.ndarray:
        return np.concatenate(self._segs) if self._segs else np.zeros(0)

    def _fill(self, start: int, n: int, buf: np.ndarray) -> np.ndarray:
        """Samples [start, start + n) in ``buf[:n]``."""
        off, end = self._off, start + n
        j0, j1 = bisect.bisect_right(off, start) - 1, bisect.bisect_left(off, end)
        parts = self._segs[j0:j1]
        parts[-1] = parts[-1][:end - off[j1 - 1]]
        parts[0] = parts[0][start - off[j0]:]
        return np.concatenate(parts, out=buf[:n])

    def _sum(self, start: int, n: int, buf: np.ndarray, mean: np.float64 | None) -> np.float64:
        """numpy's pairwise sum of samples [start, start + n) (``mean`` given: of their squared deviations)."""
        if n > self.CHUNK:
            half = n // 2
            half -= half % 8
            return self._sum(start, half, buf, mean) + self._sum(start + half, n - half, buf, mean)
        x = self._fill(start, n, buf)
        if mean is not None:
            np.subtract(x, mean, out=x)
            np.square(x, out=x)
        return np.add.reduce(x)

    def mean_std(self) -> tuple[float, float]:
        """``float(a.mean()), float(a.std())`` of the samples (:func:`_mean_std` of the built array)."""
        n = self.size
        if not n:
            return math.nan, math.nan     # numpy: nan (with a warning)
        buf = np.empty(min(n, self.CHUNK))
        mean = (np.float64(0.0) + self._sum(0, n, buf, None)) / n
        var = (np.float64(0.0) + self._sum(0, n, buf, mean)) / n
        return float(mean), float(np.sqrt(var))


def _stats_of_repeats(prefix: str, pool: np.ndarray | PooledSamples, values: np.ndarray, counts: np.ndarray,
                      percentiles: Sequence[float] = PERCENTILES) -> dict[str, float | None]:
    """:func:`_stats` of ``pool``, a sample in which ``values[j]`` occurs ``counts[j]`` times (the ITL samples: each
    step's dt once per completed request decoding in it): the same numbers, the median and percentiles read from
    the sorted values and their cumulative counts instead of partitioning millions of samples. The mean and std
    still run over ``pool`` (their sums depend on its order); numpy's median (the mean of the middle one or two)
    and linear percentile (``_lerp`` of the two neighbours of (N - 1) q / 100) are done with its operations."""
    a = pool if isinstance(pool, PooledSamples) else np.asarray(pool, float)
    values = np.asarray(values, float)
    counts = np.asarray(counts, np.int64)
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(counts[order])
    if not a.size or not np.isfinite(values).all() or int(cum[-1]) != a.size or (counts < 0).any():
        a = a.array() if isinstance(a, PooledSamples) else a
        return _stats(prefix, a, percentiles)       # NaN's ordering, or not that sample: numpy's own path
    srt, n = values[order], a.size

    def kth(k: int) -> np.float64:                  # the k-th smallest sample (0-based)
        return srt[np.searchsorted(cum, k, "right")]

    mid = [kth((n - 1) // 2)] if n % 2 else [kth(n // 2 - 1), kth(n // 2)]
    mean, std = a.mean_std() if isinstance(a, PooledSamples) else _mean_std(a)
    out = {f"mean_{prefix}_ms": mean * 1000, f"median_{prefix}_ms": float(np.mean(np.array(mid))) * 1000,
           f"std_{prefix}_ms": std * 1000}
    for p in percentiles:
        virtual = (n - 1) * np.asanyarray(np.true_divide(p, 100))
        lo = np.floor(virtual)
        below, above = (kth(n - 1), kth(n - 1)) if virtual >= n - 1 else (kth(int(lo)), kth(int(lo) + 1))
        t = float(virtual - lo)
        diff = above - below
        v = above - diff * (1 - t) if t >= 0.5 else below + diff * t
        out[f"{_pkey(p)}_{prefix}_ms"] = float(v) * 1000
    return out


GOODPUT_METRICS = ("ttft", "tpot", "e2el")


def parse_goodput(items: Sequence[str]) -> dict[str, float]:
    """``["ttft:500", "tpot:50"]`` -> {"ttft": 500.0, "tpot": 50.0} (ms), as vllm bench serve --goodput;
    a ConfigError naming the bad item otherwise."""

    out: dict[str, float] = {}
    for it in items:
        k, sep, v = str(it).partition(":")
        if not sep or k not in GOODPUT_METRICS:
            raise ConfigError("cli", "--goodput", f"expected KEY:VALUE with KEY in {', '.join(GOODPUT_METRICS)} "
                              f"(milliseconds), got {it!r}")
        try:
            x = float(v)
        except ValueError:
            raise ConfigError("cli", "--goodput", f"{k}: expected milliseconds, got {v!r}") from None
        if not (math.isfinite(x) and x >= 0):
            raise ConfigError("cli", "--goodput", f"{k}: expected a finite number of milliseconds >= 0, got {v!r}")
        out[k] = x
    return out


def _error(res: SimResult, i: int, t_end: float) -> str:
    if math.isfinite(res.finish_s[i]):
        return ""
    reason = getattr(res, "reject_reason", None)  # set by an engine that rejects unservable requests
    if reason is not None and reason[i]:
        return f"rejected: {REJECT_REASONS.get(int(reason[i]), int(reason[i]))}"
    if not math.isfinite(res.admitted_s[i]):
        return f"not admitted before the run ended at {t_end:.3f} s"
    return (f"unfinished when the run ended at {t_end:.3f} s "
            f"({int(res.emitted_tokens[i])} of {int(res.output_tokens[i])} tokens)")


def _errors(res: SimResult, idx: np.ndarray, ok: np.ndarray, t_end: float) -> list[str]:
    """:func:`_error` of every prompt ``idx`` (``ok``: finished, no error)."""
    out = [""] * len(idx)
    for j in np.flatnonzero(~ok).tolist():
        out[j] = _error(res, int(idx[j]), t_end)
    return out


def _peak_chunks_per_s(starts: np.ndarray, first: np.ndarray, step_end: np.ndarray, n_in_step: np.ndarray,
                       ok: np.ndarray, finish: np.ndarray) -> tuple[float, int]:
    """vLLM's max_output_tokens_per_s and max_concurrent_requests over completed requests.

    vLLM buckets every streamed chunk (first token + one per ITL entry) into 1-second bins from the earliest send
    and takes the fullest bin; with speculative decoding a chunk carries several tokens but counts once, as in
    vLLM. Concurrency uses the same bins: a request counts in every bin from int(send - t0) to int(finish - t0),
    both included, and the peak is the fullest bin -- the requests active at any moment of that second, not the
    most in flight at one instant (vLLM's meaning: a closed loop of N users with short requests reads above N).
    """
    if not ok.any():
        return 0.0, 0
    t0 = float(starts[ok].min())
    nb = int(math.ceil(float(finish[ok].max()) - t0)) + 1
    fb = (first[ok] - t0).astype(np.int64)
    fb = fb[(fb >= 0) & (fb < nb)]
    sb = np.floor(step_end - t0).astype(np.int64)
    keep = (sb >= 0) & (sb < nb) & (n_in_step > 0)
    # Sparse 1-second bins: a long idle run (e.g. a very low arrival rate) spans far more seconds than it has chunks.
    keys, inv = np.unique(np.concatenate([fb, sb[keep]]), return_inverse=True)
    bins = np.zeros(len(keys))
    np.add.at(bins, inv, np.concatenate([np.ones(len(fb)), n_in_step[keep].astype(float)]))
    # Concurrency bins [int(send - t0), int(finish - t0)] as events (+1 at the first bin, -1 after the last),
    # leaving before entering at one bin index; the running sum after each event is a bin's count.
    first_bin = (starts[ok] - t0).astype(np.int64)
    last_bin = (finish[ok] - t0).astype(np.int64)
    ev = np.concatenate([np.stack([first_bin, np.ones_like(first_bin)], 1),
                         np.stack([last_bin + 1, -np.ones_like(last_bin)], 1)])
    ev = ev[np.lexsort((ev[:, 1], ev[:, 0]))]
    return float(bins.max()), int(np.cumsum(ev[:, 1]).max())


def _step_spans(res: SimResult, idx: np.ndarray, t_start: np.ndarray, first: np.ndarray, fin: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """[lo, hi): the steps of its own engine that each request decoded in. The log holds every engine's steps,
    engine by engine (each block in time order), so a request is searched in its engine's block only."""
    n_steps = len(t_start)
    eng_steps = _engine_of_steps(res)
    if eng_steps is None:
        blocks, eng_req = {0: (0, n_steps)}, np.zeros(len(idx), np.int64)
    else:
        bounds = np.flatnonzero(np.diff(eng_steps)) + 1
        starts = np.concatenate([[0], bounds])
        ends = np.concatenate([bounds, [n_steps]])
        blocks = {int(eng_steps[a]): (int(a), int(b)) for a, b in zip(starts, ends)}
        dp = max(1, int(res.dp_ranks))
        eng_req = (res.replica[idx] * dp + (res.dp_rank[idx] if res.dp_rank is not None else 0)).astype(np.int64)
    lo = np.full(len(idx), n_steps, np.int64)
    hi = np.full(len(idx), n_steps, np.int64)
    for e, (a, b) in blocks.items():
        sel = eng_req == e
        ts = t_start[a:b]
        f, g = first[sel], fin[sel]
        # not started / not finished: up to the end of its engine's block (never into another engine's steps)
        lo[sel] = np.where(np.isfinite(f), a + np.searchsorted(ts, np.nan_to_num(f, nan=np.inf), "left"), b)
        hi[sel] = np.where(np.isfinite(g), a + np.searchsorted(ts, np.nan_to_num(g, nan=np.inf), "left"), b)
    return lo, np.maximum(hi, lo)


def _engine_of_steps(res: SimResult) -> np.ndarray | None:
    st = res.steps
    if res.replica is None or "replica" not in st or (res.replicas <= 1 and res.dp_ranks <= 1):
        return None
    dp = max(1, int(res.dp_ranks))
    return np.asarray(st["replica"], np.int64) * dp + np.asarray(st.get("rank", 0), np.int64)


def bench_result(res: SimResult, *, warmup_s: float, duration_s: float, model_id: str, request_rate: Any,
                 burstiness: Any, max_concurrency: Any, backend: str = "dsparksim",
                 date: str | None = None, percentiles: Sequence[float] = PERCENTILES,
                 metrics: Sequence[str] = STAT_METRICS, label: str | None = None,
                 goodput: dict[str, float] | None = None, metadata: dict[str, Any] | None = None
                 ) -> dict[str, Any]:
    """The run as `vllm bench serve --save-result --save-detailed` writes it (see the module doc)."""
    arr = res.arrival_s
    idx = np.flatnonzero(np.isfinite(arr) & (arr >= warmup_s))
    idx = idx[np.argsort(arr[idx], kind="stable")]
    st = res.steps
    t_start = np.asarray(st["t_start"], float)
    dt = np.asarray(st["dt"], float)
    t_end = res.sim_time_s
    ok = np.isfinite(res.finish_s[idx])
    first = res.first_token_s[idx]
    fin = res.finish_s[idx]
    # A decoding request is in every step from the one starting at its first token to the one ending at its finish
    # (the engine never skips a decoding request): one streamed chunk, and one ITL sample of dt, per step; but a
    # preempted request's missed steps, to the re-prefill streaming its next token, are one gap (_gap_itls).
    lo, hi = _step_spans(res, idx, t_start, first, fin)
    itls, itl_pool, chunks, itl_values = _itl_parts(res, idx, ok, lo, hi, dt)
    ttfts = np.where(np.isfinite(first), first - arr[idx], 0.0)
    lat = np.where(ok, fin - arr[idx], 0.0)
    out_lens = np.where(ok, res.output_tokens[idx], 0).astype(np.int64)
    in_lens = res.prompt_tokens[idx].astype(np.int64)
    completed = int(ok.sum())
    reason = getattr(res, "reject_reason", None)
    refused = int(np.count_nonzero(reason[idx])) if reason is not None else 0
    total_in, total_out = int(in_lens[ok].sum()), int(out_lens.sum())
    multi = ok & (out_lens > 1)  # TPOT needs a token after the first
    tpots = (lat[multi] - ttfts[multi]) / (out_lens[multi] - 1)
    peak_tok, peak_conc = _peak_chunks_per_s(arr[idx], first, t_start + dt, chunks, ok, fin)
    dur = float(duration_s)
    d: dict[str, Any] = {
        "date": date or time.strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": backend,
        "backend": backend,
        "label": label,
        "model_id": model_id,
        "tokenizer_id": model_id,
        "num_prompts": int(len(idx)),
        "request_rate": request_rate,
        "burstiness": burstiness,
        "max_concurrency": max_concurrency,
        "duration": dur,
        "completed": completed,
        "failed": refused,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": completed / dur,
        "request_goodput": None if goodput is None else _goodput(goodput, ttfts[ok], lat[ok], out_lens[ok]) / dur,
        "output_throughput": total_out / dur,
        "total_token_throughput": (total_in + total_out) / dur,
        "input_lens": in_lens.tolist(),
        "output_lens": out_lens.tolist(),
        "ttfts": ttfts.tolist(),
        "itls": itls,
        "latencies": lat.tolist(),
        "start_times": arr[idx].tolist(),
        "queue_times": [0.0] * len(idx),  # client-side semaphore wait: the simulated client never waits
        "generated_texts": [""] * len(idx),  # no text is generated
        "errors": _errors(res, idx, ok, t_end),
        "max_output_tokens_per_s": peak_tok,
        "max_concurrent_requests": peak_conc,
        "rtfx": 0.0,
    }
    d.update(_spec_decode(res, warmup_s))  # absent when no draft token was verified, as in vLLM
    d.update(_metric_stats(metrics, percentiles, ttfts[ok], tpots, (itl_pool, *itl_values), lat[ok]))
    for k, v in (metadata or {}).items():   # vLLM: --metadata KEY=VALUE pairs are added to the result
        d[k] = v
    return d


def _itl_parts(res: SimResult, idx: np.ndarray, ok: np.ndarray, lo: np.ndarray, hi: np.ndarray, dt: np.ndarray
               ) -> tuple[ItlLists, PooledSamples, np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """The prompts' ITL lists; the completed prompts' pooled ITL samples; the chunks they streamed per step (for
    max_output_tokens_per_s); and that pool as (values, counts): each step's dt with the number of completed
    prompts whose ITL it is, then each preemption gap's sample once (:func:`_stats_of_repeats`)."""
    n_steps = len(dt)
    own, spans = _gap_itls(res, idx, lo, hi, dt)
    itls = ItlLists(dt, lo, hi, own)
    done_own = {j: v for j, v in own.items() if ok[j]}
    pos = np.flatnonzero(ok)
    pool = PooledSamples(dt, lo[ok], hi[ok], {int(np.searchsorted(pos, j)): v for j, v in done_own.items()})
    # Chunks per step from completed requests (difference array over their step ranges), less the steps a
    # preemption paused them in; a gap's last step streams a chunk whose ITL is the gap, not that step's dt
    diff = np.zeros(n_steps + 1)
    np.add.at(diff, lo[ok], 1)
    np.add.at(diff, hi[ok], -1)
    itl_diff = diff.copy()
    gap_values = []
    for j, p, q in spans:
        if ok[j]:                      # a completed request's gaps are closed
            diff[p] -= 1
            diff[q] += 1
            itl_diff[p] -= 1
            itl_diff[q + 1] += 1
            gap_values.append(float(dt[p:q + 1].sum()))
    chunks = np.cumsum(diff)[:n_steps]
    counts = np.concatenate([np.cumsum(itl_diff)[:n_steps], np.ones(len(gap_values))]).astype(np.int64)
    return itls, pool, chunks, (np.concatenate([dt, np.asarray(gap_values, float)]), counts)


def _goodput(slo_ms: dict[str, float], ttft: np.ndarray, lat: np.ndarray, out_lens: np.ndarray) -> int:
    """Completed requests within every SLO (vLLM: TPOT 0 for a one-token output; a value equal to the SLO
    passes)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out_lens > 1, (lat - ttft) / np.maximum(out_lens - 1, 1), 0.0)
    good = np.ones(len(ttft), bool)
    for k, v in slo_ms.items():
        x = {"ttft": ttft, "tpot": tpot, "e2el": lat}[k] * 1000
        good &= x <= v
    return int(good.sum())


def _spec_decode(res: SimResult, warmup_s: float) -> dict[str, Any]:
    """vLLM's spec_decode_* keys: the server's counters over the window (steps ending after the warm-up).

    A draft is one request verifying >= 1 draft token in a step; draft tokens are the tokens verified (a policy
    may verify fewer than the K drafted; vLLM verifies all it drafts); acceptance rate is in percent, acceptance
    length = 1 + accepted / drafts, per-position rate = drafts accepting position p / drafts.
    """
    st = res.steps
    win = (np.asarray(st["t_start"], float) + np.asarray(st["dt"], float)) > warmup_s
    drafts = int(np.asarray(st["drafts"])[win].sum()) if "drafts" in st else 0
    draft_tok = int(np.asarray(st["verify_tokens"])[win].sum())
    acc = int(np.asarray(st["accepted"])[win].sum()) if "accepted" in st else 0
    pos = res.step_accepted_per_pos
    per_pos = pos[win].sum(0) if pos is not None and len(pos) == len(win) else np.zeros(0)
    if not draft_tok:
        return {}
    return {
        "spec_decode_acceptance_rate": 100.0 * acc / draft_tok,
        "spec_decode_acceptance_length": 1.0 + acc / drafts if drafts else 0.0,
        "spec_decode_num_drafts": drafts,
        "spec_decode_draft_tokens": draft_tok,
        "spec_decode_accepted_tokens": acc,
        "spec_decode_per_position_acceptance_rates": (per_pos / drafts).tolist() if drafts else [],
    }
