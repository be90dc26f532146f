"""Issue 14, defect 9 (reader part): every bad input file gives exit 2 and ONE line naming the file (and the
line/field) and what was expected -- through the CLI entry point, never a traceback.

Each case builds a corrupted copy of a valid file from tests/data (or a shipped profile) and runs
``dsparksim.cli.main.main``; many of them raised UnicodeDecodeError, EOFError, zlib.error, AttributeError,
OverflowError, RecursionError, ValueError or MemoryError before, or ran on silently wrapped/truncated values.
"""
from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from dsparksim.cost.profile import shipped_dir

DATA = Path(__file__).parent / "data"


def _fails_cleanly(capsys, argv: list[str], *needles: str, prefix: str = "dsparksim: error:") -> str:
    """main(argv) returns 2 and prints exactly one stderr line with the prefix and every needle (regex)."""
    from dsparksim.cli.main import main

    rc = main(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err, err
    assert rc == 2, err
    assert len(lines) == 1, err
    assert lines[0].startswith(prefix), lines[0]
    for n in needles:
        assert re.search(n, lines[0]), (n, lines[0])
    return lines[0]


def _w(tmp_path: Path, name: str, data: bytes | str) -> str:
    p = tmp_path / name
    p.write_bytes(data if isinstance(data, bytes) else data.encode())
    return str(p)


def _gz_corrupt(raw: bytes) -> bytes:
    """A gzip stream with bytes of the deflate body overwritten (zlib.error or a CRC failure on read)."""
    g = bytearray(gzip.compress(raw, mtime=0))
    for i in range(12, len(g) - 8, 5):
        g[i] ^= 0xA5
    return bytes(g)


@pytest.fixture
def run(tmp_path):
    """`run` options that finish in a fraction of a second when the inputs are valid."""
    return ["run", "--num-requests", "2", "--quiet", "--out", str(tmp_path / "out")]


def _rows(header: str, *rows: str) -> str:
    return "\n".join((header,) + rows) + "\n"


LEN_HDR = "num_prefill_tokens,num_decode_tokens"
AZ_HDR = "TIMESTAMP,ContextTokens,GeneratedTokens"


# ------------------------------------------------------------------ lengths files (--lengths)
@pytest.mark.parametrize("name,data,needles", [
    ("bad.csv", (DATA / "traffic_lengths_domain.csv").read_bytes()[:60] + b"\xff\xfe"
     + (DATA / "traffic_lengths_domain.csv").read_bytes()[60:], [r"not UTF-8", r"byte 0xff", r"\.csv:\d+:"]),
    ("t.csv.gz", gzip.compress((DATA / "traffic_lengths_domain.csv").read_bytes())[:-20], [r"truncated gzip"]),
    ("c.csv.gz", _gz_corrupt((DATA / "traffic_lengths_domain.csv").read_bytes()), [r"corrupt or truncated gzip"]),
    ("plain.csv.gz", (DATA / "traffic_lengths_domain.csv").read_bytes(), [r"gzip", r"Not a gzipped file"]),
    ("empty.csv", b"", [r"empty file"]),
    ("header.csv", LEN_HDR + "\n", [r"no data rows", r":2:"]),
    ("nan.csv", _rows(LEN_HDR, "10,3", "nan,4"), [r":3:", r"num_prefill_tokens", r"not a number"]),
    ("inf.csv", _rows(LEN_HDR, "10,inf"), [r":2:", r"num_decode_tokens", r"not finite"]),
    ("neg.csv", _rows(LEN_HDR, "-5,3"), [r"negative"]),
    ("frac.csv", _rows(LEN_HDR, "2.5,3"), [r"not an integer"]),
    ("i64.csv", _rows(LEN_HDR, "10,3", "9223372036854775808,3"), [r":3:", r"too large", r"2\^53-1"]),
    ("e30.csv", _rows(LEN_HDR, "1e30,3"), [r"too large"]),
])
def test_lengths_file(capsys, tmp_path, run, name, data, needles):
    p = _w(tmp_path, name, data)
    _fails_cleanly(capsys, run + ["--lengths", p], re.escape(p), *needles)


def test_unresolvable_paths(capsys, run):
    _fails_cleanly(capsys, run + ["--lengths", "x" * 300 + ".csv"], r"neither a shipped sample")  # ENAMETOOLONG
    _fails_cleanly(capsys, run + ["--lengths", "~no-such-user-dsparksim/a.csv"], r"neither a shipped sample")


# ------------------------------------------------------------------ replayed traces (--trace)
AZ = (DATA / "traffic_azure_small.csv").read_bytes()
MC = (DATA / "traffic_mooncake_small.jsonl").read_bytes()


def _mc(**kw) -> str:
    return json.dumps({"timestamp": 0, "input_length": 10, "output_length": 3} | kw) + "\n"


@pytest.mark.parametrize("name,data,needles", [
    ("az.csv", AZ[:50] + b"\xc3(" + AZ[50:], [r"not UTF-8", r"\.csv:2:"]),
    ("tz.csv", _rows(AZ_HDR, "2023-11-16 18:17:03+00:00,10,3", "2023-11-16 18:17:04+01:00,10,3"),
     [r":3:", r"'TIMESTAMP'", r"offset \+0100 differs from \+0000", r"same offset"]),
    ("tz2.csv", _rows(AZ_HDR, "2023-11-16 18:17:03,10,3", "2023-11-16T18:17:04Z,10,3"),
     [r":3:", r"offset \+0000 differs from none"]),
    ("y9999.csv", _rows(AZ_HDR, "2023-11-16 18:17:03,10,3", "9999-11-16 18:17:04,10,3"), [r":3:", r"1678\.\.2261"]),
    ("big.csv", _rows(AZ_HDR, "2023-11-16 18:17:03,18446744073709551616,3"), [r"ContextTokens", r"too large"]),
    ("header.csv", AZ_HDR + "\n\n", [r"no data rows"]),
    ("mc.jsonl", MC[:40] + b"\x80" + MC[40:], [r"not UTF-8", r"byte 0x80", r"jsonl:1:"]),
    ("mc.jsonl.gz", gzip.compress(MC)[:-9], [r"truncated gzip"]),
    ("huge.jsonl", _mc() + '{"timestamp": 1, "input_length": 1' + "0" * 400 + ', "output_length": 3}\n',
     [r":2:", r"'input_length'", r"2\^53-1"]),
    ("digits.jsonl", '{"timestamp": 0, "input_length": ' + "9" * 5000 + ', "output_length": 3}\n',
     [r":1:", r"malformed JSON", r"digits"]),
    ("deep.jsonl", "[" * 100000 + "]" * 100000 + "\n", [r":1:", r"nested too deeply"]),
    ("nan.jsonl", _mc(output_length=float("nan")), [r"'output_length'", r"finite number", r"got nan"]),
    ("i64.jsonl", _mc(output_length=2 ** 63), [r"'output_length'", r"2\^53-1"]),
    ("dom.jsonl", _mc(domain={"a": [1]}), [r"'domain'", r"expected one of"]),
    ("empty.jsonl", "\n\n", [r"empty file"]),
])
def test_trace_file(capsys, tmp_path, name, data, needles):
    p = _w(tmp_path, name, data)
    _fails_cleanly(capsys, ["run", "--trace", p, "--num-requests", "2", "--quiet", "--out", str(tmp_path / "o")],
                   re.escape(p), *needles)


# ------------------------------------------------------------------ profiles (--profile)
def _shipped() -> dict:
    return json.loads((shipped_dir() / "h100-llama2-7b-tp1.json").read_text())


def _profile_case(edit):
    d = _shipped()
    edit(d)
    return json.dumps(d)


def _set(path: str, value):
    def edit(d):
        *head, last = path.split(".")
        for k in head:
            d = d[k]
        if value is KeyError:
            del d[last]
        else:
            d[last] = value
    return edit


@pytest.mark.parametrize("data,needles", [
    (_profile_case(_set("metadata.kv_capacity_tokens", 113534.7)),
     [r"'metadata\.kv_capacity_tokens'", r"positive integer", r"113534\.7", r"never truncated"]),
    (_profile_case(_set("metadata.kv_capacity_tokens", "lots")), [r"'metadata\.kv_capacity_tokens'"]),
    (_profile_case(_set("metadata.max_model_len", 0)), [r"'metadata\.max_model_len'", r"positive integer"]),
    (_profile_case(_set("verify.M", KeyError)), [r"'verify\.M'", r"missing"]),
    (_profile_case(lambda d: d["verify"]["M"].__setitem__(5, 1)), [r"'verify\.M'", r"\(index 5\)",
                                                                   r"strictly increasing"]),
    (_profile_case(lambda d: d["verify"]["time_s"].__setitem__(3, float("nan"))),
     [r"'verify\.time_s'", r"\(index 3\)", r"finite time"]),
    (_profile_case(lambda d: d["verify"]["M"].__setitem__(-1, 2 ** 64)), [r"'verify\.M'", r"2\^53-1"]),
    (_profile_case(lambda d: d["verify"]["time_s"].__setitem__(0, 10 ** 400)),
     [r"'verify\.time_s'", r"\(index 0\)"]),
    (_profile_case(_set("fixed_overhead_s", 10 ** 400)), [r"'fixed_overhead_s'", r"finite"]),
    ((shipped_dir() / "h100-llama2-7b-tp1.json").read_bytes().replace(b'"device"', b'"d\xe9vice"', 1),
     [r"not UTF-8", r"byte 0xe9", r"\.json:\d+:"]),
    ("[" * 100000, [r"not valid JSON", r"nested too deeply"]),
    ("", [r"not valid JSON"]),
])
def test_profile_file(capsys, tmp_path, run, data, needles):
    p = _w(tmp_path, "p.json", data)
    _fails_cleanly(capsys, run + ["--profile", p], re.escape(p), *needles)


def test_integral_float_kv_capacity_is_accepted(tmp_path):
    from dsparksim.cost.profile import load_profile

    p = _w(tmp_path, "p.json", _profile_case(_set("metadata.kv_capacity_tokens", 113534.0)))
    assert load_profile(p).metadata["kv_capacity_tokens"] == 113534
    assert isinstance(load_profile(p).metadata["kv_capacity_tokens"], int)


# ------------------------------------------------------------------ acceptance logs (vllm: / sglang:)
@pytest.mark.parametrize("kind,name,data,needles", [
    ("vllm", "v.json", '{"metrics": "x"}', [r"'\[0\]\.metrics'", r"expected a JSON object, got 'x'"]),
    ("vllm", "v.json", '[{"metrics": {"speculative_decoding": 5}}]',
     [r"'\[0\]\.metrics\.speculative_decoding'", r"expected a JSON object"]),
    ("vllm", "v.json", '[{"speculative_decoding": [1, 2]}]', [r"'\[0\]\.speculative_decoding'"]),
    ("vllm", "v.json", (DATA / "acc_vllm_responses.json").read_bytes().replace(b'"domain"', b'"dom\xffain"'),
     [r"not UTF-8", r"\.json:2:"]),
    ("vllm", "v.json", '{"num_drafts": 100, "num_accepted_tokens_per_pos": [%d, 1]}' % 2 ** 63,
     [r"num_accepted_tokens_per_pos", r"2\^53-1"]),
    ("vllm", "v.json", '{"num_drafts": %d, "num_accepted_tokens_per_pos": [1, 1]}' % 2 ** 64,
     [r"'num_drafts'"]),
    ("vllm", "v.jsonl", '{"acceptance_histogram": [1, 2]}\n[[[' + "[" * 100000 + "\n", [r":2:", r"nested too deeply"]),
    ("sglang", "s.json", '{"draft_len": 1000000000000, "responses": [{"spec_accept_histogram": [1, 2], '
                         '"spec_verify_ct": 3}]}', [r"'draft_len'", r"1\.\.4096"]),
    ("sglang", "s.jsonl", (DATA / "acc_sglang_generate.jsonl").read_bytes()[:30] + b"\xff",
     [r"not UTF-8", r"s\.jsonl:1:"]),
    ("sglang", "s.json", '[{"meta_info": {"spec_accept_histogram": [1, 1e400], "spec_verify_ct": 2}}]',
     [r"spec_accept_histogram", r"integers in 0\.\."]),
    ("sglang", "s.json", "", [r"empty file"]),
])
def test_engine_acceptance_log(capsys, tmp_path, run, kind, name, data, needles):
    p = _w(tmp_path, name, data)
    _fails_cleanly(capsys, run + ["-K", "3", "--acceptance", f"{kind}:{p}"], re.escape(p), *needles)


# ------------------------------------------------------------------ acceptance traces (.csv / .csv.gz)
TR = (DATA / "acc_trace_k3.csv").read_bytes()


@pytest.mark.parametrize("name,data,needles", [
    ("t.csv.gz", gzip.compress(TR)[:-30], [r"truncated gzip"]),
    ("t.csv.gz", _gz_corrupt(TR), [r"corrupt or truncated gzip"]),
    ("t.csv", TR[:250] + b"\xff" + TR[250:], [r"not UTF-8", r"t\.csv:\d+:"]),
    ("t.csv", TR.replace(b"\n7,math,1", b"\n1e30,math,1", 1), [r"'request_id'", r"magnitude"]),
    ("t.csv", TR.replace(b"\n7,math,1,3,3", b"\n7,math,1,3,18446744073709551616", 1), [r"'accepted_len'"]),
    ("t.csv", b"# dsparksim-acceptance-trace/1 " + b"[" * 100000 + b"\n", [r":1:", r"'metadata'", r"too deeply"]),
    ("t.csv", TR.split(b"\n", 1)[0] + b"\nrequest_id,domain,step,K,accepted_len,conf_1,conf_2,conf_3\n",
     [r"empty trace"]),
])
def test_acceptance_trace_file(capsys, tmp_path, run, name, data, needles):
    p = _w(tmp_path, name, data)
    _fails_cleanly(capsys, run + ["-K", "3", "--acceptance", p], re.escape(p), *needles)


# ------------------------------------------------------------------ profile import
IMPORT_CASES = [
    ("vllm", b'{"sample_batch_tokens": [8, 16], "sample_steps_per_sec": [100, 9\xff], "max_batch_tokens": 16}',
     [r"not UTF-8"]),
    ("vllm", '{"sample_batch_tokens": [8, 16], "sample_steps_per_sec": [100, %d], "max_batch_tokens": 16}'
     % 10 ** 400, [r"'sample_steps_per_sec'", r"\(index 1\)"]),
    ("trt", '{"token_counts": [0, %d], "step_time_ms": [1, 2]}' % 2 ** 70, [r"'token_counts'", r"2\^53-1"]),
    ("sglang", '{"bias_seconds": %d, "bs_probes": [1], "alpha_seconds": [0], "m_probes": [1], '
               '"theta_seconds": [1]}' % 10 ** 400, [r"'bias_seconds'"]),
    ("trt", "[" * 100000, [r"nested too deeply"]),
]


@pytest.mark.parametrize("fmt,data,needles", IMPORT_CASES)
def test_profile_import_table(capsys, tmp_path, fmt, data, needles):
    p = _w(tmp_path, "table.json", data)
    _fails_cleanly(capsys, ["profile", "import", p, "--format", fmt, "--out", str(tmp_path / "o.json")],
                   re.escape(p), *needles, prefix="")


def test_profile_import_prefix(capsys, tmp_path):
    fmt, data, needles = IMPORT_CASES[0]
    p = _w(tmp_path, "table.json", data)
    _fails_cleanly(capsys, ["profile", "import", p, "--format", fmt, "--out", str(tmp_path / "o.json")], *needles)


# ------------------------------------------------------------------ sweep spec / regress baseline (read elsewhere)
def test_sweep_spec_not_utf8(capsys, tmp_path):
    p = _w(tmp_path, "s.toml", b'name = "x\xff"\n')
    _fails_cleanly(capsys, ["sweep", p, "--out", str(tmp_path / "o")], re.escape(p), r"(?i)utf-8")


def test_regress_baseline_not_utf8(capsys, tmp_path):
    p = _w(tmp_path, "b.json", b'{"format": "x\xff"}')
    _fails_cleanly(capsys, ["regress", "--baseline", p], re.escape(p))


def test_profile_metadata_nan_is_an_error(capsys, tmp_path, run):
    # found by the fuzz suite: NaN in free-form metadata reached the strict-JSON result writer (ValueError)
    p = _w(tmp_path, "p.json", _profile_case(_set("metadata.date", float("nan"))))
    _fails_cleanly(capsys, run + ["--profile", p], re.escape(p), r"'metadata\.date'", r"NaN")


def test_profile_metadata_nested_deeply_is_an_error(capsys, tmp_path, run):
    # found while fixing the NaN case: 500 levels parse as JSON but overflowed the recursion of later code
    p = _w(tmp_path, "p.json", _profile_case(_set("metadata.x", json.loads("[" * 500 + "]" * 500))))
    _fails_cleanly(capsys, run + ["--profile", p], re.escape(p), r"nested too deeply \(more than 64 levels\)")


@pytest.mark.parametrize("edit,needles", [
    (_set("name", "two\nlines"), [r"'name'", r"one-line", r"two\\nlines"]),
    (_set("bogus\nkey", 1), [r"bogus\\nkey", r"unknown key"]),
    (_set("metadata.date\u2028x", float("inf")), [r"date\\u2028x"]),
])
def test_profile_keys_with_line_breaks_stay_one_line(capsys, tmp_path, run, edit, needles):
    p = _w(tmp_path, "p.json", _profile_case(edit))
    _fails_cleanly(capsys, run + ["--profile", p], re.escape(p), *needles)


def test_acceptance_trace_header_with_line_break_stays_one_line(capsys, tmp_path, run):
    data = TR.replace(b"conf_3\n", b'"conf\n_3"\n', 1)
    p = _w(tmp_path, "t.csv", data)
    _fails_cleanly(capsys, run + ["-K", "3", "--acceptance", p], re.escape(p), r"conf\\n_3")


def test_parquet_trace_with_invalid_utf8_string(capsys, tmp_path, run):
    # found by the fuzz suite: Parquet does not check UTF-8, and pandas' Arrow strings failed later with an
    # ArrowException from inside validation
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from dsparksim.acceptance.trace_format import MAGIC, read_trace

    tr = read_trace(DATA / "acc_trace_k3.csv")
    table = pa.Table.from_pandas(tr.to_frame(), preserve_index=False)
    table = table.replace_schema_metadata({MAGIC.encode(): json.dumps(tr.metadata).encode()})
    clean = tmp_path / "clean.parquet"
    pq.write_table(table, clean, compression="none", use_dictionary=False)
    raw = clean.read_bytes()
    assert b"math" in raw
    p = _w(tmp_path, "t.parquet", raw.replace(b"math", b"m\xffth"))
    _fails_cleanly(capsys, run + ["-K", "3", "--acceptance", p], re.escape(p), r"cannot read Parquet file")
