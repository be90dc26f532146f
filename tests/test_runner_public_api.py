"""The real runner uses only the engine's public step contract (issue 10): no private attribute of the simulator's
engine, cluster or request-table objects, no subclass of them, no rewrite of the step log. A static (AST) check of
every module under dsparksim/runner/ and of the runner benchmark; it needs no torch."""
import ast
from pathlib import Path

import pytest

from dsparksim.sim.requests import RequestTable

REPO = Path(__file__).resolve().parents[1]
CORE = [REPO / "dsparksim" / "sim" / f for f in ("scheduler.py", "kv.py", "contract.py", "driver.py", "cluster.py",
                                                  "requests.py")]
RUNNER = sorted((REPO / "dsparksim" / "runner").glob("*.py")) + [REPO / "benchmarks" / "runner_overhead.py"]
CORE_CLASSES = {"Scheduler", "Simulation", "RequestTable", "CostExecutor", "Driver", "SimResult", "PagedKV",
                "ReserveKV"}
# The old private API the runner used to reach into (named so a regression is reported by name).
LEGACY = {"_issue", "_admit", "_finish", "_step", "_plan_step", "_apply_step", "_draw_block", "_accepted_prefix",
          "_execute", "_start", "_pull_arrivals", "_next_arrival", "_load", "_engine"}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def core_private_names() -> set[str]:
    """Private attributes and methods defined by the core modules (methods, class attributes, self._x = ...)."""
    names = set(LEGACY)
    for f in CORE:
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ClassDef):
                for b in node.body:
                    if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(b.name):
                        names.add(b.name)
                    if isinstance(b, (ast.Assign, ast.AnnAssign)):
                        for t in (b.targets if isinstance(b, ast.Assign) else [b.target]):
                            if isinstance(t, ast.Name) and _private(t.id):
                                names.add(t.id)
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _private(node.attr):
                names.add(node.attr)
    return names


def violations(source: str, core_names: set[str]) -> list[str]:
    """Private-API uses in ``source``: any ``obj._x`` on an object other than self/cls, a ``self._x`` that names
    a core private member (an override or use through a subclass), a class deriving from a core class, a write
    into an engine's step log (``....log[k][i] = ...``) or into a request-state array (``x.phase[rows] = ...``:
    request state changes only through Engine methods)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            owner = node.value.id if isinstance(node.value, ast.Name) else None
            if owner not in ("self", "cls"):
                out.append(f"line {node.lineno}: {ast.unparse(node)}")
            elif node.attr in core_names:
                out.append(f"line {node.lineno}: {ast.unparse(node)} (a private member of the engine/cluster)")
        if isinstance(node, ast.ClassDef):
            for b in node.bases:
                base = b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", None)
                if base in CORE_CLASSES:
                    out.append(f"line {node.lineno}: class {node.name}({base}) subclasses a core class")
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in LEGACY:
            out.append(f"line {node.lineno}: def {node.name} overrides the old private engine hook")
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                if not isinstance(t, ast.Subscript):
                    continue
                if {"log", "lg"} & set(ast.unparse(t.value).split("[")[0].split(".")):
                    out.append(f"line {node.lineno}: {ast.unparse(t)} = ... rewrites the step log")
                # (the runner's own objects may name a field alike: self.prompt is the executor's token dict)
                if (isinstance(t.value, ast.Attribute) and t.value.attr in RequestTable.GROWN
                        and not (isinstance(t.value.value, ast.Name) and t.value.value.id == "self")):
                    out.append(f"line {node.lineno}: {ast.unparse(t)} = ... writes request state directly")
    return out


@pytest.mark.parametrize("path", RUNNER, ids=lambda p: p.name)
def test_runner_uses_only_the_public_engine_api(path):
    assert violations(path.read_text(), core_private_names()) == []


def test_the_check_catches_the_old_runner():
    # The runner before the port (issue 10's architecture review), condensed: every pattern must be reported.
    old = '''
class RealEngine(Simulation):
    def _admit(self, now):
        super()._admit(now)
    def apply_once(self, plan):
        self._apply_step(1.0, 0.0, 0.1, plan)
        self.log["dt"][-1] = 0.2
def cell(eng):
    eng._issue(0, 0.0)
    eng._admit(0.0)
    eng.phase[0] = 3
'''
    v = violations(old, core_private_names())
    text = "\n".join(v)
    for needle in ("subclasses a core class", "def _admit", "self._apply_step", "self.log['dt'][-1] =",
                   "eng._issue", "eng._admit", "eng.phase[0] ="):
        assert needle in text, (needle, v)
    # ...and what the port does is clean
    new = '''
class RealStepper:
    def __init__(self, engine):
        self.engine = engine
        self._draft = None
    def end(self, plan, out, now):
        self.engine.apply(plan, out, now)
        self.engine.record(plan, out, now)
'''
    assert violations(new, core_private_names()) == []


# ---------------------------------------------------------------- the public additions the runner needs
import numpy as np  # noqa: E402

from dsparksim.sim.contract import CostExecutor, Prefilled  # noqa: E402
from dsparksim.sim.driver import Driver  # noqa: E402
from dsparksim.sim.requests import DECODE  # noqa: E402
from dsparksim.policies import make_policy  # noqa: E402
from sim_kit import FlatAcceptance, chat_workload, linear_profile, make_scheduler  # noqa: E402


class _PrefillsItself(CostExecutor):
    """A request-tracking executor that prefills the admitted requests itself, outside the loop, to ``contexts``
    (as measure's profiling cells do): it says so through the contract (``start`` returns :class:`Prefilled`)."""

    tracks_requests = True

    def __init__(self, contexts):
        self.contexts = np.asarray(contexts, np.int64)

    def start(self, new):
        return Prefilled(np.array([q.row for q in new], np.int64), self.contexts[:len(new)])

    def finish(self, rows):
        pass


def test_requests_prefilled_by_the_executor_decode_at_their_contexts():
    from dsparksim.sim.requests import RequestTable
    K = 3
    table = RequestTable(chat_workload(4, 3), 4, None)
    table.load(3)
    pol = make_policy("fixed:3")
    pol.reset(K, np.random.default_rng(0))
    eng = make_scheduler(table=table, profile=linear_profile(), acceptance=FlatAcceptance(K), policy=pol, K=K, drafter="dspark",
                         kv_capacity_tokens=10_000, max_num_seqs=3, max_batched_tokens=512, prefill_chunk_tokens=64,
                         rng=np.random.default_rng(0))
    for i in range(4):
        eng.inbox.put(i)
    ctx = np.array([5, 15, 25])
    drv = Driver(None, [eng], _PrefillsItself(ctx))
    rows = np.array(drv.admit(eng, 0.5))
    assert rows.tolist() == [0, 1, 2]                   # 3 slots: row 3 waits
    assert (table.phase[rows] == DECODE).all() and (table.prompt[rows] == ctx).all()
    assert (table.gen[rows] == 1).all() and (table.first_tok[rows] == 0.5).all()
    assert eng.kv.reserved == int((ctx + 20 + K).sum())   # the reservation follows the new prompt lengths
    (_, plan), = drv.schedule(0.5)
    assert plan.decode.tolist() == [0, 1, 2] and plan.n_prefill == 0 and plan.prefill == []
    assert plan.kv_read == 45 + 3 and plan.M == 3 * (1 + K)
    with pytest.raises(ValueError, match="running"):
        eng.apply_prefilled(Prefilled(np.array([3]), np.array([5])), 0.0)
    with pytest.raises(ValueError, match="not yet prefilled"):
        eng.apply_prefilled(Prefilled(rows, ctx), 0.5)    # only once


def test_the_runner_hands_prefills_done_outside_the_loop_through_the_contract():
    # the scheduler learns of them from Executor.start's Prefilled, applied by the Driver, never from the runner
    for path in RUNNER:
        names = {n.attr for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Attribute)}
        assert not names & {"apply_prefilled", "skip_prefill"}, path.name
