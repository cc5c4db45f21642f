"""The `remat` command as a user runs it: check, codegen, errors, a hand-written offload plan."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from remat_dsl.capture.model_file import load_model_file
from remat_dsl.plan.parser import parse_file
from remat_dsl.plan.printer import print_plan
from remat_dsl.check.replay import simulate
from remat_dsl.codegen.compare import compare_training, load_generated

ROOT = Path(__file__).resolve().parent.parent
PLANS = ROOT / "tests" / "plans"
TINY = str(ROOT / "tests" / "models" / "tiny_mlp.py")


def remat(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "remat_dsl", *args], capture_output=True, text=True, cwd=cwd)


def without(text: str, verbs: tuple[str, ...]) -> str:
    return "\n".join(line for line in text.split("\n") if not line.strip().startswith(verbs)) + ""


# --- the hand-written offload plan -------------------------------------------


def test_hand_written_offload_plan_passes_check():
    result = remat("check", str(PLANS / "tiny_mlp_offload.plan"))
    assert result.returncode == 0, result.stderr
    assert "valid plan" in result.stdout
    assert "out of date" not in result.stdout


def test_offload_lowers_the_predicted_peak():
    with_offload = parse_file(str(PLANS / "tiny_mlp_offload.plan"))
    plain = parse_file(str(PLANS / "tiny_mlp_autograd.plan"))
    assert simulate(with_offload).peak_bytes < simulate(plain).peak_bytes
    assert simulate(with_offload).host_peak_bytes == 4096


def test_offload_plan_module_gives_identical_gradients(tmp_path):
    out = tmp_path / "fast_tiny.py"
    result = remat("codegen", str(PLANS / "tiny_mlp_offload.plan"), "-o", str(out))
    assert result.returncode == 0, result.stderr
    source = out.read_text()
    assert "_offload(relu, _pool, (0, 0))" in source and "_prefetch(host_relu, event_relu, _device)" in source
    comparison = compare_training(load_model_file(TINY), load_generated(out), steps=3)
    assert comparison.identical, comparison.mismatched


def test_plans_in_tests_are_canonical():
    for path in PLANS.glob("tiny_mlp_*.plan"):
        text = path.read_text()
        assert print_plan(parse_file(str(path))) == text, path.name


# --- user errors: file:line:col, a fix, exit 2, no traceback, no output file -


def broken_plans(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    text = (PLANS / "tiny_mlp_autograd.plan").read_text()
    lines = text.split("\n")
    use_after_delete = list(lines)
    # delete relu right after computing drop: the ReLU backward still needs it
    at = lines.index("  compute  drop")
    use_after_delete.insert(at + 1, "  delete   relu")
    syntax = [
        line.replace("  compute  fc2", "  compute  fc2  compute") if line == "  compute  fc2" else line
        for line in lines
    ]
    cases = {
        "use_after_delete": ("\n".join(use_after_delete), "deleted"),
        "syntax": ("\n".join(syntax), "error"),
    }
    written = {}
    for name, (body, needle) in cases.items():
        path = tmp_path / f"{name}.plan"
        path.write_text(body)
        written[name] = (path, needle)
    return written


@pytest.mark.parametrize("case", ["use_after_delete", "syntax"])
def test_check_reports_location_and_fix(tmp_path, case):
    path, needle = broken_plans(tmp_path)[case]
    result = remat("check", str(path))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    first = result.stderr.splitlines()[0]
    assert first.startswith(f"{path}:"), first
    line, col = first[len(str(path)) + 1 :].split(":")[:2]
    assert line.isdigit() and col.isdigit()
    assert needle in result.stderr
    assert "hint:" in result.stderr
    assert "^" in result.stderr


@pytest.mark.parametrize("case", ["use_after_delete", "syntax"])
def test_codegen_of_invalid_plan_writes_nothing(tmp_path, case):
    path, _ = broken_plans(tmp_path)[case]
    out = tmp_path / "out.py"
    result = remat("codegen", str(path), "-o", str(out))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert not out.exists()
    assert not list(tmp_path.glob(".out.py*"))


def test_use_after_delete_points_at_the_user(tmp_path):
    path, _ = broken_plans(tmp_path)["use_after_delete"]
    result = remat("check", str(path))
    lines = path.read_text().split("\n")
    line = int(result.stderr.splitlines()[0].split(":")[1])
    assert "drop.bwd.threshold_backward" in lines[line - 1]


def test_model_file_that_fails_to_import(tmp_path):
    bad = tmp_path / "bad_model.py"
    bad.write_text("import torch\n\nraise RuntimeError('boom')\n")
    result = remat("plan", str(bad), "--budget", "50%")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert f"{bad}:3:1: error: the model file failed to import: RuntimeError: boom" in result.stderr


def test_infeasible_budget_states_the_smallest(tmp_path):
    result = remat("plan", TINY, "--budget", "30000B", "--repeats", "1")  # above the proven bound (27,680 B)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "smallest feasible budget is" in result.stderr
    assert result.stdout == ""
    found = re.search(
        r"is (\S+ \S+) \((\d+) B\) for this solver; proven bound: no plan that keeps its tensors on the device peaks"
        r" below \S+ \S+ \((\d+) B\) \(",
        result.stderr,
    )
    assert found and 0 < int(found[3]) <= int(found[2]), result.stderr


def test_bad_budget_text():
    result = remat("plan", TINY, "--budget", "lots", "--repeats", "1")
    assert result.returncode == 2
    assert "cannot read budget 'lots'" in result.stderr


def test_plan_prints_plan_on_stdout_and_progress_on_stderr(tmp_path):
    result = remat("plan", TINY, "--budget", "100%", "--repeats", "1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("remat-plan 2")
    assert "solving with auto" in result.stderr
    assert 'solver      "auto: checkmate' in result.stdout  # the tiny MLP has 17 ops
    plan_path = tmp_path / "tiny.plan"
    plan_path.write_text(result.stdout)
    assert remat("check", str(plan_path)).returncode == 0


def test_the_program_ends_as_python_would_for_what_outlives_the_command(tmp_path):
    """NOTE: [Exit]: the `remat` program skips the interpreter's teardown, but still runs
    the atexit functions and waits for the threads a model file started."""
    model = tmp_path / "model_with_exit_work.py"
    model.write_text(
        Path(TINY).read_text()
        + "\n\nimport atexit, threading, time\n"
        + f"atexit.register(lambda: open({str(tmp_path / 'atexit.done')!r}, 'w').close())\n"
        + "def after_main():  # a thread that outlives the command: it works once the main thread has ended\n"
        + f"    threading.main_thread().join()\n    time.sleep(0.5)\n    open({str(tmp_path / 'thread.done')!r},"
        " 'w').close()\n"
        + "threading.Thread(target=after_main).start()\n"
    )
    result = subprocess.run(
        f"'{Path(sys.executable).with_name('remat')}' plan {model.name} --budget 100% --repeats 1 > m.plan",
        shell=True, cwd=tmp_path, capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "atexit.done").exists()
    assert (tmp_path / "thread.done").exists()
    assert parse_file(str(tmp_path / "m.plan")).graph.ops


def test_check_against_the_model_named_in_the_header():
    result = remat("check", str(PLANS / "tiny_mlp_offload.plan"), "--model")
    assert result.returncode == 0, result.stderr


def test_check_against_another_model(tmp_path):
    plan = str(PLANS / "tiny_mlp_offload.plan")
    result = remat("check", plan, "--model", str(ROOT / "examples" / "resnet.py"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    line = _line_of(PLANS / "tiny_mlp_offload.plan", "  x  float32[16, 32]")
    assert result.stderr.startswith(f"{plan}:{line}:3: error: the plan was made for input 'x' float32[16, 32], but ")
    assert "gives float32[8, 3, 32, 32]" in result.stderr and "hint: plan again for this model" in result.stderr


def test_check_against_other_input_shapes(tmp_path):
    from dataclasses import replace

    plan = parse_file(PLANS / "tiny_mlp_offload.plan")
    inputs = (replace(plan.graph.inputs[0], shape=(8, 32)),)
    path = tmp_path / "shapes.plan"
    path.write_text(print_plan(replace(plan, graph=replace(plan.graph, inputs=inputs))))  # sealed for these shapes
    result = remat("check", str(path), "--model", TINY)
    assert result.returncode == 2
    line = _line_of(path, "  x  float32[8, 32]")
    assert f"{path}:{line}:3: error: the plan was made for input 'x' float32[8, 32], but" in result.stderr


def _line_of(path: Path, line: str) -> int:
    """The 1-based number of the line of `path` that is exactly `line`."""
    return path.read_text().split("\n").index(line) + 1


# --- solver status: gap, solve time, --time-limit -------------------------------


def test_check_shows_status_gap_and_solve_time(tmp_path):
    from dataclasses import replace

    plan = parse_file(PLANS / "tiny_mlp_offload.plan")
    path = tmp_path / "milp.plan"
    path.write_text(
        print_plan(replace(plan, header=replace(plan.header, status="feasible", gap=0.0123, solve_seconds=2.4)))
    )
    result = remat("check", str(path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith("\nstatus feasible, gap 1.23%, solve time 2.4 s\n")
    plain = remat("check", str(PLANS / "tiny_mlp_offload.plan"))
    assert plain.returncode == 0 and "\nstatus " not in plain.stdout and "gap" not in plain.stdout


@pytest.mark.parametrize(
    "value, message",
    [
        ("-1", "expected a number of seconds > 0, got '-1'"),
        ("0", "expected a number of seconds > 0, got '0'"),
        ("abc", "expected a number of seconds, e.g. 60 or 2.5, got 'abc'"),
        ("nan", "expected a number of seconds > 0, got 'nan'"),
        ("inf", "expected a number of seconds > 0, got 'inf'"),
    ],
)
def test_bad_time_limit_exits_2(value, message):
    result = remat("plan", TINY, "--budget", "100%", f"--time-limit={value}")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert f"remat plan: error: argument --time-limit: {message}" in result.stderr
    assert result.stdout == ""


def test_time_limit_goes_to_the_planner(tmp_path, monkeypatch, capsys):
    from remat_dsl import cli
    from remat_dsl.solve.driver import Planner

    seen = []
    real = Planner.__init__

    def spy(self, *args, **kwargs):
        seen.append(kwargs.get("time_limit", "missing"))
        real(self, *args, **kwargs)

    monkeypatch.setattr(Planner, "__init__", spy)
    out = tmp_path / "tiny.plan"
    assert cli.main(["plan", TINY, "--budget", "100%", "--repeats", "1", "--time-limit", "2.5", "-o", str(out)]) == 0
    assert cli.main(["plan", TINY, "--budget", "100%", "--repeats", "1", "-o", str(out)]) == 0
    assert seen == [2.5, None]
    err = capsys.readouterr().err
    assert "time limit 2.5 s" in err and "; status optimal" in err
    assert parse_file(out).header.status == "optimal"


def test_plan_help_mentions_time_limit():
    result = remat("plan", "--help")
    assert "--time-limit SECONDS" in result.stdout
