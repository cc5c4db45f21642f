"""The constraint language: parsing, conflicts, and every solver honouring it."""

from __future__ import annotations

import fnmatch
import subprocess
import sys
from pathlib import Path

import pytest

from remat_dsl.plan import ir
from remat_dsl.plan.constraints import read_constraints
from remat_dsl.plan.errors import PlanError, RematError
from remat_dsl.capture.model_file import load_model_file
from remat_dsl.plan.parser import parse
from remat_dsl.capture.pipeline import capture_graph
from remat_dsl.plan.printer import print_plan
from remat_dsl.check.replay import simulate
from remat_dsl.solve.driver import Planner, autograd_peak, make_plan
from remat_dsl.solve.registry import NAMES as SOLVERS
from remat_dsl.codegen.compare import compare_training, load_generated
from remat_dsl.check.verify import verify
from remat_dsl.codegen.generate import generate
from test_polish import first_fitting_unimproved

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "tests" / "models" / "tiny_mlp.py")


def remat(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "remat_dsl", *args], capture_output=True, text=True, cwd=ROOT)


@pytest.fixture(scope="module")
def gpt2():
    model_file = load_model_file(str(ROOT / "examples/gpt2.py"))
    captured = capture_graph(model_file, repeats=1)
    return model_file, captured, autograd_peak(captured.graph, captured.device)


@pytest.fixture(scope="module")
def tiny():
    model_file = load_model_file(TINY)
    return model_file, capture_graph(model_file, repeats=1)


def recomputed_tensors(plan: ir.Plan) -> set[str]:
    ops = plan.graph.op_by_name
    return {t for i in (*plan.forward, *plan.backward) if i.verb == "recompute" for t in ops[i.target].outputs}


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "c.constraints"
    path.write_text(text)
    return str(path)


BUDGET_PERCENT = {
    "autograd": 100,
    "checkpoint-sqrt": 100,
    "rotor": 70,
    "rockmate": 70,
    "hiremate": 70,
    "auto": 70,
    "twremat": 70,
}


# checkmate and moccasin: small graphs only; offmate offloads rather than recomputes them (tests/test_offmate.py)
@pytest.mark.parametrize("solver", [s for s in SOLVERS if s not in ("checkmate", "offmate", "moccasin")])
def test_keep_is_honoured_by_every_solver(gpt2, solver, tmp_path):
    model_file, captured, autograd = gpt2
    pattern = "transformer.h.*.mlp.act*"
    budget = autograd * BUDGET_PERCENT[solver] // 100
    constraints = read_constraints(write(tmp_path, f'keep "{pattern}"\n'))
    # the solver's own plan, before polish may keep them (NOTE: [Polish and repair] in solve/driver.py)
    planner = Planner(captured.graph, model=model_file.spec, device="cpu")
    unconstrained = first_fitting_unimproved(planner, budget, planner.chosen(solver))
    plan = make_plan(
        captured.graph, model=model_file.spec, device="cpu", budget=budget, solver=solver, constraints=constraints
    )
    assert not [t for t in recomputed_tensors(plan) if fnmatch.fnmatchcase(t, pattern)]
    if solver != "autograd":  # without the constraint these solvers do recompute them
        assert [t for t in recomputed_tensors(unconstrained) if fnmatch.fnmatchcase(t, pattern)]
    assert plan.constraints == constraints
    assert parse(print_plan(plan)) == plan


def test_keep_with_rotor_under_a_tight_budget_still_fits_and_trains(gpt2, tmp_path):
    model_file, captured, autograd = gpt2
    constraints = read_constraints(write(tmp_path, 'keep "transformer.h.3.*"\n'))
    plan = make_plan(
        captured.graph,
        model=model_file.spec,
        device="cpu",
        budget=autograd * 6 // 10,
        solver="rotor",
        constraints=constraints,
    )
    assert plan.header.peak_bytes <= autograd * 6 // 10
    assert not [t for t in recomputed_tensors(plan) if t.startswith("transformer.h.3.")]
    module = tmp_path / "fast.py"
    module.write_text(generate(verify(plan)))
    assert compare_training(model_file, load_generated(module), steps=2).identical


def test_recompute_and_offload_constraints(tiny, tmp_path):
    model_file, captured = tiny
    constraints = read_constraints(write(tmp_path, 'recompute "relu_1"\noffload "relu"\n'))
    plan = make_plan(
        captured.graph, model=model_file.spec, device="cpu", budget=10**6, solver="autograd", constraints=constraints
    )
    verbs = {(i.verb, i.target) for i in (*plan.forward, *plan.backward)}
    assert ("recompute", "relu_1") in verbs
    assert {("offload", "relu"), ("prefetch", "relu")} <= verbs
    assert "relu_1" not in simulate(plan).saved
    module = tmp_path / "fast.py"
    module.write_text(generate(verify(plan)))
    assert compare_training(model_file, load_generated(module), steps=3).identical


def test_conflicting_patterns_name_both_lines(tiny, tmp_path):
    model_file, captured = tiny
    path = write(tmp_path, '# comment\nkeep "relu*"\nrecompute "relu"\n')
    with pytest.raises(RematError) as error:
        make_plan(
            captured.graph, model="m", device="cpu", budget=10**6, solver="rotor", constraints=read_constraints(path)
        )
    message = error.value.format()
    assert f"{path}:2" in message and f"{path}:3" in message and "'relu'" in message


def test_constraints_over_budget_state_the_smallest_budget(tmp_path):
    path = write(tmp_path, 'keep "*"\nbudget 30 KiB\n')  # above the proven bound (27.03 KiB), below keep-all
    result = remat("plan", TINY, "--constraints", path, "--repeats", "1")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"{path}:1" in result.stderr and f"{path}:2" in result.stderr
    assert "the smallest budget that satisfies them is" in result.stderr
    assert result.stdout == ""


def test_bad_constraint_file_points_at_the_line(tmp_path):
    path = write(tmp_path, 'keep "fc1"\nkep "x"\n')
    with pytest.raises(PlanError) as error:
        read_constraints(path)
    assert error.value.format().startswith(f"{path}:2:1: error: unknown constraint `kep`")
    assert "did you mean `keep`" in error.value.format()


def test_from_old_plan_keeps_constraints_and_budget(tmp_path):
    first = tmp_path / "first.plan"
    path = write(tmp_path, 'keep "fc1*"\nbudget 40 KiB\n')
    assert remat("plan", TINY, "--constraints", path, "--repeats", "1", "-o", str(first)).returncode == 0
    again = remat("plan", TINY, "--from", str(first), "--repeats", "1")
    assert again.returncode == 0, again.stderr
    plan = parse(again.stdout)
    assert plan.header.budget == 40 * 1024
    assert [(c.kind, c.pattern, c.size) for c in plan.constraints] == [("keep", "fc1*", None), ("budget", None, 40960)]


def test_check_rejects_a_plan_that_breaks_its_own_keep(gpt2, tmp_path):
    model_file, captured, autograd = gpt2
    plan = make_plan(captured.graph, model=model_file.spec, device="cpu", budget=autograd * 7 // 10, solver="rotor")
    victim = next(i.target for i in plan.backward if i.verb == "recompute")
    text = print_plan(plan).replace("\nforward\n", f'\nconstraints\n  keep  "{victim}"\n\nforward\n', 1)
    path = tmp_path / "edited.plan"
    path.write_text(text)
    result = remat("check", str(path))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    line = next(n for n, l in enumerate(text.splitlines(), 1) if l.split()[:2] == ["recompute", victim])
    assert result.stderr.startswith(f"{path}:{line}:3: error: '{victim}' is recomputed, but the constraint `keep")


def test_removing_any_wait_is_rejected(gpt2, tmp_path):
    """Issue 11, part 2: every `wait` of a plan with offloads orders something; without
    it `remat check` rejects the plan at a line (a use, a delete or a prefetch while the
    transfer is in flight, or the step ending with it in flight)."""
    model_file, captured, autograd = gpt2
    constraints = read_constraints(write(tmp_path, 'offload "transformer.h.*.mlp.act*"\n'))
    plan = make_plan(
        captured.graph, model=model_file.spec, device="cpu", budget=autograd, solver="autograd", constraints=constraints
    )
    lines = print_plan(plan).splitlines(keepends=True)
    waits = [k for k, line in enumerate(lines) if line.split()[:1] == ["wait"]]
    assert len(waits) >= 8  # an offload and a prefetch for each of the 6 layers' activations, waited for
    for k in waits:
        edited = parse("".join(lines[:k] + lines[k + 1 :]))
        with pytest.raises(PlanError) as info:
            simulate(edited)
        assert info.value.span is not None, str(info.value)
