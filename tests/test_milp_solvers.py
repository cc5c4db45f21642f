"""Rockmate, HiRemate, Checkmate and auto (issue 4) end to end on the example models.

For every example (GPT-2 and the Transformer here, the CNNs in test_milp_solvers_cnn.py) and
each of rockmate and hiremate, at 100%, 70%, 50% of the autograd
peak and at the smallest budget the solver finds feasible: plan, round-trip the text,
generate the module in a fresh process, run three SGD steps against eager with dropout on
(torch.equal on losses, gradients, parameters, buffers), and measure the module's peak
on CPU: at most the budget, within 5% of the prediction (the longest of these cases run
with `pytest -m slow` only: SLOW_CASES in tests/conftest.py).  Then the pieces: RK-Rotor
without options is rotor, the H-ILP's schedules are valid and within budget, MILP status
is honest, auto picks by structure, checkmate runs small graphs exactly.
"""

from __future__ import annotations

import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pulp
import pytest

from remat_dsl.plan.errors import RematError
from remat_dsl.capture.model_file import load_model_file
from remat_dsl.plan.parser import parse
from remat_dsl.capture.pipeline import capture_graph
from remat_dsl.plan.printer import print_plan
from remat_dsl.solve.api import BudgetError, Problem
from remat_dsl.solve.solvers.auto import choose
from remat_dsl.solve.driver import Planner, autograd_peak, make_plan, smallest_budget
from remat_dsl.solve.solvers.chain import rk_rotor
from remat_dsl.solve.solvers.ilp import milp
from remat_dsl.solve.solvers.chain.model import Block, BlockOption, Chain, simulate_chain, store_all_schedule
from remat_dsl.solve.solvers.ilp.checkmate import op_hgraph
from remat_dsl.solve.solvers.ilp.hilp import HILP
from remat_dsl.solve.solvers.ilp.rockmate import replay
from remat_dsl.solve.solvers.chain.rotor import min_feasible_budget, solve_rotor
from remat_dsl.codegen.compare import compare_training, load_generated
from test_end_to_end import codegen_in_fresh_process, trained_peak


def choose_solver(graph) -> str:
    return choose(Problem(graph, "cpu"))


ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ["examples/gpt2.py", "examples/transformer.py"]  # the CNNs: test_milp_solvers_cnn.py (two xdist files)
BUDGETS = ["100%", "70%", "50%", "min"]
SOLVERS = ["rockmate", "hiremate"]


@pytest.fixture(scope="module", params=EXAMPLES)
def example(request):
    return planned_example(request.param)


def planned_example(path: str):
    """The example's model file, its capture, and one Planner for every budget and solver
    of the module: a sweep solves each block's ILPs once, as `remat` does in one process."""
    model_file = load_model_file(str(ROOT / path))
    captured = capture_graph(model_file, repeats=1)
    planner = Planner(captured.graph, model=model_file.spec, device=captured.device)
    return model_file, captured, planner, {}


checked: dict = {}  # (forward, backward) instructions -> measured peak of their module


def budget_of(label: str, solver: str, planner: Planner, smallest: dict) -> int:
    if label != "min":
        return planner.autograd_peak * int(label.rstrip("%")) // 100
    if solver not in smallest:
        smallest[solver] = planner.smallest_budget(solver)
    return smallest[solver]


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("label", BUDGETS)
def test_plan_trains_identically_within_budget(example, solver, label, tmp_path):
    model_file, captured, planner, smallest = example
    budget = budget_of(label, solver, planner, smallest)
    try:
        plan = planner.plan(budget, solver)
    except BudgetError as error:
        # NOTE: [Chains on non-chains] Rockmate's chain model does not see the U-Net's skip
        # tensors; at 50% it may refuse (auto gives such graphs to hiremate, which plans them
        # at 50%).  The refusal must name a budget close above, which then must work.
        assert solver == "rockmate" and choose_solver(captured.graph) == "hiremate", error
        assert budget < error.smallest <= budget * 1.1, error
        budget = error.smallest
        plan = planner.plan(budget, solver)
    h = plan.header
    assert h.solver.startswith(solver) and h.peak_bytes <= budget
    assert h.status in ("optimal", "feasible") and h.solve_seconds is not None
    text = print_plan(plan)
    assert parse(text) == plan
    schedule = (plan.forward, plan.backward)
    if schedule not in checked:  # hiremate on a chain gives rockmate's schedule: run it once
        checked[schedule] = trained_peak(model_file, text, tmp_path)
    measured = checked[schedule]
    assert measured <= budget, (measured, h.peak_bytes, h.peak_at)
    assert abs(measured - h.peak_bytes) <= 0.05 * h.peak_bytes


def test_peak_lower_bound_is_below_the_smallest_plans(example):
    """The refusal's proven bound (driver.peak_lower_bound) is at or below the smallest
    budget every solver reaches, and at least the parameter gradients."""
    _, captured, planner, smallest = example
    bound, why = planner.peak_lower_bound
    assert planner.gradient_bytes <= bound <= planner.autograd_peak and why
    for solver in SOLVERS:
        assert bound <= budget_of("min", solver, planner, smallest)


def test_rockmate_needs_no_more_memory_than_rotor(example):
    model_file, captured, planner, smallest = example
    if "gpt2" not in model_file.spec:
        pytest.skip("on graphs with skip tensors the two partition differently")
    assert budget_of("min", "rockmate", planner, smallest) <= planner.smallest_budget("rotor")


def test_rockmate_needs_less_memory_than_rotor_on_gpt2_6_layers():
    """On the 4-layer GPT-2 both floors are set by the LM head's backward; with more layers
    Rockmate's options inside the blocks show (the issue measures this at 12 layers in
    bench/frontier.py)."""
    captured = capture_graph(
        load_model_file(str(ROOT / "examples/gpt2.py") + ":build_gpt2_6l"), repeats=1, measure_time=False
    )
    rockmate = smallest_budget(captured.graph, captured.device, "rockmate")
    rotor = smallest_budget(captured.graph, captured.device, "rotor")
    assert rockmate < rotor


def test_auto_picks_by_structure(example):
    model_file, captured, planner, _ = example
    expected = {"gpt2": "rockmate", "resnet": "rockmate", "transformer": "hiremate", "unet": "hiremate"}
    name = Path(model_file.spec.split(":")[0]).stem
    assert choose_solver(captured.graph) == expected[name]
    # at 50%, a budget the solvers' cases above solved: the Planner has its blocks' options
    plan = planner.plan(planner.autograd_peak // 2, "auto")
    assert plan.header.solver.startswith(f"auto: {expected[name]}")


# --- small graphs: checkmate and the H-ILP --------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    model_file = load_model_file(str(ROOT / "tests/models/tiny_mlp.py"))
    captured = capture_graph(model_file, repeats=1)
    return model_file, captured, autograd_peak(captured.graph, captured.device)


def test_checkmate_on_a_small_graph(tiny, tmp_path):
    model_file, captured, autograd = tiny
    assert choose_solver(captured.graph) == "checkmate"
    with pytest.raises(BudgetError) as error:
        make_plan(
            captured.graph, model=model_file.spec, device=captured.device, budget=autograd // 10, solver="checkmate"
        )
    budget = error.value.smallest
    assert budget < autograd
    plan = make_plan(captured.graph, model=model_file.spec, device=captured.device, budget=budget, solver="checkmate")
    assert plan.header.peak_bytes <= budget and plan.header.recompute_us > 0
    generated = load_generated(codegen_in_fresh_process(print_plan(plan), tmp_path))
    assert compare_training(model_file, generated, steps=2).identical


def test_checkmate_refuses_big_graphs(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "remat_dsl",
            "plan",
            "examples/gpt2.py",
            "--solver",
            "checkmate",
            "--budget",
            "50%",
            "-o",
            str(tmp_path / "x.plan"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "use --solver rockmate or --solver hiremate" in result.stderr
    assert not (tmp_path / "x.plan").exists()


def test_hilp_schedules_fit_their_budget(tiny):
    """The H-ILP's schedule, replayed with the lowering's liveness, peaks at most at the
    budget it was given, and a smaller budget never gives a faster schedule."""
    _, captured, _ = tiny
    graph = captured.graph
    forward = tuple(op.name for op in graph.ops if op.phase == "forward")
    backward = tuple(op.name for op in graph.ops if op.phase == "backward")
    hg = op_hgraph(graph, forward, backward)
    model = HILP(hg)
    store_all = replay(hg, tuple(range(hg.boundary, len(hg.nodes))))
    top = max(store_all.fwd_peak, store_all.bwd_peak)
    lo, hi = 0, top  # bisection for the ILP's smallest budget
    for _ in range(10):
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if model.solve(mid) is not None else (mid, hi)
    times = []
    for budget in (top, (top + hi) // 2, hi):
        schedule = model.solve(budget)
        assert schedule is not None and schedule.result.status in ("optimal", "feasible")
        assert [k for k, _ in schedule.steps[: schedule.boundary_step]] == list(range(hg.boundary))
        r = replay(hg, tuple(k for k, _ in schedule.steps[schedule.boundary_step :]))
        assert max(r.fwd_peak, r.bwd_peak) <= budget
        times.append(schedule.time_us)
    assert hi < top and times[-1] > times[0]
    assert times[1] <= times[-1] * 1.01 + 1 and times[0] <= times[1] * 1.01 + 1  # within the 1% gap


# --- RK-Rotor ---------------------------------------------------------------------------


def random_chain(rng: random.Random, options: bool) -> Chain:
    blocks = []
    for _ in range(rng.randint(1, 6)):
        x = rng.randint(1, 100)
        xbar = x + rng.randint(0, 300)
        extra = ()
        if options:
            extra = tuple(
                BlockOption(rng.randint(x, xbar), rng.randint(0, 100), rng.randint(1, 4000), rng.randint(0, 300), i)
                for i in range(rng.randint(1, 3))
            )
        kept = rng.choice((0, rng.randint(0, 200)))  # NOTE: [Kept gradients]
        blocks.append(
            Block(
                rng.randint(1, 1000),
                rng.randint(1, 2000),
                x,
                xbar,
                x,
                rng.randint(0, 100),
                rng.randint(0, 200),
                extra,
                kept,
            )
        )
    return Chain(tuple(blocks), 5, 5)


def test_rockmate_grid_and_block_key_follow_its_config(tiny):
    """RockmateConfig's grid sets the (M_peak, M_save) points and the block cache key:
    the default's key is the one the two module constants made, another grid's differs,
    so a block solved on one grid is never recalled for another."""
    from remat_dsl.plan.cache import Cache
    from remat_dsl.solve.solvers.ilp.rockmate import RockmateConfig, _block_key, _source_digest, grid

    graph = tiny[1].graph
    forward = tuple(op.name for op in graph.ops if op.phase == "forward")
    backward = tuple(op.name for op in graph.ops if op.phase == "backward")
    hg = op_hgraph(graph, forward, backward)
    store_all = replay(hg, tuple(range(hg.boundary, len(hg.nodes))))
    assert grid(hg, store_all) == grid(hg, store_all, 3, 6) and len(grid(hg, store_all, 1, 1)) == 1
    assert len(grid(hg, store_all, 4, 8)) > len(grid(hg, store_all))
    ilp = _source_digest("ilp/hilp.py", "ilp/checkmate.py", "ilp/milp.py")
    today = Cache.key("rockmate-block", 3, 6, milp.REL_GAP, milp.MAX_NODES, milp.backend_versions(), ilp, hg)
    assert _block_key(hg) == _block_key(hg, RockmateConfig()) == today
    assert _block_key(hg, RockmateConfig(peak_steps=4)) != today != _block_key(hg, RockmateConfig(save_steps=8))
    assert _block_key(hg, RockmateConfig(slots=1000, max_options=4)) == today  # applied after the cache


def test_rk_rotor_without_options_is_rotor():
    rng = random.Random(0)
    for _ in range(40):
        chain = random_chain(rng, options=False)
        floor = rk_rotor.min_feasible_budget(chain, 100)
        for budget in (floor, floor + 17, 2 * floor):
            assert (
                rk_rotor.solve_rk_rotor(chain, budget, 100).predicted_us == solve_rotor(chain, budget, 100).predicted_us
            )


def test_rk_rotor_options_never_hurt():
    """More options: at least as fast at every budget, and each sequence replays within budget."""
    rng = random.Random(1)
    for _ in range(40):
        chain = random_chain(rng, options=True)
        plain = Chain(tuple(replace(b, options=()) for b in chain.blocks), 5, 5)
        floor = rk_rotor.min_feasible_budget(plain, 100)
        assert rk_rotor.min_feasible_budget(chain, 100) <= floor
        for budget in (floor, floor * 3 // 2):
            with_options = rk_rotor.solve_rk_rotor(chain, budget, 100)
            assert with_options.predicted_us <= rk_rotor.solve_rk_rotor(plain, budget, 100).predicted_us
            peak, total = simulate_chain(chain, with_options.ops)
            assert peak <= budget and total == with_options.predicted_us


def test_rk_rotor_min_feasible_budget_is_exact():
    """`min_feasible_budget` (the min/max table, many budgets per round) is the least budget
    at which the whole cost table finds a sequence, at every slot count; without options
    it is rotor's; at the store-all peak, where rounding may leave the table nothing,
    `solve_rk_rotor` returns store-all."""
    rng = random.Random(2)
    for _ in range(60):
        chain = random_chain(rng, options=rng.random() < 0.8)
        store_all = store_all_schedule(chain).predicted_peak
        for slots in (7, 100, 500):
            smallest = rk_rotor.min_feasible_budget(chain, slots)
            assert smallest <= store_all
            assert rk_rotor.try_rk_rotor(chain, smallest, slots) is not None or smallest == store_all
            assert rk_rotor.try_rk_rotor(chain, smallest - 1, slots) is None
            rk_rotor.solve_rk_rotor(chain, smallest, slots)
            if not any(b.options for b in chain.blocks):
                assert smallest == min(store_all, min_feasible_budget(chain, slots))


# --- MILP status ------------------------------------------------------------------------


def knapsack(n: int) -> pulp.LpProblem:
    rng = random.Random(n)
    problem = pulp.LpProblem("knapsack", pulp.LpMaximize)
    x = [problem.add_variable(f"x{i}", cat="Binary") for i in range(n)]
    weights = [rng.randint(10**5, 10**6) for _ in range(n)]
    problem += pulp.lpSum(rng.randint(10**5, 10**6) * v for v in x)
    problem += pulp.lpSum(w * v for w, v in zip(weights, x)) <= sum(weights) // 2
    return problem


def test_milp_status_is_honest():
    small = milp.solve(knapsack(10), rel_gap=0.0)
    assert small.status == milp.OPTIMAL and small.gap is not None and small.gap <= milp.OPTIMAL_GAP
    loose = milp.solve(knapsack(400), rel_gap=0.5)
    assert loose.has_solution
    if loose.status == milp.FEASIBLE:  # stopped at the gap: said so, with the gap
        assert loose.gap is not None and milp.OPTIMAL_GAP < loose.gap <= 0.5
    infeasible = pulp.LpProblem("infeasible", pulp.LpMinimize)
    y = infeasible.add_variable("y", cat="Binary")
    infeasible += y
    infeasible += y >= 2
    assert milp.solve(infeasible).status == milp.INFEASIBLE


def multidimensional_knapsack(n: int, m: int) -> pulp.LpProblem:
    """n items, m capacity rows: HiGHS needs 44 branch-and-bound nodes for n=40, m=10."""
    rng = random.Random(0)
    problem = pulp.LpProblem("mkp", pulp.LpMaximize)
    x = [problem.add_variable(f"x{i}", cat="Binary") for i in range(n)]
    problem += pulp.lpSum(rng.randint(1, 1000) * v for v in x)
    for _ in range(m):
        weights = [rng.randint(1, 1000) for _ in range(n)]
        problem += pulp.lpSum(w * v for w, v in zip(weights, x)) <= sum(weights) // 2
    return problem


def test_node_bound_stops_with_an_honest_status():
    """NOTE: [Effort bound]: a count of nodes, not a time, so the result is the same on a
    loaded machine; stopped early, the status says feasible with the gap HiGHS proved."""
    closed = milp.solve(multidimensional_knapsack(40, 10), rel_gap=0.0, max_nodes=10**6)
    assert closed.status == milp.OPTIMAL
    results, objectives = [], []
    for _ in range(2):
        problem = multidimensional_knapsack(40, 10)
        results.append(milp.solve(problem, rel_gap=0.0, max_nodes=3))
        objectives.append(pulp.value(problem.objective))
        assert problem.solverModel.getInfo().mip_node_count <= 3
    assert results[0].status == milp.FEASIBLE and results[0].gap > milp.OPTIMAL_GAP
    assert results[0].gap == results[1].gap and objectives[0] == objectives[1]  # deterministic


def test_time_limit_gives_best_plan_marked_feasible(example):
    model_file, captured, planner, _ = example
    autograd = planner.autograd_peak
    if "transformer" not in model_file.spec:
        pytest.skip("one non-chain graph is enough")
    try:
        plan = make_plan(
            captured.graph,
            model=model_file.spec,
            device=captured.device,
            budget=autograd * 6 // 10,
            solver="hiremate",
            time_limit=0.5,
        )
    except (BudgetError, RematError):
        return  # no solution within the limit: refused, not faked
    assert plan.header.status in ("optimal", "feasible")
    if plan.header.status == "optimal":
        assert plan.header.gap == 0.0


def test_hiremate_hierarchy_on_a_deeper_encoder_decoder(tmp_path):
    """4 encoder and 4 decoder layers: more blocks than one H-ILP takes (HiremateConfig.max_children), so
    H-Partition groups them and the clusters are solved bottom-up (levels > 2)."""
    model_file = load_model_file(str(ROOT / "examples/transformer.py") + ":build_transformer_4x4")
    captured = capture_graph(model_file, repeats=1)
    budget = autograd_peak(captured.graph, captured.device) // 2
    plan = make_plan(captured.graph, model=model_file.spec, device=captured.device, budget=budget, solver="auto")
    assert plan.header.solver.startswith("auto: hiremate levels=")
    assert int(plan.header.solver.split("levels=")[1].split()[0]) > 2
    assert trained_peak(model_file, print_plan(plan), tmp_path, steps=2) == plan.header.peak_bytes <= budget


def test_hiremate_frees_a_childs_saved_tensors_through_its_options(tmp_path):
    """NOTE: [Saved tensors are phantoms] in hiremate.py: what a child saves for its own
    backward is its options' phantom, not an aNode of the level.  When it was an aNode,
    hiremate's smallest budget for this DenseNet (its 6 dense layers one block) was 91% of
    the autograd peak on the CPU device model's costs (deterministic, unlike measured
    ones); it is now 65%, rockmate's, and the default solver's plan at 70% fits and trains
    bit for bit at its predicted peak."""
    from remat_dsl.capture.cost import load_device

    model_file = load_model_file(str(ROOT / "tests/models/tiny_densenet.py"))
    captured = capture_graph(model_file, device_model=load_device("cpu"))
    budget = autograd_peak(captured.graph, captured.device) * 70 // 100
    plan = make_plan(captured.graph, model=model_file.spec, device=captured.device, budget=budget, solver="auto")
    assert plan.header.solver.startswith("auto: hiremate")
    # the device model predicts temporaries above the real ones: the measured peak is lower
    assert trained_peak(model_file, print_plan(plan), tmp_path, steps=2) <= plan.header.peak_bytes <= budget


def test_chain_solvers_count_the_parameter_gradients_the_backward_keeps(tmp_path):
    """NOTE: [Kept gradients] and [Two chain models] in solve/solvers/chain/model.py: rotor's chain
    counts every parameter gradient from the B step that makes it to the step's end, and
    falls back on the paper's model, which does not.  On a 2-layer Hugging Face Llama with
    the CPU device model's costs (deterministic), rotor's smallest budget was 66.8% of the
    autograd peak when the chain did not count them; it is now below 65%, planned by the
    counted model, and that plan trains bit for bit.  Since the output gradients are no
    longer counted (NOTE: [Gradient zeros] in capture/fbgraph.py) the counted chain plans
    61% and the paper's model 65% but not 64%: 63% is between them."""
    from remat_dsl.capture.cost import load_device

    model_file = load_model_file(str(ROOT / "tests/models/hf_llama.py"))
    captured = capture_graph(model_file, device_model=load_device("cpu"))
    planner = Planner(captured.graph, model=model_file.spec, device=captured.device)
    rotor = planner.solver("rotor")
    assert sum(b.kept_bytes for b in rotor.part.chain.blocks) == planner.gradient_bytes
    (paper,) = rotor.fallbacks()
    assert not any(b.kept_bytes for b in paper.part.chain.blocks) and paper.describe().endswith("gradients=uncounted")
    budget = planner.autograd_peak * 63 // 100
    plan = planner.plan(budget, "rotor")
    assert "uncounted" not in plan.header.solver
    with pytest.raises(BudgetError):
        planner._fit(paper, budget)  # the paper's model alone cannot plan it
    # the device model's temporaries are not this machine's: the measured peak is within 5%
    measured = trained_peak(model_file, print_plan(plan), tmp_path, steps=2)
    assert plan.header.peak_bytes <= budget and abs(measured - plan.header.peak_bytes) <= 0.05 * plan.header.peak_bytes


def test_rotor_falls_back_on_the_papers_chain_model_where_it_reaches_lower(tmp_path):
    """NOTE: [Two chain models]: on a 2-layer Hugging Face GPT-2 with the CPU device model's
    costs, the counted chain's plans near its floor peak at 65% of the autograd peak and the
    paper's at 62% (its errors partly cancel there); the smallest budget is the paper
    model's, and the plan at it is the paper model's or a counted plan repaired to fit
    (NOTE: [Polish and repair] in solve/driver.py), its header says which, and it trains
    bit for bit."""
    from remat_dsl.capture.cost import load_device

    model_file = load_model_file(str(ROOT / "tests/models/hf_gpt2.py"))
    captured = capture_graph(model_file, device_model=load_device("cpu"))
    planner = Planner(captured.graph, model=model_file.spec, device=captured.device)
    rotor = planner.solver("rotor")
    (paper,) = rotor.fallbacks()
    counted = min(p.header.peak_bytes for p in planner._floor_plans(rotor))
    smallest = planner.smallest_budget("rotor")
    assert smallest == min(p.header.peak_bytes for p in planner._floor_plans(paper)) < counted
    plan = planner.plan(smallest, "rotor")
    repaired = "; repaired +" in plan.header.solver
    assert plan.header.solver.endswith("gradients=uncounted") or repaired
    assert plan.header.peak_bytes <= smallest
    measured = trained_peak(model_file, print_plan(plan), tmp_path, steps=2)
    assert abs(measured - plan.header.peak_bytes) <= 0.05 * plan.header.peak_bytes
