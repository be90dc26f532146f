"""Live-drafter mode of the real engine: the committed drafters decide acceptance inside the batched engine."""
torch = __import__("pytest").importorskip("torch")

import json  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from scipy import stats  # noqa: E402

from dsparksim.acceptance.trace_format import read_trace  # noqa: E402
from dsparksim.backend.checkpoint import load_target  # noqa: E402
from dsparksim.backend.specdec import greedy_reference, verify_prefix  # noqa: E402
from dsparksim.config import EngineConfig, RunConfig  # noqa: E402
from dsparksim.errors import ConfigError  # noqa: E402
from dsparksim.runner.executor import ExecutorConfig  # noqa: E402
from dsparksim.runner.live import PromptSource  # noqa: E402
from dsparksim.runner.run import RunnerConfig, real_run  # noqa: E402
from dsparksim.traffic import TrafficConfig  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / "models"
PROMPTS = REPO.parent / "shared" / "data" / "prompts"
pytestmark = pytest.mark.skipif(not PROMPTS.is_dir(), reason="needs ../shared/data/prompts (eval prompts)")


@pytest.fixture(scope="module")
def profile4(tmp_path_factory):
    """The shipped CPU profile with every drafter priced (timing is irrelevant to these tests)."""
    d = json.loads((REPO / "profiles" / "cpu-tiny.json").read_text())
    for k in ("eagle3", "dflash"):
        d["drafters"][k] = d["drafters"]["dspark"]
    p = tmp_path_factory.mktemp("prof") / "p.json"
    p.write_text(json.dumps(d))
    return str(p)


def _lengths(tmp_path, prompt=(8, 60), out=(10, 40), n=40, fixed=None):
    rng = np.random.default_rng(0)
    if fixed:
        rows = [fixed] * n
    else:
        rows = zip(rng.integers(prompt[0], prompt[1], n), rng.integers(out[0], out[1], n))
    p = tmp_path / "len.csv"
    p.write_text("num_prefill_tokens,num_decode_tokens\n" + "\n".join(f"{a},{b}" for a, b in rows) + "\n")
    return str(p)


def _run(profile, lengths, policy, drafter="dspark", temperature=0.0, users=4, n=8, domain="mix:math=1,code=1,chat=1",
         chunk=32, seed=3):
    t = TrafficConfig(mode="closed", concurrency=users, num_requests=n, lengths=lengths, domain=domain)
    cfg = RunConfig(policy=policy, profile=profile, acceptance="traces/real_dspark_k7.csv.gz",
                    engine=EngineConfig(block_size=7, max_num_seqs=users, max_batched_tokens=512,
                                        prefill_chunk_tokens=chunk), traffic=t, seed=seed)
    rc = RunnerConfig(executor=ExecutorConfig(temperature=temperature), check_profile=False, mode="live",
                      models=str(MODELS), live_drafter=drafter)
    return real_run(cfg, rc, record_outputs=True)


@pytest.mark.parametrize("policy,drafter", [("fixed:7", "dspark"), ("confidence", "dspark"), ("mtp1", "dspark"),
                                            ("confidence-async:2", "eagle3"), ("threshold:0.5", "dspark"), ("goodput", "dflash")])
def test_live_engine_at_temperature_0_is_the_targets_greedy_decode(profile4, tmp_path, policy, drafter):
    # Batched, variable verify lengths in ONE flattened forward, chunked prefill (chunk 32 < prompts up to 60),
    # requests joining and leaving: every request's output is still the target's greedy decode token for token.
    out = _run(profile4, _lengths(tmp_path), policy, drafter)
    r = out.result
    assert r.completed.all() and (r.emitted_tokens == r.output_tokens).all()
    assert (r.accepted_tokens <= r.verify_tokens).all()
    if policy not in ("mtp1", "threshold:0.5"):
        assert r.verify_tokens.sum() > r.decode_steps.sum()          # more than one draft verified per step
    target, _ = load_target(MODELS / "target.pt")
    for row, toks in out.outputs.items():
        n = int(r.output_tokens[row])
        assert toks[:n] == greedy_reference(target, out.prompts[row].tolist(), n), f"row {row}"


def test_verify_prefix_keeps_the_target_distribution():
    # Fixed target distributions p_0..p_3 and drafter distributions q_1..q_3 over 4 tokens; for every verify
    # length L the first emitted token must follow p_0 and, after an accepted first draft, the second p_1.
    # 60,000 draws per L; chi-square goodness of fit at alpha = 1e-3 (power > 0.99 against a 0.02 shift in
    # any probability at this sample size).
    g = torch.Generator().manual_seed(0)
    V, K, N = 4, 3, 60_000
    p = torch.tensor([[0.5, 0.2, 0.2, 0.1], [0.1, 0.6, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25], [0.7, 0.1, 0.1, 0.1]])
    q = torch.tensor([[0.1, 0.1, 0.4, 0.4], [0.3, 0.3, 0.2, 0.2], [0.6, 0.2, 0.1, 0.1]])
    logits = p.log()[None].expand(N, K + 1, V)
    for L in range(K + 1):
        d = torch.stack([torch.multinomial(q[k], N, replacement=True, generator=g) for k in range(K)], 1)
        A, new = verify_prefix(logits, d, q[None].expand(N, K, V), torch.full((N,), L), 1.0, g)
        assert int(A.max()) <= L
        first = torch.where(A >= 1, d[:, 0], new)
        obs = np.bincount(first.numpy(), minlength=V)
        assert stats.chisquare(obs, N * p[0].double().numpy() / p[0].double().sum().item()).pvalue > 1e-3, (L, obs)
        if L >= 1:
            m = A >= 1
            second = torch.where(A[m] >= 2, d[m, 1], new[m])
            obs2 = np.bincount(second.numpy(), minlength=V)
            assert stats.chisquare(obs2, obs2.sum() * p[1].double().numpy() / p[1].double().sum().item()).pvalue > 1e-3, (L, obs2)


def test_live_acceptance_matches_the_trace_collected_from_the_same_models(profile4, tmp_path):
    # Temperature 1, every draft verified (fixed:7), code and chat prompts at 96 tokens (their native length for
    # most eval prompts) and 36-token outputs (inside the traces' 20-block horizon). The live tau per domain must
    # agree with the shipped trace's within 3.5 combined standard errors (request-clustered) - a mismatch means
    # the batched engine's drafting/verification differs from `dsparksim collect`'s single-request path.
    import pandas as pd
    tr = read_trace(REPO / "traces" / "real_dspark_k7.csv.gz")
    df = pd.DataFrame({"request_id": tr.request_id, "domain": tr.domain, "accepted_len": tr.accepted})
    for dom in ("code", "chat"):
        out = _run(profile4, _lengths(tmp_path, fixed=(96, 36), n=10), "fixed:7", temperature=1.0, users=8, n=48,
                   domain=dom, chunk=256, seed=11)
        r = out.result
        per_req = r.accepted_tokens / r.decode_steps
        live, se_live = 1 + r.accepted_tokens.sum() / r.decode_steps.sum(), per_req.std(ddof=1) / np.sqrt(len(per_req))
        x = df[df["domain"] == dom]
        pr = x.groupby("request_id")["accepted_len"].mean()
        ref, se_ref = 1 + x["accepted_len"].mean(), pr.std(ddof=1) / np.sqrt(len(pr))
        assert abs(live - ref) < 3.5 * np.hypot(se_live, se_ref), (dom, live, ref, se_live, se_ref)


def test_prompt_source_uses_native_lengths_then_packs_with_end_of_text():
    ps = PromptSource({"math": [[5, 6, 7], [8, 9]], "code": [[1]], "chat": [[2, 3]]}, sep=0)
    assert ps.tokens("math", 2).tolist() == [8, 9]                  # a prompt of exactly that length exists
    assert ps.tokens("math", 3).tolist() == [5, 6, 7]
    # no 4-token math prompt: prompt 0 with the one before it packed in front, separated by end-of-text
    assert ps.tokens("math", 4).tolist() == [0, 5, 6, 7]
    assert ps.tokens("math", 6).tolist() == [5, 6, 7, 0, 8, 9]       # next request: prompt 1, prompt 0 before it
    with pytest.raises(ConfigError, match="domain"):
        ps.tokens("poetry", 3)


def test_live_mode_refuses_a_profile_with_proxy_drafting_costs(tmp_path):
    t = TrafficConfig(mode="closed", concurrency=2, num_requests=2, lengths=_lengths(tmp_path), domain="chat")
    cfg = RunConfig(policy="fixed:7", profile=str(REPO / "profiles" / "cpu-tiny.json"),
                    acceptance="traces/real_dspark_k7.csv.gz", engine=EngineConfig(block_size=7, max_num_seqs=2),
                    traffic=t)
    with pytest.raises(ConfigError, match="runner_model|drafting"):
        real_run(cfg, RunnerConfig(mode="live", models=str(MODELS)))


def test_live_mode_refuses_a_block_size_the_drafter_was_not_trained_for(profile4, tmp_path):
    t = TrafficConfig(mode="closed", concurrency=2, num_requests=2, lengths=_lengths(tmp_path), domain="chat")
    cfg = RunConfig(policy="fixed:5", profile=profile4, acceptance="traces/real_dspark_k7.csv.gz",
                    engine=EngineConfig(block_size=5, max_num_seqs=2), traffic=t)
    with pytest.raises(ConfigError, match="K=7"):
        real_run(cfg, RunnerConfig(mode="live", models=str(MODELS), check_profile=False))


def test_live_audit_passes_lossless_policies_and_catches_a_lossy_verifier(monkeypatch):
    # 800 requests x tokens 2..3 per policy through the batched live engine, chi-square on the tokens' ranks under
    # the target (see dsparksim.runner.audit_live), alpha = 1e-3. Measured at seed 0: fixed:7 p = 0.66; the lossy
    # verifier below (correction drawn from p instead of the residual max(0, p - q)) p = 7e-8.
    from dsparksim.runner import audit_live as al
    from dsparksim.runner import live

    prof = str(REPO / "profiles" / "cpu-tiny.json")
    for r in al.audit_live(MODELS, prof, ["fixed:7", "confidence"], n_requests=800, seed=0):
        assert r["p_value"] > 1e-3, r
        assert r["mean_verify_len"] > 1.0                                # drafts were really verified

    def lossy(logits, d, q, L, temperature, gen):
        B, K = d.shape
        b = torch.arange(B)
        p = torch.softmax(logits.float() / temperature, -1)
        pd, qd = p[:, :K].gather(-1, d[..., None])[..., 0], q.float().gather(-1, d[..., None])[..., 0]
        ok = (torch.rand(B, K, generator=gen) * qd < pd) & (torch.arange(K)[None] < L[:, None])
        A = ok.long().cumprod(1).sum(1)
        return A, torch.multinomial(p[b, A], 1, generator=gen)[:, 0]
    monkeypatch.setattr(live, "verify_prefix", lossy)
    (r,) = al.audit_live(MODELS, prof, ["fixed:7"], n_requests=800, seed=0)
    assert r["p_value"] < 1e-3, r


def test_live_audit_recalibrate_wraps_the_policies(monkeypatch):
    """audit --live --recalibrate: every audited run has recalibrate set (a TypeError traceback before)."""
    from dsparksim.runner import audit_live as al

    seen = []

    def spy(cfg, rc, **kw):
        seen.append(cfg.recalibrate)
        return real_run(cfg, rc, **kw)
    import dsparksim.runner.run as runmod
    monkeypatch.setattr(runmod, "real_run", spy)     # audit_live imports it at call time
    prof = str(REPO / "profiles" / "cpu-tiny.json")
    (r,) = al.audit_live(MODELS, prof, ["confidence"], n_requests=16, users=8, seed=0, recalibrate=True)
    assert seen == [True] and r["policy"] == "confidence+recal" and r["requests"] == 16


def test_run_real_live_cli_with_the_shipped_live_profile(tmp_path):
    # The shipped profile was measured on live steps of the committed pair (its model key matches a live run's);
    # it drives `run-real --live` and the result files are the simulator's, marked as a live real run. (The
    # device half of the check is skipped: CI may run on another CPU model than the one that measured it.)
    from dsparksim.backend.model import ModelConfig
    from dsparksim.cli.main import main
    from dsparksim.cost.profile import load_profile
    from dsparksim.runner.models import model_key

    prof = load_profile("cpu-tiny-live")
    ck = torch.load(MODELS / "target.pt", map_location="cpu", weights_only=True)
    want = model_key(ModelConfig(**ck["config"]), str(MODELS / "target.pt"), 1, "float32", live=True)
    assert prof.metadata["runner_model"] == want and prof.metadata["drafting"].startswith("live:")
    assert prof.prefill_note is not None and prof.drafters["dspark"].prefill_s_per_token > 0
    out = tmp_path / "live"
    rc = main(["run-real", "--live", "--models", str(MODELS), "--policy", "confidence", "--concurrency", "2",
               "--num-requests", "4", "--lengths", _lengths(tmp_path), "--domain", "code", "--out", str(out),
               "--no-profile-check", "--quiet"])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["engine"] == "real" and summary["num_requests_completed"] == 4
    cfg = json.loads((out / "config.json").read_text())
    assert "live" in json.dumps(cfg)
