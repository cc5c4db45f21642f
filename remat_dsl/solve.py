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


def make_plan(graph: ir.Graph, *, model: str, device: str, budget: int, solver: str, bandwidth: int = DEFAULT_BANDWIDTH, progress=None) -> ir.Plan:
    """Solve, lower and simulate: a plan whose predicted peak is at most `budget`.

    Raises BudgetError (with the smallest feasible budget) when the solver cannot fit.
    """
    if solver not in SOLVERS:
        raise RematError(f"error: unknown solver '{solver}'", hint=f"choose one of: {', '.join(SOLVERS)}")
    if solver == "rotor":
        return _rotor_plan(graph, model, device, budget, bandwidth)
    solution = solve_autograd(graph, budget) if solver == "autograd" else solve_sqrt(graph, budget)
    plan = _lowered(graph, solution, model, device, budget, bandwidth)
    if plan.header.peak_bytes > budget:
        raise BudgetError(budget, plan.header.peak_bytes, solver)
    return plan


def _lowered(graph, solution: Solution, model, device, budget, bandwidth) -> ir.Plan:
    forward, backward = lower(graph, list(solution.order))
    header = ir.Header(model, device, budget, ir.BUDGET_COUNTS, solution.solver, solution.status, 0, "forward:1", 0, 0, 0, bandwidth)
    plan = ir.Plan(header, graph, forward, backward)
    return with_predictions(plan, simulate(plan))


def autograd_peak(graph: ir.Graph, device: str) -> int:
    """Simulated peak of the autograd plan (bytes): what a percentage budget refers to."""
    plan = _lowered(graph, solve_autograd(graph, 0), "", device, 0, DEFAULT_BANDWIDTH)
    return plan.header.peak_bytes


def _rotor_plan(graph, model, device, budget, bandwidth) -> ir.Plan:
    part = partition(graph)
    name = f"rotor slots={ROTOR_SLOTS} blocks={len(part.blocks)}"
    store_all = _lowered(graph, Solution(solve_autograd(graph, budget).order, name, "optimal"), model, device, budget, bandwidth)
    if store_all.header.peak_bytes <= budget:
        return store_all  # nothing recomputed: no plan can be faster
    floor = min_feasible_budget(part.chain, ROTOR_SLOTS)
    chain_budget, status = budget, "optimal"
    for _ in range(8):
        plan = _rotor_at(graph, part, max(chain_budget, floor), name, status, model, device, budget, bandwidth)
        excess = plan.header.peak_bytes - budget
        if excess <= 0:
            return plan
        if chain_budget <= floor:
            break
        chain_budget, status = chain_budget - max(excess, budget // 50), "feasible"
    best = min(_floor_plans(graph, part, floor, name, model, device, budget, bandwidth), key=lambda p: p.header.peak_bytes)
    if best.header.peak_bytes > budget:
        raise BudgetError(budget, best.header.peak_bytes, "rotor")
    return best


def _rotor_at(graph, part, chain_budget, name, status, model, device, budget, bandwidth) -> ir.Plan:
    schedule = solve_rotor(part.chain, chain_budget, ROTOR_SLOTS)
    return _lowered(graph, Solution(chain_order(part, schedule), name, status), model, device, budget, bandwidth)


FLOOR_SWEEP = (1.0, 1.05, 1.1, 1.2, 1.35, 1.5)


def _floor_plans(graph, part, floor, name, model, device, budget, bandwidth):
    """Plans at chain budgets a little above the chain's floor: the least-memory ones."""
    for factor in FLOOR_SWEEP:
        yield _rotor_at(graph, part, math.ceil(floor * factor), name, "feasible", model, device, budget, bandwidth)


def smallest_rotor_budget(graph: ir.Graph, device: str) -> int:
    """The least simulated peak (bytes) of rotor's plans near the chain's smallest budget:
    `make_plan(..., solver="rotor")` succeeds at any budget at or above it."""
    part = partition(graph)
    floor = min_feasible_budget(part.chain, ROTOR_SLOTS)
    plans = _floor_plans(graph, part, floor, "rotor", "", device, 0, DEFAULT_BANDWIDTH)
    return min(p.header.peak_bytes for p in plans)
