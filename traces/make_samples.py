"""Regenerate the shipped trace samples in this folder from the full traces in ../shared/data/traces.

    python traces/make_samples.py [--shared PATH/TO/shared/data/traces]

Deterministic (fixed seed, fixed windows). Rows are copied verbatim from the source (only columns are dropped), so
every shipped value is a real recorded value. The sources' sha256 prefixes are checked against data/SOURCES.md
first, and every output is re-read by the strict readers afterwards. Provenance and licences: README.md here.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

SEED = 20231116            # the Azure trace's date; any fixed value would do
N_SAMPLE = 2000            # rows in each lengths-only sample
WINDOW_START_S = 1200.0    # windows start 20 min into each trace (past any start-up effects)
AZURE_WINDOW_S = 600.0
MOONCAKE_WINDOW_S = 300.0  # Mooncake lines carry hash_ids, so 5 min already is ~250 kB
LONG_RANGE = (8192, 131072)  # prompt tokens of the long-context sample (study long-context: 8k-128k)

# file -> sha256 prefix from data/SOURCES.md
SOURCES = {
    "AzureLLMInferenceTrace_conv.csv": "2f1e5b666d4e3055",
    "AzureLLMInferenceTrace_code.csv": "54e9a6d2a4bd06ba",
    "conversation_trace.jsonl": "b8cbb061a85206d7",
    "sharegpt_8k_filtered_stats_llama2_tokenizer.csv": "6d6c296302a853e2",
    "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv": "9d3580538d915ca7",
}


def _sample_rows(n: int, rng: np.random.Generator) -> np.ndarray:
    # Without replacement, in file order: a plain subset of the source rows.
    return np.sort(rng.choice(n, size=N_SAMPLE, replace=False))


def _lengths_sample(src: Path, dst: Path, cols: list[str], rng: np.random.Generator) -> None:
    df = pd.read_csv(src, dtype=str, keep_default_na=False)
    df.iloc[_sample_rows(len(df), rng)][cols].to_csv(dst, index=False, lineterminator="\n")


def _azure_window(src: Path, dst: Path) -> None:
    df = pd.read_csv(src, dtype=str, keep_default_na=False)
    t = pd.to_datetime(df["TIMESTAMP"], format="ISO8601")
    s = (t - t.iloc[0]).dt.total_seconds().to_numpy()
    keep = (s >= WINDOW_START_S) & (s < WINDOW_START_S + AZURE_WINDOW_S)
    df.loc[keep].to_csv(dst, index=False, lineterminator="\n")


def _mooncake_window(src: Path, dst: Path) -> None:
    lines = [ln for ln in src.read_text().splitlines() if ln.strip()]
    t = np.array([json.loads(ln)["timestamp"] for ln in lines], dtype=np.float64) / 1000.0
    s = t - t[0]
    keep = np.flatnonzero((s >= WINDOW_START_S) & (s < WINDOW_START_S + MOONCAKE_WINDOW_S))
    dst.write_text("".join(lines[i] + "\n" for i in keep))


def _mooncake_long(src: Path, dst: Path, rng: np.random.Generator) -> None:
    """N_SAMPLE random Mooncake conversation requests whose prompt has 8k-128k tokens (input_length, output_length
    verbatim, as a lengths CSV)."""
    rows = [json.loads(ln) for ln in src.read_text().splitlines() if ln.strip()]
    keep = [r for r in rows if LONG_RANGE[0] <= r["input_length"] <= LONG_RANGE[1]]
    pick = np.sort(rng.choice(len(keep), size=N_SAMPLE, replace=False))
    dst.write_text("num_prefill_tokens,num_decode_tokens\n"
                   + "".join(f"{keep[i]['input_length']},{keep[i]['output_length']}\n" for i in pick))


def main(argv: list[str] | None = None) -> int:
    here = Path(__file__).resolve().parent
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", type=Path, default=here.parent / ".." / "shared" / "data" / "traces")
    args = ap.parse_args(argv)
    for name, want in SOURCES.items():
        got = hashlib.sha256((args.shared / name).read_bytes()).hexdigest()[:16]
        if got != want:
            print(f"{args.shared / name}: sha256 {got} != {want} in SOURCES.md", file=sys.stderr)
            return 1
    rng = np.random.default_rng(SEED)  # one generator, used in this fixed order
    _lengths_sample(args.shared / "AzureLLMInferenceTrace_conv.csv", here / "azure_conv_sample.csv",
                    ["ContextTokens", "GeneratedTokens"], rng)
    _lengths_sample(args.shared / "AzureLLMInferenceTrace_code.csv", here / "azure_code_sample.csv",
                    ["ContextTokens", "GeneratedTokens"], rng)
    _lengths_sample(args.shared / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv", here / "sharegpt_sample.csv",
                    ["num_prefill_tokens", "num_decode_tokens"], rng)
    _lengths_sample(args.shared / "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
                    here / "arxiv_sample.csv", ["num_prefill_tokens", "num_decode_tokens"], rng)
    _azure_window(args.shared / "AzureLLMInferenceTrace_conv.csv", here / "azure_conv_window.csv")
    _azure_window(args.shared / "AzureLLMInferenceTrace_code.csv", here / "azure_code_window.csv")
    _mooncake_window(args.shared / "conversation_trace.jsonl", here / "mooncake_conv_window.jsonl")
    _mooncake_long(args.shared / "conversation_trace.jsonl", here / "mooncake_long_sample.csv", rng)

    from dsparksim.traffic.readers import read_trace  # validate what we wrote with the strict readers
    for f in ("azure_conv_sample.csv", "azure_code_sample.csv", "sharegpt_sample.csv", "arxiv_sample.csv",
              "azure_conv_window.csv", "azure_code_window.csv", "mooncake_conv_window.jsonl",
              "mooncake_long_sample.csv"):
        tab = read_trace(here / f)
        span = f", {tab.arrival_s[-1]:.1f} s" if tab.arrival_s is not None else ""
        print(f"{f}: {len(tab)} rows ({tab.format}{span}), {(here / f).stat().st_size} bytes, sha256 {tab.sha256}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's dsparksim, installed or not
    raise SystemExit(main())
