"""``dsparksim collect``: real acceptance traces from the committed drafter/target pairs.

For each drafter and domain, the eval prompts (held out from training and from STS calibration) are decoded by
exact speculative decoding at the preset's temperature (1.0), ``samples_per_prompt`` responses per prompt, all K
draft tokens verified every step. Each step is one trace row: the accepted prefix length A, the drafter's raw
confidences and the STS-calibrated ones (``models/calibration.json``). One file per drafter,
``traces/real_<drafter>_k<K>.csv.gz``, all three domains inside, readable by
:func:`dsparksim.acceptance.trace_format.read_trace`.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from dsparksim.acceptance.trace_format import read_trace_metadata, write_trace
from dsparksim.errors import InputError
from dsparksim.backend.artifacts import read_calibration, read_training_log
from dsparksim.backend.calibration import apply_sts
from dsparksim.backend.checkpoint import load_drafter, load_target
from dsparksim.backend.config import PRESETS, PipelineConfig, preset
from dsparksim.backend.data import DOMAINS, build_corpus
from dsparksim.backend.drafters import DRAFTERS
from dsparksim.backend.tokenizer import file_sha256, load_tokenizer
from dsparksim.backend.train import decode_domain


def load_models(models: str | Path):
    """(config, tokenizer, target, target meta, calibration dict) from a models directory, all checked."""
    models = Path(models)
    log_path = models / "training_log.json"
    if not log_path.is_file():
        raise InputError(log_path, None, "training log not found (run `dsparksim train`)")
    name = read_training_log(log_path).get("preset")
    if name not in PRESETS:
        raise InputError(log_path, "preset", f"expected one of {sorted(PRESETS)} (the preset `dsparksim train` "
                         f"ran), got {name!r}")
    cfg = preset(name)
    cal_path = models / "calibration.json"
    if not cal_path.is_file():
        raise InputError(cal_path, None, "calibration file not found (run `dsparksim train --stages calibrate`)")
    cal = read_calibration(cal_path)
    target, tmeta = load_target(models / "target.pt")
    tok_path = models / "tokenizer.json"
    tok = load_tokenizer(tok_path, target.cfg.vocab_size, models / "target.pt")
    if tmeta.get("tokenizer_sha256") != file_sha256(tok_path):
        raise InputError(tok_path, "sha256", f"tokenizer differs from the one {models / 'target.pt'} was trained with")
    return cfg, tok, target, tmeta, cal


def check_drafters(drafters) -> tuple[str, ...]:
    """The drafters to collect: known names, at least one, each once (before any model is loaded)."""
    kinds = tuple(drafters)
    bad = [k for k in kinds if k not in DRAFTERS]
    if bad:
        raise InputError("cli", "--drafters", f"unknown drafter {bad[0]!r}; expected a subset of {DRAFTERS}")
    if not kinds:
        raise InputError("cli", "--drafters", f"expected at least one of {DRAFTERS}, got none")
    if len(set(kinds)) != len(kinds):
        raise InputError("cli", "--drafters", f"each drafter once, got {','.join(kinds)}")
    return kinds


def check_replaceable(path: Path) -> None:
    """An existing trace in OUT is replaced only when `dsparksim collect` wrote it (its metadata says so): a file of
    the same name that the user made or edited, or that is no trace, is never overwritten."""
    if not path.exists() and not path.is_symlink():
        return
    try:
        ours = str(read_trace_metadata(path).get("source", "")).startswith("dsparksim collect")
    except InputError:
        ours = False
    if not ours or not path.is_file():
        raise InputError(path, "--out", "exists and was not written by `dsparksim collect` (its metadata does not "
                         "say so); it is never replaced: move it or choose another --out")


def collect_k(kind: str, cfg: PipelineConfig) -> int:
    """The block size ``collect`` decodes drafter ``kind`` at (MTP-1 drafts one token)."""
    return 1 if kind == "mtp1" else cfg.collect.K


def _checked_drafter(models: Path, kind: str, cfg: PipelineConfig, target, tmeta: dict, cal: dict):
    """(drafter, STS temperatures) of one drafter, its block size checked against the preset's collect K."""
    if kind not in cal:
        raise InputError(models / "calibration.json", kind, "no STS temperatures for this drafter")
    drafter, ck = load_drafter(models / f"{kind}.pt", kind, target, tmeta["sha256"])
    K = collect_k(kind, cfg)
    trained = ck["config"].get("K")
    if trained != K:
        raise InputError(models / f"{kind}.pt", "K", f"the drafter was trained for K={trained} but preset "
                         f"{cfg.name!r} collects K={K} (drop --preset or pass the one it was trained with)")
    temps = np.asarray(cal[kind]["temperatures"], dtype=float)
    if temps.size != K:
        raise InputError(models / "calibration.json", kind, f"{temps.size} temperatures for block size {K}")
    return drafter, temps


def describe_target(cfg: PipelineConfig, sha: str) -> str:
    m = cfg.model
    return (f"dsparksim-backend target ({cfg.name}): d_model {m.d_model}, {m.n_layers} layers, {m.n_heads} heads / "
            f"{m.n_kv_heads} kv heads, vocab {m.vocab_size}, sha256 {sha[:12]}")


# Each drafter's decoding seed is cfg.collect.seed + 1000 * (its place here) + domain index: the order of the
# command's default --drafters, so a drafter's trace is the same whichever subset a command collects.
SEED_ORDER = ("dspark", "dflash", "eagle3", "mtp1")


def _decode_trace(cfg: PipelineConfig, tok, target, drafter, kind: str, temps, corpus, progress: bool) -> dict:
    """The trace columns of one drafter over the eval prompts of every domain."""
    cols = {"request_id": [], "domain": [], "step": [], "accepted_len": [], "conf": [], "raw_conf": []}
    rid = 0
    for j, d in enumerate(tqdm(DOMAINS, desc=f"collect {kind}", disable=not progress)):
        A, C = decode_domain(cfg, tok, target, drafter, kind, corpus.prompts["eval"][d], d,
                             seed=cfg.collect.seed + 1000 * SEED_ORDER.index(kind) + j,
                             samples=cfg.collect.samples_per_prompt)
        n, S = A.shape
        cols["request_id"].append(np.repeat(np.arange(rid, rid + n), S))
        cols["domain"].append(np.full(n * S, d, dtype=object))
        cols["step"].append(np.tile(np.arange(S), n))
        cols["accepted_len"].append(A.reshape(-1))
        cols["raw_conf"].append(C.reshape(n * S, -1))
        cols["conf"].append(apply_sts(C.reshape(n * S, -1), temps))
        rid += n
    return {k: np.concatenate(v) for k, v in cols.items()}


def collect(models: str | Path, out: str | Path, drafters=DRAFTERS, preset_name: str | None = None,
            prompts_dir=None, progress=True, threads: int = 2) -> list[Path]:
    """Decode every drafter's traces, then write them: a bad drafter, checkpoint or calibration (or Ctrl-C) stops
    the command before any trace file is written."""
    kinds = check_drafters(drafters)
    torch.set_num_threads(threads)
    models = Path(models)
    cfg, tok, target, tmeta, cal = load_models(models)
    if preset_name is not None:
        cfg = preset(preset_name, model=cfg.model)
    loaded = {kind: _checked_drafter(models, kind, cfg, target, tmeta, cal) for kind in kinds}
    for kind in kinds:
        check_replaceable(Path(out) / f"real_{kind}_k{collect_k(kind, cfg)}.csv.gz")
    corpus = build_corpus(cfg.data, prompts_dir)
    traces = {kind: _decode_trace(cfg, tok, target, drafter, kind, temps, corpus, progress)
              for kind, (drafter, temps) in loaded.items()}
    out = Path(out)
    # each trace is written whole under a temporary folder in OUT, then renamed into place: Ctrl-C while writing
    # never leaves a truncated trace under its final name
    tmp = out / f".collect-{os.getpid()}.tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        # every trace whole before any is renamed: a failure writing the second left the first replaced beside
        # an earlier run's other traces
        written = [_write_one(tmp, kind, data, cfg, tmeta, loaded[kind][1]) for kind, data in traces.items()]
        paths = []
        for p in written:
            os.replace(p, out / p.name)
            paths.append(out / p.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return paths


def _write_one(folder: Path, kind: str, data: dict, cfg: PipelineConfig, tmeta: dict, temps) -> Path:
    """One drafter's trace file ``real_<kind>_k<K>.csv.gz`` in ``folder``, with its metadata."""
    cc = cfg.collect
    K = data["conf"].shape[1]
    meta = {"drafter": kind, "K": K, "temperature": cc.temperature,
            "target": describe_target(cfg, tmeta["sha256"]),
            "source": (f"dsparksim collect: exact speculative decoding (all K verified, rejection sampling) of "
                       f"held-out eval prompts, {cc.samples_per_prompt} responses per prompt, "
                       f"{cc.blocks_mtp1 if kind == 'mtp1' else cc.blocks} blocks per response, seed "
                       f"{cc.seed}; conf = STS-calibrated on separate calib prompts, raw_conf = "
                       + ("confidence head" if kind == "dspark" else "draft probability of the drafted token")
                       + ")"),
            "sts_temperatures": temps.tolist(), "preset": cfg.name}
    return write_trace(folder / f"real_{kind}_k{K}.csv.gz", data, meta, float_format="%.5g")
