"""Run ``dsparksim.cli.main.main`` in-process under a hang guard and judge what it did (shared by the trust tests).

The property every command must keep: exit 0, or exit 2 with exactly one stderr line
``dsparksim: error: ...`` -- never a traceback, another exception, another exit code or a hang.
"""
from __future__ import annotations

import contextlib
import io
import re
import signal
import threading
from dataclasses import dataclass

PREFIX = "dsparksim: error:"


class Hang(BaseException):
    """Raised by the alarm guard; a BaseException so that no ``except Exception`` in the code swallows it."""


@dataclass
class Outcome:
    argv: list[str]
    rc: int | None            # return value or SystemExit code; None when an exception escaped
    stdout: str
    stderr: str
    exc: BaseException | None = None

    @property
    def lines(self) -> list[str]:
        return [ln for ln in self.stderr.splitlines() if ln.strip()]

    def describe(self) -> str:
        e = f", exception {type(self.exc).__name__}: {self.exc}" if self.exc is not None else ""
        return f"argv={self.argv!r}: rc={self.rc}{e}, stderr={self.stderr[-1500:]!r}"


def run_cli(argv: list[str], limit_s: int = 30, cpu_limit_s: float | None = None) -> Outcome:
    """main(argv) with stdout/stderr captured; SystemExit is an exit code, any other exception is recorded.

    A run longer than ``limit_s`` wall seconds is stopped by SIGALRM (main thread only) and recorded as a
    :class:`Hang`; with ``cpu_limit_s`` so is a run that used more than that many seconds of this process's CPU
    time (SIGPROF). CPU time does not grow while other processes hold the cores, so a tight CPU limit catches a
    busy loop as soon as a wall limit would on an idle machine without failing on a loaded one; ``limit_s`` then
    only backs it up for a run that blocks without computing.
    """
    from dsparksim.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    rc, exc = None, None
    guard = threading.current_thread() is threading.main_thread()

    def _alarm(signum, frame):
        raise Hang(f"no answer within {limit_s} s: {argv!r}")

    def _cpu(signum, frame):
        raise Hang(f"no answer within {cpu_limit_s} s of CPU time: {argv!r}")

    old = signal.signal(signal.SIGALRM, _alarm) if guard else None
    old_prof = signal.signal(signal.SIGPROF, _cpu) if guard and cpu_limit_s else None
    if guard:
        signal.alarm(limit_s)
        if cpu_limit_s:
            signal.setitimer(signal.ITIMER_PROF, cpu_limit_s)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(list(argv))
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException as e:  # noqa: BLE001 - judged by the caller (a Hang included)
                exc = e
    finally:
        if guard:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
            if cpu_limit_s:
                signal.setitimer(signal.ITIMER_PROF, 0)
                signal.signal(signal.SIGPROF, old_prof)
    return Outcome(list(argv), rc, out.getvalue(), err.getvalue(), exc)


_ARGPARSE = re.compile(r"^dsparksim( [\w-]+)*: error: ")


def classify(o: Outcome) -> str:
    """'ok' (exit 0), 'error' (exit 2, one 'dsparksim: error:' or 'dsparksim CMD: error:' line), or the name
    of what went wrong:
    'argparse-usage' (argparse's usage block + its error line), 'prefix' (one line, other prefix),
    'hang', 'exception', 'traceback', 'not-one-line', 'exit-code'."""
    if isinstance(o.exc, Hang):
        return "hang"
    if o.exc is not None:
        return "exception"
    if "Traceback" in o.stderr or "Traceback" in o.stdout:
        return "traceback"
    if o.rc == 0:
        return "ok"
    if o.rc != 2:
        return "exit-code"
    lines = o.lines
    # argparse's own checks answer 'dsparksim run: error: argument --x: ...' (the subcommand in the prefix)
    if len(lines) == 1 and (lines[0].startswith(PREFIX) or _ARGPARSE.match(lines[0])):
        return "error"
    if len(lines) >= 2 and lines[0].startswith("usage:") and _ARGPARSE.match(lines[-1]):
        return "argparse-usage"
    if len(lines) == 1 and re.match(r"^(\w[\w ]*: )?error: ", lines[0]):
        return "prefix"
    return "not-one-line"


def sample_replay_argv(tmp_path, where: str = "gpu=h200,engine=sglang") -> list[str]:
    """`bench replay` argv over the sample InferenceX rows (tests/data/bench/inferencex_rows.csv), imported into
    ``tmp_path``/runs.csv; its --out is ``tmp_path``/rp (the flag tests check it is never created)."""
    from pathlib import Path
    runs = tmp_path / "runs.csv"
    rows = Path(__file__).parent / "data" / "bench" / "inferencex_rows.csv"
    assert classify(run_cli(["bench", "import", str(rows), "--out", str(runs)])) == "ok"
    return ["bench", "replay", str(runs), "--profile", "built-h200x8-deepseek-v3-tp8", "--quiet",
            "--where", where, "--out", str(tmp_path / "rp")]


def stub_runner_work(monkeypatch) -> list[str]:
    """Replace the torch runner's work (measure, model building, real runs, audits) by stubs that record their
    calls; returns the list they append to (empty = the command refused before any work)."""
    import dsparksim.runner.audit as audit_mod  # lazy: torch (the CLI tests import this module without it)
    import dsparksim.runner.measure as measure_mod
    import dsparksim.runner.run as run_mod
    import dsparksim.runner.validate as validate_mod
    calls: list[str] = []
    monkeypatch.setattr(measure_mod, "measure", lambda *a, **k: calls.append("measure"))
    monkeypatch.setattr(validate_mod, "build_models", lambda *a, **k: calls.append("build_models"))
    monkeypatch.setattr(run_mod, "real_run", lambda *a, **k: calls.append("real_run"))
    monkeypatch.setattr(audit_mod, "audit_all", lambda **k: calls.append("audit") or [])
    return calls
