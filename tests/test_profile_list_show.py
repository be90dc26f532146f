"""`profile list` is an aligned table that shows a one-rank DP profile as such; `profile show` explains SPS and
words a staircase's steps down by where the profile comes from (issue 31 item 19)."""
from __future__ import annotations

import json

from dsparksim.cli.main import main
from dsparksim.cost.profile import shipped_dir


def _list(capsys) -> list[str]:
    assert main(["profile", "list"]) == 0
    return capsys.readouterr().out.splitlines()


def test_profile_list_columns_align(capsys):
    lines = _list(capsys)
    head_i = next(i for i, ln in enumerate(lines) if ln.split()[:2] == ["name", "kind"])
    head = lines[head_i]
    rows = [ln for ln in lines[head_i + 1:] if ln.startswith("  ") and not ln.startswith("  built-h200x8-deepseek-v3-dp8ep8:")]
    names = sorted(p.stem for p in shipped_dir().glob("*.json"))
    assert [r.split()[0] for r in rows] == names          # every shipped profile, once, in order
    # each column after the first starts at the header's offset in every row (M and drafters are never empty)
    for col in ("kind", "parallel", "M", "drafters", "device"):
        at = head.index(f"  {col} ") + 2
        for r in rows:
            assert r[at - 2:at] == "  " and r[at] != " ", (col, r)


def test_profile_list_shows_dp8ep8_as_one_rank_of_eight(capsys):
    lines = _list(capsys)
    row = {ln.split()[0]: ln for ln in lines if ln.startswith("  built-h200x8-deepseek-v3-")}
    dp = row["built-h200x8-deepseek-v3-dp8ep8"]
    tp = row["built-h200x8-deepseek-v3-tp8"]
    assert "DP8 EP8 (1 of 8 ranks)" in dp and "TP1" not in dp
    assert " TP8 " in tp and "DP" not in tp
    assert dp.split()[2] == tp.split()[2] == "8"            # GPUs of one engine
    note = [ln for ln in lines if ln.startswith("  built-h200x8-deepseek-v3-dp8ep8:")]
    assert len(note) == 1 and "--dp-ranks 8" in note[0]


def test_profile_show_explains_sps(capsys):
    assert main(["profile", "show", "h100-llama2-7b-tp1"]) == 0
    out = capsys.readouterr().out
    assert "SPS = steps per second at M = 1000 / ms" in out
    # a derived profile's measured staircase is jagged, and that is said as such
    assert "(derived)" in out and "jagged measurements, kept as measured" in out
    # the table's SPS column is 1000 / ms
    for ln in out.splitlines():
        parts = ln.split()
        if len(parts) == 3 and parts[0].isdigit():
            assert abs(float(parts[2]) - 1000 / float(parts[1])) < 0.1   # printed to 0.1 and 0.001 ms


def test_profile_show_never_calls_an_analytic_staircase_measured(tmp_path, capsys):
    d = json.loads((shipped_dir() / "built-h100-llama2-7b-tp1.json").read_text())
    t = d["verify"]["time_s"]
    t[10] = t[9] * 0.9                                     # one step down in the analytic staircase
    t[11] = max(t[11], t[9])
    path = tmp_path / "built-down.json"
    path.write_text(json.dumps(d))
    assert main(["profile", "show", str(path)]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("verify staircase"))
    assert "(built)" in line and "step(s) down" in line
    assert "kept as measured" not in out and "not measured" in line
