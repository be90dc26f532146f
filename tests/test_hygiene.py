"""Import hygiene of the dsparksim package, checked statically (AST only, nothing is imported).

Rules (issue 28, part 5):

1. **No import circles** among dsparksim's modules. An edge A -> B exists when module A imports module B:
   - module-level imports count, including those under ``if``/``try`` at module level;
   - function-local imports count too, *unless* the import line (or the comment line directly above it) carries
     a comment naming an optional/heavy-dependency reason: one of the words ``optional``, ``heavy``, ``torch``,
     ``ray``, ``matplotlib``, ``scipy``, ``pandas``, ``numba`` (e.g. ``# heavy: loads matplotlib``). Such a lazy
     import is what keeps start-up light, and it is the only kind allowed to point "upward";
   - imports under ``if TYPE_CHECKING:`` do not count (they never run);
   - ``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg``; ancestor packages
     (whose ``__init__`` also runs) are not edges, so a package may re-export its own modules.
2. **No private name crosses modules.** A name with one leading underscore (not a dunder) defined in one module may
   not be imported by another (``from dsparksim.x import _y``) nor read through a module object
   (``x._y`` where ``x`` is a dsparksim module bound by an import). A private *module* (``policies/_common.py``)
   may be imported by the modules of its own package only.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = "dsparksim"
EXEMPT = re.compile(r"#.*\b(optional|heavy|torch|ray|matplotlib|scipy|pandas|numba)\b", re.I)


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted((ROOT / PKG).rglob("*.py")):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def _is_pkg(mod: str) -> bool:
    return MODULES[mod].name == "__init__.py"


def _resolve(mod: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = mod.split(".") if _is_pkg(mod) else mod.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


class _Scan(ast.NodeVisitor):
    """Collects one module's import edges, cross-module private names and module aliases."""

    def __init__(self, mod: str, lines: list[str]):
        self.mod, self.lines = mod, lines
        self.edges: dict[str, int] = {}  # target module -> first line
        self.private: list[str] = []
        self.aliases: dict[str, str] = {}  # local name -> dsparksim module
        self.depth = 0

    def _exempt(self, node: ast.stmt) -> bool:
        if self.depth == 0:
            return False
        line = self.lines[node.lineno - 1]
        above = self.lines[node.lineno - 2].strip() if node.lineno >= 2 else ""
        return bool(EXEMPT.search(line)) or (above.startswith("#") and bool(EXEMPT.search(above)))

    def _edge(self, target: str, node: ast.stmt) -> None:
        if target in MODULES and target != self.mod and not self._exempt(node):
            self.edges.setdefault(target, node.lineno)

    def _private_module(self, target: str, node: ast.stmt) -> None:
        parts = target.split(".")
        for i, part in enumerate(parts):
            home = ".".join(parts[:i])
            if _is_private(part) and self.mod != home and not self.mod.startswith(home + "."):
                self.private.append(f"{self.mod}:{node.lineno} imports private module {target}")

    def visit_FunctionDef(self, node):
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_If(self, node: ast.If):
        if _type_checking(node.test):
            for n in node.orelse:
                self.visit(n)
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import):
        for a in node.names:
            if a.name == PKG or a.name.startswith(PKG + "."):
                self._edge(a.name, node)
                self._private_module(a.name, node)
                if a.asname:
                    self.aliases[a.asname] = a.name

    def visit_ImportFrom(self, node: ast.ImportFrom):
        src = _resolve(self.mod, node)
        if not (src == PKG or src.startswith(PKG + ".")):
            return
        self._private_module(src, node)
        for a in node.names:
            sub = f"{src}.{a.name}"
            if sub in MODULES:
                self._edge(sub, node)
                self._private_module(sub, node)
                self.aliases[a.asname or a.name] = sub
            else:
                self._edge(src, node)
                if _is_private(a.name) and src != self.mod:
                    self.private.append(f"{self.mod}:{node.lineno} imports {a.name} from {src}")

    def visit_Attribute(self, node: ast.Attribute):
        chain, cur = [node.attr], node.value
        while isinstance(cur, ast.Attribute):
            chain.append(cur.attr)
            cur = cur.value
        if isinstance(cur, ast.Name):
            chain.reverse()  # e.g. ["sim", "simulate", "_streams"] after the bound name
            target = self.aliases.get(cur.id) or (PKG if cur.id == PKG else None)
            for attr in chain if target else ():
                if f"{target}.{attr}" in MODULES:
                    target = f"{target}.{attr}"
                    continue
                if _is_private(attr) and target != self.mod:
                    self.private.append(f"{self.mod}:{node.lineno} reads {target}.{attr}")
                break
            return  # the inner Attribute nodes are the same chain
        self.generic_visit(node)


def _scan_all() -> dict[str, _Scan]:
    out = {}
    for mod, path in MODULES.items():
        text = path.read_text()
        s = _Scan(mod, text.splitlines())
        s.visit(ast.parse(text, filename=str(path)))
        out[mod] = s
    return out


SCANS = _scan_all()


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each listed with one loop through it."""
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return comps


def _loop(comp: list[str], graph: dict[str, dict[str, int]]) -> str:
    """One concrete loop inside a strongly connected component, with the importing line of each edge."""
    members, start = set(comp), comp[0]
    prev, frontier = {start: None}, [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w == start:
                    path, cur = [start], v
                    while cur is not None:
                        path.append(cur)
                        cur = prev[cur]
                    path.reverse()
                    return " -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(path, path[1:])) + f" -> {start}"
                if w in members and w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return ", ".join(comp)


def test_scanner_sees_the_package():
    """Guards against a silently empty scan (wrong root, renamed package)."""
    assert "dsparksim.sim.simulate" in MODULES and "dsparksim.results.outputs" in MODULES
    assert SCANS["dsparksim.cli.main"].edges, "cli.main imports nothing from dsparksim?"


def test_rules_catch_a_circle_and_a_private_import(tmp_path):
    """The detectors themselves: a synthetic two-module loop and a private import are both reported."""
    graph = {"a": {"b": 1}, "b": {"a": 3}, "c": {"a": 2}}
    assert _cycles(graph) == [["a", "b"]]
    assert _loop(["a", "b"], graph) == "a (line 1) -> b (line 3) -> a"
    src = ("from dsparksim.sim.simulate import _x\n"
           "import dsparksim.sim.streams as st\n"
           "def f():\n"
           "    from dsparksim.cli import main  # heavy: loads everything\n"
           "    from dsparksim.results import outputs\n"
           "    return st._seed, outputs\n")
    s = _Scan("dsparksim.fake", src.splitlines())
    s.visit(ast.parse(src))
    assert "dsparksim.cli.main" not in s.edges and "dsparksim.results.outputs" in s.edges
    assert any("_x" in p for p in s.private) and any("streams._seed" in p for p in s.private)


def test_no_import_circles():
    graph = {m: s.edges for m, s in SCANS.items()}
    loops = [_loop(c, graph) for c in _cycles(graph)]
    assert not loops, "import circles:\n  " + "\n  ".join(loops)


def test_no_private_name_crosses_modules():
    bad = sorted(p for s in SCANS.values() for p in s.private)
    assert not bad, "private names used across modules:\n  " + "\n  ".join(bad)


SHARED_FLAGS = ("--backend", "--workers", "--jobs", "--ray-address", "--seed", "--threads")


def test_shared_cli_options_are_declared_once():
    """--backend/--workers/--ray-address, --seed and --threads are added by dsparksim/cli/options.py only (the run
    options' --seed is RunConfig's field, declared through ``option()``, not ``add_argument``)."""
    where = []
    for mod, path in MODULES.items():
        if mod == "dsparksim.cli.options":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "add_argument"):
                flags = [a.value for a in node.args if isinstance(a, ast.Constant)]
                hit = sorted(set(flags) & set(SHARED_FLAGS))
                if hit:
                    where.append(f"{mod}:{node.lineno} declares {', '.join(hit)}")
    assert not where, "declare these through dsparksim.cli.options:\n  " + "\n  ".join(where)


def test_cli_backend_choices_are_the_sweep_backends():
    from dsparksim.cli.options import BACKENDS
    from dsparksim.sweep.backends import BACKENDS as SWEEP_BACKENDS

    assert BACKENDS == SWEEP_BACKENDS
