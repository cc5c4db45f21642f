"""The main job end to end on the three example models.

For each example and each budget (100%, 70%, 50% of the autograd peak and the smallest
budget rotor finds feasible): plan with rotor, round-trip the plan text, generate the
module in a fresh process (`remat codegen`), import it, run three SGD steps against the
eager model with dropout on, and compare losses, gradients, parameters and buffers with
torch.equal; then measure the generated module's peak on CPU and compare it with the
budget and the plan's prediction.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from remat_dsl.capture.measure import step_peak
from remat_dsl.capture.model_file import load_model_file
from remat_dsl.plan.parser import parse
from remat_dsl.capture.pipeline import capture_graph
from remat_dsl.plan.printer import print_plan
from remat_dsl.solve.driver import autograd_peak, make_plan, smallest_budget
from remat_dsl.codegen.compare import compare_training, load_generated
from test_profile_file import without_solve_time

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ["examples/gpt2.py", "examples/transformer.py", "examples/resnet.py"]
BUDGETS = ["100%", "70%", "50%", "min"]


@pytest.fixture(scope="module", params=EXAMPLES)
def example(request):
    model_file = load_model_file(str(ROOT / request.param))
    captured = capture_graph(model_file, repeats=1)
    peak = autograd_peak(captured.graph, captured.device)
    return model_file, captured, peak


def budget_of(label: str, captured, autograd: int) -> int:
    if label == "min":
        return smallest_budget(captured.graph, captured.device, "rotor")
    return autograd * int(label.rstrip("%")) // 100


def codegen_in_fresh_process(plan_text: str, tmp_path: Path) -> Path:
    plan_path, out = tmp_path / "model.plan", tmp_path / "fast_model.py"
    plan_path.write_text(plan_text)
    result = subprocess.run(
        [sys.executable, "-m", "remat_dsl", "codegen", str(plan_path), "-o", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    return out


def trained_peak(model_file, plan_text: str, tmp_path: Path, steps: int = 3) -> int:
    """Generate the plan's module in a fresh process, assert `steps` SGD steps equal eager
    (torch.equal on losses, gradients, parameters, buffers) and return its measured peak."""
    generated = load_generated(codegen_in_fresh_process(plan_text, tmp_path))
    comparison = compare_training(model_file, generated, steps=steps)
    assert comparison.identical, comparison.mismatched[:10]
    return step_peak(generated.FastModel(model_file.build_model()), model_file.sample_inputs())


@pytest.mark.parametrize("label", BUDGETS)
def test_rotor_plan_trains_identically_within_budget(example, label, tmp_path):
    model_file, captured, autograd = example
    budget = budget_of(label, captured, autograd)
    plan = make_plan(captured.graph, model=model_file.spec, device=captured.device, budget=budget, solver="rotor")
    text = print_plan(plan)
    assert parse(text) == plan
    assert print_plan(parse(text)) == text
    measured = trained_peak(model_file, text, tmp_path)
    assert measured <= budget
    assert abs(measured - plan.header.peak_bytes) <= 0.05 * plan.header.peak_bytes


def test_lower_budgets_recompute_more(example):
    model_file, captured, autograd = example
    plans = [
        make_plan(
            captured.graph,
            model=model_file.spec,
            device=captured.device,
            budget=budget_of(label, captured, autograd),
            solver="rotor",
        )
        for label in BUDGETS
    ]
    peaks = [p.header.peak_bytes for p in plans]
    recompute = [p.header.recompute_us for p in plans]
    assert plans[0].header.recompute_us == 0
    assert peaks[-1] < peaks[0]
    assert recompute[-1] > 0


def test_same_profile_gives_byte_identical_plan(example):
    model_file, captured, autograd = example
    for solver in ("rotor", "auto"):
        texts = {
            without_solve_time(
                print_plan(
                    make_plan(
                        captured.graph,
                        model=model_file.spec,
                        device=captured.device,
                        budget=autograd // 2,
                        solver=solver,
                    )
                )
            )
            for _ in range(2)
        }
        assert len(texts) == 1, solver  # the solver's wall time is the one line that may differ


def test_generated_module_imports_no_remat_dsl(example, tmp_path):
    model_file, captured, autograd = example
    plan = make_plan(captured.graph, model=model_file.spec, device=captured.device, budget=autograd, solver="autograd")
    module_path = codegen_in_fresh_process(print_plan(plan), tmp_path)
    probe = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('fast', {str(module_path)!r})\n"
        "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
        "assert hasattr(module, 'FastModel')\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('remat_dsl'))\n"
        "print(loaded); sys.exit(1 if loaded else 0)\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_generated_module_rejects_wrong_input_shapes(example, tmp_path):
    model_file, captured, autograd = example
    plan = make_plan(captured.graph, model=model_file.spec, device=captured.device, budget=autograd, solver="autograd")
    generated = load_generated(codegen_in_fresh_process(print_plan(plan), tmp_path))
    fast = generated.FastModel(model_file.build_model())
    inputs = list(model_file.sample_inputs().args)
    inputs[0] = inputs[0][:1]
    with pytest.raises(ValueError, match="plan again for these shapes"):
        fast(*inputs)


def test_checkpoint_sqrt_trains_identically(example, tmp_path):
    model_file, captured, autograd = example
    plan = make_plan(
        captured.graph, model=model_file.spec, device=captured.device, budget=autograd, solver="checkpoint-sqrt"
    )
    generated = load_generated(codegen_in_fresh_process(print_plan(plan), tmp_path))
    assert compare_training(model_file, generated, steps=2).identical


def test_chain_partition_covers_the_graph(example):
    from remat_dsl.solve.solvers.chain.partition import partition
    from remat_dsl.plan.ir import BACKWARD, FORWARD

    _, captured, _ = example
    graph = captured.graph
    part = partition(graph)
    forward = [op.name for op in graph.ops if op.phase == FORWARD]
    backward = sorted(op.name for op in graph.ops if op.phase == BACKWARD)
    assert sorted(part.prelude) + sorted(n for b in part.blocks for n in b.forward) == sorted(part.prelude) + sorted(
        n for n in forward if n not in part.prelude
    )
    assert [n for n in forward if n not in part.prelude] == [n for b in part.blocks for n in b.forward]
    assert sorted(n for b in part.blocks for n in b.backward) == backward
    assert len(part.blocks) == len(part.chain.blocks) >= 3


def test_names_do_not_shift_when_the_model_grows():
    from dataclasses import replace

    gpt2 = load_model_file(str(ROOT / "examples/gpt2.py"))
    names = []
    for layers in (2, 3):
        spec = replace(gpt2, spec=f"gpt2-{layers}", build=lambda n=layers: gpt2.module.build_model(n_layer=n))
        names.append({op.name for op in capture_graph(spec, repeats=1).graph.ops})
    small, large = names
    assert small <= large  # no op of the smaller model is renamed by adding a layer
    added = large - small
    assert sum(".h.2." in n for n in added) >= len(added) - 2
    assert "transformer.h.0.mlp.c_fc" in small and "transformer.h.1.attn.bwd.bmm" in small


# Statements of _forward/_backward that move values in and out rather than run an
# instruction: they name no plan line.
PLUMBING = re.compile(
    r"^\s*(.*= \(_tensors\[_k\] for _k in _where\)|_device = _tensors\[len\(INPUTS\)\]\.device|.*= _s\.saved|_[pb] ="
    r" _Tensors"
    r"|_tensors, _where, _p, _b = _s\.values|_sharded = _s\.sharded|_s\.(keep|saved|values|sharded|versions|layouts) = "
    r"|if not _s\.keep:|_check_versions\(|return _outputs|_pool = _HostBuffer|_pool\.release|.*# NOTE: \[Gradient"
    r" release\] \d+$"
    r"|_shards\(_sharded, \d+\)|yield from \(\)  # a generator)"
)


def test_plans_and_modules_are_reviewable(example, tmp_path):
    """No line of the canonical plan passes 120 characters; every statement of the generated
    module that runs an instruction names its plan line (recomputes marked), and every
    instruction of the plan is run by a statement that names it."""
    import ast

    from remat_dsl.plan.ir import VERBS

    model_file, captured, autograd = example
    plan = make_plan(
        captured.graph, model=model_file.spec, device=captured.device, budget=autograd // 2, solver="rotor"
    )
    text = print_plan(plan)
    plan_lines = text.split("\n")
    assert max(len(line) for line in plan_lines) <= 120, [line for line in plan_lines if len(line) > 120][:3]
    assert any(line.lstrip().startswith("# ") for line in plan_lines[: plan_lines.index("inputs")])  # decisions
    if "gpt2" in model_file.spec:  # a block that is a whole module is named by its path
        assert re.search(r"^  # transformer\.h\.\d\.(attn|mlp): (forward|checkpoint|backward)", text, re.M)
    module = codegen_in_fresh_process(text, tmp_path)
    source = module.read_text()
    lines = source.split("\n")
    schedule = range(plan_lines.index("forward") + 1, plan_lines.index("inputs") + 1)  # 1-based line numbers
    instructions = {n for n in schedule if plan_lines[n - 1].split()[:1] and plan_lines[n - 1].split()[0] in VERBS}
    named: set[int] = set()
    functions = [
        n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name in ("_forward", "_backward")
    ]
    assert len(functions) == 2
    for function in functions:
        for statement in function.body[1:]:  # after the docstring
            code = "\n".join(lines[statement.lineno - 1 : statement.end_lineno])
            found = re.search(r"# model\.plan:(\d+)(?:-(\d+))?(.*)$", code, re.M)
            if found is None:
                assert PLUMBING.match(code.replace("\n", " ")), code
                continue
            first, last = int(found[1]), int(found[2] or found[1])
            if found[3].strip() in ("(outputs)", "(gradients)", "(tangents)"):
                continue
            covered = {n for n in range(first, last + 1) if n in instructions}
            assert covered and covered == {
                n
                for n in range(first, last + 1)
                if plan_lines[n - 1].strip() and not plan_lines[n - 1].lstrip().startswith("#")
            }, code
            verbs = {plan_lines[n - 1].split()[0] for n in covered}
            assert ("recompute" in verbs) == ("(recompute)" in found[3]), code
            named |= covered
    assert named == instructions
