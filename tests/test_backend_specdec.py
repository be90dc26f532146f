"""Exactness of speculative decoding (temperature 0 and 1) and the dspark Markov head, on tiny random models."""
import pytest

torch = pytest.importorskip("torch")

import numpy as np  # noqa: E402
from scipy import stats  # noqa: E402

from dsparksim.backend import specdec  # noqa: E402
from dsparksim.backend.drafter_state import batch_runtime  # noqa: E402
from dsparksim.backend.drafters import DrafterConfig, build_drafter  # noqa: E402
from dsparksim.backend.model import ModelConfig, TargetModel  # noqa: E402
from dsparksim.backend.specdec import greedy_reference, speculative_generate  # noqa: E402

torch.set_num_threads(1)
CFG = ModelConfig(vocab_size=40, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=64, max_seq=64)
KINDS = [("mtp1", 1), ("eagle3", 4), ("dflash", 4), ("dspark", 4)]


def _target(cfg=CFG, scale=20.0, seed=0):
    torch.manual_seed(seed)
    t = TargetModel(cfg).eval()
    with torch.no_grad():
        t.embed.weight.mul_(scale)          # peaky, learnable distributions so drafts do get accepted
    for p in t.parameters():
        p.requires_grad_(False)
    return t


@pytest.fixture(scope="module")
def trained():
    """A peaky random target and the four drafters distilled from it for 40 steps (about 3 s)."""
    tg = _target()
    out = {}
    for kind, K in KINDS:
        torch.manual_seed(1)
        dr = build_drafter(CFG, DrafterConfig(kind, K, anchors=8, ttt_steps=2))
        opt = torch.optim.Adam(dr.parameters(), 1e-2)
        for _ in range(40):
            x = torch.randint(0, CFG.vocab_size, (8, 32))
            hs, lg = tg(x)
            loss, _ = dr.loss(tg, x, hs, lg)
            opt.zero_grad()
            loss.backward()
            opt.step()
        out[kind] = dr.eval()
    return tg, out


@pytest.mark.parametrize("kind,K", KINDS)
def test_temperature0_reproduces_greedy_decode(trained, kind, K):
    tg, drafters = trained
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [10], [11, 12]]     # different lengths, decoded side by side
    res = speculative_generate(tg, drafters[kind], prompts, K, steps=6, temperature=0.0)
    for p, out in zip(prompts, res.tokens):
        assert out == greedy_reference(tg, p, len(out))
    # every step emits A + 1 tokens; the decode must actually exercise accepted drafts
    assert [len(o) for o in res.tokens] == list(1 + (res.accepted + 1).sum(1))
    if kind != "dflash":          # dflash cannot see the previous draft token, so it may accept none here
        assert res.accepted.sum() > 0


_REAL_VERIFY = specdec.verify


def _buggy_verify(logits, d, q, temperature, gen):
    """A classic bug: on rejection sample the correction from p instead of the residual max(0, p - q)."""
    A, _ = _REAL_VERIFY(logits, d, q, temperature, gen)
    p = torch.softmax(logits / temperature, -1)
    new = torch.multinomial(p[torch.arange(d.shape[0]), A], 1, generator=gen)[:, 0]
    return A, new


def test_temperature1_output_distribution_equals_target(monkeypatch):
    """Chi-square goodness of fit of the first two generated tokens against the target's exact distribution.

    Fixed case: vocab 8, prompt [1, 2, 3], N = 20000 requests decoded side by side for one step with K = 4 and an
    untrained dspark drafter (so q differs from p). The first token is the target's own sample; the second is
    the first speculative one (accepted draft or correction). Level 0.001. Stated power: against the bug
    "correction drawn from p instead of the residual max(0, p - q)" the joint test's noncentrality
    lambda = N * sum (p_bug - p)^2 / p is computed exactly for this case and its power asserted >= 0.99; the bug
    is then injected and the test must reject it.
    """
    V, K, N = 8, 4, 20000
    cfg = ModelConfig(vocab_size=V, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=32, max_seq=32)
    tg = _target(cfg, scale=6.0, seed=3)
    torch.manual_seed(4)
    dr = build_drafter(cfg, DrafterConfig("dspark", K, markov_rank=4)).eval()
    with torch.no_grad():
        dr.mk_out.weight.normal_(0, 1.0)
    prompt = [1, 2, 3]
    with torch.no_grad():
        hs, lg = tg(torch.tensor([prompt]))
        p1 = torch.softmax(lg[0, -1], -1).double().numpy()
        p2 = np.stack([torch.softmax(tg(torch.tensor([prompt + [x]]))[1][0, -1], -1).double().numpy()
                       for x in range(V)])
        q1 = []                                     # the drafter's first-position distribution given anchor x
        for x in range(V):
            rt = batch_runtime(dr, tg, 1, 32)
            rt.update(hs, torch.tensor([prompt[1:] + [x]]), torch.zeros(1, dtype=torch.long), torch.tensor([2]))
            q1.append(rt.propose(K, 1.0, torch.Generator().manual_seed(0))[1][0, 0].double().numpy())
    q1 = np.stack(q1)
    # float32 softmaxes sum to 1 only within ~1e-7; scipy's chisquare checks sum(obs) == sum(exp) to 1.5e-8
    p1, p2 = p1 / p1.sum(), p2 / p2.sum(1, keepdims=True)
    exp_p = p1[:, None] * p2
    mn = np.minimum(p2, q1)
    exp_bug = p1[:, None] * (mn + (1 - mn.sum(1, keepdims=True)) * p2)
    keep = (exp_p * N).ravel() >= 5                  # chi-square validity; the rest pooled into one cell

    def cells(m):
        rest = [m.ravel()[~keep].sum()] if (~keep).any() else []
        return np.r_[m.ravel()[keep], rest]

    def run(seed):
        res = speculative_generate(tg, dr, [prompt] * N, K, steps=1, temperature=1.0,
                                   gen=torch.Generator().manual_seed(seed))
        joint = np.zeros((V, V))
        np.add.at(joint, (np.array([o[0] for o in res.tokens]), np.array([o[1] for o in res.tokens])), 1)
        return stats.chisquare(cells(joint), cells(exp_p) * N).pvalue

    df = cells(exp_p).size - 1
    lam = N * ((cells(exp_bug) - cells(exp_p)) ** 2 / cells(exp_p)).sum()
    assert stats.ncx2.sf(stats.chi2.ppf(0.999, df), df, lam) >= 0.99      # stated power of this test
    assert run(11) > 0.001
    monkeypatch.setattr(specdec, "verify", _buggy_verify)
    assert run(12) < 0.001


def test_markov_head_changes_logits_only_through_previous_token():
    """dspark logits - dflash logits (same backbone weights) = markov_bias(previous token), whatever the context."""
    tg = _target(scale=3.0)
    torch.manual_seed(5)
    K = 4
    ds = build_drafter(CFG, DrafterConfig("dspark", K, markov_rank=8)).eval()
    with torch.no_grad():
        ds.mk_out.weight.normal_(0, 0.5)
    df = build_drafter(CFG, DrafterConfig("dflash", K)).eval()
    df.load_state_dict({k: v for k, v in ds.state_dict().items() if k in df.state_dict()})
    for prompt in ([1, 2, 3, 4], [9, 8, 7, 6, 5, 4, 3]):       # two contexts, same anchor token
        x = torch.tensor([prompt])
        with torch.no_grad():
            hs, _ = tg(x)
            nxt = torch.cat([x[:, 1:], torch.tensor([[17]])], 1)          # same anchor token 17 in both
            r1, r2 = batch_runtime(ds, tg, 1, 32), batch_runtime(df, tg, 1, 32)
            for r in (r1, r2):
                r.update(hs, nxt, torch.zeros(1, dtype=torch.long), torch.tensor([len(prompt) - 1]))
            d, _, _ = r1.propose(K, 0.0, None)
            r2.propose(K, 0.0, None)
            prev = torch.cat([torch.tensor([17]), d[0, :-1]])
            delta = r1.last_logits[0] - r2.last_logits[0]
            # the whole difference is the bias of the previous token (anchor, then the drafted tokens)
            assert torch.allclose(delta, ds.markov_bias(prev), atol=1e-5)
    assert not torch.allclose(r1.last_logits, r2.last_logits)
    probe = torch.arange(CFG.vocab_size)
    bias = ds.markov_bias(probe)
    assert bias.shape == (CFG.vocab_size, CFG.vocab_size)
    assert bias.std(0).mean() > 0            # different previous tokens do change the logits
