"""`remat plan` shows each stage with its elapsed seconds on stderr, and nothing else on
stdout (NOTE: [Progress] in remat_dsl/plan/progress.py; NOTE: [Stdout is the data])."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_stock_models import shell

from remat_dsl.capture.cost import load_device
from remat_dsl.capture.model_file import load_model_file
from remat_dsl.capture.pipeline import capture_graph
from remat_dsl.plan.progress import Progress
from remat_dsl.plan.parser import parse_file
from remat_dsl.workflow import solve_captured

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "tests/models/tiny_cnn.py"  # Rockmate solves its 7 block classes in about a second
PLAN = f"remat plan {MODEL} --solver rockmate --budget 80% --repeats 1"


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("REMAT_CACHE_DIR", str(tmp_path / "cache"))


def test_every_stage_shows_its_elapsed_seconds_and_the_plan_is_alone_on_stdout(tmp_path, cache):
    result = shell(f"{PLAN} > a.plan", tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stderr.splitlines()
    for stage in (
        rf"loading {MODEL}: \d+ s",
        rf"capturing {MODEL}: (\d+)/\1 ops, \d+ s",
        r"solved (\d+) of \1 block classes in \d+ s",
        r"planning: (\d+)/\1 block classes, \d+ s",
    ):
        assert any(re.fullmatch(stage, line) for line in lines), (stage, lines)
    assert lines.index(f"loading {MODEL} ...") < lines.index(f"capturing {MODEL} ...") < lines.index("planning ...")
    solving = [re.match(r"solving block class (\d+) of (\d+) \((\d+) done, \d+ s\): ", line) for line in lines]
    counts = [tuple(map(int, m.groups())) for m in solving if m]
    assert counts and all(done == k - 1 and k <= total for k, total, done in counts), counts
    # stdout held the plan alone: the same bytes as -o writes and as --quiet prints
    plan = (tmp_path / "a.plan").read_bytes()
    parse_file(str(tmp_path / "a.plan"))
    quiet = shell(f"{PLAN} --quiet > b.plan && {PLAN} -q -o c.plan", tmp_path)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    assert (tmp_path / "b.plan").read_bytes() == plan == (tmp_path / "c.plan").read_bytes()


def test_quiet_still_shows_errors(tmp_path, cache):
    result = shell(f"{PLAN.replace('80%', '1%')} --quiet > a.plan", tmp_path)
    assert result.returncode == 2 and "error: budget" in result.stderr and "hint:" in result.stderr
    assert "loading" not in result.stderr and (tmp_path / "a.plan").read_text() == ""


def test_a_solver_counts_its_block_classes_on_the_progress_it_reports_to(capfd):
    """The solve's `report` is the stage's Progress: Rockmate starts it with its block
    classes and advances it once per class solved (plain lines: stderr is not a terminal)."""
    # op times and temporaries predicted (the CPU device model), as `remat plan` plans: measured
    # temporaries differ between CPUs (oneDNN's kernels), and 80% is near rockmate's floor
    graph = capture_graph(load_model_file(str(MODEL)), repeats=1, device_model=load_device("cpu")).graph
    capfd.readouterr()
    with Progress("planning", unit="block classes") as progress:
        solve_captured(graph, 80.0, "rockmate", percent=True, report=progress)
    assert progress.total is not None and progress.done == progress.total > 0
    out, err = capfd.readouterr()
    assert out == ""
    last = err.splitlines()[-1]
    assert re.fullmatch(rf"planning: {progress.total}/{progress.total} block classes, \d+ s", last), last


def test_a_stage_without_a_count_ends_with_its_seconds(capfd):
    with Progress("loading model.py", unit=None):
        pass
    with Progress("quiet stage", unit=None, quiet=True) as quiet:
        quiet("a line nobody sees")
        quiet("warning: a line everyone sees")
    assert capfd.readouterr().err.splitlines() == [
        "loading model.py ...",
        "loading model.py: 0 s",
        "warning: a line everyone sees",
    ]


def test_a_stage_that_advances_nothing_still_shows_its_seconds(capfd, monkeypatch):
    """One block class of a solve can take minutes: a plain line comes every
    PLAIN_PROGRESS_SECONDS all the same, and no thread outlives the stage."""
    import threading
    import time

    from remat_dsl.plan import progress as reporter

    monkeypatch.setattr(reporter, "PLAIN_PROGRESS_SECONDS", 0.2)
    with Progress("planning", unit="block classes") as progress:
        progress.start(5)
        time.sleep(1.1)
    lines = capfd.readouterr().err.splitlines()
    ticks = [line for line in lines if re.fullmatch(r"planning: 0/5 block classes, \d+ s", line)]
    assert len(ticks) >= 3, lines
    assert not any(thread.name == "remat-progress" for thread in threading.enumerate())


def test_a_stage_names_its_phases_and_its_last_line_names_none(capfd, monkeypatch):
    """A new phase gets a plain line (here at once: PHASE_LINE_SECONDS 0) with the count so
    far; the stage's last line has its count and seconds alone."""
    from remat_dsl.plan import progress as reporter

    monkeypatch.setattr(reporter, "PHASE_LINE_SECONDS", 0.0)
    with Progress("planning", unit="block classes") as progress:
        progress.phase("partitioning the graph into blocks")
        progress.start(2)
        progress.phase("partitioning the graph into blocks")  # the same phase: no second line
        progress.advance(2)
        progress.phase("lowering and simulating")
    assert capfd.readouterr().err.splitlines() == [
        "planning ...",
        "planning: partitioning the graph into blocks, 0 s",
        "planning: lowering and simulating, 2/2 block classes, 0 s",
        "planning: 2/2 block classes, 0 s",
    ]


def test_the_capture_and_the_solve_name_their_phases(capfd, monkeypatch):
    """The capture says it traces, measures op costs and compares with eager PyTorch; the
    solve that it partitions, solves the blocks' ILPs, lowers and simulates."""
    from remat_dsl.plan import progress as reporter

    monkeypatch.setattr(reporter, "PHASE_LINE_SECONDS", 0.0)
    with Progress("capturing", quiet=False) as progress:
        graph = capture_graph(
            load_model_file(str(MODEL)), 1, progress, check_eager=True, device_model=load_device("cpu")
        ).graph
    with Progress("planning", unit="block classes") as progress:
        solve_captured(graph, 80.0, "rockmate", percent=True, report=progress)
    out, err = capfd.readouterr()
    assert out == ""
    named = re.compile(r"(?:capturing|planning): ([A-Za-z' .]+?), ")
    phases = [m.group(1) for m in map(named.match, err.splitlines()) if m]
    assert phases[:4] == [
        "building the model",
        "tracing the training step with torch.compile",
        "measuring op costs",
        "comparing the step with eager PyTorch",
    ], err
    solve = phases[4:]  # the store-all plan lowered and simulated first: does it fit already?
    partition, ilps = solve.index("partitioning the graph into blocks"), solve.index("solving the blocks' ILPs")
    assert partition + 1 == ilps and "lowering and simulating" in solve[ilps:], err


def test_plan_model_shows_the_stages_remat_plan_shows(capfd):
    """`remat_dsl.plan_model(..., progress=True)`, as a training script calls it, shows its
    stages on stderr as `remat plan` does, and plans the same; without it, nothing."""
    import remat_dsl

    plan = remat_dsl.plan_model(str(MODEL), budget="80%", solver="rockmate", repeats=1, progress=True)
    out, err = capfd.readouterr()
    lines = err.splitlines()
    assert out == "" and lines[0] == f"loading {MODEL} ...", lines
    for stage in (
        rf"loading {MODEL}: \d+ s",
        rf"capturing {MODEL}: (\d+)/\1 ops, \d+ s",
        r"planning: (\d+)/\1 block classes, \d+ s",
    ):
        assert any(re.fullmatch(stage, line) for line in lines), (stage, lines)
    assert any(line.startswith("solving block class 1 of ") for line in lines), lines
    silent = remat_dsl.plan_model(str(MODEL), budget="80%", solver="rockmate", repeats=1)
    assert capfd.readouterr() == ("", "")
    assert remat_dsl.plan_text(silent) == remat_dsl.plan_text(plan)


def test_plan_model_takes_report_or_progress_not_both():
    import remat_dsl

    with pytest.raises(remat_dsl.RematError, match="both `report` and progress=True"):
        remat_dsl.plan_model(str(MODEL), budget="80%", report=print, progress=True)
