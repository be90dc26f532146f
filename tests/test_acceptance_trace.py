"""Acceptance-trace files: format round trip, validation messages, and the replaying sampler."""
from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dsparksim.acceptance import drafter_of, load_acceptance
from dsparksim.acceptance.synthetic import simulate_blocks, write_parametric_trace
from dsparksim.acceptance.trace_format import MAGIC, read_trace, read_trace_metadata, write_trace
from dsparksim.acceptance.trace_model import TraceAcceptance
from dsparksim.errors import ConfigError, InputError

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
SAMPLE = ROOT / "traces" / "sample_dspark_k7.csv"
META = {"drafter": "dspark", "temperature": 1.0, "target": "test", "source": "unit test",
        "created": "2026-01-01T00:00:00+00:00"}


def simulated(n_req=9, K=5, seed=0, raw=False):
    rng = np.random.default_rng(seed)
    model = load_acceptance("dspark", K)
    doms = np.array(["math", "code", "chat"] * (n_req // 3), dtype=object)
    data = simulate_blocks(model, doms, rng.integers(2, 9, size=doms.size), rng)
    if raw:
        data["raw_conf"] = rng.random(data["conf"].shape)
    return data


@pytest.mark.parametrize("name", ["t.csv", "t.csv.gz", "t.parquet"])
def test_round_trip(tmp_path, name):
    data = simulated(raw=True)
    path = write_trace(tmp_path / name, data, META)
    tr = read_trace(path)
    assert tr.K == 5 and tr.metadata["K"] == 5 and tr.metadata["drafter"] == "dspark"
    assert tr.metadata["created"] == META["created"]
    np.testing.assert_array_equal(tr.request_id, data["request_id"])
    np.testing.assert_array_equal(tr.step, data["step"])
    np.testing.assert_array_equal(tr.accepted, data["accepted_len"])
    assert list(tr.domain) == list(data["domain"])
    # CSV keeps 6 significant digits (abs error <= 5e-7 on [0,1]); Parquet is exact float64
    atol = 0 if name.endswith("parquet") else 1e-6
    np.testing.assert_allclose(tr.conf, data["conf"], atol=atol, rtol=0)
    np.testing.assert_allclose(tr.raw_conf, data["raw_conf"], atol=atol, rtol=0)
    assert read_trace_metadata(path)["K"] == 5
    if name.endswith(".gz"):
        assert gzip.open(path, "rt").readline().startswith(f"# {MAGIC} ")


def test_handwritten_fixture_rows_sorted_by_request_and_step():
    tr = read_trace(DATA / "acc_trace_k3.csv")
    assert tr.request_id.tolist() == [7, 7, 7, 9, 9]
    assert tr.step.tolist() == [0, 1, 2, 0, 1]
    assert tr.accepted.tolist() == [2, 3, 0, 1, 3]
    np.testing.assert_allclose(tr.conf[0], [0.97, 0.91, 0.40])
    starts, lengths, doms = tr.responses()
    assert starts.tolist() == [0, 3] and lengths.tolist() == [3, 2] and doms.tolist() == ["math", "chat"]


def test_replay_preserves_order_and_truncates_exactly():
    tr = read_trace(DATA / "acc_trace_k3.csv")
    rng = np.random.default_rng(0)
    # one recorded response per domain: replay must follow it block by block, then continue (same domain)
    m = TraceAcceptance(tr, K=2)
    m.start(np.array([0, 1]), np.array(["math", "chat"], dtype=object), rng)
    got_conf, got_acc = [], []
    for _ in range(4):
        b = m.draw(np.array([0, 1]), rng)
        got_conf.append(b.conf)
        got_acc.append(b.accepted)
    math_rows, chat_rows = [0, 1, 2, 0], [3, 4, 3, 4]
    np.testing.assert_array_equal(np.stack(got_conf)[:, 0], tr.conf[math_rows, :2])
    np.testing.assert_array_equal(np.stack(got_conf)[:, 1], tr.conf[chat_rows, :2])
    # truncation to K=2: accepted = min(A, 2) exactly
    assert np.stack(got_acc)[:, 0].tolist() == [2, 2, 0, 2]
    assert np.stack(got_acc)[:, 1].tolist() == [1, 2, 1, 2]
    d = m.describe()
    assert d["continuations"] == 2 and d["truncated"] and d["trace_K"] == 3 and d["K"] == 2
    assert "continues with another" in d["sampling"]


def test_replay_of_many_responses_walks_consecutive_rows(tmp_path):
    data = simulated(n_req=30, K=4, seed=2)
    tr = read_trace(write_trace(tmp_path / "x.parquet", data, META))
    m = TraceAcceptance(tr)
    rng = np.random.default_rng(1)
    n = 40
    m.start(np.arange(n), np.array(["code"] * n, dtype=object), rng)
    starts, lengths, doms = tr.responses()
    # responses have >= 2 blocks, so two draws stay inside the first chosen response (no continuation)
    pos0 = m._pos[:n].copy()
    seqs = [m.draw(np.arange(n), rng).accepted for _ in range(2)]
    assert (tr.domain[pos0] == "code").all()
    assert np.all(pos0 == starts[np.searchsorted(starts, pos0)])       # every request starts a response
    np.testing.assert_array_equal(seqs[0], tr.accepted[pos0])
    np.testing.assert_array_equal(seqs[1], tr.accepted[pos0 + 1])       # next block of the same response
    assert np.all(tr.request_id[pos0] == tr.request_id[pos0 + 1])
    assert m.describe()["continuations"] == 0


def test_trace_K_and_domain_errors():
    with pytest.raises(ConfigError, match="K mismatch"):
        load_acceptance(str(DATA / "acc_trace_k3.csv"), 4)
    m = load_acceptance(str(DATA / "acc_trace_k3.csv"), 3)
    with pytest.raises(ConfigError, match=r"acc_trace_k3.csv.*'code'"):
        m.start(np.array([0]), np.array(["code"], dtype=object), np.random.default_rng(0))


def test_shipped_sample_trace_loads_through_spec():
    m = load_acceptance("traces/sample_dspark_k7.csv", 7)
    meta = m.describe()["trace_metadata"]
    assert "synthetic, from the parametric model" in meta["source"]
    tr = read_trace(SAMPLE)
    assert 200 <= tr.n_blocks <= 600 and set(tr.domain) == {"math", "code", "chat"}
    assert drafter_of("traces/sample_dspark_k7.csv") == "dspark"
    m5 = load_acceptance("traces/sample_dspark_k7.csv", 5)
    rng = np.random.default_rng(0)
    m5.start(np.arange(3), np.array(["math", "code", "chat"], dtype=object), rng)
    b = m5.draw(np.arange(3), rng)
    assert b.conf.shape == (3, 5) and b.accepted.max() <= 5


def test_write_parametric_trace(tmp_path):
    p = write_parametric_trace(tmp_path / "s.csv", "dflash", 4, requests_per_domain=3, blocks=(2, 3), seed=1)
    tr = read_trace(p)
    assert tr.K == 4 and tr.metadata["drafter"] == "dflash"
    assert tr.metadata["source"].startswith("synthetic, from the parametric model")
    assert 18 <= tr.n_blocks <= 27


# ---- malformed files: every class names the file, the column and the line/row ---------------------------------
HEADER = f'# {MAGIC} {{"drafter": "dspark", "K": 2, "temperature": 1.0, "target": "t", "source": "s", ' \
         f'"created": "2026-01-01"}}'
ROWS = ["request_id,domain,step,K,accepted_len,conf_1,conf_2",
        "1,math,0,2,2,0.9,0.8",
        "1,math,1,2,1,0.7,0.6",
        "2,chat,0,2,0,0.5,0.4",
        "2,chat,1,2,2,0.9,0.9"]


def write_lines(tmp_path, lines, name="bad.csv"):
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p


def replace_line(line_no, text):
    """Lines are numbered as in the file: 1 = metadata, 2 = column header, 3.. = data."""
    lines = [HEADER] + list(ROWS)
    lines[line_no - 1] = text
    return lines


@pytest.mark.parametrize("lines,field,line,fragment", [
    (replace_line(4, "1,math,1,2,1,1.2,0.6"), "conf_1", 4, "[0, 1]"),
    (replace_line(5, "2,chat,0,2,0,0.5,"), "conf_2", 5, "NaN"),
    (replace_line(6, "2,chat,1,2,3,0.9,0.9"), "accepted_len", 6, "0..K=2"),
    (replace_line(3, "1,math,0,3,2,0.9,0.8"), "K", 3, "K mismatch"),
    (replace_line(4, "1,math,0,2,1,0.7,0.6"), "step", 4, "appears twice"),
    (replace_line(6, "2,chat,2,2,2,0.9,0.9"), "step", 6, "follows step 0"),
    (replace_line(5, "2,chat,1,2,0,0.5,0.4"), "step", 5, "start at 0"),
    (replace_line(5, "2,legal,0,2,0,0.5,0.4"), "domain", 5, "'legal'"),
    (replace_line(6, "2,math,1,2,2,0.9,0.9"), "domain", 6, "changes domain"),
    (replace_line(3, "x1,math,0,2,2,0.9,0.8"), "request_id", 3, "integer"),
    (replace_line(4, "1,math,1.5,2,1,0.7,0.6"), "step", 4, "integer"),
    (replace_line(1, "request_id,domain"), "header", 1, "must start with"),
    (replace_line(1, f"# {MAGIC} {{not json"), "metadata", 1, "invalid JSON"),
    (replace_line(1, f'# {MAGIC} {{"K": 2}}'), "metadata.drafter", 1, "missing"),
    ([HEADER] + ROWS[:2] + [""] + ROWS[2:], "request_id", 4, "integer"),           # blank line inside
    (replace_line(4, "1,math,1,2,1,0.7,0.6,0.1"), "columns", 4, "Expected 7 fields in file line 4"),
])
def test_malformed_csv_is_located(tmp_path, lines, field, line, fragment):
    p = write_lines(tmp_path, lines)
    with pytest.raises(InputError) as ei:
        read_trace(p)
    e = ei.value
    assert e.source == str(p) and e.field == field and e.line == line, str(e)
    assert fragment in str(e) and str(p) in str(e) and f"'{field}'" in str(e)


@pytest.mark.parametrize("header,missing", [
    ("request_id,domain,step,K,accepted,conf_1,conf_2", "accepted_len"),        # renamed column
    ("request_id,domain,step,K,accepted_len,conf_1", "conf_2"),                 # header K=2, one conf column
])
def test_missing_or_renamed_column(tmp_path, header, missing):
    rows = [header] + [",".join(r.split(",")[: header.count(",") + 1]) for r in ROWS[1:]]
    p = write_lines(tmp_path, [HEADER] + rows)
    with pytest.raises(InputError, match="missing column") as ei:
        read_trace(p)
    assert ei.value.field == missing and str(p) in str(ei.value)


def test_extra_conf_column_is_a_K_mismatch(tmp_path):
    rows = [ROWS[0] + ",conf_3"] + [r + ",0.5" for r in ROWS[1:]]
    with pytest.raises(InputError, match=r"unknown column \(header K=2") as ei:
        read_trace(write_lines(tmp_path, [HEADER] + rows))
    assert ei.value.field == "conf_3"


def test_empty_inputs(tmp_path):
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(InputError, match="empty file"):
        read_trace(empty)
    with pytest.raises(InputError, match="empty trace: no blocks"):
        read_trace(write_lines(tmp_path, [HEADER, ROWS[0]], "hdr.csv"))
    with pytest.raises(InputError, match="no column header"):
        read_trace(write_lines(tmp_path, [HEADER], "meta_only.csv"))
    with pytest.raises(InputError, match="extension"):
        read_trace(tmp_path / "trace.txt")


def test_malformed_parquet_names_row_and_column(tmp_path):
    data = simulated(K=3)
    data["conf"][4, 1] = 1.5
    import pyarrow as pa
    import pyarrow.parquet as pq
    df = pd.DataFrame({"request_id": data["request_id"], "domain": data["domain"], "step": data["step"],
                       "K": 3, "accepted_len": data["accepted_len"],
                       **{f"conf_{k + 1}": data["conf"][:, k] for k in range(3)}})
    t = pa.Table.from_pandas(df, preserve_index=False)
    good_meta = {MAGIC.encode(): b'{"drafter": "d", "K": 3, "temperature": 1, "target": "t", "source": "s", '
                                 b'"created": "c"}'}
    pq.write_table(t.replace_schema_metadata(good_meta), tmp_path / "bad.parquet")
    with pytest.raises(InputError, match=r"row 4: confidence") as ei:
        read_trace(tmp_path / "bad.parquet")
    assert ei.value.field == "conf_2" and "bad.parquet" in str(ei.value)
    pq.write_table(t, tmp_path / "nometa.parquet")
    with pytest.raises(InputError, match="schema metadata") as ei:
        read_trace(tmp_path / "nometa.parquet")


def test_write_trace_refuses_invalid_data(tmp_path):
    data = simulated(K=3)
    data["accepted_len"] = data["accepted_len"].copy()
    data["accepted_len"][0] = 9
    with pytest.raises(InputError, match="accepted_len") as ei:
        write_trace(tmp_path / "x.csv", data, META)
    assert "row" in str(ei.value) and not (tmp_path / "x.csv").exists()
    with pytest.raises(InputError, match="metadata.target"):
        write_trace(tmp_path / "y.csv", simulated(K=3), {"drafter": "d", "temperature": 1, "source": "s"})
