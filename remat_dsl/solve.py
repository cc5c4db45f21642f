"""Solvers behind one interface, and the path from a solver's decisions to a checked plan.

Every solver takes the FB-graph and a budget (bytes) and returns a `Solution`: the order in
which operations run.  `make_plan` lowers it (remat_dsl.lowering, the one lowering),
simulates it exactly (remat_dsl.simulate) and writes the predictions into the header.

NOTE: [Budget correction]
Rotor plans blocks with a chain model of memory (papers/rotor-*, section 3) that does not
see everything the exact simulation sees (the prelude's masks, parameter gradients piling
up during the backward, the discretization).  When the lowered plan's simulated peak is
above the budget, we solve again with the chain budget lowered by the excess, until it
fits or the chain's own smallest budget is reached.  The smallest feasible budget we
report is the simulated peak of the plan made at that smallest chain budget, so any budget
at or above it gets a plan.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable

from remat_dsl import ir
from remat_dsl.blocks import ChainPartition, partition
from remat_dsl.constraints import add_offloads, check_conflicts, constrain_order, constraint_lines
from remat_dsl.errors import RematError
from remat_dsl.lowering import lower
from remat_dsl.simulate import simulate, with_predictions
from remat_dsl.solvers.chain import ChainSchedule
from remat_dsl.solvers.rotor import min_feasible_budget, solve_rotor
from remat_dsl.solvers.sqrt import solve_checkpoint_sqrt

DEFAULT_BANDWIDTH = 12 * 10**9  # bytes/s, PCIe 4 x16 in practice
ROTOR_SLOTS = 500


@dataclass(frozen=True)
class Solution:
    """What a solver decided: the op order, its name and settings, and its status."""

    order: tuple[str, ...]
    solver: str
    status: str


class BudgetError(RematError):
    """No plan of this solver fits the budget; `smallest` is the smallest budget that does."""

    def __init__(self, budget: int, smallest: int, solver: str):
        self.budget, self.smallest = budget, smallest
        super().__init__(
            f"error: budget {format_bytes(budget)} is infeasible for solver {solver}: "
            f"the smallest feasible budget is {format_bytes(smallest)} ({smallest} bytes)",
            hint=f"plan with --budget {smallest} or more, or choose another solver",
        )


# --- budgets ----------------------------------------------------------------

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def parse_budget(text: str, autograd_peak: Callable[[], int]) -> int:
    """`1.5GiB`, `800 MB`, `123456` (bytes) or `50%` of the autograd peak -> bytes.

    Raises RematError on anything else.
    """
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*%\s*", text)
    if match:
        return math.floor(autograd_peak() * float(match.group(1)) / 100)
    return parse_bytes(text, "budget", "or a percentage of the autograd peak (50%)")


def parse_bytes(text: str, what: str = "size", also: str = "") -> int:
    """`1.5GiB`, `800 MB`, `12GB`, `65536` -> bytes.  Raises RematError on anything else."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise RematError(
            f"error: cannot read {what} '{text}'",
            hint=f"write bytes with a unit (1.5GiB, 800MB, 65536) {also}".strip(),
        )
    return math.floor(float(match.group(1)) * _UNITS[match.group(2).lower()])


def format_bytes(n: int) -> str:
    """Human-readable size for messages (not the plan's exact format)."""
    for unit, width in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= width:
            return f"{n / width:.2f} {unit}"
    return f"{n} B"


# --- solvers ----------------------------------------------------------------


def solve_autograd(graph: ir.Graph, budget: int) -> Solution:
    """What PyTorch does: every op once, in graph order, saving what autograd saves."""
    return Solution(tuple(op.name for op in graph.ops), "autograd", "baseline")


def chain_order(part: ChainPartition, schedule: ChainSchedule) -> tuple[str, ...]:
    """Op order for a chain schedule: the prelude, then each step's block ops."""
    order = list(part.prelude)
    for kind, block in schedule.ops:
        ops = part.blocks[block - 1]
        order += ops.backward if kind == "B" else ops.forward
    return tuple(order)


def solve_sqrt(graph: ir.Graph, budget: int) -> Solution:
    """Chen et al.'s sqrt(n) segments over the chain of blocks (checkpoint_sequential)."""
    part = partition(graph)
    schedule = solve_checkpoint_sqrt(part.chain)
    return Solution(chain_order(part, schedule), f"checkpoint-sqrt blocks={len(part.blocks)}", "heuristic")


SOLVERS = ("autograd", "checkpoint-sqrt", "rotor")


def make_plan(
    graph: ir.Graph,
    *,
    model: str,
    device: str,
    budget: int,
    solver: str,
    bandwidth: int = DEFAULT_BANDWIDTH,
    constraints: tuple[ir.Constraint, ...] = (),
    time_limit: float | None = None,
) -> ir.Plan:
    """Solve, lower and simulate: a plan whose predicted peak is at most `budget`.

    constraints: keep/recompute/offload/no-offload lines every solver honours
    (remat_dsl.constraints).  Raises BudgetError (with the smallest feasible budget) when
    the solver cannot fit, and RematError naming the lines when constraints conflict.
    """
    if solver not in SOLVERS:
        raise RematError(f"error: unknown solver '{solver}'", hint=f"choose one of: {', '.join(SOLVERS)}")
    check_conflicts(graph, constraints)
    context = _Context(graph, model, device, budget, bandwidth, constraints)
    try:
        if solver == "rotor":
            return _rotor_plan(context)
        solution = solve_autograd(graph, budget) if solver == "autograd" else solve_sqrt(graph, budget)
        plan = context.lowered(solution)
        if plan.header.peak_bytes > budget:
            raise BudgetError(budget, plan.header.peak_bytes, solver)
        return plan
    except BudgetError as error:
        if not any(c.kind != "budget" for c in constraints):
            raise
        budget_lines = [c.source for c in constraints if c.kind == "budget" and c.size == budget and c.source]
        where = f" ({budget_lines[-1]})" if budget_lines else ""
        raise RematError(
            f"error: the constraints at {constraint_lines(constraints)} and the budget {format_bytes(budget)}{where} "
            f"cannot all hold with solver {solver}: the smallest budget that satisfies them is "
            f"{format_bytes(error.smallest)} ({error.smallest} bytes)",
            hint=f"raise the budget to {error.smallest} bytes or more, or relax the keep/offload/recompute lines",
        ) from None


@dataclass(frozen=True)
class _Context:
    """What every lowering of one `make_plan` call shares."""

    graph: ir.Graph
    model: str
    device: str
    budget: int
    bandwidth: int
    constraints: tuple[ir.Constraint, ...]

    def lowered(self, solution: Solution) -> ir.Plan:
        order = constrain_order(self.graph, list(solution.order), self.constraints)
        forward, backward = add_offloads(self.graph, *lower(self.graph, order), self.constraints)
        h = ir.Header(self.model, self.device, self.budget, ir.BUDGET_COUNTS, solution.solver, solution.status, 0, "forward:1", 0, 0, 0, self.bandwidth)
        plan = ir.Plan(h, self.graph, forward, backward, constraints=self.constraints)
        return with_predictions(plan, simulate(plan))


def autograd_peak(graph: ir.Graph, device: str) -> int:
    """Simulated peak of the autograd plan (bytes): what a percentage budget refers to."""
    context = _Context(graph, "", device, 0, DEFAULT_BANDWIDTH, ())
    return context.lowered(solve_autograd(graph, 0)).header.peak_bytes


def _rotor_plan(context: _Context) -> ir.Plan:
    graph, budget = context.graph, context.budget
    part = partition(graph)
    name = f"rotor slots={ROTOR_SLOTS} blocks={len(part.blocks)}"
    store_all = context.lowered(Solution(solve_autograd(graph, budget).order, name, "optimal"))
    if store_all.header.peak_bytes <= budget:
        return store_all  # nothing recomputed: no plan can be faster
    floor = min_feasible_budget(part.chain, ROTOR_SLOTS)
    chain_budget, status = budget, "optimal"
    for _ in range(8):
        plan = _rotor_at(context, part, max(chain_budget, floor), name, status)
        excess = plan.header.peak_bytes - budget
        if excess <= 0:
            return plan
        if chain_budget <= floor:
            break
        chain_budget, status = chain_budget - max(excess, budget // 50), "feasible"
    best = min(_floor_plans(context, part, floor, name), key=lambda p: p.header.peak_bytes)
    if best.header.peak_bytes > budget:
        raise BudgetError(budget, best.header.peak_bytes, "rotor")
    return best


def _rotor_at(context: _Context, part, chain_budget: int, name: str, status: str) -> ir.Plan:
    schedule = solve_rotor(part.chain, chain_budget, ROTOR_SLOTS)
    return context.lowered(Solution(chain_order(part, schedule), name, status))


FLOOR_SWEEP = (1.0, 1.05, 1.1, 1.2, 1.35, 1.5)


def _floor_plans(context: _Context, part, floor: int, name: str):
    """Plans at chain budgets a little above the chain's floor: the least-memory ones."""
    for factor in FLOOR_SWEEP:
        yield _rotor_at(context, part, math.ceil(floor * factor), name, "feasible")


def smallest_rotor_budget(graph: ir.Graph, device: str, constraints: tuple[ir.Constraint, ...] = ()) -> int:
    """The least simulated peak (bytes) of rotor's plans near the chain's smallest budget:
    `make_plan(..., solver="rotor")` succeeds at any budget at or above it."""
    part = partition(graph)
    floor = min_feasible_budget(part.chain, ROTOR_SLOTS)
    context = _Context(graph, "", device, 0, DEFAULT_BANDWIDTH, constraints)
    return min(p.header.peak_bytes for p in _floor_plans(context, part, floor, "rotor"))
