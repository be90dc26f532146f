"""``dsparksim bench``: measured serving-benchmark runs as input.

``bench import FILE... --out RUNS.csv`` reads vLLM / SGLang / InferenceX result files into one runs table
(dsparksim.bench.runs); ``bench replay RUNS.csv --profile P --out DIR`` simulates its runs (cli.bench_replay). Wire with ``register(subparsers)``; each subcommand sets ``func(args) -> exit code``.
"""
from __future__ import annotations

import dataclasses
import argparse
from collections import Counter

from dsparksim.errors import InputError
from dsparksim.bench.importers import FORMATS, import_files
from dsparksim.bench.runs import check_out, COLUMNS, parse_cell, write_runs
from dsparksim.cli.bench_replay import register_replay


def register(subparsers) -> None:
    """Add ``bench`` and its subcommands to an argparse subparsers object."""

    p = subparsers.add_parser("bench", help="measured serving-benchmark runs: import them into a runs table, "
                                            "replay them")
    sub = p.add_subparsers(dest="bench_cmd", metavar="{import,replay}")
    sub.required = True
    _register_import(sub)
    register_replay(sub)


def _register_import(sub) -> None:

    q = sub.add_parser(
        "import", help="read vLLM / SGLang / InferenceX benchmark results into a runs table",
        description="Read benchmark result files (vllm bench serve --save-result JSON, sglang.bench_serving "
                    "--output-file JSONL, InferenceX CSV; told apart by content) into one runs table, one row "
                    "per run. The options below set columns a file does not carry, for every imported run; a "
                    "value a file carries and an option contradicts is an error. Nothing is written unless "
                    "every file reads.")
    q.add_argument("files", nargs="+", metavar="FILE", help="benchmark result files")
    q.add_argument("--out", required=True, metavar="RUNS.csv", help="runs table to write (must not exist)")
    q.add_argument("--force", action="store_true",
                   help="replace --out if it is a runs table that bench import wrote (never any other file)")
    q.add_argument("--format", choices=("auto", *FORMATS), default="auto",
                   help="input format of every FILE [auto: from each file's content]")
    g = q.add_argument_group("columns set for every imported run (where the file does not carry them)")
    for c in COLUMNS:
        if c.cli:
            choices = f"; one of {', '.join(c.choices)}" if c.choices else ""
            unit = f" ({c.unit})" if c.unit else ""
            g.add_argument("--" + c.name.replace("_", "-"), dest="set_" + c.name, default=None,
                           metavar=c.type.upper() if c.type != "bool" else "true|false",
                           help=f"{c.meaning}{unit}{choices}".replace("%", "%%"))
    q.set_defaults(func=import_command)


def overrides(args: argparse.Namespace) -> dict:
    """The column values given as options, parsed and checked as their columns (errors name the option)."""

    out = {}
    for c in COLUMNS:
        text = getattr(args, "set_" + c.name, None)
        if text is None:
            continue
        opt = "--" + c.name.replace("_", "-")
        if not text.strip():
            raise InputError("bench import", opt, "expected a value, got an empty string")
        out[c.name] = parse_cell(dataclasses.replace(c, name=opt), text, "bench import", None)
    return out


# columns bench replay / profile fit read that a file may not carry (random_*: for random-dataset runs)
NEEDED = ("gpu", "gpu_count", "tp", "engine", "spec_method", "dataset_name", "random_input_len",
          "random_output_len", "random_range_ratio", "ignore_eos", "num_prompts")


def import_command(args: argparse.Namespace) -> int:

    check_out(args.out, args.force, inputs=args.files)
    notes: list[str] = []
    rows = import_files(args.files, args.format, overrides(args), notes)
    n = write_runs(rows, args.out, force=args.force)
    kinds = Counter(r["source_format"] for r in rows)
    print(f"{n} runs from {len(args.files)} file(s) ({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))}) "
          f"-> {args.out}")
    for note in notes:
        print(f"  note: {note}")
    empty = [name for name in NEEDED if any(r[name] is None and (not name.startswith("random_") or
                                                                  r["dataset_name"] in (None, "random")) for r in rows)]
    if empty:
        print(f"  empty in some runs, needed by bench replay / profile fit (set with "
              f"--{' / --'.join(e.replace('_', '-') for e in empty)} if known): {', '.join(empty)}")
    return 0
