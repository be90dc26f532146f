"""Result tables and the lengths file without pandas give what pandas gives, byte for byte / value for value
(issue 28 part 6: a run no longer imports pandas)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dsparksim.results.csvtable import table_cells, write_csv_cells
from dsparksim.sim.simulate import write_table
from dsparksim.traffic import readers as R


def _columns(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    f = rng.standard_normal(n) * 10.0 ** rng.integers(-12, 12, n)
    f[::7] = np.nan
    f[3::11] = np.inf
    f[5::13] = -np.inf
    f[6::17] = -0.0
    f[1::19] = 0.0
    words = np.array(["", "chat", "a,b", 'say "hi"', "two\nlines", " pad ", "math"], dtype=object)
    s = words[rng.integers(0, len(words), n)]
    s[4::9] = None
    return {
        "i": rng.integers(-2**62, 2**62, n),
        "small": rng.integers(-3, 3, n).astype(np.int8),
        "u": rng.integers(0, 2**63, n).astype(np.uint64),
        "b": rng.random(n) < 0.5,
        "f": f,
        "f32": f.astype(np.float32),
        "int_like": np.round(rng.random(n) * 1e6),
        "s": s,
        "u_str": np.array(["x", "y,z"] * (n // 2) + ["w"] * (n % 2)),
        "tiny": np.full(n, 5e-324),
    }


@pytest.mark.parametrize("n", [0, 1, 2, 257])
@pytest.mark.parametrize("fmt", ["%.9g", "%.3f"])
def test_csv_without_pandas_is_byte_identical_to_to_csv(tmp_path, n, fmt):
    cols = _columns(n, np.random.default_rng(n))
    cells = table_cells(cols, fmt)
    assert cells is not None
    write_csv_cells(tmp_path / "ours.csv", list(cols), cells)
    pd.DataFrame(cols).to_csv(tmp_path / "pandas.csv", index=False, float_format=fmt)
    assert (tmp_path / "ours.csv").read_bytes() == (tmp_path / "pandas.csv").read_bytes()


def test_write_table_takes_columns_or_a_frame_alike(tmp_path):
    cols = _columns(50, np.random.default_rng(7))
    write_table(tmp_path / "a.csv", cols)
    write_table(tmp_path / "b.csv", pd.DataFrame(cols))
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
    # a column kind only pandas formats (datetimes) goes through pandas, whole
    cols["t"] = np.array(["2026-12-03T21:00"] * 50, dtype="datetime64[s]")
    assert table_cells(cols) is None
    write_table(tmp_path / "c.csv", cols)
    pd.DataFrame(cols).to_csv(tmp_path / "d.csv", index=False, float_format="%.9g")
    assert (tmp_path / "c.csv").read_bytes() == (tmp_path / "d.csv").read_bytes()


def _via_pandas(path, text):
    """_parse_lengths as it was: always the pandas reader."""
    df, line = R._read_csv_strings(path, text)
    cols = next((pair for pair in R.LENGTH_COLUMNS if pair[0] in df.columns), R.LENGTH_COLUMNS[0])
    R._require(path, df, cols)
    p = R._token_counts(path, df, cols[0], line)
    o = R._token_counts(path, df, cols[1], line)
    dom = R._domains(path, df["domain"].to_numpy(), line) if "domain" in df.columns else None
    return R._table(path, "lengths", p, o, line, columns=cols, domain=dom)


def _outcome(fn, path, text):
    try:
        t = fn(path, text)
    except R.InputError as e:
        return ("error", str(e))
    return ("ok", t.columns, t.prompt_tokens.tolist(), t.output_tokens.tolist(), t.line.tolist(),
            None if t.domain is None else t.domain.tolist(), t.prompt_tokens.dtype, t.line.dtype)


PLAIN = [
    "num_prefill_tokens,num_decode_tokens\n10,20\n30,40\n",
    "num_prefill_tokens,num_decode_tokens\n10,20\n\n30,40",                 # blank line, no final newline
    "x,ContextTokens,GeneratedTokens,domain\n1,5,6,math\n2,007,8,chat\n\n\n",
    "num_prefill_tokens,num_decode_tokens,domain\n1,2,poetry\n",          # bad domain: the same error
    "num_prefill_tokens,num_decode_tokens\n1,0\n",                         # zero count: the same error
    "num_prefill_tokens,num_decode_tokens\n1,999999999999999\n",
]
NOT_PLAIN = [
    "num_prefill_tokens,num_decode_tokens\n1, 2\n",              # a space: pandas decides
    "num_prefill_tokens,num_decode_tokens\n1,2.0\n",
    'num_prefill_tokens,num_decode_tokens\n"1",2\n',
    "num_prefill_tokens,num_decode_tokens\r\n1,2\r\n",
    "num_prefill_tokens,num_decode_tokens\n1,2,3\n",
    "num_prefill_tokens,num_decode_tokens\n,\n1,2\n",
    "num_prefill_tokens,num_decode_tokens\n1,12345678901234567\n",
    "num_prefill_tokens,num_decode_tokens\n",
    "num_prefill_tokens\n1\n",
    "num_prefill_tokens,num_decode_tokens,num_decode_tokens\n1,2,3\n",
]


@pytest.mark.parametrize("text", PLAIN + NOT_PLAIN)
def test_lengths_without_pandas_read_what_pandas_reads(tmp_path, text):
    path = tmp_path / "lengths.csv"
    path.write_text(text)
    try:
        taken = R._plain_lengths(path, text) is not None
    except R.InputError:
        taken = True
    assert taken == (text in PLAIN)     # a plain file is read (or refused) without pandas, any other by pandas
    assert _outcome(R._parse_lengths, path, text) == _outcome(_via_pandas, path, text)


@pytest.mark.parametrize("n", [0, 1, 257])
@pytest.mark.parametrize("fmt", ["%.9g", "%.3f,"])
def test_cells_needing_no_quotes_are_joined_to_the_same_bytes(tmp_path, n, fmt):
    # no string needs quoting: the lines are joined directly ("%.3f," puts a comma in every float: csv.writer again)
    cols = _columns(n, np.random.default_rng(n + 1))
    plain = np.array(["", "chat", " pad ", "math", "ü"], dtype=object)
    cols["s"] = plain[np.arange(n) % len(plain)]
    cols["s"][2::5] = None
    cols["u_str"] = np.array(["x", "y z"] * (n // 2) + ["w"] * (n % 2))
    write_csv_cells(tmp_path / "ours.csv", list(cols), table_cells(cols, fmt))
    pd.DataFrame(cols).to_csv(tmp_path / "pandas.csv", index=False, float_format=fmt)
    assert (tmp_path / "ours.csv").read_bytes() == (tmp_path / "pandas.csv").read_bytes()


def test_integer_columns_of_few_values_are_the_same_bytes(tmp_path):
    # a column whose range is small next to its length formats each value of the range once: the same cells
    rng = np.random.default_rng(4)
    n = 300
    cols = {"int8_full": np.resize(np.arange(-128, 128, dtype=np.int8), n),
            "neg": rng.integers(-40, -30, n), "zero": np.zeros(n, np.int64),
            "u64_small": rng.integers(0, 5, n).astype(np.uint64) + np.uint64(2**64 - 10),
            "u64_low": rng.integers(0, 5, n).astype(np.uint64), "near_max": np.full(n, 2**63 - 1),
            "near_min": rng.integers(-2**63, -2**63 + 3, n), "b": rng.random(n) < 0.3}
    write_csv_cells(tmp_path / "ours.csv", list(cols), table_cells(cols))
    pd.DataFrame(cols).to_csv(tmp_path / "pandas.csv", index=False, float_format="%.9g")
    assert (tmp_path / "ours.csv").read_bytes() == (tmp_path / "pandas.csv").read_bytes()


@pytest.mark.parametrize("block", [1, 3, 64, 4096])
def test_columns_written_in_blocks_are_the_same_bytes(tmp_path, block):
    # requests.csv is formatted a block of rows at a time: the file is the one the whole table gives, whether a
    # block needs quoting or not, down to a header needing quotes and one-column tables (csv.writer's "" cell)
    from dsparksim.results.csvtable import csv_kinds_supported, write_csv_columns

    n = 150
    cols = _columns(n, np.random.default_rng(9))
    cols["s"][:100] = "plain"                     # the first blocks need no quoting, later ones do
    cases = [cols, {"x,y": cols["i"], "b": cols["b"]}, {"only": cols["s"]}, {"e": np.array([""] * 5, dtype=object)},
             {k: v[:0] for k, v in cols.items()}]
    for j, c in enumerate(cases):
        assert csv_kinds_supported(c)
        write_csv_columns(tmp_path / f"blocks{j}.csv", c, block=block)
        write_csv_cells(tmp_path / f"whole{j}.csv", list(c), table_cells(c))
        pd.DataFrame(c).to_csv(tmp_path / f"pandas{j}.csv", index=False, float_format="%.9g")
        got = (tmp_path / f"blocks{j}.csv").read_bytes()
        assert got == (tmp_path / f"whole{j}.csv").read_bytes() == (tmp_path / f"pandas{j}.csv").read_bytes()
    assert not csv_kinds_supported({"t": np.array(["2026-12-03T21:00"], dtype="datetime64[s]")})
    assert not csv_kinds_supported({"m": np.zeros((2, 2))})
    with pytest.raises(ValueError, match="unequal lengths"):
        write_csv_columns(tmp_path / "bad.csv", {"a": np.zeros(2), "b": np.zeros(3)})
