"""Engine options of issue 29 (2.5, 2.6): early exit of drafting (--draft-exit) and padded verification
(--pad-verify). Early exit never changes the accepted tokens of a request it did not stop; padding prices the
padded batch and changes nothing else; both are repriced exactly from the step log."""
from __future__ import annotations

import numpy as np
import pytest

from dsparksim.config import RunConfig
from dsparksim.cost.profile import load_profile
from dsparksim.errors import ConfigError
from dsparksim.policies.base import Policy
from dsparksim.sim.early_exit import drafted_lengths, mask_undrafted, position_counts
from dsparksim.sim.scheduler import reprice_steps
from dsparksim.sim.simulate import simulate

PROD = {"profile": "built-h200x8-deepseek-v3-tp8", "disaggregated": True, "kv_transfer_gbps": 400.0,
        "prefill_replicas": 8, "block_size": 5, "domain": "mix:math=1,code=1,chat=6", "lengths": "azure-conv",
        "concurrency": 48, "duration_s": 4.0, "warmup_s": 0.5}


class Recorder(Policy):
    """Records, per decoding request and per its own decode step j, what was drafted, verified and accepted."""

    def __init__(self, inner: Policy) -> None:
        self.inner, self.spec, self.name = inner, inner.spec, inner.name
        self.needs_oracle, self.drafter, self.block_size = inner.needs_oracle, inner.drafter, inner.block_size
        self.drafts, self.reads_confidence = inner.drafts, inner.reads_confidence
        self.drafted: np.ndarray | None = None
        self.steps: dict[int, int] = {}
        self.log: dict[tuple[int, int], tuple[int, int, int]] = {}   # (request, j) -> (drafted, L, accepted)

    def reset(self, K, rng):
        self.inner.reset(K, rng)

    def choose(self, ctx):
        K = ctx.K
        self.drafted = ctx.drafted if ctx.drafted is not None else np.full(ctx.n, K)
        if ctx.drafted is not None:   # the policy sees no confidence past the drafted positions
            past = np.arange(K)[None, :] >= ctx.drafted[:, None]
            assert (ctx.conf[past] == 0).all() and (ctx.survival[past] == 0).all()
        return self.inner.choose(ctx)

    def observe(self, ids, L, a):
        for i, d, l_, a_ in zip(ids.tolist(), self.drafted.tolist(), L.tolist(), a.tolist()):
            j = self.steps.get(i, 0)
            self.steps[i] = j + 1
            self.log[(i, j)] = (d, l_, a_)
        self.inner.observe(ids, L, a)


def _run(policy: str, acceptance: str = "eagle3", **extra):
    cfg = RunConfig.from_options(PROD | {"policy": policy, "acceptance": acceptance, "seed": 3} | extra)
    rec: list[Recorder] = []
    out = simulate(cfg, wrap_policy=lambda p: rec.append(Recorder(p)) or rec[0])
    return cfg, out, rec[0]


def test_drafted_lengths_and_mask():
    s = np.array([[0.9, 0.6, 0.4, 0.2], [0.2, 0.1, 0.05, 0.0], [1.0, 1.0, 0.95, 0.9], [0.5, 0.5, 0.49, 0.1]])
    np.testing.assert_array_equal(drafted_lengths(s, 0.5), [3, 1, 4, 3])
    np.testing.assert_array_equal(drafted_lengths(s, 0.0), [4, 4, 4, 4])   # threshold 0: nothing stops
    np.testing.assert_array_equal(drafted_lengths(s, 1.0), [1, 1, 3, 1])
    c, m = mask_undrafted(s, s, np.array([3, 1, 4, 3]))
    assert (m[0] == [0.9, 0.6, 0.4, 0]).all() and (m[1, 1:] == 0).all() and (m[2] == s[2]).all()
    assert (s[0] == [0.9, 0.6, 0.4, 0.2]).all()    # the input is untouched


def test_draft_time_exit_prices_what_is_drafted():
    prof = load_profile("built-h200x8-deepseek-v3-tp8")
    full = np.full(5, 40)
    for d in ("eagle3", "dspark", "mtp1"):
        K = 1 if d == "mtp1" else 5
        assert prof.draft_time_exit(d, np.full(K, 40), K) == pytest.approx(prof.draft_time(d, 40, K), rel=1e-12)
    # autoregressive: position j is one forward over the requests still drafting it
    dr = position_counts(np.array([1] * 10 + [3] * 20 + [5] * 10), 5)
    np.testing.assert_array_equal(dr, [40, 30, 30, 10, 10])
    ar = prof.drafters["eagle3"]

    def fwd(n):
        return float(ar.time_s[np.searchsorted(ar.tokens, n, side="right") - 1])
    assert prof.draft_time_exit("eagle3", dr, 5) == pytest.approx(fwd(40) + 2 * fwd(30) + 2 * fwd(10), rel=1e-12)
    # parallel: the backbone over n*K tokens is paid whole; only the Markov head's share follows the positions
    frac = prof.drafters["dspark"].markov_overhead_frac
    base = prof.draft_time("dflash", 40, 5)
    assert prof.draft_time_exit("dspark", dr, 5) == pytest.approx(base * (1 + frac * 120 / 200), rel=1e-12)
    assert prof.draft_time_exit("dspark", dr, 5) < prof.draft_time("dspark", 40, 5)
    assert prof.draft_time_exit("eagle3", full, 5) > prof.draft_time_exit("eagle3", dr, 5)
    with pytest.raises(ConfigError, match="non-increasing"):
        prof.draft_time_exit("eagle3", np.array([10, 12, 3, 2, 1]), 5)


@pytest.mark.parametrize("policy", ["fixed:5", "confidence-async:2"])
def test_early_exit_never_changes_accepted_tokens_of_unstopped_requests(policy):
    """Paired draws: request i's j-th decode step has the same drawn block with and without early exit. A request
    the drafter did not stop (drafted all K) accepts what it accepts without early exit at the same verify length;
    every request accepts min(L, A) with A its accepted prefix under full drafting and verification."""
    _, _, full = _run("fixed:5")                      # A: the accepted prefix with all K drafted and verified
    _, _, ref = _run(policy)                          # the same policy without early exit
    _, _, ex = _run(policy, draft_exit=0.4)
    common = set(full.log) & set(ex.log)
    assert len(common) > 500
    stopped = unstopped = 0
    for key in common:
        d, L, a = ex.log[key]
        A = full.log[key][2]
        assert L <= d and a == min(L, A)
        if d == 5:
            unstopped += 1
            if key in ref.log and ref.log[key][1] == L:
                assert ref.log[key][2] == a
        else:
            stopped += 1
            assert a <= d
    assert stopped > 50 and unstopped > 50
    if policy == "fixed:5":   # a per-request policy: an unstopped request verifies and accepts exactly as before
        for key in common & set(ref.log):
            if ex.log[key][0] == 5:
                assert ex.log[key][1:] == ref.log[key][1:]


def test_early_exit_saves_drafting_and_reprices_exactly():
    cfg0, base, _ = _run("fixed:5")
    cfg, out, rec = _run("fixed:5", draft_exit=0.4)
    st = out.result.steps
    dec = np.asarray(st["n_decode"]) > 0
    assert (np.asarray(st["draft_s"])[dec] <= np.asarray(st["draft_full_s"])[dec] + 1e-15).all()
    assert np.asarray(st["draft_s"]).sum() < 0.9 * np.asarray(st["draft_full_s"]).sum()
    assert (np.asarray(st["drafted"])[dec] <= 5 * np.asarray(st["n_decode"])[dec]).all()
    prof = load_profile(cfg.profile)
    rp = reprice_steps(prof, st, out.summary["drafter"], 5)
    np.testing.assert_array_equal(rp, np.asarray(st["dt"]))
    # threshold 0 stops nothing: the very same run as without the option, priced the same up to rounding
    _, zero, _ = _run("fixed:5", draft_exit=0.0)
    np.testing.assert_array_equal(zero.result.steps["verify_tokens"], base.result.steps["verify_tokens"])
    np.testing.assert_allclose(zero.result.steps["dt"], base.result.steps["dt"], rtol=1e-12, atol=0)


def test_pad_verify_prices_the_padded_batch():
    _, plain, _ = _run("confidence-async:2", acceptance="dspark")
    cfg, pad, _ = _run("confidence-async:2", acceptance="dspark", pad_verify=True)
    st = pad.result.steps
    dec = np.asarray(st["n_decode"]) > 0
    pt = np.asarray(st["pad_tokens"])
    assert (pt >= 0).all() and pt[dec].sum() > 0 and (pt[~dec] == 0).all()
    # no step verifies more than the padded batch, and padding never shows up as verified tokens
    assert (np.asarray(st["verify_tokens"]) + pt <= 5 * np.asarray(st["n_decode"])).all()
    np.testing.assert_array_equal(reprice_steps(load_profile(cfg.profile), st, "dspark", 5), np.asarray(st["dt"]))
    assert pad.summary["output_throughput_tok_s"] < plain.summary["output_throughput_tok_s"]
    # a fixed length pads nothing: the same run bit for bit
    _, f0, _ = _run("fixed:5", acceptance="dspark")
    _, f1, _ = _run("fixed:5", acceptance="dspark", pad_verify=True)
    np.testing.assert_array_equal(f0.result.steps["dt"], f1.result.steps["dt"])
    assert (np.asarray(f1.result.steps["pad_tokens"]) == 0).all()


def test_options_are_checked(tmp_path, capsys):
    with pytest.raises(ConfigError, match="draft_exit"):
        RunConfig.from_options(PROD | {"draft_exit": 1.5})
    from dsparksim.cli.main import main
    assert main(["run", "--profile", "built-h200x8-deepseek-v3-tp8", "--draft-exit", "2", "--duration", "1",
                 "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--draft-exit" in err[0] and "[0, 1]" in err[0]
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("policies", [["none"], ["mtp1"], ["none", "mtp1"]])
def test_draft_exit_is_refused_where_no_policy_drafts_a_block(tmp_path, capsys, policies):
    """none drafts nothing and MTP-1 drafts one token: --draft-exit would change nothing (the same run bit for bit),
    so it is refused in one line, as every option no policy reads."""
    from dsparksim.cli.main import main
    from dsparksim.sim.reads import policy_reads

    assert not any("draft_exit" in policy_reads(p) for p in policies)
    assert "draft_exit" in policy_reads("fixed:5") and "draft_exit" in policy_reads("confidence-async:2")
    out = tmp_path / "r"
    argv = (["run", "--policy", policies[0]] if len(policies) == 1 else
            ["frontier", "--policies", ",".join(policies), "--concurrency-levels", "1,2"])
    assert main([*argv, "--draft-exit", "0.3", "--duration", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--draft-exit" in err[0] and "has no effect" in err[0], err
    assert not out.exists()


class ChoiceRecorder(Recorder):
    """Records, per decode step, how many draft tokens the policy itself chose past the drafted positions (before
    the engine's cap) and how many requests were stopped early."""

    def __init__(self, inner: Policy) -> None:
        super().__init__(inner)
        self.past: list[int] = []
        self.stopped = 0

    def choose(self, ctx):
        L = np.asarray(super().choose(ctx), np.int64)
        if ctx.drafted is not None:
            self.past.append(int(np.maximum(L - ctx.drafted, 0).sum()))
            self.stopped += int((ctx.drafted < ctx.K).sum())
        return L


@pytest.mark.parametrize("policy", ["confidence-async:2", "confidence-global", "confidence", "fixed:5"])
def test_no_policy_chooses_a_position_that_was_not_drafted_in_a_run(policy):
    """The dense 7B H100 profile's staircase is cheaper further up (T(1) > T(8)): counting the undrafted positions
    as survival-0 candidates, confidence-async:2's global search chose them on about half the decode steps (16-64
    users, T = 0.5) for a batch the engine, which verifies at most the drafted positions, never ran."""
    cfg = RunConfig.from_options({"profile": "h100-llama2-7b-tp1", "kv_policy": "paged", "block_size": 5,
                                  "acceptance": "dspark", "domain": "mix:math=1,code=1,chat=6",
                                  "lengths": "azure-conv", "concurrency": 16, "duration_s": 4.0, "warmup_s": 0.5,
                                  "policy": policy, "seed": 0, "draft_exit": 0.5})
    rec: list[ChoiceRecorder] = []
    simulate(cfg, wrap_policy=lambda p: rec.append(ChoiceRecorder(p)) or rec[0])
    assert len(rec[0].past) > 100 and rec[0].stopped > 100
    assert sum(rec[0].past) == 0
