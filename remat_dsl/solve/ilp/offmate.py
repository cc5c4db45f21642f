# ruff: noqa: E741 (l is a block index, as in the thesis and rotor)
"""OffMate for activations: recomputation and offloading chosen together by one ILP (O-ILP).

Source: the thesis (papers/thesis-*), chapter 4.  Blocks are Rockmate's (the chain
partition of remat_dsl.solve.chain.partition, `refine=1`); each block gets the options of
section 4.4 beside Rockmate's RK-Checkmate options (remat_dsl.solve.ilp.rockmate):

    as PyTorch           store everything the backward reads (option 0);
    forward-and-forget   keep only what the block's boundary needs (its outputs), recompute
                         the rest of the forward at the start of the backward;
    recompute cheap ops  recompute the ops whose time is below the time to offload and
                         prefetch their outputs at the host bandwidth; keep the rest;

and any option's saved activations (alive at the block's forward/backward boundary, read
only by the block's own backward) are OFFLOADABLE.  Interface activations (a block's
outputs, read by later blocks) are never offloaded in this version.  Every option's costs
(forward and backward time, bytes kept at the boundary, peaks) come from the exact
`rockmate.replay` (NOTE: [Option costs] in rockmate.py), never from estimates.

NOTE: [O-ILP for activations]
The O-ILP of section 4.5.2 restricted to activations: no parameter offload, no optimizer
states, no CPU optimizer, so Sto/Ofl/Prf/StoO/OflO/PrfO/Opt of parameters, W_t (4.14),
O_t (4.15), eq. 4.5-4.13, 4.23 and the alpha/H terms are dropped.  Steps t = 1..2L run
F_1..F_L then B_L..B_1 (section 4.3.3; one option per block, section 4.3.4).  Variables:

    Comp[i,o] in {0,1}, sum_o Comp[i,o] = 1                                 (4.1)
    Time[t] >= 0 (ms)                                                        (4.2)
    Ofl[i] >= 0 (MiB): activations of block i offloaded, all in step F_i (4.3.4:
        offloaded in the step that produces them), Ofl[i] <= sum_o O_i^o Comp[i,o]
    Prf[i,k] >= 0 (MiB): activations of block i prefetched at the start of B_k, k >= i;
        sum_k Prf[i,k] = Ofl[i]: all of it is back on the device when B_i needs it (4.3, 4.9)

Two departures from section 4.5.2.  Forward steps take no prefetch (a prefetch there
would cross into the backward section while saving nothing the backward steps cannot).
And a block's own backward step B_i may prefetch its activations (Prf[i,i]), its copy
then NOT overlapped: it adds Prf[i,i] / beta to the step's compute time (4.20 below).  The
thesis prefetches strictly before B_i, so B_{i+1} holds all of block i's activations
besides its own; on GPT-2 that kept the O-ILP's smallest budget above Rockmate's (a
recompute-only plan holds nothing of block i during B_{i+1}).

Memory (eq. 4.16-4.17 with W_t = O_t = 0; "memory allocation once per step": a step's
prefetched bytes count from its start, a block's offloaded bytes leave the device at the
end of its forward step), with X_i = sum_o xbar_i^o Comp[i,o] (rotor's abar: the block's
outputs and saved activations) and A_t the interface activations and gradients of rotor's
chain model (remat_dsl.solve.chain.model, NOTE: [Step semantics]):

    F_l:  A_F + sum_{j<l} (X_j - Ofl_j) + X_l + sum_o o_f^{l,o} Comp[l,o] <= M
    B_l:  sum_{j<l} (X_j - Ofl_j + sum_{k>=l} Prf[j,k]) + X_l + delta^l + delta^{l-1}
          + sum_o o_b^{l,o} Comp[l,o] <= M
    (each step's left side also gets sum_o unseen[t,o] Comp[B(t),o]: NOTE: [A_t from the
    simulation])
    host: sum_i Ofl[i] <= the host budget                                    (4.18)

Time (eq. 4.19-4.22; beta the host link bandwidth):

    F_l:  Time >= u_f^l (4.19),  Time >= Ofl[l] / beta (4.22)
    B_l:  Time >= sum_o u_b^{l,o} Comp[l,o] + Prf[l,l] / beta (4.20),
          Time >= sum_{j<=l} Prf[j,l] / beta (4.21)

and the objective is min sum_t Time[t] (plus TIE per offloaded MiB and per MiB and step a
prefetch comes early: among plans of equal time, fewer transfers and later prefetches,
which leave room for what no model sees).  Bytes are MiB and times milliseconds inside the
ILP (HiGHS's tolerances suit numbers near 1); the solution goes back to bytes.

NOTE: [Whole tensors] (section 4.6, Algorithm 8 for activations) The ILP offloads bytes; a
plan offloads tensors.  For each block, the smallest-greedy set of its option's
offloadable tensors whose size is at least Ofl[i] is offloaded (`select_at_least`; sorted
by size then name, so deterministic), and its prefetches are spread over the steps so
that the cumulative bytes prefetched by each step stay at most the ILP's, B_i itself
taking the rest (`prefetch_steps`).  Memory in every step is then at most the ILP's (B_i
holds all of block i's activations in the ILP too); time may be a little more.  The driver lowers the order and the transfers (remat_dsl.solve.lowering,
NOTE: [Solver transfers]), simulates them exactly and corrects the budget as for every
solver (remat_dsl.solve.driver, NOTE: [Budget correction]).

NOTE: [Never worse than recomputation] At each target, the RK-Rotor plan of the same
blocks and options (what `--solver rockmate` plans) is lowered and simulated too; when it
predicts less time with a peak no higher (than the O-ILP plan's, or the target), or the
O-ILP has no solution, it is returned instead, and the first decision of the plan says
which one was kept.  (RK-Rotor's targets are in rotor's chain model, which misses what
NOTE: [A_t from the simulation] adds, so its plan at a target usually peaks higher.)
"""

from __future__ import annotations

import functools
import math
import time
from collections import defaultdict
from dataclasses import dataclass, replace

import pulp

from remat_dsl.check.replay import transfer_us
from remat_dsl.plan import ir
from remat_dsl.plan.constraints import matching
from remat_dsl.plan.ir import pinned_tensors
from remat_dsl.plan.units import format_duration, human_bytes
from remat_dsl.solve.api import FLOOR_SWEEP, BudgetError, Decision, Problem, SolverInfo, SolverResult, Status, Transfer
from remat_dsl.solve.chain.model import Chain
from remat_dsl.solve.chain.partition import (
    TEXT_WIDTH,
    ChainPartition,
    block_name,
    chain_steps,
    is_small_chain,
    partition,
)
from remat_dsl.solve.chain.rk_rotor import min_feasible_budget as rk_min_feasible_budget
from remat_dsl.solve.chain.rk_rotor import try_rk_rotor
from remat_dsl.solve.chain.rotor import DEFAULT_SLOTS as ROTOR_SLOTS
from remat_dsl.solve.ilp import milp
from remat_dsl.solve.ilp.checkmate import op_hgraph
from remat_dsl.solve.ilp.hilp import HGraph
from remat_dsl.solve.ilp.rockmate import _block_with_options, per_ilp_limit, rockmate_chain
from remat_dsl.solve.lowering import lowered_plan

MIB = 2**20  # bytes per ILP memory unit
MS = 1000  # microseconds per ILP time unit
TIE = 1e-6  # ms per MiB (and per MiB and step of early prefetch): breaks ties, never trades time
NEGLIGIBLE = 1 / 1024  # MiB: an ILP offload below 1 KiB is rounding noise, not a decision

AS_PYTORCH, ROCKMATE, FORGET, CHEAP = "as PyTorch", "Rockmate", "forward-and-forget", "recompute cheap ops"


# ---------------------------------------------------------------------------
# Block options (section 4.4)
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class BlockPlan:
    """The options of one block.  backward[o]: the op names of B^o (recomputations then
    the block's backward ops); kinds[o]: where option o comes from (AS_PYTORCH, ROCKMATE,
    FORGET, CHEAP); offloadable[o]: (tensor, bytes) of the saved activations option o may
    offload, sorted by size then name."""

    backward: tuple[tuple[str, ...], ...]
    kinds: tuple[str, ...]
    offloadable: tuple[tuple[tuple[str, int], ...], ...]


def saved_values(hg: HGraph, backward: tuple[int, ...]) -> list[int]:
    """Values (indices into hg.values) made by the forward that are alive at the block's
    forward/backward boundary when B runs `backward` (node indices), under the one
    lowering's liveness rule (`rockmate.replay`): kept for outside readers, or read by the
    backward before being made again."""
    tb = hg.boundary
    made_by = defaultdict(list)
    for d, value in enumerate(hg.values):
        made_by[value.producer].append(d)
    alive = {d for d, v in enumerate(hg.values) if v.producer < tb and (v.keep_at_boundary or v.keep_at_end)}
    remade: set[int] = set()
    for k in backward:
        for d in hg.nodes[k].reads:
            if d not in remade and hg.values[d].producer < tb:
                alive.add(d)
        remade.update(made_by[k])
    return sorted(alive)


def recompute_schedule(hg: HGraph, recomputable) -> tuple[int, ...]:
    """B that first recomputes, in forward order, the forward ops `recomputable(k)` allows
    among those whose outputs the backward reads (and, through their inputs, further
    recomputable producers), then runs the block's backward ops (node indices)."""
    tb = hg.boundary
    needed = [d for k in range(tb, len(hg.nodes)) for d in hg.nodes[k].reads]
    chosen: set[int] = set()
    stack = list(needed)
    while stack:
        value = hg.values[stack.pop()]
        k = value.producer
        if k >= tb or k in chosen or value.keep_at_boundary or value.keep_at_end or not recomputable(k):
            continue
        chosen.add(k)
        stack.extend(hg.nodes[k].reads)
    return tuple(sorted(chosen)) + tuple(range(tb, len(hg.nodes)))


def cheap_ops(hg: HGraph, bandwidth: int) -> set[int]:
    """Forward nodes whose time is below the time to offload and prefetch their outputs
    at `bandwidth` bytes/s (section 4.4, option 3: Megatron-LM's selective recomputation)."""
    made = defaultdict(int)
    for value in hg.values:
        made[value.producer] += value.size
    return {k for k in range(hg.boundary) if hg.nodes[k].options[0].time_us < 2 * transfer_us(made[k], bandwidth)}


def offloadable(hg: HGraph, backward: tuple[int, ...], excluded: set[str]) -> tuple[tuple[str, int], ...]:
    """(tensor, bytes) of the saved activations of option `backward` that may go to the
    host: alive at the boundary, read by no op outside the block (interface activations
    stay), not pinned, not `excluded` (the user's constraints), not empty; sorted by size
    then name."""
    result = []
    for d in saved_values(hg, backward):
        value = hg.values[d]
        if value.keep_at_boundary or value.keep_at_end or value.name in excluded or value.size == 0:
            continue
        result.append((value.name, value.size))
    return tuple(sorted(result, key=lambda item: (item[1], item[0])))


def block_plans(graph: ir.Graph, part: ChainPartition, rockmate_options, bandwidth: int, excluded: set[str]):
    """(chain with every block's options costed by `replay`, one BlockPlan per block):
    Rockmate's options (`rockmate_options[l].backward`, option 0 is as PyTorch) plus
    forward-and-forget and recompute-cheap-ops (section 4.4) when they differ."""
    blocks, plans = [], []
    for l, ops in enumerate(part.blocks):
        hg = op_hgraph(graph, ops.forward, ops.backward)
        names = ops.forward + ops.backward
        index = {name: k for k, name in enumerate(names)}
        schedules = [tuple(index[n] for n in b) for b in rockmate_options[l].backward]
        kinds = [AS_PYTORCH] + [ROCKMATE] * (len(schedules) - 1)
        if 0 < hg.boundary < len(hg.nodes):
            cheap = cheap_ops(hg, bandwidth)
            for kind, schedule in (
                (FORGET, recompute_schedule(hg, lambda k: True)),
                (CHEAP, recompute_schedule(hg, cheap.__contains__)),
            ):
                if schedule not in schedules:
                    schedules.append(schedule)
                    kinds.append(kind)
        blocks.append(_block_with_options(part.chain.blocks[l], part.chain.delta_bytes(l), hg, schedules))
        plans.append(
            BlockPlan(
                tuple(tuple(names[k] for k in s) for s in schedules),
                tuple(kinds),
                tuple(offloadable(hg, s, excluded) for s in schedules),
            )
        )
    return replace(part.chain, blocks=tuple(blocks)), tuple(plans)


# ---------------------------------------------------------------------------
# The O-ILP (section 4.5.2)
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class OilpSolution:
    """options[l-1]: the option of block l; offloaded[l-1]: its offloaded bytes (Ofl, float);
    prefetched[l-1]: {k: bytes prefetched at the start of B_k}; time_us: the objective."""

    options: tuple[int, ...]
    offloaded: tuple[float, ...]
    prefetched: tuple[dict[int, float], ...]
    time_us: float
    result: milp.MilpResult


class Oilp:
    """The O-ILP of NOTE: [O-ILP for activations] for `chain` and `plans`; `solve(target)`
    at a device budget (bytes), `floor()` the least budget it accepts (bytes)."""

    def __init__(self, chain: Chain, plans, bandwidth: int, host_budget: int | None, unseen: dict | None = None):
        self.chain, self.plans, self.bandwidth, self.host_budget = chain, plans, bandwidth, host_budget
        self.L = chain.length
        # ("F" | "B", l, o) -> bytes the chain model misses in that step when block l runs option o
        # (NOTE: [A_t from the simulation])
        self.unseen = unseen or {}
        self.results: list[milp.MilpResult] = []

    def memory(self, options) -> dict[tuple[str, int], int]:
        """("F" | "B", l) -> the memory constraint's left side (bytes) with block l running
        options[l-1] and nothing offloaded, without `unseen`."""
        chain, L = self.chain, self.L
        xbar = [b.variant(o)[0] for b, o in zip(chain.blocks, options)]
        result = {}
        for l in range(1, L + 1):
            earlier = sum(xbar[: l - 1])
            _, fwd_overhead, _, bwd_overhead = chain.blocks[l - 1].variant(options[l - 1])
            result["F", l] = chain.input_bytes + chain.delta_bytes(L) + earlier + xbar[l - 1] + fwd_overhead
            result["B", l] = earlier + xbar[l - 1] + chain.delta_bytes(l) + chain.delta_bytes(l - 1) + bwd_overhead
        return result

    def _model(self, target: int | None):
        """(problem, Comp, Ofl, Prf, M): minimize sum Time at M = target MiB, or, when
        target is None, minimize M itself (the floor)."""
        chain, L = self.chain, self.L
        problem = pulp.LpProblem("oilp", pulp.LpMinimize)
        n = [1 + len(b.options) for b in chain.blocks]
        comp = {
            (l, o): pulp.LpVariable(f"Comp_{l}_{o}", cat="Binary") for l in range(1, L + 1) for o in range(n[l - 1])
        }
        ofl = {l: pulp.LpVariable(f"Ofl_{l}", lowBound=0) for l in range(1, L + 1)}
        prf = {(j, k): pulp.LpVariable(f"Prf_{j}_{k}", lowBound=0) for j in range(1, L + 1) for k in range(j, L + 1)}
        steps = [("F", l) for l in range(1, L + 1)] + [("B", l) for l in range(L, 0, -1)]
        times = {s: pulp.LpVariable(f"Time_{s[0]}_{s[1]}", lowBound=0) for s in steps}
        memory = pulp.LpVariable("M", lowBound=0) if target is None else target / MIB

        def cost(l, field):  # sum_o cost^{l,o} Comp[l,o], `field` of Block.variant
            return pulp.lpSum(chain.blocks[l - 1].variant(o)[field] * comp[l, o] for o in range(n[l - 1]))

        def x(l):
            return (1 / MIB) * cost(l, 0)

        def unseen(kind, l):  # A_t beyond rotor's chain (NOTE: [A_t from the simulation]), MiB
            return pulp.lpSum(self.unseen.get((kind, l, o), 0) / MIB * comp[l, o] for o in range(n[l - 1]))

        for l in range(1, L + 1):
            problem += pulp.lpSum(comp[l, o] for o in range(n[l - 1])) == 1, f"one_option_{l}"  # (4.1)
            capacity = pulp.lpSum(
                sum(b for _, b in self.plans[l - 1].offloadable[o]) / MIB * comp[l, o] for o in range(n[l - 1])
            )
            problem += ofl[l] <= capacity, f"offloadable_{l}"
            problem += pulp.lpSum(prf[l, k] for k in range(l, L + 1)) == ofl[l], f"back_by_B_{l}"  # (4.9)
        base = (chain.input_bytes + chain.delta_bytes(L)) / MIB
        for l in range(1, L + 1):  # (4.16, 4.17)
            earlier = pulp.lpSum(x(j) - ofl[j] for j in range(1, l))
            unseen_f, unseen_b = unseen("F", l), unseen("B", l)
            problem += base + unseen_f + earlier + x(l) + (1 / MIB) * cost(l, 1) <= memory, f"memory_F_{l}"
            back = pulp.lpSum(prf[j, k] for j in range(1, l) for k in range(l, L + 1))
            deltas = (chain.delta_bytes(l) + chain.delta_bytes(l - 1)) / MIB + unseen_b
            problem += earlier + back + x(l) + deltas + (1 / MIB) * cost(l, 3) <= memory, f"memory_B_{l}"
        if self.host_budget is not None:  # (4.18)
            problem += pulp.lpSum(ofl.values()) <= self.host_budget / MIB, "host_memory"
        per_ms = MIB / self.bandwidth * 1000  # ms to move one MiB
        for l in range(1, L + 1):
            problem += times["F", l] >= chain.blocks[l - 1].fwd_us / MS, f"compute_F_{l}"  # (4.19)
            problem += times["F", l] >= per_ms * ofl[l], f"offload_F_{l}"  # (4.22)
            problem += times["B", l] >= (1 / MS) * cost(l, 2) + per_ms * prf[l, l], f"compute_B_{l}"  # (4.20)
            problem += (
                times["B", l] >= per_ms * pulp.lpSum(prf[j, l] for j in range(1, l + 1)),
                f"prefetch_B_{l}",
            )  # (4.21)
        # Ties (time equal) go to fewer offloaded bytes and later prefetches: less memory the ILP does not see
        # (parameter gradients) and fewer transfers; TIE is far below one microsecond per MiB.
        late = pulp.lpSum((k - j) * var for (j, k), var in prf.items())
        problem += memory if target is None else pulp.lpSum(times.values()) + TIE * (pulp.lpSum(ofl.values()) + late)
        return problem, comp, ofl, prf, memory, times

    @functools.cached_property
    def floor(self) -> int:
        """The least budget (bytes) with a solution: every offloadable byte offloaded where it pays."""
        problem, *_, memory, _ = self._model(None)
        result = milp.solve(problem, rel_gap=milp.OPTIMAL_GAP)
        self.results.append(result)
        if not result.has_solution:
            raise RuntimeError(f"the O-ILP's floor problem has no solution ({result.status})")
        return math.ceil(memory.value() * MIB) + 1

    def solve(self, target: int, time_limit: float | None = None) -> OilpSolution | None:
        """The O-ILP at budget `target` (bytes); None when it has no solution."""
        problem, comp, ofl, prf, _, times = self._model(target)
        result = milp.solve(problem, time_limit)
        self.results.append(result)
        if not result.has_solution:
            return None
        L = self.L
        options = tuple(
            max((o for (l2, o) in comp if l2 == l), key=lambda o: comp[l, o].value()) for l in range(1, L + 1)
        )
        offloaded = tuple(max(0.0, ofl[l].value() or 0.0) * MIB for l in range(1, L + 1))
        prefetched = tuple(
            {k: max(0.0, prf[l, k].value() or 0.0) * MIB for k in range(l, L + 1)} for l in range(1, L + 1)
        )
        total = sum(t.value() or 0.0 for t in times.values()) * MS
        return OilpSolution(options, offloaded, prefetched, total, result)


# ---------------------------------------------------------------------------
# Whole tensors (section 4.6)
# ---------------------------------------------------------------------------


def select_at_least(tensors, target: float) -> list[tuple[str, int]]:
    """A subset of `tensors` ((name, bytes)) of at least `target` bytes, close to it:
    greedy, largest first, each tensor taken while the sum stays within `target`, then
    the smallest remaining one that reaches it, then the taken ones it made useless
    dropped, smallest first (section 4.6, SELECT).  All of them when
    their sum is below `target`.  Deterministic: ties by name."""
    ordered = sorted(tensors, key=lambda item: (-item[1], item[0]))
    chosen, total = [], 0
    for item in ordered:
        if total + item[1] <= target:
            chosen.append(item)
            total += item[1]
    if total < target:
        rest = [item for item in ordered if item not in chosen and total + item[1] >= target]
        if not rest:
            return ordered
        chosen.append(rest[-1])
        total += rest[-1][1]
        for item in sorted(chosen, key=lambda item: (item[1], item[0])):  # drop what the last one made useless
            if total - item[1] >= target:
                chosen.remove(item)
                total -= item[1]
    return sorted(chosen, key=lambda item: (item[1], item[0]))


def prefetch_steps(tensors, prefetched: dict[int, float], last: int) -> dict[str, int]:
    """tensor -> block k whose backward step starts with its prefetch: the steps B_L..B_{last}
    in the order they run, each taking tensors (largest first) while the bytes prefetched
    so far stay at most the ILP's cumulative `prefetched`; B_{last}, the block's own
    backward step, takes the rest (NOTE: [Whole tensors])."""
    remaining = sorted(tensors, key=lambda item: (-item[1], item[0]))
    steps: dict[str, int] = {}
    cumulative, assigned = 0.0, 0
    for k in sorted(prefetched, reverse=True):
        cumulative += prefetched[k]
        if k == last:
            break
        for item in list(remaining):
            if assigned + item[1] <= cumulative + 0.5:
                steps[item[0]] = k
                assigned += item[1]
                remaining.remove(item)
    for name, _ in remaining:
        steps[name] = last
    return steps


# ---------------------------------------------------------------------------
# The solver
# ---------------------------------------------------------------------------


class Offmate:
    """`--solver offmate`: the O-ILP of thesis chapter 4 for activations (NOTE: [O-ILP for
    activations]) over Rockmate's blocks, each with Rockmate's options and those of
    section 4.4; whole tensors chosen as in section 4.6 (NOTE: [Whole tensors]); never
    worse than Rockmate's plan at the same target (NOTE: [Never worse than recomputation]).

    Offloads travel at `problem.bandwidth` (bytes/s); `problem.host_budget` (bytes, None
    for unlimited) bounds the offloaded bytes (eq. 4.18).  Raises BudgetError below the
    O-ILP's floor (with every offloadable byte offloaded) and RK-Rotor's.  `part`: the
    blocks (default Rockmate's; `fallbacks` gives the same solver over rotor's finer
    blocks, as rockmate does)."""

    name = "offmate"
    auto_rank = 0
    optimizes = True

    def __init__(self, problem: Problem, part: ChainPartition | None = None):
        start = time.perf_counter()
        self.problem, self.finer = problem, part is not None
        graph = problem.graph
        self.part = part or partition(graph, refine=1, strict=is_small_chain(graph))
        limit = per_ilp_limit(problem.time_limit, len(self.part.blocks))
        self.rc = rockmate_chain(graph, self.part, limit, problem.report)
        excluded = pinned_tensors(graph)
        for kind in ("offload", "no-offload", "recompute"):
            excluded |= set(matching(graph, problem.constraints, kind))
        self.chain, self.plans = block_plans(graph, self.part, self.rc.options, problem.bandwidth, excluded)
        self.oilp = Oilp(self.chain, self.plans, problem.bandwidth, problem.host_budget)
        self.oilp.unseen = self._unseen()
        self.seconds = time.perf_counter() - start

    @classmethod
    def fits(cls, problem: Problem) -> bool:
        """`auto` runs offmate when the plan has a host link and Rockmate's chain fits the graph."""
        return problem.host_link and is_small_chain(problem.graph)

    def describe(self) -> str:
        options = sum(len(p.kinds) for p in self.plans)
        host = (
            "unlimited" if self.problem.host_budget is None else human_bytes(self.problem.host_budget).replace(" ", "")
        )
        finer = "rotor-blocks " if self.finer else ""
        return f"{finer}blocks={len(self.part.blocks)} options={options} host-budget={host}"

    @property
    def info(self) -> SolverInfo:
        status, gap = milp.status_of(list(self.rc.results) + self.oilp.results)
        return SolverInfo(Status(status), gap, self.seconds + sum(r.seconds for r in self.oilp.results))

    def floor(self) -> int:
        """The least target (bytes) solve() accepts: the O-ILP's floor, or RK-Rotor's below it."""
        return min(self.oilp.floor, self._rk_floor)

    def floor_targets(self) -> list[int]:
        """Targets near the O-ILP's floor and near RK-Rotor's (api.floor_targets): the
        driver's smallest budget is the least exact peak of their plans."""
        return sorted({math.ceil(f * x) for f in (self.oilp.floor, self._rk_floor) for x in FLOOR_SWEEP})

    @functools.cached_property
    def _rk_floor(self) -> int:
        return rk_min_feasible_budget(self.rc.chain, ROTOR_SLOTS)

    def fallbacks(self):
        """NOTE: [Two partitions] of rockmate.py: a budget these blocks cannot meet is tried
        again by the O-ILP over rotor's finer blocks (their bottleneck step holds less)."""
        if not self.finer:
            yield Offmate(self.problem, partition(self.problem.graph))

    def solve(self, target: int) -> SolverResult:
        """The O-ILP's plan at `target` bytes, or Rockmate's when it predicts less time or
        the O-ILP has none (NOTE: [Never worse than recomputation]).  Raises BudgetError
        when neither has a plan."""
        solution = self.oilp.solve(target, self.problem.time_limit)
        theirs = self._rockmate(target)
        if solution is None:
            if theirs is None:
                raise BudgetError(target, self.floor(), self.name)
            note = "offmate: kept Rockmate's plan (the O-ILP has none at this target)"
            return SolverResult(theirs[0], self.info, (Decision(0, note), *theirs[1]))
        order, decisions, transfers = self._lowerable(solution)
        ours = self._simulated(order, transfers)
        if theirs is not None:
            plan = self._simulated(theirs[0], ())
            if plan.header.time_us < ours.header.time_us and plan.header.peak_bytes <= max(
                ours.header.peak_bytes, target
            ):
                note = (
                    f"offmate: kept Rockmate's plan ({format_duration(plan.header.time_us)}) over the O-ILP's "
                    f"({format_duration(ours.header.time_us)}) at this target"
                )
                return SolverResult(theirs[0], self.info, (Decision(0, note), *theirs[1]))
        other = f", Rockmate's {format_duration(plan.header.time_us)}" if theirs is not None else ""
        note = f"offmate: O-ILP plan kept (predicted {format_duration(ours.header.time_us)}{other})"
        return SolverResult(order, self.info, (Decision(0, note), *decisions), transfers)

    def _unseen(self) -> dict[tuple[str, int, int], int]:
        """NOTE: [A_t from the simulation] ("F" | "B", l, o) -> bytes: the exact peak of
        step (F|B, l) minus the O-ILP's memory for it, in the plan where block l runs
        option o and the others run as PyTorch.

        A_t of eq. 4.17 is what a step holds besides the blocks' saved activations.
        Rotor's chain model sees only the interface activations and gradients; the exact
        simulation also sees the prelude, the model outputs kept to the end of the step,
        the tangents, and the parameter gradients piling up during the backward (GPT-2's
        logits and their tangent: 4 MiB where a block saves 5 MiB), and the block
        replays' peaks are not where the plan's are.  The store-all plan, then one plan
        per option of the first block of each class of identical blocks (that block on
        that option, the others as PyTorch; no solve) measure the difference for each
        step and option; the other blocks of a class take their class's change from
        option 0 at their own steps (26 plans for examples/gpt2.py, whatever its depth).  The
        O-ILP adds sum_o unseen[t, o] Comp[B(t), o] to A_t: a plan that changes the first
        block of a class from store-all is then predicted exactly, step by step."""
        from remat_dsl.check.replay import simulate

        options = [p.backward for p in self.plans]
        result: dict[tuple[str, int, int], int] = {}
        store_all = (0,) * self.chain.length
        first = [l for l in range(1, self.chain.length + 1) if self.rc.keys[l - 1] == l - 1]  # one block per class
        for block, o in [(0, 0)] + [(l, o) for l in first for o in range(1, len(self.plans[l - 1].kinds))]:
            column = store_all[: block - 1] + (o,) + store_all[block:] if block else store_all
            ops = self._chain_ops(column)
            order, _ = chain_steps(self.part, ops, options, self.chain)
            step_of = _step_of_positions(self.part, ops, options, len(order))
            runs: dict[tuple[str, int], int] = {}
            count: dict[str, int] = defaultdict(int)
            for at, name in enumerate(order):
                runs[name, count[name]] = at
                count[name] += 1
            exact: dict[tuple[str, int], int] = {}
            seen: dict[str, int] = defaultdict(int)
            step = ("F", 1)
            for entry in simulate(self._simulated(order, ())).timeline:
                ins = entry.instruction
                if ins.verb in ("compute", "recompute"):
                    at = runs.get((ins.target, seen[ins.target]))
                    seen[ins.target] += 1
                    step = step_of[at] if at is not None else step
                exact[step] = max(exact.get(step, 0), entry.mem_peak)
            model = self.oilp.memory(column)
            for (kind, l), nbytes in model.items():
                if (l == block or not block) and (kind, l) in exact:
                    result[kind, l, o] = exact[kind, l] - nbytes
        for l in range(
            1, self.chain.length + 1
        ):  # an identical block: its class's change from option 0, at its own steps
            same = self.rc.keys[l - 1] + 1
            for o in range(1, len(self.plans[l - 1].kinds) if same != l else 0):
                for kind in ("F", "B"):
                    if (kind, l, 0) in result and (kind, same, o) in result and (kind, same, 0) in result:
                        result[kind, l, o] = result[kind, l, 0] + result[kind, same, o] - result[kind, same, 0]
        return result

    def _chain_ops(self, options) -> list[tuple]:
        """The O-ILP's step sequence: F_all 1..L, then B L..1, each with its option."""
        L = self.chain.length
        return [("F_all", l, options[l - 1]) for l in range(1, L + 1)] + [
            ("B", l, options[l - 1]) for l in range(L, 0, -1)
        ]

    def _simulated(self, order, transfers) -> ir.Plan:
        p = self.problem
        return lowered_plan(
            p.graph, order, constraints=p.constraints, device=p.device, bandwidth=p.bandwidth, transfers=transfers
        )

    def _rockmate(self, target: int):
        """(order, decisions) of RK-Rotor on Rockmate's chain at `target`, or None."""
        schedule = try_rk_rotor(self.rc.chain, target, ROTOR_SLOTS)
        if schedule is None:
            return None
        return chain_steps(self.part, schedule.ops, [b.backward for b in self.rc.options], self.rc.chain)

    def _lowerable(self, solution: OilpSolution):
        """(order, decisions, transfers) of an O-ILP solution (NOTE: [Whole tensors])."""
        L = self.chain.length
        ops = self._chain_ops(solution.options)
        options = [p.backward for p in self.plans]
        order, decisions = chain_steps(self.part, ops, options, self.chain)
        starts = _step_starts(self.part, ops, options)
        position = {name: i for i, name in reversed(list(enumerate(order)))}  # first run: the forward compute
        producers = {t.name: t.producer for t in self.problem.graph.tensors}
        transfers, words = [], {}
        for l in range(1, L + 1):
            o = solution.options[l - 1]
            if solution.offloaded[l - 1] < NEGLIGIBLE * MIB:
                continue
            chosen = select_at_least(self.plans[l - 1].offloadable[o], solution.offloaded[l - 1])
            steps = prefetch_steps(chosen, solution.prefetched[l - 1], l)
            end = position[self.part.blocks[l - 1].forward[-1]]
            for name, _ in chosen:
                transfers.append(Transfer(name, position[producers[name]], end, starts["B", steps[name]]))
            words[l] = self._offload_words(l, o, chosen, steps)
        steps_run = [step for step in ops if _nonempty(self.part, step, options)]
        worded: list[Decision] = []
        for decision, (kind, l, _) in zip(decisions, steps_run):
            worded.append(decision)
            if kind != "B" and l in words:  # a second comment line under the option's own words
                worded.append(Decision(decision.at, words[l]))
        return order, tuple(worded), tuple(transfers)

    def _offload_words(self, l: int, o: int, chosen, steps: dict[str, int]) -> str:
        """`offload 4 tensors, 12.00 MiB (recompute cheap ops option), prefetched during
        transformer.h.4.attn's and its own backward`: what block l offloads, within
        TEXT_WIDTH characters (fewer children of the module paths, else `block k`; the
        option's kind left out last).  The line above it, chain_steps' words, names the
        block and its option."""
        size = human_bytes(sum(b for _, b in chosen))
        for kind, children in ((True, 3), (True, 2), (True, 1), (False, 1), (False, 0)):
            during = [
                "its own" if k == l else (block_name(self.part, k, children) if children else f"block {k}") + "'s"
                for k in sorted(set(steps.values()), reverse=True)
            ]
            option = f" ({self.plans[l - 1].kinds[o]} option)" if kind else ""
            text = f"offload {len(chosen)} tensors, {size}{option}, prefetched during {' and '.join(during)} backward"
            if len(text) <= TEXT_WIDTH:
                break
        return text


def _nonempty(part: ChainPartition, step, options) -> bool:
    """chain_steps words only the steps that run ops."""
    kind, l, o = step
    return bool(part.blocks[l - 1].forward if kind != "B" else options[l - 1][o])


def _step_starts(part: ChainPartition, ops, options) -> dict[tuple[str, int], int]:
    """(kind, l) -> the position in chain_steps' order where that step starts (the next
    step's start when it runs no op)."""
    at, starts = len(part.prelude), {}
    for kind, l, o in ops:
        starts["B" if kind == "B" else "F", l] = at
        at += len(part.blocks[l - 1].forward if kind != "B" else options[l - 1][o])
    return starts


def _step_of_positions(part: ChainPartition, ops, options, length: int) -> list[tuple[str, int]]:
    """For each position of chain_steps' order: the step ("F" | "B", l) running it (the
    prelude counts as F_1)."""
    result = [("F", 1)] * len(part.prelude)
    for kind, l, o in ops:
        result += [("B" if kind == "B" else "F", l)] * len(
            part.blocks[l - 1].forward if kind != "B" else options[l - 1][o]
        )
    assert len(result) == length
    return result
