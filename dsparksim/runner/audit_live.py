"""Distribution audit of the live engine: the batched engine with the trained drafters keeps the target's
sampling distribution under every lossless policy.

N requests share one prompt x (a held-out math prompt) and generate 3 tokens each at temperature 1 through the
real engine (continuous batching, one flattened forward per step, the policy under audit choosing L[i], exact
rejection sampling of each verified prefix). The first token comes straight from the prefill logits; tokens 2
and 3 come out of speculative steps, so they are the test: given a request's own prefix, token t must follow
the target's p(. | x, t_1..t_{t-1}) (recomputed without a cache, independently of the engine). Each emitted
token is binned by its RANK under that distribution (rank 0 = the target's most likely token): under the null,
rank k has probability p_(k), the k-th largest probability, whatever the prefix, so ranks pool across prefixes.
Pearson's chi-square over ranks 0..23 + "other", pooled over tokens 2 and 3 (expected counts are sums of the
per-request probabilities; a sum of independent categorical draws is less variable than a multinomial with the
averaged probabilities, so the test is, if anything, conservative). Ranks are what a drafter-induced bias moves:
a drafter proposes the target's likely tokens, so a lossy verifier over-emits low ranks.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from scipy import stats

from dsparksim.config import EngineConfig, RunConfig
from dsparksim.traffic import TrafficConfig
from dsparksim.runner.executor import ExecutorConfig

BINS = 24


def audit_live(models: str | Path, profile: str, policies, n_requests: int = 2000, users: int = 64,
               seed: int = 0, prompts_dir=None, tmp: str | Path | None = None, recalibrate: bool = False
               ) -> list[dict]:
    """Chi-square of generated tokens 2..3 against the target, per policy (see module doc); ``recalibrate``:
    the confidence-reading policies wrapped in online recalibration (``audit --recalibrate``)."""
    import tempfile

    from dsparksim.backend.checkpoint import load_target
    from dsparksim.runner.live import PromptSource
    from dsparksim.runner.run import RunnerConfig, real_run

    src = PromptSource.from_models(models, prompts_dir)
    prompt = list(src.enc["math"][0])
    # every request of the audit gets this prompt (a single-prompt source; its length is the workload's)
    d = Path(tmp or tempfile.mkdtemp())
    lengths = d / "audit_lengths.csv"
    lengths.write_text("num_prefill_tokens,num_decode_tokens\n" + f"{len(prompt)},3\n")
    target, _ = load_target(Path(models) / "target.pt")
    rows = []
    for pol in policies:
        t = TrafficConfig(mode="closed", concurrency=users, num_requests=n_requests, lengths=str(lengths),
                          domain="math")
        cfg = RunConfig(policy=pol, profile=profile, acceptance="dspark", mtp1_acceptance="mtp1",
                        engine=EngineConfig(block_size=7, max_num_seqs=users, prefill_chunk_tokens=4096), traffic=t,
                        seed=seed, recalibrate=recalibrate)
        rc = RunnerConfig(executor=ExecutorConfig(temperature=1.0, seed=seed), check_profile=False, mode="live",
                          models=str(models), prompts_dir=prompts_dir)
        out = real_run(cfg, rc, record_outputs=True, prompt_source=_Single(prompt))
        toks = np.array([out.outputs[r][:3] for r in sorted(out.outputs)], np.int64)      # (N, 3)
        obs, exp = _expected(target, prompt, toks)
        chi2, dof, p = _chi2(obs, exp)
        r = out.result
        rows.append({"policy": pol + ("+recal" if recalibrate else ""), "requests": int(len(toks)), "tokens_tested": int(2 * len(toks)),
                     "chi2": chi2, "dof": dof, "p_value": p, "tau": float(1 + r.accepted_tokens.sum() /
                                                                        max(1, r.decode_steps.sum())),
                     "mean_verify_len": float(r.verify_tokens.sum() / max(1, r.decode_steps.sum()))})
    return rows


class _Single:
    """A prompt source that hands every request the same prompt."""

    def __init__(self, prompt):
        self.p = np.asarray(prompt, np.int64)

    def tokens(self, domain: str, n: int) -> np.ndarray:
        if n != len(self.p):
            raise ValueError(f"audit prompt has {len(self.p)} tokens, workload asked for {n}")
        return self.p.copy()


@torch.no_grad()
def _expected(target, prompt: list[int], toks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Observed one-hot ranks and expected rank probabilities (2N, V) for tokens 2 and 3 given each prefix."""
    obs, exp = [], []
    for t in (1, 2):
        prefixes, inv = np.unique(toks[:, :t], axis=0, return_inverse=True)
        seq = torch.as_tensor(np.concatenate([np.tile(prompt, (len(prefixes), 1)), prefixes], 1))
        _, logits = target(seq)
        p = torch.softmax(logits[:, -1].double(), -1).numpy()[inv.reshape(-1)]   # (N, V)
        order = np.argsort(-p, axis=1, kind="stable")                          # token ids by rank
        rank = np.argsort(order, axis=1, kind="stable")[np.arange(len(toks)), toks[:, t]]
        exp.append(np.take_along_axis(p, order, 1))                          # P(rank = k)
        o = np.zeros_like(p)
        o[np.arange(len(toks)), rank] = 1
        obs.append(o)
    return np.concatenate(obs), np.concatenate(exp)


def _chi2(obs: np.ndarray, exp: np.ndarray) -> tuple[float, int, float]:
    O, E = obs.sum(0), exp.sum(0)
    top = np.arange(BINS)                                # ranks 0..BINS-1, then everything else
    rest = np.arange(BINS, len(E))
    o = np.append(O[top], O[rest].sum())
    e = np.append(E[top], E[rest].sum())
    chi2 = float(((o - e) ** 2 / e).sum())
    dof = len(o) - 1
    return chi2, dof, float(stats.chi2.sf(chi2, dof))
