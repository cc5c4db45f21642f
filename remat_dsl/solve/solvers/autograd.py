"""The baseline: what eager PyTorch does, every op once, saving what autograd saves."""

from __future__ import annotations

import functools
from typing import ClassVar

from remat_dsl.solve.api import BudgetError, Problem, Solver, SolverInfo, SolverResult, Status
from remat_dsl.solve.lowering import autograd_order, simulated_peak


class FixedOrder(Solver):
    """A solver whose order does not depend on the budget (a baseline or a rule): it
    fits any budget at or above the exact peak of its plan, and no other."""

    name: str
    status: ClassVar[Status]
    auto_rank: ClassVar[int | None] = None
    optimizes: ClassVar[bool] = False  # no store-all shortcut: its plan is its plan

    def __init__(self, problem: Problem):
        self.problem = problem

    def steps(self) -> tuple[tuple[str, ...], tuple]:
        """(order, decisions): what the subclass runs, whatever the budget."""
        raise NotImplementedError

    def describe(self) -> str:
        return ""

    @functools.cached_property
    def _steps(self) -> tuple[tuple[str, ...], tuple]:
        return self.steps()

    @property
    def _order(self) -> tuple[str, ...]:
        return self._steps[0]

    def floor(self) -> int:
        """The exact peak of this solver's plan (bytes)."""
        return self._floor

    @functools.cached_property
    def _floor(self) -> int:
        p = self.problem
        return simulated_peak(p.graph, self._order, p.constraints, p.device)

    @property
    def info(self) -> SolverInfo:  # type: ignore[override]  # read-only: the driver only reads it
        return SolverInfo(self.status)

    def solve(self, target: int) -> SolverResult:
        if target < self.floor():
            raise BudgetError(target, self.floor(), self.name)
        return SolverResult(self._order, self.info, self._steps[1])


class Autograd(FixedOrder):
    """Every op once, in graph order: the plan eager PyTorch runs (status `baseline`)."""

    name = "autograd"
    status = Status.BASELINE

    def steps(self):
        return autograd_order(self.problem.graph), ()
