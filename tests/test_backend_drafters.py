"""Drafters: the training path computes exactly what decoding computes (same positions, masks, features)."""
import pytest

torch = pytest.importorskip("torch")

from dsparksim.backend import drafters as D  # noqa: E402
from dsparksim.backend.drafter_state import batch_runtime  # noqa: E402
from dsparksim.backend.model import ModelConfig, TargetModel, cache_mask  # noqa: E402

torch.set_num_threads(1)
CFG = ModelConfig(vocab_size=40, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=64, max_seq=64)
K = 4


def _capture(monkeypatch):
    logits = []
    orig = D.soft_ce

    def spy(lg, p):
        logits.append(lg)
        return orig(lg, p)
    monkeypatch.setattr(D, "soft_ce", spy)
    return logits


@pytest.fixture()
def setup():
    torch.manual_seed(0)
    tg = TargetModel(CFG).eval()
    x = torch.randint(0, CFG.vocab_size, (1, 30))
    with torch.no_grad():
        hs, lg = tg(x)
    return tg, x, hs, lg


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_parallel_drafter_training_logits_equal_decoding_logits(setup, monkeypatch, kind):
    tg, x, hs, lg = setup
    dr = D.build_drafter(CFG, D.DrafterConfig(kind, K, anchors=30 - K - 1)).eval()   # every anchor 1..25
    if kind == "dspark":
        with torch.no_grad():
            dr.mk_out.weight.normal_()
    cap = _capture(monkeypatch)
    with torch.no_grad():
        dr.loss(tg, x, hs, lg)
        t = 10                                         # anchor x_10; context features f_0..f_9
        rt = batch_runtime(dr, tg, 1, 64)
        rt.update([h[:, :t] for h in hs], x[:, 1:t + 1], torch.zeros(1, dtype=torch.long), torch.tensor([t - 1]))
        rt.propose(K, 0.0, None)
    train = cap[0][0, t - 1]                           # anchors start at 1
    # position 1 always matches; dflash matches at every position (dspark's later positions see drafted tokens)
    n = K if kind == "dflash" else 1
    assert torch.allclose(rt.last_logits[0, :n], train[:n], atol=1e-5)


def test_eagle3_training_time_test_matches_decoding(setup, monkeypatch):
    tg, x, hs, lg = setup
    dr = D.build_drafter(CFG, D.DrafterConfig("eagle3", K, ttt_steps=2)).eval()
    cap = _capture(monkeypatch)
    o = 9                                              # step-1 query at position o predicts x_{o+2}
    with torch.no_grad():
        dr.loss(tg, x, hs, lg)
        rt = batch_runtime(dr, tg, 1, 64)
        rt.update([h[:, :o + 1] for h in hs], x[:, 1:o + 2], torch.zeros(1, dtype=torch.long), torch.tensor([o]))
        assert torch.allclose(rt.logits1[0], cap[0][0, o], atol=1e-5)
        # step 2 fed with the data token x_{o+2} (teacher forcing) and the drafter's own hidden state
        blk = dr.block
        xin = dr.step_in(tg, x[:, o + 2][:, None], rt.h[:, None])
        q, k, v = blk.attn.qkv(blk.n1(xin), torch.tensor([[o + 1]]))
        mask = torch.cat([cache_mask(torch.tensor([[o]]), rt.ck.shape[2]),
                          torch.ones(1, 1, 1, 1, dtype=torch.bool)], -1)
        y = xin + blk.attn.out(q, torch.cat([rt.ck, k], 2), torch.cat([rt.cv, v], 2), mask)
        y = y + blk.mlp(blk.n2(y))
        assert torch.allclose(dr.logits(tg, y[:, 0])[0], cap[1][0, o], atol=1e-5)


def test_mtp1_is_k1_only_and_unknown_kinds_rejected():
    with pytest.raises(ValueError, match="K=1"):
        D.DrafterConfig("mtp1", 2)
    with pytest.raises(ValueError, match="unknown drafter"):
        D.DrafterConfig("medusa", 3)
