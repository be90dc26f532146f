"""Every `dsparksim ...` command shown in README.md's and docs/*.md's code blocks is real.

(a) Parsed: every command (continuation lines joined, `A && B` split, leading `VAR=value` dropped) goes through the
    real parser, `dsparksim.cli.main.build_parser()`, so a subcommand or flag that does not exist fails here.
(b) Executed, in document order in a scratch folder per page (the repo's input folders linked in, outputs written
    there), exactly the cheap ones, each of which must exit 0 and write its `--out`:
    `--help`; `profile list|show|import|build` (a second each); `trace inspect`; `bench import` whose inputs are
    shipped files (the test fixtures), and `bench replay` and `profile fit` of the runs table such an import wrote
    above it on the page (seconds on those few rows); `run` with at most 64 prompts (`--num-prompts`), or at most 10 s and 8 users (`--duration`,
    `--concurrency`).
    Only parsed: `frontier` (about a minute on the defaults), `sweep`, `capacity`, `regress` and `plan` (tens of
    seconds to minutes of cells), longer `run`s, imports of the user's own files (placeholders such as
    `results/*.json`), and the torch backend (`train`, `measure`, `run-real`, `validate`, `audit` need torch, the
    trained models and minutes to hours). CI runs the README's second command itself (`.ci/run`).
Also: the README opens with the two commands `.ci/run` relies on, its relative links resolve, and `mkdocs build
--strict` builds the docs.
"""
from __future__ import annotations

import contextlib
import glob
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from dsparksim.cli.main import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINKED = ("tests", "traces", "profiles", "sweeps", "dsparksim", "notebooks")   # read-only inputs, linked in


def doc_commands(path: Path) -> list[tuple[int, list[str]]]:
    """(line, argv after `dsparksim`) for every dsparksim command in the file's fenced code blocks."""
    found, in_code, buf, start = [], False, "", 0
    for i, ln in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if ln.lstrip().startswith("```"):
            in_code, buf = not in_code, ""
            continue
        if not in_code:
            continue
        buf, start = (buf + " " + ln.strip(), start) if buf else (ln.strip(), i)
        if buf.endswith("\\"):
            buf = buf[:-1].rstrip()
            continue
        for seg in re.split(r"\s*(?:&&|;)\s*", buf):
            seg = re.sub(r"^(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*", "", seg.strip())   # leading VAR=value
            if re.match(r"^dsparksim(\s|$)", seg):   # a command (output blocks' other lines are not shell)
                found.append((start, shlex.split(seg, comments=True)[1:]))
        buf = ""
    return found


ALL = [(p, line, argv) for p in PAGES for line, argv in doc_commands(p)]


def _opt(argv: list[str], *names: str) -> str | None:
    for j, a in enumerate(argv):
        for n in names:
            if a == n and j + 1 < len(argv):
                return argv[j + 1]
            if a.startswith(n + "="):
                return a.split("=", 1)[1]
    return None


def executed(argv: list[str], cwd: Path) -> bool:
    """Whether the test runs this command (see the module docstring)."""
    if "--help" in argv or "-h" in argv:
        return True
    head = tuple(argv[:2])
    if argv[0] == "profile" and argv[1:2] and argv[1] in ("list", "show", "import", "build"):
        return True
    if head == ("profile", "fit"):   # a few seconds on a handful of runs
        return (cwd / argv[2]).is_file()
    if head == ("trace", "inspect"):
        return True
    if head == ("bench", "import"):
        ins = [a for a in argv[2:] if not a.startswith("-") and a.endswith((".json", ".jsonl", ".csv"))
               and a != _opt(argv, "--out")]
        return bool(ins) and all(Path(a).parts[0] in LINKED and (ROOT / a).is_file() and not glob.has_magic(a)
                                 for a in ins)       # shipped files only (not ../shared data, not the user's)
    if head == ("bench", "replay"):
        return (cwd / argv[2]).is_file()
    if argv[0] == "run":
        prompts, dur, conc = _opt(argv, "--num-prompts"), _opt(argv, "--duration"), _opt(argv, "--concurrency")
        if prompts is not None:
            return int(prompts) <= 64
        return dur is not None and float(dur) <= 10 and conc is not None and int(conc) <= 8
    return False


def test_found_the_documented_commands():
    """The extractor sees the commands (a broken extractor would make every test below vacuous)."""
    readme = [argv for p, _, argv in ALL if p.name == "README.md"]
    assert ["frontier"] in readme                       # the README's first command
    assert len(ALL) >= 30
    assert {p.name for p, _, _ in ALL} >= {"README.md", "commands.md", "benchmarks.md", "sweeps.md", "torch.md"}


@pytest.mark.parametrize("page,line,argv", ALL, ids=[f"{p.name}:{ln}" for p, ln, _ in ALL])
def test_documented_command_parses(page, line, argv):
    if "--help" in argv or "-h" in argv:   # help exits 0 after printing; an unknown subcommand exits 2
        with pytest.raises(SystemExit) as e, contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            build_parser().parse_args(argv)
        assert e.value.code == 0, f"{page.name}:{line}: `dsparksim {' '.join(argv)}` exits {e.value.code}"
        return
    try:
        with contextlib.redirect_stderr(io.StringIO()) as err:
            args = build_parser().parse_args(argv)
    except SystemExit as e:
        pytest.fail(f"{page.name}:{line}: `dsparksim {' '.join(argv)}` does not parse (exit {e.code}): "
                    f"{err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else ''}")
    assert callable(getattr(args, "func", None)), f"{page.name}:{line}: no subcommand selected"


def test_the_parser_check_can_fail():
    """A misspelt flag does not parse (so the test above would catch a documented flag that does not exist)."""
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
        build_parser().parse_args(["run", "--concurency", "8"])


EXEC_PAGES = [p for p in PAGES if doc_commands(p)]


@pytest.mark.parametrize("page", EXEC_PAGES, ids=[p.name for p in EXEC_PAGES])
def test_cheap_documented_commands_run(page, tmp_path, monkeypatch, capsys):
    for d in LINKED:
        (tmp_path / d).symlink_to(ROOT / d, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    ran = []
    for line, argv in doc_commands(page):
        if not executed(argv, tmp_path):
            continue
        out = _opt(argv, "--out", "--plot")
        if out is not None:   # never write into the linked repo folders
            assert Path(out).parts[0] not in LINKED, f"{page.name}:{line}: would write into the repo: {out}"
        if "--help" in argv:
            with pytest.raises(SystemExit) as e:
                main(argv)
            assert e.value.code == 0
            assert "usage: dsparksim" in capsys.readouterr().out
        else:
            rc = main(argv)
            captured = capsys.readouterr()
            assert rc == 0, f"{page.name}:{line}: `dsparksim {' '.join(argv)}` exited {rc}: {captured.err[-800:]}"
            if out is not None:
                assert (tmp_path / out).exists(), f"{page.name}:{line}: {out} not written"
            if argv[:2] == ["profile", "list"]:
                assert "h100-llama2-7b-tp1" in captured.out and "built-h200x8-deepseek-v3-dp8ep8" in captured.out
        ran.append(" ".join(argv[:2]))
    if page.name == "README.md":   # the README's cheap commands all ran
        assert {"profile list", "bench import", "bench replay", "profile fit", "profile build"} <= set(ran)
        assert any(r.startswith("run ") for r in ran), ran


def test_readme_opens_with_the_two_commands_ci_runs():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    first, second = ('pip install -e . && dsparksim frontier', 'pip install -e ".[test,torch,ray]" && python -m pytest')
    assert text.startswith(f"# dsparksim\n\n```bash\n{first}\n{second}\n```\n")
    assert second in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert 'pip install -e ".[notebooks]"' in text and "torch==2.13.0" in text.split("## ")[0]


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_relative_links_resolve(page):
    text = (ROOT / page).read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target):
            continue
        path = target.split("#", 1)[0]
        if path:
            assert (page.parent / path).exists(), f"{page.name}: link to {target} does not resolve"


def test_mkdocs_build_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (it comes with the test extra: "
                                         "pip install -e '.[test]')")
    pytest.importorskip("material", reason="mkdocs-material is not installed (test extra)")
    site = tmp_path / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(ROOT / "mkdocs.yml"),
                        "-d", str(site)], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    for p in (ROOT / "docs").glob("*.md"):
        built = site / ("index.html" if p.stem == "index" else f"{p.stem}/index.html")
        assert built.is_file(), f"{p.name} was not built"


def test_walk_through_imports_give_every_column_replay_and_fit_need():
    """docs/from-benchmark-to-frontier.md step 2 imports the runs of step 1 for profile fit: each `bench import`
    of the user's own files must set every column bench replay / profile fit need that its format does not
    carry (the SGLang one lacked --num-prompts, which SGLang's line does not record: the fit then refused
    'num_prompts ... empty')."""
    from dsparksim.bench.importers import FILLED_BY
    from dsparksim.cli.bench import NEEDED
    page = ROOT / "docs" / "from-benchmark-to-frontier.md"
    imports = [argv for _, argv in doc_commands(page) if argv[:2] == ["bench", "import"]
               and not any(a.startswith("../shared") for a in argv)]
    assert len(imports) == 2, imports
    for argv in imports:
        fmt = "sglang" if argv[2].endswith(".jsonl") else "vllm"
        given = {a[2:].replace("-", "_") for a in argv if a.startswith("--")}
        lacking = [c for c in NEEDED if c not in FILLED_BY[fmt] and c not in given]
        assert not lacking, f"{' '.join(argv)}: {fmt} files do not carry {lacking}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_a_page_that_uses_shared_data_says_it_is_not_in_a_clone(page):
    """`../shared` sits beside this project's checkout; a user's clone has none. A page whose commands or text use
    it says so (docs/benchmarks.md and docs/policies.md did not: their `bench import ../shared/...` fails in a
    clone with no word why)."""
    text = " ".join(page.read_text(encoding="utf-8").split())   # a phrase may wrap
    if "../shared" in text:
        assert "beside the repository checkout" in text, page.name
