"""`dsparksim measure` / `validate` draw their progress bar on a terminal only, like every other command: a log or
a pipe (here: pytest's captured stderr) gets the result lines, DSPARKSIM_PROGRESS=1 forces the bar, --quiet never."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")

import dsparksim.runner.measure as measure_mod  # noqa: E402
import dsparksim.runner.validate as validate_mod  # noqa: E402
from dsparksim.cli.main import main  # noqa: E402


class _Seen(Exception):
    pass


def _spy(seen):
    def fake(*a, progress=True, **k):
        seen.append(progress)
        raise _Seen
    return fake


@pytest.mark.parametrize("argv, target", [(["measure", "--out", "OUT/p.json"], (measure_mod, "measure")),
                                          (["validate", "--policies", "fixed:7", "--concurrency", "1", "--out", "OUT"],
                                           (validate_mod, "validate"))])
@pytest.mark.parametrize("env, quiet, want", [(None, False, False), ("1", False, True), ("1", True, False)])
def test_runner_commands_draw_the_bar_on_a_terminal_only(tmp_path, monkeypatch, argv, target, env, quiet, want):
    seen = []
    monkeypatch.setattr(*target, _spy(seen))
    if env is None:
        monkeypatch.delenv("DSPARKSIM_PROGRESS", raising=False)
    else:
        monkeypatch.setenv("DSPARKSIM_PROGRESS", env)
    args = [a.replace("OUT", str(tmp_path)) for a in argv] + (["--quiet"] if quiet else [])
    with pytest.raises(_Seen):
        main(args)
    assert seen == [want]
