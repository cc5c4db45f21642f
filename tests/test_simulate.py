"""Tests of remat_dsl.check.replay: exact peaks and times by hand, one test per broken rule.

The tiny graph (sizes in bytes, times in microseconds):

    a = mm(x, w1)                 a: 100                    10 us
    d = native_dropout(a)         d: 200, d:1 (mask): 50    20 us   random
    y = mm(d, w2)                 y: 30 (model output)       5 us   temp 7
    y.bwd.mm = mm(go, w2)         200                       15 us   temp 300
    d.bwd.dropout_backward(y.bwd.mm, d:1)   100             12 us
    a.bwd.mm = mm(x, d.bwd...)    60 (gradient of w1)        8 us   temp 16

The tangent grad_output.0 is float32[4, 8]: 128 bytes, the caller's memory, not counted
(NOTE: [Gradient zeros] in remat_dsl.capture.fbgraph).
"""

from __future__ import annotations


import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remat_dsl.plan import ir
from remat_dsl.plan.errors import PlanError
from remat_dsl.check.replay import Simulation, rng_state_bytes, simulate, transfer_us, with_predictions

R = ir.Ref
TANGENT_BYTES = 128
DROP_BWD = "d.bwd.dropout_backward"


def _op(name, phase, args, outputs, time_us, temp=0, random=False, line=None):
    span = ir.Span(line, 3) if line else None
    return ir.Op(
        name, phase, "aten.x.default", tuple(args), (), tuple(outputs), time_us, temp, random, span=span
    )


def _tensor(name, nbytes, producer, index=0):
    return ir.TensorDecl(name, (nbytes,), "uint8", nbytes, producer, index)


def _graph(extra_ops=(), extra_tensors=(), y_args=(R("d"), R("w2"))) -> ir.Graph:
    forward = [
        _op("a", "forward", [R("x"), R("w1")], ["a"], 10),
        *extra_ops,
        _op("d", "forward", [R("a"), 0.1, True], ["d", "d:1"], 20, random=True),
        _op("y", "forward", y_args, ["y"], 5, temp=7),
    ]
    backward = [
        _op(
            "y.bwd.mm",
            "backward",
            [R("grad_output.0"), ir.Call("aten.t.default", (R("w2"),))],
            ["y.bwd.mm"],
            15,
            temp=300,
        ),
        _op(DROP_BWD, "backward", [R("y.bwd.mm"), R("d:1"), 0.1], [DROP_BWD], 12),
        _op("a.bwd.mm", "backward", [ir.ListArg((R("x"),)), R(DROP_BWD)], ["a.bwd.mm"], 8, temp=16),
    ]
    tensors = [
        _tensor("a", 100, "a"),
        _tensor("d", 200, "d"),
        _tensor("d:1", 50, "d", 1),
        _tensor("y", 30, "y"),
        _tensor("y.bwd.mm", 200, "y.bwd.mm"),
        _tensor(DROP_BWD, 100, DROP_BWD),
        _tensor("a.bwd.mm", 60, "a.bwd.mm"),
        *extra_tensors,
    ]
    return ir.Graph(
        inputs=(ir.ValueDecl("input", "x", (4, 8), "float32"),),
        parameters=(
            ir.ValueDecl("parameter", "w1", (8, 8), "float32"),
            ir.ValueDecl("parameter", "w2", (8, 8), "float32"),
        ),
        buffers=(),
        tangents=(ir.ValueDecl("tangent", "grad_output.0", (4, 8), "float32"),),
        tensors=tuple(tensors),
        ops=(*forward, *backward),
        outputs=ir.TupleArg((R("y"),)),
        gradients=(ir.Gradient("w1", R("a.bwd.mm")), ir.Gradient("w2", None)),
    )


def _header(device="cuda", bandwidth=10**12) -> ir.Header:
    return ir.Header(
        "tiny", device, 10**6, ir.BUDGET_COUNTS, "hand", "hand-written", 0, "forward:1", 0, 0, 0, bandwidth
    )


def _section(text: str, first_line: int) -> tuple[ir.Instruction, ...]:
    """Instructions from `VERB TARGET [STREAM]` lines; line numbers from `first_line`."""
    out = []
    for line, row in enumerate([r for r in text.strip().splitlines() if r.strip()], first_line):
        verb, target, *stream = row.split()
        out.append(
            ir.Instruction(verb, target, stream[0] if stream else ir.VERB_STREAM[verb], span=ir.Span(line, 3))
        )
    return tuple(out)


FWD_LINE = 10  # forward instructions start at line 10, backward ones at line 30
BWD_LINE = 30

STORE_ALL_FWD = """
compute a
compute d
delete a
compute y
"""
STORE_ALL_BWD = f"""
compute y.bwd.mm
delete d
compute {DROP_BWD}
delete y.bwd.mm
delete d:1
compute a.bwd.mm
delete {DROP_BWD}
"""

OFFLOAD_FWD = """
compute a
compute d
offload d:1
delete a
compute y
delete d
wait d:1
delete d:1
"""
OFFLOAD_BWD = f"""
compute y.bwd.mm
prefetch d:1
wait d:1
compute {DROP_BWD}
delete y.bwd.mm
delete d:1
compute a.bwd.mm
delete {DROP_BWD}
"""

KEEP_FWD = """
compute a
compute d
delete a
compute y
delete d
"""
KEEP_BWD = f"""
compute y.bwd.mm
compute {DROP_BWD}
delete y.bwd.mm
delete d:1
compute a.bwd.mm
delete {DROP_BWD}
"""

RECOMPUTE_FWD = """
compute a
compute d
compute y
delete d
delete d:1
"""
RECOMPUTE_BWD = f"""
compute y.bwd.mm
recompute d
delete d
compute {DROP_BWD}
delete y.bwd.mm
delete d:1
delete a
compute a.bwd.mm
delete {DROP_BWD}
"""


def _plan(fwd=STORE_ALL_FWD, bwd=STORE_ALL_BWD, graph=None, **header) -> ir.Plan:
    return ir.Plan(_header(**header), graph or _graph(), _section(fwd, FWD_LINE), _section(bwd, BWD_LINE))


def _fails(plan: ir.Plan, message: str, line: int | None, hint: str = "") -> PlanError:
    """simulate(plan) raises PlanError whose message contains `message`, at `line`, with `hint`."""
    with pytest.raises(PlanError) as info:
        simulate(plan)
    err = info.value
    text = getattr(err, "message", None) or str(err)
    assert message in text
    assert (err.span.line if err.span else None) == line
    assert err.hint and hint in err.hint
    return err


# ---------------------------------------------------------------------------
# Valid plans: exact numbers
# ---------------------------------------------------------------------------


def test_store_all_peak_and_time_by_hand():
    sim = simulate(_plan())
    # forward: a 100; d +250 = 350; delete a 250; y peaks 250+30+7=287, ends 280.
    # backward: y.bwd.mm peaks 280+200+300 = 780.
    assert sim.peak_bytes == 780
    assert sim.peak_at == "backward:1"
    assert sim.time_us == sim.compute_us == 10 + 20 + 5 + 15 + 12 + 8
    assert (sim.recompute_us, sim.transfer_us, sim.host_peak_bytes) == (0, 0, 0)
    assert sim.saved == ("d", "d:1", "y")
    mems = [(s.mem_before, s.mem_peak, s.mem_after) for s in sim.timeline]
    assert mems[:4] == [(0, 100, 100), (100, 350, 350), (350, 350, 250), (250, 287, 280)]
    # backward: 280 -> 480; delete d 280; drop bwd 380; deletes 180, 130; a.bwd.mm peaks 206 -> 190; 90.
    assert mems[4:] == [
        (280, 780, 480),
        (480, 480, 280),
        (280, 380, 380),
        (380, 380, 180),
        (180, 180, 130),
        (130, 206, 190),
        (190, 190, 90),
    ]


def test_live_at_peak_adds_up_and_only_peak_step_keeps_it():
    sim = simulate(_plan())
    peak_step = sim.timeline[4]
    assert sum(n for _, n in peak_step.live) == sim.peak_bytes
    assert peak_step.live[0] == ("temporaries of y.bwd.mm", 300)
    assert "grad_output.0" not in dict(peak_step.live)
    assert [n for _, n in peak_step.live] == sorted((n for _, n in peak_step.live), reverse=True)
    assert all(not s.live for s in sim.timeline if s is not peak_step)


def test_with_predictions_writes_header():
    plan = _plan()
    sim = simulate(plan)
    header = with_predictions(plan, sim).header
    assert (header.peak_bytes, header.peak_at, header.time_us) == (780, "backward:1", 70)
    assert (header.compute_us, header.recompute_us) == (70, 0)
    assert header.model == plan.header.model


def test_offload_lowers_peak_and_high_bandwidth_costs_little():
    keep = simulate(_plan(KEEP_FWD, KEEP_BWD))
    off = simulate(_plan(OFFLOAD_FWD, OFFLOAD_BWD))
    # keep: backward starts at y 30 + d:1 50 = 80; y.bwd.mm peaks 80+200+300 = 580.
    assert (keep.peak_bytes, keep.peak_at) == (580, "backward:1")
    # offload: backward starts at 30; y.bwd.mm peaks 530.
    assert (off.peak_bytes, off.peak_at) == (530, "backward:1")
    # on a GPU d:1's 50 bytes take a 64-byte slot of the step's pinned group, which the
    # pinned allocator reserves at the next power of two (NOTE: [Pinned host memory])
    assert off.host_peak_bytes == 64
    on_cpu = simulate(_plan(OFFLOAD_FWD, OFFLOAD_BWD, device="cpu"))
    assert on_cpu.host_peak_bytes == 50  # no pinning on the CPU: the copy's bytes
    assert off.saved == ("d:1", "y")  # d:1 crosses on the host
    assert off.transfer_us == 2 * transfer_us(50, 10**12) == 2
    assert off.time_us == 70 + 1  # the offload overlaps compute y; the prefetch costs 1 us


def test_low_bandwidth_time_includes_transfer_waits():
    sim = simulate(_plan(OFFLOAD_FWD, OFFLOAD_BWD, bandwidth=10**6))  # 50 us per 50-byte copy
    # offload starts after d (t=30), ends 80; compute y ends 35, wait -> 80.
    # y.bwd.mm ends 95; prefetch 95 -> 145; wait; drop bwd 157; a.bwd.mm 165.
    assert sim.time_us == 165
    assert sim.transfer_us == 100
    assert sim.compute_us == 70


def test_prefetch_allocates_at_once():
    sim = simulate(_plan(OFFLOAD_FWD, OFFLOAD_BWD))
    prefetch = sim.timeline[len(_section(OFFLOAD_FWD, 1)) + 1]
    assert prefetch.instruction.verb == "prefetch"
    assert (prefetch.mem_before, prefetch.mem_after) == (230, 280)


def test_rng_state_of_recomputed_random_op_on_cpu():
    cpu = simulate(_plan(RECOMPUTE_FWD, RECOMPUTE_BWD, device="cpu"))
    rng = rng_state_bytes("cpu")
    assert rng == 5056
    # forward: a 100; d saves the RNG state: peak 100+5056+250; y ends 5436; deletes -> 5186.
    assert cpu.timeline[1].mem_peak == 100 + rng + 250
    recompute = cpu.timeline[6]
    assert cpu.peak_bytes == recompute.mem_peak == 5386 + 250 + rng
    assert recompute.instruction.verb == "recompute"
    # while d replays its state the generator's current one is set aside (one more
    # state at the peak); d's saved state is freed after its last recompute.
    assert (recompute.mem_peak, recompute.mem_after) == (5386 + 250 + rng, 5386 + 250 - rng)
    assert cpu.recompute_us == 20 and cpu.time_us == 90
    assert cpu.timeline[-1].mem_after == 30 + 60  # the output and the gradient of w1: the tangent is the caller's


def test_rng_state_is_free_on_cuda_and_device_override():
    cuda = simulate(_plan(RECOMPUTE_FWD, RECOMPUTE_BWD, device="cuda"))
    cpu = simulate(_plan(RECOMPUTE_FWD, RECOMPUTE_BWD, device="cuda"), device="cpu")
    assert cpu.peak_bytes == simulate(_plan(RECOMPUTE_FWD, RECOMPUTE_BWD, device="cpu")).peak_bytes
    assert cpu.peak_bytes > cuda.peak_bytes + 5056  # saved state and the one set aside
    assert cuda.peak_bytes == 630


def test_random_op_not_recomputed_saves_no_rng_state():
    sim = simulate(_plan(device="cpu"))
    assert sim.peak_bytes == 780


# ---------------------------------------------------------------------------
# Broken rules: message, line, hint
# ---------------------------------------------------------------------------


def _replace(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new, 1)


def test_unknown_op_suggests_a_name():
    _fails(
        _plan(_replace(STORE_ALL_FWD, "compute y", "compute yy")),
        "'yy': it is not an op",
        13,
        "did you mean 'y'?",
    )


def test_compute_of_a_tensor_name():
    plan = _plan(bwd=_replace(STORE_ALL_BWD, f"compute {DROP_BWD}", "compute d:1"))
    _fails(plan, "cannot compute 'd:1': it is a tensor, not an op", 32)


def test_delete_of_unknown_tensor_and_of_a_parameter():
    _fails(
        _plan(_replace(STORE_ALL_FWD, "delete a", "delete aa")),
        "'aa': it is not a tensor",
        12,
        "did you mean 'a'?",
    )
    _fails(
        _plan(_replace(STORE_ALL_FWD, "delete a", "delete w1")),
        "'w1': it is a parameter",
        12,
        "remove this line",
    )


def test_wrong_stream():
    plan = _plan(_replace(OFFLOAD_FWD, "offload d:1", "offload d:1 compute"), OFFLOAD_BWD)
    _fails(plan, "offload runs on the d2h stream", 12, "offload d:1")


def test_forward_op_computed_twice():
    plan = _plan(_replace(STORE_ALL_FWD, "compute y", "compute y\ncompute a"))
    _fails(plan, "'a' is already computed at line 10", 14, "recompute a")
    plan = _plan(bwd=STORE_ALL_BWD + "compute a.bwd.mm")
    _fails(plan, "'a.bwd.mm' is already computed at line 35", 37, "backward ops run exactly once")


def test_forward_op_computed_in_backward():
    plan = _plan(_replace(STORE_ALL_FWD, "compute y", ""), "compute y\n" + STORE_ALL_BWD)
    # the forward section misses y first: the earlier violation wins.
    _fails(plan, "forward op 'y' is never computed in the forward section", 12, "compute y")
    plan = _plan(bwd=_replace(STORE_ALL_BWD, "delete d\n", "delete d\ncompute a\n"))
    _fails(
        plan,
        "forward op 'a' is computed in the backward section (its compute is at line 10)",
        32,
        "recompute a",
    )


def test_backward_op_in_forward_and_recompute_of_backward_op():
    _fails(
        _plan("compute y.bwd.mm\n" + STORE_ALL_FWD),
        "backward op 'y.bwd.mm' is computed in the forward section",
        10,
    )
    plan = _plan(bwd=_replace(STORE_ALL_BWD, "delete d\n", "delete d\nrecompute y.bwd.mm\n"))
    _fails(plan, "backward op 'y.bwd.mm' cannot be recomputed (it runs at line 30)", 32, "remove this line")


def test_recompute_before_compute():
    plan = _plan("compute a\nrecompute d\n" + STORE_ALL_FWD)
    _fails(plan, "recompute of 'd' before its first compute", 11, "compute d")


def test_use_before_compute():
    plan = _plan("compute d\ncompute a\ndelete a\ncompute y")
    _fails(plan, "tensor 'a' is used by 'd' but was never computed; compute its producer 'a' first", 10)


def test_use_after_delete():
    plan = _plan(_replace(STORE_ALL_FWD, "compute y", "delete d\ncompute y"))
    _fails(
        plan, "tensor 'd' is used by 'y' but was deleted at line 13", 14, "move the delete at line 13 after this line"
    )


def test_use_after_delete_hints_prefetch_when_host_copy_exists():
    plan = _plan(OFFLOAD_FWD, _replace(OFFLOAD_BWD, "prefetch d:1\nwait d:1\n", ""))
    _fails(
        plan,
        f"saved tensor 'd:1' is missing at its backward use by '{DROP_BWD}': it was deleted at line 17",
        31,
        "add `prefetch d:1` and `wait d:1` before this line",
    )


def test_use_before_wait():
    plan = _plan(OFFLOAD_FWD, _replace(OFFLOAD_BWD, "wait d:1\n", ""))
    _fails(
        plan,
        "used by 'd.bwd.dropout_backward' while its prefetch (line 31) is in flight",
        32,
        "wait d:1",
    )


def test_tangent_used_in_forward():
    graph = _graph(y_args=(R("d"), R("grad_output.0")))
    _fails(_plan(graph=graph), "tangent 'grad_output.0' is used by 'y' in the forward section", 13)


def test_delete_of_model_output_and_of_parameter_gradient():
    _fails(
        _plan(STORE_ALL_FWD + "delete y"),
        "cannot delete 'y': it is a model output held by the caller",
        14,
        "remove",
    )
    plan = _plan(bwd=STORE_ALL_BWD + "delete a.bwd.mm")
    _fails(plan, "cannot delete 'a.bwd.mm': it is a parameter gradient", 37, "remove this line")


def test_delete_twice_and_before_compute():
    _fails(
        _plan(_replace(STORE_ALL_FWD, "delete a", "delete a\ndelete a")),
        "cannot delete 'a': it was deleted at line 12",
        13,
    )
    _fails(
        _plan("delete a\n" + STORE_ALL_FWD),
        "cannot delete 'a': it was never computed",
        10,
        "after `compute a`",
    )


def test_delete_with_offload_in_flight():
    plan = _plan(_replace(OFFLOAD_FWD, "wait d:1\n", ""), OFFLOAD_BWD)
    _fails(plan, "cannot delete 'd:1' while its offload (line 12) is in flight", 16, "wait d:1")


def test_offload_twice_and_of_deleted_tensor():
    plan = _plan(_replace(OFFLOAD_FWD, "delete d:1", "offload d:1"), OFFLOAD_BWD)
    _fails(plan, "cannot offload 'd:1': it already has a host copy (offloaded at line 12)", 17)
    plan = _plan(_replace(STORE_ALL_FWD, "compute y", "compute y\noffload a d2h"))
    _fails(plan, "cannot offload 'a': it was deleted at line 12", 14)


def test_prefetch_without_host_copy_or_while_resident_or_unwaited():
    plan = _plan(KEEP_FWD, "prefetch d:1\n" + KEEP_BWD)
    _fails(plan, "cannot prefetch 'd:1': it has no host copy", 30, "offload d:1")
    plan = _plan(_replace(OFFLOAD_FWD, "delete d:1", "prefetch d:1"), OFFLOAD_BWD)
    _fails(plan, "cannot prefetch 'd:1': it is already resident", 17)
    plan = _plan(_replace(OFFLOAD_FWD, "wait d:1\ndelete d:1", "prefetch d:1"), OFFLOAD_BWD)
    _fails(plan, "cannot prefetch 'd:1': its offload (line 12) was not waited for", 16, "wait d:1")


def test_wait_without_transfer():
    plan = _plan(_replace(STORE_ALL_FWD, "delete a", "wait a\ndelete a"))
    _fails(plan, "nothing to wait for: 'a' has no offload or prefetch in flight", 12, "remove this line")


def test_random_ops_keep_graph_order():
    graph = _graph(
        extra_ops=[_op("r", "forward", [R("x")], ["r"], 3, random=True)], extra_tensors=[_tensor("r", 8, "r")]
    )
    ok = _plan(_replace(STORE_ALL_FWD, "compute d", "compute r\ncompute d"), graph=graph)
    assert simulate(ok).compute_us == 73
    bad = _plan(_replace(STORE_ALL_FWD, "compute y", "compute y\ncompute r"), graph=graph)
    _fails(bad, "random op 'd' is computed before random op 'r'", 11, "move `compute d` after `compute r`")


def test_backward_op_never_computed():
    plan = _plan(bwd=_replace(STORE_ALL_BWD, f"compute a.bwd.mm\ndelete {DROP_BWD}", ""))
    _fails(plan, "backward op 'a.bwd.mm' is never computed", 34, "compute a.bwd.mm")


def test_unknown_ref_in_op_arguments_points_at_the_ref():
    graph = _graph(y_args=(R("dd", ir.Span(7, 20)), R("w2")))
    _fails(_plan(graph=graph), "unknown value '%dd' in the arguments of 'y'", 7, "did you mean 'd'?")


def test_zero_bandwidth_rejects_transfers():
    _fails(_plan(OFFLOAD_FWD, OFFLOAD_BWD, bandwidth=0), "bandwidth is 0 B/s", 12, "bandwidth")


def test_first_violation_in_instruction_order_wins():
    fwd = _replace(STORE_ALL_FWD, "delete a", "delete zz\ncompute y.bwd.mm")
    _fails(_plan(fwd), "'zz': it is not a tensor", 12)


# ---------------------------------------------------------------------------
# Property: shuffled or thinned plans are rejected cleanly or respect a lower bound
# ---------------------------------------------------------------------------


def _lower_bound(graph: ir.Graph) -> int:
    """Bytes no valid plan can go below: the largest op footprint, and what must be held at the end."""
    sizes = {t.name: t.nbytes for t in graph.tensors}
    fwd = max(sum(sizes[o] for o in op.outputs) + op.temp_bytes for op in graph.ops if op.phase == "forward")
    bwd = max(sum(sizes[o] for o in op.outputs) + op.temp_bytes for op in graph.ops if op.phase == "backward")
    return max(fwd, bwd, sizes["y"] + sizes["a.bwd.mm"])


VALID = [(OFFLOAD_FWD, OFFLOAD_BWD), (STORE_ALL_FWD, STORE_ALL_BWD), (RECOMPUTE_FWD, RECOMPUTE_BWD)]


def _rows(text: str) -> list[str]:
    return [r for r in text.splitlines() if r.strip()]


EXTRA_ROWS = ["recompute a", "recompute d", "offload a", "offload d", "wait d", "delete d", "delete a"]


@st.composite
def _mutated_plans(draw):
    """A valid plan after up to three local edits: swap neighbours, drop, insert, shift the section cut."""
    fwd, bwd = draw(st.sampled_from(VALID))
    rows, cut = _rows(fwd) + _rows(bwd), len(_rows(fwd))
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["swap", "drop", "insert", "cut"]))
        at = draw(st.integers(0, len(rows) - 1))
        if kind == "swap" and at + 1 < len(rows):
            rows[at], rows[at + 1] = rows[at + 1], rows[at]
        elif kind == "drop":
            del rows[at]
            cut -= at < cut
        elif kind == "insert":
            rows.insert(at, draw(st.sampled_from(rows + EXTRA_ROWS)))
            cut += at < cut
        elif kind == "cut":
            cut = max(0, min(len(rows), cut + draw(st.integers(-2, 2))))
    device = draw(st.sampled_from(["cpu", "cuda"]))
    return _plan("\n".join(rows[:cut]), "\n".join(rows[cut:]), device=device)


NAMES = (
    [op.name for op in _graph().ops] + [t.name for t in _graph().tensors] + ["x", "w1", "grad_output.0", "zz"]
)


@st.composite
def _arbitrary_plans(draw):
    """Instructions with any verb, target and stream: nonsense the simulator must reject cleanly."""
    row = st.tuples(st.sampled_from(ir.VERBS + ("run",)), st.sampled_from(NAMES), st.sampled_from(ir.STREAMS))
    sections = [draw(st.lists(row, max_size=12)) for _ in range(2)]
    fwd, bwd = (tuple(ir.Instruction(v, t, s) for v, t, s in rows) for rows in sections)
    return ir.Plan(_header(bandwidth=draw(st.sampled_from([0, 10**6]))), _graph(), fwd, bwd)


@settings(max_examples=400, deadline=None)
@given(_mutated_plans())
def test_mutated_plans_are_rejected_or_respect_lower_bound(plan):
    try:
        sim = simulate(plan)
    except PlanError as err:
        assert err.hint
        return
    assert isinstance(sim, Simulation)
    assert sim.peak_bytes >= _lower_bound(plan.graph)
    assert sim.peak_bytes == max(s.mem_peak for s in sim.timeline)
    assert sim.time_us >= sim.compute_us + sim.recompute_us
    peak_step = next(step for step in sim.timeline if step.live)
    assert sum(n for _, n in peak_step.live) == sim.peak_bytes
    mem = 0
    for step in sim.timeline:
        assert step.mem_before == mem and step.mem_peak >= max(step.mem_before, step.mem_after)
        mem = step.mem_after


@settings(max_examples=300, deadline=None)
@given(_arbitrary_plans())
def test_arbitrary_instructions_raise_only_plan_errors(plan):
    try:
        simulate(plan)
    except PlanError as err:
        assert err.hint
