"""H-ILP: the rematerialization ILP over a graph whose compute nodes have options.

Source: Zhao, PhD thesis "Optimizing Memory Usage when Training Deep Neural Networks"
(2024), section 3.4 (H-ILP, eq. 3.4-3.34), which generalizes RK-Checkmate (section 2.4,
eq. 2.3-2.19).  With one option per node and no phantoms this *is* RK-Checkmate on an
FB-graph of operations; with nodes standing for H-clusters whose options are
sub-schedules it is the H-ILP of HiRemate.

Graph.  cNodes k = 0..T-1 in a topological order, forward nodes first, then backward
nodes (stage t_b = the first backward node: the forward/backward boundary, the "loss").
aNodes (values) d with size s_d and exactly one producer: our FB-graph sums gradient
contributions with explicit ops, so the per-edge variables S_{k,d} of eq. 2.7/3.12
collapse into the liveness P_d.  A forward node F_j of an H-cluster has options
o = 0..n-1 that keep a phantom of p_{j,o} bytes for its backward B_j, which must run with
the same option o (eq. 3.19), and a last option that keeps no phantom (the no_grad
"fast-forward" of eq. 2.3's R').  Values made outside the graph are always available
and not counted (the caller counts them).

Stages (section 2.4.1).  Stage t ends with the first computation of node t (eq. 3.9).
NOTE: [Pruning] Two restrictions shrink the ILP from O(T^2) compute variables to
O(T_f * T_b): forward nodes are recomputed only in backward stages (recomputing during
the forward phase only pays when the forward phase alone exceeds the budget), and each
backward node runs exactly once, in its own stage (backward values are gradients that
are consumed once).

Variables: Comp[t,k,o] (eq. 3.15), P[t,d] alive at the start of stage t (eq. 3.7, 3.11),
Sp[t,j,o] phantom alive (eq. 3.5, 3.16-3.18), D[t,k,d] delete d right after step k of
stage t (eq. 3.20-3.26), and a continuous U[t,k], the memory after step k (eq. 3.30-3.32),
so that each memory constraint (eq. 3.33) has a handful of terms.
NOTE: [Deletions] Eq. 3.25 (force eager deletion) is dropped: a deletion the ILP does not
make only overestimates memory, and the one lowering (remat_dsl.solve.lowering) deletes every
value after its last use anyway, so the real plan uses at most what the ILP counted.
Eq. 3.26 (delete only values no later step of the stage reads and that are not kept) is
kept, disaggregated per reader.
Objective: the total compute time sum_{t,k,o} c_{k,o} Comp[t,k,o] (section 2.4.1).
Budgets: M_peak bounds every step (eq. 3.33 / 2.18), M_save bounds what is alive at the
boundary (eq. 2.19).  `HILP` builds the model once; `solve` changes only the two budgets
(the right-hand sides), so a grid of budgets (section 2.6.0.0.1) costs one build.
"""

from __future__ import annotations

import functools
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import ClassVar

import pulp

from remat_dsl.solve.api import BudgetError, Solver, SolverInfo, SolverResult, Status
from remat_dsl.solve.solvers.ilp import milp
from remat_dsl.solve.lowering import autograd_order, simulated_peak


@dataclass(frozen=True)
class Value:
    """An aNode: `size` bytes made by node `producer`.

    keep_at_boundary: must be alive when the backward starts (read outside the graph
    between its forward and backward).  keep_at_end: never deleted (a gradient read
    outside the graph, a parameter gradient, a model output).
    """

    name: str
    size: int
    producer: int
    keep_at_boundary: bool = False
    keep_at_end: bool = False


@dataclass(frozen=True)
class Option:
    """One way to run a cNode: `time_us` (microseconds), `overhead` m_{k,o} (bytes above
    the memory after the node's outputs and phantom are allocated), `phantom` p_{j,o}
    (bytes a forward option keeps for its backward), `ops` the op sequence it runs."""

    time_us: int
    overhead: int
    phantom: int
    ops: tuple[str, ...]


@dataclass(frozen=True)
class CNode:
    """A cNode.  `reads`: value indices.  `pair`: for an H-cluster, the index of the
    partner node (forward <-> backward), -1 otherwise.  A paired forward node has one more
    option than its backward: the last, phantom-free one."""

    name: str
    is_backward: bool
    options: tuple[Option, ...]
    reads: tuple[int, ...]
    pair: int = -1


@dataclass(frozen=True)
class HGraph:
    nodes: tuple[CNode, ...]
    values: tuple[Value, ...]

    @property
    def boundary(self) -> int:
        """t_b: index of the first backward node (len(nodes) when there is none)."""
        return next((k for k, n in enumerate(self.nodes) if n.is_backward), len(self.nodes))


@dataclass(frozen=True)
class HSchedule:
    """Solved schedule: `steps` (node, option) in execution order, its `time_us`, the
    stage where the backward starts (index into steps), and the MILP result."""

    steps: tuple[tuple[int, int], ...]
    boundary_step: int
    time_us: int
    result: milp.MilpResult


class HILP:
    """The H-ILP model of `graph`, built once; `solve(peak, save)` for each budget pair."""

    def __init__(self, graph: HGraph):
        self.graph = graph
        self.T = len(graph.nodes)
        self.tb = graph.boundary
        self.problem = pulp.LpProblem("hilp", pulp.LpMinimize)
        self._readers: dict[int, list[int]] = defaultdict(list)
        for k, node in enumerate(graph.nodes):
            for d in node.reads:
                self._readers[d].append(k)
        self._made_by: dict[int, list[int]] = defaultdict(list)
        for d, value in enumerate(graph.values):
            self._made_by[value.producer].append(d)
        self._useful = self._useful_recomputations()
        self._variables()
        self._validity()
        self._memory()
        self.problem += pulp.lpSum(graph.nodes[k].options[o].time_us * var for (t, k, o), var in self.comp.items())

    # --- variables --------------------------------------------------------------

    def _possible(self, t: int, k: int) -> bool:
        """Can node k run in stage t?  NOTE: [Pruning]."""
        return k == t or (t >= self.tb and k in self._useful[t])

    def _useful_recomputations(self) -> dict[int, set[int]]:
        """For each backward stage t, the forward nodes that lead to what node t reads.

        NOTE: [Pruning] A recomputation in stage t that node t does not need (directly or
        through other recomputations) could run in the later stage that needs it, at the
        same cost and with no more memory held in between, so we only offer these.
        """
        g = self.graph
        useful: dict[int, set[int]] = defaultdict(set)
        for t in range(self.tb, self.T):
            node = g.nodes[t]
            todo = [g.values[d].producer for d in node.reads]
            if node.pair >= 0:
                todo.append(node.pair)
            while todo:
                k = todo.pop()
                if k in useful[t] or g.nodes[k].is_backward:
                    continue
                useful[t].add(k)
                todo.extend(g.values[d].producer for d in g.nodes[k].reads)
        return useful

    def _variables(self) -> None:
        g, T = self.graph, self.T
        self.comp: dict[tuple[int, int, int], pulp.LpVariable] = {}
        self.steps: dict[int, list[int]] = {}
        for t in range(T):
            self.steps[t] = [k for k in range(t + 1) if self._possible(t, k)]
            for k in self.steps[t]:
                for o in range(len(g.nodes[k].options)):
                    self.comp[t, k, o] = self._binary(f"C_{t}_{k}_{o}")
        self.alive: dict[tuple[int, int], pulp.LpVariable] = {}
        for d, value in enumerate(g.values):
            last = T if value.keep_at_end else self._last_need(d)
            for t in range(value.producer + 1, last + 1):
                self.alive[t, d] = self._binary(f"P_{t}_{d}")
        self.phantom: dict[tuple[int, int, int], pulp.LpVariable] = {}
        for j, node in enumerate(g.nodes):
            if not node.is_backward and node.pair >= 0:
                for t in range(j + 1, node.pair + 1):  # eq. 3.5; freed by B_j at stage pair
                    for o in range(len(node.options) - 1):
                        self.phantom[t, j, o] = self._binary(f"Sp_{t}_{j}_{o}")
        self.delete: dict[tuple[int, int, int], pulp.LpVariable] = {}
        self._delete_index: dict[tuple[int, int], list] = defaultdict(list)  # (t, k) -> deletes
        for d, value in enumerate(g.values):
            if value.keep_at_end:
                continue
            for k in [value.producer, *self._readers[d]]:
                for t in range(k, T):
                    if self._possible(t, k):
                        self.delete[t, k, d] = self._binary(f"D_{t}_{k}_{d}")
                        self._delete_index[t, k].append(((t, k, d), self.delete[t, k, d]))
            if d in self._boundary_frees:  # NOTE: [Freed at the boundary]
                key = (self.tb, self.tb, d)
                self.delete[key] = self._binary(f"D_{self.tb}_{self.tb}_{d}")
                self._delete_index[self.tb, self.tb].append((key, self.delete[key]))

    def _last_need(self, d: int) -> int:
        """The last stage that may read value d (or the boundary if it must be kept there).

        NOTE: [Pruning] After it, d is dead in every schedule: P is fixed to 0."""
        value = self.graph.values[d]
        last = value.producer
        for t in range(value.producer, self.T):
            if any(self._possible(t, k) for k in self._readers[d]):
                last = t
        if value.keep_at_boundary and last < self.tb:
            return self.T if self.tb == self.T else self.tb  # NOTE: [Freed at the boundary]
        return last

    @functools.cached_property
    def _boundary_frees(self) -> frozenset[int]:
        """Values kept to the boundary that no step at or after it reads: the first
        backward step may delete them.

        NOTE: [Freed at the boundary]
        A value read outside the graph between its forward and its backward (a block's
        output, which the next block reads) must be alive when the backward starts, and
        nothing reads it after: the one lowering deletes it after its last use, and
        Rockmate's replay (NOTE: [Option costs] in remat_dsl.solve.solvers.ilp.rockmate) frees it
        after the first backward step.  So the ILP may delete such a value right after the
        first backward step, as the replay does.  With deletions only after a step that
        makes or reads a value, the ILP would keep it to the end of the graph, counting a
        block's output through the block's whole backward where the replay, whose
        store-all peak sets the grid of (M_peak, M_save) budgets, does not: grid points
        would be infeasible (docs/measured-notes.md)."""
        tb, g = self.tb, self.graph
        if tb == self.T:
            return frozenset()
        return frozenset(
            d
            for d, v in enumerate(g.values)
            if v.keep_at_boundary and not v.keep_at_end and v.producer < tb
            and not any(self._possible(t, k) for k in self._readers[d] for t in range(tb, self.T))
        )  # fmt: skip

    def sum_comp(self, t: int, k: int):
        return pulp.lpSum(self.comp[t, k, o] for o in range(len(self.graph.nodes[k].options)) if (t, k, o) in self.comp)

    def _binary(self, name: str) -> pulp.LpVariable:
        return self.problem.add_variable(name, cat="Binary")

    def _p(self, t: int, d: int):
        return self.alive.get((t, d), 0)

    def _sp(self, t: int, j: int, o: int):
        return self.phantom.get((t, j, o), 0)

    # --- validity (eq. 3.4-3.26) ------------------------------------------------

    def _validity(self) -> None:
        g, prob = self.graph, self.problem
        for t in range(self.T):
            prob += self.sum_comp(t, t) == 1  # eq. 3.9
            for k in self.steps[t]:
                if k != t:
                    prob += self.sum_comp(t, k) <= 1  # eq. 3.15
                node = g.nodes[k]
                for d in node.reads:  # eq. 3.13
                    p = g.values[d].producer
                    made = self.sum_comp(t, p) if self._possible(t, p) and p < k else 0
                    prob += self.sum_comp(t, k) <= made + self._p(t, d)
                if node.is_backward and node.pair >= 0:  # eq. 3.19
                    j = node.pair
                    for o in range(len(node.options)):
                        fwd = self.comp.get((t, j, o), 0)
                        prob += self.comp[t, k, o] <= self._sp(t, j, o) + fwd
        self._phantoms()
        self._liveness()

    def _phantoms(self) -> None:
        g, prob = self.graph, self.problem
        for j, node in enumerate(g.nodes):
            if node.is_backward or node.pair < 0:
                continue
            b = node.pair
            for t in range(j, b + 1):
                if (t + 1, j, 0) in self.phantom:
                    prob += pulp.lpSum(self._sp(t + 1, j, o) for o in range(len(node.options) - 1)) <= 1  # eq. 3.16
                for o in range(len(node.options) - 1):
                    fwd = self.comp.get((t, j, o), 0)
                    bwd = self.comp.get((t, b, o), 0)
                    nxt = self._sp(t + 1, j, o)
                    prob += nxt <= self._sp(t, j, o) + fwd  # eq. 3.17
                    prob += nxt >= self._sp(t, j, o) + fwd - bwd  # eq. 3.18

    def _related(self, t: int, d: int) -> list[int]:
        """Steps of stage t that create or read value d, in order."""
        value = self.graph.values[d]
        steps = {k for k in {value.producer, *self._readers[d]} if self._possible(t, k)}
        if t == self.tb and d in self._boundary_frees:  # NOTE: [Freed at the boundary]
            steps.add(t)
        return sorted(steps)

    def _liveness(self) -> None:
        g, prob = self.graph, self.problem
        for d, value in enumerate(g.values):
            for t in range(value.producer, self.T):
                related = self._related(t, d)
                alive = self._p(t, d)
                for k in related:  # eq. 3.20, 3.21
                    if k == value.producer:
                        alive = alive + self.sum_comp(t, k)
                    if (t, k, d) in self.delete:
                        alive = alive - self.delete[t, k, d]
                        prob += self.delete[t, k, d] <= self.sum_comp(t, k)  # eq. 3.26
                        for later in related:
                            if later > k and later != value.producer:
                                prob += self.delete[t, k, d] + self.sum_comp(t, later) <= 1
                    prob += alive <= 1
                    prob += alive >= 0
                prob += self._p(t + 1, d) == alive  # eq. 3.24
        tb = self.tb
        for d, value in enumerate(g.values):
            if value.keep_at_boundary and value.producer < tb:
                prob += self.alive[tb, d] == 1
            if value.keep_at_end:
                prob += self.alive[self.T, d] == 1

    # --- memory (eq. 3.27-3.33, 2.18-2.19) -----------------------------------------

    def _memory(self) -> None:
        g, prob = self.graph, self.problem
        self.peak_rows: list[pulp.LpConstraint] = []
        for t in range(self.T):
            held = pulp.lpSum(g.values[d].size * self._p(t, d) for d in range(len(g.values)))
            held += pulp.lpSum(
                g.nodes[j].options[o].phantom * var for (tt, j, o), var in self.phantom.items() if tt == t
            )  # eq. 3.27
            before = self.problem.add_variable(f"U_{t}_start", lowBound=0)
            prob += before == held
            for k in self.steps[t]:
                node = g.nodes[k]
                made = pulp.lpSum(g.values[d].size for d in self._made_by[k]) * self.sum_comp(t, k)
                extra = pulp.lpSum(
                    (opt.phantom + opt.overhead) * self.comp[t, k, o] for o, opt in enumerate(node.options)
                )
                row = before + made + extra <= 0  # eq. 3.33, budget set by solve()
                prob += row
                self.peak_rows.append(row)
                change = made + self._phantom_change(t, k)
                change -= pulp.lpSum(g.values[d].size * var for (tt, kk, d), var in self._deletes_at(t, k))
                after = self.problem.add_variable(f"U_{t}_{k}", lowBound=0)
                prob += after == before + change  # eq. 3.31, 3.32
                before = after
        boundary = pulp.lpSum(g.values[d].size * self._p(self.tb, d) for d in range(len(g.values)))
        boundary += pulp.lpSum(
            g.nodes[j].options[o].phantom * var for (tt, j, o), var in self.phantom.items() if tt == self.tb
        )
        self.save_row = boundary <= 0  # eq. 2.19
        prob += self.save_row

    def _deletes_at(self, t: int, k: int):
        return self._delete_index.get((t, k), [])

    def _phantom_change(self, t: int, k: int):
        node = self.graph.nodes[k]
        if node.pair < 0:
            return 0
        if not node.is_backward:  # IF_k of eq. 3.28
            return pulp.lpSum(opt.phantom * self.comp[t, k, o] for o, opt in enumerate(node.options))
        j = node.pair  # IB_k of eq. 3.29: the phantom B_j consumes is freed
        fwd = self.graph.nodes[j]
        return -pulp.lpSum(
            fwd.options[o].phantom * (self.comp.get((t, j, o), 0) + self._sp(t, j, o) - self._sp(t + 1, j, o))
            for o in range(len(fwd.options) - 1)
        )

    # --- solving ------------------------------------------------------------------

    def solve(self, peak: int, save: int | None = None, time_limit: float | None = None) -> HSchedule | None:
        """The fastest schedule with every step at most `peak` bytes and at most `save`
        bytes alive at the boundary (None: no such bound).  None when infeasible or when
        the time limit passed before any solution."""
        for row in self.peak_rows:
            row.constant = -peak
        self.save_row.constant = -(save if save is not None else 2**62)
        rows = [*self.peak_rows, self.save_row]  # the only rows a solve changes (NOTE: [Model reuse] in milp)
        result = self.last_result = milp.solve(self.problem, time_limit, changed=rows)
        if not result.has_solution:
            return None
        steps: list[tuple[int, int]] = []
        boundary_step = None
        for t in range(self.T):
            if t == self.tb:
                boundary_step = len(steps)
            for k in self.steps[t]:
                for o in range(len(self.graph.nodes[k].options)):
                    if (self.comp[t, k, o].value() or 0) > 0.5:
                        steps.append((k, o))
        time_us = sum(self.graph.nodes[k].options[o].time_us for k, o in steps)
        return HSchedule(tuple(steps), len(steps) if boundary_step is None else boundary_step, time_us, result)


def ops_of(hg: HGraph, steps) -> tuple[str, ...]:
    """The op order of H-ILP schedule steps ((node, option) pairs): each option's ops."""
    order: list[str] = []
    for k, o in steps:
        order += hg.nodes[k].options[o].ops
    return tuple(order)


class TargetSolver(Solver):
    """A solver whose order comes from one H-ILP `model` solved at the target (bytes):
    `--solver checkmate` (one ILP over every op) and HiRemate's root.  Solves are
    remembered per target; `floor()` bisects the target between 0 and the exact peak of
    the store-all plan (FLOOR_STEPS solves), and `floor_targets()` are the feasible
    targets that bisection met, whose plans the driver compares for the smallest budget."""

    auto_rank: ClassVar[int | None] = None
    optimizes = True
    FLOOR_STEPS = 7

    def __init__(self, problem, model: HILP, order_of, name: str):
        self.problem, self.model, self._order_of, self.name = problem, model, order_of, name
        self.results: list[milp.MilpResult] = []
        self.seconds = 0.0
        self._solved: dict[int, tuple[str, ...] | None] = {}
        self._feasible: list[int] = []

    def _order(self, target: int) -> tuple[str, ...] | None:
        if target not in self._solved:
            start = time.perf_counter()
            schedule = self.model.solve(target, None, self.problem.time_limit)
            self.results.append(self.model.last_result)
            self.seconds += time.perf_counter() - start
            self._solved[target] = None if schedule is None else self._order_of(schedule)
        return self._solved[target]

    @property
    def info(self) -> SolverInfo:  # type: ignore[override]  # read-only: the driver only reads it
        status, gap = milp.status_of(self.results)
        return SolverInfo(Status(status), gap, self.seconds)

    def solve(self, target: int) -> SolverResult:
        order = self._order(target)
        if order is None:
            raise BudgetError(target, self.floor(), self.name)
        return SolverResult(order, self.info)

    @functools.cached_property
    def _floor(self) -> int:
        p = self.problem
        lo, hi = 0, simulated_peak(p.graph, autograd_order(p.graph), p.constraints, p.device)
        for _ in range(self.FLOOR_STEPS):
            mid = (lo + hi) // 2
            if self._order(mid) is None:
                lo = mid
            else:
                hi = mid
                self._feasible.append(mid)
        return hi

    def floor(self) -> int:
        return self._floor

    def floor_targets(self) -> list[int]:
        self.floor()
        return list(self._feasible)
