"""scripts/validate_inferencex.py's DP-attention section: which fit lends its scales, and the section's table."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("validate_inferencex", ROOT / "scripts" / "validate_inferencex.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rows(spec: list[tuple]) -> pd.DataFrame:
    """(gpu, image, tp, ep, dp_attention, concurrency) rows of MTP-off TRT-LLM runs."""
    return pd.DataFrame([{"gpu": g, "engine": "trtllm", "engine_version": im, "tp": tp, "ep": ep,
                          "dp_attention": dpa, "spec_method": "none", "max_concurrency": c}
                         for g, im, tp, ep, dpa, c in spec])


def test_dp_rows_borrow_the_same_images_fit_same_ep_first():
    V = _script()
    rows = _rows([("h200", "a", 8, 8, True, 64), ("h200", "a", 8, 8, False, 4), ("h200", "a", 8, 8, False, 16),
                  ("h200", "a", 8, 1, False, 4), ("h200", "a", 8, 1, False, 8), ("h200", "a", 8, 1, False, 16),
                  ("b200", "b", 8, 8, True, 256), ("b200", "b", 8, 1, False, 4), ("b200", "b", 8, 1, False, 32),
                  ("b200", "b", 4, 1, False, 4), ("b200", "b", 4, 1, False, 8), ("b200", "b", 4, 1, False, 16),
                  ("b200", "c", 8, 8, True, 64), ("b200", "c", 8, 8, False, 64)])
    assert V.dp_fit_group(rows, ("h200", "trtllm", "a", 8, 8)) == ("h200", "trtllm", "a", 8, 8)   # same EP wins
    assert V.dp_fit_group(rows, ("b200", "trtllm", "b", 8, 8)) == ("b200", "trtllm", "b", 8, 1)   # same TP only
    assert V.dp_fit_group(rows, ("b200", "trtllm", "c", 8, 8)) is None           # one concurrency: never fitted


def test_calibration_of_the_fit_coefficients():
    V = _script()
    coef = np.ones(len(V.PARAMS))
    coef[V.PARAMS.index("moe")] = 1.2
    coef[V.PARAMS.index("fixed_overhead_s")] = 2e-4
    coef[V.PARAMS.index("request_latency_s")] = 0.0
    cal = V.calibration_of(coef)
    assert dict(cal.scales) == {"moe": 1.2} and cal.fixed_overhead_s == 2e-4 and cal.request_latency_s is None


def test_dp_section_table():
    V = _script()
    D = pd.DataFrame([{"gpu": "h200", "engine_version": "x:1.1", "workload": "8192/1024", "concurrency": 64,
                       "run_id": f"r{i}", "variant": v, "scales_from": sf, "metric": "output_throughput_per_gpu",
                       "measured": m, "predicted": p}
                      for i, m in ((1, 100.0), (2, 104.0))
                      for v, sf, p in (("builder", "", 50.0), ("fitted scales", "tp8 ep8", 110.0))])
    D["rel_error"] = D.predicted / D.measured - 1
    text = "\n".join(V.dp_section(D))
    assert "| builder | fitted scales |" in text
    assert "| h200 | 1.1 | 8192/1024 | 64 | 2 | tp8 ep8 | output_throughput_per_gpu | 102 | 50 (-51.0%) | 110 (+7.9%) |" \
        in text
