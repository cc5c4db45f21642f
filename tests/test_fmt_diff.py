"""Reviewing plans: `remat fmt`, `remat diff`, and the git diff driver / textconv of README.md."""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from remat_dsl.plan import ir
from remat_dsl.cli import fmt as cli_fmt
from remat_dsl.review import diff
from remat_dsl.plan.errors import PlanError, RematError
from remat_dsl.plan.parser import parse_file
from remat_dsl.plan.printer import print_plan

ROOT = Path(__file__).resolve().parent.parent
PLANS = ROOT / "tests" / "plans"
AUTOGRAD = PLANS / "tiny_mlp_autograd.plan"
OFFLOAD = PLANS / "tiny_mlp_offload.plan"
TINY = str(ROOT / "tests" / "models" / "tiny_mlp.py")


def run(*argv: str) -> int:
    """Run a subcommand in this process, as `remat` does (output to sys.stdout at the end)."""
    from remat_dsl.cli import main

    return main(list(argv))


def remat(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "remat_dsl", *args], capture_output=True, text=True, cwd=cwd)


def messy(text: str) -> str:
    """The same plan, laid out badly: odd spacing, extra blank lines, moved comment indentation."""
    text = text.replace("  offload  relu    on d2h", "      offload relu on   d2h  ")
    text = text.replace("  x  float32[16, 32]", "    x   float32[ 16 ,32 ]")
    text = text.replace("\nforward\n", "\n\n\nforward\n\n")
    return text.replace("  # relu is saved", "      # relu is saved")


# --- fmt -------------------------------------------------------------------------


def test_fmt_check_passes_on_the_test_plans():
    result = remat("fmt", "--check", *sorted(str(p) for p in PLANS.glob("*.plan")))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == ""


def test_fmt_rewrites_canonically_keeps_comments_and_is_idempotent(tmp_path, capsys):
    canonical = OFFLOAD.read_text()
    path = tmp_path / "edited.plan"
    path.write_text(messy(canonical))
    assert path.read_text() != canonical

    assert run("fmt", str(path)) == 0
    assert path.read_text() == canonical
    assert "# relu is saved for the backward of the first ReLU" in path.read_text()
    assert "# tests/models/tiny_mlp.py planned with" in path.read_text()
    assert f"rewrote {path} in place" in capsys.readouterr().err

    assert run("fmt", str(path)) == 0
    assert path.read_text() == canonical
    assert "rewrote" not in capsys.readouterr().err
    assert run("fmt", "--check", str(path)) == 0


def test_fmt_check_lists_files_that_would_change_and_changes_nothing(tmp_path, capsys):
    bad = tmp_path / "bad.plan"
    good = tmp_path / "good.plan"
    bad.write_text(messy(OFFLOAD.read_text()))
    good.write_text(AUTOGRAD.read_text())
    before = bad.read_text()
    assert run("fmt", "--check", str(bad), str(good)) == cli_fmt.EXIT_WOULD_CHANGE
    out = capsys.readouterr()
    assert out.out.splitlines() == [str(bad)]
    assert "1 of 2 plan file(s) would be rewritten" in out.err
    assert bad.read_text() == before


def test_fmt_of_an_invalid_plan_is_exit_2_and_changes_no_file(tmp_path):
    messy_path = tmp_path / "a.plan"
    broken = tmp_path / "b.plan"
    messy_path.write_text(messy(OFFLOAD.read_text()))
    broken.write_text(AUTOGRAD.read_text().replace("  compute  relu\n", "  compute  relu on d2h\n"))
    before = messy_path.read_text()
    result = remat("fmt", str(messy_path), str(broken))
    assert result.returncode == 2
    assert re.search(rf"{re.escape(str(broken))}:\d+:\d+: error: ", result.stderr), result.stderr
    assert "Traceback" not in result.stderr
    assert messy_path.read_text() == before


def test_fmt_of_a_missing_file_is_exit_2(tmp_path):
    result = remat("fmt", str(tmp_path / "nope.plan"))
    assert result.returncode == 2
    assert "nope.plan: error: cannot read the plan" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.fixture(scope="module")
def tool_plans(tmp_path_factory) -> list[Path]:
    """Plans written by the tools for the tiny MLP: every solver in-process, rotor through `remat plan -o`."""
    from remat_dsl.capture.model_file import load_model_file
    from remat_dsl.capture.pipeline import capture_graph
    from remat_dsl.solve.driver import autograd_peak, make_plan

    out = tmp_path_factory.mktemp("tool_plans")
    captured = capture_graph(load_model_file(TINY), 1)
    budget = autograd_peak(captured.graph, captured.device)
    paths = []
    for solver in ("autograd", "checkpoint-sqrt", "rotor"):
        plan = make_plan(captured.graph, model=TINY, device=captured.device, budget=2 * budget, solver=solver)
        paths.append(out / f"{solver}.plan")
        paths[-1].write_text(print_plan(plan))
    cli_plan = out / "cli.plan"
    result = remat("plan", TINY, "--budget", "100%", "--repeats", "1", "-o", str(cli_plan))
    assert result.returncode == 0, result.stderr
    return paths + [cli_plan]


def with_solver_status(path: Path, out: Path, **changes) -> Path:
    """A copy of the plan at `path` with header fields changed (status, gap, solve_seconds), canonical."""
    plan = parse_file(path)
    out.write_text(print_plan(dataclasses.replace(plan, header=dataclasses.replace(plan.header, **changes))))
    return out


def test_fmt_check_on_a_plan_with_gap_and_solve_time(tmp_path, capsys):
    path = with_solver_status(OFFLOAD, tmp_path / "milp.plan", status="feasible", gap=0.0123, solve_seconds=2.4)
    canonical = path.read_text()
    assert "\n  status      feasible\n  gap         1.23%\n  solve-time  2.4 s\n  peak  " in canonical
    assert run("fmt", "--check", str(path)) == 0
    assert capsys.readouterr().out == ""
    path.write_text(
        messy(canonical)
        .replace("  gap         1.23%\n", "  gap 1.2300 %\n")
        .replace("  solve-time  2.4 s\n", "  solve-time 2.4s\n")
    )
    assert run("fmt", "--check", str(path)) == cli_fmt.EXIT_WOULD_CHANGE
    assert capsys.readouterr().out.splitlines() == [str(path)]
    assert run("fmt", str(path)) == 0
    assert path.read_text() == canonical
    result = remat("fmt", "--check", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_fmt_check_passes_on_plans_the_tools_write(tool_plans):
    result = remat("fmt", "--check", *map(str, tool_plans))
    assert result.returncode == 0, result.stdout + result.stderr


# --- diff: the semantic summary ----------------------------------------------------


def test_diff_of_the_sample_pair_reports_relu_offloaded_and_the_peak_change(capsys):
    assert run("diff", str(AUTOGRAD), str(OFFLOAD)) == 0
    out = capsys.readouterr().out
    summary, _, line_diff = out.partition("\n--- ")
    assert re.search(r"^  budget\s+36.29 KiB \(37164 B\)\s+36.29 KiB \(37164 B\)\s+\(unchanged\)$", summary, re.M)
    assert re.search(
        r"^  predicted peak\s+35.79 KiB \(36652 B\) at backward:12\s+31.79 KiB \(32556 B\) at backward:12\s+\(-4096 B,"
        r" -11.2%\)$",
        summary,
        re.M,
    )
    assert re.search(r"^  predicted time\s+0.139 ms\s+0.140 ms\s+\(\+0.001 ms", summary, re.M)
    assert "tensors with a new policy: 1\n    relu  kept -> offloaded\n" in summary
    assert "operations: 5 added, 0 removed, 0 moved" in summary
    for where, verb in (
        ("forward:5", "offload"),
        ("forward:10", "wait"),
        ("forward:11", "delete"),
        ("backward:15", "prefetch"),
        ("backward:16", "wait"),
    ):
        assert re.search(rf"^    \+  {where}\s+{verb}\s+relu$", summary, re.M), (where, verb)
    assert line_diff.startswith(f"{AUTOGRAD}\n+++ {OFFLOAD}\n@@ ")
    assert "\n+  offload  relu\n" in line_diff
    assert "\x1b" not in out


def test_diff_summary_shows_the_status_change_of_the_sample_pair(capsys):
    assert run("diff", str(AUTOGRAD), str(OFFLOAD)) == 0
    summary = capsys.readouterr().out.partition("\n--- ")[0]
    assert re.search(r"^  status\s+baseline\s+hand-written\s+\(changed\)$", summary, re.M)
    assert "  gap " not in summary and "solve time" not in summary  # neither plan has one


def test_diff_summary_shows_status_and_gap_changes(tmp_path, capsys):
    old = with_solver_status(OFFLOAD, tmp_path / "old.plan", status="optimal", gap=0.0, solve_seconds=12.5)
    new = with_solver_status(OFFLOAD, tmp_path / "new.plan", status="feasible", gap=0.0123, solve_seconds=60.0)
    assert run("diff", "--exit-code", str(old), str(new)) == 1
    out = capsys.readouterr().out
    summary, _, line_diff = out.partition("\n--- ")
    assert re.search(r"^  status\s+optimal\s+feasible\s+\(changed\)$", summary, re.M)
    assert re.search(r"^  gap\s+0.00%\s+1.23%\s+\(\+1.23 points\)$", summary, re.M)
    assert re.search(r"^  predicted peak\s+.*\(unchanged\)$", summary, re.M)
    assert [line for line in summary.splitlines() if "solve time" in line] == [
        "  note: solve time 12.5 s -> 60.0 s (how long the solver ran, not a change of the plan; not in the line diff)"
    ]
    assert "operations: 0 added, 0 removed, 0 moved" in summary
    assert (
        "\n-  status      optimal\n-  gap         0.00%\n+  status      feasible\n+  gap         1.23%\n" in line_diff
    )
    assert "solve-time" not in line_diff

    hand = with_solver_status(OFFLOAD, tmp_path / "hand.plan")  # no gap, no solve time
    assert run("diff", str(hand), str(new)) == 0
    summary = capsys.readouterr().out.partition("\n--- ")[0]
    assert re.search(r"^  status\s+hand-written\s+feasible\s+\(changed\)$", summary, re.M)
    assert re.search(r"^  gap\s+\(none\)\s+1.23%\s+\(changed\)$", summary, re.M)
    assert "  note: solve time (unknown) -> 60.0 s " in summary


def test_a_solve_time_change_alone_is_not_a_change(tmp_path, capsys):
    old = with_solver_status(OFFLOAD, tmp_path / "old.plan", status="optimal", gap=0.0, solve_seconds=1.2)
    new = with_solver_status(OFFLOAD, tmp_path / "new.plan", status="optimal", gap=0.0, solve_seconds=3.0)
    assert old.read_text() != new.read_text()
    assert run("diff", "--exit-code", str(old), str(new)) == 0
    out = capsys.readouterr().out
    assert re.search(r"^  status\s+optimal\s+optimal\s+\(unchanged\)$", out, re.M)
    assert re.search(r"^  gap\s+0.00%\s+0.00%\s+\(unchanged\)$", out, re.M)
    assert [line for line in out.splitlines() if "solve time" in line] == [
        "  note: solve time 1.2 s -> 3.0 s (how long the solver ran, not a change of the plan; not in the line diff)",
        "(the canonical texts are identical but for the solve time)",
    ]
    assert "tensors with a new policy: 0" in out and "operations: 0 added, 0 removed, 0 moved" in out
    assert "\n--- " not in out
    assert run("diff", "--exit-code", str(old), str(old)) == 0
    assert "solve time" not in capsys.readouterr().out  # equal solve times: no note


def test_diff_ignores_layout_and_reports_identical_plans(tmp_path, capsys):
    edited = tmp_path / "edited.plan"
    edited.write_text(messy(OFFLOAD.read_text()))
    assert run("diff", "--exit-code", str(OFFLOAD), str(edited)) == 0
    out = capsys.readouterr().out
    assert "tensors with a new policy: 0" in out
    assert "operations: 0 added, 0 removed, 0 moved" in out
    assert out.endswith("(the canonical texts are identical)\n")
    assert run("diff", "--exit-code", str(AUTOGRAD), str(OFFLOAD)) == 1


def test_moved_and_removed_operations():
    plan = parse_file(AUTOGRAD)
    fwd = list(plan.forward)  # compute fc1, compute relu, delete fc1, compute drop, ...
    fwd[2], fwd[3] = fwd[3], fwd[2]
    del fwd[-1]
    changes = diff.operation_changes(plan, dataclasses.replace(plan, forward=tuple(fwd)))
    last = plan.forward[-1]
    assert [(c.verb, c.target, c.old_pos) for c in changes if c.kind == "-"] == [
        (last.verb, last.target, len(plan.forward))
    ]
    moved = [c for c in changes if c.kind == "~"]
    assert len(moved) == 1 and moved[0].section == ir.FORWARD
    assert {moved[0].old_pos, moved[0].new_pos} == {3, 4}


def test_recomputed_policy_and_a_plan_that_does_not_simulate():
    plan = parse_file(AUTOGRAD)
    recompute = ir.Instruction("recompute", "relu", ir.COMPUTE_STREAM)
    changed = dataclasses.replace(plan, backward=(recompute,) + plan.backward)
    assert diff.policies(changed)["relu"] == diff.RECOMPUTED
    assert diff.policy_changes(plan, changed) == [("relu", "kept", "recomputed")]
    old, new = diff.Side("a", print_plan(plan), plan), diff.Side("b", print_plan(changed), changed)
    summary = "\n".join(diff.summary_lines(old, new))
    assert "relu  kept -> recomputed" in summary
    assert re.search(r"^    \+  backward:1\s+recompute\s+relu$", summary, re.M)
    assert "note: b does not simulate, figures from its header" in summary  # relu is still resident


def test_diff_of_an_invalid_plan_is_exit_2_without_traceback(tmp_path):
    broken = tmp_path / "broken.plan"
    broken.write_text(AUTOGRAD.read_text().replace("header\n", "haeder\n", 1))
    result = remat("diff", str(AUTOGRAD), str(broken))
    assert result.returncode == 2
    assert f"{broken}:" in result.stderr and "error:" in result.stderr
    assert "Traceback" not in result.stderr
    with pytest.raises(PlanError):
        diff.load_side(str(broken))
    with pytest.raises(RematError, match="cannot read the plan"):
        diff.load_side(str(tmp_path / "missing.plan"))


# --- git modes ---------------------------------------------------------------------


def test_git_diff_driver_arguments_and_added_file(capsys):
    assert run("git-diff", "m.plan", str(AUTOGRAD), "9e14db0aa", "100644", str(OFFLOAD), "4c2ec39bb", "100644") == 0
    out = capsys.readouterr().out
    assert out.startswith(
        "diff --remat a/m.plan b/m.plan\nindex 9e14db0..4c2ec39\nplan summary: a/m.plan -> b/m.plan\n"
    )
    assert "relu  kept -> offloaded" in out and "\n--- a/m.plan\n+++ b/m.plan\n" in out

    assert run("git-diff", "new.plan", os.devnull, "0" * 40, ".", str(OFFLOAD), "4c2ec39bb", "100644") == 0
    out = capsys.readouterr().out
    assert re.search(r"^  predicted peak\s+\(absent\)\s+31.79 KiB", out, re.M)
    assert "\n--- /dev/null\n+++ b/new.plan\n" in out

    assert run("git-diff", "conflicted.plan") == 0
    assert capsys.readouterr().out == "* Unmerged path conflicted.plan\n"


def test_git_modes_show_an_invalid_plan_raw_instead_of_failing(tmp_path, capsys):
    broken = tmp_path / "broken.plan"
    broken.write_text("not a plan\n")
    assert run("git-diff", "x.plan", str(AUTOGRAD), "a", "100644", str(broken), "b", "100644") == 0
    out = capsys.readouterr().out
    assert "note: b/x.plan is not a valid plan:" in out and "\n+not a plan" in out
    assert run("textconv", str(broken)) == 0
    out = capsys.readouterr().out
    assert "#   not a valid plan:" in out and out.endswith("\nnot a plan\n")


def test_textconv_prints_a_summary_header_then_the_canonical_text(capsys):
    assert run("textconv", str(OFFLOAD)) == 0
    out = capsys.readouterr().out
    header, _, body = out.partition("\n# tests/models/tiny_mlp.py")
    assert "#   predicted peak  31.79 KiB (32556 B) at backward:12" in header
    assert re.search(r"^#   kept\s+17 tensors$", header, re.M)
    assert re.search(r"^#   offloaded\s+relu$", header, re.M)
    assert re.search(r"^#   status\s+hand-written$", header, re.M)
    assert out.endswith(OFFLOAD.read_text())


def test_textconv_shows_the_gap_with_the_status(tmp_path, capsys):
    path = with_solver_status(OFFLOAD, tmp_path / "milp.plan", status="feasible", gap=0.0123, solve_seconds=2.4)
    assert run("textconv", str(path)) == 0
    out = capsys.readouterr().out
    assert re.search(r"^#   status\s+feasible, gap 1.23%$", out, re.M)
    assert out.endswith(path.read_text())


def _readme_git_setup() -> tuple[str, list[tuple[str, str]]]:
    """The .gitattributes line and the `git config diff.remat.*` lines of README.md."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Reviewing plans", 1)[1].split("\n## ", 1)[0]
    attributes = re.search(r"echo '([^']+)' >> \.gitattributes", section).group(1)
    configs = re.findall(r"^git config (diff\.remat\.\w+) '([^']+)'$", section, re.M)
    return attributes, configs


def test_git_diff_and_log_show_the_summary_with_the_readme_setup(tmp_path):
    attributes, configs = _readme_git_setup()
    assert attributes == "*.plan diff=remat"
    assert {key for key, _ in configs} == {"diff.remat.command", "diff.remat.textconv"}
    remat_command = f"{shlex.quote(sys.executable)} -m remat_dsl"
    env = {
        **os.environ,
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_PAGER": "cat",
        "PAGER": "cat",
    }
    env.pop("GIT_EXTERNAL_DIFF", None)

    def git(*args: str) -> str:
        result = subprocess.run(["git", *args], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        return result.stdout

    git("init", "-q")
    git("config", "user.name", "Test")
    git("config", "user.email", "test@example.com")
    (tmp_path / ".gitattributes").write_text(attributes + "\n")
    (tmp_path / "model.plan").write_text(AUTOGRAD.read_text())
    git("add", ".")
    git("commit", "-q", "-m", "autograd plan")
    (tmp_path / "model.plan").write_text(OFFLOAD.read_text())
    git("commit", "-q", "-a", "-m", "offload relu")
    for key, value in configs:
        assert value.startswith("remat ")
        git("config", key, remat_command + value[len("remat") :])

    shown = git("diff", "HEAD~1", "HEAD")
    assert "plan summary: a/model.plan -> b/model.plan" in shown
    assert "relu  kept -> offloaded" in shown
    assert re.search(
        r"predicted peak\s+35.79 KiB \(36652 B\) at backward:12\s+31.79 KiB \(32556 B\) at backward:12", shown
    )
    assert shown.index("plan summary") < shown.index("--- a/model.plan")

    log = git("log", "-p")
    assert "# remat textconv: plan summary" in log
    assert re.search(r"^-#   predicted peak\s+35.79 KiB \(36652 B\)", log, re.M)
    assert re.search(r"^\+#   predicted peak\s+31.79 KiB \(32556 B\)", log, re.M)
    assert re.search(r"^\+#   offloaded\s+relu$", log, re.M)
