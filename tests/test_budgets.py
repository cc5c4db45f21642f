"""Budgets that say what they mean: a number without a unit is refused before the model
file is imported (remat_dsl.plan.units.refuse_bare_number), and a budget below the proven
lower bound right after the capture, before any solve, with the smallest budget the solver
reaches when an earlier refusal stored it in the cache (NOTE: [Budgets below the bound] in
remat_dsl/solve/driver.py).  Commands run as a user types them."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from remat_dsl.plan.units import UnitError, refuse_bare_number

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "tests" / "models" / "tiny_mlp.py"
GPT2 = ROOT / "examples" / "gpt2.py"
TINY_BOUND = 27_680  # bytes: the tiny MLP's proven bound (its parameter gradients and outputs)
TINY_SMALLEST = 32_556  # bytes: checkmate's smallest feasible budget for it (tests/bad_invocations/cases.toml)


def remat(*args: str, cwd: Path) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "remat_dsl", *args], cwd=cwd, capture_output=True, text=True, timeout=600
    )
    return result, time.monotonic() - start


@pytest.mark.parametrize(
    "budget, suggestion",
    [("50", "did you mean 50% or 50MiB?"), ("0.5", "did you mean 50%?"), ("2048", "did you mean 2048MiB or 2048GiB?")],
)
def test_a_budget_without_a_unit_is_refused_before_the_model_is_imported(budget, suggestion, tmp_path):
    result, seconds = remat("plan", str(GPT2), "--budget", budget, "-o", "g.plan", cwd=tmp_path)
    assert result.returncode == 2 and suggestion in result.stderr, result.stderr
    assert f"budget '{budget}' has no unit" in result.stderr
    assert "capturing" not in result.stderr and "Traceback" not in result.stderr and result.stdout == ""
    assert seconds < 3, seconds
    assert list(tmp_path.iterdir()) == []


def test_what_needs_a_unit():
    for text in ("50%", "65536B", "1.5 GiB", "0", "0%"):
        refuse_bare_number(text, "budget")  # no error
    for text, options, hint in (
        ("12", {"per_second": True}, "did you mean 12GB/s?"),
        ("8", {"percent": False}, "did you mean 8MiB or 8GiB?"),
        ("13128716", {}, "did you mean 13128716B?"),
    ):
        with pytest.raises(UnitError) as refused:
            refuse_bare_number(text, "quantity", **options)
        assert refused.value.hint.startswith(hint), refused.value.hint


def test_explicit_bytes_are_a_budget(tmp_path):
    result, _ = remat("plan", str(TINY), "--budget", "65536B", "--repeats", "1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "budget      64.00 KiB (65536 B)" in result.stdout


def test_a_budget_below_the_bound_is_refused_before_the_solve_then_with_the_smallest_from_the_cache(tmp_path):
    first, _ = remat("plan", str(TINY), "--budget", "1%", "--repeats", "1", cwd=tmp_path)
    assert first.returncode == 2 and "Traceback" not in first.stderr and first.stdout == ""
    bound = f"is infeasible: no plan can peak below 27.03 KiB ({TINY_BOUND} B) (the step ends holding its parameter"
    assert bound in first.stderr
    assert "the parameter gradients alone take 26.53 KiB (27168 B)" in first.stderr
    assert "solving with" not in first.stderr and "smallest feasible budget" not in first.stderr
    assert f"hint: plan with --budget {TINY_BOUND}B or more" in first.stderr
    solved, _ = remat("plan", str(TINY), "--budget", "30000B", "--repeats", "1", cwd=tmp_path)  # above the bound
    assert solved.returncode == 2 and "solving with auto" in solved.stderr
    assert f"the smallest feasible budget is 31.79 KiB ({TINY_SMALLEST} B)" in solved.stderr
    again, seconds = remat("plan", str(TINY), "--budget", "1%", "--repeats", "1", cwd=tmp_path)
    assert again.returncode == 2 and "solving with" not in again.stderr
    assert (
        f"solver checkmate's smallest feasible budget is 31.79 KiB ({TINY_SMALLEST} B) (found by an earlier run"
        in again.stderr
    )
    assert f"hint: plan with --budget {TINY_SMALLEST}B or more" in again.stderr
    uncached, _ = remat("plan", str(TINY), "--budget", "1%", "--repeats", "1", "--no-cache", cwd=tmp_path)
    assert uncached.returncode == 2 and "smallest feasible budget" not in uncached.stderr


def test_a_stored_smallest_budget_that_no_solver_found_is_ignored(tmp_path):
    from remat_dsl.capture.model_file import load_model_file
    from remat_dsl.capture.pipeline import capture_graph
    from remat_dsl.plan.cache import Cache
    from remat_dsl.solve.driver import SMALLEST_KIND, Planner

    graph = capture_graph(load_model_file(str(TINY)), repeats=1, measure_time=False).graph
    cache = Cache(tmp_path)
    planner = Planner(graph, cache=cache)
    assert planner.known_smallest("checkmate") is None
    assert planner.smallest_budget("checkmate") == planner.known_smallest("checkmate")
    assert planner.known_smallest("rotor") is None  # each solver its own
    key = planner._smallest_key("checkmate")
    for bogus in (TINY_BOUND - 1, True, "32556", 1 << 70):
        cache.put(SMALLEST_KIND, key, bogus)
        assert planner.known_smallest("checkmate") is None, bogus
    other = Planner(graph, cache=cache, constraints=(), host_budget=1 << 20)
    assert other._smallest_key("checkmate") != key  # what it depends on is in the key


def test_the_smallest_budget_a_refusal_names_gets_a_plan(tmp_path):
    """A model whose parameter gradients dominate its peak: the store-all plan fits below the
    floor of Rockmate's own model, and `remat plan` returns it at any budget it fits (NOTE:
    [Budget correction]), so the refusal names its peak, not the floor: that budget plans,
    one byte less does not."""
    (tmp_path / "wide.py").write_text(
        (ROOT / "tests" / "models" / "template_names.py")
        .read_text()
        .replace("torch.randn(256, 8,", "torch.randn(6, 8,")
    )
    result, _ = remat("plan", "wide.py", "--budget", "4500B", "--solver", "rockmate", "--repeats", "1", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    found = re.search(r"the smallest feasible budget is [^(]*\((\d+) B\)", result.stderr)
    assert found, result.stderr
    result, _ = remat(
        "plan",
        "wide.py",
        "--budget",
        f"{found[1]}B",
        "--solver",
        "rockmate",
        "--repeats",
        "1",
        "-o",
        "w.plan",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    below = int(found[1]) - 1  # and none below it has one
    result, _ = remat(
        "plan", "wide.py", "--budget", f"{below}B", "--solver", "rockmate", "--repeats", "1", cwd=tmp_path
    )
    assert result.returncode == 2, result.stderr
