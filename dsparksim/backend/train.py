"""The training pipeline: tokenizer -> target -> four distilled drafters -> STS calibration.

Writes into ``out`` (default ``models/``): ``tokenizer.json``, ``target.pt``, ``{mtp1,eagle3,dflash,dspark}.pt``,
``calibration.json`` (STS temperatures per drafter, fitted on blocks decoded from the calib prompts) and
``training_log.json`` (preset, seeds, per-stage wall time, losses, parameter counts, file sizes). Every stage is
seeded (``torch.manual_seed`` + one numpy Generator per stage), so a rerun on the same machine reproduces the
checkpoints up to floating-point nondeterminism of multi-threaded CPU kernels.
"""
from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from dsparksim.backend.artifacts import read_training_log
from dsparksim.backend.calibration import apply_sts, fit_sts
from dsparksim.backend.checkpoint import load_drafter, load_target, save
from dsparksim.backend.config import PipelineConfig
from dsparksim.backend.data import DOMAINS, Corpus, build_corpus
from dsparksim.backend.drafters import DRAFTERS, DrafterConfig, build_drafter
from dsparksim.backend.model import TargetModel, lr_at, n_params
from dsparksim.backend.specdec import speculative_generate
from dsparksim.backend.tokenizer import file_sha256, load_tokenizer, train_tokenizer
from dsparksim.acceptance.confidence import ece_survival
from dsparksim.errors import InputError
from dsparksim.results.outputs import atomic_write

STAGES = ("tokenizer", "target", "drafters", "calibrate")


class Streams:
    """Token streams per domain (train part and a 5% held-out tail for validation loss)."""

    def __init__(self, tok, corpus: Corpus, weights, rng: np.random.Generator):
        self.train, self.val = {}, {}
        for d in DOMAINS:
            ids = np.concatenate([np.asarray(e.ids, np.int64) for e in tok.encode_batch(corpus.train[d])])
            cut = int(len(ids) * 0.95)
            self.train[d], self.val[d] = ids[:cut], ids[cut:]
        w = np.asarray(weights, float)
        self.w = w / w.sum()
        self.rng = rng

    def batch(self, B: int, T: int) -> torch.Tensor:
        doms = self.rng.choice(len(DOMAINS), size=B, p=self.w)
        rows = []
        for di in doms:
            s = self.train[DOMAINS[di]]
            o = int(self.rng.integers(0, len(s) - T - 1))
            rows.append(s[o:o + T + 1])
        return torch.from_numpy(np.stack(rows))

    def val_batches(self, d: str, T: int, n: int):
        s = self.val[d]
        step = max(1, (len(s) - T - 1) // n)
        return [torch.from_numpy(s[o:o + T + 1][None]) for o in range(0, len(s) - T - 1, step)][:n]

    def n_tokens(self) -> dict[str, int]:
        return {d: int(len(self.train[d])) for d in DOMAINS}


def _opt(params, lr):
    return torch.optim.AdamW([p for p in params if p.requires_grad], lr=lr, betas=(0.9, 0.95), weight_decay=0.01)


def train_target(cfg: PipelineConfig, streams: Streams, progress=True) -> tuple[TargetModel, dict]:
    torch.manual_seed(cfg.seed)
    m = TargetModel(cfg.model)
    tc = cfg.target
    opt = _opt(m.parameters(), tc.lr)
    losses = []
    bar = tqdm(range(tc.steps), desc="target", disable=not progress, mininterval=2)
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, tc.steps, tc.lr, tc.warmup)
        x = streams.batch(tc.batch, tc.seq_len)
        _, logits = m(x[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 20 == 0:
            bar.set_postfix(loss=f"{np.mean(losses[-20:]):.3f}")
    m.eval()
    for p in m.parameters():
        p.requires_grad_(False)
    val = {}
    with torch.no_grad():
        for d in DOMAINS:
            ls = [float(F.cross_entropy(m(x[:, :-1])[1][0], x[0, 1:])) for x in streams.val_batches(d, tc.seq_len, 8)]
            val[d] = float(np.mean(ls)) if ls else float("nan")
    return m, {"final_train_loss": float(np.mean(losses[-50:])), "val_loss": val}


def drafter_config(cfg: PipelineConfig, kind: str) -> DrafterConfig:
    K = 1 if kind == "mtp1" else cfg.collect.K
    return DrafterConfig(kind, K, n_layers=cfg.dflash_layers, markov_rank=cfg.markov_rank,
                         ttt_steps=min(cfg.eagle3_ttt, K))


def train_drafter(cfg: PipelineConfig, kind: str, target: TargetModel, streams: Streams, progress=True):
    """Distil one drafter from the frozen target. dflash and dspark see identical batches and anchors."""
    torch.manual_seed(cfg.seed + 1)
    dcfg = drafter_config(cfg, kind)
    m = build_drafter(cfg.model, dcfg)
    tc = cfg.drafter
    opt = _opt(m.parameters(), tc.lr)
    losses, conf = [], []
    bar = tqdm(range(tc.steps), desc=kind, disable=not progress, mininterval=2)
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, tc.steps, tc.lr, tc.warmup)
        x = streams.batch(tc.batch, tc.seq_len)[:, :-1]
        with torch.no_grad():
            hs, tl = target(x)
        loss, extra = m.loss(target, x, hs, tl)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if "conf_bce" in extra:
            conf.append(extra["conf_bce"].item())
        if step % 20 == 0:
            bar.set_postfix(loss=f"{np.mean(losses[-20:]):.3f}")
    m.eval()
    info = {"final_loss": float(np.mean(losses[-50:]))}
    if conf:
        info["final_conf_bce"] = float(np.mean(conf[-50:]))
    return m, dcfg, info


def encode_prompts(tok, texts: list[str], max_tokens: int, keep: str) -> list[list[int]]:
    """Token ids of prompts, truncated to ``max_tokens`` keeping the start ('head') or the end ('tail')."""
    out = []
    for e in tok.encode_batch(texts):
        ids = list(e.ids)
        ids = ids[:max_tokens] if keep == "head" else ids[-max_tokens:]
        out.append(ids)
    return out


PROMPT_KEEP = {"math": "tail", "code": "head", "chat": "head"}


def decode_domain(cfg: PipelineConfig, tok, target, drafter, kind: str, texts: list[str], domain: str,
                  seed: int, samples: int):
    """Speculative decoding over prompts (``samples`` responses each): (accepted (n,S), conf (n,S,K))."""
    cc = cfg.collect
    K = 1 if kind == "mtp1" else cc.K
    steps = cc.blocks_mtp1 if kind == "mtp1" else cc.blocks
    prompts = encode_prompts(tok, texts, cc.max_prompt_tokens, PROMPT_KEEP[domain]) * samples
    gen = torch.Generator().manual_seed(seed)
    res = speculative_generate(target, drafter, prompts, K, steps, cc.temperature, gen)
    return res.accepted, res.conf


def calibrate(cfg: PipelineConfig, tok, target, drafters: dict, corpus: Corpus, progress=True) -> dict:
    """Fit STS per drafter on blocks decoded from the calib prompts (all domains pooled)."""
    out = {}
    for i, (kind, m) in enumerate(tqdm(drafters.items(), desc="calibrate", disable=not progress)):
        A, C = [], []
        for j, d in enumerate(DOMAINS):
            a, c = decode_domain(cfg, tok, target, m, kind, corpus.prompts["calib"][d], d, cfg.seed + 100 * i + j,
                                 cfg.collect.calib_samples_per_prompt)
            A.append(a.reshape(-1))
            C.append(c.reshape(-1, c.shape[-1]))
        A, C = np.concatenate(A), np.concatenate(C)
        temps = fit_sts(C, A)
        out[kind] = {"temperatures": temps.tolist(), "calib_blocks": int(A.size),
                     "ece_raw": ece_survival(C, A), "ece_calibrated": ece_survival(apply_sts(C, temps), A)}
    return out


STAGE_FILES = {"tokenizer": ("tokenizer.json",), "target": ("target.pt",),
               "drafters": tuple(f"{k}.pt" for k in DRAFTERS), "calibrate": ("calibration.json",)}


def missing_stage_inputs(out: str | Path, stages) -> list[Path]:
    """The files of earlier stages that the requested ``stages`` read from ``out`` and that are not there (a stage
    reads what every stage before it wrote: ``--stages drafters`` needs tokenizer.json and target.pt)."""
    last = max(STAGES.index(s) for s in stages)
    return [Path(out) / f for s in STAGES[:last] if s not in stages for f in STAGE_FILES[s]
            if not (Path(out) / f).is_file()]


def run_pipeline(cfg: PipelineConfig, out: str | Path, stages=STAGES, prompts_dir=None, progress=True,
                 threads: int = 2) -> dict:
    """Run the requested stages; later stages load earlier results from ``out`` (checked before anything is
    written); a stage's outputs are loaded only when a later requested stage reads them."""
    missing = missing_stage_inputs(out, stages)
    if missing:
        raise InputError(missing[0], "--stages", f"needed by --stages {','.join(stages)} but not found (run the "
                         "earlier stages first, or point --out at the models directory that holds them)")
    torch.set_num_threads(threads)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "training_log.json"
    log = read_training_log(log_path) if log_path.is_file() else {}
    # the code corpus is the running interpreter's stdlib: record which one
    log.update({"preset": cfg.name, "config": cfg.to_dict(), "torch": torch.__version__, "threads": threads,
                "python": platform.python_version()})
    log.setdefault("seconds", {})
    t0 = time.time()
    corpus = build_corpus(cfg.data, prompts_dir)
    log["seconds"]["data"] = round(time.time() - t0, 1)
    log["data_sources"] = corpus.sources
    tok_path = out / "tokenizer.json"
    if "tokenizer" in stages:
        t0 = time.time()
        docs = [x for d in DOMAINS for x in corpus.train[d]]
        tok = train_tokenizer(docs, cfg.model.vocab_size)
        atomic_write(tok_path, lambda t: tok.save(str(t)))
        log["seconds"]["tokenizer"] = round(time.time() - t0, 1)
    tok = load_tokenizer(tok_path, cfg.model.vocab_size)
    tok_sha = file_sha256(tok_path)
    streams = Streams(tok, corpus, cfg.domain_weights, np.random.default_rng(cfg.seed))
    log["train_tokens"] = streams.n_tokens()
    if "target" in stages:
        t0 = time.time()
        target, info = train_target(cfg, streams, progress)
        sec = round(time.time() - t0, 1)
        sha = save(out / "target.pt", "target", cfg.model, target, tokenizer_sha256=tok_sha,
                   meta={"train_seconds": sec, **info})
        log["seconds"]["target"] = sec
        log["target"] = {"params": n_params(target), "sha256": sha, **info}
    if "drafters" in stages or "calibrate" in stages:
        _drafter_stages(cfg, out, stages, log, streams, tok, tok_sha, corpus, progress)
    log["sizes_bytes"] = {p.name: p.stat().st_size for p in sorted(out.glob("*.pt"))}
    log["sizes_bytes"]["tokenizer.json"] = tok_path.stat().st_size
    log["total_weight_bytes"] = sum(v for k, v in log["sizes_bytes"].items() if k.endswith(".pt"))
    atomic_write(log_path, lambda t: t.write_text(json.dumps(log, indent=1)))
    return log


def _drafter_stages(cfg: PipelineConfig, out: Path, stages, log: dict, streams: Streams, tok, tok_sha: str,
                    corpus: Corpus, progress: bool) -> None:
    """The drafters and calibrate stages (both read the target)."""
    target, tmeta = load_target(out / "target.pt", tok_sha)
    if "drafters" in stages:
        for kind in DRAFTERS:
            streams.rng = np.random.default_rng(cfg.seed + 1)        # identical batches for every drafter
            t0 = time.time()
            m, dcfg, info = train_drafter(cfg, kind, target, streams, progress)
            sec = round(time.time() - t0, 1)
            save(out / f"{kind}.pt", kind, dcfg, m, tokenizer_sha256=tok_sha, target_sha256=tmeta["sha256"],
                 meta={"train_seconds": sec, **info})
            log["seconds"][kind] = sec
            log.setdefault("drafters", {})[kind] = {"params": n_params(m), **info}
    if "calibrate" in stages:
        drafters = {kind: load_drafter(out / f"{kind}.pt", kind, target, tmeta["sha256"])[0] for kind in DRAFTERS}
        t0 = time.time()
        cal = calibrate(cfg, tok, target, drafters, corpus, progress)
        atomic_write(out / "calibration.json", lambda t: t.write_text(json.dumps(cal, indent=1)))
        log["seconds"]["calibrate"] = round(time.time() - t0, 1)
