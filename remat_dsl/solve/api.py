"""The one solver interface.

A solver decides the ORDER in which operations run (the first run of a forward op is a
`compute`, any later one a `recompute`), and optionally which saved tensors go to the host
and back (`Transfer`); the driver (remat_dsl.solve.driver) lowers that
order into instructions (remat_dsl.solve.lowering, the one lowering), simulates it exactly
(remat_dsl.check.replay) and fits it to the budget.  Every solver subclasses `Solver`
(below), which gives the optional members their defaults; the driver reads them directly:

    name                    the registry name (`rotor`, `rockmate`, ...)
    auto_rank: int | None   the order in which `auto` asks (None: never)
    __init__(problem)       build what every budget shares (partitions, block ILPs, ...)
    describe() -> str       its settings for the plan header (`slots=500 blocks=9`)
    solve(target) -> SolverResult
                            an order whose peak, in the solver's own memory model, is at
                            most `target` bytes; raises BudgetError when none is
    floor() -> int          the smallest `target` solve() accepts (bytes)
    info -> SolverInfo      how its solves so far went (status, largest gap, seconds):
                            what the plan header records

and, with defaults in `Solver`:

    fallbacks() -> tuple    solvers to try, in order, when this one cannot meet a budget
                            (Rockmate falls back to rotor's finer blocks)
    fits(problem) -> bool   classmethod: `auto` may pick it for this graph
    optimizes: bool         default False; True when the solver minimizes time: the
                            driver then first tries the store-all order (no recompute, so
                            no plan is faster) and, when it fits, records it with
                            `info.status`
    Config                  a frozen dataclass of its tuning constants, each field with a
                            default and a one-line `help` in its metadata (`setting`);
                            `__init__(problem, config=None)` keeps `config or Config()` as
                            `self.config`; `remat plan --solver NAME --help-solver` prints
                            them (`config_help`).  None by default.

A new solver is one module with such a class and one line in remat_dsl.solve.registry.
Solvers are exchangeable and never return None: infeasibility is a BudgetError that
states the smallest budget (Checkmate's habit of returning None is what STYLE.md asks
us to avoid).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterable

from remat_dsl.plan import ir
from remat_dsl.plan.errors import RematError
from remat_dsl.plan.units import format_bytes

if TYPE_CHECKING:
    from remat_dsl.plan.cache import Cache
from remat_dsl.solve.lowering import DEFAULT_BANDWIDTH


class Status(str, enum.Enum):
    """What a plan's header says of the solve (NOTE: [Honest status] in remat_dsl.solve.solvers.ilp.milp)."""

    OPTIMAL = "optimal"  # proven optimal for the solver's model (MILP gap <= 0.01%)
    FEASIBLE = "feasible"  # a solution, not proven optimal (gap, time limit, budget correction)
    BASELINE = "baseline"  # autograd: what eager PyTorch does
    HEURISTIC = "heuristic"  # a rule, not an optimization (checkpoint-sqrt)


@dataclass(frozen=True)
class Problem:
    """What every solve of one plan shares: the FB-graph, its device, the user's
    constraints (remat_dsl.plan.constraints) and the time limit of each MILP (seconds).
    report: where solvers say what they are doing, one line per stage (`solving block
    class 2 of 4: ...`); the CLI prints them on stderr.  bandwidth, host_link and
    host_budget describe the host link for solvers that offload (offmate).  jobs: worker
    processes for a block's grid of ILPs (NOTE: [Parallel grid] in
    remat_dsl.solve.solvers.ilp.workers); plans do not depend on it."""

    graph: ir.Graph
    device: str
    constraints: tuple[ir.Constraint, ...] = ()
    time_limit: float | None = None
    report: Callable[[str], None] | None = field(default=None, compare=False)
    bandwidth: int = DEFAULT_BANDWIDTH  # host<->device bytes per second (offload, prefetch)
    host_link: bool = False  # the user gave --bandwidth, or a --device with a host link: offload may pay
    host_budget: int | None = None  # bytes of host memory offloaded copies may take; None: unlimited
    cache: Cache | None = field(default=None, compare=False)  # for block solutions
    jobs: int = field(
        default=1, compare=False
    )  # processes that may solve independent ILPs at once (NOTE: [Parallel grid])


@dataclass(frozen=True)
class SolverInfo:
    """How a solve went: its status, the largest relative MIP gap (a fraction, None when
    no MILP reported one) and the seconds spent in the solver."""

    status: Status
    gap: float | None = None
    seconds: float = 0.0


@dataclass(frozen=True)
class Decision:
    """A solver's decision for the ops starting at position `at` of its order, in words,
    for the plan's readers (`transformer.h.3.mlp: option 2 of 6, ...`)."""

    at: int
    text: str


@dataclass(frozen=True)
class Transfer:
    """A saved tensor a solver sends to the host and back (remat_dsl.solve.lowering,
    `add_transfers`).  Positions index the solver's order: `offload T` on d2h right
    after the op at `offload_after` runs (the one that makes T), `wait T` and `delete T`
    on the compute stream after the op at `wait_after` (so the copy overlaps the ops in
    between), `prefetch T` on h2d right before the op at `prefetch_before` (a backward
    op), and `wait T` right before T's first backward use."""

    tensor: str
    offload_after: int
    wait_after: int
    prefetch_before: int


@dataclass(frozen=True)
class SolverResult:
    """An op order (names; see the module docstring), how the solve went, the
    decisions to print above the instructions they explain, and the saved tensors to
    offload and prefetch (none for recompute-only solvers)."""

    order: tuple[str, ...]
    info: SolverInfo
    decisions: tuple[Decision, ...] = ()
    transfers: tuple[Transfer, ...] = ()


class BudgetError(RematError):
    """No plan of this solver fits the budget; `smallest` is the smallest budget that does
    (bytes), `solver` the solver's name, `reason` (optional) why no plan of any solver can,
    `bound` (optional) a proven lower bound on any plan's peak (bytes, why), as
    `driver.peak_lower_bound` gives it."""

    def __init__(
        self, budget: int, smallest: int, solver: str, reason: str | None = None, bound: tuple[int, str] | None = None
    ):
        self.budget, self.smallest, self.solver, self.bound = budget, smallest, solver, bound
        why = f" ({reason})" if reason else ""
        proof = ""
        if bound is not None and bound[0] >= smallest:
            proof = f", and no plan can peak lower ({bound[1]})"
        elif bound is not None:
            proof = (
                " for this solver; proven bound: no plan that keeps its tensors on the device peaks below"
                f" {format_bytes(bound[0])} ({bound[1]})"
            )
        super().__init__(
            f"error: budget {format_bytes(budget)} is infeasible for solver {solver}{why}: "
            f"the smallest feasible budget is {format_bytes(smallest)}{proof}",
            hint=f"plan with --budget {smallest}B or more" + ("" if reason else ", or choose another solver"),
        )


def setting(default, help: str):
    """A field of a solver's Config: its default and what it means, in one line (what
    `remat plan --help-solver` prints)."""
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class NoSettings:
    """A solver without tuning constants."""


class Solver:
    """The solver contract (the module docstring): every solver subclasses it, so that the
    driver reads each member directly; the optional members have their defaults here.

    Subclasses set `name` and `info` (a SolverInfo, a class attribute, an attribute set in
    `__init__(problem)` or a property) and define `solve(target)` and `floor()`; one with
    tuning constants defines a frozen dataclass `Config` of them (`setting` fields) and
    keeps its instance as `self.config`."""

    Config: ClassVar[type] = NoSettings
    name: str
    auto_rank: ClassVar[int | None] = None  # the order in which `auto` asks; None: never
    optimizes: ClassVar[bool] = False  # minimizes time: the driver tries store-all first
    cheap_targets: ClassVar[bool] = False  # another target costs little (NOTE: [Budget correction])
    info: SolverInfo

    if TYPE_CHECKING:  # what the driver calls; each solver writes its own

        def __init__(self, problem: Problem, config: object = None) -> None: ...

    def describe(self) -> str:
        """Its settings for the plan header (`slots=500 blocks=9`); none by default."""
        return ""

    def solve(self, target: int) -> SolverResult:
        """An order whose peak, in the solver's memory model, is at most `target` bytes.
        Raises BudgetError when none is."""
        raise NotImplementedError(f"{type(self).__name__}.solve")

    def floor(self) -> int:
        """The smallest target (bytes) `solve` accepts."""
        raise NotImplementedError(f"{type(self).__name__}.floor")

    @classmethod
    def fits(cls, problem: Problem) -> bool:
        """Whether `auto` may pick it for this problem's graph: any graph by default."""
        return True

    def fallbacks(self) -> Iterable["Solver"]:
        """Solvers to try, in order, when this one cannot meet a budget: none by default."""
        return ()

    def floor_targets(self) -> list[int]:
        """Targets at and a little above the floor whose plans the driver compares for the
        smallest budget: the floor times FLOOR_SWEEP by default."""
        return [math.ceil(self.floor() * factor) for factor in FLOOR_SWEEP]

    def solve_step(self, target: int, step: StepProblem) -> tuple[SolverResult, Any] | None:
        """The activations and the whole step's placement planned together at `target`
        bytes, the whole step's budget (NOTE: [Joint candidate] in remat_dsl.solve.driver):
        (the activations' SolverResult, the parameters' fractions as
        remat_dsl.solve.solvers.ilp.placement.Fractions), or None when the model has no
        solution, or, by default, when the solver plans activations only."""
        return None


@dataclass(frozen=True)
class StepProblem:
    """What `Solver.solve_step` plans beside the activations: graph, the FB-graph with its
    gradient lines (its parameters, which of them have a gradient); state_bytes /
    temp_bytes: the optimizer's state and one update's temporaries, bytes, for a parameter
    of n bytes; speeds: the device's and the host's update speeds (bytes of parameter per
    second) and the host's overhead per update (microseconds), thesis eq. 4.20 and 4.23."""

    graph: ir.Graph
    state_bytes: Callable[[int], int]
    temp_bytes: Callable[[int], int]
    speeds: tuple[int, int, int]


def say_phase(report, what: str) -> None:
    """Name the part of the solve under way (`partitioning the graph into blocks`) on a
    `report` that has phases, a remat_dsl.plan.progress.Progress (NOTE: [Progress] there);
    nothing on any other (a plain function of lines)."""
    phase = getattr(report, "phase", None)
    if phase is not None:
        phase(what)


def refuse_above(graph: ir.Graph, limit: int, solver: str, what: str, hint: str) -> None:
    """Raise RematError when a whole-graph solver (`what`: what it builds over every op)
    gets a graph of more than `limit` ops."""
    if len(graph.ops) > limit:
        raise RematError(
            f"error: the {solver} solver builds {what} over all {len(graph.ops)} ops; "
            f"it is meant for graphs of at most {limit} ops",
            hint=hint,
        )


FLOOR_SWEEP = (1.0, 1.05, 1.1, 1.2, 1.35, 1.5)


def fallbacks(solver: Solver):
    """The solver's fallbacks, an iterator (built as they are asked for; empty when none)."""
    return iter(solver.fallbacks())


def floor_targets(solver: Solver) -> list[int]:
    """`solver.floor_targets()`, or its floor when that gives none."""
    return solver.floor_targets() or [solver.floor()]


def config_help(cls: type[Solver]) -> str:
    """The lines `remat plan --solver NAME --help-solver` prints: the solver's name, then
    each field of its Config with its default and meaning (`slots = 500  memory slots ...`)."""
    rows = [(f.name, repr(f.default), f.metadata.get("help", "")) for f in fields(cls.Config)]
    lines = [f"solver {cls.name}: {(cls.Config.__doc__ or '').strip().splitlines()[0]}"]
    width = max((len(f"{name} = {default}") for name, default, _ in rows), default=0)
    lines += [f"  {f'{name} = {default}':<{width}}  {meaning}".rstrip() for name, default, meaning in rows]
    return "\n".join(lines) + "\n"


def header_name(solver) -> str:
    """`rotor slots=500 blocks=9`: the name and settings the plan header records."""
    return f"{solver.name} {solver.describe()}".strip()
