"""Training text and held-out prompts for the three domains, from data available offline.

* code — the Python standard-library sources that ship with the interpreter (``sysconfig`` stdlib path; test
  packages and site-packages left out), split by file;
* math — the gsm8k and math500 questions (``prompts/*.jsonl``) plus templated arithmetic word problems with
  step-by-step solutions generated here (:func:`math_problem`);
* chat — the arena-hard-v2 and mt-bench prompts.

Every split (train / calib / eval) is disjoint by file or prompt and drawn with one seeded
``numpy.random.Generator``. Prompt files must hold one JSON object per line with a non-empty ``turns`` list of
strings; anything else raises :class:`~dsparksim.errors.InputError` naming the file, field and line.
"""
from __future__ import annotations

import json
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dsparksim.errors import InputError

EOT, USER, ASSISTANT = "<|endoftext|>", "<|user|>", "<|assistant|>"
SPECIAL = (EOT, USER, ASSISTANT)
DOMAINS = ("math", "code", "chat")
MATH_FILES = ("gsm8k.jsonl", "math500.jsonl")
CHAT_FILES = ("arena-hard-v2.jsonl", "mt-bench.jsonl")


def default_prompts_dir() -> Path:
    """``../shared/data/prompts`` next to the repository (where the project keeps its shared data)."""
    return Path(__file__).resolve().parents[3] / "shared" / "data" / "prompts"


def load_prompts(path: str | Path) -> list[list[str]]:
    """Read a prompts file: one ``{"turns": [str, ...]}`` per line (blank lines not allowed)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(path, None, "prompts file not found")
    out = []
    with open(path, encoding="utf-8") as fh:
        for i, line in enumerate(fh, 1):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(path, None, f"expected one JSON object per line: {e.msg}", line=i) from None
            if not isinstance(obj, dict) or "turns" not in obj:
                raise InputError(path, "turns", f"expected an object with a 'turns' list, got {str(obj)[:60]!r}",
                                 line=i)
            turns = obj["turns"]
            if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
                raise InputError(path, "turns", f"expected a non-empty list of non-empty strings, got "
                                 f"{str(turns)[:60]!r}", line=i)
            out.append(turns)
    if not out:
        raise InputError(path, None, "no prompts in file")
    return out


# ---- templated arithmetic with step-by-step solutions ------------------------------------------------------
_ITEMS = ["apples", "books", "marbles", "pencils", "cookies", "stickers", "coins", "cards", "eggs", "shells"]
_NAMES = ["Ava", "Ben", "Chen", "Dana", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Julia", "Kofi", "Lena"]


def math_problem(rng: np.random.Generator) -> tuple[str, str]:
    """One arithmetic word problem and its step-by-step solution ending in ``\\boxed{answer}``."""
    name, item = _NAMES[rng.integers(len(_NAMES))], _ITEMS[rng.integers(len(_ITEMS))]
    kind = int(rng.integers(5))
    if kind == 0:
        a, b, c = (int(x) for x in rng.integers([20, 1, 1], [200, 20, 60]))
        b = min(b, a - 1)
        q = (f"{name} has {a} {item}. {name} gives away {b} {item} and then gets {c} more. "
             f"How many {item} does {name} have now?")
        r1 = a - b
        s = [f"{name} starts with {a} {item}.", f"After giving away {b}: {a} - {b} = {r1}.",
             f"After getting {c} more: {r1} + {c} = {r1 + c}."]
        ans = r1 + c
    elif kind == 1:
        a, b = (int(x) for x in rng.integers([2, 2], [13, 30]))
        p = int(rng.integers(1, 10))
        q = (f"A box holds {b} {item}. {name} buys {a} boxes and each {item[:-1]} costs ${p}. "
             f"How much does {name} spend?")
        s = [f"Number of {item}: {a} * {b} = {a * b}.", f"Cost: {a * b} * {p} = {a * b * p}."]
        ans = a * b * p
    elif kind == 2:
        k, per = (int(x) for x in rng.integers([2, 2], [10, 25]))
        tot = k * per
        q = f"{name} shares {tot} {item} equally among {k} friends. How many {item} does each friend get?"
        s = [f"Each friend gets {tot} / {k} = {per}."]
        ans = per
    elif kind == 3:
        sp, h = (int(x) for x in rng.integers([20, 2], [90, 9]))
        extra = int(rng.integers(5, 60))
        q = (f"A train travels at {sp} km per hour for {h} hours and then {extra} km more. "
             "How far does it travel in total?")
        s = [f"Distance in {h} hours: {sp} * {h} = {sp * h} km.", f"Total: {sp * h} + {extra} = {sp * h + extra} km."]
        ans = sp * h + extra
    else:
        base = int(rng.integers(2, 40)) * 10
        pct = int(rng.choice([10, 20, 25, 50]))
        off = base * pct // 100
        q = f"A jacket costs ${base}. It is on sale for {pct}% off. What is the sale price?"
        s = [f"Discount: {pct}% of {base} = {base} * {pct} / 100 = {off}.",
             f"Sale price: {base} - {off} = {base - off}."]
        ans = base - off
    steps = "\n".join(f"Step {i + 1}: {x}" for i, x in enumerate(s))
    return q, f"{steps}\nThe answer is \\boxed{{{ans}}}."


def math_doc(q: str, a: str | None = None) -> str:
    return f"{USER}\n{q}\n{ASSISTANT}\n{a}{EOT}" if a is not None else f"{USER}\n{q}{EOT}"


def math_prompt(q: str) -> str:
    return f"{USER}\n{q}\n{ASSISTANT}\n"


# ---- corpus ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DataConfig:
    code_train_chars: int = 3_000_000
    templated_train: int = 8000
    eval_prompts: int = 96          # per domain
    calib_prompts: int = 64         # per domain
    seed: int = 1234


@dataclass
class Corpus:
    train: dict[str, list[str]]                 # domain -> documents
    prompts: dict[str, dict[str, list[str]]]    # split ("calib"/"eval") -> domain -> prompt texts
    sources: dict[str, str] = field(default_factory=dict)


def stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "test", "tests", "idle_test", "__pycache__", "lib2to3"}
    return sorted(p for p in root.rglob("*.py") if not (set(p.relative_to(root).parts[:-1]) & skip))


def _code_prompt(text: str, rng: np.random.Generator) -> str:
    lines = text.splitlines(keepends=True)
    start = int(rng.integers(0, max(1, len(lines) // 2)))
    return "".join(lines[start:start + 12])


def build_corpus(cfg: DataConfig, prompts_dir: str | Path | None = None) -> Corpus:
    """Documents per domain for training and held-out prompt texts (calib / eval) per domain."""
    rng = np.random.default_rng(cfg.seed)
    pdir = Path(prompts_dir) if prompts_dir is not None else default_prompts_dir()
    n_hold = cfg.eval_prompts + cfg.calib_prompts
    train: dict[str, list[str]] = {d: [] for d in DOMAINS}
    held: dict[str, list[str]] = {}

    # code: split files; held-out prompts are 12-line excerpts of held-out files
    files = stdlib_files()
    if len(files) < n_hold + 10:
        raise InputError(sysconfig.get_paths()["stdlib"], None, f"only {len(files)} stdlib .py files found")
    order = rng.permutation(len(files))
    texts = []
    for i in order:
        try:
            texts.append(files[i].read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            continue
    held_code = [t for t in texts[: n_hold * 2] if len(t) > 2000][:n_hold]
    held["code"] = [_code_prompt(t, rng) for t in held_code]
    chars = 0
    for t in texts[n_hold * 2:]:
        if chars >= cfg.code_train_chars:
            break
        train["code"].append(t + EOT)
        chars += len(t)

    # math: gsm8k / math500 questions + templated problems (solutions only for the templated ones)
    qs = []
    for f in MATH_FILES:
        qs += [t[0] for t in load_prompts(pdir / f)]
    perm = rng.permutation(len(qs))
    n_gsm_hold = n_hold // 2
    gsm = len(load_prompts(pdir / MATH_FILES[0]))
    held_q = [qs[i] for i in perm if i < gsm][:n_gsm_hold]          # held-out gsm8k questions
    held_set = set(held_q)
    train["math"] += [math_doc(qs[i]) for i in perm if qs[i] not in held_set]
    tmpl = [math_problem(rng) for _ in range(cfg.templated_train + (n_hold - n_gsm_hold))]
    train["math"] += [math_doc(q, a) for q, a in tmpl[: cfg.templated_train]]
    held_t = [q for q, _ in tmpl[cfg.templated_train:]]
    mixed = [x for pair in zip(held_q, held_t) for x in pair]
    held["math"] = [math_prompt(q) for q in mixed]

    # chat: arena-hard-v2 + mt-bench, split by prompt; held-out prompts are the opening of the first turn
    convs = []
    for f in CHAT_FILES:
        convs += load_prompts(pdir / f)
    perm = rng.permutation(len(convs))
    held["chat"] = [f"{USER}\n{convs[i][0][:400]}" for i in perm[:n_hold]]
    train["chat"] = ["".join(f"{USER}\n{t}\n" for t in convs[i]) + EOT for i in perm[n_hold:]]

    prompts = {"calib": {}, "eval": {}}
    for d in DOMAINS:
        if len(held[d]) < n_hold:
            raise InputError(pdir, d, f"need {n_hold} held-out {d} prompts, only {len(held[d])} available")
        prompts["eval"][d] = held[d][: cfg.eval_prompts]
        prompts["calib"][d] = held[d][cfg.eval_prompts: n_hold]
    return Corpus(train, prompts, {"stdlib": sysconfig.get_paths()["stdlib"], "prompts": str(pdir)})
