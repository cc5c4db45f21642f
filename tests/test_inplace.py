"""In-place outputs (NOTE: [In-place outputs] in remat_dsl/plan/inplace.py), backward ops
moved up (NOTE: [Backward ops moved up] in remat_dsl/solve/polish.py) and the block
ILP's boundary values (NOTE: [Freed at the boundary] in remat_dsl/solve/solvers/ilp/hilp.py).

The rule is checked on a graph made by hand, where what may and may not be written in
place is known; the generated modules of stock Hugging Face models and the GPT-2 and
ResNet examples train bit for bit as eager does and measure the peak the simulation
predicts with in-place writes, below the one it predicts without them."""

from __future__ import annotations

import functools
import warnings
from pathlib import Path

import pytest
import torch

from remat_dsl.capture.cost import load_device
from remat_dsl.capture.model_file import load_model_file
from remat_dsl.capture.pipeline import capture_graph
from remat_dsl.check.replay import simulate
from remat_dsl.check.verify import verify
from remat_dsl.codegen.compare import load_generated
from remat_dsl.codegen.generate import generate
from remat_dsl.plan import ir
from remat_dsl.plan.inplace import inplace_candidates
from remat_dsl.plan.printer import print_plan
from remat_dsl.solve.api import BudgetError
from remat_dsl.solve.solvers.chain.partition import partition
from remat_dsl.solve.driver import Planner
from remat_dsl.solve.solvers.ilp import rockmate
from remat_dsl.solve.solvers.ilp.checkmate import op_hgraph
from remat_dsl.solve.solvers.ilp.hilp import HILP
from remat_dsl.solve.lowering import autograd_order, lowered_plan
from remat_dsl.solve.polish import _Index, _moved_up, _order_of
from test_end_to_end import trained_peak

ROOT = Path(__file__).resolve().parent.parent
MODELS = {
    "llama": "tests/models/hf_llama.py",
    "olmo": "tests/models/hf_olmo.py",
    "falcon": "tests/models/hf_falcon.py",
    "gpt2": "examples/gpt2.py",
    "resnet": "tests/models/hf_resnet.py",
}
TRANSFORMERS = ("llama", "olmo", "falcon", "gpt2")  # ResNet's ReLUs read batch norms' outputs: none is written in place


def hand_graph() -> ir.Graph:
    """x @ w.T and x @ w, then elementwise ops: their sum (a is read again later, b is
    not), a scaled, the sum times a broadcast parameter, two sums added, and a
    transposed read and what follows it."""
    f32 = "float32"

    def tensor(name, shape=(4, 8)):
        return ir.TensorDecl(name, shape, f32, 4 * shape[0] * shape[1], name)

    def op(name, target, *args):
        return ir.Op(name, ir.FORWARD, target, args, (), (name,), 10)

    a, b, s, f, d, g = (ir.Ref(n) for n in "absfdg")
    ops = (
        op("a", "aten.mm.default", ir.Ref("x"), ir.Call("aten.t.default", (ir.Ref("w"),))),
        op("b", "aten.mm.default", ir.Ref("x"), ir.Ref("w")),
        op("s", "aten.add.Tensor", a, b),
        op("f", "aten.mul.Tensor", a, 3.0),
        op("d", "aten.mul.Tensor", s, ir.Ref("v")),
        op("g", "aten.add.Tensor", d, f),
        op("r", "aten.mul.Tensor", ir.Call("aten.transpose.int", (g, 0, 1)), 2.0),
        op("q", "aten.neg.default", ir.Ref("r")),
    )
    tensors = tuple(tensor(n) for n in "absfdg") + (tensor("r", (8, 4)), tensor("q", (8, 4)))
    return ir.Graph(
        inputs=(ir.ValueDecl("input", "x", (4, 8), f32),),
        parameters=(ir.ValueDecl("parameter", "w", (8, 8), f32), ir.ValueDecl("parameter", "v", (8,), f32)),
        buffers=(),
        tangents=(),
        tensors=tensors,
        ops=ops,
        outputs=ir.Ref("q"),
        gradients=(),
    )


def test_the_rule_writes_into_inputs_known_contiguous_that_die_there():
    graph = hand_graph()
    assert inplace_candidates(graph) == {"s": ("a", "b"), "f": ("a",), "d": ("s",), "g": ("d", "f")}
    plan = lowered_plan(graph, [op.name for op in graph.ops])
    sim = simulate(plan)
    into = {step.instruction.target: step.into for step in sim.timeline if step.into}
    # a is read again by f, so the sum goes into b; r reads g transposed, and q reads r,
    # whose layout (a transposed one) is not known: both allocate
    assert into == {"s": "b", "f": "a", "d": "s", "g": "d"}
    for step in sim.timeline:
        if step.into:
            assert step.mem_peak == step.mem_before == step.mem_after
    assert sim.peak_bytes == 2 * 128  # two [4, 8] tensors at most: x @ w.T and x @ w, or g and r
    assert simulate(plan, inplace=False).peak_bytes == 3 * 128  # each op's output beside its two inputs


def test_a_generated_module_falls_back_with_a_warning_on_another_layout(tmp_path):
    """Should an input the plan writes into not be contiguous when the module runs, the op
    is computed as eager computes it, and a warning says the step takes more memory."""
    graph = hand_graph()
    plan = lowered_plan(graph, [op.name for op in graph.ops], budget=1024)
    path = tmp_path / "fast.py"
    path.write_text(generate(verify(plan), "hand.plan"))
    module = load_generated(path)
    a = torch.randn(8, 4).t()
    b = torch.randn(4, 8)
    step = module._Step()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = module._into(step, torch.ops.aten.mul.out, torch.ops.aten.mul.Tensor, "out", a, a, b)
    assert torch.equal(out, a * b) and out.data_ptr() != a.data_ptr()
    assert any("not written in place" in str(w.message) for w in caught)
    c = torch.randn(4, 8)
    written = module._into(step, torch.ops.aten.mul.out, torch.ops.aten.mul.Tensor, "out", c, c.clone(), b)
    assert written.data_ptr() == c.data_ptr()
    step.keep = True  # a backward that keeps the graph (retain_graph=True) writes nothing in place
    kept = module._into(step, torch.ops.aten.mul.out, torch.ops.aten.mul.Tensor, "out", c, c.clone(), b)
    assert kept.data_ptr() != c.data_ptr() and torch.equal(kept, c * b)


@functools.cache
def captured(name: str):
    """(name, model file, Planner) of a model of MODELS, with the CPU device model's costs."""
    model_file = load_model_file(str(ROOT / MODELS[name]))
    captured = capture_graph(model_file, device_model=load_device("cpu"))
    return name, model_file, Planner(captured.graph, model=model_file.spec, device=captured.device)


@pytest.mark.parametrize("name", TRANSFORMERS)
def test_in_place_plans_train_bit_for_bit_at_the_peak_they_predict(name, tmp_path):
    """At the first of a few budgets where writing in place lowers the simulated peak, the
    generated module trains as eager does, bit for bit, and measures that lower peak."""
    name, model_file, planner = captured(name)
    for percent in (70, 60, 50, 45, 40, 35):
        try:
            plan = planner.plan(planner.autograd_peak * percent // 100, "auto")
        except BudgetError:
            continue
        with_writes, without = simulate(plan), simulate(plan, inplace=False)
        if with_writes.peak_bytes < without.peak_bytes:
            break
    else:
        pytest.fail(f"{name}: writing in place lowers no plan's peak")
    assert any(step.into for step in with_writes.timeline)
    measured = trained_peak(model_file, print_plan(plan), tmp_path)
    assert abs(measured - with_writes.peak_bytes) <= 0.01 * with_writes.peak_bytes, (measured, with_writes.peak_bytes)
    assert measured < without.peak_bytes


@pytest.mark.parametrize("name", sorted(MODELS))
def test_backward_ops_moved_up_hold_no_more_memory(name):
    """Moving up the backward ops that write in place and free another input raises no
    plan's peak nor changes its time (every order here: the autograd order and the default
    solver's plans at two budgets), and on the Llama it moves silu's backward above the
    matrix products of its layer's up projection."""
    name, _, planner = captured(name)
    graph = planner.problem.graph
    index = _Index(graph)
    orders = [list(autograd_order(graph))]
    for percent in (90, 70):
        plan = planner.plan(planner.autograd_peak * percent // 100, "auto")
        orders.append(_order_of(plan.forward + plan.backward)[0])
    moved_any = 0
    for order in orders:
        moved, new_order, _ = _moved_up(index, order, [])
        before = lowered_plan(graph, order).header
        after = lowered_plan(graph, new_order).header
        assert sorted(new_order) == sorted(order)
        assert after.peak_bytes <= before.peak_bytes and after.time_us == before.time_us
        moved_any += moved
        if name == "llama" and order is orders[0]:  # in a plan, the gate may be recomputed there
            for layer in (0, 1):
                silu = new_order.index(f"model.layers.{layer}.mlp.act_fn.bwd.silu_backward")
                assert silu < new_order.index(f"model.layers.{layer}.mlp.up_proj.bwd.mm_1")
    if name == "llama":  # the autograd order: the driver's plans have theirs moved up already
        assert moved_any


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_block_ilp_is_feasible_at_its_replayed_store_all(name):
    """Every block of Rockmate's partition has a schedule at the grid's first point: the
    peak and saved memory of its store-all replay (NOTE: [Freed at the boundary]); before,
    the ILP kept each block's output to the end of its backward, and the final norm of a
    Llama had no schedule anywhere on its grid."""
    _, _, planner = captured(name)
    graph = planner.problem.graph
    part = partition(graph, refine=1)
    for ops in part.blocks:
        hg = op_hgraph(graph, ops.forward, ops.backward)
        if hg.boundary in (0, len(hg.nodes)):
            continue
        store_all = rockmate.replay(hg, tuple(range(hg.boundary, len(hg.nodes))))
        peak, save = rockmate.grid(hg, store_all)[0]
        assert HILP(hg).solve(peak, max(save, store_all.xbar), None) is not None, ops.forward[0]
