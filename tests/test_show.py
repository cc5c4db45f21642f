"""`remat show`: the memory timeline as a PNG and as a terminal chart, and its agreement with simulate()."""

from __future__ import annotations

import collections
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from remat_dsl.cli.console import write_atomically
from remat_dsl.review import show
from remat_dsl.plan.errors import RematError
from remat_dsl.plan.parser import parse_file
from remat_dsl.check.replay import simulate
from remat_dsl.check.verify import VerifiedPlan
from remat_dsl.plan.units import human_bytes as format_bytes

ROOT = Path(__file__).resolve().parent.parent
OFFLOAD_PLAN = ROOT / "tests" / "plans" / "tiny_mlp_offload.plan"
EXAMPLES = ("gpt2", "transformer", "resnet")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module", params=EXAMPLES)
def example_plan(request):
    """A rotor plan at 50% of the autograd peak for one example (captured once per module)."""
    from remat_dsl.capture.model_file import load_model_file
    from remat_dsl.capture.pipeline import capture_graph
    from remat_dsl.solve.driver import autograd_peak, make_plan

    spec = f"examples/{request.param}.py"
    captured = capture_graph(load_model_file(str(ROOT / spec)), repeats=1)
    budget = autograd_peak(captured.graph, captured.device) // 2
    plan = make_plan(captured.graph, model=spec, device=captured.device, budget=budget, solver="rotor")
    return plan, simulate(plan)


@pytest.fixture(scope="module")
def offload_plan():
    plan = parse_file(str(OFFLOAD_PLAN))
    return plan, simulate(plan)


def check_png(path: Path) -> None:
    import matplotlib.image

    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 10_000
    image = matplotlib.image.imread(str(path))
    height, width = image.shape[:2]
    assert 400 <= height <= 2000 and 800 <= width <= 3000, image.shape
    assert image.std() > 0.05  # not a blank canvas
    leftovers = [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == [], "the atomic write left its temporary file behind"


def assert_agrees_with_simulate(plan, sim) -> None:
    timeline = show.category_timeline(VerifiedPlan(plan, sim))
    assert len(timeline.steps) == len(sim.timeline)
    for mine, step in zip(timeline.steps, sim.timeline):
        assert (mine.section, mine.index, mine.instruction) == (step.section, step.index, step.instruction)
        assert sum(mine.before) == step.mem_before, f"{step.section}:{step.index}"
        assert sum(mine.peak) == step.mem_peak, f"{step.section}:{step.index}"
        assert sum(mine.after) == step.mem_after, f"{step.section}:{step.index}"
        assert min(mine.before + mine.peak + mine.after) >= 0
    peak_step = next(s for s in sim.timeline if s.live)
    assert collections.Counter((name, n) for name, n, _ in timeline.peak_live) == collections.Counter(peak_step.live)
    assert sum(n for _, n, _ in timeline.peak_live) == sim.peak_bytes


# --- agreement with the simulator --------------------------------------------


def test_categories_agree_with_simulate_on_every_example(example_plan):
    assert_agrees_with_simulate(*example_plan)


def test_categories_agree_with_simulate_on_the_offload_plan(offload_plan):
    assert_agrees_with_simulate(*offload_plan)


@pytest.mark.parametrize("share, device, verb", [(0.92, "cpu", "host_update"), (1.2, "rtx3060", "prefetch_states")])
def test_categories_agree_with_simulate_on_whole_step_plans(share, device, verb):
    """A plan with the optimizer holds parameters and states before its first instruction;
    host updates and paged states add and free them during the step: they count in their
    own category, and the totals are the simulation's."""
    from remat_dsl.capture.model_file import load_model_file
    from remat_dsl.workflow import plan_model

    model_file = load_model_file(str(ROOT / "tests" / "models" / "tiny_mlp.py"))
    model, inputs = model_file.build(), model_file.inputs()
    held = 4 * sum(p.numel() * p.element_size() for p in model.parameters())  # AdamW: params, grads, 2 states
    plan = plan_model(model, inputs, int(share * held), optimizer="adamw", device=device)
    assert verb in {i.verb for i in plan.backward}
    sim = simulate(plan)
    assert_agrees_with_simulate(plan, sim)
    first = show.category_timeline(VerifiedPlan(plan, sim)).steps[0]
    assert first.before[show.CATEGORIES.index(show.PARAMETERS)] == sim.timeline[0].mem_before > 0


def test_a_drifted_simulation_is_detected(offload_plan):
    plan, sim = offload_plan
    steps = list(sim.timeline)
    steps[3] = dataclasses.replace(steps[3], mem_peak=steps[3].mem_peak + 1)
    with pytest.raises(AssertionError, match="disagrees with simulate"):
        show.category_timeline(VerifiedPlan(plan, dataclasses.replace(sim, timeline=tuple(steps))))


def test_tensor_categories_of_the_tiny_mlp(offload_plan):
    plan, sim = offload_plan
    categories = show.tensor_categories(plan.graph)
    assert categories["relu"] == show.SAVED  # read by the ReLU's backward
    assert categories["fc1"] == show.FORWARD_TEMPS  # deleted in the forward section
    assert categories["head"] == show.OUTPUTS
    assert "grad_output.0" not in categories  # the caller's memory (NOTE: [Gradient zeros])
    assert categories["head.bwd.mm"] == show.GRADIENTS
    timeline = show.category_timeline(VerifiedPlan(plan, sim))
    prefetch = next(s for s in timeline.steps if s.instruction.verb == "prefetch")
    saved = show.CATEGORIES.index(show.SAVED)
    assert prefetch.after[saved] - prefetch.before[saved] == 4096  # relu comes back


# --- the PNG -------------------------------------------------------------------


def test_png_for_each_example(example_plan, tmp_path):
    plan, sim = example_plan
    path = tmp_path / "timeline.png"
    write_atomically(path, show.draw_png(VerifiedPlan(plan, sim)))
    check_png(path)


def test_png_for_the_offload_plan(offload_plan, tmp_path):
    path = tmp_path / "timeline.png"
    path.write_bytes(b"old")
    write_atomically(str(path), show.draw_png(VerifiedPlan(*offload_plan)))
    check_png(path)


def test_png_into_a_missing_directory_is_a_user_error(offload_plan, tmp_path):
    with pytest.raises(RematError, match="does not exist"):
        write_atomically(tmp_path / "missing" / "timeline.png", show.draw_png(VerifiedPlan(*offload_plan)))
    assert list(tmp_path.iterdir()) == []


# --- the terminal view -----------------------------------------------------------


def test_terminal_view_shows_peak_and_budget(example_plan):
    plan, sim = example_plan
    text = show.terminal_view(VerifiedPlan(plan, sim))
    assert f"peak {format_bytes(sim.peak_bytes)}" in text
    assert f"budget {format_bytes(plan.header.budget)}" in text
    assert sim.peak_at in text
    assert "largest live tensors at the peak" in text
    assert "▼" in text and "┈" in text  # the peak column and the budget line
    chart = [line for line in text.splitlines() if "│" in line and "┃" not in line]
    assert all(len(line.split("│", 1)[1].split("  ┈ budget")[0]) == 60 for line in chart[:8])


def test_terminal_view_of_the_offload_plan(offload_plan):
    plan, sim = offload_plan
    text = show.terminal_view(VerifiedPlan(plan, sim))
    assert f"peak {format_bytes(sim.peak_bytes)}" in text
    assert f"budget {format_bytes(plan.header.budget)}" in text
    marks = next(line for line in text.splitlines() if "r recompute" in line)
    assert "t" in marks.split("r recompute")[0]  # the offload and the prefetch
    assert "fc2.bwd.mm_1" in text  # the largest live tensors table
    assert "grad_output.0" not in text  # the caller's memory (NOTE: [Gradient zeros])


# --- the command ------------------------------------------------------------------


def remat(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "remat_dsl", *args], capture_output=True, text=True, cwd=ROOT)


def test_show_command(tmp_path):
    result = remat("show", str(OFFLOAD_PLAN))
    assert result.returncode == 0, result.stderr
    assert "peak 31.79 KiB" in result.stdout and "budget 36.29 KiB" in result.stdout
    out = tmp_path / "t.png"
    result = remat("show", str(OFFLOAD_PLAN), "--png", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    check_png(out)


def test_show_command_rejects_an_invalid_plan(tmp_path):
    text = OFFLOAD_PLAN.read_text().replace("  wait      relu\n", "")
    bad = tmp_path / "bad.plan"
    bad.write_text(text)
    result = remat("show", str(bad), "--png", str(tmp_path / "t.png"))
    assert result.returncode == 2
    assert "error" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "t.png").exists()


def test_views_of_a_plan_above_its_budget(offload_plan, tmp_path):
    plan, sim = offload_plan
    tight = dataclasses.replace(plan, header=dataclasses.replace(plan.header, budget=sim.peak_bytes // 2))
    text = show.terminal_view(VerifiedPlan(tight, sim))
    assert "200.0% of budget" in text
    budget_line = next(line for line in text.splitlines() if "┈ budget" in line)
    assert "█" in budget_line  # the bars cross the budget line
    write_atomically(tmp_path / "tight.png", show.draw_png(VerifiedPlan(tight, sim)))
    check_png(tmp_path / "tight.png")
