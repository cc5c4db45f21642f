"""Local moves on a lowered plan: repair one a little above its budget, polish one within it.

A solver plans with its own model of memory (rotor's discretized chain, Rockmate's
per-block options, the H-ILP's clusters; NOTE: [Budget correction] in
remat_dsl.solve.driver), and the budget correction then lowers its target until the
exact simulation fits.  Both leave memory unused at most moments of the step: the plan
is shaped by its one peak, and a recomputation far from that peak pays time for memory
nobody needed there.

NOTE: [Polish]
Dropping the recomputation of op X at position i of the order keeps the outputs of X's
previous run alive from where the lowering deleted them (after their last use before i)
to i, where the recomputed copy would have been made; from i on nothing changes (the
kept copy is deleted where the recomputed one was).  So the exact timeline of the plan
(remat_dsl.check.replay, one Step per instruction) grows by those outputs' bytes on that
interval and nowhere else; it can also shrink (X's inputs may die earlier, X's
temporaries and allocation at i are gone), which we do not count.  A drop is taken when
the grown timeline stays within the budget everywhere.

Each round simulates the current order once and visits its recomputations by the time
they take (largest first, then by position), taking every one that fits with the growth
of those taken before it (at most one per op per round: a second drop of the same op
would start from a delete the first one moved).  Runs that nobody reads any more (the
inputs recomputed only for a dropped run) are then removed, the order lowered and
simulated again, and the round kept only if the exact peak is within the budget (always,
unless the timeline above is wrong: then the previous order stays).  Rounds repeat
until one drops nothing, at most MAX_ROUNDS.  Everything is in a fixed order, so the
result is deterministic.

NOTE: [Repair]
A solver's plans near its floor can be a little above the budget while plans it makes
within the budget are much slower: at 30% of GPT-2's (4 layers) autograd peak, Rockmate's
smallest plan peaked 1.3% above the budget at 54,954 us, and the plan the driver then
took, from a fallback, predicted 83,881 us.  `repair` brings such a plan under the
budget: at its exact peak it recomputes one of the tensors resident there and not used
there, right before its next use (the lowering then deletes the tensor after its last use
before the peak, and keeps the producer's inputs alive to the new run when they are not
already), choosing among the REPAIR_WIDTH largest by the exact time added per byte the
peak falls, and repeats until the peak fits (at most REPAIR_STEPS times, and at most
REPAIR_WORK order entries lowered in all, so that a 20,000-op graph tries few).  Each candidate
is lowered and simulated exactly, so what it reports is what the plan does.

Neither is applied to plans with transfers (offload, prefetch: their timing depends on the
order), recomputations the user asked for (`recompute` constraints), and plans above
their budget.  The plan's decisions (comments) move with the runs they annotate, or to
the next run left when theirs is dropped, and the header says what the polish did.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import numpy as np

from remat_dsl.check.replay import simulate, with_predictions
from remat_dsl.plan import ir
from remat_dsl.plan.constraints import matching
from remat_dsl.plan.errors import PlanError
from remat_dsl.plan.ir import op_uses, pinned_tensors
from remat_dsl.plan.units import format_bytes, format_duration
from remat_dsl.solve.api import Decision
from remat_dsl.solve.lowering import lower_order

MAX_ROUNDS = 8
REPAIR_STEPS = 24  # recomputations `repair` adds at most
REPAIR_WIDTH = 16  # tensors resident at the peak it tries for each
REPAIR_WORK = 2_000_000  # order entries lowered and simulated, at most, by one repair (a 2,000-run order: 1,000 tries)
RUN_VERBS = ("compute", "recompute")


def polish(plan: ir.Plan, budget: int) -> ir.Plan:
    """`plan` with the recomputations that fit `budget` (bytes) dropped (NOTE: [Polish]).

    Returns `plan` itself when nothing can be dropped, or when the plan is not polished
    (transfers, a peak above `budget`); otherwise a plan of the same solver, status and
    budget whose exact peak is at most `budget`, whose time is lower, and whose header
    comments say how many recomputations were dropped and the time saved (us)."""
    instructions = plan.forward + plan.backward
    if plan.header.peak_bytes > budget or any(ins.verb not in (*RUN_VERBS, "delete") for ins in instructions):
        return plan
    order, decisions = _order_of(instructions)
    graph = plan.graph
    wanted = {t.producer for t in graph.tensors if t.name in matching(graph, plan.constraints, "recompute")}
    index = _Index(graph)
    best, sim, dropped = plan, simulate(plan), 0
    for _ in range(MAX_ROUNDS):
        drops = _drops(index, order, sim.timeline, budget, wanted)
        if not drops:
            break
        keep = [i not in drops for i in range(len(order))]
        keep = _without_dead_runs(index, order, keep)
        new_order = [name for name, k in zip(order, keep) if k]
        new_decisions = _moved(decisions, keep)
        try:
            candidate, candidate_sim = _lowered_like(best, new_order, new_decisions, with_simulation=True)
        except PlanError:
            break
        if candidate_sim.peak_bytes > budget or candidate_sim.time_us >= sim.time_us:
            break
        dropped += len(order) - len(new_order)
        best, sim, order, decisions = candidate, candidate_sim, new_order, new_decisions
    if best is plan:
        return plan
    saved = plan.header.time_us - best.header.time_us
    note = f"polish: {dropped} recomputations dropped where keeping their values fits the budget, saving {format_duration(saved)}"
    return replace(best, header=replace(best.header, comments=plan.header.comments + (note,)))


def repair(plan: ir.Plan, budget: int) -> ir.Plan | None:
    """`plan` with recomputations added until its exact peak is at most `budget` (bytes),
    or None when REPAIR_STEPS of them do not get there (NOTE: [Repair]).  The header's
    comments say how many were added and the peak before; its status is `feasible`."""
    instructions = plan.forward + plan.backward
    if any(ins.verb not in (*RUN_VERBS, "delete") for ins in instructions):
        return None
    if plan.header.peak_bytes <= budget:
        return plan
    index = _Index(plan.graph)
    order, decisions = _order_of(instructions)
    current, sim = plan, simulate(plan)
    tries = REPAIR_WORK // max(1, len(order))
    for added in range(1, REPAIR_STEPS + 1):
        best = None
        for at, tensor in _repair_moves(index, order, sim):
            tries -= 1
            if tries < 0:
                return None
            new_order = order[:at] + [index.producer[tensor]] + order[at:]
            new_decisions = [Decision(d.at + (d.at >= at), d.text) for d in decisions]
            try:
                candidate, candidate_sim = _lowered_like(current, new_order, new_decisions, with_simulation=True)
            except PlanError:
                continue
            fall = sim.peak_bytes - candidate_sim.peak_bytes
            if fall <= 0:
                continue
            key = ((candidate_sim.time_us - sim.time_us) / fall, at, tensor)
            if best is None or key < best[0]:
                best = (key, candidate, candidate_sim, new_order, new_decisions)
        if best is None:
            return None
        _, current, sim, order, decisions = best
        if sim.peak_bytes <= budget:
            note = (f"repair: {added} recomputations added to bring the peak from {format_bytes(plan.header.peak_bytes)} "
                    f"down to the budget")
            header = replace(current.header, status="feasible", comments=plan.header.comments + (note,))
            return replace(current, header=header)
    return None


def _repair_moves(index: _Index, order: list[str], sim) -> list[tuple[int, str]]:
    """(position, tensor): recompute `tensor` right before `position`, its next use after
    the peak; for the REPAIR_WIDTH largest tensors resident at the peak and not used there."""
    k = max(range(len(sim.timeline)), key=lambda i: sim.timeline[i].mem_peak)
    at_peak = sum(1 for step in sim.timeline[: k + 1] if step.instruction.verb in RUN_VERBS) - 1
    busy = set(index.uses[order[at_peak]]) | set(index.ops[order[at_peak]].outputs) if at_peak >= 0 else set()
    live = [(n, name) for name, n in _resident_at(sim, k) if name not in busy and name not in index.pinned]
    live = [(n, name) for n, name in live if name in index.producer and index.ops[index.producer[name]].phase == ir.FORWARD]
    moves = []
    for _, tensor in sorted(live, key=lambda item: (-item[0], item[1]))[:REPAIR_WIDTH]:
        use = next((i for i in range(at_peak + 1, len(order)) if tensor in index.uses[order[i]]), None)
        if use is not None:
            moves.append((use, tensor))
    return moves


def _resident_at(sim, k: int) -> list[tuple[str, int]]:
    """(tensor, bytes) resident when step k runs, from the steps' events (NOTE: [Step events])."""
    resident: dict[str, int] = {}
    for step in sim.timeline[:k]:
        for name, n in step.added:
            resident[name] = n
        for name, _ in step.removed:
            resident.pop(name, None)
    return list(resident.items())


class _Index:
    """The graph's ops and tensors by name, and what each op reads (tensor names)."""

    def __init__(self, graph: ir.Graph):
        self.graph = graph
        self.ops = {op.name: op for op in graph.ops}
        names = {t.name for t in graph.tensors}
        self.uses = {op.name: op_uses(op, names) for op in graph.ops}
        self.nbytes = {t.name: t.nbytes for t in graph.tensors}
        self.pinned = pinned_tensors(graph)
        self.producer = {t.name: t.producer for t in graph.tensors}


def _order_of(instructions) -> tuple[list[str], list[Decision]]:
    """The op order of a plan's runs, and its comments as decisions at their positions."""
    order, decisions = [], []
    for ins in instructions:
        if ins.verb in RUN_VERBS:
            decisions += [Decision(len(order), text) for text in ins.comments]
            order.append(ins.target)
    return order, decisions


def _lowered_like(plan: ir.Plan, order: list[str], decisions: list[Decision], with_simulation: bool = False):
    """The plan of `order` with `plan`'s header fields (and its Simulation, if asked).
    Raises PlanError when the order breaks a rule of the checker."""
    forward, backward = lower_order(plan.graph, order, plan.constraints, decisions)
    new = replace(plan, forward=forward, backward=backward)
    sim = simulate(new)
    new = with_predictions(new, sim)
    return (new, sim) if with_simulation else new


def _drops(index: _Index, order: list[str], timeline, budget: int, wanted: set[str]) -> set[int]:
    """Positions of `order` whose recomputation is dropped this round (NOTE: [Polish])."""
    ops = index.ops
    peak = np.array([step.mem_peak for step in timeline], dtype=np.int64)
    growth = np.zeros_like(peak)
    run_at, deletes = [], defaultdict(list)  # position -> instruction index; tensor -> delete indices
    for k, step in enumerate(timeline):
        ins = step.instruction
        if ins.verb in RUN_VERBS:
            run_at.append(k)
        elif ins.verb == "delete":
            deletes[ins.target].append(k)
    previous: dict[str, int] = {}  # op -> position of its latest run
    read_later = _read_before_remade(index, order)
    candidates = []
    for i, name in enumerate(order):
        j = previous.get(name)
        previous[name] = i
        if j is None or ops[name].phase != ir.FORWARD or name in wanted:
            continue
        extend = []  # (first step, last step, bytes): an output kept from run j to run i
        for t in ops[name].outputs:
            if t in index.pinned or not read_later[i].get(t, False):
                continue
            d = next((k for k in deletes[t] if run_at[j] < k < run_at[i]), None)
            if d is None:
                break
            extend.append((d + 1, run_at[i], index.nbytes[t]))
        else:
            candidates.append((-ops[name].time_us, i, extend))
    drops, dropped_ops = set(), set()
    for _, i, extend in sorted(candidates, key=lambda c: (c[0], c[1])):
        if order[i] in dropped_ops:
            continue
        if extend:
            lo, hi = min(a for a, _, _ in extend), max(b for _, b, _ in extend)
            grown = growth[lo:hi].copy()
            for a, b, n in extend:
                grown[a - lo : b - lo] += n
            if hi > lo and int((peak[lo:hi] + grown).max()) > budget:
                continue
            growth[lo:hi] = grown
        drops.add(i)
        dropped_ops.add(order[i])
    return drops


def _read_before_remade(index: _Index, order: list[str]) -> list[dict[str, bool]]:
    """For each position i: output -> whether a later op reads the copy run i makes
    (before that output is made again)."""
    result: list[dict[str, bool]] = [{} for _ in order]
    maker: dict[str, int] = {}  # tensor -> position of the run whose copy is current
    for i, name in enumerate(order):
        for t in index.uses[name]:
            if t in maker:
                result[maker[t]][t] = True
        for t in index.ops[name].outputs:
            maker[t] = i
            result[i].setdefault(t, False)
    return result


def _without_dead_runs(index: _Index, order: list[str], keep: list[bool]) -> list[bool]:
    """`keep` with the recomputations nobody reads removed, until none is left (a dropped
    run's inputs recomputed only for it)."""
    keep = list(keep)
    while True:
        kept = [name for name, k in zip(order, keep) if k]
        positions = [i for i, k in enumerate(keep) if k]
        read = _read_before_remade(index, kept)
        seen: set[str] = set()
        dead = []
        for p, name in enumerate(kept):
            first = name not in seen
            seen.add(name)
            if first or index.ops[name].phase != ir.FORWARD:
                continue
            if not any(read[p].get(t) or t in index.pinned for t in index.ops[name].outputs):
                dead.append(positions[p])
        if not dead:
            return keep
        for i in dead:
            keep[i] = False


def _moved(decisions: list[Decision], keep: list[bool]) -> list[Decision]:
    """Decisions at their runs' new positions; one whose run is dropped goes to the next run
    kept (the block it annotates starts there), or is left out at the end of the order."""
    new_position, p = [], 0
    for k in keep:
        new_position.append(p)
        p += k
    return [Decision(new_position[d.at], d.text) for d in decisions if new_position[d.at] < p]
