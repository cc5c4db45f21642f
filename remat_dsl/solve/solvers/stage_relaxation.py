"""The stage and moment relaxations: MILPs over stage boundaries whose optima bound Moccasin's from below.

Moccasin's model (remat_dsl.solve.solvers.moccasin, NOTE: [Moccasin on an FB-graph]) runs every
forward op once, in graph order, and backward op b once at time t_b, after a stage of
slots where forward ops may be recomputed, in graph order.  CP-SAT proves little about it
on a few hundred ops (NOTE: [Size limit] there).  This MILP keeps the same decisions and
counts memory at fewer moments, each exactly or from below, so that every schedule of the
model is a solution of it with the same time: its optimum, or HiGHS's dual bound, is a
proven lower bound on the model's optimum.  It is RK-Checkmate's ILP (Zhao, PhD thesis
"Optimizing Memory Usage when Training Deep Neural Networks", 2024, section 2.4, eq.
2.3-2.19) with the pruning of remat_dsl.solve.solvers.ilp.hilp (NOTE: [Pruning]) and without the
per-step alive and delete variables of section 2.4.3 (eq. 2.13-2.17), which make up most
of that ILP: without them the model is a fraction of hilp's size and HiGHS finds
solutions where hilp's model gives none in minutes (docs/measured-notes.md).

NOTE: [Stage relaxation]
Variables (binary), for each forward output T (made by forward op u(T)) and each
backward stage b (b = -1: the end of the forward) up to the last stage that may need T
(one whose backward op reads T, or where an op reading T may be recomputed):
* y_{T,b} = T resident at time t_b (the thesis's S_{t,e}, taken at t_b instead of at
  the stage's start);
* r_{u,b} = forward op u recomputed in stage b (the thesis's R_{t,k}), only where
  Moccasin's model offers it (u leads to what backward op b reads: Moccasin.useful).
Constraints, each implied by the model (a resident tensor is one copy, alive over one
interval from its run):
* read: y_{T,b} = 1 when backward op b reads T;
* keep: y_{T,b} <= y_{T,b-1} + r_{u(T),b} (a copy alive at t_b was made in stage b or
  was alive at t_{b-1}; eq. 2.7);
* recompute: r_{u,b} <= y_{T',b-1} + r_{u(T'),b} for each forward input T' of u (eq. 2.8);
* memory at each forward op's run (exact: no recomputation in the forward), at each t_b,
  and at each slot k of stage b where something may be recomputed, counting at slot k:
  T with u(T) at or before slot k and y_{T,b} = 1 (its copy alive at t_b was made by
  slot k); T with u(T) after slot k and y_{T,b} = 1, r_{u(T),b} = 0 (alive across the
  stage: h_{T,b} >= y_{T,b} - r_{u(T),b}); the inputs, outputs and temporaries of the op
  at slot k when it runs (e >= r - y, so nothing is counted twice); backward tensors
  and pinned outputs as Moccasin counts them (eq. 2.18 at these moments).
  Left out: RNG states of recomputed random ops, and tensors alive within a stage that
  neither t_b nor the op at slot k needs (an input held for a later recomputation), so
  memory is never overcounted and the optimum is a lower bound.
Objective: the compute time of every op once plus sum t_u r_{u,b} (microseconds).
`StageRelaxation.point` maps a schedule of the model onto these variables; the tests
check that the schedules of Rockmate's plans and of the relaxation break no row at their
own peak (y_{T,b} runs to the last stage that may need T, not to its last backward
reader: a schedule keeping T for a later recomputation must satisfy eq. 2.8).

The relaxation's solution is also a schedule (each r_{u,b} = 1 a run at u's slot of
stage b), often close to fitting the capacity, so Moccasin takes it as a hint once it
fits (NOTE: [Hints], NOTE: [Stage bound] in remat_dsl.solve.solvers.moccasin).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import pulp

from remat_dsl.solve.solvers.ilp import milp


@dataclass(frozen=True)
class StageBound:
    """What the relaxation proved at a capacity: `bound` (microseconds) a lower bound on
    the time of every schedule of the model within it (None: HiGHS proved none in time),
    `infeasible` when no schedule fits it at all, `runs` the fastest schedule of its
    solutions that fits (Moccasin's runs: op -> times), or None, and `closest` the last
    schedule it found, fitting or not (a hint for CP-SAT where nothing fits)."""

    bound: int | None
    infeasible: bool = False
    runs: dict[int, list[int]] | None = None
    closest: dict[int, list[int]] | None = None


@dataclass
class _Facts:
    """What both relaxations read off a Moccasin model `m` (bytes; stages are backward
    op positions, -1 the end of the forward): each forward or backward output's
    `producer` (op index) and `size`, the backward stages (`read_in`) and forward ops
    (`read_fwd`) reading it, the `last` stage that may need it (its backward op reads it,
    or an op reading it may be recomputed in it), the forward inputs of each forward op,
    and what is alive besides forward outputs across each stage (`across`: backward
    tensors, pinned outputs) and at each t_b (`at_stage`: that, plus the backward op's
    outputs and temporaries)."""

    m: Any  # the Moccasin solver whose model this reads (its module imports this one)
    producer: dict[str, int]
    size: dict[str, int]
    stage: dict[int, int]
    read_in: dict[str, list[int]]
    read_fwd: dict[str, list[int]]
    last: dict[str, int]
    ftens: list[str]
    btens: list[str]
    inputs: dict[int, list[str]]
    pinned: list[tuple[int, int]]
    across: list[int]
    at_stage: list[int]

    @classmethod
    def of(cls, m) -> "_Facts":
        ops, forward = m.ops, set(m.forward)
        producer, size = {}, {}
        for v in range(len(ops)):
            for t, n in m.outs[v]:
                producer[t], size[t] = v, n
        stage = {v: b for b, v in enumerate(m.backward)}
        read_in: dict[str, list[int]] = {t: [] for t in producer}  # backward stages reading t
        read_fwd: dict[str, list[int]] = {t: [] for t in producer}  # forward ops reading t
        for v in range(len(ops)):
            for t in m.reads[v]:
                if t in producer:
                    (read_fwd[t].append(v) if v in forward else read_in[t].append(stage[v]))
        last = {t: max([*read_in[t], *(b for v in read_fwd[t] for b in m.useful.get(v, ()))], default=-1) for t in size}
        ftens = [t for t in producer if producer[t] in forward]
        btens = [t for t in producer if producer[t] not in forward]
        inputs = {u: [t for t in m.reads[u] if t in producer and producer[t] in forward] for u in m.forward}
        pinned = sorted((m.first_start(v), n) for v, n in enumerate(m.pinned_bytes) if n)
        facts = cls(m, producer, size, stage, read_in, read_fwd, last, ftens, btens, inputs, pinned, [], [])
        for b, w in enumerate(m.backward):
            tb = m.first_start(w)
            across = sum(size[t] for t in btens if stage[producer[t]] < b and last[t] >= b)
            facts.across.append(across + facts.pinned_by(tb - 1))
            facts.at_stage.append(across + sum(n for _, n in m.outs[w]) + ops[w].temp_bytes + facts.pinned_by(tb))
        return facts

    def pinned_by(self, time: int) -> int:
        """Bytes of pinned outputs (model outputs, parameter gradients) made by `time`."""
        return sum(n for s, n in self.pinned if s <= time)

    def forward_rows(self) -> list[tuple[list[str], int]]:
        """Memory at each forward op's run (no recomputation in the forward): the forward
        outputs counted only if kept at the end of the forward, and the bytes alive then
        anyway (the op's outputs and temporaries, outputs a later forward op reads, pinned ones)."""
        m, rows = self.m, []
        for f, v in enumerate(m.forward):
            fixed = sum(n for _, n in m.outs[v]) + m.ops[v].temp_bytes + self.pinned_by(f)
            tensors = []
            for t in self.ftens:
                if m.slot[self.producer[t]] < f:
                    if any(m.slot[w] >= f for w in self.read_fwd[t]):
                        fixed += self.size[t]
                    else:
                        tensors.append(t)
            rows.append((tensors, fixed))
        return rows


def _point(relaxation, runs, capacity: int, r_of_stage, stage_of_y, derived=None) -> list[pulp.LpConstraint]:
    """What both relaxations' `point` share: sets every variable of `relaxation` to its
    value in Moccasin's schedule `runs` (op -> times) and the memory rows to `capacity`
    bytes, and returns the constraints that point breaks.  r_of_stage maps the backward
    stage of a recomputation to the key of its r variable (the stage, or the interval
    holding it), stage_of_y a y variable's key to the stage it is taken at (-1: the
    forward's end); derived(values) sets the variables defined from r and y (the stage
    relaxation's h and e).  Raises KeyError when `runs` recomputes where the model offers
    no slot."""
    m, F = relaxation.m, len(relaxation.m.forward)
    alive = _copies(m, runs)
    values = {var.name: 0 for var in relaxation.problem.variables()}
    values["every_op_once"] = 1
    for u in m.forward:
        for s in runs[u][1:]:
            values[relaxation.r[u, r_of_stage((s - F) // (F + 1))].name] = 1
    for (t, key), var in relaxation.y.items():
        stage = stage_of_y(key)
        at = F - 1 if stage < 0 else m.first_start(m.backward[stage])
        values[var.name] = int(any(s <= at < e for s, e in alive.get(t, ())))
    if derived is not None:
        derived(values)
    for var in relaxation.problem.variables():
        var.varValue = values[var.name]
    for constraint, fixed in relaxation.rows:
        constraint.constant = fixed - capacity
    return [c for c in relaxation.problem.constraints.values() if not c.valid(0)]


def _copies(m, runs) -> dict[str, list[tuple[int, int]]]:
    """Forward output -> the [start, end) interval of each of its copies in Moccasin's
    schedule `runs` (op -> times): what both relaxations' `point` reads residency from."""
    _, tensor_ends = m._ends(runs)
    alive: dict[str, list[tuple[int, int]]] = {}
    for u in m.forward:
        for s, ends in zip(runs[u], tensor_ends[u]):
            for (t, _), e in zip(m.outs[u], ends):
                alive.setdefault(t, []).append((s, e))
    return alive


class StageRelaxation:
    """NOTE: [Stage relaxation] for a Moccasin model `m` (remat_dsl.solve.solvers.moccasin.Moccasin):
    built once, solved at each capacity (bytes) by setting the memory rows' right-hand
    sides (solves through remat_dsl.solve.solvers.ilp.milp: HiGHS, CBC as the fallback).

    NOTE: [Lazy slot rows]
    Memory at the slots of each stage is one row per slot where a recomputation may run
    (thousands of rows and hundreds of thousands of nonzeros on GPT-2 with 4 layers), and
    most never bind (docs/measured-notes.md).  So the model starts with the
    rows at forward ops and at each t_b; after a solve, the rows of the slots where its
    schedule breaks the capacity in Moccasin's model (`Moccasin.profile`) are added, and
    it is solved again.  Each solve's optimum is a lower bound (its rows are a subset of
    the relaxation's), so the largest proven one is kept.  A schedule that still breaks
    the capacity where no row is missing (RNG states, inputs held for later
    recomputations) is repaired by solving at the capacity less the excess.

    rel_gap: HiGHS's relative gap, of the whole time; rounds: rounds of slot rows added
    where the schedule broke the capacity (`solve`); None: `m.config`'s (MoccasinConfig's
    relaxation_gap and slot_rounds)."""

    def __init__(self, m, rel_gap: float | None = None, rounds: int | None = None):
        self.m = m
        self.rel_gap = m.config.relaxation_gap if rel_gap is None else rel_gap
        self.rounds = m.config.slot_rounds if rounds is None else rounds
        ops = m.ops
        self.problem = pulp.LpProblem("stage_relaxation", pulp.LpMinimize)
        facts = _Facts.of(m)
        producer, size, read_in, last = facts.producer, facts.size, facts.read_in, facts.last
        self.producer, self.size = producer, size
        self.ftens = ftens = facts.ftens
        self.base = sum(op.time_us for op in ops)
        binary = lambda name: self.problem.add_variable(name, cat="Binary")  # noqa: E731
        self.index = {t: i for i, t in enumerate(ftens)}
        self.y = y = {(t, b): binary(f"y_{i}_{b}") for i, t in enumerate(ftens) for b in range(-1, last[t] + 1)}
        self.r = r = {(u, b): binary(f"r_{u}_{b}") for u in m.forward for b in m.useful.get(u, ())}
        R = lambda u, b: r.get((u, b), 0)  # noqa: E731
        prob = self.problem
        every_op_once = prob.add_variable("every_op_once", lowBound=1, upBound=1)  # the objective's constant, so
        # that HiGHS's relative gap is over the whole time, as Moccasin's is
        prob += pulp.LpAffineExpression([(every_op_once, self.base)] + [(x, ops[u].time_us) for (u, _), x in r.items()])
        for t in ftens:
            for b in range(last[t] + 1):
                prob += y[t, b] <= y[t, b - 1] + R(producer[t], b)  # keep
                if b in read_in[t]:
                    prob += y[t, b] == 1  # read
        self.inputs = facts.inputs
        for (u, b), x in r.items():
            for t in self.inputs[u]:  # recompute
                prob += x <= y.get((t, b - 1), 0) + R(producer[t], b)
        self.rows: list[tuple[pulp.LpConstraint, int]] = []  # (row, bytes it holds besides its terms)
        for tensors, fixed in facts.forward_rows():  # memory at each forward op's run
            self._row([(y[t, -1], size[t]) for t in tensors], fixed)
        self.across = facts.across  # per stage: bytes alive across it besides forward outputs
        for b in range(len(m.backward)):  # memory at t_b
            self._row([(y[t, b], size[t]) for t in ftens if (t, b) in y], facts.at_stage[b])
        self._held: dict[int, dict[str, pulp.LpVariable]] = {}  # stage -> tensor -> h
        self._extra: dict[tuple[int, int, str], pulp.LpVariable] = {}  # (stage, slot, tensor) -> e
        self._slot_rows: set[tuple[int, int]] = set()
        self.results: list[milp.MilpResult] = []

    def _row(self, terms, fixed: int) -> None:
        constraint = pulp.LpAffineExpression(terms) <= 0
        self.problem.addConstraint(constraint)
        self.rows.append((constraint, fixed))

    def _add_slot_row(self, b: int, k: int) -> None:
        """The memory row at slot k of stage b (NOTE: [Stage relaxation]), once."""
        if (b, k) in self._slot_rows:
            return
        self._slot_rows.add((b, k))
        m, y, r, prob, size, producer = self.m, self.y, self.r, self.problem, self.size, self.producer
        if b not in self._held:  # h_{T,b} >= y_{T,b} - r_{u(T),b}: T alive across stage b
            self._held[b] = {}
            for t in self.ftens:
                if (t, b) in y and (producer[t], b) in r:
                    h = self._held[b][t] = prob.add_variable(f"h_{b}_{self.index[t]}", lowBound=0, upBound=1)
                    prob += h >= y[t, b] - r[producer[t], b]
        held, u = self._held[b], m.forward[k]
        terms = [
            (y[t, b] if m.slot[producer[t]] <= k else held.get(t, y[t, b]), size[t]) for t in self.ftens if (t, b) in y
        ]
        for t in sorted({t for t, _ in m.outs[u]} | set(self.inputs[u])):
            if (t, b) in y:
                extra = self._extra[b, k, t] = prob.add_variable(f"e_{b}_{k}_{self.index[t]}", lowBound=0, upBound=1)
                prob += extra >= r[u, b] - y[t, b]
                terms.append((extra, size[t]))
            else:
                terms.append((r[u, b], size[t]))
        terms.append((r[u, b], m.ops[u].temp_bytes))
        self._row(terms, self.across[b])

    def solve(self, capacity: int, time_limit: float | None) -> StageBound:
        """The relaxation at `capacity` bytes, within `time_limit` seconds in all (None:
        none): NOTE: [Lazy slot rows].  Each round solves at the capacity (a bound, and a
        schedule that may break it) and, when it breaks it, once more at the capacity less
        the excess (a schedule that may fit), then adds the rows that were missing; each
        solve takes at most half the time left, so that one that stops at the time limit
        leaves time for a repair."""
        start = time.perf_counter()

        def half_left() -> float | None:
            return None if time_limit is None else (time_limit - (time.perf_counter() - start)) / 2

        bound, best, closest = None, None, None
        for _ in range(self.rounds):
            result, runs, profile = self._solve_at(capacity, half_left())
            if result.status == milp.INFEASIBLE:
                return StageBound(bound, infeasible=True, runs=best, closest=closest)
            proven = self._proven(result)
            if proven is not None:
                bound = proven if bound is None else max(bound, proven)
            best = self._better(best, runs, profile, capacity)
            closest = runs or closest
            if runs is None or best is runs:
                break
            excess = max(profile) - capacity
            _, repaired, repaired_profile = self._solve_at(capacity - excess, half_left())
            best = self._better(best, repaired, repaired_profile, capacity)
            closest = repaired or closest
            missing = self._missing(runs, profile, capacity)
            if not missing:
                break
            for b, k in missing:
                self._add_slot_row(b, k)
        return StageBound(bound, runs=best, closest=best or closest)

    def first_bound(self, capacity: int, time_limit: float | None) -> int | None:
        """The first round of `solve` alone, given all of `time_limit` seconds: a proven
        lower bound (microseconds) at `capacity` bytes, or None (no bound in time, or
        no schedule fits)."""
        result, _, _ = self._solve_at(capacity, time_limit)
        return self._proven(result)

    def _proven(self, result) -> int | None:
        """A solve's proven bound (microseconds): HiGHS's dual bound; None without a
        solution, or from CBC stopped by its limit (it gives no bound)."""
        if result.has_solution and result.gap is not None:
            return math.floor(pulp.value(self.problem.objective) * (1 - result.gap))
        return None

    def _solve_at(self, target: int, time_limit: float | None):
        """(MILP result, its schedule or None, that schedule's memory profile or None)."""
        if time_limit is not None and time_limit <= 1:
            return milp.MilpResult(milp.NO_SOLUTION, None, 0.0, ""), None, None
        for constraint, fixed in self.rows:
            constraint.constant = fixed - target
        result = milp.solve(self.problem, time_limit, rel_gap=self.rel_gap, max_nodes=10**9)
        self.results.append(result)
        if not result.has_solution:
            return result, None, None
        runs = self._runs()
        return result, runs, self.m.profile(runs)

    def _better(self, best, runs, profile, capacity: int):
        """The faster of `best` and `runs` where `runs` fits `capacity`."""
        if runs is None or max(profile) > capacity:
            return best
        return runs if best is None or self.m._time(runs) < self.m._time(best) else best

    def _missing(self, runs, profile, capacity: int) -> list[tuple[int, int]]:
        """The (stage, slot) rows not yet in the model at the recomputations where the
        schedule `runs` breaks `capacity` (NOTE: [Lazy slot rows])."""
        m, F = self.m, len(self.m.forward)
        missing = set()
        for time_, live in enumerate(profile):
            b, k = divmod(time_ - F, F + 1)
            if live > capacity and time_ >= F and k < F and (b, k) not in self._slot_rows:
                if time_ in runs[m.forward[k]]:
                    missing.add((b, k))
        return sorted(missing)

    def add_every_slot_row(self) -> None:
        """Every memory row of NOTE: [Stage relaxation], none left to NOTE: [Lazy slot rows]."""
        for u, b in self.r:
            self._add_slot_row(b, self.m.slot[u])

    def point(self, runs, capacity: int) -> list[pulp.LpConstraint]:
        """Sets every variable to its value in Moccasin's schedule `runs` (op -> times)
        and the memory rows to `capacity` bytes; returns the constraints that point
        breaks.  NOTE: [Stage relaxation] says there are none when the schedule's peak in
        the model is at most `capacity`: the tests check it on real schedules.  Raises
        KeyError when `runs` recomputes where the model offers no slot."""

        def held_and_extra(values: dict[str, int]) -> None:
            for b, held in self._held.items():
                for t, h in held.items():
                    values[h.name] = max(0, values[self.y[t, b].name] - values[self.r[self.producer[t], b].name])
            for (b, k, t), e in self._extra.items():
                values[e.name] = max(0, values[self.r[self.m.forward[k], b].name] - values[self.y[t, b].name])

        return _point(self, runs, capacity, lambda b: b, lambda b: b, held_and_extra)

    def _runs(self) -> dict[int, list[int]]:
        m = self.m
        F = len(m.forward)
        runs = {v: [m.first_start(v)] for v in range(len(m.ops))}
        for (u, b), var in self.r.items():
            if (var.value() or 0) > 0.5:
                runs[u].append(F + b * (F + 1) + m.slot[u])
        return {v: sorted(times) for v, times in runs.items()}


class MomentRelaxation:
    """NOTE: [Moment relaxation] for a Moccasin model `m`: the stage relaxation's rows at
    `moments` backward moments instead of every stage, for graphs whose stage relaxation
    HiGHS does not bound in minutes.

    NOTE: [Moment relaxation]
    On graphs with hundreds of backward stages (the 8-layer Llama decoder of
    bench/models/llama_d512_bytes.py) the stage relaxation's first solve
    (NOTE: [Stage relaxation], no slot rows) bounds little even in 15 minutes.  This
    relaxation keeps the memory rows at the end of the forward and at `moments` stages
    s_1 < ... < s_K = B - 1 (in each of K equal windows of stages, the one where the
    store-all schedule holds the most), and joins the stages between two moments into one
    interval I_i = (s_i, s_{i+1}] (s_0 = -1).  Variables (binary): y_{T,j}, forward output
    T resident at t_{s_j}, and R_{u,i}, forward op u recomputed at least once in a stage of
    I_i (where Moccasin's model offers it).  Constraints, each implied by every schedule
    of Moccasin's model:
    * keep: y_{T,j+1} <= y_{T,j} + R_{u(T),j} (a copy alive at t_{s_{j+1}} was alive at
      t_{s_j} or made within I_j);
    * read: y_{T,j} + R_{u(T),j} >= 1 when a backward op of I_j reads T, and y_{T,j+1} = 1
      when the one at s_{j+1} does;
    * recompute: R_{u,j} <= y_{T',j} + R_{u(T'),j} for each forward input T' of u (the
      input was alive at t_{s_j} or made within I_j before u's run);
    * memory at each forward op's run and at each t_{s_j}, as the stage relaxation counts it.
    Objective: every op once plus sum t_u R_{u,i}: a stage of I_i that recomputes u costs
    at least t_u.  So its optimum, or HiGHS's dual bound, bounds Moccasin's model's from
    below: no schedule that runs the forward once in graph order and the backward in
    graph order, recomputing in between, is faster within the capacity.  With every
    stage a moment it is the stage relaxation without slot rows.  `point` maps a
    schedule onto it; the tests check that schedules break no row at their own peak.
    32 moments (MoccasinConfig.moments) proved the highest bound on that decoder: with few moments the rows miss
    the peaks, with many HiGHS is slower (docs/measured-notes.md)."""

    def __init__(self, m, moments: int | None = None, rel_gap: float | None = None):
        """moments, rel_gap: None: `m.config`'s (MoccasinConfig's moments and relaxation_gap)."""
        self.m = m
        moments = m.config.moments if moments is None else moments
        self.rel_gap = m.config.relaxation_gap if rel_gap is None else rel_gap
        ops = m.ops
        facts = self.facts = _Facts.of(m)
        producer, size, last, ftens = facts.producer, facts.size, facts.last, facts.ftens
        B = len(m.backward)
        held = [facts.at_stage[b] + sum(size[t] for t in ftens if last[t] >= b) for b in range(B)]  # store-all
        window = max(1, -(-B // max(1, moments)))
        chosen = {max(range(i, min(i + window, B)), key=lambda b: (held[b], -b)) for i in range(0, B, window)}
        self.moments = [-1, *sorted(chosen | ({B - 1} if B else set()))]  # stage of moment j; -1: the forward's end
        self.interval = {}  # stage -> i, the interval (moments[i], moments[i + 1]] holding it
        for i in range(len(self.moments) - 1):
            for b in range(self.moments[i] + 1, self.moments[i + 1] + 1):
                self.interval[b] = i
        self.problem = prob = pulp.LpProblem("moment_relaxation", pulp.LpMinimize)
        binary = lambda name: prob.add_variable(name, cat="Binary")  # noqa: E731
        index = {t: i for i, t in enumerate(ftens)}
        self.y = y = {
            (t, j): binary(f"y_{index[t]}_{j}")
            for t in ftens
            for j in range(len(self.moments))
            if j == 0 or last[t] > self.moments[j - 1]
        }
        self.r = r = {
            (u, i): binary(f"r_{u}_{i}")
            for u in m.forward
            for i in sorted({self.interval[b] for b in m.useful.get(u, ())})
        }
        R = lambda u, i: r.get((u, i), 0)  # noqa: E731
        self.base = sum(op.time_us for op in ops)
        every_op_once = prob.add_variable("every_op_once", lowBound=1, upBound=1)  # as in StageRelaxation
        prob += pulp.LpAffineExpression([(every_op_once, self.base)] + [(x, ops[u].time_us) for (u, _), x in r.items()])
        for t in ftens:
            u = producer[t]
            for i in range(len(self.moments) - 1):
                if (t, i + 1) not in y:
                    break
                lo, hi = self.moments[i], self.moments[i + 1]
                prob += y[t, i + 1] <= y[t, i] + R(u, i)  # keep
                if any(lo < b <= hi for b in facts.read_in[t]):
                    prob += y[t, i] + R(u, i) >= 1  # read within I_i
                if hi in facts.read_in[t]:
                    prob += y[t, i + 1] == 1  # read at the moment
        for (u, i), x in r.items():
            for t in facts.inputs[u]:  # recompute
                prob += x <= y.get((t, i), 0) + R(producer[t], i)
        self.rows: list[tuple[pulp.LpConstraint, int]] = []  # (row, bytes it holds besides its terms)
        for tensors, fixed in facts.forward_rows():
            self._row([(y[t, 0], size[t]) for t in tensors], fixed)
        for j, s in enumerate(self.moments[1:], start=1):
            self._row([(y[t, j], size[t]) for t in ftens if (t, j) in y], facts.at_stage[s])
        self.results: list[milp.MilpResult] = []

    def _row(self, terms, fixed: int) -> None:
        constraint = pulp.LpAffineExpression(terms) <= 0
        self.problem.addConstraint(constraint)
        self.rows.append((constraint, fixed))

    def bound(self, capacity: int, time_limit: float | None) -> StageBound:
        """A proven lower bound (microseconds) on the time of every schedule of Moccasin's
        model within `capacity` bytes: HiGHS's dual bound after at most `time_limit`
        seconds (None: to optimality), None when it proved none in time; `infeasible`
        when no schedule fits (a relaxation with no solution)."""
        for constraint, fixed in self.rows:
            constraint.constant = fixed - capacity
        result = milp.solve(self.problem, time_limit, rel_gap=self.rel_gap, max_nodes=10**9)
        self.results.append(result)
        if result.status == milp.INFEASIBLE:
            return StageBound(None, infeasible=True)
        if result.has_solution and result.gap is not None:
            return StageBound(math.floor(pulp.value(self.problem.objective) * (1 - result.gap)))
        return StageBound(None)

    def point(self, runs, capacity: int) -> list[pulp.LpConstraint]:
        """Sets every variable to its value in Moccasin's schedule `runs` (op -> times)
        and the memory rows to `capacity` bytes; returns the constraints that point
        breaks (none when the schedule's peak is at most `capacity`: NOTE: [Moment
        relaxation]).  Raises KeyError when `runs` recomputes where the model offers no slot."""
        return _point(self, runs, capacity, self.interval.__getitem__, self.moments.__getitem__)
