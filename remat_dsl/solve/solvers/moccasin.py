"""Moccasin: rematerialization as a constraint program over retention intervals.

Source: Bartan, Li, Teague, Lott, Dilkina, "Moccasin: Efficient Tensor
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

O(C n) interval variables, where Checkmate's ILP has O(n^2) Booleans.  Ours beyond cp.py:
an interval per output of a node (NOTE: [Tensor ends]), the saved RNG states
(NOTE: [RNG states]) in the "memory budget", redundant rows for CP-SAT's LP relaxation
(NOTE: [Stage memory]) and the default solver's plan as the first solution (NOTE: [Hints]).

NOTE: [Moccasin on an FB-graph]
Nodes are the FB-graph's ops (an edge u -> v when v reads an output of u, as in
remat_dsl.solve.solvers.twremat).  Our plans run every forward op once in the forward section, in
graph order, and every backward op exactly once (NOTE: [TW-Remat on an FB-graph]), so the
time axis is the stage axis of the reference implementation with Checkmate's pruning
(remat_dsl.solve.solvers.ilp.hilp, NOTE: [Pruning]): forward op f starts its first interval at
time f (f = 0..F-1); backward stage b (b = 0..B-1, backward ops in graph order) holds the
F + 1 times F + b (F + 1) + k: k = 0..F-1 a slot where forward op k may be recomputed,
k = F the backward op's own run.  Only forward ops get intervals 2..C (recomputations),
only in backward stages whose op needs them (directly or through other recomputations).
Memory (bytes) is what remat_dsl.check.replay counts (its NOTE: [Memory model]): each
output of an op over its own interval per run (NOTE: [Tensor ends]), except the pinned
ones (model outputs, parameter gradients: remat_dsl.plan.ir.pinned_tensors), which get one
interval from the op's first run to the end of the axis; its temp_bytes over [s, s + 1)
of each run; the RNG states of recomputed random ops (NOTE: [RNG states]).  Parameters,
inputs and tangents are counted by neither (the zeros of an absent tangent are in the
temp_bytes of the ops that read it: NOTE: [Gradient zeros] in remat_dsl.capture.fbgraph).
So the model's peak is the simulated peak of the order, the driver's first target fits,
and no solve is spent on NOTE: [Budget correction] (remat_dsl.solve.driver).  Should
a graph still differ, `offset` (NOTE: [Model offset]) lowers each target by what the
store-all order is simulated above the model, and the driver corrects the rest.
Outputs a `keep` line names are never recomputed; the one lowering applies the other
constraint lines (remat_dsl.plan.constraints).  The solution becomes an op order by
sorting present intervals by start: a forward op's first run is its compute, later ones
are recomputes.

NOTE: [Size limit]
CP-SAT proves little on a graph of a few hundred ops within minutes (gaps of a few
percent at half the autograd peak, tens of percent at tight budgets), so moccasin refuses
graphs of more than MAX_OPS ops: 310 takes GPT-2 with 4 layers (examples/gpt2.py).  A
solve starts from Rockmate's plan (NOTE: [Hints]) and the stage relaxation's bound
(NOTE: [Stage bound]), so where that plan fits the model it returns it or a faster one
within its time limit, with the gap in the header.  CP-SAT runs with its defaults (PARAMETERS
is empty, for measuring): each other search option measured gave a lower bound than the
defaults.  bench/optimality.py lifts the limit to measure larger graphs.  Measurements:
docs/measured-notes.md.

NOTE: [Tensor ends]
cp.py keeps a node's whole output until its last reader.  A node here is an op whose
outputs may die at different times (a dropout's output is read by the next op, its mask
by the backward; a layer norm's mean and rstd only by the backward), and the simulation
frees each output after its own last reader.  So each output T of a run has its own end
e_T^i <= e_v^i, its own interval [s_v^i, e_T^i) in the "memory budget", and the
"precedence constraint" also asks e_T^i > s_w for each output T the reader w reads.
With one end per op, the model's peak would differ from the simulated one by outputs
that die early, and solves would need budget corrections.

NOTE: [Hints]
CP-SAT starts from a complete solution hint (each variable's value): the fastest schedule
known that fits the capacity in the model, among earlier solutions and the driver's
Rockmate plans (the default solver's, fallbacks and budget correction included) at this
target, mapped onto the time axis (`_schedule`: a recomputation moves to its slot in the
first stage at or after it where it is useful; one in the forward section is left out),
each interval ending one past its last reader.  The number of intervals C of a solve is
at least that of the hint (Rockmate recomputes some GPT-2 ops five times at 30% of the
autograd peak).  So where Rockmate's plan fits the capacity, a solve returns it or a
faster one, and CP-SAT's time goes to improving it and to the bound.  The stage
relaxation's schedule (NOTE: [Stage bound]) is a hint too, often the fastest.  Without a fitting
hint (below Rockmate's smallest budget) CP-SAT searches from nothing.

NOTE: [Stage bound]
Each solve first runs the stage relaxation (remat_dsl.solve.solvers.stage_relaxation,
NOTE: [Stage relaxation]): a MILP over stage boundaries, solved by HiGHS within
`config.stage_share` of the time limit, whose optimum bounds the model's from below and whose
solution, once it fits the capacity, is a schedule of the model.  Its schedule joins the
hints; where the best hint is within GAP_OPTIMAL of its bound the solve ends there,
proven, without CP-SAT; else CP-SAT has the rest of the time, with the objective held at
or above the bound, and the gap is over the better bound.  A relaxation with no solution
proves that no schedule fits.  At tight budgets the relaxation's schedules may break the
capacity a little (its rows leave out inputs held for later recomputations:
NOTE: [Lazy slot rows]).  Its bound rises with time, so `stage_bound` gives the first
solve all of its time, to measure how far plans are from the optimum
(bench/optimality.py --bound-time).  Measurements: docs/measured-notes.md.

NOTE: [Honest CP status]
CP-SAT runs with `config.num_workers` workers and a fixed `config.random_seed`, so a solve that ends by
proof is deterministic; one stopped by its time limit (problem.time_limit, else
`config.time_limit` seconds) depends on the machine's speed and load.  The plan header says
`optimal` only when CP-SAT proved the optimum, else `feasible` with the gap
(objective - best bound) / objective from CP-SAT's own bound.

NOTE: [Deadline]
The time limit (problem.time_limit, else `config.time_limit` seconds) bounds the whole solve of a
target: building and solving the stage relaxation (at most `config.stage_share` of the limit),
the hints (Rockmate's plans), building the CP model, and CP-SAT, which gets what is left
(nothing when under a second is left).  The time limit is 570 s so that a command like
`remat plan examples/gpt2.py --budget 50% --solver moccasin` (capture and profiling take
seconds) ends within 10 minutes.  The first Rockmate plan of a target (its first hint) is
not cut: it is what makes a result when CP-SAT finds nothing.  Later hint rounds do not
start past the deadline, and the CP model is not built with under a second left, since
CP-SAT would not run.  So a solve ends within the limit, or within the relaxation's share
and one Rockmate plan, plus what began before the deadline (the CP model's build, the
lowering, the polish).  At limits of a few seconds CP-SAT gets little or no time, and
the plan is the hint's or the relaxation's.  The stage share is kept at half: other shares
changed the gap by less than two profiles differ by (docs/measured-notes.md).
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from remat_dsl.plan import ir
from remat_dsl.plan.constraints import matching
from remat_dsl.plan.errors import RematError
from remat_dsl.check.replay import rng_state_bytes
from remat_dsl.plan.ir import op_predecessors, op_uses, pinned_tensors
from remat_dsl.plan.liveness import live_intervals
from remat_dsl.plan.units import format_bytes
from remat_dsl.solve.api import (
    BudgetError,
    Decision,
    Problem,
    Solver,
    SolverInfo,
    SolverResult,
    Status,
    refuse_above,
    setting,
)

if TYPE_CHECKING:
    from remat_dsl.solve.solvers.stage_relaxation import MomentRelaxation, StageRelaxation

GAP_OPTIMAL = 1e-4  # a relative gap at most this is reported as optimal (as the MILPs do)
PARAMETERS: dict[str, object] = {}  # further CP-SAT parameters, for measuring (none kept: NOTE: [Size limit])


@dataclass(frozen=True)
class MoccasinConfig:
    """CP-SAT's settings, the time limit and the share of it each stage takes."""

    num_workers: int = setting(1, "CP-SAT workers: one, so that a proven solve is deterministic")
    random_seed: int = setting(0, "CP-SAT's random seed")
    time_limit: float = setting(
        570.0, "seconds per solve (relaxation, hints, CP-SAT) when --time-limit gives none (NOTE: [Deadline])"
    )
    hint_rounds: int = setting(6, "Rockmate targets tried for a hint that fits (NOTE: [Hints])")
    stage_share: float = setting(
        0.5, "share of a solve's time limit, at most, for the relaxation (NOTE: [Stage bound])"
    )
    relaxation_gap: float = setting(1e-4, "HiGHS's relative gap on the relaxations, of the whole time (as GAP_OPTIMAL)")
    slot_rounds: int = setting(4, "rounds of slot rows added where the relaxation broke the capacity (Lazy slot rows)")
    moments: int = setting(32, "backward moments with a memory row in moment_bound (NOTE: [Moment relaxation])")


def _gap(value: float, bound: float) -> float:
    """The relative gap of a schedule's time `value` over a proven lower `bound` (both
    microseconds), 0 when the bound meets it (or the time is 0)."""
    return max(0.0, (value - bound) / value) if value > 0 else 0.0


def _cp_model():
    try:
        from ortools.sat.python import cp_model
    except ImportError as error:  # pragma: no cover - ortools is a dependency
        raise RematError(
            "error: the moccasin solver needs OR-Tools (CP-SAT)", hint="pip install 'ortools>=9.15'"
        ) from error
    return cp_model


class Moccasin(Solver):
    """`--solver moccasin`: the CP model of Moccasin (see the module docstring) over the
    whole FB-graph, solved by CP-SAT at the target (bytes), minimizing the predicted time
    (microseconds).  `intervals`: the least C, retention intervals per forward op (C - 1
    recomputations); a solve takes more when its hint needs them (NOTE: [Hints]).
    Refused above MAX_OPS ops (RematError); never picked by `auto`."""

    name = "moccasin"
    auto_rank = None
    optimizes = True
    MAX_OPS = 310  # measured: NOTE: [Size limit]
    intervals = 2
    Config = MoccasinConfig

    def __init__(self, problem: Problem, config: MoccasinConfig | None = None):
        self.config = config or MoccasinConfig()
        graph = problem.graph
        refuse_above(
            graph, self.MAX_OPS, self.name, "one constraint program",
            hint="use --solver twremat (any size) or --solver hiremate, which solve small pieces",
        )  # fmt: skip
        self.problem = problem
        self.ops = graph.ops
        self.index = {op.name: i for i, op in enumerate(self.ops)}
        self.preds = op_predecessors(graph)
        sizes = graph.nbytes
        pinned = pinned_tensors(graph)
        self.free_bytes = [sum(sizes[t] for t in op.outputs if t not in pinned) for op in self.ops]
        self.pinned_bytes = [sum(sizes[t] for t in op.outputs if t in pinned) for op in self.ops]
        # NOTE: [Tensor ends] each output of an op has its own end
        self.outs = [[(t, sizes[t]) for t in op.outputs if t not in pinned and sizes[t]] for op in self.ops]
        self.reads = [set(op_uses(op, sizes)) for op in self.ops]
        self.rng_bytes = rng_state_bytes(problem.device)  # NOTE: [RNG states]
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
        self._schedules: list[tuple[int, int, dict[int, list[int]]]] = []  # (peak, time_us, runs): NOTE: [Hints]
        self._rockmate = None  # a Planner for Rockmate's plans: NOTE: [Hints]
        self._rockmate_capacities: set[int] = set()
        self._floor_proven = False
        self.used_intervals = self.intervals
        self._stage: StageRelaxation | None = None  # NOTE: [Stage bound], built on first use
        self._moments: dict[int, MomentRelaxation] = {}  # NOTE: [Moment relaxation]

    def describe(self) -> str:
        return f"ops={len(self.ops)} intervals={self.used_intervals}"

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

    def _model(self, capacity: int | None, intervals: int):
        """The CP model at `capacity` (scaled bytes; None: the capacity is a variable
        to minimize) with `intervals` retention intervals per forward op.  Returns
        (model, cp_model, variables, objective, peak); `variables` holds every variable
        by kind (starts, ends, tensor ends, presences, lengths, precedence Booleans, stage
        rows' Booleans, RNG state ends), for the hints (NOTE: [Hints])."""
        cp_model = _cp_model()
        model = cp_model.CpModel()
        unit = self._unit()
        total = (sum(self.free_bytes) + sum(self.pinned_bytes) + sum(op.temp_bytes for op in self.ops)) // unit
        H, F = self.horizon, len(self.forward)
        starts: dict[int, list] = {}
        ends: dict[int, list] = {}
        present: dict[int, list] = {}
        tensor_ends: dict[int, list] = {}  # NOTE: [Tensor ends]: [interval][output]
        rng: dict[int, tuple] = {}  # NOTE: [RNG states]: (end, length)
        lengths: dict[tuple[int, int, int], object] = {}
        cumulative, heights = [], []
        for v, op in enumerate(self.ops):
            s0 = self.first_start(v)
            starts[v], ends[v], present[v] = [s0], [model.new_int_var(s0 + 1, H, f"e_{v}_0")], [True]
            stages = self.useful.get(v, []) if v in self.slot else []
            for i in range(1, intervals if stages else 1):  # "valid interval": recomputations, backward stages only
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
            tensor_ends[v] = []
            for i in range(len(starts[v])):
                s, e, a = starts[v][i], ends[v][i], present[v][i]
                tensor_ends[v].append([])
                for k, (_, nbytes) in enumerate(self.outs[v]):
                    if len(self.outs[v]) == 1:
                        end = e
                    else:
                        end = model.new_int_var(s0 + 1 if i == 0 else e.proto.domain[0], H, f"e_{v}_{i}_{k}")
                        model.add(end <= e)
                    tensor_ends[v][i].append(end)
                    length = lengths[v, i, k] = model.new_int_var(1, H, f"l_{v}_{i}_{k}")
                    interval = (
                        model.new_interval_var(s, length, end, f"I_{v}_{i}_{k}")
                        if a is True
                        else model.new_optional_interval_var(s, length, end, a, f"I_{v}_{i}_{k}")
                    )
                    cumulative.append(interval)
                    heights.append(nbytes // unit)
                if op.temp_bytes:
                    run = (
                        model.new_fixed_size_interval_var(s, 1, f"T_{v}_{i}")
                        if a is True
                        else model.new_optional_fixed_size_interval_var(s, 1, a, f"T_{v}_{i}")
                    )
                    cumulative.append(run)
                    heights.append(op.temp_bytes // unit)
            if op.random and self.rng_bytes and len(starts[v]) > 1:
                states, rng[v] = self._rng_states(model, starts[v], present[v], H)
                cumulative += states
                heights += [self.rng_bytes // unit] * len(states)
            if self.pinned_bytes[v]:
                cumulative.append(model.new_fixed_size_interval_var(s0, H - s0, f"P_{v}"))
                heights.append(self.pinned_bytes[v] // unit)
        choices = self._precedence(model, starts, ends, present, tensor_ends)
        peak = model.new_int_var(0, total, "peak") if capacity is None else capacity
        model.add_cumulative(cumulative, heights, peak)  # "memory budget"
        stage_memory = self._stage_memory(model, starts, tensor_ends, present, peak, unit)
        recompute = [
            (self.ops[v].time_us, a) for v in present for a in present[v] if a is not True and self.ops[v].time_us
        ]
        objective = sum(op.time_us for op in self.ops) + sum(t * a for t, a in recompute)  # "min_runtime"
        variables = {
            "starts": starts, "ends": ends, "tensor_ends": tensor_ends, "present": present, "lengths": lengths,
            "choices": choices, "stage_memory": stage_memory, "rng": rng,
        }  # fmt: skip
        return model, cp_model, variables, objective, peak

    def _rng_states(self, model, starts, present, H: int) -> tuple[list, tuple]:
        """NOTE: [RNG states] A random op that is recomputed saves its RNG state at its
        first run and frees it after its last recomputation, and sets the generator's
        state aside while it is recomputed (NOTE: [Memory model] in
        remat_dsl.check.replay): an interval from s^0 to past the last present s^i, and
        one step at each present recomputation.  Returns the intervals (height: one
        state each) and the end and length variables (for the hints)."""
        s0 = starts[0]
        end = model.new_int_var(s0 + 1, H, f"rng_end_{s0}")
        for s, a in zip(starts[1:], present[1:]):
            model.add(end >= s + 1).only_enforce_if(a)
        length = model.new_int_var(1, H, f"rng_length_{s0}")
        states = [model.new_optional_interval_var(s0, length, end, present[1], f"rng_{s0}")]
        for i, (s, a) in enumerate(zip(starts[1:], present[1:])):
            states.append(model.new_optional_fixed_size_interval_var(s, 1, a, f"rng_aside_{s0}_{i}"))
        return states, (end, length)

    def _stage_memory(self, model, starts, tensor_ends, present, peak, unit: int) -> dict:
        """NOTE: [Stage memory] Redundant rows, implied by the "memory budget" and the
        "precedence constraint" (paper section 3), that let CP-SAT's LP relaxation see
        memory: the cumulative alone gives it no bound above the no-recompute time.  At
        the run of backward op b (time t_b) these are resident: b's inputs, outputs and
        temporaries; every backward output read after stage b; the pinned
        outputs made by then; and each output T of a forward op u that a backward op
        reads after stage b, by whichever interval of u serves that reader: either one
        covers t_b (Booleans k_Tb = [e_T^0 > t_b] for the first, j_Tb^i = [a_u^i,
        s_u^i <= t_b < e_T^i] for a recomputation), or a recomputation starts after t_b
        (r_ub^i = [a_u^i, s_u^i > t_b]).  So k_Tb + sum_i (j_Tb^i + r_ub^i) >= 1,
        j_Tb^i + r_ub^i <= a_u^i, and sum_T bytes_T (k_Tb + sum_i j_Tb^i) <= capacity -
        the rest.  A solution of the model satisfies them with each Boolean at its true
        value; they leave out what else may be resident (inputs of recomputations), so
        they only relax.  Returns the Booleans by (name, u, i, output k, t_b)."""
        booleans: dict[tuple[str, int, int, int | None, int], Any] = {}
        steps = [(self.reads[v], self.ops[v].outputs) for v in self.backward]  # stage b: backward op b
        made_forward = [t for v in self.forward for t in self.ops[v].outputs]
        last_reader = {  # output -> the last backward stage that reads it (NOTE: [Liveness])
            iv.tensor: iv.last_read for iv in live_intervals(steps, resident=made_forward) if iv.last_read is not None
        }
        for b, w in enumerate(self.backward):
            t = self.first_start(w)
            fixed = sum(n for _, n in self.outs[w]) + self.ops[w].temp_bytes
            fixed += sum(self.pinned_bytes[v] for v in range(len(self.ops)) if self.first_start(v) <= t)
            fixed += sum(n for v in self.preds[w] for name, n in self.outs[v] if name in self.reads[w])
            fixed += sum(
                n
                for v in self.backward[:b]
                for name, n in self.outs[v]
                if name not in self.reads[w] and last_reader.get(name, -1) > b
            )
            terms = []
            for u in self.forward:
                later = [
                    (k, n)
                    for k, (name, n) in enumerate(self.outs[u])
                    if name not in self.reads[w] and last_reader.get(name, -1) > b
                ]
                if not later:
                    continue
                after = []
                for i in range(1, len(starts[u])):
                    r = booleans["r", u, i, None, t] = model.new_bool_var(f"r_{u}_{i}_{b}")
                    model.add(starts[u][i] >= t + 1).only_enforce_if(r)
                    after.append(r)
                for k, n in later:
                    x = booleans["k", u, 0, k, t] = model.new_bool_var(f"k_{u}_{k}_{b}")
                    model.add(tensor_ends[u][0][k] >= t + 1).only_enforce_if(x)
                    serving, resident = [x, *after], [x]
                    for i in range(1, len(starts[u])):
                        j = booleans["j", u, i, k, t] = model.new_bool_var(f"j_{u}_{i}_{k}_{b}")
                        model.add(starts[u][i] <= t).only_enforce_if(j)
                        model.add(tensor_ends[u][i][k] >= t + 1).only_enforce_if(j)
                        model.add(j + after[i - 1] <= present[u][i])
                        serving.append(j)
                        resident.append(j)
                    model.add_bool_or(serving)
                    terms += [(n // unit, y) for y in resident]
            if terms:
                model.add(sum(c * y for c, y in terms) + fixed // unit <= peak)
        return booleans

    def _precedence(self, model, starts, ends, present, tensor_ends) -> dict:
        """The "precedence constraint": each present interval of v lies within a present interval of each
        input u, from after u's run to past v's run.  u's first interval always starts
        before v's runs (graph order); a later one (a recomputation) only when chosen.
        Returns the Booleans x_uv^ij by (u, i, v, j)."""
        choices = {}
        for v in range(len(self.ops)):
            for j, sv in enumerate(starts[v]):
                av = present[v][j]
                for u in self.preds[v]:
                    if len(starts[u]) == 1:
                        for end in [ends[u][0], *self._read_ends(tensor_ends, u, 0, v)]:
                            row = model.add(end >= sv + 1)
                            if av is not True:
                                row.only_enforce_if(av)
                        continue
                    for i, su in enumerate(starts[u]):
                        x = model.new_bool_var(f"x_{u}_{i}_{v}_{j}")
                        if i:
                            model.add_implication(x, present[u][i])
                            model.add(su + 1 <= sv).only_enforce_if(x)
                        for end in [ends[u][i], *self._read_ends(tensor_ends, u, i, v)]:
                            model.add(end >= sv + 1).only_enforce_if(x)
                        choices[u, i, v, j] = x
                    row = model.add_bool_or([choices[u, i, v, j] for i in range(len(starts[u]))])
                    if av is not True:
                        row.only_enforce_if(av)
        return choices

    def _read_ends(self, tensor_ends, u, i, v) -> list:
        """NOTE: [Tensor ends] The ends of the outputs of u's interval i that v reads,
        when u has more than one (else the interval's own end is the output's)."""
        if len(self.outs[u]) < 2:
            return []
        return [end for (t, _), end in zip(self.outs[u], tensor_ends[u][i]) if t in self.reads[v]]

    def _run(self, model, cp_model, time_limit: float | None = None, bound: int | None = None):
        """Solve `model` with CP-SAT within `time_limit` seconds (default: the problem's,
        else `config.time_limit`).  Returns (solver, (status, gap) or None); the gap is over the
        better of CP-SAT's bound and `bound` (microseconds, NOTE: [Stage bound])."""
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = self.config.num_workers
        solver.parameters.random_seed = self.config.random_seed
        solver.parameters.max_time_in_seconds = max(
            1.0, time_limit or float(self.problem.time_limit or self.config.time_limit)
        )
        for key, value in PARAMETERS.items():
            setattr(solver.parameters, key, value)
        start = time.perf_counter()
        code = solver.solve(model)
        self.seconds += time.perf_counter() - start
        if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return solver, None
        if code == cp_model.OPTIMAL:
            return solver, (Status.OPTIMAL, 0.0)
        gap = _gap(solver.objective_value, max(solver.best_objective_bound, bound or 0))
        return solver, (Status.OPTIMAL if gap <= GAP_OPTIMAL else Status.FEASIBLE, gap)

    # --- schedules: an order on the time axis (NOTE: [Hints]) ---------------------------

    def _schedule(self, order) -> dict[int, list[int]]:
        """Op -> the sorted times of its runs, for an op order (any solver's): each op's
        first run at its own time; a forward op's later run, in the backward, at its slot
        of the first stage at or after it where it is useful (the only times the model
        has, NOTE: [Pruning]; its inputs are then held longer, which `_peak` counts); a
        recomputation in the forward section, or one that no later stage needs, is left
        out (the output of the run before is then held longer).  NOTE: [Hints]"""
        names = [self.index[name] for name in order]
        stage: int | None = None
        stages: list[int | None] = [None] * len(names)
        for k in range(len(names) - 1, -1, -1):  # the backward stage each run precedes
            if names[k] not in self.slot:
                stage = self.backward.index(names[k])
            stages[k] = stage
        F = len(self.forward)
        runs: dict[int, list[int]] = {v: [] for v in range(len(self.ops))}
        for k, v in enumerate(names):
            if not runs[v]:
                runs[v].append(self.first_start(v))
                continue
            at_stage = stages[k]
            later = [b for b in self.useful.get(v, []) if at_stage is not None and b >= at_stage]
            if later and F + later[0] * (F + 1) + self.slot[v] not in runs[v]:
                runs[v].append(F + later[0] * (F + 1) + self.slot[v])
        for times in runs.values():
            times.sort()
        return runs

    def _ends(self, runs):
        """The earliest end of each run's interval, and of each of its outputs: one past
        the last reader's run (a reader uses the latest run of its input before it).
        Returns (ends[v][i], tensor ends[v][i][k])."""
        ends = {v: [s + 1 for s in times] for v, times in runs.items()}
        tensor_ends = {v: [[s + 1] * len(self.outs[v]) for s in times] for v, times in runs.items()}
        for v, times in runs.items():
            for t in times:
                for u in self.preds[v]:
                    i = max(i for i, s in enumerate(runs[u]) if s < t)
                    ends[u][i] = max(ends[u][i], t + 1)
                    for k, (name, _) in enumerate(self.outs[u]):
                        if name in self.reads[v]:
                            tensor_ends[u][i][k] = max(tensor_ends[u][i][k], t + 1)
        return ends, tensor_ends

    def profile(self, runs) -> list[int]:
        """The bytes alive at each time of the axis in schedule `runs` (op -> sorted times),
        in the model's memory (the "memory budget")."""
        (_, tensor_ends), H = self._ends(runs), self.horizon
        change = [0] * (H + 2)
        for v, times in runs.items():
            for s, out_ends in zip(times, tensor_ends[v]):
                change[s] += self.ops[v].temp_bytes
                change[s + 1] -= self.ops[v].temp_bytes
                for (_, nbytes), e in zip(self.outs[v], out_ends):
                    change[s] += nbytes
                    change[e] -= nbytes
            change[times[0]] += self.pinned_bytes[v]
            if self.ops[v].random and len(times) > 1:  # NOTE: [RNG states]
                change[times[0]] += self.rng_bytes
                change[times[-1] + 1] -= self.rng_bytes
                for s in times[1:]:
                    change[s] += self.rng_bytes
                    change[s + 1] -= self.rng_bytes
        live, profile = 0, []
        for delta in change:
            live += delta
            profile.append(live)
        return profile

    def _peak(self, runs) -> int:
        """The schedule's peak (bytes) in the model's memory (the "memory budget")."""
        return max(self.profile(runs))

    def _time(self, runs) -> int:
        """The schedule's time (microseconds): each run of each op."""
        return sum(self.ops[v].time_us * len(times) for v, times in runs.items())

    def _incumbent(self, capacity: int, deadline: float | None = None):
        """The fastest schedule known that fits `capacity` bytes of the model (earlier
        solutions, Rockmate's plans at this capacity), or None (NOTE: [Hints]).  No
        Rockmate plan after the first starts past `deadline` (time.perf_counter() seconds;
        NOTE: [Deadline])."""
        if capacity not in self._rockmate_capacities:
            self._rockmate_schedules(capacity, deadline)
        fitting = [(time_us, runs) for peak, time_us, runs in self._schedules if peak <= capacity]
        return min(fitting, key=lambda item: item[0])[1] if fitting else None

    def _planner(self):
        """A Planner of our own, for Rockmate's plans (the default solver's)."""
        if self._rockmate is None:
            from remat_dsl.solve.driver import Planner

            p = self.problem
            self._rockmate = Planner(p.graph, device=p.device, constraints=p.constraints, time_limit=p.time_limit)
        return self._rockmate

    def _rockmate_schedules(self, capacity: int, deadline: float | None = None) -> None:
        """The driver's Rockmate plans (its fallbacks and budget correction included) at
        budget `capacity` + offset, then lowered by the mapped schedule's excess in the
        model until one fits (at most `config.hint_rounds` plans, and none after the first once
        time.perf_counter() passes `deadline`), kept as schedules."""
        self._rockmate_capacities.add(capacity)
        budget = capacity + self.offset
        for attempt in range(self.config.hint_rounds):
            if attempt and deadline is not None and time.perf_counter() >= deadline:
                return  # NOTE: [Deadline]
            try:
                plan = self._planner().plan(budget, "rockmate")
            except RematError:
                return
            order = [i.target for i in plan.forward + plan.backward if i.runs_op]
            runs = self._schedule(order)
            peak = self._peak(runs)
            self._schedules.append((peak, self._time(runs), runs))
            if peak <= capacity:
                return
            budget -= max(peak - capacity, capacity // 100)

    def _hint(self, model, variables, runs, peak=None) -> None:
        """Every variable's value in schedule `runs`, as CP-SAT's solution hint."""
        hints = []
        ends, tensor_ends = self._ends(runs)
        present = variables["present"]
        for v, times in runs.items():
            for i, s in enumerate(variables["starts"][v]):
                outs = range(len(variables["tensor_ends"][v][i]))
                if i >= len(times):  # an absent interval: its smallest values
                    low = s.proto.domain[0]
                    hints += [(s, low), (variables["ends"][v][i], low + 1), (present[v][i], 0)]
                    hints += [(variables["lengths"][v, i, k], 1) for k in outs]
                    hints += [(e, low + 1) for e in variables["tensor_ends"][v][i] if e is not variables["ends"][v][i]]
                    continue
                if i:
                    hints += [(s, times[i]), (present[v][i], 1)]
                hints.append((variables["ends"][v][i], ends[v][i]))
                for k in outs:
                    e = variables["tensor_ends"][v][i][k]
                    value = ends[v][i] if e is variables["ends"][v][i] else tensor_ends[v][i][k]
                    if e is not variables["ends"][v][i]:
                        hints.append((e, value))
                    hints.append((variables["lengths"][v, i, k], value - times[i]))
        for (u, i, v, j), x in variables["choices"].items():
            serving = j < len(runs[v]) and i == max(k for k, s in enumerate(runs[u]) if s < runs[v][j])
            hints.append((x, int(serving)))
        for (name, u, i, k, t), x in variables["stage_memory"].items():  # NOTE: [Stage memory]
            if i >= len(runs[u]):
                value = False
            elif name == "r":
                value = runs[u][i] > t
            else:
                value = runs[u][i] <= t < tensor_ends[u][i][k]
            hints.append((x, int(value)))
        for v, (end, length) in variables["rng"].items():  # NOTE: [RNG states]
            last = runs[v][-1] + 1 if len(runs[v]) > 1 else runs[v][0] + 1
            hints += [(end, last), (length, last - runs[v][0])]
        if peak is not None:
            hints.append((peak, self._peak(runs) // self._unit()))
        for var, value in hints:
            model.add_hint(var, value)

    def _solution(self, solver, variables) -> dict[int, list[int]]:
        """The solution's schedule: the times of its present intervals."""
        runs = {}
        for v, starts in variables["starts"].items():
            present = variables["present"][v]
            runs[v] = sorted(
                s if isinstance(s, int) else solver.value(s)
                for s, a in zip(starts, present)
                if a is True or solver.boolean_value(a)
            )
        return runs

    def _order(self, runs) -> tuple[str, ...]:
        """The op order of a schedule: runs sorted by time."""
        return tuple(self.ops[v].name for _, v in sorted((t, v) for v, times in runs.items() for t in times))

    # --- the solver interface ----------------------------------------------------------

    @functools.cached_property
    def offset(self) -> int:
        """NOTE: [Model offset] Bytes the exact simulation counts above the model's peak
        for the store-all order; each solve plans within its target less this.  0 where
        the model counts what the simulation counts (NOTE: [Moccasin on an FB-graph]:
        measured on GPT-2 and tiny_cnn); a safeguard should a graph hold something the
        model leaves out, so that its plans fit at the first try."""
        from remat_dsl.solve.lowering import autograd_order, lowered_plan

        order = autograd_order(self.problem.graph)
        simulated = lowered_plan(self.problem.graph, order, device=self.problem.device).header.peak_bytes
        return max(0, simulated - self._peak(self._schedule(order)))

    def _solve(self, target: int):
        """(order, time_us, status, gap) of the fastest order at `target` bytes, or None."""
        if target in self._solved:
            return self._solved[target]
        report = self.problem.report
        if report:
            report(f"moccasin: stage relaxation (HiGHS), CP-SAT at {format_bytes(target)} over {len(self.ops)} ops")
        if self._floor_proven and target < self.floor():
            self._solved[target] = None
            return None
        limit = float(self.problem.time_limit or self.config.time_limit)
        deadline = time.perf_counter() + limit  # NOTE: [Deadline]
        capacity = max(target - self.offset, 0) // self._unit()
        relaxation = self._stage_relaxation()
        first = len(relaxation.results)
        stage = relaxation.solve(capacity * self._unit(), limit * self.config.stage_share)  # NOTE: [Stage bound]
        stage_seconds = sum(r.seconds for r in relaxation.results[first:])
        self.seconds += stage_seconds
        if stage.infeasible:
            self._solved[target] = None
            return None
        if stage.runs is not None:
            self._schedules.append((self._peak(stage.runs), self._time(stage.runs), stage.runs))
        incumbent = self._incumbent(capacity * self._unit(), deadline)
        if incumbent is not None and stage.bound is not None:
            gap = _gap(self._time(incumbent), stage.bound)
            if gap <= GAP_OPTIMAL:  # proven by the relaxation: CP-SAT has nothing to add
                self._status.append((Status.OPTIMAL, gap))
                self._solved[target] = (self._order(incumbent), self._time(incumbent), Status.OPTIMAL, gap)
                return self._solved[target]
        solver, status = None, None
        if deadline - time.perf_counter() >= 1:  # NOTE: [Deadline]: else no CP-SAT, so no CP model
            hint = incumbent or stage.closest  # a schedule that breaks the capacity still guides CP-SAT
            intervals = max([self.intervals, *(len(t) for t in hint.values())] if hint else [self.intervals])
            self.used_intervals = max(self.used_intervals, intervals)
            model, cp_model, variables, objective, _ = self._model(capacity, intervals)
            model.minimize(objective)  # "min_runtime"
            if stage.bound is not None:
                model.add(objective >= stage.bound)  # proven (NOTE: [Stage bound]): lets CP-SAT stop there
            if hint:
                self._hint(model, variables, hint)
            left = deadline - time.perf_counter()
            if left >= 1:
                solver, status = self._run(model, cp_model, left, stage.bound)
        result = None
        if status is not None:
            runs = self._solution(solver, variables)
            if incumbent is not None and self._time(incumbent) < self._time(runs):  # CP-SAT stopped above its hint
                bound = self._time(runs) * (1 - status[1])
                runs, status = incumbent, (Status.FEASIBLE, _gap(self._time(incumbent), bound))
            result = (self._order(runs), self._time(runs), *status)
            self._status.append(status)
            self._schedules.append((self._peak(runs), self._time(runs), runs))
        elif incumbent is not None:  # CP-SAT found nothing in the time left: the best hint, with the relaxation's gap
            hint_gap = None if stage.bound is None else _gap(self._time(incumbent), stage.bound)
            result = (self._order(incumbent), self._time(incumbent), Status.FEASIBLE, hint_gap)
            self._status.append((Status.FEASIBLE, hint_gap))
        self._solved[target] = result
        return result

    def stage_bound(self, target: int, time_limit: float) -> int | None:
        """A proven lower bound (microseconds) on the predicted time of every schedule of
        the model whose peak is at most `target` bytes: the stage relaxation's first
        solve (NOTE: [Stage relaxation], with the slot rows earlier solves added: NOTE:
        [Lazy slot rows]), given all of `time_limit` seconds: HiGHS's dual bound.  None
        when HiGHS proved no bound in time or no schedule fits `target` (remat_dsl.solve.api.BudgetError names the
        smallest budget then).  For measuring how far plans are from the optimum
        (bench/optimality.py --bound-time): a solve (`solve`) gives the relaxation at
        most `config.stage_share` of its time, split between rounds, and CP-SAT the rest."""
        relaxation = self._stage_relaxation()
        first = len(relaxation.results)
        bound = relaxation.first_bound(max(target - self.offset, 0) // self._unit() * self._unit(), time_limit)
        self.seconds += sum(r.seconds for r in relaxation.results[first:])
        return bound

    def moment_bound(self, target: int, time_limit: float | None, moments: int | None = None) -> int | None:
        """A proven lower bound (microseconds) on the predicted time of every schedule of
        the model whose peak is at most `target` bytes, from the moment relaxation (NOTE:
        [Moment relaxation] in remat_dsl.solve.solvers.stage_relaxation) with `moments` backward
        moments (default `config.moments`), HiGHS's dual bound after at most `time_limit`
        seconds.  None when HiGHS proved no bound in time or no schedule fits `target`.
        For graphs whose stage relaxation is not bounded in minutes (bench/decoder.py
        --bound, bench/optimality.py --moment-time); not used by `solve`."""
        from remat_dsl.solve.solvers.stage_relaxation import MomentRelaxation

        moments = self.config.moments if moments is None else moments
        if moments not in self._moments:
            self._moments[moments] = MomentRelaxation(self, moments, self.config.relaxation_gap)
        relaxation = self._moments[moments]
        result = relaxation.bound(max(target - self.offset, 0) // self._unit() * self._unit(), time_limit)
        self.seconds += relaxation.results[-1].seconds
        return result.bound

    def _stage_relaxation(self):
        """The MILP of NOTE: [Stage bound], built on first use."""
        if self._stage is None:
            from remat_dsl.solve.solvers.stage_relaxation import StageRelaxation

            self._stage = StageRelaxation(self, self.config.relaxation_gap, self.config.slot_rounds)
        return self._stage

    def _unit(self) -> int:
        demands = [n for outs in self.outs for _, n in outs] + self.pinned_bytes
        demands += [op.temp_bytes for op in self.ops] + [self.rng_bytes]
        return functools.reduce(math.gcd, [d for d in demands if d], 0) or 1

    @functools.cached_property
    def _floor(self) -> int:
        """The smallest target (bytes) of the model: CP-SAT minimizing the capacity,
        from the smallest-peak schedule known, Rockmate's at its smallest budget among
        them (NOTE: [Hints])."""
        try:
            self._rockmate_schedules(self._planner().smallest_budget("rockmate") - self.offset)
        except RematError:
            pass
        known = min(self._schedules, key=lambda item: item[0])[2] if self._schedules else None
        intervals = max([self.intervals, *(len(t) for t in known.values())] if known else [self.intervals])
        self.used_intervals = max(self.used_intervals, intervals)
        model, cp_model, variables, _, peak = self._model(None, intervals)
        model.minimize(peak)
        if known:
            self._hint(model, variables, known, peak)
        solver, status = self._run(model, cp_model)
        if status is None:
            raise RematError("error: moccasin found no schedule within its time limit", hint="raise --time-limit")
        self._floor_proven = status[0] == Status.OPTIMAL
        runs = self._solution(solver, variables)
        self._schedules.append((self._peak(runs), self._time(runs), runs))
        return int(solver.value(peak)) * self._unit() + self.offset

    def floor(self) -> int:
        """The smallest target (bytes) with a schedule in the model: the least of the
        peak-minimizing solve's result (a proven minimum when CP-SAT proved it within the
        time limit) and the targets solved so far."""
        solved = [target for target, result in self._solved.items() if result is not None]
        return min([self._floor, *solved])

    def floor_targets(self) -> list[int]:
        return [self.floor()]

    @property
    def info(self) -> SolverInfo:  # type: ignore[override]  # read-only: the driver only reads it
        if not self._status:
            return SolverInfo(Status.OPTIMAL, None, self.seconds)
        feasible = [gap for status, gap in self._status if status != Status.OPTIMAL]
        if feasible:  # a gap of None: no bound was proven for that solve
            gaps = [gap for gap in feasible if gap is not None]
            return SolverInfo(Status.FEASIBLE, None if len(gaps) < len(feasible) else max(gaps), self.seconds)
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
