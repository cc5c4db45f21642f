"""The joint O-ILP (NOTE: [Joint O-ILP] in remat_dsl/solve/solvers/ilp/offmate.py) as a
candidate of `Planner.plan_step` (NOTE: [Joint candidate] in remat_dsl/solve/driver.py): one
model holds the block options and the parameters' placement, never predicts a slower step
than the placement LP's on the activations chosen first, plans a budget below parameters +
gradients + states that `remat check` accepts and that trains bit for bit beside eager
torch.optim, and `plan_step` is never slower with it than without it."""

from __future__ import annotations

import copy
import functools
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from remat_dsl import capture_model, generate_module, load_module, plan_text
from remat_dsl.capture.cost import load_device
from remat_dsl.capture.model_file import load_model_file
from remat_dsl.check.replay import simulate, value_nbytes
from remat_dsl.plan.optimizer import parse_optimizer
from remat_dsl.solve.driver import Planner
from remat_dsl.plan.printer import without_solve_time
from remat_dsl.solve.solvers.ilp import milp
from remat_dsl.solve.solvers.ilp.offmate import parameter_blocks, whole_step
from remat_dsl.workflow import update_speeds

MODELS = Path(__file__).resolve().parent / "models"
ADAMW = "adamw lr=0.01 weight_decay=0.1"


@functools.cache
def _captured(device: str):
    """(the captured stock HF Llama step with costs predicted for `device`, bytes of
    parameters + gradients + AdamW states)."""
    model_file = load_model_file(str(MODELS / "hf_llama.py"))
    model, inputs = model_file.build(), model_file.inputs()
    captured = capture_model(model, inputs, device=device)
    sizes = [p.numel() * p.element_size() for p in model.parameters()]
    return captured, 4 * sum(sizes)  # AdamW: two states per parameter


def _planner(device: str) -> Planner:
    """A Planner of the whole step as `remat plan --device DEVICE` makes it: the device's
    link, offloading for a GPU."""
    captured, _ = _captured(device)
    link = load_device(device)
    return Planner(
        captured.graph, model="m", device=captured.device, bandwidth=int(link.host_to_device),
        host_link=link.kind == "cuda",
    )  # fmt: skip


def _activations(planner: Planner) -> Planner:
    """The Planner of the activations, the graph without its gradient lines, as plan_step builds it."""
    p = planner.problem
    return Planner(
        replace(p.graph, gradients=()), model="m", device=p.device, bandwidth=planner.bandwidth,
        host_link=p.host_link,
    )  # fmt: skip


def _speeds(device: str):
    captured, _ = _captured(device)
    optimizer = parse_optimizer(ADAMW)
    return optimizer, update_speeds(optimizer, load_device(device), captured.device)


# the solver plan_step is asked for: on the CPU (no host link) `auto` plans with another
# solver than offmate, and the joint candidate runs only for offmate's activations
SOLVER = {"cpu": "offmate", "rtx3060": "auto"}


@functools.cache
def _plan_step(device: str, share: float, joint: bool = True):
    """`plan_step` with AdamW at `share` of parameters + gradients + states, with or
    without the joint candidate."""
    _, held = _captured(device)
    planner = _planner(device)
    if not joint:
        planner.JOINT_ROUNDS = 0
    optimizer, speeds = _speeds(device)
    return planner.plan_step(int(share * held), optimizer, speeds, SOLVER[device])


def test_the_joint_model_is_never_slower_than_the_sequential_one_on_its_own_model():
    planner = _planner("rtx3060")
    optimizer, speeds = _speeds("rtx3060")
    solver = _activations(planner).solver("offmate")
    graph = planner.problem.graph
    sizes = {p.name: value_nbytes(p) for p in graph.parameters}
    trainable = {g.parameter for g in graph.gradients if g.value is not None}
    blocks = parameter_blocks(graph, solver.part)
    assert set(blocks) == set(sizes) and set(blocks.values()) <= set(range(1, len(solver.part.blocks) + 1))
    whole = whole_step(
        blocks, len(solver.part.blocks), sizes=sizes, trainable=trainable, state_bytes=optimizer.state_bytes,
        temp_bytes=optimizer.temp_bytes, speeds=speeds,
    )  # fmt: skip
    oilp = solver.oilp
    names = {v.name for v in oilp._model(10**9, whole)[0].variables()}
    L = len(solver.part.blocks)
    assert {f"Comp_{L}_0", "Ofl_1", f"Prf_1_{L}"} <= names  # the block options and the activations' transfers
    assert {f"{x}_{l}" for x in "sogwv" for l in range(1, L + 1)} <= names  # and the placement, per block
    # the sequential plan: Offmate's activations at the budget less what the step holds
    # with every parameter and state on the device, then the placement for them
    budget = whole.held() + 2 * oilp.floor
    first = oilp.solve(budget - whole.held())
    assert first is not None
    sequential = oilp.solve(budget, whole=whole, fixed=first)
    joint = oilp.solve(budget, whole=whole)
    assert sequential is not None and joint is not None
    assert sequential.options == first.options and sequential.placement is not None
    assert joint.placement is not None and len(joint.placement.streamed) == L
    assert joint.time_us <= sequential.time_us * (1 + milp.REL_GAP)  # the MILP stops within REL_GAP
    # below parameters + gradients + states the sequential plan has no activation budget left
    _, pgs = _captured("rtx3060")
    tight = int(0.6 * pgs)
    assert tight < whole.held() and oilp.solve(tight - whole.held()) is None
    placed = oilp.solve(tight, whole=whole)
    assert placed is not None and placed.placement is not None
    assert max(placed.placement.streamed) > 0.5 and max(placed.placement.paged) > 0.5


def _trained_beside_eager(path: Path, tmp_path: Path) -> None:
    """The plan at `path`, accepted by `remat check` through the shell, trains the stock
    HF Llama 3 AdamW steps bit for bit beside eager torch.optim."""
    checked = subprocess.run([sys.executable, "-m", "remat_dsl", "check", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    source = tmp_path / "fast_llama.py"
    source.write_text(generate_module(path))
    module = load_module(source)
    model_file = load_model_file(str(MODELS / "hf_llama.py"))
    eager, inputs = model_file.build(), model_file.inputs()
    ours = copy.deepcopy(eager)
    eager_opt = torch.optim.AdamW(eager.parameters(), lr=0.01, weight_decay=0.1)
    fast = module.FastModel(ours, optimizer=torch.optim.AdamW(ours.parameters(), lr=0.01, weight_decay=0.1))
    for step in range(3):
        torch.manual_seed(step)
        loss = eager(**inputs).loss
        loss.backward()
        eager_opt.step()
        eager_opt.zero_grad()
        torch.manual_seed(step)
        ours_loss = fast(**inputs).loss
        ours_loss.backward()
        fast.optimizer.step()
        assert torch.equal(loss, ours_loss)
    for (name, a), b in zip(eager.named_parameters(), ours.parameters()):
        assert torch.equal(a, b), name


def test_the_joint_plan_below_parameters_gradients_and_states_checks_and_trains_bit_for_bit(tmp_path):
    _, held = _captured("cpu")
    budget = int(0.6 * held)
    planner = _planner("cpu")
    optimizer, speeds = _speeds("cpu")
    made = planner._joint_oilp(_activations(planner), "offmate", budget, optimizer, speeds, None)
    assert made is not None  # the joint candidate's own plan, whether or not plan_step keeps it
    plan = made[1]
    assert "placement=joint-o-ilp predicted-us=" in plan.header.solver
    assert simulate(plan).peak_bytes == plan.header.peak_bytes <= budget < held
    path = tmp_path / "llama.plan"
    path.write_text(plan_text(plan))
    _trained_beside_eager(path, tmp_path)


def test_the_joint_candidate_is_the_same_plan_on_every_run():
    texts = []
    for _ in range(2):
        planner = _planner("rtx3060")
        optimizer, speeds = _speeds("rtx3060")
        _, held = _captured("rtx3060")
        made = planner._joint_oilp(_activations(planner), "auto", int(0.6 * held), optimizer, speeds, None)
        assert made is not None
        assert "placement=joint-o-ilp" in made[1].header.solver
        texts.append(plan_text(made[1]))
    assert texts[0] == texts[1]


@pytest.mark.parametrize("device, share", [("cpu", 0.6), ("rtx3060", 0.6)])
def test_plan_step_is_never_slower_with_the_joint_candidate(device, share):
    _, held = _captured(device)
    plan, without = _plan_step(device, share), _plan_step(device, share, joint=False)
    assert plan.header.peak_bytes <= share * held
    assert plan.header.time_us <= without.header.time_us
    if "placement=joint-o-ilp" not in plan.header.solver:
        assert without_solve_time(plan_text(plan)) == without_solve_time(plan_text(without))  # the others' plan


def test_another_solver_s_plan_has_no_joint_candidate():
    """The joint model plans the activations with offmate: a plan asked of another solver
    (or of `auto` where it picks another) stays that solver's."""
    planner = _planner("rtx3060")
    optimizer, speeds = _speeds("rtx3060")
    _, held = _captured("rtx3060")
    assert planner._joint_oilp(_activations(planner), "rockmate", int(0.6 * held), optimizer, speeds, None) is None
    cpu = _planner("cpu")
    optimizer, speeds = _speeds("cpu")
    assert _activations(cpu).chosen("auto") != "offmate"
    assert cpu._joint_oilp(_activations(cpu), "auto", int(0.6 * _captured("cpu")[1]), optimizer, speeds, None) is None
