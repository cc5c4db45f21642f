"""The one lowering from solver decisions to plan instructions.

Every solver decides only the ORDER in which operations run: a list of op names, where
the first run of a forward op is a `compute` and any later run a `recompute`, split into
the forward section (everything before the first backward op) and the backward section.
`lower` turns that order into instructions by liveness: each tensor is deleted right after
its last use before it is next created (or the step ends), so memory is exactly what the
order needs and nothing is freed that is still used (NOTE: [Liveness] in
remat_dsl.plan.liveness).  Model outputs and parameter gradients are never deleted (the
caller and autograd hold them).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from remat_dsl.plan import ir
from remat_dsl.plan.constraints import matching
from remat_dsl.plan.ir import buffer_readers, op_uses, pinned_tensors
from remat_dsl.plan.liveness import live_intervals, op_steps

PREFETCH_LEAD = 3  # backward instructions between a prefetch and the use it serves


def lower_order(
    graph: ir.Graph, order, constraints=(), decisions=(), transfers=()
) -> tuple[tuple[ir.Instruction, ...], tuple[ir.Instruction, ...]]:
    """The forward and backward instructions of a solver's op `order`, with the user's
    constraints applied (NOTE: [Applying constraints] in remat_dsl.plan.constraints):
    the order edited for keep/recompute, lowered, the solver's own transfers added
    (`add_transfers`), then transfers for offload constraints.
    decisions: the solver's words (remat_dsl.solve.api.Decision), each a comment above
    the instruction that runs the op at its position of `order`.  transfers: the
    solver's offloads (remat_dsl.solve.api.Transfer), positions in `order`."""
    edited = constrain_order(graph, list(order), constraints)
    forward, backward = lower(graph, edited)
    forward, backward = add_transfers(graph, forward, backward, list(order), transfers)
    forward, backward = add_offloads(graph, forward, backward, constraints)
    return _annotated(forward, backward, list(order), decisions)


def _run_index(instructions) -> dict[tuple[str, int], int]:
    """(op, k) -> index in `instructions` of the k-th run (compute or recompute) of op."""
    runs: dict[tuple[str, int], int] = {}
    seen: dict[str, int] = {}
    for index, ins in enumerate(instructions):
        if ins.runs_op:
            runs[ins.target, seen.get(ins.target, 0)] = index
            seen[ins.target] = seen.get(ins.target, 0) + 1
    return runs


def _position(runs, order: list[str], at: int) -> int | None:
    """The instruction index running order[at] (None when the constraints took that run away)."""
    op = order[at]
    return runs.get((op, order[:at].count(op)))


def _annotated(forward, backward, order: list[str], decisions):
    """NOTE: [Decisions as comments] A decision at position i of the solver's order goes
    above the k-th run (compute or recompute) of the op order[i], k its runs before i; a
    run that the constraints took away takes no comment."""
    instructions = list(forward) + list(backward)
    runs = _run_index(instructions)
    for decision in decisions:
        index = _position(runs, order, decision.at)
        if index is not None:
            ins = instructions[index]
            instructions[index] = replace(ins, comments=ins.comments + (decision.text,))
    return tuple(instructions[: len(forward)]), tuple(instructions[len(forward) :])


def add_transfers(graph: ir.Graph, forward, backward, order: list[str], transfers):
    """Forward and backward instructions with a solver's transfers (remat_dsl.solve.api.Transfer).

    NOTE: [Solver transfers] For a saved tensor T: `offload T` on d2h right after the
    compute that makes T (the copy reads T while the forward goes on using it), `wait T`
    and `delete T` after the op at `wait_after` and the deletes that follow it (the end
    of the solver's step: the copy overlaps the step's ops), `prefetch T` on h2d right
    before the backward op at `prefetch_before` (its device copy is allocated there), and
    `wait T` right before the first op after it that reads T.  A transfer whose ops the
    constraints took away, or whose T no op reads after `prefetch_before`, is left out;
    the exact simulation checks the rest.  Raises ValueError when a transfer
    is out of order (its prefetch before the backward, its wait before its offload).
    """
    if not transfers:
        return forward, backward
    ops = graph.op_by_name
    names = graph.tensor_by_name
    instructions = list(forward) + list(backward)
    runs = _run_index(instructions)
    before: dict[tuple[int, str], list[ir.Instruction]] = defaultdict(list)  # (index, section) -> to insert before it
    for transfer in sorted(transfers, key=lambda t: (t.offload_after, t.tensor)):
        t = transfer.tensor
        made, done, back = (
            _position(runs, order, p) for p in (transfer.offload_after, transfer.wait_after, transfer.prefetch_before)
        )
        if made is None or done is None or back is None:
            continue
        if not (made <= done < len(forward) <= back):
            raise ValueError(f"transfer of {t}: offload at {made}, wait at {done}, prefetch at {back} are out of order")
        use = next((i for i in range(back, len(instructions)) if _reads(instructions[i], t, ops, names)), None)
        if use is None:
            continue
        before[made + 1, ir.FORWARD].append(ir.Instruction("offload", t, ir.D2H_STREAM))
        before[_after_deletes(instructions, done), ir.FORWARD] += [
            ir.Instruction("wait", t, ir.COMPUTE_STREAM),
            ir.Instruction("delete", t, ir.COMPUTE_STREAM),
        ]
        before[back, ir.BACKWARD].append(ir.Instruction("prefetch", t, ir.H2D_STREAM))
        before[use, ir.BACKWARD].append(ir.Instruction("wait", t, ir.COMPUTE_STREAM))
    result: dict[str, list[ir.Instruction]] = {ir.FORWARD: [], ir.BACKWARD: []}
    for index, ins in enumerate(instructions + [None]):
        for section in (ir.FORWARD, ir.BACKWARD):  # at len(forward): the forward's end, then the backward's start
            result[section] += before.get((index, section), [])
        if ins is not None:
            result[ir.FORWARD if index < len(forward) else ir.BACKWARD].append(ins)
    return tuple(result[ir.FORWARD]), tuple(result[ir.BACKWARD])


def _reads(ins: ir.Instruction, tensor: str, ops, names) -> bool:
    return ins.runs_op and tensor in op_uses(ops[ins.target], names)


def _after_deletes(instructions, index: int) -> int:
    """The index right after instruction `index` and the deletes that follow it."""
    index += 1
    while index < len(instructions) and instructions[index].verb == "delete":
        index += 1
    return index


DEFAULT_BANDWIDTH = 12 * 10**9  # bytes/s, PCIe 4 x16 in practice


def lowered_plan(
    graph: ir.Graph,
    order,
    *,
    constraints=(),
    model: str = "",
    device: str = "cpu",
    budget: int = 0,
    solver: str = "",
    status: str = "optimal",
    bandwidth: int = DEFAULT_BANDWIDTH,
    decisions=(),
    transfers=(),
    inplace: bool = True,
) -> ir.Plan:
    """The plan of a solver's op `order` and `transfers`: lowered (`lower_order`),
    simulated exactly (remat_dsl.check.replay; `inplace` False: without in-place outputs,
    as eager PyTorch runs) and with the simulation's predictions in its header.  Raises
    PlanError when the transfers break a rule of the checker."""
    from remat_dsl.check.replay import simulate, with_predictions

    forward, backward = lower_order(graph, order, constraints, decisions, transfers)
    header = ir.Header(model, device, budget, ir.BUDGET_COUNTS, solver, status, 0, "forward:1", 0, 0, 0, bandwidth)
    plan = ir.Plan(header, graph, forward, backward, constraints=tuple(constraints))
    return with_predictions(plan, simulate(plan, inplace=inplace))


def simulated_peak(graph: ir.Graph, order, constraints=(), device: str = "cpu") -> int:
    """The exact peak (bytes) of the plan of `order` (`lowered_plan`)."""
    return lowered_plan(graph, order, constraints=constraints, device=device).header.peak_bytes


def autograd_order(graph: ir.Graph) -> tuple[str, ...]:
    """What PyTorch does: every op once, in graph order (the store-all order)."""
    return tuple(op.name for op in graph.ops)


def lower(graph: ir.Graph, order: list[str]) -> tuple[tuple[ir.Instruction, ...], tuple[ir.Instruction, ...]]:
    """Instructions for running ops in `order`, with deletes placed by liveness.

    order: op names; forward ops before the first backward op form the forward section.
    Returns (forward instructions, backward instructions).
    """
    ops = graph.op_by_name
    deletes_after = _deletes(graph, order)
    first_backward = next((i for i, n in enumerate(order) if ops[n].phase == ir.BACKWARD), len(order))
    sections: tuple[list, list] = ([], [])
    computed: set[str] = set()
    for step, name in enumerate(order):
        verb = "recompute" if name in computed else "compute"
        computed.add(name)
        section = sections[step >= first_backward]
        section.append(ir.Instruction(verb, name, ir.COMPUTE_STREAM))
        for tensor in deletes_after.get(step, ()):
            section.append(ir.Instruction("delete", tensor, ir.COMPUTE_STREAM))
    return tuple(sections[0]), tuple(sections[1])


def _deletes(graph: ir.Graph, order) -> dict[int, list[str]]:
    """step -> tensors to delete right after it, in declaration order: each copy's end
    (NOTE: [Liveness] in remat_dsl.plan.liveness); pinned tensors are never deleted."""
    pinned = pinned_tensors(graph)
    result: dict[int, list[str]] = defaultdict(list)
    for iv in live_intervals(op_steps(graph, order), pinned=pinned):
        if iv.end is not None:  # None: pinned, never deleted
            result[iv.end].append(iv.tensor)
    key = _declaration_order(graph.op_by_name)
    return {step: sorted(names, key=key) for step, names in result.items()}


def _declaration_order(ops):
    position = {t: i for i, t in enumerate(t for op in ops.values() for t in op.outputs)}
    return lambda name: position[name]


# ---------------------------------------------------------------------------
# Constraints (NOTE: [Applying constraints] in remat_dsl.plan.constraints)
# ---------------------------------------------------------------------------


def constrain_order(graph: ir.Graph, order: list[str], constraints) -> list[str]:
    """The solver's op order edited for keep, offload and recompute (NOTE above)."""
    producers = graph.producer
    once = {producers[t] for kind in ("keep", "offload") for t in matching(graph, constraints, kind)}
    once |= buffer_readers(graph)
    seen: set[str] = set()
    result = []
    for name in order:
        if name in once and name in seen:
            continue
        seen.add(name)
        result.append(name)
    return _recompute_before_backward(graph, result, matching(graph, constraints, "recompute"), producers)


def _recompute_before_backward(graph, order, tensors, producers) -> list[str]:
    if not tensors:
        return order
    ops = graph.op_by_name
    names = graph.tensor_by_name
    first_backward = next((i for i, n in enumerate(order) if ops[n].phase == ir.BACKWARD), len(order))
    inserts: dict[int, list[str]] = {}
    for tensor in tensors:
        producer = producers[tensor]
        if ops[producer].phase != ir.FORWARD:
            continue
        use = next((i for i in range(first_backward, len(order)) if tensor in op_uses(ops[order[i]], names)), None)
        made_again = any(order[i] == producer for i in range(first_backward, use or first_backward))
        if use is not None and not made_again:
            inserts.setdefault(use, []).append(producer)
    result = []
    for i, name in enumerate(order):
        for producer in dict.fromkeys(inserts.get(i, [])):
            result.append(producer)
        result.append(name)
    return result


def add_offloads(graph: ir.Graph, forward, backward, constraints):
    """Forward and backward instructions with offload/prefetch of matching saved tensors:
    those the backward needs from the forward (the simulation's Crossing.needed)."""
    from remat_dsl.check.replay import simulate

    wanted = matching(graph, constraints, "offload")
    if not wanted:
        return forward, backward
    ops = graph.op_by_name
    names = graph.tensor_by_name
    header = ir.Header("", "cpu", 0, ir.BUDGET_COUNTS, "", "optimal", 0, "forward:1", 0, 0, 0, DEFAULT_BANDWIDTH)
    crossing = simulate(ir.Plan(header, graph, tuple(forward), tuple(backward))).crossing
    needed = set(crossing.needed) & set(crossing.resident) - pinned_tensors(graph)
    forward, backward = list(forward), list(backward)
    for tensor in sorted(t for t in wanted if t in needed):
        forward = _offload_after_last_use(forward, tensor, ops, names)
        backward = _prefetch_before_first_use(backward, tensor, ops, names)
    return tuple(forward), tuple(backward)


def _runs(instructions, tensor, ops, names, *, making: bool):
    """Indices of compute/recompute instructions that read `tensor` (or make it, if `making`)."""
    for i, ins in enumerate(instructions):
        if not ins.runs_op:
            continue
        op = ops[ins.target]
        if tensor in op_uses(op, names) or (making and tensor in op.outputs):
            yield i


def _offload_after_last_use(forward, tensor, ops, names):
    last = max(_runs(forward, tensor, ops, names, making=True))
    moves = [
        ir.Instruction("offload", tensor, ir.D2H_STREAM),
        ir.Instruction("wait", tensor, ir.COMPUTE_STREAM),
        ir.Instruction("delete", tensor, ir.COMPUTE_STREAM),
    ]
    return forward[: last + 1] + moves + forward[last + 1 :]


def _prefetch_before_first_use(backward, tensor, ops, names):
    first = next(_runs(backward, tensor, ops, names, making=False))
    computes = [i for i, ins in enumerate(backward[:first]) if ins.runs_op]
    at = computes[-PREFETCH_LEAD] if len(computes) >= PREFETCH_LEAD else 0
    prefetch = ir.Instruction("prefetch", tensor, ir.H2D_STREAM)
    wait = ir.Instruction("wait", tensor, ir.COMPUTE_STREAM)
    return backward[:at] + [prefetch] + backward[at:first] + [wait] + backward[first:]


def add_updates(
    plan: ir.Plan, optimizer: str, on_host=frozenset(), speeds: tuple[int, int, int] = (0, 0, 0), lag: int = 0
) -> ir.Plan:
    """`plan` with the whole step's optimizer (NOTE: [Optimizer in the step] in
    remat_dsl.plan.optimizer): the header's `optimizer` (its text) and `update-speed`
    (`speeds`: device and host bytes of parameter per second, host overhead in
    microseconds), and in the backward, for each trainable parameter P, the update where
    its gradient is complete and P is read no more (thesis ch. 4, eq. 4.6), then the
    gradient deleted after its last read.  P in `on_host`: the gradient offloaded as soon
    as it is made, waited for and deleted where the update goes, then `host_update P`; with
    `lag`, that many ops later (or at the end of the backward), so that the gradient's copy
    overlaps them instead of the compute stream waiting for it (thesis ch. 4, eq. 4.21: the
    offload runs on the d2h channel beside compute).  The predictions in the header are not
    updated (simulate the result)."""
    graph = plan.graph
    gradient_tensors = {name for g in graph.gradients for name in ir.refs_in(g.value)}
    # deletes of gradients (a plan made without gradient lines frees them after their last
    # read) go where the updates leave them
    backward = [ins for ins in plan.backward if not (ins.verb == "delete" and ins.target in gradient_tensors)]
    ops = graph.op_by_name
    made: dict[str, int] = {}  # tensor -> index of the backward instruction that makes it
    last_read: dict[str, int] = {}  # value -> index of the last backward instruction that reads it
    for i, ins in enumerate(backward):
        if ins.runs_op:
            op = ops[ins.target]
            for out in op.outputs:
                made.setdefault(out, i)
            for ref in ir.op_refs(op):
                last_read[ref.name] = i
    after: dict[int, list[ir.Instruction]] = defaultdict(list)
    computes = [i for i, ins in enumerate(backward) if ins.runs_op]

    def later(index: int) -> int:
        """The `lag`-th op after instruction `index` (the last instruction when there are fewer)."""
        if not lag:
            return index
        following = [i for i in computes if i > index]
        return following[lag - 1] if len(following) >= lag else len(backward) - 1

    pinned = set(ir.refs_in(graph.outputs))
    gradient_of: dict[str, int] = defaultdict(int)  # tensor -> how many gradients read it
    for g in graph.gradients:
        for name in dict.fromkeys(ir.refs_in(g.value)):
            gradient_of[name] += 1
    updates_left = dict(gradient_of)
    for g in sorted(graph.gradients, key=lambda g: g.parameter):
        if g.value is None:
            continue
        tensors = [name for name in dict.fromkeys(ir.refs_in(g.value)) if name in graph.tensor_by_name]
        ready = max([made.get(t, -1) for t in tensors] + [last_read.get(g.parameter, -1)])
        host = g.parameter in on_host
        if host:
            for t in tensors:
                after[made.get(t, -1)].append(ir.Instruction("offload", t, ir.D2H_STREAM))
        freed = max([ready] + [last_read.get(t, -1) for t in tensors])
        step = []
        for t in tensors:
            updates_left[t] -= 1
            if host:
                step.append(ir.Instruction("wait", t, ir.COMPUTE_STREAM))
        if host:
            step += [
                ir.Instruction("delete", t, ir.COMPUTE_STREAM)
                for t in tensors
                if not updates_left[t] and t not in pinned
            ]
            after[later(freed)].extend(step)
            after[later(freed)].append(ir.Instruction("host_update", g.parameter, ir.HOST_STREAM))
        else:
            after[ready].append(ir.Instruction("update", g.parameter, ir.COMPUTE_STREAM))
            after[freed].extend(
                ir.Instruction("delete", t, ir.COMPUTE_STREAM)
                for t in tensors
                if not updates_left[t] and t not in pinned
            )
    result = list(after.get(-1, []))
    for i, ins in enumerate(backward):
        result.append(ins)
        result.extend(after.get(i, []))
    header = replace(
        plan.header,
        optimizer=optimizer,
        counts=ir.BUDGET_COUNTS_OPTIMIZER,
        device_update=speeds[0],
        host_update=speeds[1],
        host_update_overhead_us=speeds[2],
    )
    return replace(plan, header=header, backward=tuple(result))


def add_parameter_streaming(plan: ir.Plan, streamed, lead: int = PREFETCH_LEAD) -> ir.Plan:
    """`plan` (a whole-step plan, after `add_updates`) with the parameters `streamed` kept in
    host memory (NOTE: [Parameters on the host] in remat_dsl.check.replay): in each section
    that reads one, `prefetch` `lead` ops before its first read, `wait` right before it and
    `delete` right after its last read.  One updated on the device (`update P`, a read of
    its device copy) is written back after its update: `offload P` right after it, `wait P`
    and `delete P` `lead` ops later or at the end of the backward, so that the copy overlaps
    compute (thesis ch. 4, eq. 4.10 and 4.22: the offload of a parameter
    updated on the GPU, on the d2h channel).  The predictions in the header are not
    updated (simulate the result)."""
    streamed = set(streamed)
    ops = plan.graph.op_by_name
    ahead = max(1, lead)

    def stream(instructions: tuple[ir.Instruction, ...]) -> tuple[ir.Instruction, ...]:
        first: dict[str, int] = {}
        last: dict[str, int] = {}
        for i, ins in enumerate(instructions):
            names = [r.name for r in ir.op_refs(ops[ins.target])] if ins.runs_op else []
            if ins.verb == "update":
                names = [ins.target]
            for name in names:
                if name in streamed:
                    first.setdefault(name, i)
                    last[name] = i
        before: dict[int, list[ir.Instruction]] = defaultdict(list)
        after: dict[int, list[ir.Instruction]] = defaultdict(list)
        computes = [i for i, ins in enumerate(instructions) if ins.runs_op]
        for name in sorted(first, key=lambda n: (first[n], n)):
            start, end = first[name], last[name]
            at = start
            for _ in range(ahead):  # `ahead` ops earlier, so the copy overlaps them
                at = next((j for j in range(at - 1, -1, -1) if instructions[j].runs_op), at)
            before[at].append(ir.Instruction("prefetch", name, ir.H2D_STREAM))
            before[start].append(ir.Instruction("wait", name, ir.COMPUTE_STREAM))
            if instructions[end].verb != "update":
                after[end].append(ir.Instruction("delete", name, ir.COMPUTE_STREAM))
                continue
            later = [i for i in computes if i > end]
            joined = later[ahead - 1] if len(later) >= ahead else len(instructions) - 1
            after[end].append(ir.Instruction("offload", name, ir.D2H_STREAM))
            after[joined] += [
                ir.Instruction("wait", name, ir.COMPUTE_STREAM),
                ir.Instruction("delete", name, ir.COMPUTE_STREAM),
            ]
        result: list[ir.Instruction] = []
        for i, ins in enumerate(instructions):
            result.extend(before.get(i, []))
            result.append(ins)
            result.extend(after.get(i, []))
        return tuple(result)

    return replace(plan, forward=stream(plan.forward), backward=stream(plan.backward))


def add_paged_states(plan: ir.Plan, paged, lead: int = PREFETCH_LEAD) -> ir.Plan:
    """`plan` (a whole-step plan, after `add_updates`) with the optimizer states of the
    parameters `paged` (each updated on the device) kept in host memory (NOTE: [Paged
    optimizer states] in remat_dsl.plan.optimizer): `prefetch_states P` `lead` ops before
    `update P` and `wait_states P` right before it (thesis ch. 4, eq. 4.10: PrfO),
    `offload_states P` right after it and its `wait_states P` `lead` ops later, or at the
    end of the backward (eq. 4.10: OflO), so that both copies overlap compute.  The
    predictions in the header are not updated (simulate the result)."""
    paged = set(paged)
    ahead = max(1, lead)
    backward = plan.backward
    before: dict[int, list[ir.Instruction]] = defaultdict(list)
    after: dict[int, list[ir.Instruction]] = defaultdict(list)
    computes = [i for i, ins in enumerate(backward) if ins.runs_op]
    for at, ins in enumerate(backward):
        if ins.verb != "update" or ins.target not in paged:
            continue
        earlier = [i for i in computes if i < at]
        later = [i for i in computes if i > at]
        start = earlier[-ahead] if len(earlier) >= ahead else 0
        before[start].append(ir.Instruction("prefetch_states", ins.target, ir.H2D_STREAM))
        before[at].append(ir.Instruction("wait_states", ins.target, ir.COMPUTE_STREAM))
        after[at].append(ir.Instruction("offload_states", ins.target, ir.D2H_STREAM))
        joined = later[ahead - 1] if len(later) >= ahead else len(backward) - 1
        after[joined].append(ir.Instruction("wait_states", ins.target, ir.COMPUTE_STREAM))
    result: list[ir.Instruction] = []
    for i, ins in enumerate(backward):
        result.extend(before.get(i, []))
        result.append(ins)
        result.extend(after.get(i, []))
    return replace(plan, backward=tuple(result))
