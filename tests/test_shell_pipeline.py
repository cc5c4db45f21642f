"""The headline pipeline as a user types it in a shell, with every solver.

`remat plan examples/gpt2.py --budget 50% --solver S > g.plan && remat check g.plan &&
remat codegen g.plan -o f.py` either succeeds (and g.plan holds the plan and nothing else:
C libraries such as HiGHS print banners on file descriptor 1) or `remat plan` refuses
with exit 2, a message and an empty g.plan.  Also: written files get the usual
permissions, progress shows in a log, and stdout stays clean when the plan goes to -o.
`auto` is left to the README's quickstart, which runs the same pipeline with it (GPT-2 is a
chain: auto plans it with rockmate, so rockmate's run is that one).
"""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / ".venv" / "bin"
SOLVERS = ["hiremate", "rotor", "checkpoint-sqrt", "checkmate", "autograd"]
REFUSED = {"checkmate": "it is meant for graphs of at most 160 ops", "autograd": "is infeasible for solver autograd"}
TINY = ROOT / "tests" / "models" / "tiny_mlp.py"


def shell(script: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        ["bash", "-c", "set -eo pipefail\n" + script], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
    )


@pytest.fixture(scope="module")
def pipelines(tmp_path_factory) -> dict[str, tuple[Path, subprocess.CompletedProcess]]:
    def run(solver: str):
        work = tmp_path_factory.mktemp(solver)
        script = (
            f"remat plan {ROOT}/examples/gpt2.py --budget 50% --solver {solver} > g.plan\n"
            "remat check g.plan > report.txt\n"
            "remat codegen g.plan -o f.py\n"
        )
        return solver, (work, shell(script, work))

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(run, SOLVERS))


@pytest.mark.parametrize("solver", SOLVERS)
def test_plan_check_codegen_through_the_shell(solver, pipelines):
    work, result = pipelines[solver]
    assert "Traceback" not in result.stderr, result.stderr
    plan = (work / "g.plan").read_text()
    if solver in REFUSED:
        assert result.returncode == 2, result.stderr
        assert REFUSED[solver] in result.stderr
        assert plan == "", "a refused plan writes nothing on stdout"
        assert not (work / "f.py").exists()
        return
    assert result.returncode == 0, result.stderr
    assert plan.startswith("remat-plan 2\n"), plan[:300]
    assert "HiGHS" not in plan and "Running" not in plan
    assert "valid plan" in (work / "report.txt").read_text()
    assert "class FastModel" in (work / "f.py").read_text()


def test_written_files_follow_the_umask(tmp_path):
    result = shell(
        f"umask 022\nremat plan {TINY} --budget 100% --repeats 1 -o t.plan\nremat codegen t.plan -o t.py\n", tmp_path
    )
    assert result.returncode == 0, result.stderr
    for name in ("t.plan", "t.py"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o644, name
    assert sorted(os.listdir(tmp_path)) == ["t.plan", "t.py"]  # no temporary left


def test_progress_shows_in_a_log_and_stdout_stays_clean(tmp_path):
    result = shell(f"remat plan {TINY} --budget 100% --repeats 1 -o t.plan 2> log.txt > out.txt\n", tmp_path)
    assert result.returncode == 0
    log = (tmp_path / "log.txt").read_text()
    assert f"capturing {TINY} ..." in log and "ops," in log  # the plain progress lines
    assert (tmp_path / "out.txt").read_text() == ""


def test_two_plans_of_the_same_profile_are_byte_identical(tmp_path):
    result = shell(
        f"remat profile {TINY} -o t.profile --repeats 1\n"
        f"remat plan {TINY} --budget 90% --profile t.profile > a.plan\n"
        f"remat plan {TINY} --budget 90% --profile t.profile > b.plan\n"
        "cmp a.plan b.plan\n",
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "solve-time" not in (tmp_path / "a.plan").read_text()
    assert '"auto: checkmate' in (tmp_path / "a.plan").read_text()  # a MILP solver made it


def test_solve_time_is_recorded_when_asked(tmp_path):
    result = shell(
        f"remat plan {TINY} --budget 100% --repeats 1 --record-solve-time > t.plan\nremat check t.plan\n", tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert "  solve-time  " in (tmp_path / "t.plan").read_text()
    assert "solve time" in result.stdout
