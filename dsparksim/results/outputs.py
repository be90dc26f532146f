"""Result directories that are complete or absent, checked before any work starts.

* ``check_out_dir`` (called before a simulation starts): OUT must be creatable and writable, and an existing OUT
  must be a directory holding only result files that a dsparksim run or frontier wrote (its ``config.json``
  says so), never the working directory or a folder above it: it is replaced whole, so a folder of the user's own
  .json/.csv files (a measured profile, a lengths file, a model's config.json) must never qualify.
* ``staged_dir`` (``run``, ``run-real``, ``frontier``): every file is written into the hidden sibling
  ``.OUT.tmp-<pid>``, which then replaces OUT (rename). An old ``steps.csv`` never survives a rerun, and a run
  killed while writing leaves the previous OUT as it was (or, killed between the two renames, no OUT at all).
* ``write_result_set`` (``sweep``, ``capacity``): OUT also holds the resumable cell cache, so only the final files
  are replaced, as a set: the set's manifest is removed first and written last, listing every file with its size
  and sha256. Result files without a manifest (or whose bytes disagree with it) are an interrupted write.

New files and directories get the usual permissions (0644 / 0755 under a 022 umask).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Mapping

from dsparksim.errors import ConfigError

RESULT_SUFFIXES = (".json", ".csv", ".parquet", ".png", ".gz")


def check_out_dir(path: str | Path, option: str = "--out", replace: bool = True) -> Path:
    """Raise ConfigError (naming ``option``) unless ``path`` can become a result directory.

    ``replace``: OUT is replaced whole, so an existing OUT may only hold result files (no subdirectories).
    """
    p = Path(path)
    if replace:
        refuse_working_dir(p, option)
    if p.exists() or p.is_symlink():
        if not p.is_dir():
            raise ConfigError("cli", option, f"expected a directory, but {str(p)!r} is a file")
        if replace:
            entries = sorted(p.iterdir())
            other = [c.name for c in entries
                     if not (c.is_file() and (c.suffix in RESULT_SUFFIXES or c.name.endswith(".tmp")))]
            if other:
                raise ConfigError("cli", option, f"{str(p)!r} is replaced whole by the new results but holds "
                                  f"other things ({', '.join(other[:5])}); choose a new or empty directory")
            files = [c.name for c in entries]
            if files and not written_by_dsparksim(p):
                raise ConfigError("cli", option, f"{str(p)!r} is replaced whole by the new results but holds files "
                                  f"that no dsparksim run or frontier wrote ({', '.join(files[:5])}"
                                  f"{', ...' if len(files) > 5 else ''}; their config.json would name the "
                                  "dsparksim version); choose a new or empty directory")
        _check_writable(p, option)
        anchor = p.resolve().parent if replace else p
        _check_writable(anchor, option)
        return p
    _check_creatable(p, option)
    return p


def check_out_file(path: str | Path, option: str = "--out") -> Path:
    """Raise ConfigError (naming ``option``) unless ``path`` can be written as one result file: not a directory,
    and its folder exists and is writable or can be created (checked before any work starts)."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError("cli", option, f"{str(p)!r} is a directory; expected the path of the file to write")
    _check_creatable(p, option)
    return p


def refuse_working_dir(p: Path, option: str = "--out") -> None:
    """Raise ConfigError unless ``p`` is neither the working directory nor a folder above it (an OUT that is
    replaced or cleaned must never take the user's working tree with it)."""
    here = Path.cwd().resolve()
    if here == p.resolve() or p.resolve() in here.parents:
        raise ConfigError("cli", option, f"{str(p)!r} is the working directory or holds it; choose a new "
                          "directory (e.g. --out results/run1)")


def _check_creatable(p: Path, option: str) -> None:
    # the nearest existing ancestor must be a writable directory: everything below it can be created
    anc = p.absolute().parent
    while not anc.exists():
        anc = anc.parent
    if not anc.is_dir():
        raise ConfigError("cli", option, f"cannot create {str(p)!r}: {str(anc)!r} is a file")
    _check_writable(anc, option)


def written_by_dsparksim(d: Path) -> bool:
    """True when ``d/config.json`` is a result config of ``run``/``run-real`` or ``frontier`` (it records the
    dsparksim version; frontier folders written before it did are known by their base_config and policies)."""
    try:
        doc = json.loads((d / "config.json").read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return isinstance(doc, dict) and ("dsparksim_version" in doc or {"base_config", "policies"} <= doc.keys())


def _check_writable(d: Path, option: str) -> None:
    # Create and remove a probe directory: os.access says yes to root even on read-only or virtual file systems.
    try:
        os.rmdir(tempfile.mkdtemp(dir=d, prefix=".dsparksim-probe-"))
    except OSError as e:
        raise ConfigError("cli", option, f"directory {str(d)!r} is not writable ({e.strerror or e})") from None


def need_parquet(option: str = "--format") -> None:
    """Raise ConfigError unless pyarrow imports (checked before a run, not when its table is written)."""
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise ConfigError("cli", option, "parquet needs pyarrow (pip install pyarrow), or use --format csv") \
            from None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _clean_stale(out: Path) -> None:
    # Staging folders of killed runs (their pid is gone) are never results: remove them.
    for q in out.parent.glob(f".{out.name}.*-*"):
        kind, _, pid = q.name[len(out.name) + 2:].rpartition("-")
        if kind in ("tmp", "old") and pid.isdigit() and not _alive(int(pid)) and q.is_dir():
            shutil.rmtree(q, ignore_errors=True)


@contextmanager
def staged_dir(out: str | Path) -> Iterator[Path]:
    """Yield a fresh staging directory; on success it replaces ``out`` whole, on any exception it is removed."""
    out = Path(out)
    if out.is_symlink():
        out = out.resolve()  # replace the directory the link points to, keep the link
    out.parent.mkdir(parents=True, exist_ok=True)
    _clean_stale(out)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    os.mkdir(tmp)  # mode 0777 less the umask, like any new directory (mkdtemp would make it 0700)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    replace_dir(tmp, out)


def replace_dir(new: Path, out: Path) -> None:
    """Move directory ``new`` to ``out``, replacing an existing ``out`` whole."""
    if not out.exists():
        os.rename(new, out)
        return
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    if old.exists():
        shutil.rmtree(old)
    os.rename(out, old)
    try:
        os.rename(new, out)
    except BaseException:
        os.rename(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)


def write_result_set(out: str | Path, files: Mapping[str, Callable[[Path], None]], manifest: str,
                     stale: tuple[str, ...] = (), status: Mapping[str, object] | None = None) -> dict[str, Path]:
    """Replace a set of result files in ``out`` as a unit: drop the manifest, write each file atomically, remove
    the ``stale`` names this set no longer has, then write the manifest (size + sha256 of every file) last.

    ``status``: what the set describes, recorded in the manifest; its ``complete`` (default True) says whether the
    work behind the files finished (a sweep with failed cells writes its files whole but is not complete)."""
    from dsparksim.sim.simulate import atomic_write

    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    (d / manifest).unlink(missing_ok=True)
    paths = {}
    for name, write in files.items():
        paths[name] = d / name
        atomic_write(d / name, write)
    for name in stale:
        if name not in files:
            (d / name).unlink(missing_ok=True)
    entries = {name: {"bytes": p.stat().st_size, "sha256": _sha256(p)} for name, p in paths.items()}
    doc = {"complete": True, **(status or {}), "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "files": entries}
    atomic_write(d / manifest, lambda p: p.write_text(json.dumps(doc, indent=1) + "\n"))
    return paths


def result_set_complete(out: str | Path, manifest: str) -> bool:
    """True when ``manifest`` exists in ``out`` and every file it lists has the recorded size and sha256."""
    d = Path(out)
    try:
        doc = json.loads((d / manifest).read_text())
        return all((d / n).is_file() and _sha256(d / n) == e["sha256"] for n, e in doc["files"].items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _sha256(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
