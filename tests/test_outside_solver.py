"""NOTE: [Outside solvers] (remat_dsl.solve.registry): a solver written outside the
repository plans a model from the command line, as `path/to/file.py:Class` or
`package.module:Class`, and its plan checks, generates and trains exactly; a plan whose
header names a solver that way makes nothing that reads it import anything."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

import remat_dsl
from remat_dsl.capture.model_file import load_model_file
from remat_dsl.codegen.compare import compare_training, load_generated
from remat_dsl.plan.parser import parse_file
from remat_dsl.plan.printer import print_plan

ROOT = Path(__file__).resolve().parent.parent
REMAT = Path(sys.executable).parent / "remat"
TINY = ROOT / "tests" / "models" / "tiny_mlp.py"

MY_SOLVER = '''
"""A solver outside the repository: the autograd order, every activation kept."""
from dataclasses import dataclass

from remat_dsl.solve.api import BudgetError, Problem, Solver, SolverInfo, SolverResult, Status, setting
from remat_dsl.solve.lowering import autograd_order, simulated_peak


@dataclass(frozen=True)
class MyConfig:
    """Nothing to tune but a label."""

    label: str = setting("store-all", "what the plan header says of the order")


class MySolver(Solver):
    name = "my-solver"
    info = SolverInfo(Status.HEURISTIC)
    Config = MyConfig

    def __init__(self, problem: Problem, config: MyConfig | None = None):
        self.config = config or MyConfig()
        self.order = autograd_order(problem.graph)
        self.peak = simulated_peak(problem.graph, self.order, problem.constraints, problem.device)

    def describe(self) -> str:
        return f"label={self.config.label}"

    def floor(self) -> int:
        return self.peak

    def solve(self, target: int) -> SolverResult:
        if target < self.peak:
            raise BudgetError(target, self.peak, self.name)
        return SolverResult(self.order, self.info)
'''

EVIL = '''
from pathlib import Path
Path(__file__).with_name("imported").write_text("the plan's solver was imported")
from remat_dsl.solve.api import Solver
class Evil(Solver):
    name = "evil"
'''


def _remat(args, cwd, pythonpath, check=True):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in pythonpath)}
    result = subprocess.run([str(REMAT), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.fixture
def outside(tmp_path):
    """A folder outside the repository holding mysolver.py."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "mysolver.py").write_text(MY_SOLVER)
    return folder


def test_an_outside_solver_plans_gpt2_as_users_type_it(outside, tmp_path):
    work, path = tmp_path / "work", [ROOT]
    work.mkdir()
    spec = f"{outside / 'mysolver.py'}:MySolver"
    _remat(
        ["plan", str(ROOT / "examples/gpt2.py"), "--budget", "100%", "--solver", spec, "-o", "gpt2.plan"], work, path
    )
    header = (work / "gpt2.plan").read_text()
    assert 'solver      "my-solver label=store-all' in header, header[:2000]
    _remat(["check", "gpt2.plan"], work, path)
    _remat(["codegen", "gpt2.plan", "-o", "fast_gpt2.py"], work, path)
    comparison = compare_training(
        load_model_file(str(ROOT / "examples/gpt2.py")), load_generated(work / "fast_gpt2.py"), steps=2
    )
    assert comparison.identical, comparison.mismatched[:10]
    # the same class as package.module:Class, from PYTHONPATH
    _remat(
        [
            "plan",
            str(ROOT / "examples/gpt2.py"),
            "--budget",
            "100%",
            "--solver",
            "mysolver:MySolver",
            "-o",
            "again.plan",
        ],
        work,
        [ROOT, outside],
    )
    assert (work / "again.plan").read_text() == header
    shown = _remat(["plan", "--solver", "mysolver:MySolver", "--help-solver"], work, [ROOT, outside])
    assert "solver my-solver: Nothing to tune" in shown.stdout and "label = 'store-all'" in shown.stdout


def test_the_python_api_takes_the_class(outside, monkeypatch):
    monkeypatch.syspath_prepend(str(outside))
    from mysolver import MySolver

    plan = remat_dsl.plan_model(str(TINY), budget="100%", solver=MySolver, repeats=1)
    assert plan.header.solver.startswith("my-solver label=store-all")


@pytest.mark.parametrize("named", ["evil.py:Evil", "evil:Evil", "os:system"])
def test_nothing_that_reads_a_plan_imports_the_solver_it_names(named, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "evil.py").write_text(EVIL)
    path = [ROOT, work]  # evil.py importable by file and by module name
    _remat(
        ["plan", str(TINY), "--budget", "100%", "--solver", "rotor", "--repeats", "1", "-o", "good.plan"], work, path
    )
    good = parse_file(str(work / "good.plan"))
    (work / "evil.plan").write_text(print_plan(replace(good, header=replace(good.header, solver=named))))
    _remat(["check", "evil.plan"], work, path)
    _remat(["codegen", "evil.plan", "-o", "fast.py"], work, path)
    _remat(["show", "evil.plan"], work, path)
    _remat(["diff", "good.plan", "evil.plan"], work, path, check=False)
    _remat(["fmt", "--check", "evil.plan"], work, path, check=False)
    _remat(
        ["plan", str(TINY), "--from", "evil.plan", "--solver", "rotor", "--repeats", "1", "-o", "again.plan"],
        work,
        path,
    )
    plan = remat_dsl.read_plan(work / "evil.plan")
    remat_dsl.check_plan(plan)
    remat_dsl.check_plan(work / "evil.plan")
    assert plan.header.solver == named
    assert not (work / "imported").exists()
    assert "evil" not in sys.modules
