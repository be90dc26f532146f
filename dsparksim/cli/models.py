"""``dsparksim train | collect | report``: the torch backend's commands (need ``pip install 'dsparksim[torch]'``).

torch is imported inside the command functions only, so ``dsparksim --help`` works without it.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from dsparksim.cli.options import add_threads_option, check_threads, refuse_empty
from dsparksim.errors import InputError, MissingExtraError
from dsparksim.results.outputs import check_out_dir


def _need_torch(cmd: str) -> bool:
    try:
        import torch  # noqa: F401
        import tokenizers  # noqa: F401
    except ImportError as e:  # main() prints the one line and exits 2, as for every missing extra
        raise MissingExtraError(getattr(e, "name", None) or "torch", "torch", f"dsparksim {cmd}") from None
    return True


def register(subparsers) -> None:
    """Add ``train``, ``collect`` and ``report``."""
    t = subparsers.add_parser("train", help="train tokenizer, target and the four drafters; fit STS calibration",
                              description="Writes models/ (tokenizer.json, target.pt, mtp1/eagle3/dflash/dspark.pt, "
                                          "calibration.json, training_log.json).")
    t.add_argument("--preset", default="quick", help="smoke | quick (committed checkpoints) | full [%(default)s]")
    t.add_argument("--out", default="models", help="output directory [%(default)s]")
    t.add_argument("--stages", default="tokenizer,target,drafters,calibrate",
                   help="comma-separated subset of tokenizer,target,drafters,calibrate [all]")
    t.add_argument("--prompts-dir", default=None,
                   help="directory with the prompts/*.jsonl files [../shared/data/prompts]")
    add_threads_option(t)
    t.add_argument("--quiet", action="store_true", help="no progress bars")
    t.set_defaults(func=train_command)

    c = subparsers.add_parser("collect", help="decode held-out prompts with each drafter; write acceptance traces",
                              description="Exact speculative decoding (all K verified) of the eval prompts of each "
                                          "domain; writes traces/real_<drafter>_k<K>.csv.gz.")
    c.add_argument("--models", default="models", help="checkpoint directory [%(default)s]")
    c.add_argument("--out", default="traces", help="trace directory [%(default)s]")
    c.add_argument("--drafters", default="dspark,dflash,eagle3,mtp1", help="subset to collect [%(default)s]")
    c.add_argument("--preset", default=None, help="override the collect sizes of this preset [the trained one]")
    c.add_argument("--prompts-dir", default=None, help="directory with the prompts/*.jsonl files")
    add_threads_option(c)
    c.add_argument("--quiet", action="store_true")
    c.set_defaults(func=collect_command)

    r = subparsers.add_parser("report", help="quality report of the trained models and real traces (md + png)")
    r.add_argument("--models", default="models", help="checkpoint directory [%(default)s]")
    r.add_argument("--traces", default="traces", help="trace directory [%(default)s]")
    r.add_argument("--out", default=None, help="report directory [MODELS/report]")
    r.set_defaults(func=report_command)


def _stages(s: str):
    from dsparksim.backend.train import STAGES  # lazy: pulls in numpy, scipy, torch, tqdm
    st = tuple(x.strip() for x in s.split(",") if x.strip())
    bad = [x for x in st if x not in STAGES]
    if bad or not st:
        raise InputError("--stages", "stages", f"unknown stage(s) {bad}; expected a subset of {STAGES}")
    return st


def _check_dir_args(args: argparse.Namespace) -> None:
    """--threads and the paths, before any model is built or trained."""
    check_threads(args)
    refuse_empty(args, "--out", "--models", "--prompts-dir", noun="path", expected="a directory")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise InputError(str(out), "--out", "is a file; expected the output directory")
    check_out_dir(out, "--out", replace=False)   # creatable and writable (/proc/x, FILE/sub were tracebacks)


def train_command(args: argparse.Namespace) -> int:
    _check_dir_args(args)
    if not _need_torch("train"):
        return 3
    from dsparksim.backend.config import preset  # lazy: pulls in numpy, torch, tqdm
    from dsparksim.backend.train import run_pipeline  # lazy: pulls in numpy, scipy, torch, tqdm
    log = run_pipeline(preset(args.preset), args.out, _stages(args.stages), args.prompts_dir,
                       progress=not args.quiet, threads=args.threads)
    print(f"trained preset {args.preset!r} into {args.out}: seconds {log['seconds']}, "
          f"weights {log['total_weight_bytes'] / 1e6:.2f} MB")
    return 0


def collect_command(args: argparse.Namespace) -> int:
    _check_dir_args(args)
    if not _need_torch("collect"):
        return 3
    from dsparksim.backend.collect import collect  # lazy: pulls in numpy, pandas, pyarrow, scipy, torch, tqdm
    paths = collect(args.models, args.out, [d.strip() for d in args.drafters.split(",") if d.strip()],
                    preset_name=args.preset, prompts_dir=args.prompts_dir, progress=not args.quiet,
                    threads=args.threads)
    for p in paths:
        print(f"wrote {p}")
    return 0


def report_command(args: argparse.Namespace) -> int:
    refuse_empty(args, "--models", "--traces", "--out", noun="path", expected="a directory")
    if args.out is not None and not Path(args.out).is_file():
        check_out_dir(args.out, "--out", replace=False)   # creatable and writable, before the report is computed
    from dsparksim.backend.report import write_report   # numpy/matplotlib only: works without torch
    md = write_report(args.models, args.traces, args.out)
    print(f"wrote {md}")
    return 0
