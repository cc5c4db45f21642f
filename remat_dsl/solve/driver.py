"""Solvers behind one interface, and the path from a solver's decisions to a checked plan.

Every solver takes the FB-graph and a budget (bytes) and returns a `Solution`: the order in
which operations run.  `make_plan` lowers it (remat_dsl.solve.lowering, the one lowering),
simulates it exactly (remat_dsl.check.replay) and writes the predictions into the header.

Solvers: autograd and checkpoint-sqrt (baselines), rotor and rockmate (chain dynamic
programs, `ChainStrategy`), hiremate and checkmate (H-ILP, `_ilp_plan`), and auto, which
picks one by graph structure and size (`choose_solver`).  Each plan header carries the
solver's name and settings, its status (optimal, or feasible with the MIP gap), and the
seconds spent (NOTE: [Honest status] in remat_dsl.solve.ilp.milp).

NOTE: [Budget correction]
Rotor plans blocks with a chain model of memory (papers/rotor-*, section 3) that does not
see everything the exact simulation sees (the prelude's masks, parameter gradients piling
up during the backward, the discretization).  When the lowered plan's simulated peak is
above the budget, we solve again with the chain budget lowered by the excess, until it
fits or the chain's own smallest budget is reached.  The smallest feasible budget we
report is the simulated peak of the plan made at that smallest chain budget, so any budget
at or above it gets a plan.  Rockmate and the H-ILP solvers (whose models also stop at
their blocks' or clusters' boundaries) go through the same loop.
"""

from __future__ import annotations

import functools
import math
import re
import time
from dataclasses import dataclass, replace
from typing import Callable

from remat_dsl.plan import ir
from remat_dsl.solve.chain.partition import ChainPartition, partition
from remat_dsl.plan.constraints import add_offloads, check_conflicts, constrain_order, constraint_lines
from remat_dsl.plan.errors import RematError
from remat_dsl.solve.lowering import lower
from remat_dsl.check.replay import simulate, with_predictions
from remat_dsl.solve.chain.model import ChainSchedule, InfeasibleBudget
from remat_dsl.solve.ilp import milp
from remat_dsl.solve.ilp.checkmate import op_hgraph
from remat_dsl.solve.ilp.hilp import HILP
from remat_dsl.solve.ilp.hiremate import Hierarchy, schedule_order
from remat_dsl.solve.chain.rk_rotor import min_feasible_budget as rk_min_feasible_budget
from remat_dsl.solve.chain.rk_rotor import try_rk_rotor
from remat_dsl.solve.ilp.rockmate import PEAK_STEPS, SAVE_STEPS, rockmate_chain
from remat_dsl.solve.ilp.rockmate import chain_order as rockmate_order
from remat_dsl.solve.chain.rotor import min_feasible_budget, solve_rotor
from remat_dsl.solve.chain.sqrt import solve_checkpoint_sqrt

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


SOLVERS = ("auto", "autograd", "checkpoint-sqrt", "rotor", "rockmate", "hiremate", "checkmate")


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
    (remat_dsl.plan.constraints).  Raises BudgetError (with the smallest feasible budget) when
    the solver cannot fit, and RematError naming the lines when constraints conflict.
    """
    if solver not in SOLVERS:
        raise RematError(f"error: unknown solver '{solver}'", hint=f"choose one of: {', '.join(SOLVERS)}")
    check_conflicts(graph, constraints)
    context = _Context(graph, model, device, budget, bandwidth, constraints)
    start = time.perf_counter()
    chosen = choose_solver(graph) if solver == "auto" else solver
    try:
        plan, gap = _solve(context, chosen, time_limit)
        name = f"auto: {plan.header.solver}" if solver == "auto" else plan.header.solver
        header = replace(plan.header, solver=name, gap=gap, solve_seconds=time.perf_counter() - start)
        return replace(plan, header=header)
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


def choose_solver(graph: ir.Graph) -> str:
    """The `auto` solver's choice, by graph structure and size:

    * checkmate, one exact ILP over all ops, for graphs of at most AUTO_CHECKMATE_OPS ops;
    * rockmate when the graph is a chain of small blocks: cut at the separators no skip
      tensor crosses, no block holds more than AUTO_CHAIN_SHARE of the forward ops nor
      more than AUTO_BLOCK_OPS of them (GPT-2, ResNet);
    * hiremate otherwise: skip tensors (encoder memory, U-Net skips) leave big blocks,
      and HiRemate's H-ILP plans with them.
    """
    if len(graph.ops) <= AUTO_CHECKMATE_OPS:
        return "checkmate"
    return "rockmate" if is_small_chain(graph) else "hiremate"


def is_small_chain(graph: ir.Graph) -> bool:
    """Cut at the separators no skip tensor crosses, no block holds more than
    AUTO_CHAIN_SHARE of the forward ops nor more than AUTO_BLOCK_OPS of them."""
    sizes = [len(b.forward) for b in partition(graph, refine=1).blocks]
    largest = max(sizes)
    return largest <= AUTO_CHAIN_SHARE * sum(sizes) and largest <= AUTO_BLOCK_OPS


AUTO_CHAIN_SHARE = 0.3
AUTO_BLOCK_OPS = 40
AUTO_CHECKMATE_OPS = 60


def _solve(context: _Context, solver: str, time_limit: float | None) -> tuple[ir.Plan, float | None]:
    """(plan, MIP gap or None) for one named solver."""
    graph, budget = context.graph, context.budget
    if solver == "rockmate" or (solver == "hiremate" and is_small_chain(graph)):
        return _first_fitting(context, rockmate_strategies(graph, time_limit, solver))
    if solver in STRATEGIES:
        strategy = STRATEGIES[solver](graph, time_limit)
        return _chain_plan(context, strategy), strategy.gap
    if solver in ILP_SOLVERS:
        ilp = ILP_SOLVERS[solver](graph, time_limit)
        plan = _ilp_plan(context, ilp)
        return plan, _milp_status(ilp.results)[1]
    solution = solve_autograd(graph, budget) if solver == "autograd" else solve_sqrt(graph, budget)
    plan = context.lowered(solution)
    if plan.header.peak_bytes > budget:
        raise BudgetError(budget, plan.header.peak_bytes, solver)
    return plan, None


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


@dataclass
class ChainStrategy:
    """A chain solver for the budget-correction loop (NOTE: [Budget correction]).

    order(chain_budget) -> op order whose chain-model peak is at most chain_budget, or
    None when none fits; floor_of() -> the smallest chain budget `order` accepts (bytes),
    computed once, when first needed.  name/status/gap/seconds go to the plan header.
    """

    name: str
    order: Callable[[int], tuple[str, ...] | None]
    floor_of: Callable[[], int]
    status: str = "optimal"
    gap: float | None = None
    seconds: float = 0.0

    @functools.cached_property
    def floor(self) -> int:
        return self.floor_of()


def rotor_strategy(graph: ir.Graph, time_limit: float | None = None) -> ChainStrategy:
    """Rotor (papers/rotor-*, Algorithms 3-4) over `blocks.partition`."""
    start = time.perf_counter()
    part = partition(graph)

    def order(chain_budget: int) -> tuple[str, ...] | None:
        try:
            return chain_order(part, solve_rotor(part.chain, chain_budget, ROTOR_SLOTS))
        except InfeasibleBudget:
            return None

    name = f"rotor slots={ROTOR_SLOTS} blocks={len(part.blocks)}"
    return ChainStrategy(name, order, lambda: min_feasible_budget(part.chain, ROTOR_SLOTS), seconds=time.perf_counter() - start)


def rockmate_strategy(graph: ir.Graph, time_limit: float | None = None, part: ChainPartition | None = None, label: str = "rockmate") -> ChainStrategy:
    """Rockmate (thesis chapter 2, Algorithm 3): RK-Checkmate options per block class on
    Rockmate's blocks (`partition(refine=1)`, cut where no skip tensor crosses when the
    graph is a chain of small blocks, else at every separator as rotor does), RK-Rotor
    over the chain."""
    start = time.perf_counter()
    part = part or partition(graph, refine=1, strict=is_small_chain(graph))
    rc = rockmate_chain(graph, part, _per_ilp_limit(time_limit, part))

    def order(chain_budget: int) -> tuple[str, ...] | None:
        schedule = try_rk_rotor(rc.chain, chain_budget, ROTOR_SLOTS)
        return None if schedule is None else rockmate_order(part, rc.options, schedule.ops)

    def floor() -> int:
        return rk_min_feasible_budget(rc.chain, ROTOR_SLOTS)

    options = sum(len(b.options) for b in rc.chain.blocks)
    name = f"{label} slots={ROTOR_SLOTS} blocks={len(part.blocks)} classes={rc.classes} ilps={rc.ilps} options={options}"
    status, gap = _milp_status(rc.results)
    return ChainStrategy(name, order, floor, status, gap, time.perf_counter() - start)


def rockmate_strategies(graph: ir.Graph, time_limit: float | None, solver: str = "rockmate"):
    """Rockmate on its own blocks, then on rotor's (finer, skip tensors crossing).

    NOTE: [Two partitions] Rockmate's blocks (`partition(refine=1)`) suit chains of
    repeated layers (a GPT-2 layer's attention and MLP).  On a graph with few such blocks
    (the ResNet cuts into 5) RK-Rotor has few places to checkpoint, and rotor's finer
    blocks reach lower budgets; RK-Rotor over rotor's blocks with their RK-Checkmate
    options can do everything rotor does there.  A budget the first cannot meet goes to
    the second, and the smallest feasible budget is the least of the two.
    """
    first = hiremate_chain_strategy(graph, time_limit) if solver == "hiremate" else STRATEGIES["rockmate"](graph, time_limit)
    yield first
    yield _rockmate_on_rotor_blocks(graph, time_limit, solver)  # built only when needed


@functools.lru_cache(maxsize=4)
def _rockmate_on_rotor_blocks(graph: ir.Graph, time_limit: float | None, solver: str) -> ChainStrategy:
    label = "hiremate levels=2 root=rk-rotor" if solver == "hiremate" else solver
    return rockmate_strategy(graph, time_limit, part=partition(graph), label=label)


def _first_fitting(context: _Context, strategies) -> tuple[ir.Plan, float | None]:
    smallest, name = [], ""
    for strategy in strategies:
        name = name or strategy.name.split()[0]
        try:
            return _chain_plan(context, strategy), strategy.gap
        except BudgetError as error:
            smallest.append(error.smallest)
    raise BudgetError(context.budget, min(smallest), name)


def hiremate_chain_strategy(graph: ir.Graph, time_limit: float | None = None) -> ChainStrategy:
    """HiRemate's H-Solver on a graph whose clusters form a chain.

    NOTE: [H-Solver on chains] HiRemate "includes not only H-ILP, but also other solvers,
    including CHECKMATE and ROTOR, to provide solutions when the target graph has a
    desirable structure" (thesis, chapter 1 and section 3.2.2).  When the clusters above
    the blocks form a chain (`is_small_chain`), the root level is solved by RK-Rotor,
    exact for persistent schedules of a chain, over the blocks' RK-Checkmate options: the
    same plan as rockmate.  Other graphs get the H-ILP hierarchy (remat_dsl.solve.ilp.hiremate).
    """
    strategy = STRATEGIES["rockmate"](graph, time_limit)
    name = strategy.name.replace("rockmate", "hiremate levels=2 root=rk-rotor", 1)
    return replace(strategy, name=name)


def _per_ilp_limit(time_limit: float | None, part) -> float | None:
    """A user's time limit (seconds) shared by the grid's ILPs of every block class."""
    if time_limit is None:
        return None
    return max(0.05, time_limit / max(1, len(part.blocks)) / (PEAK_STEPS * SAVE_STEPS))


def _milp_status(results) -> tuple[str, float | None]:
    """"optimal" when every MILP solve proved its optimum, else "feasible" with the
    largest gap (None when a backend could not tell it).  NOTE: [Honest status] in
    remat_dsl.solve.ilp.milp."""
    feasible = [r for r in results if r.status == milp.FEASIBLE]
    if not feasible:
        return "optimal", 0.0 if results else None
    gaps = [r.gap for r in feasible]
    return "feasible", None if None in gaps else max(gaps)


STRATEGIES = {"rotor": rotor_strategy, "rockmate": functools.lru_cache(maxsize=4)(rockmate_strategy)}


def _chain_plan(context: _Context, strategy: ChainStrategy) -> ir.Plan:
    graph, budget = context.graph, context.budget
    store_all = context.lowered(Solution(solve_autograd(graph, budget).order, strategy.name, strategy.status))
    if store_all.header.peak_bytes <= budget:
        return store_all  # nothing recomputed: no plan can be faster
    chain_budget, status = budget, strategy.status
    for _ in range(8):
        order = strategy.order(chain_budget)
        at_floor = order is None
        if at_floor:
            chain_budget = strategy.floor
            order = strategy.order(chain_budget)
        plan = context.lowered(Solution(order, strategy.name, status))
        excess = plan.header.peak_bytes - budget
        if excess <= 0:
            return plan
        if at_floor:
            break
        chain_budget, status = chain_budget - max(excess, budget // 50), "feasible"
    best = min(_floor_plans(context, strategy), key=lambda p: p.header.peak_bytes)
    if best.header.peak_bytes > budget:
        raise BudgetError(budget, best.header.peak_bytes, strategy.name.split()[0])
    return best


def _chain_at(context: _Context, strategy: ChainStrategy, chain_budget: int, status: str) -> ir.Plan:
    return context.lowered(Solution(strategy.order(chain_budget), strategy.name, status))


FLOOR_SWEEP = (1.0, 1.05, 1.1, 1.2, 1.35, 1.5)


def _floor_plans(context: _Context, strategy: ChainStrategy):
    """Plans at chain budgets a little above the chain's floor: the least-memory ones."""
    for factor in FLOOR_SWEEP:
        yield _chain_at(context, strategy, math.ceil(strategy.floor * factor), "feasible")


def smallest_budget(graph: ir.Graph, device: str, solver: str = "rotor", constraints: tuple[ir.Constraint, ...] = ()) -> int:
    """The least simulated peak (bytes) of a chain solver's plans near its chain's smallest
    budget: `make_plan(..., solver=solver)` succeeds at any budget at or above it."""
    context = _Context(graph, "", device, 0, DEFAULT_BANDWIDTH, constraints)
    if solver == "hiremate" and not is_small_chain(graph):
        return _ilp_floor(context, ILP_SOLVERS["hiremate"](graph, None))
    if solver in ("rockmate", "hiremate"):
        return min(p.header.peak_bytes for s in rockmate_strategies(graph, None, solver) for p in _floor_plans(context, s))
    if solver == "checkmate":
        return _ilp_floor(context, ILP_SOLVERS["checkmate"](graph, None))
    strategy = STRATEGIES[solver](graph, None)
    return min(p.header.peak_bytes for p in _floor_plans(context, strategy))


def smallest_rotor_budget(graph: ir.Graph, device: str, constraints: tuple[ir.Constraint, ...] = ()) -> int:
    """`smallest_budget` for rotor."""
    return smallest_budget(graph, device, "rotor", constraints)


class HiremateSolver:
    """HiRemate (remat_dsl.solve.ilp.hiremate): the hierarchy solved bottom-up once, then the
    root H-ILP at each peak budget asked (bytes)."""

    def __init__(self, graph: ir.Graph, time_limit: float | None = None):
        part = partition(graph, refine=1, strict=False)
        rc = rockmate_chain(graph, part, _per_ilp_limit(time_limit, part))
        self.hierarchy = Hierarchy(graph, part, rc, time_limit)
        self.results = self.hierarchy.results
        self.peaks: dict[int, int] = {}  # ILP budget -> simulated peak of its plan
        h = self.hierarchy
        self.name = (
            f"hiremate levels={h.levels} blocks={h.clusters} classes={rc.classes} "
            f"ilps={len(h.results)} top-nodes={len(h.top.nodes)}"
        )

    def order(self, peak: int) -> tuple[str, ...] | None:
        return self.hierarchy.order(peak)


class CheckmateSolver:
    """RK-Checkmate (thesis section 2.4) on the whole FB-graph: for small graphs only."""

    MAX_OPS = 160

    def __init__(self, graph: ir.Graph, time_limit: float | None = None):
        if len(graph.ops) > self.MAX_OPS:
            raise RematError(
                f"error: the checkmate solver builds one ILP over all {len(graph.ops)} ops; "
                f"it is meant for graphs of at most {self.MAX_OPS} ops",
                hint="use --solver rockmate or --solver hiremate (or auto), which solve small pieces",
            )
        start = time.perf_counter()
        forward = tuple(op.name for op in graph.ops if op.phase == ir.FORWARD)
        backward = tuple(op.name for op in graph.ops if op.phase == ir.BACKWARD)
        self.hg = op_hgraph(graph, forward, backward)
        self.model = HILP(self.hg)
        self.time_limit = time_limit
        self.results: list[milp.MilpResult] = []
        self.peaks: dict[int, int] = {}  # ILP budget -> simulated peak of its plan
        self.seconds = time.perf_counter() - start
        self.name = f"checkmate ops={len(graph.ops)}"

    def order(self, peak: int) -> tuple[str, ...] | None:
        start = time.perf_counter()
        schedule = self.model.solve(peak, None, self.time_limit)
        self.results.append(self.model.last_result)
        self.seconds += time.perf_counter() - start
        return None if schedule is None else schedule_order(self.hg, schedule)


# Built solvers are kept for the next budget on the same graph (a budget sweep solves the
# blocks' ILPs once); a graph is a frozen dataclass, so equal graphs share them.
ILP_SOLVERS = {"hiremate": functools.lru_cache(maxsize=2)(HiremateSolver), "checkmate": functools.lru_cache(maxsize=2)(CheckmateSolver)}


def _ilp_plan(context: _Context, solver) -> ir.Plan:
    """Solve the ILP at the budget; while the exact simulation finds the lowered plan over
    it, solve again with the ILP's budget lowered by the excess (NOTE: [Budget
    correction]); BudgetError with the smallest peak found when nothing fits."""
    graph, budget = context.graph, context.budget
    store_all = context.lowered(Solution(solve_autograd(graph, budget).order, solver.name, "optimal"))
    if store_all.header.peak_bytes <= budget:
        return store_all
    target, corrected = budget, False
    for _ in range(8):
        plan = _ilp_at(context, solver, target, corrected)
        if plan is None:
            break
        excess = plan.header.peak_bytes - budget
        if excess <= 0:
            return plan
        target, corrected = target - max(excess, budget // 50), True
    fitting = [t for t, peak in solver.peaks.items() if peak <= budget]  # from earlier calls
    if fitting:
        return _ilp_at(context, solver, max(fitting), True)
    raise BudgetError(budget, _ilp_floor(context, solver), solver.name.split()[0])


def _ilp_at(context: _Context, solver, target: int, corrected: bool) -> ir.Plan | None:
    """The lowered plan of the ILP solved at `target` bytes; records its simulated peak
    in `solver.peaks` so that a later budget can reuse a target known to fit."""
    order = solver.order(target)
    if order is None:
        return None
    status, _ = _milp_status(solver.results)
    plan = context.lowered(Solution(order, solver.name, "feasible" if corrected else status))
    solver.peaks[target] = plan.header.peak_bytes
    return plan


def _ilp_floor(context: _Context, solver, steps: int = 7) -> int:
    """The least simulated peak (bytes) found by bisection over the top H-ILP's budget."""
    lo, hi = 0, context.lowered(Solution(solve_autograd(context.graph, 0).order, "", "")).header.peak_bytes
    best = hi
    for _ in range(steps):
        mid = (lo + hi) // 2
        plan = _ilp_at(context, solver, mid, True)
        if plan is None:
            lo = mid
            continue
        best, hi = min(best, plan.header.peak_bytes), mid
    return best
