"""One way to solve a pulp MILP: HiGHS (highspy) by default, CBC as the fallback.

NOTE: [Honest status]
With a time limit both backends may stop early while pulp's `LpStatus` still reads
"Optimal" (seen with both: docs/measured-notes.md, "Capture probe").  We read pulp's
`sol_status` instead:
`LpSolutionOptimal` is a proven optimum (within the backend's default relative gap,
1e-4 for HiGHS), `LpSolutionIntegerFeasible` is the best solution found before the limit,
with the relative MIP gap HiGHS reports.  CBC through pulp does not report its bound, so
a time-limited CBC solution has an unknown gap (None).

NOTE: [Effort bound]
A time limit makes plans depend on the machine's load; without one, a hard block ILP
can run for minutes (a T5 block's RK-Checkmate ILP: 1,418 branch-and-bound nodes and
132 s to close a 1% gap it had at the root within 0.3%).  So every solve stops after
MAX_NODES branch-and-bound nodes (HiGHS `mip_max_nodes`, CBC `maxNodes`): a count, not
a time, so the same problem gives the same plan on any machine.  A solve stopped there
is FEASIBLE with the gap HiGHS proved (never called optimal), or NO_SOLUTION when no
incumbent was found, which the callers handle as they handle a time limit.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import time
from dataclasses import dataclass

import pulp

try:
    import highspy
except ImportError:  # CBC only: _HiGHS is never used
    highspy = None  # type: ignore[assignment]  # an optional dependency: None when not installed

OPTIMAL, FEASIBLE, INFEASIBLE, NO_SOLUTION = "optimal", "feasible", "infeasible", "no-solution"


@dataclass(frozen=True)
class MilpResult:
    """status: OPTIMAL, FEASIBLE (stopped at the time limit with a solution), INFEASIBLE or
    NO_SOLUTION (stopped before finding one).  gap: relative MIP gap (fraction) or None.
    seconds: wall time of the backend call.  backend: "HiGHS" or "CBC"."""

    status: str
    gap: float | None
    seconds: float
    backend: str

    @property
    def has_solution(self) -> bool:
        return self.status in (OPTIMAL, FEASIBLE)


def backend_versions() -> tuple[str, str, str]:
    """(preferred backend, pulp version, highspy version or ""): what a solution depends on
    besides the model (NOTE: [Solution cache] in remat_dsl.plan.cache)."""
    names = backend_names()
    highs = getattr(highspy, "__version__", "") if highspy is not None else ""
    if highspy is not None and not highs:
        from importlib.metadata import version

        highs = version("highspy")
    return (names[0] if names else "", pulp.__version__, highs)


def backend_names() -> list[str]:
    """Backends pulp can run here, preferred first."""
    available = set(pulp.listSolvers(onlyAvailable=True))
    return [name for name, key in (("HiGHS", "HiGHS"), ("CBC", "PULP_CBC_CMD")) if key in available]


REL_GAP = 0.01  # stop once the incumbent is proven within 1% of the optimum
MAX_NODES = 200  # branch-and-bound nodes per solve (NOTE: [Effort bound])
OPTIMAL_GAP = 1e-4  # what we call optimal (HiGHS's default mip_rel_gap)


def solve(problem: pulp.LpProblem, time_limit: float | None = None, rel_gap: float = REL_GAP, changed=None,
          max_nodes: int = MAX_NODES) -> MilpResult:  # fmt: skip
    """Solve `problem` in place (variable values are set when a solution exists).

    time_limit: seconds, or None for no limit.  rel_gap: the search stops once the best
    solution is proven within this relative gap; the result says "optimal" only when
    the proven gap is at most OPTIMAL_GAP, else "feasible" with the gap (deterministic:
    no time is involved unless time_limit is given).  max_nodes: branch-and-bound nodes
    after which the search stops with its incumbent (NOTE: [Effort bound]).  changed: None, or the constraints
    whose right-hand sides (`constant`) are the only change since the last solve of this
    problem (NOTE: [Model reuse]).  Raises RuntimeError when no MILP backend is available
    (install highspy, or pulp's bundled CBC).
    """
    names = backend_names()
    if not names:
        raise RuntimeError("no MILP backend: pip install highspy (or a pulp with its CBC binary)")
    start = time.perf_counter()
    if names[0] == "HiGHS":
        solver = _HiGHS(
            msg=False, timeLimit=time_limit, gapRel=rel_gap, threads=1, random_seed=0, mip_max_nodes=max_nodes
        )
        solver.changed = changed
        with _c_stdout_silenced():
            problem.solve(solver)
        info = problem.solverModel.getInfo()
        gap = max(0.0, float(info.mip_gap)) if info.mip_gap < 1e30 else None
    else:
        solver = pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit, gapRel=rel_gap, threads=1, maxNodes=max_nodes)
        problem.solve(solver)
        gap = None if problem.sol_status == pulp.LpSolutionIntegerFeasible else 0.0
    seconds = time.perf_counter() - start
    status = _status(problem.sol_status)
    if status == OPTIMAL and (gap is None or gap > OPTIMAL_GAP):
        status = FEASIBLE  # stopped at rel_gap, not proven optimal
    if status not in (OPTIMAL, FEASIBLE):
        gap = None
    return MilpResult(status, gap, seconds, names[0])


class _HiGHS(pulp.HiGHS):
    """pulp's HiGHS backend, keeping the HiGHS model of a problem between solves.

    NOTE: [Model reuse]
    A budget grid solves one model with other right-hand sides (section 2.6.0.0.1:
    `HILP.solve` changes two rows' bounds).  pulp rebuilds the HiGHS model at every solve
    and reads back every row's slack and dual; on DenseNet-121's 633 block ILPs that was
    41 s of 170.  When the caller says which constraints changed (and the problem has
    as many rows and columns as when it was built), only those rows' bounds are
    updated, the previous solve is cleared (`clearSolver`: no basis or incumbent carried
    over, so a solve gives what a fresh model gives) and only the variables' values are
    read back.  Any other call builds the model as pulp does."""

    changed = None

    def actualSolve(self, lp):  # noqa: N802 (pulp's name)
        shape = (len(lp._constraints), len(lp._variables))
        model = getattr(lp, "solverModel", None)
        if self.changed is not None and model is not None and getattr(lp, "_remat_shape", None) == shape:
            model.clearSolver()
            self._configure(model)
            inf = highspy.kHighsInf
            for constraint in self.changed:
                lb, ub = constraint.getLb(), constraint.getUb()
                model.changeRowBounds(constraint.index, -inf if lb is None else lb, inf if ub is None else ub)
        else:
            self.createAndConfigureSolver(lp)
            self.buildSolverModel(lp)
            lp._remat_shape = shape
            lp._remat_columns = lp.variables()
        self.callSolver(lp)
        status, sol_status = self._read_solution(lp)
        lp.assignStatus(status, sol_status)
        return status

    def _configure(self, model) -> None:
        model.setOptionValue("time_limit", float(self.timeLimit) if self.timeLimit is not None else highspy.kHighsInf)
        if self.gapRel is not None:
            model.setOptionValue("mip_rel_gap", self.gapRel)
        for key, value in self.optionsDict.items():
            model.setOptionValue(key, value)

    @staticmethod
    def _read_solution(lp) -> tuple[int, int]:
        """Variable values and pulp's (status, solution status) from the HiGHS model."""
        model = lp.solverModel
        status = model.getModelStatus()
        kind = highspy.HighsModelStatus
        values = list(model.getSolution().col_value)
        for var in lp._remat_columns:
            var.varValue = values[var.index] if values else None
        stopped = (
            kind.kTimeLimit,
            kind.kIterationLimit,
            kind.kSolutionLimit,
            kind.kInterrupt,
            kind.kObjectiveBound,
            kind.kObjectiveTarget,
        )
        if status == kind.kOptimal:
            return pulp.LpStatusOptimal, pulp.LpSolutionOptimal
        if status in (kind.kInfeasible, kind.kUnboundedOrInfeasible):
            return pulp.LpStatusInfeasible, pulp.LpSolutionInfeasible
        if status == kind.kUnbounded:
            return pulp.LpStatusUnbounded, pulp.LpSolutionUnbounded
        if status in stopped and values and model.getInfo().objective_function_value < highspy.kHighsInf:
            return pulp.LpStatusOptimal, pulp.LpSolutionIntegerFeasible
        return pulp.LpStatusNotSolved, pulp.LpSolutionNoSolutionFound


@contextlib.contextmanager
def _c_stdout_silenced():
    """HiGHS prints a banner on file descriptor 1 from C even with msg=False: send it to
    /dev/null, so a library call never writes on its caller's stdout."""
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError):
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        try:
            ctypes.CDLL(None).fflush(None)
        except (OSError, AttributeError):
            pass
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def _status(sol_status: int) -> str:
    if sol_status == pulp.LpSolutionOptimal:
        return OPTIMAL
    if sol_status == pulp.LpSolutionIntegerFeasible:
        return FEASIBLE
    if sol_status == pulp.LpSolutionInfeasible:
        return INFEASIBLE
    return NO_SOLUTION


def status_of(results) -> tuple[str, float | None]:
    """A plan's status over every MILP solve that made it: ("optimal", 0.0) when each
    proved its optimum, else ("feasible", the largest gap; None when a backend could not
    tell it); ("optimal", None) when there was no solve.  NOTE: [Honest status]."""
    feasible = [r for r in results if r.status == FEASIBLE]
    if not feasible:
        return OPTIMAL, 0.0 if results else None
    gaps = [r.gap for r in feasible]
    return FEASIBLE, None if None in gaps else max(gaps)
