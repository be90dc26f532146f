"""Function hygiene of the dsparksim package, checked statically (AST only, nothing is imported).

Rules (issue 28, part 5):

3. **A function-local import says why it is local.** Its line (or the comment line directly above it) carries a
   comment: a heavy or optional dependency kept off the import path (``# lazy: pandas``, ``# optional: ray``,
   ``# torch``), CLI start-up (``# lazy: numpy (CLI start-up)``), a circle it breaks. Anything else belongs at the
   top of the module.
4. **No function over 80 lines** (``end_lineno - lineno + 1``, docstring included), except argument tables (a CLI
   ``register`` that only declares options) and the functions listed in ``LONG`` with their length at the time the
   rule was introduced: each may shrink, never grow, and leaves the list once it fits (the test says so).
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "dsparksim"
MAX_LINES = 80

# argument tables: option declarations, one add_argument after another
ARGUMENT_TABLES = {"dsparksim/cli/runner.py:register"}

# functions over the limit when the rule came in (issue 28 part 5), with their length then: split them as their
# modules are next touched; a listed function may not grow
LONG: dict[str, int] = {}


def _qualnames():
    """(file:qualified name, node, lines) for every function, methods as Class.method."""
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(ROOT).as_posix()
        text = p.read_text()
        lines = text.splitlines()

        def walk(node, prefix):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    name = f"{prefix}{child.name}"
                    yield f"{rel}:{name}", child, lines
                    yield from walk(child, name + ".")
                elif isinstance(child, ast.ClassDef):
                    yield from walk(child, f"{prefix}{child.name}.")
                else:
                    yield from walk(child, prefix)

        yield from walk(ast.parse(text, filename=rel), "")


def test_function_local_imports_say_why():
    bare = []
    for key, fn, lines in _qualnames():
        for node in ast.walk(fn):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                first, last = lines[node.lineno - 1], lines[node.end_lineno - 1]
                above = lines[node.lineno - 2].strip() if node.lineno >= 2 else ""
                if "#" not in first and "#" not in last and not above.startswith("#"):
                    bare.append(f"{key}:{node.lineno}: {first.strip()}")
    assert not sorted(set(bare)), "function-local imports without a reason (move them to the top, or say why):\n" \
        + "\n".join(sorted(set(bare)))


def test_no_function_over_80_lines():
    too_long, grew, fits = [], [], []
    seen = set()
    for key, fn, _ in _qualnames():
        n = fn.end_lineno - fn.lineno + 1
        seen.add(key)
        if key in ARGUMENT_TABLES:
            continue
        if key in LONG:
            if n > LONG[key]:
                grew.append(f"{key}: {n} lines (was {LONG[key]})")
            elif n <= MAX_LINES:
                fits.append(f"{key}: {n} lines: delete it from LONG")
        elif n > MAX_LINES:
            too_long.append(f"{key}: {n} lines")
    gone = sorted(set(LONG) - seen)
    assert not too_long, f"functions over {MAX_LINES} lines:\n" + "\n".join(too_long)
    assert not grew, "listed long functions grew:\n" + "\n".join(grew)
    assert not fits and not gone, "LONG lists functions that fit or no longer exist:\n" + "\n".join(fits + gone)
