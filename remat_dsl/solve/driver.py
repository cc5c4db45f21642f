"""From a solver's decisions to a checked plan under a budget: `Planner` and `make_plan`.

A `Planner` holds one captured graph and what its solves share: the solvers it built
(remat_dsl.solve.registry), each built once, so a sweep over budgets solves the blocks'
ILPs once, and the targets tried so far.  `plan(budget, solver)` runs the one
budget-fitting loop; `smallest_budget(solver)` the one smallest-budget search.
`make_plan` is a Planner used once.

NOTE: [Budget correction]
A solver plans with its own model of memory (rotor's chain, section 3 of Beaumont et al.,
"Optimal checkpointing for heterogeneous chains", ACM TOMS 2024; Rockmate's blocks; the
H-ILP's clusters), which does not see everything the exact
simulation sees (the prelude's masks, the step's outputs, a block's
saved tensors freed during its own backward, the discretization, values crossing
clusters; the chain solvers do count the parameter gradients piling up during the
backward, NOTE: [Kept gradients] in remat_dsl.solve.solvers.chain.model).  So the driver lowers each order
(remat_dsl.solve.lowering) and simulates it exactly (remat_dsl.check.replay); when the
simulated peak is above the budget it asks again with the solver's target lowered by the
excess (at least 2% of the budget), at most MAX_ROUNDS times, jumping to the solver's
floor when the target falls below it.  A target that fitted an earlier budget is reused.
The simulation also sees what no solver's model does that lowers the peak, elementwise
outputs written into inputs that die there (NOTE: [In-place outputs] in
remat_dsl.plan.inplace): when the plan fits with room to spare (0.5% of the budget or
more) and the solver answers another target cheaply (`cheap_targets`: rotor's and
Rockmate's chain DP, whose blocks are solved once), the driver asks again with the
target raised by that room, at most RAISE_ROUNDS times, and keeps the fastest plan that
fits; the first that does not fit is a near miss to repair (below).  An exact solver
(checkmate, moccasin) keeps the plan it proved optimal for its own model.
When nothing fits, the plans at and a little above the floor (`api.floor_targets`) give
the smallest feasible budget the error states: any budget at or above it gets a plan.
Solvers that minimize time (`optimizes`) first get the store-all plan when it fits (status
optimal, no gap): no plan can be faster.  A solver's `fallbacks` (Rockmate on rotor's blocks) are tried in
order when it cannot meet the budget.

NOTE: [Polish and repair]
Each solver's plan is then improved by local moves on the exact simulation
(remat_dsl.solve.polish): the fitting plan is polished (recomputations dropped where
keeping the value fits), and the fastest plans the solver made a little above the budget
(at most REPAIR_REACH above, REPAIR_PLANS of them, only those faster than the best so far)
are repaired (recomputations added at the peak until it fits) and polished too; the
fastest of these is the plan.  Near misses count from every candidate tried (a solver
whose own model cannot meet the budget, then its fallbacks), but only once one of them
fits: a budget below the smallest feasible one (the floor plans') is still refused, so
every budget at or above it gets a plan and none below it does.  Near misses repaired
can be much faster than the plans that fit at first (NOTE: [Repair]; `python
bench/polish.py` measures it).

NOTE: [Budgets below the bound]
A budget below `peak_lower_bound` has no plan, whatever the solver: `remat plan` refuses it
right after the capture (`Planner.refuse_below_bound`), before any solve, which would take
long to find that out (several times the profile's time: docs/measured-notes.md).  The
refusal says the bound, why (the op whose inputs, outputs and temporaries make it, or the
gradients and outputs the step ends with) and the parameter gradients' bytes.  The
smallest budget a solver reaches is found only by solving (its floor plans), so every
refusal of `plan` and every `smallest_budget` stores it in the cache (kind SMALLEST_KIND),
keyed by what it depends on: the graph with its costs (its digest items,
remat_dsl.plan.digest), the device, the solver, the keep/recompute/offload lines, the
bandwidth, the host link and the host budget (and the cache's VERSION, in every key); a
solve under a time limit is not stored.  A later refusal below the bound names it.  The
cache only adds to the message: the refusal itself rests on the bound alone, and a stored
value below the bound is ignored.
"""

from __future__ import annotations

import functools
import time
from dataclasses import replace

from remat_dsl.check.replay import value_nbytes
from remat_dsl.plan import digest, ir
from remat_dsl.plan.ir import op_uses, pinned_tensors
from remat_dsl.plan.constraints import check_conflicts, constraint_lines
from remat_dsl.plan.errors import RematError
from remat_dsl.plan.inplace import inplace_candidates
from remat_dsl.plan.optimizer import Optimizer
from remat_dsl.plan.units import format_bytes
from remat_dsl.solve.api import (
    BudgetError,
    Problem,
    Solver,
    SolverInfo,
    SolverResult,
    Status,
    StepProblem,
    fallbacks,
    floor_targets,
    header_name,
    say_phase,
)
from remat_dsl.solve.lowering import (
    DEFAULT_BANDWIDTH,
    PREFETCH_LEAD,
    add_paged_states,
    add_parameter_streaming,
    add_updates,
    autograd_order,
    lowered_plan,
)
from remat_dsl.solve.polish import move_up, polish, repair
from remat_dsl.solve.registry import NAMES, solver_class, unknown_solver

MAX_ROUNDS = 8
RAISE_ROUNDS = 3  # targets raised by the room a fitting plan leaves (NOTE: [Budget correction])
REPAIR_REACH = 0.15  # near misses repaired: simulated peaks at most 15% above the budget (NOTE: [Polish and repair])
REPAIR_PLANS = 3  # the fastest near misses repaired, per solver
SMALLEST_KIND = "smallest"  # cache entries: a solver's smallest feasible budget (NOTE: [Budgets below the bound])


def _placed_step(
    activations: ir.Plan, optimizer: Optimizer, speeds: tuple[int, int, int], budget: int, on_host, streamed,
    paged, lead: int, lag: int,
) -> ir.Plan:  # fmt: skip
    """NOTE: [Optimizer placement]: the whole step's plan of `activations` (the solver's
    instructions, the graph with its gradient lines): the updates of `on_host` on the host
    (their gradients waited for `lag` ops late), the others on the device; `streamed` kept in
    host memory and prefetched `lead` ops ahead; the states of `paged` (a sequence) paged
    `lead` ops ahead; its header's budget `budget` bytes."""
    plan = add_updates(activations, optimizer.text(), on_host, speeds, lag)
    plan = add_parameter_streaming(plan, streamed, lead)
    if paged:
        plan = add_paged_states(plan, paged, lead)
    return replace(plan, header=replace(plan.header, budget=budget))


class Planner:
    """Plans for one FB-graph (see the module docstring).

    model: the model spec for plan headers; device: `cpu` or `cuda` (RNG state sizes);
    bandwidth: host<->device bytes per second; host_link: the user gave a bandwidth or a
    device with a host link (`auto` then considers offloading, remat_dsl.solve.solvers.auto);
    host_budget: bytes of host memory for offloaded copies (None: unlimited);
    constraints: keep/recompute/offload lines every solver honours
    (remat_dsl.plan.constraints); time_limit: seconds per MILP; jobs: worker processes
    that may solve a block's grid of ILPs at once (NOTE: [Parallel grid] in
    remat_dsl.solve.solvers.ilp.workers: the plan does not depend on it; the workers are spawned,
    so a script that passes jobs > 1 runs its own code under `if __name__ == "__main__":`,
    and it calls `workers.stop()` when it is done planning).
    Raises RematError naming the lines when two constraints conflict.
    """

    def __init__(self, graph: ir.Graph, *, model: str = "", device: str = "cpu", bandwidth: int = DEFAULT_BANDWIDTH,
                 constraints: tuple[ir.Constraint, ...] = (), time_limit: float | None = None, report=None,
                 host_link: bool = False, host_budget: int | None = None, cache=None, jobs: int = 1):  # fmt: skip
        check_conflicts(graph, constraints)
        self.problem = Problem(
            graph, device, tuple(constraints), time_limit, report, bandwidth, host_link, host_budget, cache, jobs
        )
        self.model, self.bandwidth = model, bandwidth
        self._solvers: dict[str | type[Solver], Solver] = {}
        self._fallbacks: dict[object, list] = {}
        self._tried: dict[object, dict[int, int]] = {}  # solver -> {target: simulated peak}

    # --- solvers ------------------------------------------------------------

    def chosen(self, name: str | type[Solver]) -> str | type[Solver]:
        """`name` (a registry name), or for `auto` the solver it picks
        (remat_dsl.solve.solvers.auto); an outside solver's class as it is (NOTE: [Outside
        solvers] in remat_dsl.solve.registry: a string is never imported here).  Raises
        RematError for an unknown name or a class that does not subclass Solver."""
        if isinstance(name, type):
            if not issubclass(name, Solver):
                raise RematError(f"error: solver {name.__name__} is not a subclass of remat_dsl.solve.api.Solver")
            return name
        if name not in NAMES:
            raise unknown_solver(name)
        if name != "auto":
            return name
        from remat_dsl.solve.solvers.auto import choose

        return choose(self.problem)

    @staticmethod
    def _class(name: str | type[Solver]) -> type[Solver]:
        """The class of a chosen solver: registered by `name`, or the class itself."""
        return name if isinstance(name, type) else solver_class(name)

    @staticmethod
    def _label(name: str | type[Solver]) -> str:
        """What messages call the solver: its registry name, or an outside class's `name`."""
        return name.name if isinstance(name, type) else name

    def solver(self, name: str | type[Solver]) -> Solver:
        """The solver registered as `name` (not `auto`), or of the outside class `name`,
        built once for this graph."""
        if name not in self._solvers:
            self._solvers[name] = self._class(name)(self.problem)
        return self._solvers[name]

    def _candidates(self, solver: Solver):
        """The solver, then its fallbacks (built when first reached, kept)."""
        yield solver
        if solver not in self._fallbacks:
            self._fallbacks[solver] = list(fallbacks(solver))
        yield from self._fallbacks[solver]

    # --- plans --------------------------------------------------------------

    @functools.cached_property
    def autograd_peak(self) -> int:
        """Simulated peak of the autograd plan (bytes), every output a new allocation as
        eager PyTorch makes it (NOTE: [In-place outputs] in remat_dsl.plan.inplace): what a
        percentage budget refers to."""
        graph, device = self.problem.graph, self.problem.device
        return lowered_plan(graph, autograd_order(graph), device=device, inplace=False).header.peak_bytes

    @functools.cached_property
    def gradient_bytes(self) -> int:
        """Bytes of the parameter gradients the step returns: all of them are live at its end,
        so no budget below this has a plan."""
        graph = self.problem.graph
        with_gradient = {g.parameter for g in graph.gradients if g.value is not None}
        return sum(value_nbytes(p) for p in graph.parameters if p.name in with_gradient)

    @functools.cached_property
    def peak_lower_bound(self) -> tuple[int, str]:
        """`peak_lower_bound` of the graph: (bytes, why)."""
        return peak_lower_bound(self.problem.graph)

    def plan(self, budget: int, solver: str | type[Solver] = "auto") -> ir.Plan:
        """A plan whose simulated peak is at most `budget` bytes, by `solver` (a registry
        name, `auto`, or an outside Solver subclass).  Its header records the solver and its settings, the status, the
        MIP gap and the seconds spent.  Raises BudgetError with the smallest feasible
        budget, or RematError naming the constraint lines when they are what cannot hold."""
        start = time.perf_counter()
        name = self.chosen(solver)
        if name not in self._solvers and self._class(name).optimizes:
            plan = self._store_all_if_it_fits(name, budget)
            if plan is not None:  # no plan is faster: the solver's ILPs need not be built
                label = f"auto: {plan.header.solver}" if solver == "auto" else plan.header.solver
                return replace(
                    plan, header=replace(plan.header, solver=label, gap=None, solve_seconds=time.perf_counter() - start)
                )
        try:
            plan, info = self._first_fitting(self.solver(name), budget)
        except BudgetError as error:
            smallest = self._or_store_all(name, error.smallest)
            self._remember_smallest(name, smallest)
            gradients, reason = self.gradient_bytes, None
            if budget < gradients:  # no schedule of any solver: the step ends holding them all
                reason = f"the parameter gradients alone take {format_bytes(gradients)}, and the budget counts them"
            error = BudgetError(error.budget, smallest, error.solver, reason, self.peak_lower_bound)
            raise self._constraints_error(error, budget, self._label(solver)) from None
        label = f"auto: {plan.header.solver}" if solver == "auto" else plan.header.solver
        header = replace(plan.header, solver=label, gap=info.gap, solve_seconds=time.perf_counter() - start)
        return replace(plan, header=header)

    # NOTE: [Optimizer placement]
    # With the optimizer in the step (NOTE: [Optimizer in the step] in remat_dsl.plan.optimizer)
    # each trainable parameter is updated on the device (its states held there through the
    # step) or on the host (its gradient offloaded, its states and an fp32 copy in host memory,
    # the update on the host's stream).  `plan_step` tries host sets of growing size, the
    # largest parameters first (their states are the most device memory one decision frees):
    # none, then the parameters that hold a quarter, half, three quarters and all of the
    # states; then, every update on the host, the parameters themselves kept in host memory
    # and prefetched where they are read (NOTE: [Parameters on the host] in
    # remat_dsl.check.replay), the largest first, a quarter, half and three quarters of their bytes.
    # For each, the activations are planned by the solver under the budget less what the
    # device holds besides (its parameters and optimizer states, the two largest prefetched
    # parameters, the largest update's temporaries), the updates placed and the parameters
    # streamed (lowering's `add_updates`, `add_parameter_streaming`, `add_paged_states`) and
    # the whole plan simulated; it must fit the budget and the host budget.  Each host set is
    # tried twice: the device updates with their states held through the step, and with their
    # states paged (NOTE: [Paged optimizer states] in
    # remat_dsl.plan.optimizer: held in host memory, prefetched before the update and offloaded
    # after it, thesis eq. 4.10's PrfO/OflO; their copies are timed on the h2d and d2h streams
    # as eq. 4.21-4.22 time them).  Among these plans the fastest that fits (the replay's
    # predicted time) is kept: paging moves 2 x the states over the link per step where a host
    # update moves the gradient and the parameter and runs at the host's speed (eq. 4.23), so
    # which is faster depends on the link, the host and the model.  Parameter streaming is
    # tried only when none of them fits.  It is a heuristic: the thesis' O-ILP (ch. 4, eq.
    # 4.1-4.23) chooses these fractions, per parameter and per block, in one ILP with the schedule;
    # its placement part, for the activation plans found here, is one more candidate (NOTE:
    # [Placement candidate]), and on a chain of small blocks the joint model is another (NOTE:
    # [Joint candidate]).
    # Beside streaming with every update on the host, `plan_step` tries streamed parameters
    # updated on the device (STREAM_SHARES of the parameters' bytes, the largest first), their
    # states paged and each written back to its host copy after its update (NOTE: [Parameters on
    # the host] in remat_dsl.check.replay; thesis eq. 4.10, 4.21-4.22: PrfO/OflO of the states and
    # the offload of a parameter updated on the GPU), with MIXED_HOST_SHARES of the states'
    # bytes updated on the host instead: the parameters whose gradients are complete first, so
    # that the host's updates (eq. 4.23) run while the rest of the backward does.  On a slow
    # host (the RTX 3060's machine updates 1.1 GB/s) the link then carries the step's parameters
    # and most states, each way, where the host would update them all.  Their activations are
    # planned for one budget per streamed share (the held memory counted for the largest states
    # and updates), and each is lowered with its copies LEADS ops ahead of their use (and the
    # waits for the write-backs, the states' offloads and the host updates' gradients as many
    # ops after): with the link the bottleneck, a copy issued a few ops ahead leaves it idle
    # while the compute stream waits for another, so a longer lead is faster where memory allows.
    HOST_SHARES = (0.0, 0.25, 0.5, 0.75, 1.0)
    STREAM_SHARES = (0.75, 0.95)
    MIXED_HOST_SHARES = (0.0, 0.25)
    LEADS = (PREFETCH_LEAD, 8, 16, 32, 64)  # ops between each copy and the instruction it serves

    def plan_step(
        self, budget: int, optimizer: Optimizer, speeds: tuple[int, int, int], solver: str | type[Solver] = "auto"
    ) -> ir.Plan:
        """The whole step's plan (NOTE: [Optimizer placement]) with peak at most `budget`
        bytes, counting the device's optimizer states and updates.  speeds: the device's and
        the host's update speed (bytes of parameter per second) and the host's overhead per
        update (microseconds).  Raises BudgetError when no host set fits."""
        from remat_dsl.check.replay import simulate, with_predictions

        graph = self.problem.graph
        # the activations are planned for the graph without its gradient lines: a gradient is
        # then freed after its last read, as the update frees it, where the solvers would
        # otherwise hold every gradient to the end of the step
        problem = self.problem
        activations = Planner(
            replace(graph, gradients=()), model=self.model, device=problem.device, bandwidth=self.bandwidth,
            constraints=problem.constraints, time_limit=problem.time_limit, report=problem.report,
            host_link=problem.host_link, host_budget=problem.host_budget, cache=problem.cache, jobs=problem.jobs,
        )  # fmt: skip
        sizes = {p.name: value_nbytes(p) for p in graph.parameters}
        by_size = sorted(sizes, key=lambda name: (-sizes[name], name))
        trainable = [p for p in by_size if p in {g.parameter for g in graph.gradients if g.value is not None}]
        total_states = sum(optimizer.state_bytes(sizes[p]) for p in trainable)
        total_params = sum(sizes.values())
        cpu = self.problem.device == "cpu"
        tried, smallest = set(), None
        host_error: RematError | None = None  # the last plan that fit the budget but not the host budget
        best: tuple[int, ir.Plan] | None = None  # (predicted time in us, the simulated plan)
        solved: dict[int, ir.Plan] = {}  # activation budget -> the solver's plan (shared by attempts)
        # the smallest parameters stay on the device: the generated module finds its device by them
        attempts = [(share, 0.0, paged, False) for share in self.HOST_SHARES for paged in (False, True)]
        streaming = [(1.0, share, False, False) for share in self.HOST_SHARES[1:-1]]
        streaming += [(share, part, True, True) for part in self.STREAM_SHARES for share in self.MIXED_HOST_SHARES]
        completed = _by_gradient_completion(graph, trainable)
        for number, (state_share, param_share, paged, mixed) in enumerate(attempts + streaming):
            if number == len(attempts) and best is not None:
                break  # a plan without parameter streaming fits: the fastest of them
            streamed = _largest(by_size, sizes.__getitem__, param_share * total_params)
            # mixed: only streamed parameters go to the host, updated where they live; one held on
            # the device would be copied back on the h2d stream after its host update, holding the
            # parameters' prefetches behind the host's clock
            candidates = [p for p in completed if p in streamed] if mixed else trainable
            on_host = _largest(candidates, lambda p: optimizer.state_bytes(sizes[p]), state_share * total_states)
            key = (
                frozenset(on_host) | (frozenset() if mixed else frozenset(streamed) & set(trainable)),
                frozenset(streamed),
            )
            device = [p for p in trainable if p not in key[0]]
            if (key, paged) in tried or (paged and not device):
                continue
            tried.add((key, paged))
            device_states = sorted(
                (optimizer.state_bytes(sizes[p]) for p in (trainable if mixed else device)), reverse=True
            )
            # paged: the states of the updates whose transfers overlap (PREFETCH_LEAD ops each way)
            states = sum(device_states[:3]) if paged else sum(device_states)
            resident = sum(n for p, n in sizes.items() if p not in key[1])
            # prefetched ahead of use; updated on the device: held from the backward's read to the write-back
            working = sum(sorted((sizes[p] for p in key[1]), reverse=True)[: 4 if mixed else 2])
            updating = device if not (cpu or mixed) else trainable  # one allocator on a CPU
            temp = max((optimizer.temp_bytes(sizes[p], cpu) for p in updating), default=0)
            held = states + resident + working + temp
            if budget - held <= 0:
                continue
            target = budget - held
            try:
                if target not in solved:
                    solved[target] = activations.plan(target, solver)
                plan = solved[target]
            except BudgetError as error:
                smallest = min(smallest or error.smallest + held, error.smallest + held)
                if not paged or error.smallest + resident + device_states[0] > budget:
                    continue
                # a paged update's states and temporaries are on the device while the backward's
                # activations are mostly freed: the activations at their floor, the simulation judges
                try:
                    plan = solved[error.smallest] = solved.get(error.smallest) or activations.plan(
                        error.smallest, solver
                    )
                except BudgetError:
                    continue
            solved_plan = replace(plan, graph=graph)
            for lead in self.LEADS if mixed else (PREFETCH_LEAD,):
                plan = _placed_step(
                    solved_plan, optimizer, speeds, budget, key[0], key[1], device if paged else (), lead,
                    lead if mixed else 0,
                )  # fmt: skip
                sim = simulate(plan)
                if sim.peak_bytes > budget:
                    continue
                host_budget = self.problem.host_budget
                if host_budget is not None and sim.host_peak_bytes > host_budget:
                    host_error = RematError(
                        f"error: the plan that fits the budget needs {format_bytes(sim.host_peak_bytes)} of host "
                        f"memory (optimizer states and copies of {len(key[0] | key[1])} parameters), above the host "
                        f"budget {format_bytes(host_budget)}",
                        hint="raise --host-budget or --budget",
                    )
                    continue
                if best is None or sim.time_us < best[0]:
                    best = (sim.time_us, with_predictions(plan, sim))
        ilp = self._placement_ilp(budget, optimizer, speeds, solved, best[0] if best else None)
        if ilp is not None:
            best = ilp
        joint = self._joint_oilp(activations, solver, budget, optimizer, speeds, best[0] if best else None)
        if joint is not None:
            best = joint
        if best is not None:
            return best[1]
        if host_error is not None:
            raise host_error
        why = "with the optimizer's states and updates"
        raise BudgetError(budget, smallest or budget * 2, self._label(solver), why)

    # NOTE: [Placement candidate]
    # Beside the search above, the placement LP of the thesis' O-ILP (NOTE: [Placement ILP] in
    # remat_dsl.solve.solvers.ilp.placement) places the parameters and states for each
    # activation plan the search solved.  For the PLACEMENT_PLANS whose LP predicts the shortest
    # step, its answer is rounded (the thresholds of section 4.6), lowered with the same
    # functions as the search and simulated exactly, with PREFETCH_LEAD and, while the plan
    # fits, the longer LEADS.  The LP's memory model is coarser than the simulation (copies
    # lead by several ops, paged states overlap), so as NOTE: [Budget correction] does for the
    # solvers, when the rounding nearest the LP's answer (all at 0.5) does not fit, the LP is
    # solved again with its device budget lowered by the excess (at least 2% of the budget),
    # at most PLACEMENT_ROUNDS times.  A plan joins the
    # candidates only if it fits the budget and the host budget, and is kept only if faster
    # than the search's best, so `plan_step` is never slower with it.  Its header's solver
    # then ends in `placement=o-ilp predicted-us=N` (N the LP's objective, the fractional
    # placement's step time); without that word the search's placement won.
    PLACEMENT_PLANS = 2
    PLACEMENT_ROUNDS = 3

    def _placement_ilp(
        self, budget: int, optimizer: Optimizer, speeds: tuple[int, int, int], solved: dict[int, ir.Plan],
        fastest: int | None,
    ) -> tuple[int, ir.Plan] | None:  # fmt: skip
        """(predicted time in us, plan) of the placement LP's fastest fitting plan when it is
        faster than `fastest` (us; None: nothing fits yet), else None (NOTE: [Placement
        candidate]).  solved: activation budget -> the solver's plan for the graph without
        gradient lines."""
        if not self.PLACEMENT_PLANS:
            return None
        from remat_dsl.check.replay import simulate
        from remat_dsl.solve.solvers.ilp.placement import placement_fractions

        graph, problem = self.problem.graph, self.problem
        cpu = problem.device == "cpu"
        sizes = {p.name: value_nbytes(p) for p in graph.parameters}
        with_gradient = {g.parameter for g in graph.gradients if g.value is not None}
        trainable = sorted(p for p in sizes if p in with_gradient)
        activation_plans = list({id(p): p for _, p in sorted(solved.items(), reverse=True)}.values())

        def fractions(activation: ir.Plan, timeline, target: int):
            return placement_fractions(
                replace(activation, graph=graph), timeline, sizes=sizes, trainable=trainable,
                state_bytes=optimizer.state_bytes, temp_bytes=lambda n: optimizer.temp_bytes(n, cpu), budget=target,
                host_budget=problem.host_budget, bandwidth=self.bandwidth, speeds=speeds,
            )  # fmt: skip

        answers = []
        for number, activation in enumerate(activation_plans):
            timeline = simulate(activation).timeline
            answer = fractions(activation, timeline, budget)
            if answer is not None:
                answers.append((answer.predicted_us, number, answer, activation, timeline))
        best: tuple[int, ir.Plan] | None = None
        for _, _, first, activation, timeline in sorted(answers, key=lambda a: a[:2])[: self.PLACEMENT_PLANS]:

            def solve(target: int, first=first, activation=activation, timeline=timeline):
                answer = first if target == budget else fractions(activation, timeline, target)
                return None if answer is None else (activation, answer)

            best = self._refined(solve, self.PLACEMENT_ROUNDS, budget, optimizer, speeds, best, fastest, "o-ilp")
        return best

    # NOTE: [Joint candidate]
    # The thesis' O-ILP proper (NOTE: [Joint O-ILP] in remat_dsl.solve.solvers.ilp.offmate):
    # the solver that plans the activations (the one asked for, or `auto`'s pick; built once
    # by the activation Planner, shared with the search) plans the whole step at its budget
    # through the solver contract's `solve_step` (remat_dsl.solve.api: StepProblem), which
    # offmate implements and the others decline; its activation part is lowered by the solver,
    # its answer is each parameter's fractions, and the rounding and lowering of the placement
    # LP (`_placed`) judge it on the exact simulation.  As in NOTE: [Placement candidate],
    # when the rounding nearest the model's answer peaks above the budget, the model is solved
    # again with its budget lowered by the excess (at least 2% of the budget), at most
    # JOINT_ROUNDS solves in all.  The plan joins the candidates only when it fits and is
    # faster than the best so far; its header's solver then ends in `placement=joint-o-ilp
    # predicted-us=N` (N the model's objective).  JOINT_ROUNDS = 0 turns the candidate off.
    JOINT_ROUNDS = 3

    def _joint_oilp(
        self, activations: Planner, name: str | type[Solver], budget: int, optimizer: Optimizer,
        speeds: tuple[int, int, int], fastest: int | None,
    ) -> tuple[int, ir.Plan] | None:  # fmt: skip
        """(predicted time in us, plan) of the joint model's fastest fitting plan when it is
        faster than `fastest` (us; None: nothing fits yet), else None (NOTE: [Joint
        candidate]).  activations: the Planner of the graph without gradient lines; name:
        the solver plan_step was asked for: the one `auto` picks, or that one, plans the
        whole step jointly when it can (`Solver.solve_step`: offmate), so that another
        solver's plan stays that solver's."""
        if not self.JOINT_ROUNDS:
            return None
        solver = activations.solver(activations.chosen(name))
        cpu = self.problem.device == "cpu"
        step = StepProblem(self.problem.graph, optimizer.state_bytes, lambda n: optimizer.temp_bytes(n, cpu), speeds)
        label = header_name(solver)
        label = f"auto: {label}" if name == "auto" else label

        def solve(target: int):
            solved = solver.solve_step(target, step)
            if solved is None:
                return None
            result, answer = solved
            return activations._lowered(result, label, Status.FEASIBLE, budget), answer

        return self._refined(solve, self.JOINT_ROUNDS, budget, optimizer, speeds, None, fastest, "joint-o-ilp")

    def _refined(
        self, solve, rounds: int, budget: int, optimizer: Optimizer, speeds: tuple[int, int, int],
        best: tuple[int, ir.Plan] | None, fastest: int | None, source: str,
    ) -> tuple[int, ir.Plan] | None:  # fmt: skip
        """NOTE: [Placement candidate], for the placement LP and the joint O-ILP alike: at
        most `rounds` solves, `solve(target)` -> (activation plan, placement.Fractions) or
        None, the first at `budget`; each answer's roundings (THRESHOLDS, section 4.6) placed
        on its activation plan (`_placed`); while the rounding nearest the answer
        (THRESHOLDS[0]) peaks above `budget`, the next target is lower by the excess, at
        least 2% of the budget.  Returns `best` (us, plan), or the fastest placed plan that
        fits and is faster than it (than `fastest` while `best` is None)."""
        from remat_dsl.solve.solvers.ilp.placement import THRESHOLDS, round_placement

        target = budget
        for _ in range(rounds):
            solved = solve(target)
            if solved is None:
                break
            activation, answer = solved
            nearest = None
            for placement in dict.fromkeys(round_placement(answer, *t) for t in THRESHOLDS):
                bar = best[0] if best else fastest
                plan, peak = self._placed(activation, placement, budget, optimizer, speeds, bar, source)
                if plan is not None:
                    best = (plan.header.time_us, plan)
                nearest = peak if nearest is None else nearest
            if nearest is None or nearest <= budget:
                break
            target -= max(nearest - budget, budget // 50)
        return best

    def _placed(
        self, activation: ir.Plan, placement, budget: int, optimizer: Optimizer, speeds: tuple[int, int, int],
        bar: int | None, source: str = "o-ilp",
    ) -> tuple[ir.Plan | None, int]:  # fmt: skip
        """(the fastest plan of `placement` lowered on `activation`, with each of LEADS while
        it fits `budget` and the host budget, if faster than `bar` microseconds, else None;
        the peak of its first lowering, bytes).  Its header's solver ends in
        `placement=SOURCE predicted-us=N`, N the model's objective (`source`: o-ilp for the
        placement LP, joint-o-ilp for the joint O-ILP)."""
        from remat_dsl.check.replay import simulate, with_predictions

        whole = replace(activation, graph=self.problem.graph)
        host_budget = self.problem.host_budget
        first_peak, best = None, None
        label = f"placement={source} predicted-us={round(placement.predicted_us)}"
        for lead in self.LEADS if placement.streamed or placement.paged else (PREFETCH_LEAD,):
            plan = _placed_step(
                whole, optimizer, speeds, budget, placement.on_host, placement.streamed, sorted(placement.paged),
                lead, lead if placement.streamed else 0,
            )  # fmt: skip
            sim = simulate(plan)
            first_peak = sim.peak_bytes if first_peak is None else first_peak
            if sim.peak_bytes > budget or (host_budget is not None and sim.host_peak_bytes > host_budget):
                break  # a longer lead holds its copies longer
            if bar is None or sim.time_us < bar:
                plan = with_predictions(plan, sim)
                best = replace(plan, header=replace(plan.header, solver=f"{plan.header.solver} {label}"))
                bar = sim.time_us
        assert first_peak is not None
        return best, first_peak

    def _store_all_if_it_fits(self, name: str | type[Solver], budget: int) -> ir.Plan | None:
        """The store-all plan, labelled `NAME (store-all fits: no solve)`, when it fits
        `budget` (bytes): a solver that minimizes time would return it (NOTE: [Budget
        correction]), after building every block's ILPs for nothing (DenseNet-121: 2 min)."""
        plan = self._lowered(
            self._store_all(), f"{self._label(name)} (store-all fits: no solve)", Status.OPTIMAL, budget
        )
        if plan.header.peak_bytes > budget:
            return None
        if self.problem.report:
            self.problem.report(
                f"the store-all plan fits the budget ({format_bytes(plan.header.peak_bytes)}): no solve"
            )
        return plan

    def smallest_budget(self, solver: str | type[Solver] = "rotor") -> int:
        """The least simulated peak (bytes) of the solver's plans near its floor (and its
        fallbacks'): `plan` succeeds at any budget at or above it."""
        name = self.chosen(solver)
        chosen = self.solver(name)
        plans = (p for candidate in self._candidates(chosen) for p in self._floor_plans(candidate))
        smallest = self._or_store_all(name, min(p.header.peak_bytes for p in plans))
        self._remember_smallest(name, smallest)
        return smallest

    def _or_store_all(self, name: str | type[Solver], smallest: int) -> int:
        """`smallest` (bytes), or the store-all plan's peak where that is lower and solver
        `name` minimizes time: `plan` returns the store-all plan at any budget it fits (NOTE:
        [Budget correction]), which a solver's own floor may not show (a small model whose
        parameter gradients dominate its peak)."""
        if not self._class(name).optimizes:
            return smallest
        store_all = self._lowered(self._store_all(), self._label(name), Status.OPTIMAL, smallest)
        return min(smallest, store_all.header.peak_bytes)

    # --- budgets no plan reaches (NOTE: [Budgets below the bound]) ----------

    def refuse_below_bound(self, budget: int, solver: str | type[Solver] = "auto") -> None:
        """Raise RematError, before any solve, when `budget` (bytes) is below
        `peak_lower_bound`: no plan of any solver fits it.  The message names the bound and
        why, the parameter gradients' bytes, and the smallest budget `solver` reaches when
        an earlier run found it (NOTE: [Budgets below the bound])."""
        bound, why = self.peak_lower_bound
        if budget >= bound:
            return
        name = self.chosen(solver)
        smallest = self.known_smallest(name)
        message = (
            f"error: budget {format_bytes(budget)} is infeasible: no plan can peak below {format_bytes(bound)} "
            f"({why}); the parameter gradients alone take {format_bytes(self.gradient_bytes)}"
        )
        if smallest is None:
            hint = (
                f"plan with --budget {bound}B or more; a budget the solver cannot reach is refused with the"
                " smallest one"
            )
            raise RematError(message, hint=hint)
        known = (
            f"solver {self._label(name)}'s smallest feasible budget is {format_bytes(smallest)} (found by an earlier"
            " run, in the cache)"
        )
        raise RematError(f"{message}; {known}", hint=f"plan with --budget {smallest}B or more")

    def known_smallest(self, solver: str | type[Solver]) -> int | None:
        """The smallest feasible budget (bytes) of `solver` (a registry name, not `auto`)
        that an earlier refusal stored in the cache, or None.  A stored value below
        `peak_lower_bound` is no budget a solver found and is ignored.  An outside solver's
        is never stored: the cache cannot tell when its code changes."""
        cache = self.problem.cache
        if cache is None or not cache.enabled or isinstance(solver, type):
            return None
        value = cache.get(SMALLEST_KIND, self._smallest_key(solver))
        if not isinstance(value, int) or isinstance(value, bool) or not self.peak_lower_bound[0] <= value < 1 << 62:
            return None
        return value

    def _remember_smallest(self, solver: str | type[Solver], smallest: int) -> None:
        """Store `solver`'s smallest feasible budget (bytes) in the cache; not under a time
        limit, where what a MILP finds depends on the machine's load, nor for an outside
        solver (`known_smallest`)."""
        cache = self.problem.cache
        if cache is None or not cache.enabled or self.problem.time_limit is not None or isinstance(solver, type):
            return
        cache.put(SMALLEST_KIND, self._smallest_key(solver), int(smallest))

    def _smallest_key(self, solver: str) -> str:
        """The cache key of `solver`'s smallest budget: everything it depends on (NOTE:
        [Budgets below the bound])."""
        p = self.problem
        assert p.cache is not None  # asked only with a cache
        constraints = tuple((c.kind, c.pattern) for c in p.constraints if c.kind != "budget")
        graph = digest.graph_hash(digest.items(p.graph, costs=True))
        return p.cache.key(SMALLEST_KIND, graph, p.device, solver, constraints, p.bandwidth, p.host_link, p.host_budget)

    def _first_fitting(self, solver: Solver, budget: int) -> tuple[ir.Plan, SolverInfo]:
        """The plan of the first candidate that fits, polished, or a near miss of it or of
        the candidates before it repaired, whichever is fastest (NOTE: [Polish and
        repair]), and how its solves went."""
        smallest: list[int] = []
        near: list[ir.Plan] = []
        for candidate in self._candidates(solver):
            try:
                plan, info = self._fit(candidate, budget, near)
            except BudgetError as error:
                smallest.append(error.smallest)
                continue
            best, repaired = self._improved(plan, near, budget)
            # a repaired plan is none that the solver's MILPs bounded: no gap
            return best, replace(info, status=Status.FEASIBLE, gap=None) if repaired else info
        raise BudgetError(budget, min(smallest), solver.name)

    @staticmethod
    def _improved(plan: ir.Plan, near: list[ir.Plan], budget: int) -> tuple[ir.Plan, bool]:
        """The fastest of `plan` polished and the fastest near misses repaired and
        polished, and whether it is a repaired one."""
        options = [polish(plan, budget)]
        seen: set[tuple[int, int]] = set()
        for miss in sorted(near, key=lambda p: (p.header.time_us, p.header.peak_bytes)):
            key = (miss.header.time_us, miss.header.peak_bytes)
            if key in seen or miss.header.peak_bytes > budget * (1 + REPAIR_REACH):
                continue
            if len(seen) == REPAIR_PLANS or miss.header.time_us >= min(p.header.time_us for p in options):
                break
            seen.add(key)
            repaired = repair(miss, budget)
            if repaired is not None:
                options.append(polish(repaired, budget))
        best = min(range(len(options)), key=lambda i: options[i].header.time_us)
        return options[best], best > 0

    def _solve(self, solver: Solver, target: int) -> SolverResult:
        """`solver.solve(target)`, held to the contract: a SolverResult or BudgetError.
        Raises RematError naming the solver when it returns anything else (a plug-in's
        bare list of op names)."""
        say_phase(self.problem.report, "solving")
        result = solver.solve(target)
        if not isinstance(result, SolverResult):
            raise RematError(
                f"error: solver {solver.name} returned a {type(result).__name__}, not a SolverResult",
                hint="return remat_dsl.solve.api.SolverResult(order, SolverInfo(status)) from solve(target): "
                "docs/solvers.md",
            )
        return result

    def _lowered(self, result: SolverResult, solver: str, status: Status, budget: int) -> ir.Plan:
        """The plan of `result` (its order, decisions and transfers) lowered and simulated
        for `budget` bytes; `solver`: the header's solver text (`api.header_name`), `status`
        the header's status."""
        p = self.problem
        say_phase(p.report, "lowering and simulating")
        plan = lowered_plan(
            p.graph, result.order, constraints=p.constraints, model=self.model, device=p.device, budget=budget,
            solver=solver, status=Status(status).value, bandwidth=self.bandwidth,
            decisions=result.decisions, transfers=result.transfers,
        )  # fmt: skip
        return move_up(plan)  # NOTE: [Backward ops moved up] in remat_dsl.solve.polish

    def _store_all(self) -> SolverResult:
        """The autograd order (no recompute) as a result: the store-all plan."""
        return SolverResult(autograd_order(self.problem.graph), SolverInfo(Status.OPTIMAL))

    def _fit(self, solver: Solver, budget: int, near: list[ir.Plan] | None = None) -> tuple[ir.Plan, SolverInfo]:
        """NOTE: [Budget correction] for one solver: its plan and how its solves went;
        the plans it made above the budget are appended to `near`.  Raises BudgetError."""
        if solver.optimizes:
            store_all = self._lowered(self._store_all(), header_name(solver), Status.OPTIMAL, budget)
            if store_all.header.peak_bytes <= budget:  # no recompute: optimal, whatever the solver's MILPs said
                return store_all, SolverInfo(Status.OPTIMAL, None, solver.info.seconds)
        return self._fit_order(solver, budget, [] if near is None else near)

    def _fit_order(self, solver: Solver, budget: int, near: list[ir.Plan]) -> tuple[ir.Plan, SolverInfo]:
        """The solver's plan that fits `budget`, its target corrected, and how the solve
        that made it went (its own gap: a solver that keeps its solves, such as
        moccasin in a budget sweep, reports in `info` the largest gap of them all, which
        is not this plan's); the plans above it are appended to `near`.  Raises
        BudgetError."""
        tried = self._tried.setdefault(solver, {})
        target, corrected, at_floor = budget, False, False
        for _ in range(MAX_ROUNDS):
            try:
                result = self._solve(solver, target)
            except BudgetError:
                if at_floor:
                    break
                target, at_floor = solver.floor(), True
                try:
                    result = self._solve(solver, target)
                except BudgetError:
                    break
            plan = self._lowered(
                result, header_name(solver), Status.FEASIBLE if corrected else result.info.status, budget
            )
            tried[target] = plan.header.peak_bytes
            excess = plan.header.peak_bytes - budget
            if excess <= 0:
                if solver.cheap_targets:
                    return self._raised(solver, budget, target, plan, result, near)
                return plan, self._solve_info(result, solver)
            near.append(plan)
            if at_floor:
                break
            # never below 0 (a solver refuses 0 with BudgetError, so the floor is tried next)
            target, corrected = max(0, target - max(excess, budget // 50)), True
        fitting = [t for t, peak in tried.items() if peak <= budget]
        if fitting:
            result = self._solve(solver, max(fitting))
            return self._lowered(result, header_name(solver), Status.FEASIBLE, budget), self._solve_info(result, solver)
        plans = self._floor_plans(solver, budget)
        near += [p for p in plans if p.header.peak_bytes > budget]
        best = min(plans, key=lambda p: p.header.peak_bytes)
        if best.header.peak_bytes > budget:
            raise BudgetError(budget, best.header.peak_bytes, solver.name)
        return best, solver.info

    def _raised(
        self, solver: Solver, budget: int, target: int, plan: ir.Plan, result: SolverResult, near: list[ir.Plan]
    ) -> tuple[ir.Plan, SolverInfo]:
        """`plan` (made at `target`, fitting `budget`), or a faster one made at a target
        raised by the room it leaves, while one fits (NOTE: [Budget correction]); the
        first that does not fit goes to `near`."""
        best = plan, self._solve_info(result, solver)
        for _ in range(RAISE_ROUNDS):
            room = budget - plan.header.peak_bytes
            if room < budget // 200:
                break
            target += room
            made = self._plan_at(solver, target, budget)
            if made is None:
                break
            plan, result = made
            if plan.header.peak_bytes > budget:
                near.append(plan)
                break
            if plan.header.time_us < best[0].header.time_us:
                best = plan, self._solve_info(result, solver)
        return best

    def _plan_at(self, solver: Solver, target: int, budget: int):
        """(the solver's plan at `target` bytes, lowered and simulated, its SolverResult), the
        plan's peak recorded among the targets tried; None when the solver refuses it."""
        try:
            result = self._solve(solver, target)
        except BudgetError:
            return None
        plan = self._lowered(result, header_name(solver), Status.FEASIBLE, budget)
        self._tried.setdefault(solver, {})[target] = plan.header.peak_bytes
        return plan, result

    @staticmethod
    def _solve_info(result: SolverResult, solver: Solver) -> SolverInfo:
        """The status and gap of the solve that gave `result`, with the solver's seconds
        so far."""
        return replace(result.info, seconds=solver.info.seconds)

    def _floor_plans(self, solver: Solver, budget: int = 0) -> list[ir.Plan]:
        """The plans at the solver's floor targets (`api.floor_targets`), each simulated."""
        plans = [
            made[0] for made in (self._plan_at(solver, target, budget) for target in floor_targets(solver)) if made
        ]
        if not plans:
            plans.append(self._lowered(self._store_all(), header_name(solver), Status.FEASIBLE, budget))
        return plans

    def _constraints_error(self, error: BudgetError, budget: int, solver: str) -> RematError:
        """The error to raise: `error`, or when the constraints are what cannot hold, one
        that names their lines and the smallest budget that satisfies them."""
        constraints = self.problem.constraints
        if not any(c.kind != "budget" for c in constraints):
            return error
        budget_lines = [c.source for c in constraints if c.kind == "budget" and c.size == budget and c.source]
        where = f" ({budget_lines[-1]})" if budget_lines else ""
        return RematError(
            f"error: the constraints at {constraint_lines(constraints)} and the budget {format_bytes(budget)}{where} "
            f"cannot all hold with solver {solver}: the smallest budget that satisfies them is "
            f"{format_bytes(error.smallest)}",
            hint=f"raise the budget to {error.smallest} bytes or more, or relax the keep/offload/recompute lines",
        )


def _by_gradient_completion(graph: ir.Graph, trainable: list[str]) -> list[str]:
    """`trainable` in the order the backward completes their gradients (the graph's order of
    the last op making each gradient): the updates that can start first."""
    position = {op.name: i for i, op in enumerate(graph.ops)}
    tensors = graph.tensor_by_name
    done = {
        g.parameter: max((position[tensors[r].producer] for r in ir.refs_in(g.value) if r in tensors), default=-1)
        for g in graph.gradients
        if g.value is not None
    }
    return sorted(trainable, key=lambda p: (done.get(p, -1), p))


def _largest(names: list[str], size, amount: float) -> list[str]:
    """The first of `names` (largest first) whose sizes add up to at least `amount`; all of
    them for an amount at or above their total."""
    chosen, held = [], 0
    for name in names:
        if held >= amount:
            break
        chosen.append(name)
        held += size(name)
    return chosen


def make_plan(graph: ir.Graph, *, model: str, device: str, budget: int, solver: str, bandwidth: int = DEFAULT_BANDWIDTH,
              constraints: tuple[ir.Constraint, ...] = (), time_limit: float | None = None) -> ir.Plan:  # fmt: skip
    """`Planner(...).plan(budget, solver)`: one plan (see Planner.plan)."""
    planner = Planner(
        graph, model=model, device=device, bandwidth=bandwidth, constraints=constraints, time_limit=time_limit
    )
    return planner.plan(budget, solver)


def autograd_peak(graph: ir.Graph, device: str) -> int:
    """Simulated peak of the autograd plan (bytes): what a percentage budget refers to."""
    return Planner(graph, device=device).autograd_peak


def peak_lower_bound(graph: ir.Graph) -> tuple[int, str]:
    """A proven lower bound on the simulated peak (bytes) of any plan of `graph` that keeps
    its tensors on the device, and why, for the refusal's message (issue 13 part 3).

    Every plan runs every op at least once, and while op k runs, its input tensors, its
    outputs and its temporaries are resident (remat_dsl.check.replay counts them so), and
    so is every tensor a plan may never delete (parameter gradients, model outputs:
    `ir.pinned_tensors`) that an op upstream of k made: that op ran before k and its
    output stays.  At the end of the step all pinned tensors are resident.  The bound is
    the largest of these sums; an op that may write its output into an input (NOTE:
    [In-place outputs] in remat_dsl.plan.inplace) counts that output's bytes once."""
    sizes = graph.nbytes
    inplace = inplace_candidates(graph)
    pinned = sorted(t for t in pinned_tensors(graph) if t in sizes)
    bit = {t: i for i, t in enumerate(pinned)}
    predecessors = ir.op_predecessors(graph)
    made = [sum(1 << bit[t] for t in op.outputs if t in bit) for op in graph.ops]
    upstream = [0] * len(graph.ops)  # pinned tensors made by ops upstream of each op, as a bit set
    sums: dict[int, int] = {}

    def total(mask: int) -> int:
        if mask not in sums:
            sums[mask] = sum(sizes[t] for i, t in enumerate(pinned) if mask >> i & 1)
        return sums[mask]

    best = (sum(sizes[t] for t in pinned), "the step ends holding its parameter gradients and outputs")
    names = set(sizes)
    for k, op in enumerate(graph.ops):
        for j in predecessors[k]:
            upstream[k] |= upstream[j] | made[j]
        held = set(op_uses(op, names)) | set(op.outputs)
        own = sum(sizes[t] for t in held) + op.temp_bytes - (sizes[op.outputs[0]] if op.name in inplace else 0)
        before = total(upstream[k] & ~sum(1 << bit[t] for t in held if t in bit))
        if own + before > best[0]:
            best = (
                own + before,
                f"{op.name} runs with {format_bytes(own)} of inputs, outputs and temporaries, beside "
                f"{format_bytes(before)} of gradients and outputs made before it",
            )
    return best


def smallest_budget(
    graph: ir.Graph, device: str, solver: str = "rotor", constraints: tuple[ir.Constraint, ...] = ()
) -> int:
    """`Planner(...).smallest_budget(solver)`."""
    return Planner(graph, device=device, constraints=constraints).smallest_budget(solver)
