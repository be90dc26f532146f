"""Result directories that are complete or absent, checked before any work starts.

* ``check_out_dir`` (called before a simulation starts): OUT must be creatable and writable, and an existing OUT
  must be a directory holding only result files that a dsparksim run or frontier wrote (its ``config.json``
  says so), never the working directory or a folder above it: it is replaced whole, so a folder of the user's own
  .json/.csv files (a measured profile, a lengths file, a model's config.json) must never qualify.
* ``staged_dir`` (``run``, ``run-real``, ``frontier``): every file is written into the hidden sibling
  ``.OUT.tmp-<pid>``, which then replaces OUT (rename). An old ``steps.csv`` never survives a rerun, and a run
  killed while writing leaves the previous OUT as it was (or, killed between the two renames, no OUT at all).
* ``write_result_set`` (``sweep``, ``capacity``, ``plan``): OUT also holds the resumable cell cache, so only the
  final files are replaced, as a set: the set's manifest is first rewritten as pending (names only, not complete)
  and written last, listing every file with its size and sha256. Result files whose manifest is pending (or whose
  bytes disagree with it) are an interrupted write.

One rule for every command that writes (issue 31): nothing the user wrote is ever overwritten. dsparksim replaces
only what dsparksim wrote, as the file's own mark, its folder's ``config.json`` or its result set's manifest says;
never an input of the command, never a file it did not write -- not even with ``--force``:

* ``claim_out_file`` (one file: ``profile build|import|measure --out``, ``measure --raw``, ``profile show --plot``,
  ``audit --out``, ``bench import --out`` and every new command that writes one file): an existing file that
  dsparksim wrote is replaced only with ``--force`` (the user means it);
* ``claim_result_set`` (``sweep``, ``capacity``, ``plan``: the set's file names in an existing folder; a rerun
  updates its own set, which is how an interrupted search resumes);
* ``check_out_dir`` (``run``, ``frontier``: a folder of dsparksim's results, replaced whole by a rerun).

New files and directories get the usual permissions (0644 / 0755 under a 022 umask).
"""
from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

from dsparksim.errors import ConfigError
from dsparksim import __version__

RESULT_SUFFIXES = (".json", ".csv", ".parquet", ".png", ".gz")
# every file a command that replaces its OUT whole writes there (`run`, `frontier`, `bench replay`); any other file
# in an existing OUT is someone else's and makes the folder refused, never deleted with the old results
RESULT_NAMES = frozenset({
    "config.json", "summary.json", "requests.csv", "requests.parquet", "steps.csv", "bench_result.json",
    "frontier.csv", "frontier_seeds.csv", "comparison.csv", "frontier.png", "frontier_per_gpu.png",
    "verify_budget.png", "replay.csv", "replay_errors.csv", "replay.png"})


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Write to a temporary file next to ``path`` and rename: a crash never leaves a half-written result.

    The temporary file is created with mode 0666 less the umask (as ``open`` would), not mkstemp's 0600, so
    results are readable by whoever may read the directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def check_out_dir(path: str | Path, option: str = "--out", replace: bool = True,
                  also: tuple[str, ...] = ()) -> Path:
    """Raise ConfigError (naming ``option``) unless ``path`` can become a result directory.

    ``replace``: OUT is replaced whole, so an existing OUT may only hold result files (no subdirectories) that a
    dsparksim run, frontier or replay writes (:data:`RESULT_NAMES`, plus the names in ``also``, e.g. a
    ``--result-filename``), and only ones a dsparksim command wrote (its config.json says so).
    """
    if str(path) == "":   # Path("") is ".": an unset shell variable would write into the working directory
        raise ConfigError("cli", option, f"empty path {str(path)!r}; expected the output folder (e.g. {option} "
                          "results/run1)")
    p = Path(path)
    if replace:
        refuse_working_dir(p, option)
    if p.exists() or p.is_symlink():
        if not p.is_dir():
            what = (f"a dangling symbolic link (to {os.readlink(p)!r})" if not p.exists() else "a file")
            raise ConfigError("cli", option, f"expected a directory, but {str(p)!r} is {what}")
        if replace:
            entries = sorted(p.iterdir())
            other = [c.name for c in entries
                     if not (c.is_file() and (c.suffix in RESULT_SUFFIXES or c.name.endswith(".tmp")))]
            if other:
                raise ConfigError("cli", option, f"{str(p)!r} is replaced whole by the new results but holds "
                                  f"other things ({', '.join(other[:5])}); choose a new or empty directory")
            foreign = [c.name for c in entries if c.name not in RESULT_NAMES and c.name not in also
                       and not c.name.endswith(".tmp")]
            if foreign:
                raise ConfigError("cli", option, f"{str(p)!r} is replaced whole by the new results but holds files "
                                  f"this command does not write ({', '.join(foreign[:5])}"
                                  f"{', ...' if len(foreign) > 5 else ''}), which would be deleted; move them or "
                                  "choose a new or empty directory")
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
    and its folder exists and is writable or can be created (checked before any work starts).

    It does not judge an existing file: a command that writes a file uses :func:`claim_out_file` (the overwrite
    rule), which also makes these checks."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError("cli", option, f"{str(p)!r} is a directory; expected the path of the file to write")
    _check_creatable(p, option)
    return p


# ------------------------------------------------------------------------------ the one overwrite rule
MARK = "dsparksim"   # the mark a file dsparksim wrote carries (JSON: written_by; images: Software/Creator)


def written_by() -> str:
    """The mark dsparksim puts in what it writes: ``dsparksim <version>``."""

    return f"{MARK} {__version__}"


def image_metadata(path: str | Path) -> dict[str, str] | None:
    """matplotlib ``savefig(metadata=...)`` marking a plot as dsparksim's (PNG Software, SVG/PDF Creator); None
    for formats that carry no such text (an existing file of such a format is never replaced)."""
    ext = Path(path).suffix.lower()
    if ext == ".png":
        return {"Software": written_by()}
    if ext in (".svg", ".svgz", ".pdf", ".eps", ".ps"):
        return {"Creator": written_by()}
    return None


def _json_doc(p: Path):
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return None


def _marked(v: object) -> bool:
    return isinstance(v, str) and v.split(" ", 1)[0] == MARK


def _is_profile(p: Path) -> bool:
    # metadata.written_by (every profile dsparksim writes); metadata.build: profile build before the mark existed
    d = _json_doc(p)
    md = d.get("metadata") if isinstance(d, dict) else None
    return isinstance(md, dict) and (_marked(md.get("written_by")) or isinstance(md.get("build"), dict))


def _is_marked_json(p: Path) -> bool:
    d = _json_doc(p)
    return isinstance(d, dict) and _marked(d.get("written_by"))


def _is_audit(p: Path) -> bool:
    # audit --out: a list of per-policy, per-setting rows with a p-value (the format has no room for a mark)
    d = _json_doc(p)
    return isinstance(d, list) and bool(d) and all(isinstance(r, dict) and {"policy", "setting", "p_value"} <= r.keys()
                                                   for r in d)


def _is_image(p: Path) -> bool:
    try:
        with open(p, "rb") as f:
            head = f.read(1 << 16)
    except OSError:
        return False
    return f"{MARK} ".encode() in head


# kind -> how to tell that an existing file of that kind was written by dsparksim (register_kind adds one)
KINDS: dict[str, Callable[[Path], bool]] = {"profile": _is_profile, "json": _is_marked_json, "audit": _is_audit,
                                            "plot": _is_image}


def register_kind(kind: str, recognize: Callable[[Path], bool]) -> None:
    """Teach :func:`claim_out_file` a new kind of file: ``recognize(path)`` is True when that existing file is
    one dsparksim wrote (e.g. it carries ``written_by()``); it must never raise."""
    KINDS[kind] = recognize


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def claim_out_file(path: str | Path, kind: str, force: bool = False, option: str = "--out",
                   inputs: Sequence[str | Path | None] = ()) -> Path:
    """Check, before any work starts, that this command may write the one file ``path`` (the rule every command
    that writes a file follows; ConfigError naming ``option`` otherwise):

    * never a directory, and never one of ``inputs`` (the files this command reads; also through a link), not
      even with ``force``;
    * a new file: its folder exists and is writable, or can be created;
    * an existing file only when dsparksim wrote it, as recognised by ``kind`` (see ``KINDS``: "profile" reads
      ``metadata.written_by``, "json" a top-level ``written_by``, "plot" the image's Software/Creator text,
      "audit" the audit rows; :func:`register_kind` adds one), and only with ``force`` (the user's ``--force``:
      a rerun does not silently replace an earlier result); a file dsparksim did not write never, force or not.

    Write the file with :func:`atomic_write`, carrying ``written_by()`` (or
    ``image_metadata``), so that a rerun may replace it. Returns ``Path(path)``.
    """
    p = Path(path)
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; register it with register_kind")
    for src in inputs:
        if src is not None and (_same_file(p, Path(src)) or p.absolute() == Path(src).absolute()):
            raise ConfigError("cli", option, f"{str(p)!r} is also an input of this command ({src}); dsparksim "
                              "never overwrites its inputs, even with --force: choose another output file")
    if p.is_dir():
        raise ConfigError("cli", option, f"{str(p)!r} is a directory; expected the path of the file to write")
    if p.exists() or p.is_symlink():
        if not p.is_file():
            raise ConfigError("cli", option, f"{str(p)!r} exists and is not a regular file")
        if not KINDS[kind](p):
            raise ConfigError("cli", option, f"{str(p)!r} exists and dsparksim did not write it (it is not a {kind} "
                              "file dsparksim wrote): it is never replaced, even with --force; choose another path")
        if not force:
            raise ConfigError("cli", option, f"{str(p)!r} exists (a {kind} file dsparksim wrote); add --force to "
                              "replace it, or choose a new path")
        _check_writable(p.parent, option)
        return p
    _check_creatable(p, option)
    return p


def manifest_files(d: Path) -> set[str]:
    """The file names the result-set manifests (``*.manifest.json``) in ``d`` list as written by dsparksim: a name
    with a recorded sha256 only while the file still has it (a file edited or replaced since, e.g. a spec saved
    under that name, is the user's); a name of a pending manifest (an interrupted write) without one."""
    names: set[str] = set()
    for m in d.glob("*.manifest.json"):
        doc = _json_doc(m)
        if isinstance(doc, dict) and isinstance(doc.get("files"), dict) and (
                _marked(doc.get("written_by")) or "written" in doc):
            names.add(m.name)
            for n, e in doc["files"].items():
                sha = e.get("sha256") if isinstance(e, dict) else None
                if sha is None or not (d / str(n)).is_file() or _sha256(d / str(n)) == sha:
                    names.add(str(n))
    return names


def claim_result_set(out: str | Path, names: Sequence[str], manifest: str, option: str = "--out",
                     dirs: Sequence[str] = ("cells",)) -> Path:
    """Check, before any work starts, that the result set ``names`` (+ its ``manifest``) may be written into the
    folder ``out`` (``sweep``, ``capacity``, ``plan``): the folder is usable (see :func:`check_out_dir`), each of
    ``dirs`` (the cell cache) is a folder if it exists, and every one of those names that already exists there is
    listed by a dsparksim manifest in the folder, i.e. was written by dsparksim (a rerun updates its own set); a
    same-named file of the user's is refused, always. Returns ``Path(out)``."""
    p = check_out_dir(out, option, replace=False)
    if not p.is_dir():
        return p
    for name in dirs:
        if ((p / name).exists() or (p / name).is_symlink()) and not (p / name).is_dir():
            raise ConfigError("cli", option, f"{str(p / name)!r} is in the way of the cell cache (a folder) and is "
                              "not a folder; move it or choose a new or empty folder")
    ours = manifest_files(p)
    clash = [n for n in [*names, manifest] if (p / n).exists() and n not in ours]
    bad = [n for n in clash if not (p / n).is_file()]
    if bad:
        raise ConfigError("cli", option, f"{str(p / bad[0])!r} is in the way of a result file and is not a file")
    if clash:
        raise ConfigError("cli", option, f"{str(p)!r} holds {', '.join(clash[:5])}{', ...' if len(clash) > 5 else ''}, "
                          "which dsparksim did not write (no result manifest there lists them, or the file changed "
                          "since: its sha256 differs) and never replaces; choose a new or empty folder")
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


def _missing_dirs(d: Path) -> list[Path]:
    # the folders mkdir(parents=True) would create for d, outermost first
    missing = []
    while not (d.exists() or d.is_symlink()):
        missing.append(d)
        d = d.parent
    return missing[::-1]


def _remove(q: Path) -> None:
    if q.is_dir() and not q.is_symlink():
        shutil.rmtree(q)
    else:
        q.unlink(missing_ok=True)


def _new_aside(out: Path) -> Path:
    """Make and return the hidden sibling ``.OUT.previous-<pid>`` of ``out`` (``-2``, ``-3``, ... after it when
    that exists: a run killed between its renames left its earlier results there, their only copy, and this
    process may reuse its pid)."""
    base = out.resolve().parent / f".{out.resolve().name}.previous-{os.getpid()}"
    aside, i = base, 1
    while True:
        try:
            aside.mkdir()
            return aside
        except FileExistsError:
            i += 1
            aside = base.with_name(f"{base.name}-{i}")


@contextmanager
def previous_kept_on_error(out: str | Path, names: Sequence[str], keep: Sequence[Path] = ()) -> Iterator[Path]:
    """Write into the folder ``out`` in place (its files record their own paths, so no staging copy), as a unit.

    The entries ``names`` an earlier run left in ``out`` are first moved aside into the hidden sibling
    ``.OUT.previous-<pid>`` (a new one: ``-2`` etc. after it when it exists; an earlier run's files never stand
    beside the new ones). On success they are deleted;
    on any exception (Ctrl-C included) everything this run created in ``out`` is removed, they are moved back and
    folders this call created are removed again: a failed run leaves ``out`` as it found it. ``keep``: paths left
    where they are (an input of the command inside ``out``, e.g. ``validate --profile OUT/profile.json``)."""
    out = Path(out)
    made = _missing_dirs(out)
    out.mkdir(parents=True, exist_ok=True)
    kept = {Path(k).resolve() for k in keep}
    aside: Path | None = None
    moved: list[str] = []
    before: set[str] | None = None     # what OUT holds once the earlier run's entries are aside
    try:
        for n in names:
            q = out / n
            if (q.exists() or q.is_symlink()) and q.resolve() not in kept:
                aside = aside or _new_aside(out)
                os.rename(q, aside / n)
                moved.append(n)
        before = set(os.listdir(out))
        yield out
    except BaseException:
        for n in set(os.listdir(out)) - before if before is not None else ():
            _remove(out / n)
        for n in moved:
            os.replace(aside / n, out / n)
        if aside is not None:
            os.rmdir(aside)
        for d in reversed(made):
            try:
                os.rmdir(d)
            except OSError:     # not empty: someone else's files arrived meanwhile
                break
        raise
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


class WriteInterrupted(KeyboardInterrupt):
    """Ctrl-C while a result set was being replaced; the message names the folder and its incomplete manifest."""


def write_result_set(out: str | Path, files: Mapping[str, Callable[[Path], None]], manifest: str,
                     stale: tuple[str, ...] = (), status: Mapping[str, object] | None = None) -> dict[str, Path]:
    """Replace a set of result files in ``out`` as a unit: mark the manifest pending, write each file atomically, remove
    the ``stale`` names this set no longer has, then write the manifest (size + sha256 of every file) last.

    ``status``: what the set describes, recorded in the manifest; its ``complete`` (default True) says whether the
    work behind the files finished (a sweep with failed cells writes its files whole but is not complete)."""
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    # While the files are written the manifest is a pending one: it keeps every old and new name claimed (a rerun
    # after a kill may replace them) and, having no sha256, never reads as complete.
    old = _json_doc(d / manifest)
    claimed = {str(n): None for n in (old.get("files") or {})} if isinstance(old, dict) and isinstance(
        old.get("files"), dict) else {}
    pending = {"written_by": written_by(), "complete": False, "writing": True,
               "files": {**claimed, **{n: None for n in files}}}
    atomic_write(d / manifest, lambda p: p.write_text(json.dumps(pending, indent=1) + "\n"))
    paths, done = {}, 0
    try:
        for name, write in files.items():
            paths[name] = d / name
            atomic_write(d / name, write)
            done += 1
        for name in stale:
            if name not in files:
                (d / name).unlink(missing_ok=True)
        # hashing every file can take as long as writing them: the manifest is still the pending one until then
        entries = {name: {"bytes": p.stat().st_size, "sha256": _sha256(p)} for name, p in paths.items()}
    except KeyboardInterrupt as e:
        # Each file is whole (atomic), but the set may now mix this run's files and an earlier run's: say so, and
        # leave the pending manifest (complete: false) as the record.
        raise WriteInterrupted(f"while writing the result files in {str(d)!r}: {manifest} marks the set "
                               f"incomplete (complete: false; {done} of {len(files)} files replaced); "
                               "run the same command again to write it whole") from e
    doc = {"written_by": written_by(), "complete": True, **(status or {}),
           "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "files": entries}
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
