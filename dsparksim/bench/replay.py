"""``bench replay``: simulate every selected run of a runs table as its client ran it, and compare.

Each row becomes a :class:`~dsparksim.bench.client.ClientWorkload` (random dataset, range ratio, prompts, cap,
rate, warm-up) on the given profile, with the policy its speculative config maps to
(:func:`dsparksim.bench.spec.map_row`; plain decoding for MTP-off rows). :func:`replay` returns one row per run
with the measured value, the simulated value and the relative error (simulated / measured - 1) of each metric.

What a row must carry (else one line naming the run and the field, before anything is simulated): the random
dataset (dataset_name random or empty, random_input_len, random_output_len; range convention ``low`` =
[int(R*L), L], the only one simulated), num_prompts, and max_concurrency or request_rate. Filled in and said so
in the ``notes`` column: a missing range ratio is 0 (a vLLM run's: vLLM's default, every length L, i.e. 1 in
[int(R*L), L]); a missing request rate with a cap is inf; a missing
ignore_eos is taken as true; the warm-up count changes nothing measured (the server is empty when the benchmark
starts), so a missing one is 0.

A DP-attention run (``dp_attention`` true) is simulated as its engine ran: ``tp`` attention DP ranks stepped in
lockstep (``--dp-ranks``), each batching its own requests, on a profile that prices one of them
(``metadata.data_parallel`` = tp, ``tensor_parallel`` 1); any other profile, or a DP profile for a run without DP
attention, is refused naming the run and ``dp_attention`` (:func:`check_dp`).

Server settings are the caller's for every run; no ``chunked_prefill_size`` = the profile's token budget,
as ``profile fit`` simulates by default.
"""
from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from dsparksim.acceptance import load_acceptance
from dsparksim.bench.client import ClientWorkload, ServerSettings, engine_mixes_prefill, is_trtllm, run_client
from dsparksim.errors import ConfigError, InputError
from dsparksim.bench.runs import read_runs
from dsparksim.cost.analytic.hardware import gpu_mismatch, same_gpu
from dsparksim.bench.spec import map_row
from dsparksim.cost.profile import load_profile

# metric of the runs table -> key of ClientRun.metrics
METRICS = ("mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms",
           "mean_e2el_ms", "median_e2el_ms", "p99_e2el_ms", "output_throughput", "output_throughput_per_gpu",
           "duration_s")
KEYS = ("run_id", "model", "gpu", "gpu_count", "tp", "ep", "dp_attention", "engine", "engine_version", "spec_method",
        "random_input_len", "random_output_len", "random_range_ratio", "max_concurrency", "request_rate",
        "num_prompts")


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or (isinstance(v, str) and not v.strip())


def read_table(path: str | Path) -> list[dict[str, Any]]:
    """The runs of a runs table (dsparksim.bench.runs.read_runs, which validates every cell)."""

    return read_runs(path)


# ------------------------------------------------------------------------------------------------- selection
def parse_where(spec: str | None) -> list[tuple[str, str]]:
    """``"engine=sglang,random_input_len=1024"`` -> [(column, text)]; ConfigError on a malformed term or a column
    given twice (which of two values was meant is unknown)."""
    if spec is None:
        return []
    out: list[tuple[str, str]] = []
    for term in spec.split(","):
        k, eq, v = term.partition("=")
        if not eq or not k.strip():
            raise ConfigError("cli", "--where", f"expected KEY=VALUE[,KEY=VALUE...], got term {term!r}")
        if k.strip() in dict(out):
            raise ConfigError("cli", "--where", f"{k.strip()!r} is given twice ({dict(out)[k.strip()]!r} and "
                              f"{v.strip()!r}); give each column once")
        out.append((k.strip(), v.strip()))
    return out


def cell_matches(v: Any, text: str, column: str | None = None) -> bool:
    """A runs-table cell against a --where value: numbers as numbers (1024 = 1024.0), text case-insensitively,
    '' = empty; in the ``gpu`` column, any spelling of the same GPU (``h200`` selects ``NVIDIA H200``:
    :func:`dsparksim.cost.analytic.hardware.same_gpu`)."""
    if column == "gpu" and isinstance(v, str) and text:
        return same_gpu(text, v)
    if _missing(v):
        return text == ""
    if isinstance(v, bool):
        return text.lower() == str(v).lower()
    if isinstance(v, (int, float, np.integer, np.floating)):
        try:
            return float(text) == float(v)
        except ValueError:
            return False
    return str(v).lower() == text.lower()


def select(runs: Sequence[Mapping[str, Any]], where: list[tuple[str, str]], source: str = "runs table"
           ) -> list[Mapping[str, Any]]:
    """The runs matching every KEY=VALUE term (:func:`cell_matches`)."""
    if runs:
        cols = set(runs[0])
        for k, _ in where:
            if k not in cols:
                raise ConfigError("cli", "--where", f"{k!r} is not a column of {source}")
    sel = [r for r in runs if all(cell_matches(r.get(k), v, k) for k, v in where)]
    if not sel:
        raise ConfigError("cli", "--where", f"selects none of the {len(runs)} runs of {source}")
    check_one_gpu(sel, where, "--where")
    return sel


def check_one_gpu(sel: Sequence[Mapping[str, Any]], where: Sequence[tuple[str, str]], source: str) -> None:
    """A ``gpu=`` term that selects runs on two different GPUs (``sxm5``: H100 and H800 rows) is ambiguous: a
    ConfigError naming them, never a mixed selection."""
    text = dict(where).get("gpu")
    if not text:
        return
    kinds: list[str] = []
    for r in sel:
        g = r.get("gpu")
        if isinstance(g, str) and not any(same_gpu(g, k) for k in kinds):
            kinds.append(g)
    if len(kinds) > 1:
        raise ConfigError(source, "gpu", f"gpu={text} is ambiguous: it selects runs on {len(kinds)} GPUs "
                          f"({', '.join(map(repr, kinds))}); name one")


# ------------------------------------------------------------------------------------------------ one row
def _length_moments(lo: int, L: int) -> tuple[float, float]:
    """Mean and standard deviation of lengths uniform over the integers [lo, L]."""
    return (lo + L) / 2, math.sqrt(((L - lo + 1) ** 2 - 1) / 12)


def check_lengths(row: Mapping[str, Any], L: int, R: float, source: str = "runs table") -> None:
    """The run's own token counts against its lengths: total_input_tokens / completed is the mean of prompt lengths
    uniform in [max(1, int(R*L_in)), L_in], and with ignore_eos total_output_tokens / completed that of output
    lengths uniform in [max(1, int(R*L)), L] (an SGLang run's may start at 0: :func:`sglang_zero_outputs`). Off by
    more than 4 standard errors + 2% is an InputError (lengths or range ratio mistyped at import, a prefix the
    client added to every prompt, or outputs cut by EOS); a count that is missing is not checked."""
    L_in = row.get("random_input_len")
    if not _missing(L_in):
        _check_mean(row, "total_input_tokens", "random_input_len", int(L_in), R, (max(1, int(R * int(L_in))),),
                    source, "prompt", "--random-input-len / --random-range-ratio at import, and a prefix the client "
                    "added to every prompt (vLLM --random-prefix-len)", slack=SPECIAL_TOKENS_SLACK)
    lo = max(1, int(R * L))
    _check_mean(row, "total_output_tokens", "random_output_len", L, R,
                (lo, 0) if sglang_zero_outputs(row, L, R) is not None else (lo,), source, "output",
                "--random-output-len / --random-range-ratio at import, and ignore_eos")


# vllm bench serve draws prompt lengths around random_input_len minus the tokenizer's special tokens
# (RandomDataset: real_input_len = input_len - tokenizer.num_special_tokens_to_add(), 1 for a BOS): prompts may be
# up to this many tokens shorter than the lengths say
SPECIAL_TOKENS_SLACK = 4


def _check_mean(row: Mapping[str, Any], total: str, field: str, L: int, R: float, lows: tuple[int, ...],
                source: str, what: str, check: str, slack: int = 0) -> None:
    """``total`` / completed against the mean of lengths uniform in [low, L] for any of ``lows``, or up to
    ``slack`` tokens below it (see :func:`check_lengths`)."""
    tot, done = row.get(total), row.get("completed")
    if _missing(tot) or _missing(done) or not done:
        return
    mean = float(tot) / float(done)
    for low in lows:
        mu, sd = _length_moments(low, L)
        tol = 4 * sd / math.sqrt(float(done)) + 0.02 * mu
        if mu - slack - tol <= mean <= mu + tol:
            return
    lo, mu = lows[0], _length_moments(lows[0], L)[0]
    did = "emitted" if what == "output" else "sent"
    raise InputError(source, field, f"run {row.get('run_id') or '?'}: its {int(done)} completed requests {did} "
                     f"{mean:.1f} {'' if what == 'output' else what + ' '}tokens each ({total} / completed), but "
                     f"{'' if what == 'output' else what + ' '}lengths uniform in [{lo}, {L}] ({field} {L}, range "
                     f"ratio {R:g} as [int(R*L), L] reads it) have a mean of {mu:.1f}: check {check}")


def sglang_zero_outputs(row: Mapping[str, Any], L: int, R: float) -> float | None:
    """The expected number of prompts an SGLang run sent with 0 output tokens, or None when it sent none.

    sgl-project/sglang ``python/sglang/bench_serving.py`` at 0033168f, ``sample_random_requests``: input lengths
    ``np.random.randint(max(int(input_len * range_ratio), 1), input_len + 1)`` but output lengths
    ``np.random.randint(int(output_len * range_ratio), output_len + 1)``: uniform over [0, L] when int(R*L) = 0
    (its default range ratio is 0.0), so each prompt has a 1 / (L + 1) chance of 0. Such a prompt goes out as
    ``max_new_tokens: 0`` (``max_tokens: 0`` on the OpenAI-compatible backends, which a vLLM server refuses: a
    failed request). SGLang's server prefills it and samples one token in that step, which finishes it
    (sgl-project/sglang#4892; the fix that would drop the token, #4998, was closed unmerged): if the token streams
    back the client records a 1-token request, else 0 tokens and TTFT 0. The simulator cannot send a 0-token
    request (it draws [1, L]). The ``sglang.benchmark`` package (``compute_random_lens``) draws
    [1, L] for both; a runs table does not say which client wrote a run, so this is an upper bound."""
    if row.get("source_format") != "sglang" or int(R * L) != 0:
        return None
    n = row.get("num_prompts")
    n = row.get("completed") if _missing(n) else n
    return None if _missing(n) else float(n) / (L + 1)


def sglang_zero_note(expected: float, n: int, L: int) -> str:
    """replay.csv's note on an SGLang run that drew outputs in [0, L] (:func:`sglang_zero_outputs`)."""
    return (f"SGLang's bench_serving (0033168f) drew output lengths in [int(R*L), L] = [0, {L}]: about {expected:.2g} "
            f"of its {n} prompts (1 in {L + 1}) went out with max_new_tokens 0 (a prefill whose one sampled token ends "
            "it: a 1-token request to the client, or 0 tokens and TTFT 0 if none streamed back); the simulator "
            f"cannot send 0 tokens and draws [1, {L}]")


def low_range_ratio(row: Mapping[str, Any], bad: Callable[[str, str], Exception]) -> float | None:
    """The run's range ratio R as lengths uniform in [int(R*L), L] read it (None: not recorded). vLLM's symmetric
    [L(1-R), L(1+R)] at R = 0 is every length L, the same draw as R = 1 here; at any other R it is not simulated
    (``bad(field, message)`` is raised)."""
    conv, R = row.get("random_range_convention"), row.get("random_range_ratio")
    R = None if _missing(R) else R
    if _missing(conv) or conv == "low":
        return R
    if conv == "symmetric" and R == 0:
        return 1.0
    raise bad("random_range_convention", f"{conv!r} (vLLM's [L(1-R), L(1+R)]) at R = {R} is not simulated; only "
              "'low' = [int(R*L), L] (SGLang, InferenceX, vLLM before mid-2025) and vLLM's R = 0")


def row_workload(row: Mapping[str, Any], source: str = "runs table") -> tuple[ClientWorkload, list[str]]:
    """The client workload of one run, and the notes of what was filled in (see the module doc)."""
    rid = row.get("run_id") or "?"

    def bad(field: str, msg: str) -> InputError:
        return InputError(source, field, f"run {rid}: {msg}")

    notes: list[str] = []
    ds = row.get("dataset_name")
    if not _missing(ds) and ds != "random":
        raise bad("dataset_name", f"dataset {ds!r}: only the random dataset is replayed")
    if not _missing(row.get("lengths_file")):
        raise bad("lengths_file", "a lengths file is not replayed (random dataset only)")
    R = low_range_ratio(row, bad)
    for f in ("random_input_len", "random_output_len", "num_prompts"):
        if _missing(row.get(f)):
            raise bad(f, "missing: the client's workload cannot be rebuilt without it")
    if R is None and row.get("source_format") == "vllm":
        R = 1.0   # vLLM records no range ratio; its default (0 symmetric; 1.0 in benchmark_serving.py) is every L
        notes.append("random_range_ratio not recorded: vLLM's default, every length L (bench import "
                     "--random-range-ratio if the run set one)")
    elif R is None:
        R = 0.0
        notes.append("random_range_ratio missing: 0")
    check_lengths(row, int(row["random_output_len"]), float(R), source)
    zeros = sglang_zero_outputs(row, int(row["random_output_len"]), float(R))
    if zeros is not None:
        notes.append(sglang_zero_note(zeros, int(row["num_prompts"]), int(row["random_output_len"])))
    cap = None if _missing(row.get("max_concurrency")) else int(row["max_concurrency"])
    rate = row.get("request_rate")
    if _missing(rate):
        if cap is None:
            raise bad("request_rate", "missing, and no max_concurrency: the load is unknown")
        rate = math.inf
        notes.append("request_rate missing: inf (all released at once under the cap)")
    if cap is None and math.isinf(float(rate)):   # a cap the file left out would change every figure
        notes.append("max_concurrency empty (no cap, or not recorded): every prompt released at once")
    eos = row.get("ignore_eos")
    if eos is False:
        raise bad("ignore_eos", "false: the simulator has no model of when a model stops (only ignore_eos runs)")
    if _missing(eos):
        notes.append("ignore_eos not recorded: every request emits its drawn output length")
    failed = row.get("failed")
    if not _missing(failed) and failed:
        notes.append(f"{int(failed)} request(s) failed in the measured run: its figures cover the completed ones, "
                     "the simulation completes every prompt")
    gone = unaccounted(row)
    if gone:
        notes.append(unaccounted_text(row, gone) + ": the measured figures cover the completed ones, the simulation "
                     "completes every prompt")
    w = row.get("num_warmup_prompts")
    w = 0 if _missing(w) else int(w)
    try:
        wl = ClientWorkload(random_input_len=int(row["random_input_len"]),
                            random_output_len=int(row["random_output_len"]), random_range_ratio=float(R),
                            num_prompts=int(row["num_prompts"]), max_concurrency=cap, request_rate=float(rate),
                            num_warmup_prompts=w)
    except ConfigError as e:
        raise bad(e.field or "?", e.message) from None
    return wl, notes


def unaccounted(row: Mapping[str, Any]) -> int:
    """Prompts of the run neither completed nor counted failed: num_prompts - completed - failed (0 when a count is
    missing). SGLang's line has no failed count, so its failed requests land here; so does a num_prompts given at
    import that is not what the client sent."""
    n, done, failed = row.get("num_prompts"), row.get("completed"), row.get("failed")
    if _missing(n) or _missing(done):
        return 0
    return max(0, int(n) - int(done) - (0 if _missing(failed) else int(failed)))


def unaccounted_text(row: Mapping[str, Any], gone: int) -> str:
    return (f"{gone} of its {int(row['num_prompts'])} prompts neither completed nor counted failed (completed "
            f"{int(row['completed'])}; failed requests where the file records none, as SGLang's, or a num_prompts "
            "that is not what the client sent)")


def row_policy(row: Mapping[str, Any], source: str = "runs table") -> dict[str, Any]:
    """run_client's policy keywords for the run's speculative config (bench.spec.map_row); plain decoding for
    MTP-off rows."""
    method = row.get("spec_method")
    plain = _missing(method) or str(method).strip().lower() in ("none", "off")
    if plain and all(_missing(row.get(k)) for k in ("spec_num_steps", "spec_num_draft_tokens", "spec_mtp_nextn")):
        return {"policy": "none"}

    try:
        m = map_row(row, source=source)
    except ConfigError as e:
        raise InputError(source, e.field, f"run {row.get('run_id')}: {e.message}") from None
    kw: dict[str, Any] = {"policy": m.policy}
    if m.block_size is not None:
        kw.update(block_size=m.block_size, acceptance=m.acceptance, drafter=m.drafter)
    return kw


def dp_ranks_of(row: Mapping[str, Any], source: str = "runs table") -> int:
    """Attention data-parallel ranks of a run's engine: its TP size when ``dp_attention`` is true, else 1.

    TensorRT-LLM's ``enable_attention_dp`` makes every one of the engine's ``tp_size`` GPUs an attention DP rank
    (attention TP 1; the MoE layers stay EP/TP over all of them); SGLang's ``--enable-dp-attention`` does the same
    with ``--dp-size`` = ``--tp-size``, the only split the runs table records (the SGLang importer refuses another).
    InputError when dp_attention is true and tp is missing."""
    if row.get("dp_attention") is not True:
        return 1
    tp = row.get("tp")
    if _missing(tp):
        raise InputError(source, "tp", f"run {row.get('run_id') or '?'}: missing, and dp_attention is true: the "
                         "number of attention DP ranks (the TP size) is unknown")
    return int(tp)


def dp_router(engine: Any) -> str:
    """How an engine spreads new requests over its attention DP ranks, as a simulator router: TensorRT-LLM assigns
    each new request to a rank below the balanced count of active requests, fewest active tokens first
    (``tensorrt_llm/_torch/pyexecutor`` executor request queue, ``_balance_requests_across_ranks``) ->
    ``least-outstanding`` (fewest running + waiting + queued); SGLang's DP controller sends them in turn
    (``--load-balance-method`` default ``round_robin``) -> ``round-robin``; any other engine -> ``round-robin``."""
    return "least-outstanding" if is_trtllm(engine) else "round-robin"


def _check_balance_runs(plan: Sequence[tuple], timeout: int) -> None:
    """``--attention-dp-timeout-iters`` needs a selected DP-attention run, and every such run a TensorRT-LLM one (the
    balance is its ``attention_dp_config``). ``plan``: replay's (row, ..., DP ranks) tuples."""
    dp_rows = [row for row, *_, R in plan if R > 1]
    if not dp_rows:
        raise ConfigError("cli", "--attention-dp-timeout-iters", f"{timeout} given, but no selected run has DP "
                          "attention (the balance holds prefills across DP ranks; select runs with --where "
                          "dp_attention=true)")
    other = next((row for row in dp_rows if not _missing(row.get("engine")) and not is_trtllm(row.get("engine"))),
                 None)
    if other is not None:
        raise ConfigError("cli", "--attention-dp-timeout-iters", f"{timeout} given, but run "
                          f"{other.get('run_id') or '?'} ran on {other.get('engine')!r}: the balance is "
                          "TensorRT-LLM's (attention_dp_config); select its runs (--where engine=trtllm)")


def _check_batch_wait_runs(plan: Sequence[tuple], timeout: int) -> None:
    """``--batch-wait-timeout-iters`` is TensorRT-LLM's, and it skips batch waiting under attention DP: every
    selected run must be a TensorRT-LLM one (or of no named engine) without DP attention."""
    for row, *_, R in plan:
        eng = row.get("engine")
        if R > 1 or (not _missing(eng) and not is_trtllm(eng)):
            why = ("has DP attention (TensorRT-LLM skips batch waiting there; its balance is "
                   "--attention-dp-timeout-iters)" if R > 1 else f"ran on {eng!r} (batch waiting is TensorRT-LLM's)")
            raise ConfigError("cli", "--batch-wait-timeout-iters", f"{timeout} given, but run "
                              f"{row.get('run_id') or '?'} {why}: select the runs it applies to with --where")


_GENERIC_WORDS = {"ai", "hf", "meta", "org", "instruct", "chat", "base", "it", "fp8", "fp4", "bf16", "fp16", "int4",
                  "int8", "awq", "gptq", "nvfp4", "mxfp4", "preview"}


def _model_words(name: str) -> set[str]:
    """The words of a model name that say which model family it is: no sizes (7b, 30b, a3b), versions of two
    characters or fewer, dates, or generic words (instruct, fp8, ...)."""
    words = re.findall(r"[a-z0-9]+", name.lower())
    return {w for w in words if len(w) > 2 and re.search(r"[a-z]", w) and w not in _GENERIC_WORDS
            and not re.fullmatch(r"a?\d+(\.\d+)?[bmk]", w)}


def model_note(row: Mapping[str, Any], prof: Any) -> str | None:
    """A note when the run's model and the profile's ``metadata.model`` share no family word (deepseek, llama,
    qwen3, ...): the profile may price another model. Names differ too much (an HF id, a config name, a
    fine-tune's) for this to be a refusal; None when they share one or either is unknown."""
    run = row.get("model")
    priced = str((getattr(prof, "metadata", {}) or {}).get("model") or "")
    if _missing(run) or not priced:
        return None
    a, b = _model_words(str(run)), _model_words(priced)
    if not a or not b or a & b:
        return None
    return (f"model {str(run)!r} shares no name with the profile's model {priced!r}: is this its profile? (replay "
            "each model's runs on a profile of that model)")


def unchecked_columns(row: Mapping[str, Any], prof: Any) -> list[tuple[str, Any]]:
    """(column, the profile's value) of the deployment columns the run leaves empty (gpu, tp, ep) where the profile
    states them: :func:`check_deployment` cannot check them, so the run is taken to have run on the profile's. An
    empty ep beside a profile without expert parallelism (ep 1, the usual dense or one-GPU case) is not listed."""
    meta = getattr(prof, "metadata", {}) or {}
    ep = meta.get("expert_parallel")
    tp = meta.get("tensor_parallel")   # a DP-rank profile's engine spans tensor_parallel x data_parallel GPUs
    have = {"gpu": meta.get("device"), "tp": None if tp is None else int(tp) * int(meta.get("data_parallel") or 1),
            "ep": ep if ep and int(ep) > 1 else None}
    return [(col, v) for col, v in have.items() if _missing(row.get(col)) and v is not None]


def unchecked_note(row: Mapping[str, Any], prof: Any) -> str | None:
    """The replay note of :func:`unchecked_columns` (None: none)."""
    empty = unchecked_columns(row, prof)
    if not empty:
        return None
    listed = ", ".join(f"{c} (the profile's {v})" for c, v in empty)
    return (f"{listed} not recorded: taken as the profile's, not "
            f"checked (set it at bench import: --{' / --'.join(c for c, _ in empty)})")


def placeholder_tpot(row: Mapping[str, Any]) -> bool:
    """True when every TPOT statistic the row has is 0: what vLLM's and SGLang's clients write when no request had
    more than one output token (``np.mean(tpots or 0)``), never a measured decode time. ``bench import`` leaves
    such TPOT empty; a table written before it did (or by hand) may still hold the zeros."""
    vals = [row.get(f"{s}_tpot_ms") for s in ("mean", "median", "p99")]
    present = [float(v) for v in vals if not _missing(v)]
    return bool(present) and all(v == 0 for v in present)


def gpus_of(row: Mapping[str, Any]) -> int:
    """GPUs for throughput per GPU: gpu_count, else tp (InferenceX divides by TP), else 1."""
    for f in ("gpu_count", "tp"):
        if not _missing(row.get(f)):
            return int(row[f])
    return 1


def _rel(sim: float, meas: Any) -> float:
    if _missing(meas) or not meas or not math.isfinite(float(sim)):
        return math.nan
    return float(sim) / float(meas) - 1.0


def profile_label(prof: Any) -> str:
    """How an error names the profile: its name, and the file it came from when that file is not named after it
    (a `profile fit --out my-h200.json` profile is named 'fitted-h200x8-deepseek-v3' inside)."""
    name, src = str(getattr(prof, "name", "?")), str(getattr(prof, "source", "") or "")
    return repr(name) if not src or Path(src).stem == name else f"{name!r} (file {src})"


def check_dp(row: Mapping[str, Any], prof: Any, source: str = "runs table") -> int:
    """The run's attention DP ranks R (:func:`dp_ranks_of`), checked against the profile's
    ``metadata.data_parallel`` D (absent = 1: one TP engine): a DP-attention run needs a profile of one of its R
    ranks (``profile build --tp 1 --ep EP --dp R``), any other run a profile with D = 1. ConfigError naming the run
    and ``dp_attention`` otherwise (a TP profile's per-step cost is not one rank's, nor the reverse)."""
    meta = getattr(prof, "metadata", {}) or {}
    rid = row.get("run_id") or "?"
    R = dp_ranks_of(row, source)
    D = int(meta.get("data_parallel") or 1)
    if R == D:
        return R
    if R > 1:
        what = "one TP engine (metadata.data_parallel 1)" if D == 1 else f"one of {D} DP ranks (metadata.data_parallel)"
        raise ConfigError(source, "dp_attention", f"run {rid} ran with DP attention over {R} ranks (dp_attention "
                          f"true, tp {R}) but the profile {profile_label(prof)} prices {what}: replay it on a profile of one "
                          f"of {R} DP ranks (profile build --tp 1 --ep EP --dp {R}), or select the runs without DP "
                          "attention (--where dp_attention=false)")
    dpa = row.get("dp_attention")
    raise ConfigError(source, "dp_attention", f"run {rid} ran without DP attention (dp_attention "
                      f"{'false' if dpa is False else 'empty'}) but the profile {profile_label(prof)} prices one of {D} "
                      "DP ranks (metadata.data_parallel): select the DP-attention runs (--where dp_attention=true) "
                      "or use a profile of one TP engine")


def check_deployment(row: Mapping[str, Any], prof: Any, source: str = "runs table") -> int:
    """A run is replayed on a profile of its own deployment: its GPU named in the profile's device, its attention
    DP ranks those the profile prices one of (:func:`check_dp`), its TP equal to the profile's GPUs per engine
    (tensor_parallel x data_parallel) and its EP to the profile's (where both say). Another GPU's or parallelism's
    cost curve would make every error meaningless, so a mismatch is an error naming the run (select the runs with
    --where, or use their profile). Returns the run's DP ranks."""
    meta = getattr(prof, "metadata", {}) or {}
    rid = row.get("run_id") or "?"
    gpu, device = row.get("gpu"), str(meta.get("device") or "")
    why = None if _missing(gpu) or not device else gpu_mismatch(str(gpu), device)
    if why is not None:
        raise ConfigError(source, "gpu", f"run {rid} ran on {gpu!r} but the profile {profile_label(prof)} prices "
                          f"{device!r} ({why}): give each GPU's runs their own profile (select them with --where "
                          "gpu=...)")
    R = check_dp(row, prof, source)
    for col, key in (("tp", "tensor_parallel"), ("ep", "expert_parallel")):
        v, pv = row.get(col), meta.get(key)
        if _missing(v) or pv is None:
            continue
        have, label = int(pv), f"{key} {int(pv)}"
        if col == "tp" and R > 1:        # a DP engine's TP size is its GPUs: attention TP x DP ranks
            have, label = int(pv) * R, f"tensor_parallel {int(pv)} x data_parallel {R} = {int(pv) * R} GPUs"
        if int(v) != have:
            raise ConfigError(source, col, f"run {rid} ran with {col} {int(v)} but the profile {profile_label(prof)} has "
                              f"{label}: select the runs of its deployment (--where {col}={have})")
    return R


def replay(runs: Sequence[Mapping[str, Any]], profile: Any, *, server: ServerSettings = ServerSettings(),
           seed: int = 0, source: str = "runs table", on_done: Callable[[], None] | None = None,
           mixed_prefill: bool | None = None, acceptance: str | None = None):
    """Simulate every run; a DataFrame with one row per run: KEYS, notes, the policy, ``mixed_prefill``,
    ``dp_ranks`` / ``dp_router`` (a DP-attention run: its TP size of ranks stepped in lockstep, requests spread as
    its engine does, :func:`dp_router`; 1 / empty otherwise) and for each metric ``measured_M``, ``simulated_M``,
    ``rel_error_M``. Every row is checked before any is simulated (:func:`check_deployment`).
    ``mixed_prefill``: None = each run's engine default (SGLang: off; see
    :func:`dsparksim.bench.client.engine_mixes_prefill`), else the value for every run. ``acceptance``: the
    acceptance spec of the speculative runs instead of their mapping's (e.g. ``mtp?tau2=2.3`` from the server
    log's accept length); ConfigError when no selected run is speculative."""
    import pandas as pd  # lazy: pandas

    prof = load_profile(profile) if isinstance(profile, (str, Path)) else profile
    if server.chunked_prefill_size is None:   # profile fit's default: the runs are simulated as they were fitted
        server = replace(server, chunked_prefill_size=int(prof.max_tokens))
    plan = []
    for row in runs:
        R = check_deployment(row, prof, source)
        wl, notes = row_workload(row, source)
        if R > 1:
            notes = notes + [f"DP attention: {R} ranks in lockstep, requests spread {dp_router(row.get('engine'))}"]
        pol = row_policy(row, source)
        if acceptance is not None and "acceptance" in pol:
            pol = {**pol, "acceptance": acceptance}
            notes = notes + [f"acceptance {acceptance} (given) instead of the mapping's"]
        notes = notes + [n for n in (model_note(row, prof), unchecked_note(row, prof)) if n]
        if placeholder_tpot(row):
            notes = notes + ["measured TPOT 0 not compared: the client's placeholder when no request had more than "
                             "one output token, not a measurement"]
        plan.append((row, wl, notes, pol, gpus_of(row), R))
    if server.attention_dp_timeout_iters is not None:
        _check_balance_runs(plan, server.attention_dp_timeout_iters)
    if server.batch_wait_timeout_iters is not None:
        _check_batch_wait_runs(plan, server.batch_wait_timeout_iters)
    if acceptance is not None:
        spec_ks = sorted({int(pol["block_size"]) for _, _, _, pol, _, _ in plan if "acceptance" in pol})
        if not spec_ks:
            raise ConfigError("cli", "--acceptance", f"{acceptance!r} given, but no selected run is speculative "
                              "(it replaces the acceptance of speculative runs only)")
        for K in spec_ks:                # a bad spec fails here, before any run is simulated
            load_acceptance(acceptance, K)
    out = []
    for row, wl, notes, pol, gpus, R in plan:
        mixed = engine_mixes_prefill(row.get("engine")) if mixed_prefill is None else bool(mixed_prefill)
        srv = ServerSettings(**{**server.__dict__, "gpus": gpus, "mixed_chunk": mixed, "dp_ranks": R,
                                "router": dp_router(row.get("engine")) if R > 1 else None})
        try:
            run = run_client(prof, wl, srv, seed=seed, **pol)
        except InputError as e:   # e.g. no request fits the engine: say which run of the table it was
            raise InputError(source, None, f"run {row.get('run_id')}: {e}") from None
        rec: dict[str, Any] = {k: row.get(k) for k in KEYS}
        rec["policy"] = pol["policy"]
        rec["mixed_prefill"] = mixed
        rec["dp_ranks"] = R
        rec["dp_router"] = srv.router or ""
        rec["notes"] = "; ".join(notes)
        rec["simulated_failed"] = run.metrics["failed"]
        for m in METRICS:
            sim = run.metrics[m]
            meas = None if m.endswith("_tpot_ms") and placeholder_tpot(row) else row.get(m)
            rec[f"measured_{m}"] = None if _missing(meas) else float(meas)
            rec[f"simulated_{m}"] = sim
            rec[f"rel_error_{m}"] = _rel(sim, meas)
        out.append(rec)
        if on_done is not None:
            on_done()
    return pd.DataFrame(out)


def error_summary(df) -> "Any":
    """Per metric: runs with a measurement, median and p90 of |relative error| (in %), and the median signed."""
    import pandas as pd  # lazy: pandas

    rows = []
    for m in METRICS:
        e = df[f"rel_error_{m}"].astype(float).dropna()
        rows.append({"metric": m, "runs": int(len(e)),
                     "median_abs_error_pct": float(np.median(np.abs(e))) * 100 if len(e) else math.nan,
                     "p90_abs_error_pct": float(np.percentile(np.abs(e), 90)) * 100 if len(e) else math.nan,
                     "median_error_pct": float(np.median(e)) * 100 if len(e) else math.nan})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------------------ plot
def _workload_label(r: Mapping[str, Any]) -> str:
    def k(v: Any) -> str:
        v = int(v)
        return f"{v // 1024}k" if v % 1024 == 0 else str(v)
    parts = [f"{k(r['random_input_len'])}/{k(r['random_output_len'])}"]
    for f in ("gpu", "engine", "engine_version", "spec_method"):
        v = r.get(f)
        if not _missing(v) and not (f == "spec_method" and str(v).lower() in ("none", "off")):
            parts.append(str(v) if f != "spec_method" else f"spec {v}")
    return " ".join(parts)


def replay_figure(df, title: str = ""):
    """Interactivity (tok/s/user = 1000 / median TPOT) against output throughput per GPU, one panel per workload
    (lengths, GPU, engine, version, speculation): measured (filled, solid) and simulated (hollow, dashed), each
    series in concurrency (then rate) order, as InferenceX draws it."""
    import pandas as pd  # lazy: pandas
    from matplotlib.figure import Figure  # lazy: matplotlib

    d = df.copy()
    d["_label"] = [_workload_label(r) for r in d.to_dict("records")]
    d["_order"] = [(float(c) if not _missing(c) else math.inf, float(q) if not _missing(q) else math.inf)
                   for c, q in zip(d["max_concurrency"], d["request_rate"])]
    labels = list(dict.fromkeys(d["_label"]))
    n = len(labels)
    cols = min(3, n)
    rows = -(-n // cols)
    fig = Figure(figsize=(5.2 * cols, 4.2 * rows), dpi=110)
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
    for ax, lab in zip(axes, labels):
        g = d[d["_label"] == lab]
        g = g.iloc[sorted(range(len(g)), key=lambda i: g["_order"].iloc[i])]
        # median TPOT as InferenceX draws it; the mean for a run whose measurement has no median (both kinds)
        use_mean = g["measured_median_tpot_ms"].isna().to_numpy() & g["measured_mean_tpot_ms"].notna().to_numpy()
        for kind, style in (("measured", dict(marker="o", ls="-", color="#1f77b4", mfc="#1f77b4")),
                            ("simulated", dict(marker="s", ls="--", color="#d62728", mfc="none"))):
            x = g[f"{kind}_output_throughput_per_gpu"].astype(float)
            tpot = np.where(use_mean, g[f"{kind}_mean_tpot_ms"].astype(float), g[f"{kind}_median_tpot_ms"].astype(float))
            y = pd.Series(1000.0 / tpot, index=g.index)
            ok = np.isfinite(x) & np.isfinite(y)
            ax.plot(x[ok], y[ok], label=kind, ms=5, lw=1.2, gid=f"{kind}:{lab}", **style)
            if kind == "measured":
                for xi, yi, c, mean in zip(x[ok], y[ok], g.loc[ok, "max_concurrency"], use_mean[ok.to_numpy()]):
                    if not _missing(c):
                        ax.annotate(f"c{int(c)}" + ("*" if mean else ""), (xi, yi), textcoords="offset points",
                                    xytext=(4, 4), fontsize=7)
        ax.set_title(lab, fontsize=9)
        ax.set_xlabel("output throughput per GPU (tok/s/GPU)")
        ax.set_ylabel("interactivity (tok/s/user = 1000 / median TPOT)\n* = mean TPOT (no median measured)",
                      fontsize=8)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    for ax in axes[n:]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
