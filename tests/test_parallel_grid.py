"""A block's grid of RK-Checkmate ILPs solved in worker processes (NOTE: [Parallel grid]
in remat_dsl/solve/solvers/ilp/workers.py): the same plan as in one process (from the library,
with every grid handed to the workers), `remat plan --jobs` as a user types it (this small
model's grids are too fast to reach the workers there: the option and the exit), and a
pool whose worker dies."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

from remat_dsl.capture.model_file import load_model_file
from remat_dsl.capture.pipeline import capture_graph
from remat_dsl.plan.printer import print_plan
from remat_dsl.solve.driver import Planner
from remat_dsl.solve.solvers.ilp import workers

ROOT = Path(__file__).resolve().parent.parent
LLAMA = ROOT / "tests" / "models" / "hf_llama.py"
REMAT = Path(sys.executable).parent / "remat"


def test_grids_solved_in_workers_give_the_plan_one_process_gives(monkeypatch):
    graph = capture_graph(load_model_file(str(LLAMA)), repeats=1).graph
    handed = []
    run_all = workers.run_all

    def spy(fn, calls, jobs):
        results = run_all(fn, calls, jobs)
        handed.append((len(calls), jobs, results is not None))
        return results

    monkeypatch.setattr(workers, "run_all", spy)
    monkeypatch.setattr(workers, "PARALLEL_AFTER_S", 0.0)  # every grid, however cheap its first ILP
    plans = {}
    threads = threading.active_count()
    try:
        for jobs in (1, 2):
            planner = Planner(graph, model="hf_llama.py", jobs=jobs)
            plan = planner.plan(int(planner.autograd_peak * 0.75), "rockmate")
            plans[jobs] = print_plan(replace(plan, header=replace(plan.header, solve_seconds=None)))
    finally:
        workers.stop()
    assert threading.active_count() == threads  # the pool's thread is gone: `remat` exits at once (NOTE: [Exit])
    assert handed and all(jobs == 2 and done and calls >= 2 for calls, jobs, done in handed), handed
    assert plans[2] == plans[1]
    assert "rockmate" in plans[1]


def test_remat_plan_jobs_gives_the_same_plan_through_the_shell(tmp_path):
    commands = [
        f"'{REMAT}' plan {LLAMA} --budget 75% --no-cache --profile p.profile --jobs {n} > j{n}.plan" for n in (1, 2)
    ]
    profile = subprocess.run(
        f"'{REMAT}' profile {LLAMA} --repeats 1 -o p.profile", shell=True, cwd=tmp_path, capture_output=True, text=True
    )
    assert profile.returncode == 0, profile.stderr
    for command in commands:
        result = subprocess.run(command, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
    assert (tmp_path / "j1.plan").read_text() == (tmp_path / "j2.plan").read_text()
    assert (tmp_path / "j1.plan").read_text().startswith("remat-plan")


def test_a_pool_whose_worker_dies_leaves_the_work_to_the_caller():
    """`run_all` answers None when a worker dies (the caller then solves the rest itself),
    and the next call starts a pool that works."""
    try:
        assert workers.run_all(os._exit, [(3,), (3,)], 2) is None
        assert workers.run_all(abs, [(-1,), (-2,), (3,)], 2) == [1, 2, 3]
    finally:
        workers.stop()
