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
of those taken before it.  Two runs of an op in a row may both be dropped when every
output read from the later run's copy is read from the earlier one's too: the copy kept
from before the first then lives on over the earlier run's own copy, so the growths add
up; otherwise the first drop would have skipped an output the second needs kept.  Runs
that nobody reads any more (the inputs recomputed only for a dropped run, and theirs)
are then removed in one pass from the end, the order lowered and simulated again, and
the round kept only if the exact peak is within the budget (always, unless the timeline
above is wrong: then the previous order stays).  Rounds repeat until one drops nothing,
at most MAX_ROUNDS, and while the order entries simulated stay within POLISH_WORK (a
round costs about its order's length).  Dead runs go in one pass, not one level of
readers per pass, and a round drops every run that fits, so that plans of a 20,000-op
graph are polished in under a minute (`python bench/twremat_scale.py`; figures in
docs/measured-notes.md).  Everything is in a fixed order, so the result is deterministic.

NOTE: [Repair]
A solver's plans near its floor can be a little above the budget while the plans it makes
within the budget are much slower (GPT-2 at 30% of its autograd peak: docs/measured-notes.md).
`repair` brings such a plan under the budget: at its exact peak it recomputes one of the
tensors resident there and not used there, right before its next use (the lowering then
deletes the tensor after its last use before the peak, and keeps the producer's inputs
alive to the new run when they are not already).  Of the REPAIR_WIDTH largest such
tensors it estimates each move on the timeline (`_estimate`: the excess over the budget,
`_excess`, summed over the steps, so that a flat peak falls step by step), lowers and
simulates the REPAIR_EXACT that promise the most fall per microsecond added, takes the
best of those by the exact time added per byte-step the excess falls, and repeats until
the plan fits (at most REPAIR_STEPS moves, and at most REPAIR_WORK order entries lowered
in all).  What it returns was lowered and simulated exactly.

NOTE: [Backward ops moved up]
A backward op that writes its output into an input dying there (NOTE: [In-place
outputs] in remat_dsl.plan.inplace) and frees another input there allocates nothing and
frees that input: run earlier, right after the last run that makes or reads what it
reads, it frees that input earlier and holds nothing more anywhere (its output lives in
the storage its input held anyway).  So every order the driver lowers has such ops
moved up to there (`move_up`), kept when the exact peak falls; no random op is one, so
the random stream is drawn in the same order, and ops that do not read each other's outputs
give the same values in either order.  In a Llama decoder layer's MLP backward, for
example, `silu_backward` of the gate comes after both matrix products of the up
projection; moved up before them, it writes into the gate and frees the gradient it
reads, so less is held while those products run, in the same time (figures in
docs/measured-notes.md).  Such a plan's backward is then not in the captured order.

None of these is applied to plans with transfers (offload, prefetch: their timing depends on
the order).  Repair leaves orders of more than MAX_RUNS runs as they are (every try
lowers and simulates the whole plan, seconds there), polish those of more than
POLISH_WORK / 2 (not one round would fit); one round of polish scans at most DROP_WORK
timeline steps.  Polish keeps the recomputations the user asked for
(`recompute` constraints) and leaves plans above their budget as they are.  The plan's
decisions (comments) move with the runs they annotate, or to the next run left when
theirs is dropped, and the header's solver says what was done.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import replace

import numpy as np

from remat_dsl.check.replay import simulate, with_predictions
from remat_dsl.plan import ir
from remat_dsl.plan.constraints import matching
from remat_dsl.plan.errors import PlanError
from remat_dsl.plan.inplace import inplace_candidates
from remat_dsl.plan.ir import op_uses, pinned_tensors
from remat_dsl.plan.liveness import live_intervals
from remat_dsl.plan.units import format_duration
from remat_dsl.solve.api import Decision
from remat_dsl.solve.lowering import lower_order

MAX_ROUNDS = 8
MAX_RUNS = 20_000  # longer orders are not repaired: each try lowers and simulates the whole plan
POLISH_WORK = 1_000_000  # order entries polish simulates, at most, over its rounds
DROP_WORK = 200_000_000  # timeline steps one round of polish scans, at most, for its drops
REPAIR_STEPS = 64  # recomputations `repair` adds at most
REPAIR_WIDTH = 32  # tensors resident at the peak whose move it estimates, for each
REPAIR_EXACT = 2  # of those, the moves it lowers and simulates exactly
REPAIR_WORK = 2_000_000  # order entries lowered and simulated, at most, by one repair (a 2,000-run order: 1,000 tries)
REPAIR_NOTE = "repair: recomputed here for %s, which was resident at the peak above the budget"


def polish(plan: ir.Plan, budget: int) -> ir.Plan:
    """`plan` with the recomputations that fit `budget` (bytes) dropped (NOTE: [Polish]).

    Returns `plan` itself when nothing can be dropped, or when the plan is not polished
    (transfers, a peak above `budget`, more than POLISH_WORK / 2 runs); otherwise a plan of
    the same solver, status and budget whose exact peak is at most `budget`, whose time is
    lower, and whose header's solver ends `; polished -N recomputations, -T ms` (the time
    saved)."""
    instructions = plan.forward + plan.backward
    if plan.header.peak_bytes > budget or any(ins.is_transfer for ins in instructions):
        return plan
    order, decisions = _order_of(instructions)
    work = 2 * len(order)  # the simulation of `plan` and the first round
    if work > POLISH_WORK:
        return plan
    graph = plan.graph
    # the lowering would put a dropped constrained run back (slower round): never drop one
    wanted = {t.producer for t in graph.tensors if t.name in matching(graph, plan.constraints, "recompute")}
    index = _Index(graph)
    best, sim, dropped = plan, simulate(plan), 0
    for round_ in range(MAX_ROUNDS):
        if round_ and work + len(order) > POLISH_WORK:
            break
        work += len(order) * bool(round_)
        drops = _drops(index, order, sim.timeline, budget, wanted)
        if not drops:
            break
        keep = [i not in drops for i in range(len(order))]
        keep = _without_dead_runs(index, order, keep)
        new_order = [name for name, k in zip(order, keep) if k]
        new_decisions = _moved(decisions, keep)
        try:
            candidate, candidate_sim = _lowered_like(best, new_order, new_decisions)
        except PlanError:
            break
        if candidate_sim.peak_bytes > budget or candidate_sim.time_us >= sim.time_us:
            break
        dropped += len(order) - len(new_order)
        best, sim, order, decisions = candidate, candidate_sim, new_order, new_decisions
    if best is plan:
        return plan
    saved = format_duration(plan.header.time_us - best.header.time_us)
    solver = f"{plan.header.solver}; polished -{dropped} recomputations, -{saved}"
    return replace(best, header=replace(best.header, solver=solver))


def repair(plan: ir.Plan, budget: int) -> ir.Plan | None:
    """`plan` with recomputations added until its exact peak is at most `budget` (bytes),
    or None when REPAIR_STEPS of them do not get there, or the plan has transfers or more
    than MAX_RUNS runs (NOTE: [Repair]).  Its header's
    solver ends `; repaired +N recomputations`, each added run has a comment saying why,
    and its status is `feasible`."""
    instructions = plan.forward + plan.backward
    if any(ins.is_transfer for ins in instructions):
        return None
    if plan.header.peak_bytes <= budget:
        return plan
    index = _Index(plan.graph)
    order, decisions = _order_of(instructions)
    if len(order) > MAX_RUNS:
        return None
    current, sim = plan, simulate(plan)
    tries = REPAIR_WORK // max(1, len(order))
    for added in range(1, REPAIR_STEPS + 1):
        best, excess = None, _excess(sim, budget)
        for at, tensor in _repair_moves(index, order, sim, budget):
            tries -= 1
            if tries < 0:
                return None
            new_order = order[:at] + [index.producer[tensor]] + order[at:]
            new_decisions = [Decision(d.at + (d.at >= at), d.text) for d in decisions]
            new_decisions.append(Decision(at, REPAIR_NOTE % tensor))
            try:
                candidate, candidate_sim = _lowered_like(current, new_order, new_decisions)
            except PlanError:
                continue
            fall = excess - _excess(candidate_sim, budget)
            if fall <= 0:
                continue
            key = ((candidate_sim.time_us - sim.time_us) / fall, at, tensor)
            if best is None or key < best[0]:
                best = (key, candidate, candidate_sim, new_order, new_decisions)
        if best is None:
            return None
        _, current, sim, order, decisions = best
        if sim.peak_bytes <= budget:
            solver = f"{plan.header.solver}; repaired +{added} recomputations"
            return replace(current, header=replace(current.header, solver=solver, status="feasible"))
    return None


def _excess(sim, budget: int) -> int:
    """Byte-steps above `budget`: the sum over the steps of how far each one's peak is
    above it (0: the plan fits).  A flat peak over several steps falls step by step."""
    return sum(max(0, step.mem_peak - budget) for step in sim.timeline)


def _repair_moves(index: _Index, order: list[str], sim, budget: int) -> list[tuple[int, str]]:
    """(position, tensor): recompute `tensor` right before `position`, its next use after
    the peak; of the REPAIR_WIDTH largest tensors resident at the peak and not used there,
    the REPAIR_EXACT whose estimated excess (`_excess`) falls most per microsecond added
    (`_estimate`)."""
    steps = sim.timeline
    peaks = np.array([step.mem_peak for step in steps], dtype=np.int64)
    k = int(peaks.argmax())
    run_at = [i for i, step in enumerate(steps) if step.instruction.runs_op]
    at_peak = bisect.bisect_right(run_at, k) - 1
    busy = set(index.uses[order[at_peak]]) | set(index.ops[order[at_peak]].outputs) if at_peak >= 0 else set()
    intervals = _intervals(steps)
    live = [
        (index.nbytes[name], name)
        for name, spans in intervals.items()
        if name in index.producer and name not in busy and name not in index.pinned
        and index.ops[index.producer[name]].phase == ir.FORWARD and any(a < k <= r for a, r in spans)
    ]  # fmt: skip
    scored, excess = [], int(np.maximum(peaks - budget, 0).sum())
    for _, tensor in sorted(live, key=lambda item: (-item[0], item[1]))[:REPAIR_WIDTH]:
        use = next((i for i in range(at_peak + 1, len(order)) if tensor in index.uses[order[i]]), None)
        if use is None:
            continue
        fall = excess - _estimate(index, order, steps, peaks, intervals, run_at, at_peak, tensor, use, budget)
        if fall > 0:
            scored.append((index.ops[index.producer[tensor]].time_us / fall, use, tensor))
    return [(use, tensor) for _, use, tensor in sorted(scored)[:REPAIR_EXACT]]


def _estimate(index: _Index, order, steps, peaks, intervals, run_at, at_peak: int, tensor: str, use: int,
              budget: int) -> int:  # fmt: skip
    """`_excess` after recomputing `tensor` right before position `use`, estimated on the
    timeline: `tensor` is gone from after its last use up to the peak to the new
    run, the producer's inputs not resident there are kept from their delete to it, and
    the new run holds its inputs, outputs and temporaries."""
    producer = index.ops[index.producer[tensor]]
    u = run_at[use]
    made = max(a for a, r in intervals[tensor] if a < u)
    reads = (run_at[p] for p in range(at_peak, -1, -1) if run_at[p] > made and tensor in index.uses[order[p]])
    last = next(reads, made)  # the last run reading it up to the peak, or the one that made it
    delta = np.zeros_like(peaks)
    delta[last + 1 : u] -= index.nbytes[tensor]
    kept = 0
    for name in index.uses[producer.name]:
        spans = [(a, r) for a, r in intervals.get(name, ()) if a < u]
        if not spans or any(r >= u for _, r in spans):
            continue
        r = max(r for _, r in spans)
        delta[r + 1 : u] += index.nbytes[name]
        kept += index.nbytes[name]
    made_bytes = sum(index.nbytes[t] for t in producer.outputs) + producer.temp_bytes
    run_peak = steps[u].mem_before - index.nbytes[tensor] + kept + made_bytes
    return int(np.maximum(peaks + delta - budget, 0).sum()) + max(0, run_peak - budget)


def _intervals(steps) -> dict[str, list[tuple[int, int]]]:
    """name -> (a, r) for each copy: made at step a, deleted at step r (len(steps) when never),
    from the steps' events (NOTE: [Step events] in remat_dsl.check.replay)."""
    spans: dict[str, list[tuple[int, int]]] = defaultdict(list)
    start: dict[str, int] = {}
    for i, step in enumerate(steps):
        for name, _ in step.added:
            start[name] = i
        for name, _ in step.removed:
            if name in start:
                spans[name].append((start.pop(name), i))
    for name, a in start.items():
        spans[name].append((a, len(steps)))
    return spans


class _Index:
    """The graph's ops and tensors by name (NOTE: [Graph index] in remat_dsl.plan.ir), and
    what each op reads (tensor names)."""

    def __init__(self, graph: ir.Graph):
        self.graph = graph
        self.ops = graph.op_by_name
        self.uses = {op.name: op_uses(op, graph.tensor_by_name) for op in graph.ops}
        self.nbytes = graph.nbytes
        self.pinned = pinned_tensors(graph)
        self.producer = graph.producer

    def steps(self, order: list[str]) -> list[tuple[list[str], tuple[str, ...]]]:
        """`order`'s steps for `live_intervals`: what each op reads, its outputs."""
        return [(self.uses[name], self.ops[name].outputs) for name in order]


def move_up(plan: ir.Plan) -> ir.Plan:
    """`plan` with its backward ops that write in place moved up (NOTE: [Backward ops
    moved up]) when that lowers its exact peak and no more; else `plan` itself.  The
    header's solver then ends `; N backward ops moved up`.  Plans with transfers, or of
    more than MAX_RUNS runs, are left as they are."""
    instructions = plan.forward + plan.backward
    if any(ins.is_transfer for ins in instructions):
        return plan
    order, decisions = _order_of(instructions)
    if len(order) > MAX_RUNS:
        return plan
    moved, new_order, new_decisions = _moved_up(_Index(plan.graph), order, decisions)
    if not moved:
        return plan
    try:
        candidate, sim = _lowered_like(plan, new_order, new_decisions)
    except PlanError:
        return plan
    if sim.peak_bytes >= plan.header.peak_bytes or sim.time_us > plan.header.time_us:
        return plan
    return replace(
        candidate, header=replace(candidate.header, solver=f"{plan.header.solver}; {moved} backward ops moved up")
    )


def _moved_up(index: _Index, order: list[str], decisions: list[Decision]) -> tuple[int, list[str], list[Decision]]:
    """(how many runs moved, the order, its decisions) with every backward op that writes
    into an input dying there and frees another one there run right after the last run
    that makes or reads what it reads (NOTE: [Backward ops moved up])."""
    candidates = inplace_candidates(index.graph)
    dying = _last_reads(index, order)  # invariant under these moves: no run moves above a reader of what dies at it
    runs = list(range(len(order)))  # positions in `order`, in their new order
    moved = 0
    for j in range(len(runs)):
        name = order[runs[j]]
        if index.ops[name].phase != ir.BACKWARD or name not in candidates:
            continue
        dies = dying[runs[j]]
        into = next((t for t in candidates[name] if t in dies), None)  # as the simulation picks it
        if into is None or not any(index.nbytes[t] for t in dies - {into}):
            continue
        makers = {index.producer[t] for t in index.uses[name]}
        at = j - 1
        while at >= 0 and order[runs[at]] not in makers and not (dies & set(index.uses[order[runs[at]]])):
            at -= 1
        if at + 1 < j:
            runs.insert(at + 1, runs.pop(j))
            moved += 1
    if not moved:
        return 0, order, decisions
    where = {old: new for new, old in enumerate(runs)}
    return moved, [order[i] for i in runs], sorted((replace(d, at=where[d.at]) for d in decisions), key=lambda d: d.at)


def _last_reads(index: _Index, order: list[str]) -> list[set[str]]:
    """For each position of `order`, the tensors it reads last before they are made again
    (or ever), that may be freed (not pinned): the copies whose interval ends at a read
    there (NOTE: [Liveness] in remat_dsl.plan.liveness)."""
    last: list[set[str]] = [set() for _ in order]
    for iv in live_intervals(index.steps(order), pinned=index.pinned):
        if iv.last_read is not None and iv.end is not None:
            last[iv.last_read].add(iv.tensor)
    return last


def _order_of(instructions) -> tuple[list[str], list[Decision]]:
    """The op order of a plan's runs, and its comments as decisions at their positions."""
    order: list[str] = []
    decisions: list[Decision] = []
    for ins in instructions:
        if ins.runs_op:
            decisions += [Decision(len(order), text) for text in ins.comments]
            order.append(ins.target)
    return order, decisions


def _lowered_like(plan: ir.Plan, order: list[str], decisions: list[Decision]):
    """The plan of `order` with `plan`'s header fields, and its Simulation.
    Raises PlanError when the order breaks a rule of the checker."""
    forward, backward = lower_order(plan.graph, order, plan.constraints, decisions)
    new = replace(plan, forward=forward, backward=backward)
    sim = simulate(new)
    new = with_predictions(new, sim)
    return new, sim


def _drops(index: _Index, order: list[str], timeline, budget: int, wanted: set[str]) -> set[int]:
    """Positions of `order` whose recomputation is dropped this round (NOTE: [Polish])."""
    ops = index.ops
    peak = np.array([step.mem_peak for step in timeline], dtype=np.int64)
    growth = np.zeros_like(peak)
    run_at, deletes = [], defaultdict(list)  # position -> instruction index; tensor -> delete indices
    for k, step in enumerate(timeline):
        ins = step.instruction
        if ins.runs_op:
            run_at.append(k)
        elif ins.verb == "delete":
            deletes[ins.target].append(k)
    previous: dict[str, int] = {}  # op -> position of its latest run
    before, after = {}, {}  # position -> the position of the op's run before it, after it
    read_later = _read_before_remade(index, order)
    candidates = []
    for i, name in enumerate(order):
        j = previous.get(name)
        previous[name] = i
        if j is None or ops[name].phase != ir.FORWARD or name in wanted:
            continue
        before[i], after[j] = j, i
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

    def read(i: int) -> set[str]:
        return {t for t, r in read_later[i].items() if r and t not in index.pinned}

    drops, work = set(), DROP_WORK
    for _, i, extend in sorted(candidates, key=lambda c: (c[0], c[1])):
        # two runs of an op in a row dropped: the growths add up when every output read from
        # the later copy is read from the earlier one too (the merged copy lives over both)
        j, k = before.get(i, -1), after.get(i, -1)  # -1: no such run, never dropped
        if (j in drops and not read(i) <= read(j)) or (k in drops and not read(k) <= read(i)):
            continue
        if extend:
            lo, hi = min(a for a, _, _ in extend), max(b for _, b, _ in extend)
            work -= hi - lo
            if work < 0:
                break
            grown = growth[lo:hi].copy()
            for a, b, n in extend:
                grown[a - lo : b - lo] += n
            if hi > lo and int((peak[lo:hi] + grown).max()) > budget:
                continue
            growth[lo:hi] = grown
        drops.add(i)
    return drops


def _read_before_remade(index: _Index, order: list[str]) -> list[dict[str, bool]]:
    """For each position i: output -> whether a later op reads the copy run i makes
    (before that output is made again; NOTE: [Liveness] in remat_dsl.plan.liveness)."""
    result: list[dict[str, bool]] = [{} for _ in order]
    for iv in live_intervals(index.steps(order)):
        result[iv.made][iv.tensor] = iv.last_read is not None
    return result


def _without_dead_runs(index: _Index, order: list[str], keep: list[bool]) -> list[bool]:
    """`keep` with the recomputations nobody reads removed (a dropped run's inputs
    recomputed only for it, and theirs in turn): one pass from the end of the order,
    keeping a run when a later kept run reads one of its outputs before a later kept run
    makes it again (or an output is pinned).  Runs after a position are decided before
    it, so one pass removes what removing dead runs until none is left would."""
    keep = list(keep)
    first: dict[str, int] = {}
    for i, name in enumerate(order):
        first.setdefault(name, i)
    needed: set[str] = set()  # tensors a later kept run reads from the copy current here
    for i in range(len(order) - 1, -1, -1):
        if not keep[i]:
            continue
        op = index.ops[order[i]]
        if first[order[i]] != i and op.phase == ir.FORWARD:
            if not any(t in needed or t in index.pinned for t in op.outputs):
                keep[i] = False
                continue
        needed.difference_update(op.outputs)
        needed.update(index.uses[order[i]])
    return keep


def _moved(decisions: list[Decision], keep: list[bool]) -> list[Decision]:
    """Decisions at their runs' new positions; one whose run is dropped goes to the next run
    kept (the block it annotates starts there), or is left out at the end of the order."""
    new_position, p = [], 0
    for k in keep:
        new_position.append(p)
        p += k
    return [Decision(new_position[d.at], d.text) for d in decisions if new_position[d.at] < p]
