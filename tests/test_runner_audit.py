torch = __import__("pytest").importorskip("torch")

import pytest  # noqa: E402

from dsparksim.runner.audit import LOSSLESS, appendix_a, batch_setting, run_audit  # noqa: E402

# Fixed seeds; sample sizes: 6000 engine steps per (policy, setting) (about 6k-50k tokens). A lossless policy
# must not be rejected at alpha = 1e-3 (Pearson chi-square on prev->next transitions); the non-causal global
# search must be rejected at p < 1e-6 in the paper's Appendix-A setting (observed p ~ 1e-12 at seed 0).
STEPS, SEED = 6000, 0


@pytest.mark.parametrize("policy", LOSSLESS)
def test_lossless_policies_preserve_target_distribution_appendix_a(policy):
    r = run_audit(policy, appendix_a(), STEPS, SEED)
    assert r["p_value"] > 1e-3, r


@pytest.mark.parametrize("policy", ["fixed:7", "threshold:0.5", "goodput", "confidence", "confidence-async:2"])
def test_lossless_policies_preserve_target_distribution_batch(policy):
    r = run_audit(policy, batch_setting(), 3000, SEED)
    assert r["p_value"] > 1e-3, r
    assert r["mean_L"] > 0          # the setting verifies drafts, so acceptance actually shapes the output


def test_non_causal_global_search_is_detected_as_biased():
    r = run_audit("confidence-global", appendix_a(), STEPS, SEED)
    assert r["p_value"] < 1e-6, r
    # the bias points at the drafter's favourite token 0 (q=0.9 vs p=0.5)
    assert r["freq"][0][0] > 0.5 and r["freq"][1][0] > 0.5
