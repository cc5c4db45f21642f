"""Where the parameters and optimizer states live: the O-ILP's placement variables.

Source: Zhao, PhD thesis "Optimizing Memory Usage when Training Deep Neural Networks"
(2024), chapter 4 (OffMate), section 4.5.2, eq. 4.3-4.23, and the rounding of section 4.6.

NOTE: [Placement ILP]
One LP (pulp, HiGHS through remat_dsl.solve.solvers.ilp.milp) chooses, for a fixed
activation plan, per trainable parameter i of P_i bytes with S_i bytes of optimizer state,
the fractions (all in [0,1]):

    s_i  streamed: kept in host memory, prefetched where it is read      1 - Sto, Prf (4.3, 4.5, 4.9)
    o_i  updated on the host: gradient offloaded, states on the host     X_w, Opt (4.4, 4.12)
    g_i  states paged: on the host, prefetched before the device's
         update and offloaded after it                                   1 - StoO, PrfO, OflO (4.8, 4.10)
    o_i + g_i <= 1: the device's update has its states there             (4.6)
    w_i >= o_i - s_i: a host update of a parameter held on the device
         is fetched back to it                                           (4.11)
    v_i >= s_i - o_i: a streamed parameter updated on the device is
         offloaded to its host copy                                      (4.7)

A frozen parameter has only s_i; the smallest parameter keeps s_i = 0 (the generated
module finds its device by it).  Steps t are the activation plan's instructions cut at
every parameter event (first and last read in the forward, first read in the backward,
the update point where its gradient is complete and it is read no more): the thesis'
F_1..F_L, B_L..B_1 aggregated to the parameters' groups, one per event.  A_t (its S_t +
A_t) is the activation plan's simulated peak inside the step (which counts no parameter)
with each gradient held from its last making to its update point; C_t the ops' time.
Memory (4.14-4.17), M the budget:

    A_t + sum_i (1 - s_i) P_i + sum_{i read in t or t+1} s_i P_i
        + sum_i (1 - o_i - g_i) S_i + sum_{i updated in t or t+1} g_i S_i
        (+ (1 - o_i) T_i while i's update runs, with A_t the memory after i's gradient
        and only the parameters whose reads span it)
                                                                              (4.14-4.17)
    sum_i (s_i + o_i) P_i + (o_i + g_i) S_i <= host budget                    (4.18)

with T_i the device update's temporaries.  Time (4.19-4.23), beta the link's bytes per
microsecond each way, alpha_G and alpha_C the device's and host's update speeds, H the
host's overhead per update:

    Time_t >= C_t + sum_{i updated in t} (1 - o_i) P_i / alpha_G             (4.19-4.20)
    Time_t >= (sum_{i read first in t+1} s_i P_i + sum_{i updated in t+1} g_i S_i) / beta   (4.21)
    Time_t >= sum_{i updated in t} (o_i P_i + g_i S_i + v_i P_i) / beta       (4.22)
    sum_{t > k} Time_t + Time_end >= sum_{i updated in k or later} o_i (P_i / alpha_C + H)  (4.23)
    Time_end >= sum_i w_i P_i / beta
    minimize sum_t Time_t + Time_end

Departures from section 4.5.2: the activations are fixed (the solver's plan for the budget
less what the device holds; the thesis chooses Comp/Ofl/Prf of activations in the same
ILP); steps are aggregated per parameter event rather than per block; a transfer is
charged to the step before the one that reads it (the lowering's copies lead by a few
ops); eq. 4.23's host work is one queue fed in gradient order (an exact bound for a serial
host, linear in the fractions), with H per update rather than per step; the host's
copy-back of host-updated parameters goes in one step after the backward; host memory
counts only the parameters kept there (the thesis' eq. 4.18 counts a host copy of every
parameter, which this runtime does not make).

Rounding (section 4.6): a fraction at or above a threshold takes the whole parameter
(`round_placement`, THRESHOLDS: 0.5; then 1e-6 for streaming and paging, which only cost
link time, with host updates, which cost the host's time, still at 0.5; then 1e-6 for
all); a parameter updated on the host is never paged, and one whose host update is
rounded away is paged by the part of its states the LP kept off the device.  Rounding
moves memory: a fractional g_i rounded down holds its states through the whole step,
rounded up it holds them around the update.  The lowering (remat_dsl.solve.lowering) then
places the copies and the exact simulation judges the plan (NOTE: [Optimizer placement]
and NOTE: [Placement candidate] in remat_dsl.solve.driver).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pulp

from remat_dsl.plan import ir
from remat_dsl.solve.solvers.ilp import milp

# rounding variants of section 4.6, tried in this order: (threshold of s and g, of o)
THRESHOLDS = ((0.5, 0.5), (1e-6, 0.5), (1e-6, 1e-6))


@dataclass(frozen=True)
class Placement:
    """An LP's placement rounded to whole parameters (names sorted).

    streamed: kept in host memory, prefetched where read; on_host: updated on the host;
    paged: updated on the device, states paged; predicted_us: the LP's objective
    (microseconds), a prediction of the fractional placement's step time."""

    streamed: frozenset[str]
    on_host: frozenset[str]
    paged: frozenset[str]
    predicted_us: float


@dataclass(frozen=True)
class Fractions:
    """The LP's solution: parameter -> fraction for s (streamed), o (host update), g (paged)."""

    streamed: dict[str, float]
    on_host: dict[str, float]
    paged: dict[str, float]
    predicted_us: float


@dataclass(frozen=True)
class _Events:
    """Instruction positions (forward then backward, one index) of a parameter's events."""

    first_forward: int
    last_forward: int
    first_backward: int | None
    update: int | None  # trainable only


def _events(plan: ir.Plan, trainable: set[str]) -> tuple[dict[str, _Events], dict[str, tuple[int, int]]]:
    """Each parameter's events in `plan` (its graph with the gradient lines), and each
    trainable parameter's gradient span (its last making, its update point)."""
    graph = plan.graph
    ops = graph.op_by_name
    parameters = {p.name for p in graph.parameters}
    gradient_of = {name: g.parameter for g in graph.gradients if g.value is not None for name in ir.refs_in(g.value)}
    instructions = (*plan.forward, *plan.backward)
    start = len(plan.forward)
    reads: dict[str, list[int]] = {}
    made: dict[str, int] = {}
    for i, ins in enumerate(instructions):
        if not ins.runs_op:
            continue
        op = ops[ins.target]
        for name in {r.name for r in ir.op_refs(op)} & parameters:
            reads.setdefault(name, []).append(i)
        for out in op.outputs:
            if out in gradient_of:
                made[gradient_of[out]] = max(made.get(gradient_of[out], -1), i)
    events: dict[str, _Events] = {}
    spans: dict[str, tuple[int, int]] = {}
    for name, at in reads.items():
        forward = [i for i in at if i < start] or [at[0]]
        backward = [i for i in at if i >= start]
        update = None
        if name in trainable:
            update = max(backward[-1] if backward else start, made.get(name, start))
            spans[name] = (made.get(name, update), update)
        events[name] = _Events(forward[0], forward[-1], backward[0] if backward else None, update)
    return events, spans


def placement_fractions(
    plan: ir.Plan,
    timeline,
    *,
    sizes: dict[str, int],
    trainable: list[str],
    state_bytes: Callable[[int], int],
    temp_bytes: Callable[[int], int],
    budget: int,
    host_budget: int | None,
    bandwidth: int,
    speeds: tuple[int, int, int],
) -> Fractions | None:
    """The LP of NOTE: [Placement ILP] for the activation plan `plan`, its instructions
    made for the graph without gradient lines and its graph the whole one (with them), and
    `timeline`, the simulation of its instructions without gradient lines, which counts no
    parameter (remat_dsl.check.replay.Simulation.timeline, one Step per instruction).  sizes: bytes
    per parameter; trainable: the parameters with a gradient; state_bytes / temp_bytes:
    the optimizer's states and update temporaries (bytes) of a parameter of n bytes;
    budget, host_budget: bytes; bandwidth: link bytes per second each way; speeds: the
    device's and host's update speeds (bytes per second, 0: not timed) and the host's
    overhead per update (microseconds).  None when the LP is infeasible or unsolved."""
    trainable_set = set(trainable)
    events, spans = _events(plan, trainable_set)
    names = sorted(events)
    if not names:
        return None
    instructions = (*plan.forward, *plan.backward)
    ops = plan.graph.op_by_name
    cuts = sorted({0} | {e.first_forward for e in events.values()} | {e.last_forward for e in events.values()}
                  | {e.first_backward for e in events.values() if e.first_backward is not None}
                  | {e.update for e in events.values() if e.update is not None})  # fmt: skip
    n = len(instructions)
    bounds = [(a, b) for a, b in zip(cuts, [*cuts[1:], n]) if a < b]
    step_of = [0] * n
    for t, (a, b) in enumerate(bounds):
        for i in range(a, b):
            step_of[i] = t
    held_gradient = [0] * n  # a gradient held from its last making to its update point
    for name, (made, update) in spans.items():
        for i in range(made, update + 1):
            held_gradient[i] += sizes[name]
    memory = [max(timeline[i].mem_peak + held_gradient[i] for i in range(a, b)) for a, b in bounds]
    compute = [sum(ops[instructions[i].target].time_us for i in range(a, b) if instructions[i].runs_op)
               for a, b in bounds]  # fmt: skip
    steps = range(len(bounds))
    beta = bandwidth / 1e6  # bytes per microsecond
    device_speed, host_speed, overhead = (x / 1e6 if k < 2 else x for k, x in enumerate(speeds))
    smallest = min(names, key=lambda p: (sizes[p], p))

    lp = pulp.LpProblem("placement", pulp.LpMinimize)
    s = {p: lp.add_variable(f"s_{k}", 0, 0 if p == smallest else 1) for k, p in enumerate(names)}
    o = {p: lp.add_variable(f"o_{k}", 0, 1) for k, p in enumerate(names) if p in trainable_set}
    g = {p: lp.add_variable(f"g_{k}", 0, 1) for k, p in enumerate(names) if p in trainable_set}
    w = {p: lp.add_variable(f"w_{k}", 0, 1) for k, p in enumerate(names) if p in trainable_set}
    v = {p: lp.add_variable(f"v_{k}", 0, 1) for k, p in enumerate(names) if p in trainable_set}
    time_t = [lp.add_variable(f"time_{t}", 0) for t in steps]
    time_end = lp.add_variable("time_end", 0)
    lp += pulp.lpSum(time_t) + time_end
    for p in o:  # (4.6, 4.7, 4.11) as they apply to whole-step placements
        lp += o[p] + g[p] <= 1
        lp += w[p] >= o[p] - s[p]
        lp += v[p] >= s[p] - o[p]

    # (4.14-4.17) device memory per step
    state = {p: state_bytes(sizes[p]) for p in o}
    temp = {p: temp_bytes(sizes[p]) for p in o}
    resident_states = pulp.lpSum((1 - o[p] - g[p]) * state[p] for p in o)
    streamed_out = pulp.lpSum(s[p] * sizes[p] for p in names)
    all_parameters = sum(sizes.values())  # the activation plan counts no parameter
    read: list[set[str]] = [set() for _ in steps]
    updated: list[set[str]] = [set() for _ in steps]
    first_read: list[set[str]] = [set() for _ in steps]
    for p, e in events.items():
        spans_read = [(e.first_forward, e.last_forward)]
        if e.first_backward is not None:
            spans_read.append((e.first_backward, max(e.first_backward, e.update or 0)))
        for a, b in spans_read:
            first_read[step_of[a]].add(p)
            for t in range(max(0, step_of[a] - 1), step_of[b] + 1):  # prefetched in the step before
                read[t].add(p)
        if e.update is not None:
            updated[step_of[e.update]].add(p)
    def read_at(i: int) -> set[str]:
        """The parameters whose forward or backward reads span instruction i."""
        return {q for q, e in events.items() if e.first_forward <= i <= e.last_forward
                or e.first_backward is not None and e.first_backward <= i <= max(e.first_backward, e.update or 0)}

    for t in steps:
        near = updated[t] | (updated[t + 1] if t + 1 < len(bounds) else set())
        lp += (
            memory[t] + all_parameters - streamed_out + pulp.lpSum(s[p] * sizes[p] for p in sorted(read[t]))
            + resident_states
            + pulp.lpSum(g[p] * state[p] for p in sorted(near))
            <= budget
        ), f"memory_{t}"  # fmt: skip
        for p in sorted(updated[t]):  # while an update runs: the memory after its gradient's last op
            at = events[p].update
            assert at is not None
            lp += (
                timeline[at].mem_after + held_gradient[at] + all_parameters - streamed_out
                + pulp.lpSum(s[q] * sizes[q] for q in sorted(read_at(at))) + resident_states
                + pulp.lpSum(g[q] * state[q] for q in sorted(near)) + (1 - o[p]) * temp[p]
                <= budget
            ), f"update_{t}_{names.index(p)}"  # fmt: skip
    if host_budget is not None:  # (4.18)
        lp += pulp.lpSum(s[p] * sizes[p] for p in names) + pulp.lpSum(
            o[p] * (sizes[p] + state[p]) + g[p] * state[p] for p in o
        ) <= host_budget

    # (4.19-4.22) each step's compute, h2d and d2h streams
    for t in steps:
        device_work = [(1 - o[p]) * sizes[p] / device_speed for p in sorted(updated[t])] if device_speed else []
        lp += time_t[t] >= compute[t] + pulp.lpSum(device_work)
        if t + 1 < len(bounds):
            lp += time_t[t] * beta >= pulp.lpSum(s[p] * sizes[p] for p in sorted(first_read[t + 1])) + pulp.lpSum(
                g[p] * state[p] for p in sorted(updated[t + 1])
            )
        lp += time_t[t] * beta >= pulp.lpSum(
            o[p] * sizes[p] + g[p] * state[p] + v[p] * sizes[p] for p in sorted(updated[t])
        )
    lp += time_end * beta >= pulp.lpSum(w[p] * sizes[p] for p in o)
    # (4.23) the host's updates, one queue fed as the gradients complete
    if host_speed:
        for k in sorted({t for t in steps if updated[t]}):
            work = pulp.lpSum(
                o[p] * (sizes[p] / host_speed + overhead) for u in range(k, len(bounds)) for p in sorted(updated[u])
            )
            lp += pulp.lpSum(time_t[k + 1 :]) + time_end >= work
    result = milp.solve(lp)
    if not result.has_solution:
        return None

    def values(variables: dict[str, pulp.LpVariable]) -> dict[str, float]:
        return {p: round(x.value() or 0.0, 6) for p, x in variables.items()}

    return Fractions(values(s), values(o), values(g), float(pulp.value(lp.objective)))


def round_placement(fractions: Fractions, threshold: float, host_threshold: float) -> Placement:
    """`fractions` rounded to whole parameters (section 4.6): a parameter is streamed when
    s_i >= `threshold`, updated on the host when o_i >= `host_threshold`, else paged when
    the part of its states off the device, g_i plus the o_i rounded away, is at least
    `threshold` (so that rounding a host update down does not bring its states to the
    device for the whole step)."""
    streamed = frozenset(p for p, x in fractions.streamed.items() if x >= threshold)
    on_host = frozenset(p for p, x in fractions.on_host.items() if x >= host_threshold)
    paged = frozenset(
        p for p, x in fractions.paged.items() if p not in on_host and x + fractions.on_host[p] >= threshold
    )
    return Placement(streamed, on_host, paged, fractions.predicted_us)
