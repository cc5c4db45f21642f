"""Moccasin: rematerialization as a constraint program over retention intervals.

Source: Bartan, Li, Teague, Mirhoseini, Pilanci, "Moccasin: Efficient Tensor
Rematerialization for Neural Networks" (ICML 2023), section 3, and its reference
implementation (github.com/haoming-codes/moccasin, src/moccasin/cp.py, `make_cpsat_model`
with `use_stage=True`, `discretized=True` and explicit interval-to-interval assignments in
place of its reservoir constraints).  Each node v has at most C retention intervals
I_v^i = [s_v^i, e_v^i) on a discrete time axis with presence literals a_v^i: v is computed
at s_v^i and its output kept until e_v^i.  The constraints, named as cp.py's comments name
them (the paper's section 3 states the same model; its equation numbers are not quoted
here because they were not checked against the paper):

* "every node is computed at least once": I_v^1 is present, at v's own stage;
* "valid interval": I_v^i needs I_v^(i-1) and starts at or after its end;
* "precedence constraint": for each edge u -> v and present I_v^j, some present I_u^i has
  s_u^i < s_v^j < e_u^i (u's output is alive while v runs; cp.py's `reservoir=False`
  branch with Booleans x_uv^ij, kept only where u has a choice);
* "memory budget": Cumulative(intervals, demand = output bytes, capacity = the target);
* objective "min_runtime": the total compute time sum_v sum_i t_v a_v^i (microseconds).

O(C n) interval variables, where Checkmate's ILP has O(n^2) Booleans.

NOTE: [Moccasin on an FB-graph]
Nodes are the FB-graph's ops (an edge u -> v when v reads an output of u, as in
remat_dsl.solve.twremat).  Our plans run every forward op once in the forward section, in
graph order, and every backward op exactly once (NOTE: [TW-Remat on an FB-graph]), so the
time axis is the stage axis of the reference implementation with Checkmate's pruning
(remat_dsl.solve.ilp.hilp, NOTE: [Pruning]): forward op f starts its first interval at
time f (f = 0..F-1); backward stage b (b = 0..B-1, backward ops in graph order) holds the
F + 1 times F + b (F + 1) + k: k = 0..F-1 a slot where forward op k may be recomputed,
k = F the backward op's own run.  Only forward ops get intervals 2..C (recomputations),
only in backward stages whose op needs them (directly or through other recomputations).
Memory (bytes): an op's outputs over its intervals, minus the pinned ones (model outputs,
parameter gradients: remat_dsl.plan.ir.pinned_tensors), which get one interval from the
op's first run to the end of the axis; its temp_bytes over [s, s + 1) of each run.  What
the graph does not make (parameters, inputs) is left out: the driver simulates the order
exactly and corrects the target (NOTE: [Budget correction] in remat_dsl.solve.driver).
Outputs a `keep` line names are never recomputed; the one lowering applies the other
constraint lines (remat_dsl.plan.constraints).  The solution becomes an op order by
sorting present intervals by start: a forward op's first run is its compute, later ones
are recomputes.

NOTE: [Size limit]
Measured on this 2-core machine (shared), one worker: tests/models/tiny_cnn.py (22 ops)
proves its optimum in under a second at every budget; tests/models/hf_gpt2.py (188 ops)
stopped at 60 s per solve with gaps of 2% (smallest peak) and 10% (70% of the autograd
peak), its plan 8% faster than rockmate's and its smallest budget 7% below rockmate's;
examples/transformer.py (331 ops) found no lower bound in 120 s (gap 100%) and no plan
below 69% of the autograd peak, where rockmate reaches 27%; examples/gpt2.py (4 layers,
310 ops, 20 s per solve) planned 70% 3.7% slower than rockmate (gap 7.7%) and nothing
below 83%.  So graphs above MAX_OPS = 200 ops are refused (bench/optimality.py lifts the
limit to measure).

NOTE: [Honest CP status]
CP-SAT runs with NUM_WORKERS workers and a fixed RANDOM_SEED, so a solve that ends by
proof is deterministic; one stopped by its time limit (problem.time_limit, else
TIME_LIMIT seconds) depends on the machine's speed and load.  The plan header says
`optimal` only when CP-SAT proved the optimum, else `feasible` with the gap
(objective - best bound) / objective from CP-SAT's own bound.
"""

from __future__ import annotations

import functools
import math
import time
from collections import defaultdict

from remat_dsl.plan import ir
from remat_dsl.plan.constraints import matching
from remat_dsl.plan.errors import RematError
from remat_dsl.plan.ir import op_predecessors, pinned_tensors
from remat_dsl.plan.units import format_bytes
from remat_dsl.solve.api import BudgetError, Decision, Problem, SolverInfo, SolverResult, Status, refuse_above

NUM_WORKERS = 1  # CP-SAT workers: one, so that a proven solve is deterministic
RANDOM_SEED = 0
TIME_LIMIT = 600.0  # seconds per CP-SAT solve when the problem gives none
GAP_OPTIMAL = 1e-4  # a relative gap at most this is reported as optimal (as the MILPs do)


def _cp_model():
    try:
        from ortools.sat.python import cp_model
    except ImportError as error:  # pragma: no cover - ortools is a dependency
        raise RematError(
            "error: the moccasin solver needs OR-Tools (CP-SAT)", hint="pip install 'ortools>=9.15'"
        ) from error
    return cp_model


class Moccasin:
    """`--solver moccasin`: the CP model of Moccasin (see the module docstring) over the
    whole FB-graph, solved by CP-SAT at the target (bytes), minimizing the predicted time
    (microseconds).  `intervals`: C, retention intervals per forward op (C - 1
    recomputations).  Refused above MAX_OPS ops (RematError); never picked by `auto`."""

    name = "moccasin"
    auto_rank = None
    optimizes = True
    MAX_OPS = 200  # measured: NOTE: [Size limit]
    intervals = 2

    def __init__(self, problem: Problem):
        graph = problem.graph
        refuse_above(
            graph, self.MAX_OPS, self.name, "one constraint program",
            hint="use --solver twremat (any size) or --solver hiremate, which solve small pieces",
        )  # fmt: skip
        self.problem = problem
        self.ops = graph.ops
        self.index = {op.name: i for i, op in enumerate(self.ops)}
        self.preds = op_predecessors(graph)
        sizes = {t.name: t.nbytes for t in graph.tensors}
        pinned = pinned_tensors(graph)
        self.free_bytes = [sum(sizes[t] for t in op.outputs if t not in pinned) for op in self.ops]
        self.pinned_bytes = [sum(sizes[t] for t in op.outputs if t in pinned) for op in self.ops]
        self.forward = [i for i, op in enumerate(self.ops) if op.phase == ir.FORWARD]
        self.backward = [i for i, op in enumerate(self.ops) if op.phase == ir.BACKWARD]
        F, B = len(self.forward), len(self.backward)
        self.slot = {v: k for k, v in enumerate(self.forward)}  # forward op -> its slot k
        self.horizon = F + B * (F + 1)
        kept = matching(graph, problem.constraints, "keep")  # `keep` lines: never recomputed
        self.kept = {v for v, op in enumerate(self.ops) if any(t in kept for t in op.outputs)}
        self.useful = self._useful_recomputations()
        self.seconds = 0.0
        self._status: list[tuple[Status, float | None]] = []
        self._solved: dict[int, tuple[tuple[str, ...], int, Status, float | None] | None] = {}
        self._solutions: list[tuple[int, int, list[int]]] = []  # (capacity, time_us, values): NOTE: [Hints]
        self._floor_proven = False

    def describe(self) -> str:
        return f"ops={len(self.ops)} intervals={self.intervals}"

    # --- the time axis (NOTE: [Moccasin on an FB-graph]) ------------------------------

    def first_start(self, v: int) -> int:
        """The time of op v's own run: its forward slot, or its backward stage's last slot."""
        if v in self.slot:
            return self.slot[v]
        F = len(self.forward)
        return F + self.backward.index(v) * (F + 1) + F

    def _useful_recomputations(self) -> dict[int, list[int]]:
        """Forward op -> the backward stages b where recomputing it may pay: it leads,
        through forward ops, to what backward op b reads (hilp.py, NOTE: [Pruning])."""
        useful: dict[int, list[int]] = defaultdict(list)
        for b, v in enumerate(self.backward):
            seen: set[int] = set()
            todo = [u for u in self.preds[v] if u in self.slot]
            while todo:
                u = todo.pop()
                if u in seen or self.pinned_bytes[u] or u in self.kept:
                    continue  # an op with pinned or kept outputs is never recomputed
                seen.add(u)
                todo.extend(w for w in self.preds[u] if w in self.slot)
            for u in seen:
                useful[u].append(b)
        return useful

    # --- the CP model (paper section 3; constraint names from cp.py) ----------------------------------

    def _model(self, capacity: int | None):
        """The CP model at `capacity` (scaled bytes; None: the capacity is a variable
        to minimize).  Returns (model, cp_model, starts, presences, objective, peak, unit)."""
        cp_model = _cp_model()
        model = cp_model.CpModel()
        demands = [d for d in self.free_bytes + self.pinned_bytes + [op.temp_bytes for op in self.ops] if d]
        unit = functools.reduce(math.gcd, demands, 0) or 1
        total = sum(demands) // unit
        H, F = self.horizon, len(self.forward)
        starts: dict[int, list] = {}
        ends: dict[int, list] = {}
        present: dict[int, list] = {}
        intervals, heights = [], []
        for v, op in enumerate(self.ops):
            s0 = self.first_start(v)
            starts[v], ends[v], present[v] = [s0], [model.new_int_var(s0 + 1, H, f"e_{v}_0")], [True]
            stages = self.useful.get(v, []) if v in self.slot else []
            for i in range(
                1, self.intervals if stages else 1
            ):  # "valid interval": recomputations, backward stages only
                times = [F + b * (F + 1) + self.slot[v] for b in stages]
                s = model.new_int_var_from_domain(cp_model.Domain.from_values(times), f"s_{v}_{i}")
                e = model.new_int_var(min(times) + 1, H, f"e_{v}_{i}")
                a = model.new_bool_var(f"a_{v}_{i}")
                model.add(s >= ends[v][i - 1]).only_enforce_if(a)
                if i > 1:
                    model.add_implication(a, present[v][i - 1])
                starts[v].append(s)
                ends[v].append(e)
                present[v].append(a)
            for i in range(len(starts[v])):
                s, e, a = starts[v][i], ends[v][i], present[v][i]
                if self.free_bytes[v]:
                    length = model.new_int_var(1, H, f"l_{v}_{i}")
                    interval = (
                        model.new_interval_var(s, length, e, f"I_{v}_{i}")
                        if a is True
                        else model.new_optional_interval_var(s, length, e, a, f"I_{v}_{i}")
                    )
                    intervals.append(interval)
                    heights.append(self.free_bytes[v] // unit)
                if op.temp_bytes:
                    run = (
                        model.new_fixed_size_interval_var(s, 1, f"T_{v}_{i}")
                        if a is True
                        else model.new_optional_fixed_size_interval_var(s, 1, a, f"T_{v}_{i}")
                    )
                    intervals.append(run)
                    heights.append(op.temp_bytes // unit)
            if self.pinned_bytes[v]:
                intervals.append(model.new_fixed_size_interval_var(s0, H - s0, f"P_{v}"))
                heights.append(self.pinned_bytes[v] // unit)
        self._precedence(model, starts, ends, present)
        peak = model.new_int_var(0, total, "peak") if capacity is None else capacity
        model.add_cumulative(intervals, heights, peak)  # "memory budget"
        recompute = [
            (self.ops[v].time_us, a) for v in present for a in present[v] if a is not True and self.ops[v].time_us
        ]
        objective = sum(op.time_us for op in self.ops) + sum(t * a for t, a in recompute)  # "min_runtime"
        return model, cp_model, starts, present, objective, peak, unit

    def _precedence(self, model, starts, ends, present) -> None:
        """The "precedence constraint": each present interval of v lies within a present interval of each
        input u, from after u's run to past v's run.  u's first interval always starts
        before v's runs (graph order); a later one (a recomputation) only when chosen."""
        for v in range(len(self.ops)):
            for j, sv in enumerate(starts[v]):
                av = present[v][j]
                for u in self.preds[v]:
                    if len(starts[u]) == 1:
                        row = model.add(ends[u][0] >= sv + 1)
                        if av is not True:
                            row.only_enforce_if(av)
                        continue
                    choices = []
                    for i, su in enumerate(starts[u]):
                        x = model.new_bool_var(f"x_{u}_{i}_{v}_{j}")
                        if i:
                            model.add_implication(x, present[u][i])
                            model.add(su + 1 <= sv).only_enforce_if(x)
                        model.add(ends[u][i] >= sv + 1).only_enforce_if(x)
                        choices.append(x)
                    row = model.add_bool_or(choices)
                    if av is not True:
                        row.only_enforce_if(av)

    def _run(self, model, cp_model):
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = NUM_WORKERS
        solver.parameters.random_seed = RANDOM_SEED
        solver.parameters.max_time_in_seconds = float(self.problem.time_limit or TIME_LIMIT)
        start = time.perf_counter()
        code = solver.solve(model)
        self.seconds += time.perf_counter() - start
        if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return solver, None
        if code == cp_model.OPTIMAL:
            return solver, (Status.OPTIMAL, 0.0)
        value, bound = solver.objective_value, solver.best_objective_bound
        gap = (value - bound) / value if value > 0 else 0.0
        return solver, (Status.OPTIMAL if gap <= GAP_OPTIMAL else Status.FEASIBLE, gap)

    def _order(self, solver, starts, present) -> tuple[str, ...]:
        """The op order of a solution: present intervals sorted by start."""
        runs = []
        for v in starts:
            for i, s in enumerate(starts[v]):
                a = present[v][i]
                if a is True or solver.boolean_value(a):
                    runs.append((s if isinstance(s, int) else solver.value(s), v))
        return tuple(self.ops[v].name for _, v in sorted(runs))

    def _remember(self, solver, capacity: int, time_us: int) -> None:
        """Keep a solution (every variable's value) that fits `capacity` (scaled bytes)."""
        self._solutions.append((capacity, time_us, list(solver.response_proto.solution)))

    def _hint(self, model, capacity: int) -> None:
        """NOTE: [Hints] The fastest solution kept that fits `capacity` starts the search:
        CP-SAT then begins from a feasible schedule.  Models are built in the same order,
        so variable i means the same in each (the floor model's extra `peak` comes last)."""
        fitting = [(t, values) for cap, t, values in self._solutions if cap <= capacity]
        if not fitting:
            return
        _, values = min(fitting, key=lambda item: item[0])
        n = len(model.proto.variables)
        model.proto.solution_hint.vars.extend(range(n))
        model.proto.solution_hint.values.extend(values[:n])

    # --- the solver interface ----------------------------------------------------------

    def _solve(self, target: int):
        """(order, time_us, status, gap) of the fastest order at `target` bytes, or None."""
        if target in self._solved:
            return self._solved[target]
        report = self.problem.report
        if report:
            report(f"moccasin: CP-SAT at {format_bytes(target)} over {len(self.ops)} ops")
        floor = self.floor()
        if target < floor and self._floor_proven:
            self._solved[target] = None
            return None
        capacity = max(target, 0) // self._unit()
        model, cp_model, starts, present, objective, _, unit = self._model(capacity)
        model.minimize(objective)  # "min_runtime"
        self._hint(model, capacity)
        solver, status = self._run(model, cp_model)
        result = None
        if status is not None:
            order = self._order(solver, starts, present)
            time_us = sum(self.ops[self.index[n]].time_us for n in order)
            result = (order, time_us, *status)
            self._status.append(status)
            self._remember(solver, capacity, time_us)
        self._solved[target] = result
        return result

    def _unit(self) -> int:
        demands = [d for d in self.free_bytes + self.pinned_bytes + [op.temp_bytes for op in self.ops] if d]
        return functools.reduce(math.gcd, demands, 0) or 1

    @functools.cached_property
    def _floor(self) -> int:
        """The smallest peak (bytes) of the model: CP-SAT minimizing the capacity."""
        model, cp_model, starts, present, _, peak, unit = self._model(None)
        model.minimize(peak)
        solver, status = self._run(model, cp_model)
        if status is None:
            raise RematError("error: moccasin found no schedule within its time limit", hint="raise --time-limit")
        self._floor_proven = status[0] == Status.OPTIMAL
        order = self._order(solver, starts, present)
        self._remember(solver, int(solver.value(peak)), sum(self.ops[self.index[n]].time_us for n in order))
        return int(solver.value(peak)) * unit

    def floor(self) -> int:
        """The smallest target (bytes) with a schedule in the model: the least of the
        peak-minimizing solve's result (a proven minimum when CP-SAT proved it within the
        time limit) and the targets solved so far."""
        solved = [target for target, result in self._solved.items() if result is not None]
        return min([self._floor, *solved])

    def floor_targets(self) -> list[int]:
        return [self.floor()]

    @property
    def info(self) -> SolverInfo:
        if not self._status:
            return SolverInfo(Status.OPTIMAL, None, self.seconds)
        feasible = [gap for status, gap in self._status if status != Status.OPTIMAL]
        if feasible:
            return SolverInfo(Status.FEASIBLE, max(feasible), self.seconds)
        return SolverInfo(Status.OPTIMAL, max(gap or 0.0 for _, gap in self._status), self.seconds)

    def solve(self, target: int) -> SolverResult:
        """The fastest order (microseconds) whose peak in the model is at most `target`
        bytes.  Raises BudgetError below the floor."""
        result = self._solve(target)
        if result is None:
            raise BudgetError(target, self.floor(), self.name)
        order, time_us, status, gap = result
        text = f"moccasin: {status.value}" + (f", gap {gap:.2%}" if gap else "") + f", {time_us} us predicted"
        return SolverResult(order, SolverInfo(status, gap, self.seconds), (Decision(0, text),))
