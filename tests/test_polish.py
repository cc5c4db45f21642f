"""Polish and repair (remat_dsl.solve.polish; NOTE: [Polish and repair] in
remat_dsl/solve/driver.py): local moves on the exact simulation after every solver.

Polished plans drop recomputations where keeping the value fits the budget; near misses
(plans a little above the budget) are repaired by recomputing at their peak.  Checked on
the GPT-2 example with the CPU device model's costs (deterministic), through the shell as
users type it, and as properties on synthetic graphs with several solvers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from remat_dsl.capture.cost import load_device
from remat_dsl.capture.model_file import load_model_file
from remat_dsl.capture.pipeline import capture_graph
from remat_dsl.check.replay import simulate
from remat_dsl.plan import ir
from remat_dsl.plan.constraints import read_constraints
from remat_dsl.plan.parser import parse
from remat_dsl.plan.printer import print_plan
from remat_dsl.solve.api import BudgetError
from remat_dsl.solve.driver import Planner
from remat_dsl.solve.polish import polish, repair
from synthetic_graphs import layered_fb_graph
from test_end_to_end import trained_peak

ROOT = Path(__file__).resolve().parent.parent
REMAT = Path(sys.executable).parent / "remat"


@pytest.fixture(scope="module")
def gpt2():
    model_file = load_model_file(str(ROOT / "examples/gpt2.py"))
    captured = capture_graph(model_file, device_model=load_device("cpu"))
    return model_file, captured, Planner(captured.graph, model=model_file.spec, device=captured.device)


def first_fitting_unimproved(planner: Planner, budget: int, solver: str) -> ir.Plan:
    """The plan the driver gave before polish and repair: the first candidate's that fits."""
    for candidate in planner._candidates(planner.solver(solver)):
        try:
            return planner._fit(candidate, budget)[0]
        except BudgetError:
            continue
    raise AssertionError("no candidate fits")


def runs(plan: ir.Plan) -> list[str]:
    return [i.target for i in plan.forward + plan.backward if i.verb in ("compute", "recompute")]


def test_gpt2_at_28_percent_is_a_near_miss_repaired_and_trains_bit_exactly(gpt2, tmp_path):
    """Rockmate's chain cannot meet 28% of GPT-2's autograd peak (4 layers); the driver took
    the fallback's plan, 62,926 us predicted with these costs.  A near miss repaired and
    polished predicts 58,558 us; it fits, says so in its header, and trains bit for bit
    with the predicted peak.  (At 30% before the output gradients stopped being counted,
    NOTE: [Gradient zeros] in capture/fbgraph.py: 81,074 and 59,821 us; at 30% Rockmate's
    chain now fits.)"""
    model_file, captured, planner = gpt2
    budget = planner.autograd_peak * 28 // 100
    before = first_fitting_unimproved(planner, budget, "rockmate")
    plan = planner.plan(budget, "rockmate")
    assert plan.header.peak_bytes <= budget
    assert "; repaired +" in plan.header.solver
    assert plan.header.status == "feasible" and plan.header.gap is None
    assert plan.header.time_us < 0.95 * before.header.time_us
    text = print_plan(plan)
    assert parse(text) == plan
    measured = trained_peak(model_file, text, tmp_path)
    assert measured <= budget and abs(measured - plan.header.peak_bytes) <= 0.05 * plan.header.peak_bytes


@pytest.mark.parametrize("solver", ["rotor", "rockmate", "twremat"])
def test_polished_plans_are_faster_within_the_budget_and_train_bit_exactly(gpt2, solver, tmp_path):
    """At 50%: the plan is never slower than the solver's own, its simulation agrees with
    its header, recomputations were dropped where the solver's plan had slack (the header
    says how many), and the module trains bit for bit."""
    model_file, captured, planner = gpt2
    budget = planner.autograd_peak // 2
    before = first_fitting_unimproved(planner, budget, solver)
    plan = planner.plan(budget, solver)
    sim = simulate(plan)
    assert sim.peak_bytes == plan.header.peak_bytes <= budget and sim.time_us == plan.header.time_us
    assert plan.header.time_us <= before.header.time_us
    if plan.header.time_us < before.header.time_us:
        assert "; polished -" in plan.header.solver or "; repaired +" in plan.header.solver
    measured = trained_peak(model_file, print_plan(plan), tmp_path, steps=2)
    assert measured <= budget


def test_polish_keeps_what_the_user_asked_to_recompute(gpt2, tmp_path):
    """A `recompute` constraint is honoured through the whole pipeline, though keeping the
    tensor would fit at 90%: polish skips those runs, and the lowering puts a constrained
    recomputation back if one is dropped, so this checks the two together."""
    model_file, captured, _ = gpt2
    path = tmp_path / "c.txt"
    path.write_text('recompute "transformer.h.*.mlp.act.tanh"\n')
    constraints = read_constraints(str(path))
    planner = Planner(captured.graph, model=model_file.spec, device=captured.device, constraints=constraints)
    plan = planner.plan(planner.autograd_peak * 9 // 10, "rockmate")
    recomputed = {i.target for i in plan.backward if i.verb == "recompute"}
    assert {f"transformer.h.{k}.mlp.act.tanh" for k in range(4)} <= recomputed


def test_a_budget_below_the_smallest_feasible_one_is_still_refused(gpt2):
    """Repair rescues near misses only once some plan fits: every budget at or above the
    smallest feasible one gets a plan, none below it does."""
    _, _, planner = gpt2
    smallest = planner.smallest_budget("rockmate")
    assert planner.plan(smallest, "rockmate").header.peak_bytes <= smallest
    with pytest.raises(BudgetError, match="smallest feasible budget"):
        planner.plan(smallest - 1, "rockmate")


def test_remat_plan_at_28_percent_as_users_type_it(tmp_path):
    """Through a shell with two hash seeds: the same bytes, the repair said in the plan's
    header (its solver) and above each run it added, and `remat check` accepts the plan
    against the model."""
    plans = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        command = f"{REMAT} plan {ROOT}/examples/gpt2.py --device cpu --budget 28% --no-cache > p{seed}.plan"
        result = subprocess.run(command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        plans.append((tmp_path / f"p{seed}.plan").read_text())
    assert plans[0] == plans[1]
    assert plans[0].startswith("remat-plan 2\n") and "; repaired +" in plans[0]
    assert "# repair: recomputed here for " in plans[0]
    check = subprocess.run(
        [str(REMAT), "check", "p1.plan", "--model", f"{ROOT}/examples/gpt2.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stderr


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 50),
    fraction=st.sampled_from([0.0, 0.2, 0.5]),
    solver=st.sampled_from(["rotor", "twremat", "hiremate"]),
)
def test_polish_and_repair_properties_on_synthetic_graphs(seed, fraction, solver):
    """On layered random DAGs (80 ops), at budgets from the solver's smallest to the
    autograd peak: a polished plan fits its budget, is no slower and simulates to its
    header; polish is deterministic; a repaired plan fits the lower budget asked, has more
    runs and is no faster than the plan repaired, or repair says it cannot.  (On these
    graphs twremat's plans at its smallest budget took 2,270-2,760 us and polished ones
    960-1,040 us.)"""
    graph = layered_fb_graph(80, width=3, seed=seed)
    planner = Planner(graph)
    smallest = planner.smallest_budget(solver)
    budget = smallest + int(fraction * (planner.autograd_peak - smallest))
    raw = first_fitting_unimproved(planner, budget, solver)
    polished = polish(raw, budget)
    assert polished.header.peak_bytes <= budget and polished.header.time_us <= raw.header.time_us
    assert simulate(polished).time_us == polished.header.time_us
    assert polish(raw, budget) == polished
    lower = raw.header.peak_bytes * 97 // 100
    repaired = repair(raw, lower)
    if repaired is not None:
        sim = simulate(repaired)
        assert sim.peak_bytes == repaired.header.peak_bytes <= lower
        assert repaired.header.time_us >= raw.header.time_us
        assert len(runs(repaired)) > len(runs(raw))


def test_twremat_orders_of_87000_runs_are_polished():
    """A layered random DAG of 8,000 ops: TW-Remat's order at 50% of its store-all peak is
    87,194 runs, x10.9 every op once (each op takes 10 us), above the 20,000 runs polish
    was once limited to.  Polish (dead runs removed in one pass, two runs of an op in a
    row dropped in one round, NOTE: [Polish]) brings it under x1.5; the plan fits and
    simulates to its header."""
    graph = layered_fb_graph(8000, width=4)
    planner = Planner(graph)
    budget = planner.autograd_peak // 2
    raw = first_fitting_unimproved(planner, budget, "twremat")
    assert len(runs(raw)) > 80_000  # the premise: a long order
    plan = planner.plan(budget, "twremat")
    assert "; polished -" in plan.header.solver
    assert plan.header.peak_bytes <= budget and plan.header.time_us < 1.5 * 8000 * 10
    assert simulate(plan).time_us == plan.header.time_us
